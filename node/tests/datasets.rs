//! Datasets shared peer to peer, with real node processes: add, list, get with `--to`
//! (byte-identical), rm; a holder whose copy is corrupt is dropped and the fetch still
//! gives the right bytes, and none of its bytes reach `--to`; a fetch resumes after its node was killed; a full disk is a clear
//! error with nothing half-written visible; bad input is refused with clear errors.

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use common::{exe, fails, formed_cluster, ok, POLL};
use ringleader::cli::local::LocalCluster;

const FORM_WAIT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(60);
const MIB: usize = 1 << 20;

/// Starts nodes of their own names and arguments (the first alone, the others joining it)
/// and waits until they are formed (`common::wait_formed`).
fn cluster_of(root: &Path, nodes: &[(&str, &[&str])]) -> LocalCluster {
    let mut c = LocalCluster::new(exe(), root);
    for (i, (name, args)) in nodes.iter().enumerate() {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        if i == 0 {
            c.start(name, &args).unwrap();
        } else {
            c.start_joining(name, &args).unwrap();
        }
    }
    common::wait_formed(&c, nodes.len(), FORM_WAIT);
    c
}

/// Runs the CLI against node `i`.
fn cli(c: &LocalCluster, i: usize, args: &[&str]) -> Output {
    c.cli(i).args(args).output().expect("running the CLI")
}

/// Pseudo-random bytes (xorshift), different for each seed.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A dataset directory: one file of `mib` MiB plus a few small ones and an empty one.
/// The files [`make_tree`] writes, relative to its root.
const TREE_FILES: [&str; 4] = ["big.bin", "nested/a.txt", "nested/deeper/b.txt", "empty"];

fn make_tree(dir: &Path, mib: usize, seed: u64) -> PathBuf {
    let src = dir.join(format!("src-{seed}"));
    std::fs::create_dir_all(src.join("nested/deeper")).unwrap();
    std::fs::write(src.join("big.bin"), noise(mib * MIB + 12_345, seed)).unwrap();
    std::fs::write(src.join("nested/a.txt"), b"first\n").unwrap();
    std::fs::write(src.join("nested/deeper/b.txt"), noise(5_000, seed + 1)).unwrap();
    std::fs::write(src.join("empty"), b"").unwrap();
    src
}

fn same_tree(a: &Path, b: &Path) {
    for rel in TREE_FILES {
        assert_eq!(
            std::fs::read(a.join(rel)).unwrap(),
            std::fs::read(b.join(rel)).unwrap(),
            "{rel} differs"
        );
    }
}

fn ls(c: &LocalCluster, i: usize) -> Vec<serde_json::Value> {
    let out = ok(cli(c, i, &["--json", "dataset", "ls"]));
    serde_json::from_str(&out).unwrap()
}

