//! Real-process tests of elastic jobs: a 3-node cluster runs a job with `min_workers = 2`,
//! a fault is injected (a rank's process killed, a whole node killed, a rank stopped with
//! SIGSTOP), and the ring re-forms as a new generation inside the same attempt. Each test
//! asserts the generation's reason in `history`, that the survivors' processes are the ones
//! that started (train jobs keep their state in memory), and that the job ends `succeeded`.
//!
//! Waits poll with deadlines; every node is stopped by PID when its cluster is dropped, and
//! the worker processes die with their nodes' process groups.

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

mod common;

use common::signal;
use common::{exe, POLL};
use ringleader::{
    api::status::JobDoc,
    cli::local::{process_alive as alive, train_workers_in, LocalCluster, Throttle},
};

/// Bound on each wait (a debug build on two cores is slow).
const WAIT: Duration = Duration::from_secs(120);

/// One test at a time: each runs a 3-node cluster with 3 training ranks on this host, and
/// the hang test's silence bound should not race a machine loaded by the others.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The test-only step delay of every train job's workers here, so a fault lands mid-run. A
/// test hook: set in the nodes' environment, which their ranks inherit (a spec's `env` may
/// not name a `RINGLEADER_*` variable).
const STEP_DELAY: (&str, &str) = ("RINGLEADER_TEST_STEP_DELAY_MS", "15");

/// A formed cluster of `n` nodes, `e0` first (three voters: it survives losing one), whose
/// ranks get [`STEP_DELAY`].
fn cluster(root: &Path, n: usize) -> LocalCluster {
    cluster_env(root, n, &[STEP_DELAY])
}

/// [`cluster`] with `env` (test hooks) in the nodes' environment instead.
fn cluster_env(root: &Path, n: usize, env: &[(&str, &str)]) -> LocalCluster {
    let mut c = LocalCluster::new(exe(), root);
    c.env = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    c.start("e0", &[]).unwrap();
    for i in 1..n {
        c.start_joining(&format!("e{i}"), &[]).unwrap();
    }
    common::wait_formed(&c, n, WAIT);
    c
}

/// Polls node `i`'s view of job `id` until `cond` holds.
fn wait_job(
    c: &LocalCluster,
    i: usize,
    id: &str,
    what: &str,
    cond: impl Fn(&JobDoc) -> bool,
) -> JobDoc {
    common::wait_job(c, i, id, what, WAIT, cond)
}

/// A train job of 3 workers that may go down to 2; commits in memory every 5 steps (the
/// nodes' [`STEP_DELAY`] slows it); a member that left may join again after 1 s (not the
/// default 10 s: the tests wait for the growth, then for the end).
fn train_spec(name: &str, steps: u32) -> String {
    format!(
        r#"
name = "{name}"
kind = "train"
workers = 3
min_workers = 2
max_workers = 3
max_restarts = 0
[model]
arch = "mlp"
hidden = [64]
[data]
dataset = "digits"
[train]
epochs = 500
max_steps = {steps}
batch_per_worker = 32
lr = 0.05
[checkpoint]
every_steps = 1000
keep = 1
commit_every_steps = 5
[elastic]
rejoin_after_s = 1
"#
    )
}

/// Steps of a [`train_fault`] job: enough that the member joins again before the end. It
/// does 1 to 5 s after the re-form (`rejoin_after_s`, then its standby's start, or its
/// node's restart); the latest re-form, a deadlock's (named after 3 s without progress),
/// comes about 9 s in. [`STEP_DELAY`] caps the steps at 66 a second: at most 940 steps by
/// then on any machine; 290 here (2 cores, debug), 1,000 in about 25 s.
const TRAIN_FAULT_STEPS: u32 = 1_000;

fn history_reasons(doc: &JobDoc) -> Vec<String> {
    doc.history.iter().map(|h| h.reason.clone()).collect()
}

