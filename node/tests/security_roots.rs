//! The security review's attacks on the API's reach into the host (issue 47, H1, points 1
//! and 7), as real-process tests: a made token adding the node's data directory,
//! `/etc/shadow` or `/proc/self/environ`, or writing `--to /etc/cron.d`, is refused with a
//! message that says why (the refused path, or the `--dataset-source`/`--dataset-dest` flag
//! it lacks); inside the node's roots it is served; no token reaches the refused paths, not
//! through a link either. Under `--run-as nobody` a file only root may read is refused even
//! inside a root, and `--to` writes the user's files; a shared dataset's copy is readable by
//! the job that uses it and not by another job of the same user, and is taken back when the
//! job ends (both skipped, saying so, when not root or no `nobody`). `ringleader logs ID | head` ends quietly.
//!
//! Before this change every one of the refused adds and writes was served (the review read
//! the cluster key through a dataset). Waits poll with deadlines; nodes are stopped by PID
//! when the cluster is dropped.

mod common;

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::Path,
    process::Command,
    time::Duration,
};

use common::{fails, ok, poll_until, wait_formed, wait_job};
use ringleader::cli::local::LocalCluster;

/// Bound on forming the cluster and on a job (a debug build on two loaded cores is slow).
const WAIT: Duration = Duration::from_secs(120);
/// Bound on a made token reaching a replica.
const REPLICATE_WAIT: Duration = Duration::from_secs(10);

/// A CLI command against node `i` acting with `token` (a made one) instead of the admin's.
fn as_token(c: &LocalCluster, i: usize, token: &str, args: &[&str]) -> std::process::Output {
    c.cli(i)
        .env("RINGLEADER_TOKEN", token)
        .args(args)
        .output()
        .unwrap()
}

/// A token made by the admin on node 0, once every node's replica accepts it.
fn made_token(c: &LocalCluster) -> String {
    let token = ok(c
        .cli(0)
        .args(["token", "create", "roots"])
        .output()
        .unwrap())
    .trim()
    .to_owned();
    for i in 0..c.nodes.len() {
        poll_until(
            REPLICATE_WAIT,
            || as_token(c, i, &token, &["status"]).status.success(),
            |&ok| ok,
        )
        .expect("the made token accepted");
    }
    token
}

