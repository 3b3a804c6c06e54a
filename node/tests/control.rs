//! Real-process tests of the control plane: chief election, jobs submitted to any node,
//! command jobs with torchrun's environment, failover, restarts. Bounded waits; every
//! process is stopped by PID when its cluster is dropped.

mod common;

use std::time::Duration;

use common::exe;
use ringleader::{api::status::StatusDoc, cli::local::LocalCluster};

const WAIT: Duration = Duration::from_secs(40);

fn free_port() -> u16 {
    collective::testing::unused_local_port()
}

/// A cluster of `n` nodes on fixed p2p ports (so a restarted cluster finds its seed again),
/// formed, with a chief and 3 voters known to every node.
fn formed(n: usize) -> (LocalCluster, tempfile::TempDir) {
    let root = tempfile::Builder::new()
        .prefix("rl-ctl-")
        .tempdir()
        .unwrap();
    let mut c = LocalCluster::new(exe(), root.path());
    let seed_port = free_port();
    c.start("n0", &["--listen".into(), format!("127.0.0.1:{seed_port}")])
        .unwrap();
    for i in 1..n {
        let args = vec![
            "--listen".to_string(),
            format!("127.0.0.1:{}", free_port()),
            "--join".to_string(),
            format!("127.0.0.1:{seed_port}"),
        ];
        c.start(&format!("n{i}"), &args).unwrap();
    }
    common::wait_formed(&c, n, WAIT);
    (c, root)
}

fn chief_name(s: &StatusDoc) -> Option<String> {
    s.chief.as_ref().map(|c| c.name.clone())
}

