//! Real-process tests of elastic command jobs (`[elastic] protocol`): a 3-node cluster runs
//! a command job of 3 ranks with `min_workers = 2`, each rank a small Python script (the
//! standard library only, carried in the spec's `[[files]]`: `elastic_command/rank.py`)
//! that follows its generations and logs each as `gen=G rank=R world=N pid=P`.
//!
//! - `protocol = "ringleader"`: a rank's process killed or stopped (named hung), or a whole
//!   node killed, re-forms the ring to 2 with the survivors' processes unchanged, told
//!   generation 2 on stdin; the returning node joins at generation 3; the job succeeds;
//! - a script that never speaks the protocol fails the job, saying it must use
//!   `ringleader.torch`;
//! - `protocol = "torchrun"` (the default): a lost rank starts every rank again.
//!
//! Waits poll with deadlines; every node is stopped by PID when its cluster is dropped, and
//! the ranks die with their nodes.

use std::{
    collections::BTreeSet,
    path::Path,
    time::{Duration, Instant},
};

mod common;

use common::signal;
use common::{wait_job, POLL};
use nix::sys::signal::Signal;
use ringleader::{
    api::status::JobDoc,
    cli::local::{process_alive as alive, LocalCluster},
};

/// Bound on each wait (a debug build on two cores is slow).
const WAIT: Duration = Duration::from_secs(120);

/// One test at a time: each runs a 3-node cluster with 3 ranks on this host.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The fake elastic rank.
const RANK_PY: &str = include_str!("elastic_command/rank.py");

/// One test's place: its turn ([`SERIAL`]), its directory, a formed cluster of 3 nodes
/// (`c0` first), and the path of the file that ends its job's ranks.
struct Setup {
    _serial: std::sync::MutexGuard<'static, ()>,
    c: LocalCluster,
    done: std::path::PathBuf,
    /// Removed last, after the cluster is dropped.
    _root: tempfile::TempDir,
}

fn setup() -> Setup {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::Builder::new()
        .prefix("rl-elastic-cmd-")
        .tempdir()
        .unwrap();
    Setup {
        _serial: serial,
        c: common::formed_cluster(root.path(), "c", 3, &[], WAIT),
        done: root.path().join("done"),
        _root: root,
    }
}

/// A command job of 3 ranks that may go down to 2, running `command` with the fake rank in
/// its working directory; `elastic` is its `[elastic]` table's body. Its ranks end when
/// `done` exists.
fn spec(name: &str, command: &str, elastic: &str, done: &Path) -> String {
    let script = toml::Value::String(RANK_PY.into());
    format!(
        r#"
name = "{name}"
kind = "command"
workers = 3
min_workers = 2
max_restarts = 0
command = {command}
[env]
DONE_FILE = "{}"
[elastic]
{elastic}
[[files]]
path = "rank.py"
text = {script}
"#,
        done.display()
    )
}

/// The generations the ranks of job `id` logged: (generation, rank, world, pid).
fn joins(c: &LocalCluster, id: &str) -> BTreeSet<(u32, u32, u32, u32)> {
    let field = |l: &str, k: &str| -> Option<u32> {
        l.split(' ')
            .find_map(|w| w.strip_prefix(k)?.strip_prefix('='))?
            .parse()
            .ok()
    };
    c.job_logs(id)
        .iter()
        .flat_map(|(_, t)| t.lines())
        .filter(|l| l.starts_with("gen="))
        .filter_map(|l| {
            Some((
                field(l, "gen")?,
                field(l, "rank")?,
                field(l, "world")?,
                field(l, "pid")?,
            ))
        })
        .collect()
}

/// Polls the logs of job `id` until `cond` holds of its ranks' joins.
fn wait_joins(
    c: &LocalCluster,
    id: &str,
    what: &str,
    cond: impl Fn(&BTreeSet<(u32, u32, u32, u32)>) -> bool,
) -> BTreeSet<(u32, u32, u32, u32)> {
    let deadline = Instant::now() + WAIT;
    loop {
        let seen = joins(c, id);
        if cond(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "job {id}: {what} not within {WAIT:?}; joins {seen:?}\n{:#?}",
            c.job_logs(id)
        );
        std::thread::sleep(POLL);
    }
}

