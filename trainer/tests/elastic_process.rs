//! Elastic workers as real processes: three `train-worker --elastic` processes on
//! 127.0.0.1; one is killed by PID; the test, playing the node, writes the next generation
//! to the survivors' stdin; the same two processes finish the run with falling loss. One
//! is stopped (SIGSTOP: its connections stay open and silent): the survivors, blocked in a
//! step, leave for the next generation within seconds. And a stop line ends a worker
//! cleanly.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use trainer::elastic::Generation;

/// Deadline for each phase, s.
const PHASE_DEADLINE_S: u64 = 120;
/// Steps of the run.
const STEPS: u64 = 60;
/// Test-only step delay of every worker, ms: keeps the run long enough to kill a worker
/// in the middle, and shows up in the rank-stats lines as compute time.
const STEP_DELAY_MS: u64 = 25;
const SECRET: &str = "elastic-test";

fn addrs(n: usize) -> Vec<SocketAddr> {
    (0..n)
        .map(|_| SocketAddr::from(([127, 0, 0, 1], collective::testing::unused_local_port())))
        .collect()
}

struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts worker `rank` of generation 0, every step delayed by `delay_ms`; its stdout
/// lines go to `lines` as (rank, line).
fn start(
    dir: &std::path::Path,
    rank: usize,
    addrs: &[SocketAddr],
    delay_ms: u64,
    lines: &mpsc::Sender<(usize, String)>,
) -> Worker {
    let joined: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_train-worker"))
        .args(["--spec", dir.join("job.toml").to_str().unwrap()])
        .args(["--rank", &rank.to_string(), "--addrs", &joined.join(",")])
        .args(["--job-id", "elastic-test", "--secret", SECRET])
        .args(["--data-dir", dir.join("data").to_str().unwrap()])
        .args(["--max-steps", &STEPS.to_string(), "--elastic", "--verbose"])
        .env("RINGLEADER_TEST_STEP_DELAY_MS", delay_ms.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let tx = lines.clone();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send((rank, l)).is_err() {
                break;
            }
        }
    });
    let stdin = child.stdin.take();
    Worker { child, stdin }
}

/// Reads lines (with a deadline) until `pred` has matched lines from every rank in
/// `ranks`; every line read is kept in `seen`.
fn wait_lines(
    rx: &mpsc::Receiver<(usize, String)>,
    seen: &mut Vec<(usize, String)>,
    ranks: &[usize],
    pred: impl Fn(&str) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(PHASE_DEADLINE_S);
    let done = |seen: &[(usize, String)]| {
        ranks
            .iter()
            .all(|r| seen.iter().any(|(k, l)| k == r && pred(l)))
    };
    while !done(seen) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(x) => seen.push(x),
            Err(e) => panic!("waiting for lines from {ranks:?}: {e}; seen {seen:#?}"),
        }
    }
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

fn write_spec(dir: &std::path::Path) {
    std::fs::write(
        dir.join("job.toml"),
        "[model]\narch = \"mlp\"\nhidden = [32]\n[train]\nepochs = 50\nbatch_per_worker = 16\n\
         lr = 0.05\nseed = 5\neval_every_epochs = 0\n[checkpoint]\nevery_steps = 0\n\
         commit_every_steps = 5\n",
    )
    .unwrap();
}