fn spec_file(root: &std::path::Path, name: &str, text: &str) -> String {
    let path = root.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn submit(c: &LocalCluster, node: usize, spec: &str) -> String {
    c.nodes[node].client().submit(spec).expect("submit")
}

fn wait_job_state(
    c: &LocalCluster,
    node: usize,
    id: &str,
    state: &str,
) -> ringleader::api::status::JobDoc {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if let Ok(doc) = c.nodes[node].client().job(id) {
            if doc.state == state {
                return doc;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "job {id} never {state}: {doc:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn command_job_on_a_follower_runs_with_torchrun_env_and_survives_the_chiefs_death() {
    let (mut c, _root) = formed(3);
    let status = c.status(0).unwrap();
    let chief = chief_name(&status).unwrap();
    let chief_idx = c.nodes.iter().position(|n| n.name == chief).unwrap();
    let follower = (chief_idx + 1) % 3;

    // Phase: a 2-worker job submitted to a follower; each worker prints torchrun's variables.
    let spec = r#"
name = "env-check"
kind = "command"
workers = 2
command = ["sh", "-c", "echo env RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT; echo ringleader-metric rank_seen $RANK 1"]
"#;
    let id = submit(&c, follower, spec);
    let doc = wait_job_state(&c, follower, &id, "succeeded");
    assert_eq!(doc.generation, 1);
    assert_eq!(doc.ring.len(), 2);
    assert!(doc.metrics.contains_key("rank_seen"), "{doc:?}");
    let logs: ringleader::api::status::LogsDoc = c.nodes[follower]
        .client()
        .get(&format!("/v1/jobs/{id}/logs"))
        .unwrap();
    for (rank, chunk) in logs.chunks.iter().enumerate() {
        let line = chunk
            .text
            .lines()
            .find(|l| l.starts_with("env "))
            .unwrap_or_default();
        assert!(
            line.contains(&format!("RANK={rank} WORLD_SIZE=2")),
            "{line}"
        );
        assert!(
            line.contains("MASTER_ADDR=127.0.0.1") && line.contains("MASTER_PORT="),
            "{line}"
        );
    }

    // Phase: a longer job, then kill -9 the chief while it runs.
    let spec = r#"
name = "long"
kind = "command"
workers = 2
command = ["sh", "-c", "echo started; sleep 3; echo done"]
"#;
    let id = submit(&c, follower, spec);
    wait_job_state(&c, follower, &id, "running");
    c.kill9(chief_idx).unwrap();
    c.wait_all(WAIT, "a new chief", |s| {
        chief_name(s).is_some_and(|n| n != chief)
    })
    .unwrap();
    // The job is still there and finishes (retried on the survivors if a worker was lost).
    let doc = wait_job_state(&c, follower, &id, "succeeded");
    if doc.history.len() > 1 {
        assert!(doc.history[1].reason.starts_with("retry"), "{doc:?}");
        assert!(
            !doc.ring.contains(&chief),
            "retry must avoid the dead node: {doc:?}"
        );
    }
    // Every survivor agrees on the jobs.
    let a = c.status((chief_idx + 1) % 3).unwrap();
    let b = c.status((chief_idx + 2) % 3).unwrap();
    assert_eq!(a.jobs.len(), 2);
    assert_eq!(a.chief, b.chief);
}

#[test]
fn a_failing_rank_is_retried_up_to_max_restarts_then_the_job_fails() {
    let (c, root) = formed(2);
    let spec = r#"
name = "fails"
kind = "command"
workers = 2
max_restarts = 1
command = ["sh", "-c", "if [ $RANK = 1 ]; then exit 3; fi; sleep 30"]
"#;
    let id = submit(&c, 1, spec);
    let doc = wait_job_state(&c, 0, &id, "failed");
    assert_eq!(doc.generation, 2, "one restart: {doc:?}");
    assert_eq!(doc.history.len(), 2);
    let reasons: Vec<&str> = doc
        .events
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains("exited with code 3")),
        "{reasons:?}"
    );

    // Bad specs are refused with the field and the line.
    let bad = spec_file(
        root.path(),
        "bad",
        "name = \"x\"\nkind = \"command\"\ncommand = [\"true\"]\nworkers = 0\n",
    );
    let out = c.cli(0).args(["submit", &bad]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("workers: expected a positive integer at line 4"),
        "{err}"
    );
}

#[test]
fn a_full_restart_keeps_jobs_and_their_states() {
    let (mut c, _root) = formed(3);
    let id = submit(
        &c,
        2,
        "name = \"ok\"\nkind = \"command\"\nworkers = 1\ncommand = [\"true\"]\n",
    );
    wait_job_state(&c, 0, &id, "succeeded");
    let cancelled = submit(
        &c,
        1,
        "name = \"slow\"\nkind = \"command\"\nworkers = 1\ncommand = [\"sleep\", \"60\"]\n",
    );
    wait_job_state(&c, 0, &cancelled, "running");
    let out = c.cli(1).args(["cancel", &cancelled]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_job_state(&c, 0, &cancelled, "cancelled");

    for i in 0..3 {
        c.terminate(i).unwrap();
    }
    for i in 0..3 {
        c.restart(i).unwrap();
    }
    c.wait_all(WAIT, "a chief after restart", |s| {
        s.chief.is_some() && s.jobs.len() == 2
    })
    .unwrap();
    for i in 0..3 {
        let s = c.status(i).unwrap();
        let state = |id: &str| s.jobs.iter().find(|j| j.id == id).map(|j| j.state.clone());
        assert_eq!(state(&id).as_deref(), Some("succeeded"), "node {i}: {s:?}");
        assert_eq!(
            state(&cancelled).as_deref(),
            Some("cancelled"),
            "node {i}: {s:?}"
        );
    }
}

#[test]
fn an_unmodified_pytorch_ddp_script_runs_as_a_command_job() {
    // scripts/test.sh names the virtualenv it installs torch in; else the python3 on PATH.
    let python = std::env::var("RINGLEADER_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let torch = std::process::Command::new(&python)
        .args(["-c", "import torch.distributed"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !torch {
        println!(
            "SKIPPED: PyTorch is not installed for {python} (scripts/test.sh installs it in \
             target/py-venv and names it in RINGLEADER_TEST_PYTHON)"
        );
        return;
    }
    let (c, _root) = formed(2);
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ddp/train_ddp.py");
    let spec = format!(
        "name = \"torch-ddp\"\nkind = \"command\"\nworkers = 2\ncommand = [{python:?}, {:?}]\n",
        script.canonicalize().unwrap().display().to_string()
    );
    let id = submit(&c, 1, &spec);
    let doc = wait_job_state(&c, 0, &id, "succeeded");
    assert_eq!(doc.metrics.get("world_size"), Some(&2.0), "{doc:?}");
    assert!(doc.metrics.contains_key("loss"), "{doc:?}");
}
