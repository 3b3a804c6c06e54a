//! Observability of a job in its storage: rank 0's TensorBoard event file under
//! `jobs/<id>/tb/` and the gathered timeline `jobs/<id>/timeline.json`, written by real
//! `train-worker` processes; TensorBoard's own reader accepts the event file (when python3
//! has `tensorboard`); and a worker whose observability writes fail still trains.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use trainer::observe::event_file::decode_file;
use trainer::observe::{ScalarLog, EPOCH_TAGS, PHASES, STEP_TAGS, TIMELINE_STEPS};
use trainer::{EpochMetrics, StepMetrics};

/// Deadline for one launch of the workers, s.
const LAUNCH_DEADLINE_S: u64 = 120;

const SPEC: &str = "name = \"t\"\nworkers = 2\n[model]\narch = \"mlp\"\nhidden = [32]\n\
    [train]\nepochs = 2\nbatch_per_worker = 32\nlr = 0.05\nseed = 5\n\
    [checkpoint]\nevery_steps = 20\nkeep = 1\n";

/// Starts `world` workers of job `job` (with `extra` arguments; stdin a pipe held open
/// until they end: an elastic worker stops at the end of stdin) and waits (polling with a
/// deadline) for all; kills the rest by handle if one fails or time runs out. Returns each
/// worker's stdout.
fn launch(spec: &Path, data_dir: &Path, world: usize, job: &str, extra: &[&str]) -> Vec<String> {
    let addrs: Vec<String> = (0..world)
        .map(|_| format!("127.0.0.1:{}", collective::testing::unused_local_port()))
        .collect();
    let addrs = addrs.join(",");
    let mut children: Vec<Child> = (0..world)
        .map(|r| {
            Command::new(env!("CARGO_BIN_EXE_train-worker"))
                .args(["--spec", spec.to_str().unwrap(), "--rank", &r.to_string()])
                .args(["--addrs", &addrs, "--job-id", job])
                .args(["--data-dir", data_dir.to_str().unwrap()])
                .args(extra)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    let stdins: Vec<_> = children.iter_mut().map(|c| c.stdin.take()).collect();
    common::wait_success(&mut children, Duration::from_secs(LAUNCH_DEADLINE_S));
    drop(stdins);
    children
        .into_iter()
        .map(|c| String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap())
        .collect()
}

/// The steps of a `done step=N` line.
fn done_step(out: &str) -> u64 {
    out.lines()
        .find_map(|l| l.split(" done step=").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no done line in {out}"))
}

#[test]
fn workers_write_tensorboard_scalars_and_a_gathered_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("job.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let data = dir.path().join("data");
    let out = launch(&spec, &data, 2, "obs-test", &[]);
    let steps = done_step(&out[0]);
    assert!(steps > 0);
    assert!(out[0].contains("tensorboard at="), "{}", out[0]);
    assert!(
        !out[1].contains("tensorboard at="),
        "only rank 0 writes: {}",
        out[1]
    );

    // TensorBoard: one event file, every step's scalars and every validation.
    let tb = data.join("store/jobs/obs-test/tb");
    let files: Vec<_> = std::fs::read_dir(&tb)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.starts_with("events.out.tfevents."), "{name}");
    let events = decode_file(&std::fs::read(&files[0]).unwrap()).unwrap();
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    let step_points: Vec<_> = events.iter().filter(|e| e.values.len() == 3).collect();
    assert_eq!(step_points.len() as u64, steps);
    for (i, e) in step_points.iter().enumerate() {
        assert_eq!(e.step, i as i64 + 1);
        let tags: Vec<&str> = e.values.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(tags, STEP_TAGS);
        assert!(e.values.iter().all(|(_, v)| v.is_finite()));
        assert!(e.wall_time_s > 1.6e9);
    }
    let vals: Vec<_> = events.iter().filter(|e| e.values.len() == 2).collect();
    assert_eq!(vals.len(), 2, "one validation per epoch");
    assert_eq!(vals[1].step as u64, steps);
    assert_eq!(vals[1].values[0].0, EPOCH_TAGS[0]);
    let acc = vals[1].values[1].1;
    assert!(acc > 0.5 && acc <= 1.0, "val_accuracy {acc}");

    // Timeline: both ranks' first steps, each phase once per step.
    let text = std::fs::read_to_string(data.join("store/jobs/obs-test/timeline.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let x: Vec<&serde_json::Value> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect();
    let recorded = (steps as usize).min(TIMELINE_STEPS);
    for rank in 0..2u64 {
        let mine: Vec<_> = x.iter().filter(|e| e["tid"] == rank).collect();
        assert_eq!(mine.len(), recorded * (PHASES.len() + 1), "rank {rank}");
        for phase in PHASES {
            assert_eq!(mine.iter().filter(|e| e["name"] == phase).count(), recorded);
        }
    }
    assert!(x.iter().all(|e| e["dur"].as_f64().unwrap() >= 0.0));
}

#[test]
fn elastic_workers_write_tensorboard_and_one_timeline_per_rank() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("job.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let data = dir.path().join("data");
    let out = launch(
        &spec,
        &data,
        2,
        "obs-elastic",
        &["--elastic", "--max-steps", "25"],
    );
    for o in &out {
        assert_eq!(done_step(o), 25, "{o}");
    }
    let job = data.join("store/jobs/obs-elastic");
    let files: Vec<_> = std::fs::read_dir(job.join("tb"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let events = decode_file(&std::fs::read(&files[0]).unwrap()).unwrap();
    assert_eq!(events.iter().filter(|e| e.values.len() == 3).count(), 25);
    for rank in 0..2u64 {
        let path = job.join(format!("timeline-rank-{rank}.json"));
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let x: Vec<_> = doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .collect();
        assert_eq!(x.len(), TIMELINE_STEPS * (PHASES.len() + 1));
        assert!(x.iter().all(|e| e["tid"] == rank));
    }
    assert!(!job.join("timeline.json").exists());
}

#[test]
fn a_worker_whose_observability_writes_fail_still_trains() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("job.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let data = dir.path().join("data");
    let job = data.join("store/jobs/obs-fail");
    std::fs::create_dir_all(&job).unwrap();
    // A file where the event files' directory goes, a directory where the timeline goes.
    std::fs::write(job.join("tb"), b"in the way").unwrap();
    std::fs::create_dir_all(job.join("timeline.json/x")).unwrap();
    let out = launch(&spec, &data, 2, "obs-fail", &[]);
    for o in &out {
        assert!(done_step(o) > 0, "{o}");
    }
    assert!(job.join("ckpt").exists(), "checkpoints still written");
}

/// Reads a file written by [`ScalarLog`] with TensorBoard's own loader in python3; skipped
/// when python3 lacks `tensorboard`.
#[test]
fn tensorboard_reads_the_event_file() {
    let has_tb = Command::new("python3")
        .args(["-c", "import tensorboard"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_tb {
        println!("SKIPPED: tensorboard not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut log = ScalarLog::new(1_700_000_000.0, 1000);
    for s in 1..=30u64 {
        let m = StepMetrics {
            step: s,
            samples_per_step: 0,
            epoch: s / 10,
            loss: 1.0 / s as f64,
            lr: 0.01 * s as f64,
            samples_per_s: 100.0 * s as f64,
            compute_s: 0.0,
            pack_s: 0.0,
            comm_wait_s: 0.0,
            optim_s: 0.0,
            step_s: 0.0,
            sent_bytes: 0,
        };
        log.step(&m, 1_700_000_000.0 + s as f64);
        if s % 10 == 0 {
            let e = EpochMetrics {
                epoch: s / 10 - 1,
                step: s,
                val_loss: 2.0 / s as f64,
                val_accuracy: s as f64 / 40.0,
            };
            log.epoch(&e, 1_700_000_000.5 + s as f64);
        }
    }
    let path = dir.path().join("events.out.tfevents.1700000000.test.1");
    std::fs::write(&path, log.encode()).unwrap();
    let script = r#"
import sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
for tag in sorted(acc.Tags()["scalars"]):
    for e in acc.Scalars(tag):
        print(tag, e.step, repr(e.value), e.wall_time)
"#;
    let out = Command::new("python3")
        .args(["-c", script, dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<(String, i64, f64, f64)> = stdout
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].to_string(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            )
        })
        .collect();
    let of = |tag: &str| -> Vec<(i64, f64, f64)> {
        rows.iter()
            .filter(|r| r.0 == tag)
            .map(|r| (r.1, r.2, r.3))
            .collect()
    };
    for tag in STEP_TAGS {
        assert_eq!(of(tag).len(), 30, "{tag}: {stdout}");
    }
    for tag in EPOCH_TAGS {
        assert_eq!(of(tag).len(), 3, "{tag}: {stdout}");
    }
    let loss = of("loss");
    assert_eq!(loss[3].0, 4);
    assert_eq!(loss[3].1, f64::from(0.25f32));
    assert_eq!(loss[3].2, 1_700_000_004.0);
    let sps = of("samples_per_s");
    assert_eq!(sps[29], (30, 3000.0, 1_700_000_030.0));
    let acc = of("val_accuracy");
    assert_eq!(acc[2].0, 30);
    assert_eq!(acc[2].1, f64::from(0.75f32));
}
