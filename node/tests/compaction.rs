//! Ended jobs leave the live state after the retention (`--job-retention-s`), on every
//! node, while running jobs stay; `job ID` still answers for a compacted job, from the
//! record each node wrote to its store, or, for members sharing a store, the one record
//! one of them wrote.

mod common;

use std::time::{Duration, Instant};

use common::{exe, formed_cluster, wait_formed, wait_job, POLL};
use ringleader::cli::local::LocalCluster;

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn ended_jobs_are_compacted_and_still_answered_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--job-retention-s".to_string(), "2".to_string()];
    let c = formed_cluster(dir.path(), "cmp", 3, &extra, WAIT);
    let client = c.nodes[0].client();
    let quick: Vec<String> = (0..3)
        .map(|i| {
            client
                .submit(&format!(
                    "name = \"quick-{i}\"\nkind = \"command\"\ncommand = [\"true\"]\n"
                ))
                .unwrap()
        })
        .collect();
    let long = client
        .submit("name = \"long\"\nkind = \"command\"\ncommand = [\"sleep\", \"60\"]\n")
        .unwrap();
    for id in &quick {
        wait_job(&c, 0, id, "succeeded", WAIT, |d| d.state == "succeeded");
    }
    wait_job(&c, 0, &long, "running", WAIT, |d| d.state == "running");
    let deadline = Instant::now() + WAIT;
    loop {
        let listed: Vec<Vec<String>> = (0..3)
            .map(|i| {
                c.nodes[i]
                    .client()
                    .status()
                    .map(|s| s.jobs.into_iter().map(|j| j.id).collect())
                    .unwrap_or_default()
            })
            .collect();
        if listed.iter().all(|ids| ids == &vec![long.clone()]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not compacted everywhere: {listed:?}"
        );
        std::thread::sleep(POLL);
    }
    for (i, id) in quick.iter().enumerate() {
        let doc = c.nodes[i % 3].client().job(id).unwrap();
        assert_eq!(doc.state, "succeeded");
        assert_eq!(doc.freshness.served_by, "archive");
    }
    client
        .post::<serde_json::Value>(&format!("/v1/jobs/{long}/cancel"), "")
        .unwrap();
}

/// Waits until every node's log holds `line`.
fn wait_logged(c: &LocalCluster, line: &str, wait: Duration) {
    let deadline = Instant::now() + wait;
    loop {
        let logs: Vec<String> = c
            .nodes
            .iter()
            .map(|n| std::fs::read_to_string(n.dir.join("node.log")).unwrap_or_default())
            .collect();
        if logs.iter().all(|l| l.contains(line)) {
            return;
        }
        assert!(Instant::now() < deadline, "not every node logged {line:?}");
        std::thread::sleep(POLL);
    }
}

/// Members sharing one store (here a directory; a bucket works the same) find each other
/// by their markers in it and write each ended job's record once between them, spread over
/// them; every node answers for the compacted jobs from that one copy.
#[test]
fn members_sharing_a_store_write_each_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let shared = format!("file://{}", dir.path().join("shared").display());
    let extra = [
        "--job-retention-s".to_string(),
        "2".to_string(),
        "--storage".to_string(),
        shared,
    ];
    let mut c = LocalCluster::new(exe(), dir.path());
    // The log line each record's write leaves is a debug one.
    c.env = vec![(
        "RUST_LOG".into(),
        "info,openraft=warn,libp2p=warn,ringleader::jobs::archive=debug".into(),
    )];
    c.start("sh0", &extra).unwrap();
    for i in 1..3 {
        c.start_joining(&format!("sh{i}"), &extra).unwrap();
    }
    wait_formed(&c, 3, WAIT);
    wait_logged(
        &c,
        "job records: this node's store is shared with 2 other members",
        WAIT,
    );
    let client = c.nodes[0].client();
    let quick: Vec<String> = (0..12)
        .map(|i| {
            client
                .submit(&format!(
                    "name = \"shared-{i}\"\nkind = \"command\"\ncommand = [\"true\"]\n"
                ))
                .unwrap()
        })
        .collect();
    for id in &quick {
        wait_job(&c, 0, id, "succeeded", WAIT, |d| d.state == "succeeded");
    }
    let deadline = Instant::now() + WAIT;
    'compacted: loop {
        for (i, id) in quick.iter().enumerate() {
            let served = c.nodes[i % 3]
                .client()
                .job(id)
                .map(|d| d.freshness.served_by)
                .unwrap_or_default();
            if served != "archive" {
                assert!(
                    Instant::now() < deadline,
                    "job {id} not answered from the store (served by {served:?})"
                );
                std::thread::sleep(POLL);
                continue 'compacted;
            }
        }
        break;
    }
    // Each record written once, by one of the three, and not all by the same one.
    let writes: Vec<Vec<usize>> = c
        .nodes
        .iter()
        .map(|n| {
            let log = std::fs::read_to_string(n.dir.join("node.log")).unwrap();
            quick
                .iter()
                .map(|id| {
                    log.lines()
                        .filter(|l| {
                            l.contains("job record written") && l.contains(&format!("job={id} "))
                        })
                        .count()
                })
                .collect()
        })
        .collect();
    for (j, id) in quick.iter().enumerate() {
        let total: usize = writes.iter().map(|w| w[j]).sum();
        assert_eq!(total, 1, "job {id} written {total} times: {writes:?}");
    }
    let writers = writes.iter().filter(|w| w.iter().any(|&n| n > 0)).count();
    assert!(writers >= 2, "every record written by one node: {writes:?}");
    for id in &quick {
        let record = dir.path().join("shared/jobs").join(id).join("record.json");
        assert!(record.is_file(), "{} missing", record.display());
    }
}
