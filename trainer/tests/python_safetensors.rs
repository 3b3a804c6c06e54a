//! Python and the trainer share files through `safetensors`: a checkpoint loads in Python,
//! and `examples/make_dataset.py` writes a shared dataset the trainer reads. Skipped, saying
//! so, when the interpreter or its `safetensors`/`numpy` packages are missing; `PYTHON`
//! picks the interpreter (default `python3`).

use std::process::Command;

use trainer::{CheckpointStore, Dataset, TrainSpec, Trainer};

/// The interpreter, if it has safetensors and numpy; otherwise says SKIPPED.
fn python() -> Option<String> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python)
        .args(["-c", "import safetensors.numpy, numpy"])
        .status();
    if matches!(probe, Ok(s) if s.success()) {
        Some(python)
    } else {
        println!("SKIPPED: {python} with safetensors and numpy not available (pip install safetensors numpy)");
        None
    }
}

#[test]
fn make_dataset_py_writes_a_readable_shared_dataset() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/make_dataset.py");
    let out = Command::new(&python)
        .arg(script)
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (train, val) = Dataset::shared(dir.path()).unwrap();
    assert_eq!((train.len(), val.len()), (900, 100));
    assert_eq!((train.input_shape(), train.classes()), ([1, 28, 28], 10));
}

#[test]
fn checkpoint_loads_in_python_safetensors() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let state = rt.block_on(async {
        let store =
            CheckpointStore::from_url(&format!("file://{}", dir.path().display()), "py").unwrap();
        let comm = collective::Communicator::in_memory(1, Default::default())
            .unwrap()
            .pop()
            .unwrap();
        let mut t = Trainer::new(&TrainSpec::default(), comm).unwrap();
        for _ in 0..3 {
            t.step().await.unwrap();
        }
        let s = t.snapshot().unwrap();
        store.write(&s).await.unwrap();
        s
    });
    let ckpt = dir.path().join("jobs/py/ckpt/000000000003");
    // The script prints `name shape sum` per tensor of model.safetensors; compare with ours.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/check_checkpoint.py");
    let out = Command::new(&python)
        .arg(script)
        .arg(&ckpt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), state.params.len(), "output: {text}");
    for (line, t) in lines.iter().zip(&state.params) {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[0], t.name);
        assert_eq!(
            f[1],
            t.shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("x")
        );
        let ours: f64 = t.data.iter().map(|&v| v as f64).sum();
        let theirs: f64 = f[2].parse().unwrap();
        assert!(
            (ours - theirs).abs() <= 1e-6 * (1.0 + ours.abs()),
            "{}: {ours} vs {theirs}",
            t.name
        );
    }
}
