//! Ended jobs leave the live state after the retention (`--job-retention-s`), on every
//! node, while running jobs stay; `job ID` still answers for a compacted job, from the
//! record each node wrote to its store, or, for members sharing a store, the one record
//! one of them wrote.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{formed_cluster, wait_formed, wait_job, POLL};
use ringleader::cli::local::LocalCluster;
use ringleader::domain::id::JobId;
use ringleader::jobs::archive::sharers::Sharers;

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

/// Three nodes on one shared directory, `extra` added to their flags (see
/// `common::sharing_cluster`).
fn sharing_cluster(root: &Path, extra: &[&str]) -> LocalCluster {
    let mut args = vec![
        "--storage".to_string(),
        format!("file://{}", root.join("shared").display()),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    common::sharing_cluster(root, &args, WAIT)
}

/// `n` jobs that succeed at once, submitted to node 0, once they succeeded.
fn quick_jobs(c: &LocalCluster, n: usize) -> Vec<String> {
    let client = c.nodes[0].client();
    let ids: Vec<String> = (0..n)
        .map(|i| {
            client
                .submit(&format!(
                    "name = \"shared-{i}\"\nkind = \"command\"\ncommand = [\"true\"]\n"
                ))
                .unwrap()
        })
        .collect();
    for id in &ids {
        wait_job(c, 0, id, "succeeded", WAIT, |d| d.state == "succeeded");
    }
    ids
}

/// Members sharing one store find each other by their markers in it and write each ended
/// job's record once between them, spread over them; every node answers for the compacted
/// jobs from that one copy.
#[test]
fn members_sharing_a_store_write_each_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let c = sharing_cluster(dir.path(), &["--job-retention-s", "2"]);
    let quick = quick_jobs(&c, 12);
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
    let writes = common::logged(&c, &quick, "job record written");
    for (j, id) in quick.iter().enumerate() {
        let total: usize = writes.iter().map(|w| w[j]).sum();
        assert_eq!(total, 1, "job {id} written {total} times: {writes:?}");
    }
    let writers = writes.iter().filter(|w| w.iter().any(|&n| n > 0)).count();
    assert!(writers >= 2, "every record written by one node: {writes:?}");
}

/// Each record is written by the sharer that `Sharers` ranks first for it, and a writer
/// killed and restarted finds its records in the store and writes none of them again.
#[test]
fn the_ranked_writer_writes_each_record_and_its_restart_rewrites_none() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = sharing_cluster(dir.path(), &[]);
    let ids = quick_jobs(&c, 12);
    let peers: Vec<String> = c.nodes.iter().map(|n| n.info.id.clone()).collect();
    let everyone: BTreeSet<String> = peers.iter().cloned().collect();
    let writer_of: Vec<usize> = ids
        .iter()
        .map(|id| {
            let job: JobId = id.parse().unwrap();
            let writers: Vec<usize> = (0..3)
                .filter(|&i| {
                    let view = Sharers::new(&peers[i], peers.clone());
                    view.writes(job, &view.alive(&everyone))
                })
                .collect();
            assert_eq!(writers.len(), 1, "job {id}: ranked writers {writers:?}");
            writers[0]
        })
        .collect();
    let expected: Vec<Vec<usize>> = (0..3)
        .map(|i| writer_of.iter().map(|&w| usize::from(w == i)).collect())
        .collect();
    common::poll_until(
        WAIT,
        || common::logged(&c, &ids, "job record written"),
        |writes| *writes == expected,
    )
    .unwrap_or_else(|writes| panic!("record writes {writes:?}, expected {expected:?}"));
    for id in &ids {
        let record = dir.path().join("shared/jobs").join(id).join("record.json");
        assert!(record.is_file(), "{} missing", record.display());
    }

    // The joiner that writes more of them is killed and restarted: it looks at its jobs
    // again (its memory of what it wrote is gone) and finds each one in the store.
    let victim = (1..3)
        .max_by_key(|&i| writer_of.iter().filter(|&&w| w == i).count())
        .unwrap();
    let its_jobs = writer_of.iter().filter(|&&w| w == victim).count();
    c.kill9(victim).unwrap();
    c.restart(victim).unwrap();
    wait_formed(&c, 3, WAIT);
    common::poll_until(
        WAIT,
        || -> usize {
            common::logged(&c, &ids, "job record already in the store")[victim]
                .iter()
                .sum()
        },
        |&found| found >= its_jobs,
    )
    .unwrap_or_else(|found| {
        panic!("the restarted node found {found} of its {its_jobs} records in the store")
    });
    assert_eq!(
        common::logged(&c, &ids, "job record written"),
        expected,
        "a record was written again"
    );
}
