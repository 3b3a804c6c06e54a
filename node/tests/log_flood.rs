//! Real-process test of the rank log cap (issue 22, point 6): a command job prints about
//! 50 MB of junk with `ringleader-metric` lines among it; the job succeeds, every metric line
//! reaches the log and the job's metrics, the log stays within the cap's bound (rate × time +
//! burst), and the node's `/healthz` answers throughout. Prints the node's CPU time for the
//! job (utime + stime from /proc). Waits poll with deadlines.

mod common;

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

/// Forming the cluster and running the job get this long each.
const WAIT: Duration = Duration::from_secs(120);
/// The cap the node runs with in this test, bytes per second.
const CAP_BYTES_PER_S: u64 = 200_000;
/// Lines of junk (100 bytes and a newline each: about 50 MB).
const JUNK_LINES: u64 = 500_000;
/// A metric line every this many junk lines.
const METRIC_EVERY: u64 = 10_000;
/// Longest `/healthz` may take while the job floods, and its poll period.
const HEALTH_LATENCY_MAX: Duration = Duration::from_secs(2);
const HEALTH_POLL: Duration = Duration::from_millis(50);

/// The node's CPU time so far (user + system), in milliseconds.
fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `rest` starts at field 3.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks * 1000 / hz
}

/// One `GET /healthz`: its latency, or what went wrong.
fn healthz(addr: &str) -> Result<Duration, String> {
    let start = Instant::now();
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(HEALTH_LATENCY_MAX * 2))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).map_err(|e| e.to_string())?;
    if reply.starts_with("HTTP/1.1 200") && reply.ends_with("ok") {
        Ok(start.elapsed())
    } else {
        Err(format!("unexpected reply: {reply:?}"))
    }
}

/// The one log file under `dir` (a job's directory).
fn the_log(dir: &Path) -> std::path::PathBuf {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "log") {
                found.push(p);
            }
        }
    }
    assert_eq!(found.len(), 1, "{found:?}");
    found.pop().unwrap()
}

#[test]
fn a_flooding_rank_is_capped_its_metrics_kept_and_the_node_answers() {
    // Phase 1: one node with a low cap.
    let root = tempfile::Builder::new()
        .prefix("rl-flood-")
        .tempdir()
        .unwrap();
    let extra = [
        "--rank-log-bytes-per-s".to_string(),
        CAP_BYTES_PER_S.to_string(),
    ];
    let c = common::formed_cluster(&root.path().join("nodes"), "fl", 1, &extra, WAIT);
    let pid = c.nodes[0].pid().unwrap();
    let api = c.nodes[0].info.api_addr.clone();

    // Phase 2: /healthz is polled from another thread while the job floods.
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let done = done.clone();
        std::thread::spawn(move || {
            let (mut polls, mut slowest) = (0u32, Duration::ZERO);
            while !done.load(Ordering::Relaxed) {
                let took = healthz(&api).unwrap_or_else(|e| panic!("/healthz failed: {e}"));
                slowest = slowest.max(took);
                polls += 1;
                std::thread::sleep(HEALTH_POLL);
            }
            (polls, slowest)
        })
    };

    // Phase 3: the flood: ~50 MB of junk lines with a metric line every 10 000.
    let program = format!(
        "BEGIN {{ junk = sprintf(\"%0100d\", 0); for (i = 1; i <= {JUNK_LINES}; i++) {{ print junk; \
         if (i % {METRIC_EVERY} == 0) print \"ringleader-metric loss 0.5 \" i }} \
         print \"ringleader-metric flood_done 1\" }}"
    );
    let spec = format!(
        "name = \"flood\"\nkind = \"command\"\nworkers = 1\ncommand = [\"awk\", '{program}']\n"
    );
    let cpu_before = cpu_ms(pid);
    let started = Instant::now();
    let id = c.nodes[0].client().submit(&spec).expect("submit");
    let doc = common::wait_job(&c, 0, &id, "succeeded", WAIT, |d| match d.state.as_str() {
        "failed" | "cancelled" => panic!("job {id} ended {}: {d:#?}", d.state),
        s => s == "succeeded",
    });
    let elapsed = started.elapsed();
    let cpu = cpu_ms(pid) - cpu_before;
    done.store(true, Ordering::Relaxed);
    let (polls, slowest) = poller.join().expect("the /healthz poller");
    eprintln!(
        "flood: node cpu {cpu} ms over {} ms for {} MB; /healthz {polls} polls, slowest {} ms",
        elapsed.as_millis(),
        JUNK_LINES * 101 / 1_000_000,
        slowest.as_millis()
    );
    assert!(polls > 0 && slowest < HEALTH_LATENCY_MAX, "{slowest:?}");

    // Phase 4: the metrics arrived, the last value included.
    assert_eq!(doc.metrics.get("loss"), Some(&0.5), "{doc:#?}");
    assert_eq!(doc.metrics.get("flood_done"), Some(&1.0), "{doc:#?}");

    // Phase 5: the log kept every metric line, says what it dropped, and stays in bound.
    let log_path = the_log(&c.nodes[0].dir.join("jobs").join(&id));
    let log = std::fs::read_to_string(&log_path).unwrap();
    let metric_lines = log
        .lines()
        .filter(|l| l.starts_with("ringleader-metric loss 0.5 "))
        .count() as u64;
    assert_eq!(metric_lines, JUNK_LINES / METRIC_EVERY);
    assert!(log.contains("ringleader-metric flood_done 1"));
    assert!(
        log.contains("ringleader: log rate cap"),
        "a note of the drops"
    );
    let burst = CAP_BYTES_PER_S * ringleader::jobs::log_rate::RANK_LOG_BURST_S;
    let bound = CAP_BYTES_PER_S * (elapsed.as_secs() + 1) + burst + 64 * 1024;
    assert!(
        (log.len() as u64) <= bound,
        "log {} bytes, bound {bound}",
        log.len()
    );
    assert!(
        (log.len() as u64) < JUNK_LINES * 101 / 10,
        "most of the flood was dropped"
    );
}