/// Polls node `i`'s `dataset ls` until it lists `n` datasets (a follower applies the
/// chief's log a moment after the add returns), or the deadline passes; returns the last list.
fn ls_count(c: &LocalCluster, i: usize, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let rows = ls(c, i);
        if rows.len() == n || Instant::now() > deadline {
            return rows;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls node `i`'s `dataset ls` until dataset `name`'s holders are `holders`.
fn wait_holders(c: &LocalCluster, i: usize, name: &str, holders: &[&str]) {
    let got = || -> Vec<String> {
        let rows = ls(c, i);
        let row = rows.iter().find(|r| r["name"] == name);
        row.and_then(|r| r["holders"].as_array())
            .map(|a| a.iter().map(|h| h.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default()
    };
    common::poll_until(WAIT, got, |got| got == holders)
        .unwrap_or_else(|got| panic!("holders of {name}: want {holders:?}, last {got:?}"));
}

/// Node `i`'s latest fetch of `name`, from the API.
fn fetch_status(c: &LocalCluster, i: usize, name: &str) -> Option<serde_json::Value> {
    c.nodes[i]
        .client()
        .get::<serde_json::Value>(&format!("/v1/datasets/{name}/get"))
        .ok()
}

#[test]
fn add_list_get_to_and_remove_with_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = formed_cluster(&dir.path().join("c"), "d", 3, &[], FORM_WAIT);
    let src = make_tree(dir.path(), 9, 1);

    let added = ok(cli(
        &c,
        0,
        &["dataset", "add", "shared-1", src.to_str().unwrap()],
    ));
    assert!(added.contains("added shared-1"), "{added}");
    let rows = ls_count(&c, 2, 1);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["files"], 4);
    assert_eq!(rows[0]["size_bytes"], (9 * MIB + 12_345 + 6 + 5_000) as u64);
    // 10 of big.bin in the 1 MiB chunks of a small dataset, 1 each for a.txt and b.txt.
    assert_eq!(rows[0]["chunks"], 12);
    assert_eq!(rows[0]["root"].as_str().unwrap().len(), 64);
    wait_holders(&c, 2, "shared-1", &["d0"]);

    // get --to on two other nodes: byte-identical files at their relative paths.
    for i in [1, 2] {
        let to = dir.path().join(format!("out-{i}"));
        let text = ok(cli(
            &c,
            i,
            &["dataset", "get", "shared-1", "--to", to.to_str().unwrap()],
        ));
        assert!(text.contains("fetched shared-1"), "{text}");
        same_tree(&src, &to);
    }
    wait_holders(&c, 0, "shared-1", &["d0", "d1", "d2"]);
    let last = fetch_status(&c, 2, "shared-1").unwrap();
    assert_eq!(last["state"], "done");
    assert_eq!(last["bytes"], rows[0]["size_bytes"]);
    // A dead member is no holder; restarted, it holds its copy again.
    c.kill9(2).unwrap();
    wait_holders(&c, 0, "shared-1", &["d0", "d1"]);
    c.restart(2).unwrap();
    wait_holders(&c, 0, "shared-1", &["d0", "d1", "d2"]);
    // A second get is a no-op on a node that holds it.
    let again = ok(cli(&c, 1, &["dataset", "get", "shared-1"]));
    assert!(again.contains("is on the node"), "{again}");

    // Bad input: a name that exists, a path that does not, a bad name, an unknown dataset,
    // a train job naming a dataset nobody added, --to over other content.
    let err = fails(cli(
        &c,
        1,
        &["dataset", "add", "shared-1", src.to_str().unwrap()],
    ));
    assert!(err.contains("exists"), "{err}");
    let err = fails(cli(&c, 0, &["dataset", "add", "other", "/no/such/path"]));
    assert!(err.contains("/no/such/path"), "{err}");
    let err = fails(cli(
        &c,
        0,
        &["dataset", "add", "a/b", src.to_str().unwrap()],
    ));
    assert!(err.contains("dataset name"), "{err}");
    let err = fails(cli(
        &c,
        0,
        &["dataset", "add", "digits", src.to_str().unwrap()],
    ));
    assert!(err.contains("built-in"), "{err}");
    let err = fails(cli(&c, 0, &["dataset", "get", "nope"]));
    assert!(err.contains("no dataset \"nope\""), "{err}");
    let spec = dir.path().join("job.toml");
    std::fs::write(
        &spec,
        "name = \"x\"\nkind = \"train\"\n[data]\ndataset = \"nope\"\n[model]\narch = \"mlp\"\n",
    )
    .unwrap();
    let err = fails(cli(&c, 0, &["submit", spec.to_str().unwrap()]));
    assert!(
        err.contains("data.dataset: no dataset \"nope\" in the cluster"),
        "{err}"
    );
    let clash = dir.path().join("clash");
    std::fs::create_dir_all(clash.join("nested")).unwrap();
    std::fs::write(clash.join("nested/a.txt"), b"mine").unwrap();
    let err = fails(cli(
        &c,
        2,
        &[
            "dataset",
            "get",
            "shared-1",
            "--to",
            clash.to_str().unwrap(),
        ],
    ));
    assert!(err.contains("exists with other content"), "{err}");
    assert_eq!(
        std::fs::read(clash.join("nested/a.txt")).unwrap(),
        b"mine",
        "nothing overwritten"
    );

    // rm: the name goes, and every holder deletes the content.
    ok(cli(&c, 2, &["dataset", "rm", "shared-1"]));
    assert!(ls(&c, 0).is_empty());
    let root = rows[0]["root"].as_str().unwrap();
    let deadline = Instant::now() + WAIT;
    while c
        .nodes
        .iter()
        .any(|n| n.dir.join("datasets").join(root).exists())
    {
        assert!(Instant::now() < deadline, "copies not deleted after rm");
        std::thread::sleep(POLL);
    }
    let err = fails(cli(&c, 0, &["dataset", "rm", "shared-1"]));
    assert!(err.contains("no dataset"), "{err}");
}

#[test]
fn a_holder_with_a_corrupt_copy_is_dropped_and_the_bytes_come_right() {
    let dir = tempfile::tempdir().unwrap();
    // k0 serves at 10 MB/s, so k1 (unlimited) is surely asked for chunks before k0 could
    // have sent them all, however the fetch's tasks are scheduled.
    let c = cluster_of(
        &dir.path().join("c"),
        &[
            ("k0", &["--dataset-upload-mbps", "10"]),
            ("k1", &[]),
            ("k2", &[]),
        ],
    );
    let src = make_tree(dir.path(), 20, 2);
    ok(cli(
        &c,
        0,
        &["dataset", "add", "lies", src.to_str().unwrap()],
    ));
    ok(cli(&c, 1, &["dataset", "get", "lies"]));
    wait_holders(&c, 2, "lies", &["k0", "k1"]);

    // k1's copy rots: one byte flipped in every (1 MiB) chunk of every file, so whichever
    // chunks the fetch asks of k1 (the first window may hold only the small files) are bad.
    let root = ls(&c, 0)[0]["root"].as_str().unwrap().to_owned();
    let files = c.nodes[1].dir.join("datasets").join(&root).join("files");
    for rel in TREE_FILES {
        let path = files.join(rel);
        let mut bytes = std::fs::read(&path).unwrap();
        for chunk in 0..bytes.len().div_ceil(MIB) {
            let at = (chunk * MIB + 7).min(bytes.len() - 1);
            bytes[at] ^= 0xff;
        }
        std::fs::write(&path, &bytes).unwrap();
    }

    let to = dir.path().join("out");
    let out = ok(cli(
        &c,
        2,
        &[
            "--json",
            "dataset",
            "get",
            "lies",
            "--to",
            to.to_str().unwrap(),
        ],
    ));
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    same_tree(&src, &to);
    let sources = status["sources"].as_array().unwrap();
    let k1 = sources
        .iter()
        .find(|s| s["name"] == "k1")
        .expect("k1 was asked");
    assert!(
        k1["state"].as_str().unwrap().starts_with("dropped"),
        "k1 sent corrupt chunks but was not dropped: {status:#}"
    );
    assert_eq!(k1["bytes"], 0, "no byte of k1's is good: {status:#}");
    let k0 = sources.iter().find(|s| s["name"] == "k0").unwrap();
    assert_eq!(k0["bytes"], status["bytes"], "every byte came from k0");
}

/// The names in `dir` (one level), sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `get --to` writes chunks into place as they arrive, and only verified ones: with a
/// corrupt holder the only one left, the fetch fails and DIR holds no file at all (no
/// final path, no temporary); the verified chunks stay in the store's `.part`, and once a
/// good holder is back the same `get --to` resumes from them and gives identical files.
#[test]
fn get_to_writes_only_verified_chunks_and_shows_files_only_when_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = formed_cluster(&dir.path().join("c"), "v", 3, &[], FORM_WAIT);
    let src = make_tree(dir.path(), 6, 7);
    ok(cli(
        &c,
        1,
        &["dataset", "add", "rot", src.to_str().unwrap()],
    ));
    wait_holders(&c, 2, "rot", &["v1"]);
    ok(cli(&c, 2, &["dataset", "get", "rot"]));
    wait_holders(&c, 0, "rot", &["v1", "v2"]);

    // v2's copy rots in big.bin's last chunk (1 MiB chunks), and v1, the good holder, dies.
    let root = ls(&c, 0)[0]["root"].as_str().unwrap().to_owned();
    let big = c.nodes[2]
        .dir
        .join("datasets")
        .join(&root)
        .join("files/big.bin");
    let mut bytes = std::fs::read(&big).unwrap();
    bytes[6 * MIB + 7] ^= 0xff;
    std::fs::write(&big, &bytes).unwrap();
    c.kill9(1).unwrap();
    wait_holders(&c, 0, "rot", &["v2"]);

    let to = dir.path().join("out");
    let err = fails(cli(
        &c,
        0,
        &["dataset", "get", "rot", "--to", to.to_str().unwrap()],
    ));
    assert!(err.contains("no usable holder left"), "{err}");
    assert!(err.contains("v2"), "the corrupt holder is named: {err}");
    // No file under --to after a failed fetch, not even a temporary.
    assert_eq!(entries(&to), ["nested"]);
    assert_eq!(entries(&to.join("nested")), ["deeper"]);
    assert!(entries(&to.join("nested/deeper")).is_empty());

    c.restart(1).unwrap();
    wait_holders(&c, 0, "rot", &["v1", "v2"]);
    let out = ok(cli(
        &c,
        0,
        &[
            "--json",
            "dataset",
            "get",
            "rot",
            "--to",
            to.to_str().unwrap(),
        ],
    ));
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    same_tree(&src, &to);
    assert_eq!(entries(&to), ["big.bin", "empty", "nested"]);
    assert_eq!(entries(&to.join("nested")), ["a.txt", "deeper"]);
    assert_eq!(entries(&to.join("nested/deeper")), ["b.txt"]);
    assert!(
        status["resumed_chunks"].as_u64().unwrap() >= 1,
        "the verified chunks of the failed fetch were kept: {status:#}"
    );
    same_tree(
        &src,
        &c.nodes[0].dir.join("datasets").join(&root).join("files"),
    );
}

#[test]
fn an_interrupted_fetch_resumes_from_its_verified_chunks() {
    let dir = tempfile::tempdir().unwrap();
    // The holder serves at 4 MB/s, so the fetch takes about 5 s and can be cut.
    let mut c = cluster_of(
        &dir.path().join("c"),
        &[("r0", &["--dataset-upload-mbps", "4"]), ("r1", &[])],
    );
    let src = make_tree(dir.path(), 20, 3);
    ok(cli(
        &c,
        0,
        &["dataset", "add", "slow", src.to_str().unwrap()],
    ));
    let root = ls(&c, 0)[0]["root"].as_str().unwrap().to_owned();
    let total_chunks = ls(&c, 0)[0]["chunks"].as_u64().unwrap();
    c.nodes[1]
        .client()
        .post_json::<serde_json::Value>("/v1/datasets/slow/get", &serde_json::json!({}))
        .unwrap();
    let store = c.nodes[1].dir.join("datasets");
    let deadline = Instant::now() + WAIT;
    loop {
        let s = fetch_status(&c, 1, "slow").unwrap();
        assert_eq!(
            s["state"], "fetching",
            "finished before it could be cut: {s:#}"
        );
        // Nothing is visible as whole while the fetch runs.
        assert!(!store.join(&root).exists());
        if s["chunks_done"].as_u64().unwrap() >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "no progress: {s:#}");
        std::thread::sleep(Duration::from_millis(20));
    }
    c.kill9(1).unwrap();
    assert!(store.join(format!("{root}.part")).exists());
    assert!(!store.join(&root).exists());

    c.restart(1).unwrap();
    let out = ok(cli(&c, 1, &["--json", "dataset", "get", "slow"]));
    let s: serde_json::Value = serde_json::from_str(&out).unwrap();
    let resumed = s["resumed_chunks"].as_u64().unwrap();
    assert!(resumed >= 2, "resumed {resumed} chunks: {s:#}");
    assert_eq!(s["chunks_done"].as_u64().unwrap(), total_chunks);
    assert!(s["bytes"].as_u64().unwrap() < s["size_bytes"].as_u64().unwrap());
    same_tree(&src, &store.join(&root).join("files"));
    assert!(!store.join(format!("{root}.part")).exists());
}