/// What a fault leaves for the test to do once the ring re-formed.
enum After {
    /// Nothing: the victim's member is alive and joins again by itself.
    Nothing,
    /// Restart node `i` (it was killed); it joins again.
    Restart(usize),
    /// The victim process was stopped: its node must kill it (a stale worker never comes
    /// back into the ring); then nothing.
    Reaped,
    /// Node `i` and the victim were frozen (SIGSTOP, a host that hangs): wake the victim
    /// first, while its node still sleeps, and see the new ring go on without it; then wake
    /// the node, which kills its stale worker.
    Thaw(usize),
}

/// Runs a train job, injects `fault` on rank 2 once training is under way, and checks the
/// re-form (a generation with `reason_prefix`, survivors' processes unchanged, restored from
/// memory, at most one commit interval of steps lost), the growth back to 3 workers when
/// the member is available again (`joined`, the joiner's state by broadcast), and success.
fn train_fault(
    name: &str,
    fault: impl FnOnce(&mut LocalCluster, &JobDoc, u32) -> After,
    reason_prefix: &str,
) {
    train_fault_env(name, &[], fault, reason_prefix)
}

/// [`train_fault`] with more test hooks in the nodes' environment (their ranks inherit it).
fn train_fault_env(
    name: &str,
    env: &[(&str, &str)],
    fault: impl FnOnce(&mut LocalCluster, &JobDoc, u32) -> After,
    reason_prefix: &str,
) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::Builder::new()
        .prefix("rl-elastic-")
        .tempdir()
        .unwrap();
    let mut c = cluster_env(root.path(), 3, &[&[STEP_DELAY], env].concat());
    let id = c.nodes[0]
        .client()
        .submit(&train_spec(name, TRAIN_FAULT_STEPS))
        .unwrap();

    // Phase 1: under way on 3 workers, one process per rank.
    let doc = wait_job(&c, 0, &id, "past step 30", |d| {
        d.state == "running" && d.ring.len() == 3 && d.step.is_some_and(|s| s >= 30)
    });
    let workers = train_workers_in(&id, root.path());
    assert_eq!(workers.len(), 3, "{workers:?}");
    let by_rank: BTreeMap<u32, u32> = workers.iter().map(|(p, r)| (*r, *p)).collect();
    let victim = by_rank[&2];
    let victim_node = doc.ring[2].clone();
    let survivors = [by_rank[&0], by_rank[&1]];

    // Phase 2: the fault; the ring re-forms as generation 2 of the same attempt.
    let after = fault(&mut c, &doc, victim);
    let observer = c
        .running()
        .into_iter()
        .find(|&i| c.nodes[i].name != victim_node)
        .unwrap();
    let reformed = wait_job(&c, observer, &id, "re-formed", |d| d.generation >= 2);
    let reasons = history_reasons(&reformed);
    assert!(
        reasons[1].starts_with(&format!("{reason_prefix}{victim_node} (rank 2)")),
        "history {reasons:?} does not start generation 2 with {reason_prefix:?}"
    );
    assert_eq!(reformed.attempt, 1, "a re-form uses no restart");
    assert_eq!(reformed.history[1].ring.len(), 2, "{:?}", reformed.history);
    for pid in survivors {
        assert!(alive(pid), "survivor {pid} was restarted");
    }
    match after {
        After::Nothing => {}
        After::Restart(i) => c.restart(i).unwrap(),
        After::Reaped => {
            let deadline = Instant::now() + WAIT;
            while alive(victim) {
                assert!(
                    Instant::now() < deadline,
                    "the stopped worker {victim} was not killed"
                );
                std::thread::sleep(POLL);
            }
        }
        After::Thaw(i) => {
            // The stale worker wakes into a ring that moved on: its old connections are
            // gone and the new generation's ports and secret are not its own, so the new
            // ring goes on undisturbed while it lives.
            signal(victim, nix::sys::signal::Signal::SIGCONT);
            let step_then = reformed.step.unwrap_or(0);
            let watch_until = Instant::now() + Duration::from_secs(3);
            let mut stepped = false;
            while Instant::now() < watch_until {
                let d = c.nodes[observer].client().job(&id).unwrap();
                assert_eq!(
                    d.generation,
                    reformed.generation,
                    "{:?}",
                    history_reasons(&d)
                );
                assert_eq!(d.state, "running");
                stepped |= d.step.unwrap_or(0) > step_then;
                for pid in survivors {
                    assert!(alive(pid), "survivor {pid} was disturbed");
                }
                std::thread::sleep(POLL);
            }
            assert!(
                stepped,
                "the new ring trained on while the stale worker was awake"
            );
            let node = c.nodes[i].pid().unwrap();
            signal(node, nix::sys::signal::Signal::SIGCONT);
            let deadline = Instant::now() + WAIT;
            while alive(victim) {
                assert!(
                    Instant::now() < deadline,
                    "the stale worker {victim} was not stopped by its node"
                );
                std::thread::sleep(POLL);
            }
        }
    }

    // Phase 3: the member is back: the ring grows to 3 again with it.
    let grown = wait_job(&c, observer, &id, "grown back", |d| {
        d.history
            .iter()
            .any(|h| h.reason == format!("joined {victim_node}"))
            || d.state != "running"
    });
    assert_eq!(
        grown.state, "running",
        "finished before the member joined again"
    );
    let joined = grown
        .history
        .iter()
        .find(|h| h.reason.starts_with("joined"))
        .unwrap();
    assert_eq!(joined.ring.len(), 3, "{:?}", grown.history);

    // Phase 4: the job finishes; survivors kept their processes all along.
    let deadline = Instant::now() + WAIT;
    let done = loop {
        let doc = c.nodes[observer].client().job(&id).unwrap();
        if matches!(doc.state.as_str(), "succeeded" | "failed" | "cancelled") {
            break doc;
        }
        if Instant::now() > deadline {
            let tails: Vec<(std::path::PathBuf, Vec<String>)> = c
                .job_logs(&id)
                .into_iter()
                .map(|(p, t)| {
                    let lines: Vec<String> = t.lines().map(str::to_owned).collect();
                    (p, lines[lines.len().saturating_sub(12)..].to_vec())
                })
                .collect();
            panic!("job {id} did not finish: {doc:#?}\n{tails:#?}");
        }
        std::thread::sleep(POLL);
    };
    let logs = c.job_logs(&id);
    assert_eq!(done.state, "succeeded", "{done:#?}\n{logs:#?}");
    let resumed = |generation: u32, source: &str| {
        logs.iter()
            .flat_map(|(_, t)| t.lines())
            .filter(|l| {
                l.starts_with(&format!(
                    "ringleader-elastic resumed generation={generation} "
                )) && l.ends_with(&format!("source={source}"))
            })
            .count()
    };
    assert_eq!(
        resumed(2, "memory"),
        2,
        "both survivors restore from memory: {logs:#?}"
    );
    assert_eq!(
        resumed(3, "broadcast"),
        1,
        "the joiner gets the state by broadcast"
    );
    let lost = done.metrics.get("steps_lost").copied().unwrap_or(f64::NAN);
    assert!(
        lost <= 5.0,
        "at most one commit interval of steps lost, got {lost}"
    );
    let acc = done.metrics.get("val_accuracy").copied().unwrap_or(0.0);
    assert!(
        acc > 0.9,
        "training went on to a good model: val_accuracy {acc}"
    );
    c.stop_all();
}

