use super::*;

/// Every line `pump` forwards from `input` under a cap of `bytes_per_s`.
async fn pumped(input: Vec<u8>, bytes_per_s: u64) -> Vec<(bool, String)> {
    let rate = Arc::new(Mutex::new(LogRate::new(bytes_per_s, 0)));
    let (tx, mut rx) = mpsc::channel(LINE_QUEUE_DEPTH);
    let task = tokio::spawn(pump(
        std::io::Cursor::new(input),
        true,
        rate,
        Instant::now(),
        tx,
    ));
    let mut out = Vec::new();
    while let Some(line) = rx.recv().await {
        out.push(line);
    }
    task.await.unwrap();
    out
}

/// Runs `script` (sh) as rank 0 of generation 1 of the ringleader protocol, its first
/// heartbeat due within `first_heartbeat_ms`; returns what it reported until `until`
/// holds of a report or `wait_ms` passed, then kills it, and its log.
async fn protocol_rank(
    standby: bool,
    script: &str,
    first_heartbeat_ms: u64,
    wait_ms: u64,
    until: impl Fn(&ControlCommand) -> bool,
) -> (Vec<ControlCommand>, String) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("worker-0.log");
    let (reports, mut rx) = mpsc::channel(64);
    let run = Run {
        key: (JobId::from_log_index(7), 1, 0),
        generation: 1,
        rank: 0,
        launch: Launch {
            command: vec!["sh".into(), "-c".into(), script.into()],
            files: Vec::new(),
            work_dir: None,
            env: Vec::new(),
            log: log.clone(),
            trial_metric: None,
            trial_metric_lines: false,
            trial_rung: None,
            dataset: None,
        },
        control_stdin: true,
        protocol: Some(ProtocolRank {
            first_generation: (!standby)
                .then(|| "ringleader-generation {\"generation\":1}".to_owned()),
            first_heartbeat_ms,
        }),
        standby,
        reports,
        clock_ms: || 1,
        datasets: None,
        groups: None,
        options: RankOptions::default(),
    };
    let (control, control_rx) = mpsc::channel(CONTROL_QUEUE_DEPTH);
    let task = tokio::spawn(run.run(control_rx));
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    while let Ok(Some(r)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        let done = until(&r);
        seen.push(r);
        if done {
            break;
        }
    }
    // Gone already when the process exited by itself.
    let _ = control.send(Control::Kill).await;
    task.await.unwrap();
    (seen, std::fs::read_to_string(&log).unwrap_or_default())
}

fn is_lost(r: &ControlCommand) -> bool {
    matches!(
        r,
        ControlCommand {
            op: Op::RankLost(ops::RankLost { .. }),
            ..
        }
    )
}

#[tokio::test]
async fn a_protocol_rank_reads_its_first_generation_and_must_speak_in_time() {
    // It reads the generation on stdin and never speaks: lost, saying what to change.
    let (seen, log) = protocol_rank(
        false,
        "read l; echo \"got ${l%% *}\"; sleep 30",
        300,
        10_000,
        is_lost,
    )
    .await;
    assert!(log.contains("got ringleader-generation"), "{log}");
    let Some(ControlCommand {
        op:
            Op::RankLost(ops::RankLost {
                generation,
                rank,
                hung,
                reason,
                ..
            }),
        ..
    }) = seen.iter().find(|r| is_lost(r))
    else {
        panic!("never reported lost: {seen:?}")
    };
    assert_eq!((*generation, *rank, *hung), (1, 0, false));
    assert!(
        reason.contains("ringleader.torch") && reason.contains("rlt.init()"),
        "{reason}"
    );
    // One that prints a heartbeat at once is never reported, whatever else it prints.
    let (seen, _) = protocol_rank(
        false,
        "echo ringleader-heartbeat computing_ms=0; echo ringleader-metric loss 1; sleep 30",
        300,
        1_500,
        is_lost,
    )
    .await;
    assert!(!seen.iter().any(is_lost), "{seen:?}");
}

