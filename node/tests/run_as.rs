//! Real-process test of `--run-as USER` (issue 22, point 5): a node run as root with
//! `--run-as nobody` starts its ranks as `nobody` (uid 65534 on Debian), in a work directory
//! they own; such a rank cannot read the node's API token, identity key, cluster key or Raft
//! log (permission denied), nor list the data directory, and its output still reaches its
//! log; it reads a shared dataset but cannot change it; a train rank writes its checkpoint to
//! the node's store. Skipped (with `SKIPPED` in the
//! output) when the test does not run as root or the host has no `nobody`. Waits poll with
//! deadlines.

mod common;

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use common::mode;

/// Forming the cluster and running each job get this long (a debug build trains slowly).
const WAIT: Duration = Duration::from_secs(120);

const TRAIN_SPEC: &str = r#"
name = "digits-run-as"
kind = "train"
workers = 1
[model]
arch = "mlp"
hidden = [16]
[data]
dataset = "digits"
[train]
epochs = 1
max_steps = 6
batch_per_worker = 32
lr = 0.05
[checkpoint]
every_steps = 3
keep = 2
commit_every_steps = 3
"#;

/// The uid and gid of `nobody`, or why the test cannot run here.
fn nobody() -> Result<(u32, u32), String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err("not running as root".into());
    }
    match nix::unistd::User::from_name("nobody") {
        Ok(Some(u)) => Ok((u.uid.as_raw(), u.gid.as_raw())),
        _ => Err("no user nobody on this host".into()),
    }
}

/// Waits for job `id` to succeed (a failure panics at once).
fn succeeded(c: &ringleader::cli::local::LocalCluster, id: &str) {
    common::wait_job(c, 0, id, "succeeded", WAIT, |d| match d.state.as_str() {
        "failed" | "cancelled" => panic!("job {id} ended {}: {d:#?}", d.state),
        s => s == "succeeded",
    });
}

fn owner(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().uid()
}

