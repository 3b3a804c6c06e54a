//! Real-process test of the scheduler's queue (issue 49): waiting jobs start by priority,
//! not by arrival; a user's quota holds its jobs pending with the quota named; a priority
//! above the user's ceiling is refused at submit naming the field; `queue --json` lists
//! the waiting jobs in start order with owners and reasons, and `quota ls --json` each
//! user's usage against its quota.
//!
//! Two nodes offer one cpu each (`--cpus 1`), so two one-cpu ranks fill the cluster. Waits
//! poll with deadlines; nodes are stopped by PID when the cluster is dropped.

use std::time::Duration;

mod common;

use common::{formed_cluster, ok, poll_until, wait_job};
use ringleader::{api::client::ApiClient, cli::local::LocalCluster};

/// Bound on cluster formation and job placement (a debug build on two cores is slow).
const WAIT: Duration = Duration::from_secs(120);

fn job(name: &str, workers: u32, priority: &str) -> String {
    format!(
        "name = \"{name}\"\nkind = \"command\"\nworkers = {workers}\npriority = \"{priority}\"\n\
         command = [\"sh\", \"-c\", \"sleep 300\"]\n"
    )
}

/// `queue --json` on node `i`.
fn queue(c: &LocalCluster, i: usize) -> serde_json::Value {
    let out = ok(c.cli(i).args(["--json", "queue"]).output().unwrap());
    serde_json::from_str(&out).unwrap()
}

#[test]
fn waiting_jobs_start_by_priority_and_a_quota_holds_a_users_jobs_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let extra = vec!["--cpus".to_string(), "1".to_string()];
    let c = formed_cluster(dir.path(), "sq", 2, &extra, WAIT);
    let admin = c.nodes[0].client();

    // Phase 1: a job of two ranks fills the cluster; a low job, then a high one of two
    // ranks, wait behind it.
    let blocker = admin.submit(&job("blocker", 2, "normal")).unwrap();
    wait_job(&c, 0, &blocker, "running", WAIT, |j| j.state == "running");
    let low = admin.submit(&job("low", 1, "low")).unwrap();
    let high = admin.submit(&job("high", 2, "high")).unwrap();
    for id in [&low, &high] {
        let doc = wait_job(&c, 1, id, "a pending reason", WAIT, |j| {
            j.pending_reason.is_some()
        });
        assert_eq!(doc.state, "pending", "{doc:#?}");
    }

    // Phase 2: the queue, on the other node, lists them in start order: high, then low.
    let q = queue(&c, 1);
    let rows = q["jobs"].as_array().unwrap();
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [high.as_str(), low.as_str()], "{q:#}");
    assert_eq!(rows[0]["priority_label"], "high");
    assert_eq!(rows[0]["owner"], "admin");
    assert_eq!(rows[0]["position"], 1);
    assert!(
        rows.iter().all(|r| r["pending_reason"].is_string()),
        "{q:#}"
    );

    // Phase 3: alice's quota is no cpu and no borrowing: her job waits, saying so; a
    // priority above her ceiling is refused naming the field.
    let token = ok(c
        .cli(0)
        .args(["token", "create", "alice"])
        .output()
        .unwrap())
    .trim()
    .to_owned();
    ok(c.cli(0)
        .args(["quota", "set", "alice", "--cpus", "0", "--borrow-cpus", "0"])
        .args(["--max-priority", "normal"])
        .output()
        .unwrap());
    let alice = ApiClient::new(&c.nodes[1].info.api_addr, Some(token));
    let held = poll_until(
        WAIT,
        || alice.submit(&job("mine", 1, "normal")),
        Result::is_ok,
    )
    .unwrap()
    .unwrap();
    let doc = wait_job(&c, 1, &held, "the quota reason", WAIT, |j| {
        j.pending_reason.as_deref() == Some("waiting for 1 cpu: alice's quota 0/0 cpus in use")
    });
    assert_eq!(doc.state, "pending");
    let refused = alice
        .submit(&job("urgent", 1, "high"))
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("priority") && refused.contains("alice's ceiling normal"),
        "{refused}"
    );

    // Phase 4: the blocker ends: the high job takes the whole cluster, ahead of the low
    // one submitted before it; alice's job still waits for her quota.
    ok(c.cli(0).args(["cancel", &blocker]).output().unwrap());
    wait_job(&c, 0, &high, "running", WAIT, |j| j.state == "running");
    let doc = wait_job(&c, 0, &low, "still pending", WAIT, |j| j.state == "pending");
    assert!(doc.started_at_ms.is_none(), "{doc:#?}");
    let q = queue(&c, 0);
    let owners: Vec<&str> = q["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["owner"].as_str().unwrap())
        .collect();
    assert_eq!(owners.len(), 2, "{q:#}");
    assert!(
        owners.contains(&"alice") && owners.contains(&"admin"),
        "{q:#}"
    );

    // Phase 5: `quota ls --json` shows alice's quota and, once node 1's replica has the
    // placement, the admin's use.
    let quota_ls = || -> serde_json::Value {
        let out = ok(c.cli(1).args(["--json", "quota", "ls"]).output().unwrap());
        serde_json::from_str(&out).unwrap()
    };
    let row = |rows: &serde_json::Value, user: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["user"] == user)
            .cloned()
            .unwrap_or_default()
    };
    let rows = poll_until(WAIT, quota_ls, |rows| {
        row(rows, "admin")["used"]["cpus"] == 2
    })
    .unwrap_or_else(|rows| panic!("the admin's 2 cpus not shown: {rows:#}"));
    assert_eq!(row(&rows, "alice")["quota"]["cpus"], 0);
    assert_eq!(row(&rows, "alice")["used"]["cpus"], 0);
}
