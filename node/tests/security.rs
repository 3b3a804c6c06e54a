//! Real-process tests of the secure defaults (issue 22's attacks, repeated against real
//! nodes): a node started with no key makes its cluster key and admin token (0600) and wants
//! the token; a joiner without the key is refused with a clear error; `--insecure` is the one
//! open mode and says so; nothing a node writes (Raft log, records, logs, checkpoints) is
//! open to other local users, and an older data directory is tightened at start; a ring's
//! secret, which a rank gets in its environment, is stored in no file (a local user who reads
//! the node's files cannot forge a rank's handshake).
//!
//! The foreign joiner with another key or none is `cluster.rs`'s
//! `a_node_with_another_cluster_key_is_never_admitted`; the browser and hostile-client attacks
//! are `security_api.rs`; symlinks are `security_files.rs`.
//!
//! Every wait polls with a deadline; every process started here is stopped by PID.

mod common;

use std::{
    os::unix::fs::PermissionsExt,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::{exe, POLL};
use common::{mode, walk};
use ringleader::{api::client::ApiClient, node::NodeInfo};

/// Bound on each wait (a debug build on two cores is slow).
const WAIT: Duration = Duration::from_secs(120);

/// A node process started by hand (not through `LocalCluster`, which always passes a key);
/// killed by PID when dropped.
struct Raw(Child);

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `ringleader node` on loopback ports the OS picks with `extra` arguments and waits
/// for its `node.json`.
fn start_raw(dir: &Path, name: &str, extra: &[&str]) -> (Raw, NodeInfo) {
    std::fs::create_dir_all(dir).unwrap();
    let log = std::fs::File::create(dir.with_extension("log")).unwrap();
    let child = Command::new(exe())
        .args(["node", "--name", name, "--data-dir"])
        .arg(dir)
        .args(["--listen", "127.0.0.1:0", "--api", "127.0.0.1:0"])
        .args(["--data", "127.0.0.1:0"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut raw = Raw(child);
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(info) = NodeInfo::read(dir) {
            if info.pid == raw.0.id() {
                return (raw, info);
            }
        }
        if let Some(status) = raw.0.try_wait().unwrap() {
            let log = std::fs::read_to_string(dir.with_extension("log")).unwrap_or_default();
            panic!("node {name} exited at start ({status}): {log}");
        }
        assert!(Instant::now() < deadline, "node {name} did not start");
        std::thread::sleep(POLL);
    }
}

#[test]
fn a_first_node_makes_its_key_and_token_and_a_joiner_without_the_key_is_refused() {
    let root = tempfile::Builder::new()
        .prefix("rl-security-")
        .tempdir()
        .unwrap();
    let dir = root.path().join("first");
    // An older data directory, left open to other users.
    std::fs::create_dir_all(dir.join("jobs")).unwrap();
    std::fs::write(dir.join("jobs/old.log"), "old").unwrap();
    for p in [dir.clone(), dir.join("jobs"), dir.join("jobs/old.log")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    // Phase 1: the first node makes the key and the admin token, 0600, and tightens the
    // directory it was given.
    let (_first, info) = start_raw(&dir, "first", &[]);
    let key = dir.join("cluster.key");
    let token_file = dir.join("api.token");
    assert_eq!(mode(&key), 0o600);
    assert_eq!(mode(&token_file), 0o600);
    assert_eq!(mode(&dir), 0o700, "the data directory is upgraded");
    assert_eq!(mode(&dir.join("jobs/old.log")), 0o700 & 0o755);
    let log = std::fs::read_to_string(dir.with_extension("log")).unwrap();
    assert!(log.contains("cluster key written to"), "{log}");
    // The token is the file's first line (a `tls sha256:…` line follows).
    let token_text = std::fs::read_to_string(&token_file).unwrap();
    let token_line = token_text.lines().next().unwrap().trim().to_string();
    assert!(token_text
        .lines()
        .nth(1)
        .unwrap()
        .starts_with("tls sha256:"));
    assert!(!log.contains(&token_line));

    // Phase 2: its API wants the token; the CLI finds it through --token-file.
    let open = ApiClient::new(&info.api_addr, None);
    let err = open.status().unwrap_err().to_string();
    assert!(err.contains("wants an API token"), "{err}");
    let token = token_line;
    let s = ApiClient::new(&info.api_addr, Some(token.clone()))
        .status()
        .unwrap();
    assert!(!s.insecure);
    let out = Command::new(exe())
        .args(["--peer", &info.api_addr, "--token-file"])
        .arg(&token_file)
        .args(["status", "--json"])
        .env_remove("RINGLEADER_TOKEN")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    // Phase 3: a joiner without the key stops at once, saying what it needs.
    let out = Command::new(exe())
        .args(["node", "--data-dir"])
        .arg(root.path().join("joiner"))
        .args(["--listen", "127.0.0.1:0", "--api", "127.0.0.1:0"])
        .args(["--join", &info.p2p_addrs[0]])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--join needs the cluster key"), "{err}");

    // Phase 4: with the key it joins, and the same token works on it.
    let (_joiner, jinfo) = start_raw(
        &root.path().join("joiner"),
        "joiner",
        &[
            "--join",
            &info.p2p_addrs[0],
            "--cluster-key",
            key.to_str().unwrap(),
        ],
    );
    let client = ApiClient::new(&jinfo.api_addr, Some(token));
    let deadline = Instant::now() + WAIT;
    while client.status().map(|s| s.names_in("alive").len()).ok() != Some(2) {
        assert!(Instant::now() < deadline, "the joiner never joined");
        std::thread::sleep(POLL);
    }

    // Phase 5: a key file others may read is refused.
    let loose = root.path().join("loose.key");
    std::fs::copy(&key, &loose).unwrap();
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(exe())
        .args(["node", "--data-dir"])
        .arg(root.path().join("loose"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--api",
            "127.0.0.1:0",
            "--cluster-key",
        ])
        .arg(&loose)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("chmod 600"), "{err}");
}

#[test]
fn insecure_is_explicit_and_shown() {
    let root = tempfile::Builder::new()
        .prefix("rl-insecure-")
        .tempdir()
        .unwrap();
    let dir = root.path().join("open");
    let (_node, info) = start_raw(&dir, "open", &["--insecure"]);
    assert!(!dir.join("cluster.key").exists() && !dir.join("api.token").exists());
    let s = ApiClient::new(&info.api_addr, None).status().unwrap();
    assert!(s.insecure, "status says the cluster is open");
    assert!(s.to_table().contains("INSECURE"), "{}", s.to_table());
    let log = std::fs::read_to_string(dir.with_extension("log")).unwrap();
    assert!(log.contains("--insecure"), "{log}");
}

const TRAIN: &str = r#"
name = "modes"
kind = "train"
workers = 2
[model]
arch = "mlp"
hidden = [32]
[data]
dataset = "digits"
[train]
epochs = 40
batch_per_worker = 32
lr = 0.05
[checkpoint]
every_steps = 5
keep = 2
"#;

#[test]
fn nothing_a_node_writes_is_open_to_others_and_no_file_holds_a_ring_secret() {
    let root = tempfile::Builder::new()
        .prefix("rl-modes-")
        .tempdir()
        .unwrap();
    let mut c = common::formed_cluster(root.path(), "m", 2, &[], WAIT);

    // Phase 1: a train job runs; its ranks hold the ring secret in their environment.
    let id = c.nodes[0].client().submit(TRAIN).unwrap();
    let deadline = Instant::now() + WAIT;
    let secrets = loop {
        let found: Vec<String> = ringleader::cli::local::train_workers(&id)
            .keys()
            .filter_map(|pid| std::fs::read(format!("/proc/{pid}/environ")).ok())
            .filter_map(|env| {
                env.split(|b| *b == 0)
                    .find_map(|kv| kv.strip_prefix(b"RINGLEADER_SECRET=").map(<[u8]>::to_vec))
            })
            .map(|v| String::from_utf8(v).unwrap())
            .collect();
        if found.len() == 2 {
            break found;
        }
        assert!(Instant::now() < deadline, "no train ranks of {id}");
        std::thread::sleep(POLL);
    };
    assert_eq!(secrets[0], secrets[1], "one secret per ring");
    // Checkpoints written, then the job ends.
    common::wait_job(&c, 0, &id, "a checkpoint", WAIT, |d| {
        d.step.unwrap_or(0) >= 10
    });
    c.nodes[0]
        .client()
        .post::<serde_json::Value>(&format!("/v1/jobs/{id}/cancel"), "")
        .unwrap();
    common::wait_job(&c, 0, &id, "cancelled", WAIT, |d| d.state == "cancelled");
    c.stop_all();

    // Phase 2: every directory 0700, every file without group or other bits; the secret in
    // no file (the Raft log and snapshots hold only the chief's nonce).
    let mut checked = 0;
    for node in &c.nodes {
        for p in walk(&node.dir) {
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.file_type().is_symlink() {
                continue;
            }
            assert_eq!(
                mode(&p) & 0o077,
                0,
                "{} is open to others ({:o})",
                p.display(),
                mode(&p)
            );
            if meta.is_file() {
                let bytes = std::fs::read(&p).unwrap();
                let text = String::from_utf8_lossy(&bytes);
                assert!(
                    !text.contains(&secrets[0]),
                    "{} holds the ring secret",
                    p.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 10, "only {checked} files looked at");
    let ckpt = walk(&c.nodes[0].dir)
        .into_iter()
        .chain(walk(&c.nodes[1].dir))
        .any(|p| p.to_string_lossy().contains("ckpt"));
    assert!(ckpt, "a checkpoint was among the files");
}

#[test]
fn secrets_reach_their_ranks_and_are_sealed_everywhere_else() {
    const PLAIN: &str = "s3cr3t-for-the-rank-only";
    let root = tempfile::Builder::new()
        .prefix("rl-secrets-")
        .tempdir()
        .unwrap();
    let mut c = common::formed_cluster(root.path(), "s", 2, &[], WAIT);
    // The rank compares an upper-cased copy: the plaintext is in no command line either.
    let upper = PLAIN.to_uppercase();
    // Phase 1: a command job on the follower's API gets its secret in the environment.
    let spec = format!(
        "name = \"sealed\"\nkind = \"command\"\nworkers = 2\n\
         command = [\"sh\", \"-c\", 'test \"$(printf %s \"$MY_TOKEN\" | tr a-z A-Z)\" = \"{upper}\" && echo secret-ok']\n\
         [secrets]\nMY_TOKEN = \"{PLAIN}\"\n"
    );
    let id = c.nodes[1].client().submit(&spec).unwrap();
    let done = common::wait_job(&c, 0, &id, "ended", WAIT, |d| {
        matches!(d.state.as_str(), "succeeded" | "failed")
    });
    assert_eq!(done.state, "succeeded", "{done:#?}");
    assert_eq!(c.job_log_lines(&id, "secret-ok").len(), 2);
    c.stop_all();
    // Phase 2: the plaintext is in no file of either node (Raft log, snapshots, records).
    for node in &c.nodes {
        for p in walk(&node.dir) {
            if std::fs::symlink_metadata(&p).unwrap().is_file() {
                let text = String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned();
                assert!(!text.contains(PLAIN), "{} holds the secret", p.display());
            }
        }
    }

    // Phase 3: an open cluster has nothing to seal with and refuses `[secrets]`.
    let dir = root.path().join("open");
    let (_node, info) = start_raw(&dir, "open", &["--insecure"]);
    let err = ApiClient::new(&info.api_addr, None)
        .submit(&spec)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--insecure"), "{err}");
}
