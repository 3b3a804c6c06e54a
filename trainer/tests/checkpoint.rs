//! Checkpoints: resume equals an uninterrupted run; a corrupt or half-written checkpoint is
//! skipped with a warning in favour of the previous committed one; pruning keeps `keep`.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::on_group;
use trainer::{
    operator_from_url, read_capped, CheckpointStore, Checkpointer, ReadCappedError, TrainError,
    TrainParams, TrainSpec, Trainer, COMMIT_BYTES_MAX, META_BYTES_MAX,
};

fn spec(total: u64) -> TrainSpec {
    TrainSpec {
        train: TrainParams {
            epochs: 1,
            max_steps: Some(total),
            batch_per_worker: 16,
            optimizer: trainer::OptimizerKind::Adamw,
            lr: 0.003,
            ..TrainParams::default()
        },
        ..TrainSpec::default()
    }
}

/// Runs a group of `world` on `spec`: restores from `store`'s latest checkpoint if `resume`,
/// trains until `stop` steps are done, rank 0 checkpoints at `stop`; returns rank 0's params.
fn run(
    spec: &TrainSpec,
    world: usize,
    store: &CheckpointStore,
    resume: bool,
    stop: u64,
) -> Vec<Vec<f32>> {
    let (spec, store) = (spec.clone(), store.clone());
    let out = on_group(world, move |c| {
        let (spec, store) = (spec.clone(), store.clone());
        async move {
            let mut t = Trainer::new(&spec, c)?;
            if resume {
                let s = store
                    .load_latest()
                    .await?
                    .expect("a checkpoint to resume from");
                t.restore(&s)?;
            }
            while t.step_count() < stop {
                t.step().await?;
            }
            if t.rank() == 0 {
                let mut ck = Checkpointer::spawn(store.clone(), 3);
                ck.save(Arc::new(t.snapshot().unwrap()));
                ck.close().await?;
            }
            Ok::<_, TrainError>(t.params()?.to_vec())
        }
    });
    out.into_iter().next().unwrap().unwrap()
}

#[test]
fn resume_from_checkpoint_equals_uninterrupted_run() {
    let total = 24;
    let s = spec(total);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let interrupted = CheckpointStore::from_url(&url, "job-a").unwrap();
    run(&s, 2, &interrupted, false, 10);
    let resumed = run(&s, 2, &interrupted, true, total);
    let straight_store = CheckpointStore::from_url("memory://", "job-b").unwrap();
    let straight = run(&s, 2, &straight_store, false, total);
    assert_eq!(
        resumed, straight,
        "resumed run must be bit-identical to the uninterrupted one"
    );
    let latest = rt().block_on(interrupted.load_latest()).unwrap().unwrap();
    assert_eq!(latest.meta.step, total);
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Collects log output for assertions.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn corrupt_and_half_written_checkpoints_are_skipped_with_a_warning() {
    let logs = Logs::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    rt().block_on(async {
        let store = CheckpointStore::new(operator_from_url("memory://").unwrap(), "job-c").unwrap();
        let mut t = Trainer::new(
            &spec(40),
            collective::Communicator::in_memory(1, Default::default())
                .unwrap()
                .pop()
                .unwrap(),
        )
        .unwrap();
        let mut states = Vec::new();
        for stop in [10, 20, 30] {
            while t.step_count() < stop {
                t.step().await.unwrap();
            }
            let s = t.snapshot().unwrap();
            store.write(&s).await.unwrap();
            states.push(s);
        }
        let op = store.operator().clone();
        // Step 30: a byte of the parameters flipped after commit.
        let path = format!("{}model.safetensors", store.dir(30));
        let mut bytes = op.read(&path).await.unwrap().to_vec();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        op.write(&path, bytes).await.unwrap();
        // Step 40: half-written (files but no commit marker).
        while t.step_count() < 40 {
            t.step().await.unwrap();
        }
        let mut half = t.snapshot().unwrap();
        half.meta.step = 40;
        store.write(&half).await.unwrap();
        op.delete(&format!("{}COMMIT", store.dir(40)))
            .await
            .unwrap();

        let got = store
            .load_latest()
            .await
            .unwrap()
            .expect("step 20 survives");
        assert_eq!(
            got.meta, states[1].meta,
            "falls back to the newest intact committed checkpoint"
        );
        assert!(
            got == states[1],
            "tensors of step 20 differ after the round trip"
        );
        assert!(matches!(
            store.load(30).await,
            Err(TrainError::Corrupt { .. })
        ));
        assert!(matches!(
            store.load(40).await,
            Err(TrainError::Corrupt { .. })
        ));

        // Pruning to 1 keeps the newest committed directory (30, even though corrupt: it is
        // committed) and removes older ones; the uncommitted 40 is newer, so it stays.
        let deleted = store.prune(1).await.unwrap();
        assert_eq!(deleted, vec![10, 20]);
        assert_eq!(store.steps().await.unwrap(), vec![30, 40]);
    });
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("WARN")
            && text.contains("checkpoint skipped")
            && text.contains("step=40")
            && text.contains("step=30"),
        "logs: {text}"
    );
}