#[test]
fn killed_rank_process_survivors_keep_training() {
    train_fault(
        "kill-rank",
        |_, _, victim| {
            signal(victim, nix::sys::signal::Signal::SIGKILL);
            After::Nothing
        },
        "peer-lost ",
    );
}

#[test]
fn killed_node_survivors_keep_training_and_take_it_back() {
    train_fault(
        "kill-node",
        |c, doc, _| {
            let name = doc.ring[2].clone();
            let i = c.nodes.iter().position(|n| n.name == name).unwrap();
            c.kill9(i).unwrap();
            After::Restart(i)
        },
        "peer-lost ",
    );
}

#[test]
fn stopped_rank_is_named_hung_left_out_and_killed() {
    train_fault(
        "hang",
        |_, _, victim| {
            signal(victim, nix::sys::signal::Signal::SIGSTOP);
            After::Reaped
        },
        "hung ",
    );
}

#[test]
fn frozen_host_wakes_its_stale_worker_cannot_disturb_the_new_ring() {
    // The host hangs (node and worker stopped): gossip declares it dead, the ring re-forms;
    // then the worker wakes first (SIGCONT), then its node.
    train_fault(
        "thaw",
        |c, doc, victim| {
            let name = doc.ring[2].clone();
            let i = c.nodes.iter().position(|n| n.name == name).unwrap();
            signal(c.nodes[i].pid().unwrap(), nix::sys::signal::Signal::SIGSTOP);
            signal(victim, nix::sys::signal::Signal::SIGSTOP);
            After::Thaw(i)
        },
        "peer-lost ",
    );
}

