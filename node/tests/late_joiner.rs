//! A node that joins after the log was snapshotted and purged catches up through the
//! snapshot, sent in chunks that each fit a frame: 3 nodes snapshot every 50 entries while
//! 300 jobs (about 4 KiB of spec each, a control state well over one snapshot chunk) run;
//! then a fourth node joins, installs the snapshot, and lists the same jobs in the same
//! states as the others.

mod common;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use common::{formed_cluster, POLL};
use ringleader::control::{protocol::SNAPSHOT_CHUNK_BYTES, store::SNAPSHOT_FILE};

const JOBS: usize = 300;
const WAIT: Duration = Duration::from_secs(180);

fn spec(i: usize) -> String {
    // Padding in the environment makes the state large enough for several chunks.
    format!(
        "name = \"late-{i}\"\nkind = \"command\"\ncommand = [\"true\"]\n[env]\nPAD = \"{}\"\n",
        "x".repeat(4000)
    )
}

/// Job ids and states as node `i` lists them.
fn jobs(c: &ringleader::cli::local::LocalCluster, i: usize) -> BTreeMap<String, String> {
    c.nodes[i]
        .client()
        .status()
        .map(|s| s.jobs.into_iter().map(|j| (j.id, j.state)).collect())
        .unwrap_or_default()
}

#[test]
fn a_late_joiner_catches_up_from_a_chunked_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--raft-snapshot-every".to_string(), "50".to_string()];
    let mut c = formed_cluster(dir.path(), "late", 3, &extra, Duration::from_secs(60));
    let clients: Vec<_> = (0..3).map(|i| c.nodes[i].client()).collect();
    std::thread::scope(|s| {
        for (t, client) in clients.iter().enumerate() {
            s.spawn(move || {
                for i in (t..JOBS).step_by(3) {
                    client.submit(&spec(i)).expect("submit");
                }
            });
        }
    });
    let deadline = Instant::now() + WAIT;
    loop {
        let all = jobs(&c, 0);
        if all.len() == JOBS && all.values().all(|s| s == "succeeded") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "jobs did not all succeed: {all:?}"
        );
        std::thread::sleep(POLL);
    }
    let snapshot = std::fs::metadata(c.nodes[0].dir.join("raft").join(SNAPSHOT_FILE))
        .expect("the leader's replicas built a snapshot")
        .len();
    assert!(
        snapshot > SNAPSHOT_CHUNK_BYTES,
        "a snapshot of {snapshot} bytes fits one chunk: the test proves nothing"
    );

    let joiner = c
        .start_joining("late3", &extra)
        .expect("starting the late joiner");
    let want = jobs(&c, 0);
    let deadline = Instant::now() + WAIT;
    loop {
        if jobs(&c, joiner) == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the late joiner lists {} of {} jobs",
            jobs(&c, joiner).len(),
            want.len()
        );
        std::thread::sleep(POLL);
    }
    assert!(
        c.nodes[joiner]
            .dir
            .join("raft")
            .join(SNAPSHOT_FILE)
            .exists(),
        "the joiner caught up without installing a snapshot"
    );
}