#[test]
fn survivors_keep_their_processes_and_finish_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    write_spec(dir.path());
    let (tx, rx) = mpsc::channel();
    let gen0 = addrs(3);
    let mut workers: Vec<Worker> = (0..3)
        .map(|r| start(dir.path(), r, &gen0, STEP_DELAY_MS, &tx))
        .collect();
    let pids: Vec<u32> = workers.iter().map(|w| w.child.id()).collect();
    let mut seen = Vec::new();

    // Phase 1: training in generation 0, every rank reporting its step times.
    wait_lines(&rx, &mut seen, &[0, 1, 2], |l| {
        l.starts_with("ringleader-rank-stats generation=0")
    });
    wait_lines(&rx, &mut seen, &[0], |l| {
        field(l, "step").and_then(|s| s.parse::<u64>().ok()) >= Some(12) && l.contains("loss=")
    });

    // Phase 2: kill rank 2 by PID; both survivors report the failure.
    workers[2].child.kill().unwrap();
    workers[2].child.wait().unwrap();
    wait_lines(&rx, &mut seen, &[0, 1], |l| {
        l.starts_with("ringleader-elastic failed generation=0 ")
    });

    // Phase 3: the node's next generation, on the survivors' stdin (still the same
    // processes: neither has exited).
    let gen1 = addrs(2);
    for (r, w) in workers.iter_mut().take(2).enumerate() {
        assert!(w.child.try_wait().unwrap().is_none(), "rank {r} exited");
        let g = Generation {
            generation: 1,
            rank: r,
            addrs: gen1.clone(),
            secret: SECRET.into(),
            batch_workers: None,
        };
        let stdin = w.stdin.as_mut().unwrap();
        writeln!(stdin, "{}", g.to_line()).unwrap();
        stdin.flush().unwrap();
    }
    wait_lines(&rx, &mut seen, &[0, 1], |l| l.contains(" done step="));
    for (r, w) in workers.iter_mut().take(2).enumerate() {
        assert_eq!(w.child.id(), pids[r]);
        let deadline = Instant::now() + Duration::from_secs(PHASE_DEADLINE_S);
        let status = loop {
            if let Some(s) = w.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "rank {r} did not exit");
            let _ = rx
                .recv_timeout(Duration::from_millis(50))
                .map(|x| seen.push(x));
        };
        assert!(status.success(), "rank {r}: {status}");
    }
    seen.extend(rx.try_iter());

    // Phase 4: what the survivors said.
    for r in 0..2 {
        let out: Vec<&str> = seen
            .iter()
            .filter(|(k, _)| *k == r)
            .map(|(_, l)| l.as_str())
            .collect();
        let resumed: Vec<&&str> = out
            .iter()
            .filter(|l| l.starts_with("ringleader-elastic resumed generation=1 "))
            .collect();
        assert_eq!(resumed.len(), 1, "rank {r}: {out:#?}");
        let l = resumed[0];
        assert_eq!(field(l, "world"), Some("2"), "{l}");
        assert_eq!(field(l, "rank"), Some(r.to_string().as_str()), "{l}");
        assert_eq!(field(l, "source"), Some("memory"), "{l}");
        let restored: u64 = field(l, "restored_step").unwrap().parse().unwrap();
        let step: u64 = field(l, "step").unwrap().parse().unwrap();
        let lost: u64 = field(l, "steps_lost").unwrap().parse().unwrap();
        // The kill came after rank 0's step 12; the failed step changed nothing, so the
        // survivors committed their last whole step (not only the periodic commit of 10).
        assert!(restored >= 12, "{l}");
        assert_eq!(lost, step - restored, "{l}");
        let failed = out
            .iter()
            .find(|l| l.starts_with("ringleader-elastic failed"))
            .unwrap();
        assert!(
            field(failed, "lost_rank").is_some() && failed.contains("error=\""),
            "{failed}"
        );
        assert!(
            out.iter()
                .any(|l| l.contains(&format!(" done step={STEPS} "))),
            "rank {r}: {out:#?}"
        );
        let stats: Vec<f64> = out
            .iter()
            .filter(|l| l.starts_with("ringleader-rank-stats generation=1"))
            .map(|l| field(l, "compute_ms").unwrap().parse().unwrap())
            .collect();
        assert!(
            !stats.is_empty() && stats.iter().all(|&c| c >= STEP_DELAY_MS as f64),
            "rank {r} stats {stats:?}"
        );
        let losses: Vec<f64> = out
            .iter()
            .filter(|l| l.contains(" loss="))
            .filter_map(|l| field(l, "loss")?.parse().ok())
            .collect();
        let first: f64 = losses[..3].iter().sum::<f64>() / 3.0;
        let last: f64 = losses[losses.len() - 3..].iter().sum::<f64>() / 3.0;
        assert!(last < 0.7 * first, "rank {r}: loss {first} -> {last}");
    }
}

/// The most the survivors of a stopped rank may take, from the next generation written to
/// their stdin to resuming in it, s: the abort grace (`ABORT_GRACE_MS`, 1 s) plus
/// connecting and agreeing, far below the collective's op timeout (60 s), which is all that
/// would end their blocked step otherwise (a stopped process's kernel still acknowledges
/// TCP, so the connections never go silent).
const STOPPED_RECOVERY_S: u64 = 5;
/// How long the survivors print nothing before the test takes them as blocked, ms.
const QUIET_MS: u64 = 500;

/// Sends `signal` (`STOP`) to the process `pid` the test started.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}: {status}");
}