/// The pids of generation `g`'s ranks, in rank order, once all `world` have logged it.
fn generation_pids(c: &LocalCluster, id: &str, g: u32, world: u32) -> Vec<u32> {
    let seen = wait_joins(c, id, &format!("generation {g} on {world}"), |s| {
        s.iter().filter(|j| j.0 == g && j.2 == world).count() == world as usize
    });
    seen.iter()
        .filter(|j| j.0 == g && j.2 == world)
        .map(|j| j.3)
        .collect()
}

/// Submits a job of 3 fake ranks (`rank.py`) with `elastic`, and waits until generation 1
/// runs on 3: its id, its document then, and its ranks' pids in rank order.
fn start_fake_ranks(
    c: &LocalCluster,
    name: &str,
    elastic: &str,
    done: &Path,
) -> (String, JobDoc, Vec<u32>) {
    let text = spec(name, r#"["python3", "rank.py"]"#, elastic, done);
    let id = c.nodes[0].client().submit(&text).unwrap();
    let doc = wait_job(c, 0, &id, "running on 3", WAIT, |d| {
        d.state == "running" && d.ring.len() == 3
    });
    let pids = generation_pids(c, &id, 1, 3);
    (id, doc, pids)
}

/// What the test does to rank 2 of the ringleader job.
enum Fault {
    /// SIGKILL its process.
    KillRank,
    /// SIGKILL its node, and start the node again once the ring re-formed: it joins.
    KillNode,
    /// SIGSTOP its process: its node names it hung, and kills it once the ring re-formed.
    StopRank,
}

/// Runs a ringleader-protocol job, injects `fault` on rank 2, and checks the re-form: the
/// history names the reason, the two survivors keep their processes and log generation 2
/// with world 2 (their new generation arrived on stdin); after a node's return, it joins at
/// generation 3; the job succeeds.
fn ringleader_fault(name: &str, fault: Fault, reason: impl Fn(&str) -> String) {
    let mut s = setup();
    let Setup { c, done, .. } = &mut s;
    // Phase 1: generation 1 on 3 ranks, each with its first generation from stdin.
    // A member that left may join again after 1 s, not the default 10 s.
    let elastic = "protocol = \"ringleader\"\nrejoin_after_s = 1";
    let (id, doc, pids) = start_fake_ranks(c, name, elastic, done);
    let victim_node = doc.ring[2].clone();
    let victim = c.nodes.iter().position(|n| n.name == victim_node).unwrap();
    let observer = if victim == 0 { 1 } else { 0 };

    // Phase 2: the fault; generation 2 keeps the survivors' processes.
    match fault {
        Fault::KillRank => signal(pids[2], Signal::SIGKILL),
        Fault::KillNode => c.kill9(victim).unwrap(),
        Fault::StopRank => signal(pids[2], Signal::SIGSTOP),
    }
    let reformed = wait_job(c, observer, &id, "re-formed on 2", WAIT, |d| {
        d.generation >= 2
    });
    let expected = reason(&victim_node);
    assert!(
        reformed.history[1].reason.starts_with(&expected),
        "generation 2's reason {:?} does not start with {expected:?}",
        reformed.history[1].reason
    );
    assert_eq!(reformed.history[1].ring.len(), 2, "{:?}", reformed.history);
    assert_eq!(reformed.attempt, 1, "a re-form uses no restart");
    let survivors = generation_pids(c, &id, 2, 2);
    assert_eq!(
        survivors,
        pids[..2],
        "the survivors of generation 1 go on in generation 2 in their own processes"
    );
    for pid in &survivors {
        assert!(alive(*pid), "survivor {pid} ended");
    }

    // Phase 3 (a rank stopped): its node kills it, the ring no longer wanting it.
    if let Fault::StopRank = fault {
        let deadline = Instant::now() + WAIT;
        while alive(pids[2]) {
            assert!(Instant::now() < deadline, "the stopped rank was not killed");
            std::thread::sleep(POLL);
        }
    }
    // Phase 3 (a node killed): it returns and joins at the next generation, a new process
    // told generation 3 on stdin; the survivors go on in theirs.
    if let Fault::KillNode = fault {
        c.restart(victim).unwrap();
        let grown = wait_job(c, observer, &id, "grown back", WAIT, |d| {
            d.history
                .iter()
                .any(|h| h.reason == format!("joined {victim_node}"))
        });
        let g = grown.generation;
        let now = generation_pids(c, &id, g, 3);
        assert_eq!(now[..2], survivors, "the survivors joined generation {g}");
        assert!(!pids.contains(&now[2]), "the joiner is a new process");
    }

    // Phase 4: the ranks end by themselves; the job succeeds in its first attempt.
    std::fs::write(done, b"").unwrap();
    let end = wait_job(c, observer, &id, "finished", WAIT, |d| d.state != "running");
    assert_eq!(end.state, "succeeded", "{end:#?}\n{:#?}", c.job_logs(&id));
    assert_eq!(end.attempt, 1);
    c.stop_all();
}

#[test]
fn ringleader_protocol_killed_rank_survivors_keep_their_processes() {
    ringleader_fault("rl-kill-rank", Fault::KillRank, |node| {
        format!("peer-lost {node} (rank 2): exited with code 137")
    });
}

#[test]
fn ringleader_protocol_killed_node_survivors_keep_their_processes_and_it_rejoins() {
    ringleader_fault("rl-kill-node", Fault::KillNode, |node| {
        format!("peer-lost {node} (rank 2): member dead")
    });
}

#[test]
fn ringleader_protocol_stopped_rank_is_named_hung_survivors_keep_their_processes() {
    ringleader_fault("rl-hang", Fault::StopRank, |node| {
        format!("hung {node} (rank 2): its process is stopped")
    });
}

#[test]
fn ringleader_protocol_script_that_never_speaks_it_fails_the_job() {
    let s = setup();
    let Setup { c, done, .. } = &s;
    // A plain script: it never reads its generations nor prints a heartbeat.
    let text = spec(
        "rl-silent",
        r#"["python3", "-c", "import time; print('training', flush=True); time.sleep(120)"]"#,
        "protocol = \"ringleader\"\nfirst_heartbeat_s = 2",
        done,
    );
    let id = c.nodes[0].client().submit(&text).unwrap();
    let end = wait_job(c, 0, &id, "finished", WAIT, |d| {
        d.state != "running" && d.state != "pending"
    });
    assert_eq!(end.state, "failed", "{end:#?}");
    let events = serde_json::to_string(&end.events).unwrap();
    assert!(
        events.contains("within 2 s of starting")
            && events.contains("must use ringleader.torch (call rlt.init())"),
        "{events}"
    );
}

#[test]
fn torchrun_protocol_starts_every_rank_again() {
    let mut s = setup();
    let Setup { c, done, .. } = &mut s;
    // The default, said out loud: the ranks read their generation from the environment.
    let (id, doc, pids) = start_fake_ranks(c, "torchrun", "protocol = \"torchrun\"", done);
    signal(pids[2], Signal::SIGKILL);
    let reformed = wait_job(c, 0, &id, "re-formed on 2", WAIT, |d| d.generation >= 2);
    let expected = format!("peer-lost {} (rank 2): exited with code 137", doc.ring[2]);
    assert!(
        reformed.history[1].reason.starts_with(&expected),
        "{:?}",
        reformed.history
    );
    // Every rank of generation 2 is a new process, started with WORLD_SIZE 2.
    let restarted = generation_pids(c, &id, 2, 2);
    assert!(
        restarted.iter().all(|p| !pids.contains(p)),
        "generation 1 {pids:?}, generation 2 {restarted:?}"
    );
    let deadline = Instant::now() + WAIT;
    while pids.iter().any(|p| alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "generation 1's ranks were not stopped"
        );
        std::thread::sleep(POLL);
    }
    std::fs::write(done, b"").unwrap();
    let end = wait_job(c, 0, &id, "finished", WAIT, |d| d.state != "running");
    assert_eq!(end.state, "succeeded", "{end:#?}");
    assert_eq!((end.generation, end.attempt), (2, 1));
    c.stop_all();
}
