//! Real-process test of a node's clean shutdown (issue 26, point 5): a node running a train
//! rank that checkpoints is sent SIGTERM. It exits by itself (status 0, within
//! `SHUTDOWN_MS_MAX`), saying every part stopped cleanly; its rank process is gone (by PID);
//! nothing in its data directory is left half-written (no `.part` or temporary file); and
//! started again on the same directory it reads its stores back (the job is still known).
//! Waits poll with deadlines; processes are stopped by PID.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{walk, POLL};
use ringleader::cli::local::{process_alive, train_workers};
use ringleader::node::SHUTDOWN_MS_MAX;

/// Forming the cluster and the rank's first checkpoint get this long.
const WAIT: Duration = Duration::from_secs(120);

/// One rank that trains for far longer than the test, checkpointing often.
const SPEC: &str = r#"
name = "long"
kind = "train"
workers = 1
[model]
arch = "mlp"
hidden = [32]
[data]
dataset = "digits"
[train]
epochs = 10000
batch_per_worker = 32
[checkpoint]
every_steps = 10
commit_every_steps = 5
"#;

/// Whether a file name is one of a write under way: a `.part`, or a temporary file.
fn half_written(path: &Path) -> bool {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    name.ends_with(".part") || name.ends_with(".tmp") || name.starts_with(".tmp")
}

#[test]
fn sigterm_stops_the_ranks_and_every_task_within_the_bound_and_leaves_the_data_dir_whole() {
    // Phase 1: one node, a train rank running and checkpointing.
    let root = tempfile::Builder::new()
        .prefix("rl-shutdown-")
        .tempdir()
        .unwrap();
    let mut c = common::formed_cluster(root.path(), "q", 1, &[], WAIT);
    let id = c.nodes[0].client().submit(SPEC).expect("submit");
    let dir = c.nodes[0].dir.clone();
    let ckpts = dir.join("store/jobs").join(&id).join("ckpt");
    let deadline = Instant::now() + WAIT;
    let ranks = loop {
        let ranks: Vec<u32> = train_workers(&id).into_keys().collect();
        let committed = walk(&ckpts)
            .iter()
            .any(|p| p.ends_with(trainer::COMMIT_FILE));
        if !ranks.is_empty() && committed {
            break ranks;
        }
        assert!(
            Instant::now() < deadline,
            "no rank with a checkpoint of {id}"
        );
        std::thread::sleep(POLL);
    };
    let node = c.nodes[0].pid().expect("the node runs");

    // Phase 2: SIGTERM; the node exits by itself, well within the bound.
    let asked = Instant::now();
    let status = c.terminate(0).unwrap();
    let took = asked.elapsed();
    eprintln!("shutdown took {took:?}");
    assert!(
        status.success(),
        "the node did not exit by itself: {status:?}"
    );
    assert!(
        took < Duration::from_millis(SHUTDOWN_MS_MAX),
        "shutdown took {took:?}"
    );
    let log = std::fs::read_to_string(dir.join("node.log")).unwrap();
    let last = log
        .lines()
        .rev()
        .find(|l| l.contains("stopped"))
        .unwrap_or("");
    assert!(last.contains("clean=true"), "{last}");
    assert!(!log.contains("tasks still running"), "{log}");

    // Phase 3: the node and its rank are gone, by PID.
    assert!(!process_alive(node), "node {node} still runs");
    for pid in &ranks {
        assert!(!process_alive(*pid), "rank {pid} outlived its node");
    }
    assert!(train_workers(&id).is_empty(), "a rank of {id} still runs");

    // Phase 4: nothing half-written in the data directory.
    let half: Vec<PathBuf> = walk(&dir).into_iter().filter(|p| half_written(p)).collect();
    assert!(half.is_empty(), "half-written: {half:?}");

    // Phase 5: started again on it, the node reads its stores back: the job is known.
    c.restart(0).unwrap();
    common::wait_formed(&c, 1, WAIT);
    let deadline = Instant::now() + WAIT;
    while let Err(e) = c.nodes[0].client().job(&id) {
        assert!(
            Instant::now() < deadline,
            "{id} unknown after the restart: {e}"
        );
        std::thread::sleep(POLL);
    }
    c.stop_all();
}