#[test]
fn deadlocked_rank_is_named_hung_by_its_heartbeat() {
    // The worker started as rank 2 never returns from step 60's forward pass.
    train_fault_env(
        "deadlock",
        &[("RINGLEADER_TEST_HANG", "2:60")],
        |_, _, _| After::Reaped,
        "hung ",
    );
}

#[test]
fn elastic_command_job_restarts_every_rank_with_the_new_world_size() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::Builder::new()
        .prefix("rl-elastic-cmd-")
        .tempdir()
        .unwrap();
    let mut c = cluster(root.path(), 3);
    let done_file = root.path().join("done");
    let spec = format!(
        r#"
name = "elastic-cmd"
kind = "command"
workers = 3
min_workers = 2
max_restarts = 0
command = ["sh", "-c", "echo world=$WORLD_SIZE restart=$TORCHELASTIC_RESTART_COUNT rank=$RANK; while [ ! -e {} ]; do sleep 0.05; done"]
"#,
        done_file.display()
    );
    let id = c.nodes[0].client().submit(&spec).unwrap();
    let doc = wait_job(&c, 0, &id, "running on 3", |d| {
        d.state == "running" && d.ring.len() == 3
    });
    // The victim is a node that is not rank 0's.
    let name = doc.ring[2].clone();
    let victim = c.nodes.iter().position(|n| n.name == name).unwrap();
    c.kill9(victim).unwrap();
    let observer = if victim == 0 { 1 } else { 0 };
    let reformed = wait_job(&c, observer, &id, "re-formed on 2", |d| {
        d.generation == 2 && d.ring.len() == 2
    });
    let reason = &reformed.history[1].reason;
    assert!(
        reason.starts_with(&format!("peer-lost {name} (rank 2): member dead")),
        "{reason}"
    );
    // Every rank of generation 2 runs again with WORLD_SIZE 2 and the restart count up.
    let deadline = Instant::now() + WAIT;
    loop {
        let lines: Vec<String> = c
            .job_logs(&id)
            .into_iter()
            .filter(|(p, _)| p.to_string_lossy().contains("generation-2"))
            .flat_map(|(_, t)| t.lines().map(str::to_owned).collect::<Vec<_>>())
            .collect();
        let restarted = lines
            .iter()
            .filter(|l| l.starts_with("world=2 restart=1"))
            .count();
        if restarted == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "generation 2's ranks: {lines:?}");
        std::thread::sleep(POLL);
    }
    std::fs::write(&done_file, b"").unwrap();
    let done = wait_job(&c, observer, &id, "succeeded", |d| d.state == "succeeded");
    assert_eq!((done.generation, done.attempt), (2, 1));
    c.stop_all();
}

