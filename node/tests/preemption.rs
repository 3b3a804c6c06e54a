//! Real-process tests of preemption (`ringleader job preempt`, `job grow`): a 4-node
//! cluster runs an elastic train job of 4 workers; the admin shrinks it to 2 and grows it
//! back. The survivors keep their processes, no step is lost, and the global batch is kept
//! (samples per step unchanged in the metrics, by gradient accumulation). A rigid command
//! job that checkpoints on SIGTERM is requeued for another job and resumes from its
//! checkpoint, using none of its restarts.
//!
//! Waits poll with deadlines; every node is stopped by PID when its cluster is dropped, and
//! the worker processes die with their nodes' process groups.

use std::{path::Path, time::Duration};

mod common;

use common::{exe, ok};
use ringleader::cli::local::{process_alive as alive, train_workers_in, LocalCluster};

/// Bound on each wait (a debug build on two cores is slow).
const WAIT: Duration = Duration::from_secs(120);

/// One test at a time: each runs a cluster and its ranks on this host.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The test-only step delay of every train rank, so the job is still running when the
/// preemption lands.
const STEP_DELAY: (&str, &str) = ("RINGLEADER_TEST_STEP_DELAY_MS", "15");

fn cluster(root: &Path, n: usize) -> LocalCluster {
    let mut c = LocalCluster::new(exe(), root);
    c.env = vec![(STEP_DELAY.0.to_owned(), STEP_DELAY.1.to_owned())];
    c.start("p0", &[]).unwrap();
    for i in 1..n {
        c.start_joining(&format!("p{i}"), &[]).unwrap();
    }
    common::wait_formed(&c, n, WAIT);
    c
}

/// An elastic train job of 4 workers that may shrink to 1; commits in memory every 5
/// steps; a member that left may join again after 1 s (`rejoin_after_s`; 10 s by default).
const SPEC: &str = r#"
name = "shrinkable"
kind = "train"
workers = 4
min_workers = 1
max_workers = 4
max_restarts = 0
[model]
arch = "mlp"
hidden = [64]
[data]
dataset = "digits"
[train]
epochs = 100000
max_steps = 1000000
batch_per_worker = 32
lr = 0.05
[checkpoint]
every_steps = 100000
keep = 1
commit_every_steps = 5
[elastic]
rejoin_after_s = 1
"#;