#[test]
fn survivors_of_a_stopped_rank_leave_for_the_next_generation_within_seconds() {
    let dir = tempfile::tempdir().unwrap();
    write_spec(dir.path());
    let (tx, rx) = mpsc::channel();
    let gen0 = addrs(3);
    let mut workers: Vec<Worker> = (0..3)
        .map(|r| start(dir.path(), r, &gen0, STEP_DELAY_MS, &tx))
        .collect();
    let mut seen = Vec::new();

    // Phase 1: training in generation 0, past the first commits.
    wait_lines(&rx, &mut seen, &[0], |l| {
        field(l, "step").and_then(|s| s.parse::<u64>().ok()) >= Some(12) && l.contains("loss=")
    });

    // Phase 2: stop rank 2; the survivors block inside a step: they go quiet.
    signal(workers[2].child.id(), "STOP");
    let deadline = Instant::now() + Duration::from_secs(PHASE_DEADLINE_S);
    loop {
        assert!(Instant::now() < deadline, "the survivors never went quiet");
        match rx.recv_timeout(Duration::from_millis(QUIET_MS)) {
            Ok(x) => seen.push(x),
            Err(mpsc::RecvTimeoutError::Timeout) => break,
            Err(e) => panic!("{e}"),
        }
    }
    let blocked_at = seen.len();

    // Phase 3: the node's next generation, the survivors, on their stdin.
    let gen1 = addrs(2);
    let sent = Instant::now();
    for (r, w) in workers.iter_mut().take(2).enumerate() {
        let g = Generation {
            generation: 1,
            rank: r,
            addrs: gen1.clone(),
            secret: SECRET.into(),
            batch_workers: None,
        };
        let stdin = w.stdin.as_mut().unwrap();
        writeln!(stdin, "{}", g.to_line()).unwrap();
        stdin.flush().unwrap();
    }
    wait_lines(&rx, &mut seen, &[0, 1], |l| {
        l.starts_with("ringleader-elastic resumed generation=1 ")
    });
    let recovered = sent.elapsed();
    println!("survivors of a stopped rank resumed generation 1 after {recovered:?}");
    assert!(
        recovered < Duration::from_secs(STOPPED_RECOVERY_S),
        "resumed after {recovered:?}"
    );
    wait_lines(&rx, &mut seen, &[0, 1], |l| l.contains(" done step="));

    // Phase 4: the blocked step was left, not reported as a peer loss; the survivors
    // restored a commit from memory and finished.
    for r in 0..2 {
        let out: Vec<&str> = seen[blocked_at..]
            .iter()
            .filter(|(k, _)| *k == r)
            .map(|(_, l)| l.as_str())
            .collect();
        let lost: Vec<&&str> = out
            .iter()
            .filter(|l| {
                l.starts_with("ringleader-elastic failed")
                    && field(l, "lost_rank").is_some_and(|x| x != "-")
            })
            .collect();
        assert!(lost.is_empty(), "rank {r} reported a lost rank: {lost:?}");
        let resumed = out
            .iter()
            .find(|l| l.starts_with("ringleader-elastic resumed generation=1 "))
            .unwrap();
        assert_eq!(field(resumed, "source"), Some("memory"), "{resumed}");
        assert!(
            out.iter()
                .any(|l| l.contains(&format!(" done step={STEPS} "))),
            "rank {r}: {out:#?}"
        );
    }
    // Cleanup: dropping the workers kills them, the stopped one included (SIGKILL).
    drop(workers);
}

#[test]
fn a_stop_line_ends_a_worker_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    write_spec(dir.path());
    let (tx, rx) = mpsc::channel();
    let mut w = start(dir.path(), 0, &addrs(1), STEP_DELAY_MS, &tx);
    let mut seen = Vec::new();
    wait_lines(&rx, &mut seen, &[0], |l| l.contains(" loss="));
    let stdin = w.stdin.as_mut().unwrap();
    writeln!(stdin, "ringleader-stop").unwrap();
    stdin.flush().unwrap();
    wait_lines(&rx, &mut seen, &[0], |l| l.contains(" stopped step="));
    let deadline = Instant::now() + Duration::from_secs(PHASE_DEADLINE_S);
    let status = loop {
        if let Some(s) = w.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the worker did not exit");
        let _ = rx.recv_timeout(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    let stopped = seen.iter().find(|(_, l)| l.contains(" stopped ")).unwrap();
    let step: u64 = field(&stopped.1, "step").unwrap().parse().unwrap();
    assert!(step > 0 && step < STEPS, "{}", stopped.1);
}

/// A straggler shows in the rank-stats lines: its compute time holds the delay, and the
/// other rank waits for it.
#[test]
fn rank_stats_show_a_straggler() {
    let dir = tempfile::tempdir().unwrap();
    write_spec(dir.path());
    let (tx, rx) = mpsc::channel();
    let a = addrs(2);
    let slow_ms = 4 * STEP_DELAY_MS;
    let workers = [
        start(dir.path(), 0, &a, 0, &tx),
        start(dir.path(), 1, &a, slow_ms, &tx),
    ];
    let mut seen = Vec::new();
    // The first report covers the first step only; wait for a later one from each rank.
    let later = |l: &str| {
        l.starts_with("ringleader-rank-stats ")
            && field(l, "step").and_then(|s| s.parse::<u64>().ok()) > Some(1)
    };
    wait_lines(&rx, &mut seen, &[0, 1], later);
    let stats = |r: usize, key: &str| -> f64 {
        let l = &seen.iter().find(|(k, l)| *k == r && later(l)).unwrap().1;
        field(l, key).unwrap().parse().unwrap()
    };
    let slow = slow_ms as f64;
    assert!(stats(1, "compute_ms") >= slow, "{seen:#?}");
    assert!(stats(0, "compute_ms") < slow, "{seen:#?}");
    assert!(stats(0, "wait_ms") > 0.5 * slow, "{seen:#?}");
    // Dropping the workers kills them.
    drop(workers);
}