/// A standby joiner's ready line is reported; its exit before it joined drops the standby
/// (no rank exited); one that never speaks is dropped too, not reported lost.
#[tokio::test]
async fn a_standby_reports_ready_and_its_exit_or_silence_drops_it() {
    let dropped =
        |r: &ControlCommand| matches!(r.op, Op::StandbyDropped(ops::StandbyDropped { .. }));
    let (seen, _) = protocol_rank(
        true,
        "echo ringleader-heartbeat computing_ms=0; echo ringleader-ready; exit 3",
        60_000,
        10_000,
        dropped,
    )
    .await;
    let ops: Vec<&Op> = seen.iter().map(|r| &r.op).collect();
    let id = JobId::from_log_index(7);
    assert!(
        matches!(ops.as_slice(), [Op::StandbyReady(ops::StandbyReady { id: i, worker: 0 }), Op::StandbyDropped(ops::StandbyDropped { id: j, worker: 0, reason })] if *i == id && *j == id && reason == "its process exited with code 3"),
        "{seen:?}"
    );
    let (seen, _) = protocol_rank(true, "sleep 30", 300, 10_000, dropped).await;
    assert!(
        matches!(seen.as_slice(), [ControlCommand { op: Op::StandbyDropped(ops::StandbyDropped { reason, .. }), .. }] if reason.contains("rlt.init()")),
        "{seen:?}"
    );
}

#[tokio::test]
async fn files_are_written_fresh_never_through_a_link() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("worker-0");
    // Directories made as needed; an old file (or a link at its path) replaced.
    write_fresh(&work.join("lib/a.py"), b"one").await.unwrap();
    write_fresh(&work.join("lib/a.py"), b"two").await.unwrap();
    assert_eq!(std::fs::read(work.join("lib/a.py")).unwrap(), b"two");
    let outside = dir.path().join("outside");
    std::fs::write(&outside, b"keep").unwrap();
    std::os::unix::fs::symlink(&outside, work.join("link.py")).unwrap();
    write_fresh(&work.join("link.py"), b"new").await.unwrap();
    assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
    assert_eq!(std::fs::read(work.join("link.py")).unwrap(), b"new");
    // A directory on the way that is a link: refused, nothing written beyond it.
    std::fs::create_dir(dir.path().join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("elsewhere"), work.join("sub")).unwrap();
    let e = write_fresh(&work.join("sub/x.py"), b"x").await.unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert!(!dir.path().join("elsewhere/x.py").exists());
}

#[tokio::test]
async fn a_flood_is_capped_but_protocol_lines_always_pass() {
    let mut input = Vec::new();
    for i in 0..20_000 {
        input.extend_from_slice(&[b'x'; 99]);
        input.push(b'\n');
        if i % 1_000 == 0 {
            input.extend_from_slice(format!("ringleader-metric loss 0.5 {i}\n").as_bytes());
        }
    }
    // An overlong line: its pieces are ordinary lines, even one that looks like protocol.
    input.extend_from_slice(&vec![b'y'; LINE_BYTES_MAX]);
    input.extend_from_slice(b"ringleader-metric fake 1\n");
    input.extend_from_slice(b"ringleader-metric last 1\n");
    let out = pumped(input, 1_000).await;
    let lines: Vec<&str> = out.iter().map(|(_, l)| l.as_str()).collect();
    let losses = lines
        .iter()
        .filter(|l| l.starts_with("ringleader-metric loss 0.5 "))
        .count();
    assert_eq!(losses, 20);
    assert_eq!(lines.last(), Some(&"ringleader-metric last 1"));
    // The burst (4 s at 1000 bytes/s: 40 lines, less the protocol lines' share) of junk
    // and what the test's own time refilled; the rest dropped.
    let junk = lines.iter().filter(|l| l.starts_with('x')).count();
    assert!((30..=60).contains(&junk), "{junk}");
    // Nothing is capped without a cap.
    let open = pumped(b"a\nb\nringleader-metric x 1\n".to_vec(), 0).await;
    assert_eq!(open.len(), 3);
}

/// The golden lines (`protocol/golden/lines.txt`) read as the node reads a
/// rank's stdout: every `rank-ok` line is a protocol line, every `rank-bad` one is
/// malformed (logged and ignored), never the rank's own output.
#[test]
fn golden_rank_lines_read_as_the_protocol_says() {
    let mut n = 0;
    for g in ringleader_protocol::golden_lines(ringleader_protocol::GOLDEN_LINES) {
        match g.tag {
            "rank-ok" => assert!(matches!(read_line(g.line), Read::Line(_)), "{g:?}"),
            "rank-bad" => assert!(matches!(read_line(g.line), Read::Malformed(_)), "{g:?}"),
            _ => continue,
        }
        n += 1;
    }
    assert!(n > 10, "{n} golden rank lines");
    assert_eq!(read_line("epoch 3 loss 0.2"), Read::Output);
    assert_eq!(read_line("ringleader: fetching"), Read::Output);
}