#[test]
fn an_elastic_train_job_shrinks_for_a_preemption_keeps_its_batch_and_grows_back() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::Builder::new()
        .prefix("rl-preempt-")
        .tempdir()
        .unwrap();
    let c = cluster(root.path(), 4);
    let id = c.nodes[0].client().submit(SPEC).unwrap();

    // Phase 1: under way on 4 workers, 4 × 32 samples a step.
    let doc = common::wait_job(&c, 0, &id, "past step 20 on 4", WAIT, |d| {
        d.state == "running" && d.ring.len() == 4 && d.step.is_some_and(|s| s >= 20)
    });
    assert_eq!(
        doc.metrics.get("samples_per_step"),
        Some(&128.0),
        "{doc:#?}"
    );
    let workers = train_workers_in(&id, root.path());
    assert_eq!(workers.len(), 4, "{workers:?}");
    let by_rank: std::collections::BTreeMap<u32, u32> =
        workers.iter().map(|(p, r)| (*r, *p)).collect();
    let survivors = [by_rank[&0], by_rank[&1]];
    let leavers = [by_rank[&2], by_rank[&3]];

    // Phase 2: the admin shrinks it to 2: one generation, the highest ranks leave.
    ok(c.cli(0)
        .args([
            "job",
            "preempt",
            &id,
            "--shrink-to",
            "2",
            "--reason",
            "make room",
        ])
        .output()
        .unwrap());
    let shrunk = common::wait_job(&c, 0, &id, "shrunk to 2", WAIT, |d| {
        d.generation == 2 && d.ring.len() == 2
    });
    let event = shrunk.history.last().unwrap();
    assert_eq!(
        event.reason, "preempted (make room): shrunk 4 → 2 (global batch kept)",
        "{:?}",
        shrunk.history
    );
    assert_eq!(shrunk.attempt, 1, "a shrink uses no restart");
    let at_step = shrunk.step.unwrap_or(0);
    // The survivors go on past the shrink: same processes, no step lost, same batch.
    let going = common::wait_job(&c, 0, &id, "20 steps past the shrink", WAIT, |d| {
        d.step.is_some_and(|s| s >= at_step + 20)
    });
    for pid in survivors {
        assert!(alive(pid), "survivor {pid} was restarted");
    }
    common::poll_until(WAIT, || leavers.iter().all(|p| !alive(*p)), |&gone| gone)
        .expect("the leavers' nodes stopped them");
    assert_eq!(
        going.metrics.get("steps_lost"),
        Some(&0.0),
        "no step lost at the shrink: {going:#?}"
    );
    // Metric reports are thinned (one a second per name): wait for two past the shrink.
    let past_shrink = |points: &Vec<(u64, f64)>| -> Vec<f64> {
        points
            .iter()
            .filter(|(s, _)| *s > at_step + 1)
            .map(|(_, v)| *v)
            .collect()
    };
    let per_step = common::poll_until(
        WAIT,
        || {
            let doc = c.nodes[0].client().job_metrics(&id).unwrap();
            doc.metrics
                .get("samples_per_step")
                .cloned()
                .unwrap_or_default()
        },
        |points| past_shrink(points).len() >= 2,
    )
    .expect("samples_per_step reported after the shrink");
    let after = past_shrink(&per_step);
    assert!(
        after.iter().all(|v| *v == 128.0),
        "2 workers × 2 micro-batches × 32 keep the global batch of 128: {per_step:?}"
    );
    // It stays at 2 while it is preempted (no growth back on its own).
    let still = c.nodes[0].client().job(&id).unwrap();
    assert_eq!(still.generation, 2, "{:?}", still.history);

    // Phase 3: capacity returned: it grows back to 4 in one generation.
    ok(c.cli(0)
        .args(["job", "grow", &id, "--to", "4"])
        .output()
        .unwrap());
    let grown = common::wait_job(&c, 0, &id, "grown to 4", WAIT, |d| {
        d.ring.len() == 4 || d.state != "running"
    });
    assert_eq!(grown.state, "running");
    let event = grown.history.last().unwrap();
    assert!(
        event.reason.starts_with("grown 2 → 4: capacity returned"),
        "{:?}",
        grown.history
    );
    for pid in survivors {
        assert!(alive(pid), "survivor {pid} was restarted by the grow");
    }
    let at_step = grown.step.unwrap_or(0);
    let going = common::wait_job(&c, 0, &id, "10 steps past the grow", WAIT, |d| {
        d.step.is_some_and(|s| s >= at_step + 10)
    });
    assert_eq!(going.metrics.get("samples_per_step"), Some(&128.0));
    assert_eq!(going.attempt, 1, "{:?}", going.history);
    ok(c.cli(0).args(["cancel", &id]).output().unwrap());
}

/// A rigid command job's script: resumes from its checkpoint (`step` in its place), counts
/// steps, and at SIGTERM saves the step it reached and exits 0 (`ringleader.Stopped`'s
/// pattern, by hand).
const COUNTER: &str = r#"
import os, signal, time, urllib.request, urllib.error
url, token = os.environ["RINGLEADER_CHECKPOINT_URL"], os.environ["RINGLEADER_CHECKPOINT_TOKEN"]
auth = {"Authorization": "Bearer " + token}
try:
    step = int(urllib.request.urlopen(urllib.request.Request(url + "/step", headers=auth)).read())
except urllib.error.HTTPError as e:
    if e.code != 404:
        raise
    step = 0
print("resumed from", step, flush=True)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
while not stop:
    step += 1
    time.sleep(0.02)
    if step % 25 == 0:
        print("at", step, flush=True)
body = str(step).encode()
urllib.request.urlopen(urllib.request.Request(url + "/step", data=body, method="PUT", headers=auth))
print("checkpointed", step, flush=True)
"#;

fn submit_script(c: &LocalCluster, name: &str, script: &str) -> String {
    let spec = serde_json::json!({
        "name": name, "kind": "command", "max_restarts": 0,
        "command": ["python3", "job.py"],
        "files": [{"path": "job.py", "text": script}],
        "preemption": {"grace_s": 20},
    });
    c.nodes[0].client().submit_json(&spec.to_string()).unwrap()
}