fn dir(p: &Path, mode: u32) {
    std::fs::create_dir_all(p).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_made_token_reaches_only_the_nodes_roots_and_no_token_the_refused_paths() {
    // Phase 1: node 0 with a source and a destination root, node 1 with neither.
    let tmp = tempfile::tempdir().unwrap();
    let tmp = std::fs::canonicalize(tmp.path()).unwrap();
    let (src, dst) = (tmp.join("src"), tmp.join("dst"));
    dir(&src.join("set"), 0o755);
    dir(&dst, 0o755);
    std::fs::write(src.join("set/a.txt"), "inside the root\n").unwrap();
    let mut c = LocalCluster::new(common::exe(), tmp.join("nodes"));
    let flags: Vec<String> = ["--dataset-source", src.to_str().unwrap()]
        .into_iter()
        .chain(["--dataset-dest", dst.to_str().unwrap()])
        .map(String::from)
        .collect();
    c.start("ro0", &flags).unwrap();
    c.start_joining("ro1", &[]).unwrap();
    wait_formed(&c, 2, WAIT);
    let token = made_token(&c);
    let data = std::fs::canonicalize(&c.nodes[0].dir).unwrap();
    // A link inside the root to the node's data directory (planted by a local user).
    std::os::unix::fs::symlink(&data, src.join("to-data")).unwrap();

    // Phase 2: the review's adds with a made token on node 0: all refused, saying why.
    let add = |i: usize, name: &str, path: &Path| {
        as_token(
            &c,
            i,
            &token,
            &["dataset", "add", name, path.to_str().unwrap()],
        )
    };
    for (name, path) in [
        ("data-dir", data.clone()),
        ("api-token", data.join("api.token")),
        ("missing-in-data", data.join("no-such-file")),
        ("environ", "/proc/self/environ".into()),
        ("via-link", src.join("to-data/cluster.key")),
    ] {
        let err = fails(add(0, name, &path));
        assert!(err.contains("refused"), "{name}: {err}");
        assert!(err.contains("whatever the token"), "{name}: {err}");
    }
    let err = fails(add(0, "shadow", Path::new("/etc/shadow")));
    assert!(
        err.contains("outside this node's --dataset-source"),
        "{err}"
    );
    // Node 1 has no root: the message names the flag.
    let err = fails(add(1, "anything", &src.join("set")));
    assert!(err.contains("--dataset-source DIR"), "{err}");
    assert!(err.contains("this node has none"), "{err}");

    // Phase 3: inside the root, a made token's add is served.
    ok(add(0, "inside", &src.join("set")));

    // Phase 4: `get --to`: /etc/cron.d outside the destination roots, none on node 1, the
    // data directory refused even to the admin; inside the root the files are written.
    let get = |i: usize, to: &Path, with: Option<&str>| {
        let mut cmd = c.cli(i);
        if let Some(token) = with {
            cmd.env("RINGLEADER_TOKEN", token);
        }
        cmd.args(["dataset", "get", "inside", "--to", to.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let err = fails(get(0, Path::new("/etc/cron.d"), Some(&token)));
    assert!(err.contains("outside this node's --dataset-dest"), "{err}");
    assert!(!Path::new("/etc/cron.d/a.txt").exists());
    let err = fails(get(1, &tmp.join("anywhere"), Some(&token)));
    assert!(err.contains("--dataset-dest DIR"), "{err}");
    let err = fails(get(0, &data.join("jobs/planted"), None));
    assert!(err.contains("refused"), "{err}");
    assert!(!data.join("jobs/planted").exists(), "nothing made there");
    ok(get(0, &dst.join("out"), Some(&token)));
    let got = poll_until(
        WAIT,
        || std::fs::read_to_string(dst.join("out/a.txt")).ok(),
        |t| t.is_some(),
    )
    .expect("the files under --to");
    assert_eq!(got.as_deref(), Some("inside the root\n"));

    // Phase 5: the admin reads anything but the refused paths.
    for (name, path) in [
        ("admin-data", data.clone()),
        ("admin-environ", "/proc/self/environ".into()),
        ("admin-link", src.join("to-data")),
    ] {
        let err = fails(
            c.cli(0)
                .args(["dataset", "add", name, path.to_str().unwrap()])
                .output()
                .unwrap(),
        );
        assert!(err.contains("refused"), "{name}: {err}");
    }
    let outside = tmp.join("outside.txt");
    std::fs::write(&outside, "the admin's to add\n").unwrap();
    ok(c.cli(0)
        .args(["dataset", "add", "admin-any", outside.to_str().unwrap()])
        .output()
        .unwrap());
}

#[test]
fn under_run_as_reads_and_writes_take_the_users_access() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIPPED: --run-as credentials test: not running as root");
        return;
    }
    let Ok(Some(nobody)) = nix::unistd::User::from_name("nobody") else {
        eprintln!("SKIPPED: --run-as credentials test: no user nobody on this host");
        return;
    };
    // Phase 1: a node as root with --run-as nobody and a source root the user can enter,
    // holding a file only root may read and one anybody may.
    let tmp = tempfile::tempdir().unwrap();
    let tmp = std::fs::canonicalize(tmp.path()).unwrap();
    dir(&tmp, 0o711);
    let (src, dst) = (tmp.join("src"), tmp.join("dst"));
    dir(&src, 0o755);
    dir(&dst, 0o777);
    let secret = src.join("root-only.txt");
    std::fs::write(&secret, "root's\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let open = src.join("open.txt");
    std::fs::write(&open, "anyone's\n").unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let flags: Vec<String> = [
        "--run-as",
        "nobody",
        "--dataset-source",
        src.to_str().unwrap(),
    ]
    .into_iter()
    .chain(["--dataset-dest", dst.to_str().unwrap()])
    .map(String::from)
    .collect();
    let c = common::formed_cluster(&tmp.join("nodes"), "rr", 1, &flags, WAIT);
    let token = made_token(&c);

    // Phase 2: inside the root, the root-only file is refused (the user cannot read it);
    // the admin token gets no more under --run-as. The open one is served.
    let err = fails(as_token(
        &c,
        0,
        &token,
        &["dataset", "add", "secret", secret.to_str().unwrap()],
    ));
    assert!(err.contains("Permission denied"), "{err}");
    let err = fails(
        c.cli(0)
            .args(["dataset", "add", "secret", secret.to_str().unwrap()])
            .output()
            .unwrap(),
    );
    assert!(err.contains("Permission denied"), "{err}");
    ok(as_token(
        &c,
        0,
        &token,
        &["dataset", "add", "open", open.to_str().unwrap()],
    ));

    // Phase 3: --to writes as the user: its files, and nothing where it may not write.
    let private = dst.join("roots-own");
    dir(&private, 0o700);
    let get_to = |to: &Path| {
        let to = to.to_str().unwrap();
        as_token(&c, 0, &token, &["dataset", "get", "open", "--to", to])
    };
    let err = fails(get_to(&private.join("x")));
    assert!(err.contains("Permission denied"), "{err}");
    ok(get_to(&dst.join("out")));
    let file = dst.join("out/open.txt");
    poll_until(WAIT, || file.is_file(), |&there| there).expect("the file under --to");
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (nobody.uid.as_raw(), nobody.gid.as_raw())
    );
    assert_eq!(
        std::fs::metadata(dst.join("out")).unwrap().uid(),
        nobody.uid.as_raw()
    );
}

#[test]
fn under_run_as_a_shared_copy_is_its_jobs_only_and_taken_back_when_it_ends() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIPPED: --run-as dataset sharing test: not running as root");
        return;
    }
    if !matches!(nix::unistd::User::from_name("nobody"), Ok(Some(_))) {
        eprintln!("SKIPPED: --run-as dataset sharing test: no user nobody on this host");
        return;
    }
    // Phase 1: a node with --run-as nobody and a dataset the user may read.
    let tmp = tempfile::tempdir().unwrap();
    let tmp = std::fs::canonicalize(tmp.path()).unwrap();
    dir(&tmp, 0o711);
    let src = tmp.join("greeting");
    dir(&src, 0o755);
    std::fs::write(src.join("hello.txt"), "the dataset says hi\n").unwrap();
    let flags = ["--run-as".to_string(), "nobody".to_string()];
    let c = common::formed_cluster(&tmp.join("nodes"), "rs", 1, &flags, WAIT);
    ok(c.cli(0)
        .args(["dataset", "add", "greeting", src.to_str().unwrap()])
        .output()
        .unwrap());
    let data = std::fs::canonicalize(&c.nodes[0].dir).unwrap();
    let copy = std::fs::read_dir(data.join("datasets"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("files/hello.txt").is_file())
        .expect("the node's copy");
    let file = copy.join("files/hello.txt");

    // Phase 2: a job on the dataset reads it and waits; meanwhile another job of the same
    // user, without the dataset, tries the same file (the review read it from any job).
    let flag = tmp.join("reader-may-end");
    let reader = format!(
        "name = \"reader\"\nkind = \"command\"\nworkers = 1\nmax_restarts = 0\n\
         command = [\"sh\", \"-c\", '''cat \"$RINGLEADER_DATASET_DIR/hello.txt\"; \
         while [ ! -e {} ]; do sleep 0.1; done''']\n[data]\ndataset = \"greeting\"\n",
        flag.display()
    );
    let id = c.nodes[0].client().submit(&reader).expect("submit");
    let logs = |id: &str| ok(c.cli(0).args(["logs", id]).output().unwrap());
    poll_until(WAIT, || logs(&id), |l| l.contains("the dataset says hi"))
        .expect("the job on the dataset reads it");
    let other = format!(
        "name = \"other\"\nkind = \"command\"\nworkers = 1\nmax_restarts = 0\n\
         command = [\"sh\", \"-c\", '''cat {} || echo other-denied''']\n",
        file.display()
    );
    let other = c.nodes[0].client().submit(&other).expect("submit");
    wait_job(&c, 0, &other, "ended", WAIT, common::ended);
    let log = logs(&other);
    assert!(log.contains("other-denied"), "{log}");
    assert!(!log.contains("the dataset says hi"), "{log}");

    // Phase 3: the job ends, and the copy is the node's alone again.
    std::fs::write(&flag, "").unwrap();
    wait_job(&c, 0, &id, "succeeded", WAIT, |d| d.state == "succeeded");
    let taken_back = poll_until(WAIT, || common::mode(&file), |&m| m == 0o600);
    assert_eq!(taken_back, Ok(0o600), "the copy taken back after the job");
    assert_eq!(common::mode(&copy), 0o700);
    assert_eq!(std::fs::metadata(&file).unwrap().gid(), 0);
}

#[test]
fn logs_into_a_closed_pipe_end_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let c = common::formed_cluster(tmp.path(), "lp", 1, &[], WAIT);
    // More than a pipe holds (64 KiB), so the CLI is still writing when `head` leaves.
    let spec = "name = \"chatty\"\nkind = \"command\"\nworkers = 1\n\
                command = [\"sh\", \"-c\", \"seq 1 40000\"]\n";
    let id = c.nodes[0].client().submit(spec).expect("submit");
    wait_job(&c, 0, &id, "succeeded", WAIT, |d| d.state == "succeeded");
    let out = Command::new("bash")
        .envs(c.nodes[0].cli_env())
        .args([
            "-c",
            &format!(
                "'{}' logs {id} | head -n 2; echo \"status=${{PIPESTATUS[0]}}\"",
                common::exe()
            ),
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(stdout.contains("status=0"), "{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    assert!(stderr.trim().is_empty(), "nothing on stderr: {stderr}");
}