#[test]
fn throttled_rank_is_dropped_as_a_straggler_and_blacklisted() {
    if !Throttle::available() {
        eprintln!("SKIPPED throttled_rank_is_dropped_as_a_straggler_and_blacklisted: needs root and cgroup v1's cpu controller");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::Builder::new()
        .prefix("rl-elastic-slow-")
        .tempdir()
        .unwrap();
    // Real compute (no step delay) so the throttled rank's compute time stands out.
    let mut c = cluster_env(root.path(), 3, &[]);
    let spec = train_spec("straggler", 3_000)
        .replace("hidden = [64]", "hidden = [256, 256]")
        .replace(
            "rejoin_after_s = 1\n",
            "rejoin_after_s = 1\nstraggler_window = 10\n",
        );
    assert!(!spec.contains("DELAY"), "{spec}");
    let id = c.nodes[0].client().submit(&spec).unwrap();
    let doc = wait_job(&c, 0, &id, "past step 30", |d| {
        d.state == "running" && d.step.is_some_and(|s| s >= 30)
    });
    let by_rank: BTreeMap<u32, u32> = train_workers_in(&id, root.path())
        .iter()
        .map(|(p, r)| (*r, *p))
        .collect();
    let slow_node = doc.ring[2].clone();
    let throttle = Throttle::new(by_rank[&2], 5).unwrap();

    // The ring drops it after its window, the member is blacklisted, the survivors go on.
    let reformed = wait_job(&c, 0, &id, "straggler dropped", |d| d.generation >= 2);
    drop(throttle);
    let reason = &reformed.history[1].reason;
    assert!(
        reason.starts_with(&format!("straggler {slow_node} (rank 2)")),
        "{reason}"
    );
    assert!(alive(by_rank[&0]) && alive(by_rank[&1]), "survivors kept");
    let status = c.status(0).unwrap();
    let member = status.members.iter().find(|m| m.name == slow_node).unwrap();
    assert!(member.blacklisted, "{member:?}");
    assert!(
        member
            .blacklist_reason
            .as_deref()
            .is_some_and(|r| r.contains("straggler")),
        "{member:?}"
    );
    let done = wait_job(&c, 0, &id, "finished", |d| d.state != "running");
    assert_eq!(done.state, "succeeded", "{done:#?}");
    // Blacklisted for the default 60 s: not taken back before the cooldown ends (after it, a
    // long run may take it back).
    let dropped_at = reformed.history[1].at_ms;
    assert!(
        done.history
            .iter()
            .filter(|h| h.reason.starts_with("joined"))
            .all(|h| h.at_ms >= dropped_at + 60_000),
        "a blacklisted member was taken back during its cooldown: {:?}",
        done.history
    );
    c.stop_all();
}

#[test]
fn chief_killed_with_a_rank_the_new_chief_reforms() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::Builder::new()
        .prefix("rl-elastic-chief-")
        .tempdir()
        .unwrap();
    // The first node bootstraps the cluster and is its chief; its name sorts last, so the
    // job's three workers are placed on the other three.
    let mut c = LocalCluster::new(exe(), root.path());
    c.env = vec![(STEP_DELAY.0.into(), STEP_DELAY.1.into())];
    c.start("z-chief", &[]).unwrap();
    for name in ["a1", "a2", "a3"] {
        c.start_joining(name, &[]).unwrap();
    }
    c.wait_all(WAIT, "formed with 3 voters", |s| {
        s.names_in("alive").len() == 4
            && s.chief.as_ref().is_some_and(|ch| ch.name == "z-chief")
            && s.members.iter().filter(|m| m.voter).count() == 3
    })
    .unwrap();
    let id = c.nodes[1]
        .client()
        .submit(&train_spec("chief", 1_200))
        .unwrap();
    let doc = wait_job(&c, 1, &id, "past step 30", |d| {
        d.state == "running" && d.step.is_some_and(|s| s >= 30)
    });
    assert_eq!(doc.ring, ["a1", "a2", "a3"]);
    let by_rank: BTreeMap<u32, u32> = train_workers_in(&id, root.path())
        .iter()
        .map(|(p, r)| (*r, *p))
        .collect();

    // Rank 2's process and the chief die together: the next chief makes the re-form.
    signal(by_rank[&2], nix::sys::signal::Signal::SIGKILL);
    c.kill9(0).unwrap();
    let reformed = wait_job(&c, 1, &id, "re-formed by the new chief", |d| {
        d.generation >= 2
    });
    assert!(
        reformed.history[1]
            .reason
            .starts_with("peer-lost a3 (rank 2)"),
        "{:?}",
        reformed.history
    );
    let status = c.status(1).unwrap();
    assert!(
        status.chief.as_ref().is_some_and(|ch| ch.name != "z-chief"),
        "{:?}",
        status.chief
    );
    assert!(alive(by_rank[&0]) && alive(by_rank[&1]), "survivors kept");
    let done = wait_job(&c, 1, &id, "finished", |d| d.state != "running");
    assert_eq!(done.state, "succeeded", "{done:#?}");
    assert_eq!(done.attempt, 1);
    c.stop_all();
}