#[test]
fn a_rigid_job_checkpoints_is_requeued_for_another_and_resumes_without_a_restart() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::Builder::new()
        .prefix("rl-requeue-")
        .tempdir()
        .unwrap();
    // One node with room for one rank.
    let mut c = LocalCluster::new(exe(), root.path());
    c.start("q0", &["--cpus".to_owned(), "1".to_owned()])
        .unwrap();
    common::wait_formed(&c, 1, WAIT);
    let victim = submit_script(&c, "counter", COUNTER);
    common::poll_until(WAIT, || c.job_log_lines(&victim, "at "), |l| !l.is_empty())
        .expect("the counter counts");
    let wanted = submit_script(&c, "wanted", COUNTER);
    let waiting = common::wait_job(&c, 0, &wanted, "pending for room", WAIT, |d| {
        d.pending_reason.is_some()
    });
    assert_eq!(waiting.state, "pending");

    // Requeued for `wanted`: checkpoint, stop, pending; `wanted` takes the room.
    ok(c.cli(0)
        .args(["job", "preempt", &victim, "--requeue", "--for", &wanted])
        .output()
        .unwrap());
    let requeued = common::wait_job(&c, 0, &victim, "requeued", WAIT, |d| d.state == "pending");
    let reasons: Vec<&str> = requeued
        .events
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert!(
        reasons.contains(
            &format!("preempted for {wanted} (admin, priority normal): checkpointed and requeued")
                .as_str()
        ),
        "{reasons:?}"
    );
    let saved = c.job_log_lines(&victim, "checkpointed ");
    assert_eq!(saved.len(), 1, "{:#?}", c.job_logs(&victim));
    let saved_step: u64 = saved[0].split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(saved_step >= 25, "{saved:?}");
    common::wait_job(&c, 0, &wanted, "placed in the freed room", WAIT, |d| {
        d.state == "running"
    });
    let still = c.nodes[0].client().job(&victim).unwrap();
    assert_eq!(still.state, "pending", "it does not take the room back");

    // The room returns: the victim runs again, from its checkpoint, with no restart used.
    ok(c.cli(0).args(["cancel", &wanted]).output().unwrap());
    let again = common::wait_job(&c, 0, &victim, "running again", WAIT, |d| {
        d.state == "running" && d.attempt == 2
    });
    assert_eq!(again.attempt, 2);
    let resumed = common::poll_until(
        WAIT,
        || c.job_log_lines(&victim, "resumed from "),
        |l| l.len() >= 2,
    )
    .unwrap_or_else(|l| panic!("not resumed: {l:?}"));
    assert!(
        resumed.contains(&format!("resumed from {saved_step}")),
        "{resumed:?}"
    );
    ok(c.cli(0).args(["cancel", &victim]).output().unwrap());
    c.stop_all();
}

/// A search of one train trial (checkpointing every 20 steps) on one node.
const SEARCH: &str = r#"
name = "paused"
kind = "search"
[model]
arch = "mlp"
hidden = [32]
[data]
dataset = "digits"
[train]
epochs = 4
batch_per_worker = 32
[checkpoint]
every_steps = 20
[search]
algorithm = "random"
trials = 1
metric = "val_accuracy"
direction = "max"
[[search.params]]
name = "train.lr"
type = "double"
min = 0.02
max = 0.1
"#;

#[test]
fn a_searchs_trial_is_paused_from_a_checkpoint_and_resumes_from_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::Builder::new()
        .prefix("rl-pause-")
        .tempdir()
        .unwrap();
    let mut c = LocalCluster::new(exe(), root.path());
    c.env = vec![(STEP_DELAY.0.to_owned(), STEP_DELAY.1.to_owned())];
    c.start("t0", &[]).unwrap();
    common::wait_formed(&c, 1, WAIT);
    let search = c.nodes[0].client().submit(SEARCH).unwrap();
    let doc = common::wait_job(&c, 0, &search, "a trial under way", WAIT, |d| {
        d.trials.first().is_some_and(|t| t.state == "running")
    });
    let trial_job = doc.trials[0].job.clone();
    common::wait_job(&c, 0, &trial_job, "past step 30", WAIT, |d| {
        d.step.is_some_and(|s| s >= 30)
    });

    ok(c.cli(0)
        .args(["job", "preempt", &search, "--pause-trials", "1"])
        .output()
        .unwrap());
    // Checkpointed at SIGTERM, back to pending, placed again (nothing waits for the room),
    // and resumed from that checkpoint.
    let again = common::wait_job(&c, 0, &trial_job, "placed again", WAIT, |d| {
        d.attempt == 2 || common::ended(d)
    });
    let reasons: Vec<&str> = again
        .events
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert!(
        reasons.contains(&"preempted: checkpointed and trial paused"),
        "{reasons:?}"
    );
    let stopped = common::poll_until(
        WAIT,
        || c.job_log_lines(&trial_job, "rank=0 workers=1 stopped step="),
        |l| !l.is_empty(),
    )
    .unwrap_or_else(|_| panic!("{:#?}", c.job_logs(&trial_job)));
    let step: u64 = stopped[0]
        .trim_start_matches("rank=0 workers=1 stopped step=")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(stopped[0].ends_with("checkpointed"), "{stopped:?}");
    let resumed = common::poll_until(
        WAIT,
        || c.job_log_lines(&trial_job, "rank=0 workers=1 resumed step="),
        |l| !l.is_empty(),
    )
    .unwrap_or_else(|_| panic!("{:#?}", c.job_logs(&trial_job)));
    assert!(
        resumed[0].starts_with(&format!("rank=0 workers=1 resumed step={step} ")),
        "{resumed:?} after stopping at {step}"
    );
    let done = common::wait_job(&c, 0, &search, "search ended", WAIT, common::ended);
    assert_eq!(done.state, "succeeded", "{done:#?}");
    assert_eq!(done.trials[0].state, "succeeded", "{:?}", done.trials[0]);
    c.stop_all();
}

