//! Real-process test of `kind = "train"` jobs: a 3-node cluster trains the digits MLP on 3
//! workers (a few steps), the job's metrics and ring show in `job ID --json`, and rank 0's
//! node holds a committed checkpoint. Bounded waits; processes stopped by PID on drop.

mod common;

use std::time::{Duration, Instant};

use common::exe;
use ringleader::cli::local::LocalCluster;

/// Forming the cluster and running the job each get this long (a debug build trains slowly).
const WAIT: Duration = Duration::from_secs(120);

const SPEC: &str = r#"
name = "digits-smoke"
kind = "train"
workers = 3
max_restarts = 2
[model]
arch = "mlp"
hidden = [32]
[data]
dataset = "digits"
[train]
epochs = 2
max_steps = 12
batch_per_worker = 32
lr = 0.05
[checkpoint]
every_steps = 5
keep = 2
commit_every_steps = 5
"#;

#[test]
fn train_job_runs_on_three_workers_and_checkpoints() {
    // Phase 1: a formed 3-node cluster with a chief.
    let root = tempfile::Builder::new()
        .prefix("rl-train-")
        .tempdir()
        .unwrap();
    let mut c = LocalCluster::new(exe(), root.path());
    c.start("t0", &[]).unwrap();
    for i in 1..3 {
        c.start_joining(&format!("t{i}"), &[]).unwrap();
    }
    c.wait_all(WAIT, "formed with a chief", |s| {
        s.names_in("alive").len() == 3 && s.chief.is_some()
    })
    .unwrap();

    // Phase 2: a bad [train] table is refused at submit, naming the field.
    let bad = SPEC.replace("lr = 0.05", "lrr = 0.05");
    let err = c.nodes[1].client().submit(&bad).unwrap_err().to_string();
    assert!(err.contains("train.lrr"), "{err}");

    // Phase 3: the job, submitted to a non-seed node, runs to success.
    let id = c.nodes[2].client().submit(SPEC).expect("submit");
    let deadline = Instant::now() + WAIT;
    let doc = loop {
        if let Ok(doc) = c.nodes[0].client().job(&id) {
            match doc.state.as_str() {
                "succeeded" => break doc,
                "failed" | "cancelled" => panic!("job ended {}: {doc:?}", doc.state),
                _ => {}
            }
        }
        assert!(
            Instant::now() < deadline,
            "job {id} did not succeed in {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(doc.ring.len(), 3, "{doc:?}");

    // Phase 4: `job ID --json` through the CLI carries ring, step, epoch and metrics.
    let out = c.cli(1).args(["job", &id, "--json"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["ring"].as_array().map(Vec::len), Some(3), "{json}");
    assert_eq!(json["step"].as_u64(), Some(12), "{json}");
    assert!(json["epoch"].as_u64().is_some(), "{json}");
    assert!(json["metrics"]["loss"].as_f64().is_some(), "{json}");
    let acc = json["metrics"]["val_accuracy"]
        .as_f64()
        .expect("val_accuracy");
    assert!((0.0..=1.0).contains(&acc), "{json}");

    // Phase 5: rank 0's node holds the final checkpoint, committed.
    let rank0 = &doc.ring[0];
    let node = c.nodes.iter().find(|n| &n.name == rank0).unwrap();
    let dir = node
        .dir
        .join("store/jobs")
        .join(&id)
        .join(format!("ckpt/{:012}", 12));
    assert!(
        dir.join(trainer::COMMIT_FILE).is_file(),
        "no commit marker in {}",
        dir.display()
    );
    c.stop_all();
}
