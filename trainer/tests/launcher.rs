//! The standalone launcher: three `train-worker` processes on 127.0.0.1 over the
//! collective's TCP backend train a digits job, checkpoint it, and a restart with the same
//! job id resumes from the committed checkpoint.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Deadline for one launch of the three workers, s.
const LAUNCH_DEADLINE_S: u64 = 120;

fn free_addrs(n: usize) -> String {
    (0..n)
        .map(|_| format!("127.0.0.1:{}", collective::testing::unused_local_port()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Starts the workers and waits (polling with a deadline) for all of them; kills the rest by
/// handle if one fails or time runs out. Returns each worker's stdout.
fn launch(
    spec: &std::path::Path,
    data_dir: &std::path::Path,
    world: usize,
    extra: &[&str],
) -> Vec<String> {
    let addrs = free_addrs(world);
    let mut children: Vec<Child> = (0..world)
        .map(|r| {
            Command::new(env!("CARGO_BIN_EXE_train-worker"))
                .args([
                    "--spec",
                    spec.to_str().unwrap(),
                    "--rank",
                    &r.to_string(),
                    "--addrs",
                    &addrs,
                ])
                .args([
                    "--job-id",
                    "launch-test",
                    "--data-dir",
                    data_dir.to_str().unwrap(),
                ])
                .args(extra)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    common::wait_success(&mut children, Duration::from_secs(LAUNCH_DEADLINE_S));
    children
        .into_iter()
        .map(|c| String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap())
        .collect()
}

/// The validation accuracy a worker's `done` line reports.
fn accuracy(out: &str) -> f64 {
    out.lines()
        .find(|l| l.contains(" done "))
        .and_then(|l| l.split("val_accuracy=").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no done line with val_accuracy in {out}"))
}

#[test]
fn three_processes_train_checkpoint_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("job.toml");
    std::fs::write(
        &spec,
        "name = \"t\"\nworkers = 3\n[model]\narch = \"mlp\"\nhidden = [64]\n[train]\nepochs = 4\n\
         batch_per_worker = 32\nlr = 0.05\nseed = 3\n[checkpoint]\nevery_steps = 25\nkeep = 2\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let out = launch(&spec, &data, 3, &[]);
    for (r, o) in out.iter().enumerate() {
        assert!(o.contains("done step=60"), "rank {r}: {o}");
    }
    assert!(out[0].contains("checkpoint step=60"), "{}", out[0]);
    assert_eq!(accuracy(&out[0]), accuracy(&out[2]), "ranks agree");
    let ckpt = data.join("store/jobs/launch-test/ckpt");
    let mut steps: Vec<String> = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    steps.sort();
    // The writer coalesces snapshots that arrive while it is busy, so 50 may have been
    // superseded by 60; either way at most `keep` remain and the newest is the last step.
    assert!(
        steps.len() <= 2 && steps.last().map(String::as_str) == Some("000000000060"),
        "{steps:?}"
    );
    assert!(ckpt.join("000000000060/COMMIT").exists());

    // Same job id again: every rank resumes at step 60, which is the end.
    let again = launch(&spec, &data, 3, &[]);
    for o in &again {
        assert!(o.contains("resumed step=60"), "{o}");
        assert!(o.contains("done step=60"), "{o}");
    }
}

/// Over plain TCP (no shared memory), with every dense layer's gradients gathered as
/// sufficient factors: the ranks agree and train as well as with the allreduce.
#[test]
fn sufficient_factors_over_tcp_train_like_the_allreduce() {
    let dir = tempfile::tempdir().unwrap();
    let mut accs = Vec::new();
    for factors in ["always", "never"] {
        let spec = dir.path().join(format!("{factors}.toml"));
        std::fs::write(
            &spec,
            format!(
                "name = \"t\"\nworkers = 3\n[model]\narch = \"mlp\"\nhidden = [64]\n[train]\n\
                 epochs = 3\nbatch_per_worker = 32\nlr = 0.05\nseed = 3\n\
                 sufficient_factors = \"{factors}\"\n"
            ),
        )
        .unwrap();
        let out = launch(&spec, &dir.path().join(factors), 3, &["--no-shm"]);
        let acc: Vec<f64> = out.iter().map(|o| accuracy(o)).collect();
        assert!(
            acc.iter().all(|a| *a == acc[0]),
            "{factors}: ranks disagree: {acc:?}"
        );
        accs.push(acc[0]);
    }
    assert!(accs[0] > 0.8, "with factors: {accs:?}");
    assert!((accs[0] - accs[1]).abs() < 0.03, "{accs:?}");
}
