//! Ended jobs leave the live state after the retention (`--job-retention-s`), on every
//! node, while running jobs stay; `job ID` still answers for a compacted job, from the
//! record each node wrote to its store.

mod common;

use std::time::{Duration, Instant};

use common::{formed_cluster, wait_job, POLL};

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