/// Whether this process may mount a tmpfs (root, with mount available).
fn can_mount() -> bool {
    nix_is_root()
        && Command::new("mount")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Unmounts a tmpfs when dropped.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_is_a_clear_error_and_nothing_half_written_is_visible() {
    if !can_mount() {
        println!("SKIPPED: needs root and mount (a small tmpfs fills up)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root_dir = dir.path().join("c");
    // f1's dataset store is a 6 MiB filesystem; the dataset is 12 MiB.
    let store = root_dir.join("f1/datasets");
    std::fs::create_dir_all(&store).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=6m", "tmpfs"])
        .arg(&store)
        .status()
        .unwrap();
    if !mounted.success() {
        println!("SKIPPED: mounting a tmpfs failed (no privileges in this container)");
        return;
    }
    let _mount = Mount(store.clone());
    let c = cluster_of(&root_dir, &[("f0", &[]), ("f1", &[])]);
    let src = make_tree(dir.path(), 12, 4);
    ok(cli(
        &c,
        0,
        &["dataset", "add", "big", src.to_str().unwrap()],
    ));
    let to = dir.path().join("out");
    let err = fails(cli(
        &c,
        1,
        &["dataset", "get", "big", "--to", to.to_str().unwrap()],
    ));
    assert!(err.contains("disk full"), "{err}");
    let root = ls(&c, 0)[0]["root"].as_str().unwrap().to_owned();
    assert!(
        !store.join(&root).exists(),
        "no whole copy after a failed fetch"
    );
    assert!(!to.join("big.bin").exists(), "nothing written to --to");
    // The node is still fine: it answers and lists the dataset.
    assert_eq!(ls(&c, 1).len(), 1);
}

#[test]
fn a_train_job_fetches_its_shared_dataset_to_nodes_that_lack_it() {
    let dir = tempfile::tempdir().unwrap();
    // t0 adds the dataset and offers 1 cpu; the job's workers take 2 each, so they run on
    // t1 and t2, which hold nothing and fetch it first.
    let c = cluster_of(
        &dir.path().join("c"),
        &[
            ("t0", &["--cpus", "1"]),
            ("t1", &["--cpus", "2"]),
            ("t2", &["--cpus", "2"]),
        ],
    );
    let data = dir.path().join("digits-st");
    trainer::export_digits(&data).unwrap();
    ok(cli(
        &c,
        0,
        &["dataset", "add", "digits-st", data.to_str().unwrap()],
    ));
    let spec = dir.path().join("job.toml");
    std::fs::write(
        &spec,
        r#"name = "shared-digits"
kind = "train"
workers = 2
[resources]
cpus_per_worker = 2
[model]
arch = "mlp"
hidden = [64]
[data]
dataset = "digits-st"
[train]
epochs = 6
batch_per_worker = 32
lr = 0.1
seed = 3
"#,
    )
    .unwrap();
    let id = ok(cli(&c, 0, &["submit", spec.to_str().unwrap()]))
        .trim()
        .to_owned();
    let doc = common::wait_job(&c, 0, &id, "succeeded", Duration::from_secs(180), |d| {
        matches!(d.state.as_str(), "succeeded" | "failed")
    });
    assert_eq!(doc.state, "succeeded", "{doc:#?}");
    assert!(
        !doc.ring.iter().any(|m| m == "t0"),
        "the ring was meant for t1 and t2: {:?}",
        doc.ring
    );
    let accuracy = doc.metrics["val_accuracy"];
    assert!(accuracy > 0.85, "val_accuracy {accuracy}");
    let fetched: Vec<_> = doc
        .events
        .iter()
        .filter(|e| e["what"] == "note" && e.to_string().contains("fetched"))
        .collect();
    assert_eq!(
        fetched.len(),
        2,
        "one fetch note per rank: {:#?}",
        doc.events
    );
    wait_holders(&c, 0, "digits-st", &["t0", "t1", "t2"]);
}

#[test]
fn a_peer_without_the_cluster_key_gets_nothing() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("swarm.key");
    let out = Command::new(exe())
        .arg("keygen")
        .arg(&key)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key_arg = key.to_str().unwrap();
    let c = cluster_of(
        &dir.path().join("c"),
        &[
            ("p0", &["--cluster-key", key_arg]),
            ("p1", &["--cluster-key", key_arg]),
        ],
    );
    let src = make_tree(dir.path(), 1, 5);
    ok(cli(
        &c,
        0,
        &["dataset", "add", "private", src.to_str().unwrap()],
    ));
    // A member with the key fetches it.
    ok(cli(&c, 1, &["dataset", "get", "private"]));
    let status = c.nodes[0].client().status().unwrap();
    let me = status.members.iter().find(|m| m.name == "p0").unwrap();
    let root = ls(&c, 0)[0]["root"].as_str().unwrap().to_owned();

    // An outsider speaks the protocol without the key: the node answers the hello (its
    // nonce and proof), refuses the made-up proof, and sends nothing more.
    let mut s = std::net::TcpStream::connect(&me.datasets_addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = ringleader::datasets::transport::MAGIC.to_vec();
    hello.extend_from_slice(&[9u8; 32]);
    s.write_all(&hello).unwrap();
    let mut answer = [0u8; 64];
    s.read_exact(&mut answer).unwrap();
    s.write_all(&[0u8; 32]).unwrap();
    let request = format!("{{\"Manifest\":{{\"root\":\"{root}\"}}}}");
    let _ = s.write_all(&(request.len() as u32).to_le_bytes());
    let _ = s.write_all(request.as_bytes());
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "an outsider got {} bytes", rest.len());
}