/// Objects over their limits are refused from their stat, before they are read: a commit
/// marker over `COMMIT_BYTES_MAX`, a marker announcing a `meta.json` over `META_BYTES_MAX`,
/// a file longer than its marker says.
#[test]
fn oversized_objects_are_refused_before_reading() {
    rt().block_on(async {
        let op = operator_from_url("memory://").unwrap();
        let store = CheckpointStore::new(op.clone(), "job-d").unwrap();
        let corrupt_detail = |r: Result<_, TrainError>| match r {
            Err(TrainError::Corrupt { detail, .. }) => detail,
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("loaded"),
        };

        let marker = |step: u64| format!("{}COMMIT", store.dir(step));
        op.write(&marker(1), vec![b' '; COMMIT_BYTES_MAX as usize + 1])
            .await
            .unwrap();
        let d = corrupt_detail(store.load(1).await);
        assert!(
            d.contains("commit marker") && d.contains("over the limit"),
            "{d}"
        );

        let hash = |b: &[u8]| blake3::hash(b).to_hex().to_string();
        for name in ["model.safetensors", "optimizer.safetensors"] {
            op.write(&format!("{}{name}", store.dir(2)), b"ab".to_vec())
                .await
                .unwrap();
        }
        let commit = |meta_len: u64, model_len: u64| {
            serde_json::json!({"step": 2, "files": {
                "model.safetensors": [model_len, hash(b"ab")],
                "optimizer.safetensors": [2, hash(b"ab")],
                "meta.json": [meta_len, "00"],
            }})
            .to_string()
        };
        op.write(&marker(2), commit(META_BYTES_MAX + 1, 2))
            .await
            .unwrap();
        let d = corrupt_detail(store.load(2).await);
        assert!(
            d.contains("meta.json") && d.contains("over the limit"),
            "{d}"
        );
        // The model object is 2 bytes, the marker says 1: refused without reading it.
        op.write(&marker(2), commit(10, 1)).await.unwrap();
        let d = corrupt_detail(store.load(2).await);
        assert!(d.contains("model.safetensors does not match"), "{d}");

        let path = "any/object";
        op.write(path, vec![7u8; 100]).await.unwrap();
        assert!(matches!(
            read_capped(&op, path, 99).await,
            Err(ReadCappedError::TooLarge {
                len: 100,
                max_bytes: 99,
                ..
            })
        ));
        assert_eq!(read_capped(&op, path, 100).await.unwrap(), vec![7u8; 100]);
    });
}

#[test]
fn writer_coalesces_and_prunes_to_keep() {
    rt().block_on(async {
        let store = CheckpointStore::from_url("memory://", "job-d").unwrap();
        let mut t = Trainer::new(
            &spec(5),
            collective::Communicator::in_memory(1, Default::default())
                .unwrap()
                .pop()
                .unwrap(),
        )
        .unwrap();
        let mut ck = Checkpointer::spawn(store.clone(), 2);
        for _ in 0..5 {
            t.step().await.unwrap();
            ck.save(Arc::new(t.snapshot().unwrap()));
            ck.flush().await.unwrap();
        }
        ck.close().await.unwrap();
        assert_eq!(store.steps().await.unwrap(), vec![4, 5]);
        assert_eq!(store.load_latest().await.unwrap().unwrap().meta.step, 5);
    });
}

/// An S3-compatible server (s3s-fs, a file-backed S3 implementation) on a free port, killed
/// on drop.
struct S3Server {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl S3Server {
    /// `None` when no `s3s-fs` binary is found (`S3S_FS`, `PATH`, `~/.cargo/bin`; scripts/test.sh
    /// installs it).
    fn start() -> Option<S3Server> {
        let bin = std::env::var_os("S3S_FS")
            .map(std::path::PathBuf::from)
            .into_iter()
            .chain(std::env::var_os("PATH").into_iter().flat_map(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("s3s-fs"))
                    .collect::<Vec<_>>()
            }))
            .chain(
                std::env::var_os("HOME")
                    .map(|h| std::path::Path::new(&h).join(".cargo/bin/s3s-fs")),
            )
            .find(|p| p.is_file())?;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ckpt")).unwrap();
        let port = collective::testing::unused_local_port();
        let child = std::process::Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--access-key",
                "ringleader",
                "--secret-key",
                "ringleader-secret",
            ])
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting s3s-fs");
        let server = S3Server {
            child,
            port,
            _dir: dir,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "s3s-fs did not listen in 20 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Some(server)
    }

    fn url(&self, prefix: &str) -> String {
        format!(
            "s3://ckpt/{prefix}?endpoint=http://127.0.0.1:{}&access_key_id=ringleader&secret_access_key=ringleader-secret",
            self.port
        )
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn checkpoints_through_s3_resume_like_local_ones() {
    let Some(server) = S3Server::start() else {
        eprintln!("no s3s-fs binary: skipping the S3 checkpoint test");
        return;
    };
    let total = 12;
    let s = spec(total);
    let store = CheckpointStore::from_url(&server.url("runs"), "job-s3").unwrap();
    run(&s, 2, &store, false, 5);
    let resumed = run(&s, 2, &store, true, total);
    let straight = run(
        &s,
        2,
        &CheckpointStore::from_url("memory://", "job-s3b").unwrap(),
        false,
        total,
    );
    assert_eq!(
        resumed, straight,
        "resumed through S3 must equal the uninterrupted run"
    );
    let rt = rt();
    assert_eq!(rt.block_on(store.steps()).unwrap(), vec![5, total]);
    // What is in the bucket is what a file store would hold: the committed files.
    let listed = rt
        .block_on(async {
            store
                .operator()
                .list_with(&store.dir(5))
                .recursive(true)
                .await
        })
        .unwrap();
    let mut names: Vec<String> = listed.iter().map(|e| e.name().to_string()).collect();
    names.sort();
    assert!(names.iter().any(|n| n == trainer::COMMIT_FILE), "{names:?}");
    assert!(
        names.iter().any(|n| n.ends_with(".safetensors")),
        "{names:?}"
    );
}
