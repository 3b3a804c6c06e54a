//! A checkpoint loads in Python with `safetensors` (skipped, saying so, when python3 or the
//! `safetensors`/`numpy` packages are missing).

use std::process::Command;

use trainer::{CheckpointStore, TrainSpec, Trainer};

#[test]
fn checkpoint_loads_in_python_safetensors() {
    let probe = Command::new("python3")
        .args(["-c", "import safetensors.numpy, numpy"])
        .status();
    if !matches!(probe, Ok(s) if s.success()) {
        eprintln!("SKIPPED: python3 with safetensors and numpy not available (pip install safetensors numpy)");
        return;
    }
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
        let s = t.snapshot();
        store.write(&s).await.unwrap();
        s
    });
    let ckpt = dir.path().join("jobs/py/ckpt/000000000003");
    // The script prints `name shape sum` per tensor of model.safetensors; compare with ours.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/check_checkpoint.py");
    let out = Command::new("python3")
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