fn line(text: &str) -> RankLine {
    text.parse().unwrap()
}

#[test]
fn trial_reports_from_report_lines_and_command_trials_metric_lines() {
    let mut t = TrialReports {
        metric: Some("val_accuracy".into()),
        from_metric_lines: true,
        ..TrialReports::default()
    };
    assert_eq!(t.report(&line("ringleader-metric loss 0.5 1")), None);
    assert_eq!(
        t.report(&line("ringleader-metric val_accuracy 0.5 1")),
        Some((1, 0.5))
    );
    assert_eq!(
        t.report(&line("ringleader-metric val_accuracy 0.6 1")),
        None,
        "no progress"
    );
    assert_eq!(
        t.report(&line("ringleader-report 3 val_loss 0.2 val_accuracy 0.9")),
        Some((3, 0.9))
    );
    assert_eq!(t.report(&line("ringleader-report 4 val_loss 0.2")), None);
    // Without STEP: the count of such lines so far (the 3rd is 3, not beyond 3; the 4th
    // is 4).
    assert_eq!(t.report(&line("ringleader-metric val_accuracy 0.93")), None);
    assert_eq!(
        t.report(&line("ringleader-metric val_accuracy 0.95")),
        Some((4, 0.95))
    );

    // A train trial: its metric lines count steps, only its reports count.
    let mut train = TrialReports {
        metric: Some("val_accuracy".into()),
        from_metric_lines: false,
        ..TrialReports::default()
    };
    assert_eq!(
        train.report(&line("ringleader-metric val_accuracy 0.5 120")),
        None
    );
    assert_eq!(
        train.report(&line("ringleader-report 1 val_accuracy 0.5")),
        Some((1, 0.5))
    );
    // Not a trial: nothing is a report.
    let mut none = TrialReports::default();
    assert_eq!(
        none.report(&line("ringleader-report 1 val_accuracy 0.5")),
        None
    );
}

#[test]
fn a_resumable_trials_run_reports_up_to_its_rung_and_no_further() {
    let mut t = TrialReports {
        metric: Some("acc".into()),
        from_metric_lines: true,
        rung: Some(3),
        ..TrialReports::default()
    };
    assert_eq!(
        t.report(&line("ringleader-report 1 acc 0.1")),
        Some((1, 0.1))
    );
    assert!(!t.reached_rung());
    assert_eq!(
        t.report(&line("ringleader-report 3 acc 0.3")),
        Some((3, 0.3))
    );
    assert!(t.reached_rung());
    assert_eq!(
        t.report(&line("ringleader-report 4 acc 0.4")),
        None,
        "past the rung"
    );
    assert_eq!(
        t.report(&line("ringleader-metric acc 0.5 5")),
        None,
        "past the rung"
    );
    // A run that resumed past its rung (the run before saved beyond its own) has
    // reached it: its first report goes to the search, which takes it as the rung's;
    // nothing after it does.
    let mut past = TrialReports {
        metric: Some("acc".into()),
        rung: Some(3),
        ..TrialReports::default()
    };
    assert_eq!(
        past.report(&line("ringleader-report 5 acc 0.5")),
        Some((5, 0.5))
    );
    assert!(past.reached_rung());
    assert_eq!(past.report(&line("ringleader-report 6 acc 0.6")), None);
}

#[tokio::test]
async fn a_rank_gets_the_default_timer_slack_not_the_nodes() {
    // The node's threads run with a 20 ms slack; this one (which starts the rank) too.
    crate::tasks::relax_timers();
    // SAFETY: PR_GET_TIMERSLACK only reads the calling thread's slack.
    let mine = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
    assert_eq!(mine as u64, crate::tasks::NODE_TIMER_SLACK_NS);
    let (_, log) = protocol_rank(
        false,
        "read l; echo slack=$(cat /proc/self/timerslack_ns); sleep 30",
        300,
        10_000,
        is_lost,
    )
    .await;
    crate::tasks::set_timer_slack(crate::tasks::RANK_TIMER_SLACK_NS);
    let expected = format!("slack={}", crate::tasks::RANK_TIMER_SLACK_NS);
    assert!(log.contains(&expected), "{log}");
}
