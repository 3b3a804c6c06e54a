//! Real-process test of a search's trials under the scheduler (issue 49): a low-priority
//! search of one user and a high-priority job of another both wait; the high job starts
//! first; the search's trials then start only up to its owner's quota of cpus, and while
//! more wait the search shows why (its `pending_reason`, and its row in `queue --json`).
//! Also the submit refusals: `preemptible = false` from a user the admin did not allow,
//! and more cpus per worker than any member has, each naming the field.
//!
//! Two nodes offer two cpus each (`--cpus 2`), so four one-cpu ranks fill the cluster.
//! Waits poll with deadlines; nodes are stopped by PID when the cluster is dropped.

use std::time::Duration;

mod common;

use common::{formed_cluster, ok, poll_until, wait_job};
use ringleader::{
    api::{client::ApiClient, status::JobDoc},
    cli::local::LocalCluster,
};

/// Bound on cluster formation and job placement (a debug build on two cores is slow).
const WAIT: Duration = Duration::from_secs(120);
/// Samples of the search's running trials taken while its quota is full.
const QUOTA_SAMPLES: usize = 5;

fn job(name: &str, workers: u32, priority: &str, extra: &str) -> String {
    format!(
        "name = \"{name}\"\nkind = \"command\"\nworkers = {workers}\npriority = \"{priority}\"\n\
         command = [\"sh\", \"-c\", \"sleep 300\"]\n{extra}"
    )
}

/// A low-priority search whose trials (one rank of one cpu each) sleep.
const SEARCH: &str = r#"
name = "sweep"
kind = "search"
priority = "low"
command = ["sh", "-c", "sleep 300"]
[search]
trial = "command"
algorithm = "random"
trials = 6
max_parallel = 4
metric = "m"
direction = "max"
seed = 5
[[search.params]]
name = "x"
type = "double"
min = 0.0
max = 1.0
"#;

/// A user's token, made by the admin.
fn token(c: &LocalCluster, user: &str) -> String {
    ok(c.cli(0).args(["token", "create", user]).output().unwrap())
        .trim()
        .to_owned()
}

fn running_trials(doc: &JobDoc) -> usize {
    doc.trials.iter().filter(|t| t.state == "running").count()
}

#[test]
fn a_high_job_starts_before_a_low_search_whose_trials_keep_to_the_quota_and_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let extra = vec!["--cpus".to_string(), "2".to_string()];
    let c = formed_cluster(dir.path(), "st", 2, &extra, WAIT);
    let admin = c.nodes[0].client();
    let alice = ApiClient::new(&c.nodes[1].info.api_addr, Some(token(&c, "alice")));
    let bob = ApiClient::new(&c.nodes[0].info.api_addr, Some(token(&c, "bob")));
    ok(c.cli(0)
        .args(["quota", "set", "alice", "--cpus", "2", "--borrow-cpus", "0"])
        .output()
        .unwrap());
    // Bob's quota covers his job (borrowing would wait for alice's claim on her quota).
    ok(c.cli(0)
        .args(["quota", "set", "bob", "--cpus", "4"])
        .output()
        .unwrap());

    // Phase 1: the admin's job that refuses preemption fills the cluster; bob may not
    // refuse preemption, nor ask for more cpus per rank than a member has.
    let blocker = admin
        .submit(&job("blocker", 4, "normal", "preemptible = false\n"))
        .unwrap();
    wait_job(&c, 0, &blocker, "running", WAIT, |j| j.state == "running");
    let refused = poll_until(
        WAIT,
        || bob.submit(&job("firm", 1, "normal", "preemptible = false\n")),
        |r| {
            r.as_ref()
                .is_err_and(|e| e.to_string().contains("preemptible"))
        },
    )
    .unwrap_or_else(|r| panic!("bob's preemptible = false was not refused: {r:?}"))
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("bob may not refuse preemption"),
        "{refused}"
    );
    let wide = "[resources]\ncpus_per_worker = 64\n";
    let refused = bob.submit(&job("wide", 1, "normal", wide)).unwrap_err();
    let refused = refused.to_string();
    assert!(
        refused.contains("resources.cpus_per_worker")
            && refused.contains("64 cpus per worker, but the largest member has 2"),
        "{refused}"
    );

    // Phase 2: alice's low search and bob's high job both wait; the search says why, and
    // the queue lists it, after the high job.
    let search = alice.submit(SEARCH).unwrap();
    let high = bob.submit(&job("urgent", 4, "high", "")).unwrap();
    wait_job(&c, 1, &search, "its trials' reason", WAIT, |j| {
        j.pending_reason
            .as_deref()
            .is_some_and(|r| r.starts_with("trials wait: "))
    });
    wait_job(&c, 1, &high, "a pending reason", WAIT, |j| {
        j.state == "pending" && j.pending_reason.is_some()
    });
    let q: serde_json::Value =
        serde_json::from_str(&ok(c.cli(1).args(["--json", "queue"]).output().unwrap())).unwrap();
    let rows = q["jobs"].as_array().unwrap();
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [high.as_str(), search.as_str()], "{q:#}");
    assert_eq!(rows[1]["trials"], true, "{q:#}");
    assert_eq!(rows[1]["owner"], "alice", "{q:#}");

    // Phase 3: the blocker ends: the high job starts first, and no trial beside it.
    ok(c.cli(0).args(["cancel", &blocker]).output().unwrap());
    let started = wait_job(&c, 0, &high, "running", WAIT, |j| j.state == "running");
    let doc = c.nodes[0].client().job(&search).unwrap();
    assert_eq!(running_trials(&doc), 0, "{doc:#?}");
    assert!(
        doc.trials.is_empty(),
        "a trial started beside the high job: {doc:#?}"
    );

    // Phase 4: the high job ends: the search's trials start, two of one cpu within
    // alice's quota of 2, and the others wait with the quota named.
    ok(c.cli(0).args(["cancel", &high]).output().unwrap());
    let quota_reason = "trials wait: waiting for 1 cpu: alice's quota 2/2 cpus in use";
    let doc = wait_job(&c, 0, &search, "the quota's reason", WAIT, |j| {
        j.pending_reason.as_deref() == Some(quota_reason)
    });
    assert!(doc.trials.len() >= 2, "{doc:#?}");
    let first_trial = doc
        .events
        .iter()
        .find(|e| e["what"] == "trial")
        .and_then(|e| e["at_ms"].as_u64())
        .unwrap();
    assert!(
        started.started_at_ms.unwrap() <= first_trial,
        "a trial started before the high job: {doc:#?}"
    );
    for _ in 0..QUOTA_SAMPLES {
        let doc = c.nodes[1].client().job(&search).unwrap();
        assert!(running_trials(&doc) <= 2, "over alice's quota: {doc:#?}");
        let q: serde_json::Value =
            serde_json::from_str(&ok(c.cli(1).args(["--json", "queue"]).output().unwrap()))
                .unwrap();
        assert!(
            q["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["id"] != search.as_str() || r["trials"] == true),
            "{q:#}"
        );
    }
}
