//! Real processes: `collective-bench` ranks on 127.0.0.1; one is killed with SIGKILL in the
//! middle of its allreduces and every survivor must exit with `peer lost: rank 2` promptly,
//! with the links on shared memory (the default between processes on one host) and on TCP.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const WORLD: usize = 4;
const VICTIM: usize = 2;

fn free_ports(n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| collective::testing::unused_local_port())
        .collect()
}

struct Ranks(Vec<Child>);

impl Ranks {
    /// Kills every rank and returns what each wrote on stderr, for a failure's message.
    fn stop_and_read_stderr(&mut self) -> String {
        let mut said = String::new();
        for (rank, c) in self.0.iter_mut().enumerate() {
            let _ = c.kill();
            let status = c.wait();
            let mut err = String::new();
            if let Some(mut e) = c.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            said.push_str(&format!("rank {rank} ({status:?}): {err}\n"));
        }
        said
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn sigkill_of_a_rank_fails_every_survivor_quickly_over_shm() {
    sigkill_of_a_rank(&[]);
}

#[test]
fn sigkill_of_a_rank_fails_every_survivor_quickly_over_tcp() {
    sigkill_of_a_rank(&["--no-shm"]);
}

/// Tries to start a group this many times: a port the test found free may be bound by
/// another process before the rank binds it (the probe must release it for the rank).
const START_TRIES: usize = 3;

/// Starts `WORLD` ranks on fresh ports and waits until rank 0 has printed its 4K line
/// (2000 quick iterations; it then loops on 1 MiB allreduces for far longer than the test).
/// A start that lost a port to another process is tried again on other ports; any other
/// failure, or `START_TRIES` lost races, fails the test with what every rank said.
fn start_running_group(extra: &[&str]) -> Ranks {
    for attempt in 1..=START_TRIES {
        let peers: Vec<String> = free_ports(WORLD)
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let peers = peers.join(",");
        let mut ranks = Ranks(Vec::new());
        for rank in 0..WORLD {
            let child = Command::new(env!("CARGO_BIN_EXE_collective-bench"))
                .args(["--world", &WORLD.to_string(), "--rank", &rank.to_string()])
                .args([
                    "--peers", &peers, "--sizes", "4K,1M", "--iters", "2000", "--warmup", "1",
                ])
                .args(extra)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn collective-bench");
            ranks.0.push(child);
        }
        let stdout = ranks.0[0].stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        if line.starts_with("allreduce world=4 size=4096 ") {
            return ranks;
        }
        let said = ranks.stop_and_read_stderr();
        if said.contains("Address already in use") && attempt < START_TRIES {
            eprintln!(
                "start {attempt}: a port was taken before its rank bound it; again on others:\n{said}"
            );
            continue;
        }
        panic!(
            "rank 0 did not report the first size (it printed {line:?}); the ranks said:\n{said}"
        );
    }
    unreachable!("the last try returns or panics")
}

fn sigkill_of_a_rank(extra: &[&str]) {
    // Phase 1: the group runs.
    let mut ranks = start_running_group(extra);

    // Phase 2: SIGKILL one rank in the middle of the 1 MiB loop.
    ranks.0[VICTIM].kill().unwrap();
    let killed_at = Instant::now();
    ranks.0[VICTIM].wait().unwrap();

    // Phase 3: every survivor exits with an error naming the lost rank, quickly.
    let deadline = killed_at + Duration::from_secs(10);
    for (rank, child) in ranks.0.iter_mut().enumerate() {
        if rank == VICTIM {
            continue;
        }
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "rank {rank} still running 10 s after the kill"
            );
            std::thread::sleep(Duration::from_millis(10)); // polling a child, with a deadline
        };
        let exited_after = killed_at.elapsed();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(!status.success(), "rank {rank} must fail");
        assert!(err.contains("peer lost: rank 2"), "rank {rank}: {err}");
        assert!(
            exited_after < Duration::from_secs(2),
            "rank {rank} took {exited_after:?}"
        );
    }
}