#[test]
fn ranks_run_as_the_user_and_cannot_read_the_node_secrets() {
    let (uid, gid) = match nobody() {
        Ok(ids) => ids,
        Err(why) => {
            eprintln!("SKIPPED: --run-as test: {why}");
            return;
        }
    };
    // Phase 1: a node run as root with --run-as nobody. The test's own directory must let
    // the user through (a temporary directory is 0700).
    let root = tempfile::Builder::new()
        .prefix("rl-runas-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let extra = ["--run-as".to_string(), "nobody".to_string()];
    let c = common::formed_cluster(&root.path().join("nodes"), "ra", 1, &extra, WAIT);
    let data = std::path::absolute(&c.nodes[0].dir).unwrap();
    assert_eq!(mode(&data), 0o711, "the data dir: traverse only");
    assert_eq!(mode(&data.join("jobs")), 0o711);
    let secrets: Vec<PathBuf> = vec![
        data.join("api.token"),
        data.join("identity.key"),
        std::path::absolute(c.key_file()).unwrap(),
        data.join("raft/raft-log"),
    ];
    for p in &secrets {
        assert!(p.is_file(), "{} is there to be read", p.display());
        assert_eq!(owner(p), 0, "{}", p.display());
        assert_eq!(mode(p) & 0o077, 0, "{}", p.display());
    }

    // Phase 2: a command job whose rank tries to read them all and to list the data dir.
    let files: Vec<String> = secrets.iter().map(|p| p.display().to_string()).collect();
    let script = format!(
        "echo uid=$(id -u) groups=$(id -G); echo home=$HOME; echo cwd=$(pwd); \
         for f in {}; do if cat \"$f\" >/dev/null; then echo \"read-ok $f\"; \
         else echo \"read-denied $f\"; fi; done; \
         ls {} >/dev/null || echo list-denied; echo mine > mine.txt && echo wrote-cwd; \
         echo \"given: $(cat lib/given.txt)\"; echo more > lib/more.txt && echo wrote-lib",
        files.join(" "),
        data.display()
    );
    let spec = format!(
        "name = \"run-as\"\nkind = \"command\"\nworkers = 1\ncommand = [\"sh\", \"-c\", '''{script}''']\n[[files]]\npath = \"lib/given.txt\"\ntext = \"from the spec\"\n"
    );
    let id = c.nodes[0].client().submit(&spec).expect("submit");
    succeeded(&c, &id);
    let log = common::ok(c.cli(0).args(["logs", &id]).output().unwrap());
    assert!(
        log.contains(&format!("uid={uid} groups={gid}")),
        "the rank runs as nobody with its group only: {log}"
    );
    assert!(!log.contains("read-ok"), "{log}");
    for f in &files {
        assert!(log.contains(&format!("read-denied {f}")), "{f}: {log}");
    }
    assert!(
        log.matches("Permission denied").count() >= files.len(),
        "{log}"
    );
    assert!(log.contains("list-denied"), "{log}");
    assert!(
        log.contains("wrote-cwd"),
        "its work directory is its own: {log}"
    );
    let token = std::fs::read_to_string(data.join("api.token")).unwrap();
    let token = token.lines().next().unwrap().trim();
    assert!(!log.contains(token), "the token leaked into the log");
    // Its work directory (its cwd and HOME) is the user's; its log is the node's.
    let job_dir = data.join("jobs").join(&id);
    let gen_dir = std::fs::read_dir(&job_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_dir())
        .expect("a generation directory");
    let work = gen_dir.join("worker-0");
    assert!(log.contains(&format!("home={}", work.display())), "{log}");
    assert!(log.contains(&format!("cwd={}", work.display())), "{log}");
    assert_eq!(owner(&work), uid);
    assert_eq!(owner(&work.join("mine.txt")), uid);
    // The spec's `[[files]]` are there, the user's, and so is their directory.
    assert!(log.contains("given: from the spec"), "{log}");
    assert!(log.contains("wrote-lib"), "{log}");
    assert_eq!(owner(&work.join("lib")), uid);
    assert_eq!(owner(&work.join("lib/given.txt")), uid);
    let log_file = gen_dir.join("worker-0.log");
    assert_eq!((owner(&log_file), mode(&log_file)), (0, 0o600));
    assert_eq!(mode(&job_dir), 0o711);

    // Phase 3: a shared dataset (added from a directory the user may read: under --run-as
    // an add reads with the user's access) is read by the user's rank, which can neither
    // change it nor list the node's other datasets.
    let source = root.path().join("greeting");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    std::fs::write(source.join("sub/hello.txt"), "the dataset says hi\n").unwrap();
    std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o755)).unwrap();
    common::ok(
        c.cli(0)
            .args(["dataset", "add", "greeting", source.to_str().unwrap()])
            .output()
            .unwrap(),
    );
    let script = "echo \"read: $(cat \"$RINGLEADER_DATASET_DIR/sub/hello.txt\")\"; \
         echo x >> \"$RINGLEADER_DATASET_DIR/sub/hello.txt\" || echo write-denied; \
         ls \"$RINGLEADER_DATASET_DIR/../..\" >/dev/null || echo store-list-denied";
    let spec = format!(
        "name = \"run-as-data\"\nkind = \"command\"\nworkers = 1\nmax_restarts = 0\ncommand = [\"sh\", \"-c\", '''{script}''']\n[data]\ndataset = \"greeting\"\n"
    );
    let id = c.nodes[0].client().submit(&spec).expect("submit");
    succeeded(&c, &id);
    let log = common::ok(c.cli(0).args(["logs", &id]).output().unwrap());
    assert!(log.contains("read: the dataset says hi"), "{log}");
    assert!(log.contains("write-denied"), "{log}");
    assert!(log.contains("store-list-denied"), "{log}");
    let datasets = data.join("datasets");
    assert_eq!(mode(&datasets), 0o711);
    let copy = std::fs::read_dir(&datasets)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("files/sub/hello.txt").is_file())
        .expect("the node's copy");
    let file = copy.join("files/sub/hello.txt");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "the dataset says hi\n"
    );
    // The job has ended: the copy is the node's alone again (it was the dataset group's,
    // 0640, while the rank read it).
    let taken_back = common::poll_until(WAIT, || mode(&copy), |&m| m == 0o700);
    assert_eq!(taken_back, Ok(0o700), "the copy taken back");
    let meta = std::fs::symlink_metadata(&file).unwrap();
    assert_eq!((meta.uid(), meta.gid(), mode(&file)), (0, 0, 0o600));

    // Phase 4: a train job checkpoints into the node's store, in a place the user owns.
    let id = c.nodes[0].client().submit(TRAIN_SPEC).expect("submit");
    succeeded(&c, &id);
    let place = data.join("store/jobs").join(&id);
    assert_eq!(owner(&place), uid);
    let ckpt = place.join(format!("ckpt/{:012}", 6));
    assert!(
        ckpt.join(trainer::COMMIT_FILE).is_file(),
        "no committed checkpoint in {}",
        ckpt.display()
    );
    assert_eq!(mode(&data.join("store/jobs")), 0o711);
    // The node's own record of the job lands in that place as a node-owned file.
    let record = place.join("record.json");
    let deadline = std::time::Instant::now() + WAIT;
    while !record.is_file() {
        assert!(
            std::time::Instant::now() < deadline,
            "no {}",
            record.display()
        );
        std::thread::sleep(common::POLL);
    }
    assert_eq!(owner(&record), 0);
}

#[test]
fn a_node_that_is_not_root_or_names_no_user_is_refused() {
    let root = tempfile::Builder::new()
        .prefix("rl-runas-bad-")
        .tempdir()
        .unwrap();
    let out = std::process::Command::new(common::exe())
        .args([
            "node",
            "--insecure",
            "--run-as",
            "no-such-user-rl",
            "--data-dir",
        ])
        .arg(root.path().join("d"))
        .args(["--listen", "127.0.0.1:0", "--api", "127.0.0.1:0"])
        .output()
        .unwrap();
    let err = common::fails(out);
    assert!(
        err.contains("--run-as no-such-user-rl: no such user"),
        "{err}"
    );
}