/// The chief is killed while a shrink is asked of it (through another node, whose call is
/// forwarded): the shrink's one log entry committed or it did not. The new chief finds the
/// whole shrink (a ring of at most 2 that does not grow back onto a free member, and keeps
/// its global batch) or none of it (the job goes on without the dead
/// node's rank, and a shrink asked again is carried out by the new chief). Never a failed
/// attempt, never a ring between the two.
#[test]
fn a_chief_killed_during_a_shrink_leaves_the_whole_shrink_or_none_of_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::Builder::new()
        .prefix("rl-preempt-chief-")
        .tempdir()
        .unwrap();
    let mut c = cluster(root.path(), 4);
    let id = c.nodes[0].client().submit(SPEC).unwrap();
    common::wait_job(&c, 0, &id, "past step 20 on 4", WAIT, |d| {
        d.state == "running" && d.ring.len() == 4 && d.step.is_some_and(|s| s >= 20)
    });
    let chief = c.status(0).unwrap().chief.unwrap().name;
    let dead = c.nodes.iter().position(|n| n.name == chief).unwrap();
    let asker = (dead + 1) % c.nodes.len();

    // The shrink asked through another node, the chief killed while it is on its way.
    let client = c.nodes[asker].client();
    let path = format!("/v1/jobs/{id}/preempt");
    let call = std::thread::spawn(move || {
        let body = serde_json::json!({"action": {"shrink": {"to_workers": 2}}});
        client.post_json::<serde_json::Value>(&path, &body)
    });
    c.kill9(dead).unwrap();
    let answer = call.join().unwrap();
    let new_chief = common::poll_until(
        WAIT,
        || c.status(asker).ok().and_then(|s| s.chief).map(|n| n.name),
        |n| n.as_ref().is_some_and(|n| *n != chief),
    )
    .expect("a new chief");
    assert!(new_chief.is_some());

    let shrunk = |d: &ringleader::api::status::JobDoc| {
        d.history
            .iter()
            .any(|h| h.reason.starts_with("preempted: shrunk "))
    };
    // Settled: the dead node's rank is gone (a re-form) and the shrink is in or out.
    let settled = common::wait_job(&c, asker, &id, "re-formed after the chief", WAIT, |d| {
        d.generation >= 2 && !d.ring.contains(&chief)
    });
    assert_eq!(settled.state, "running", "{:?}", settled.history);
    assert_eq!(settled.attempt, 1, "no restart: {:?}", settled.history);
    if !shrunk(&settled) {
        // None of it: the answer said so (or was lost with the chief) and the ring is the
        // survivors'. Asked again, the new chief carries it out.
        assert_eq!(settled.ring.len(), 3, "{:?} {answer:?}", settled.history);
        ok(c.cli(asker)
            .args(["job", "preempt", &id, "--shrink-to", "2"])
            .output()
            .unwrap());
    }
    let doc = common::wait_job(&c, asker, &id, "the shrink in", WAIT, shrunk);
    let at = doc.generation;
    let ring = doc.ring.len();
    assert!(ring <= 2, "{:?}", doc.history);

    // The whole shrink holds under the new chief: three members live, at most two hold a
    // rank, and the ring does not grow back onto the free one (past the rejoin delay).
    let step = doc.step.unwrap_or(0);
    // (The spec's `rejoin_after_s` is 1 s; 3 s is well past it.)
    let later = common::wait_job(&c, asker, &id, "training on, 3 s later", WAIT, |d| {
        d.step.is_some_and(|s| s >= step + 20)
            && d.history
                .last()
                .is_some_and(|h| h.at_ms + 3_000 <= ringleader::control::handle::wall_ms())
    });
    assert!(
        later.ring.len() <= ring,
        "grew back past the ceiling: {:?}",
        later.history
    );
    assert_eq!(later.attempt, 1);
    assert!(later.generation >= at);
    assert_eq!(later.metrics.get("samples_per_step"), Some(&128.0));
}
