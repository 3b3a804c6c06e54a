//! A full disk under the chief: each of 3 nodes keeps its data directory on a small tmpfs, and
//! the chief's fills up while jobs are submitted. The chief's Raft log write fails: it stops
//! with a clear reason (status `control_fault`, writes refused with it), the other two elect a
//! chief and go on; once space returns the node restarts Raft on its files and catches up, and
//! after a kill -9 it starts again from the same files (the log was never corrupted). No
//! acknowledged job is lost. Needs root to mount tmpfs; otherwise SKIPPED.

mod common;

use std::{
    collections::BTreeSet,
    io::Write,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use common::{formed_cluster, wait_formed, POLL};
use ringleader::cli::local::LocalCluster;

const NODES: usize = 3;
const WAIT: Duration = Duration::from_secs(60);
/// Each node's filesystem.
const TMPFS_SIZE: &str = "24m";

/// tmpfs mounts, unmounted (lazily) when dropped.
struct Mounts(Vec<PathBuf>);

impl Mounts {
    /// Mounts a tmpfs at `root/{prefix}{i}` for each node, or `None` where this host does not
    /// allow it (not root, no mount).
    fn try_new(root: &Path, prefix: &str) -> Option<Mounts> {
        let mut m = Mounts(Vec::new());
        for i in 0..NODES {
            let dir = root.join(format!("{prefix}{i}"));
            std::fs::create_dir_all(&dir).ok()?;
            let ok = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={TMPFS_SIZE}"), "tmpfs"])
                .arg(&dir)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                return None;
            }
            m.0.push(dir);
        }
        Some(m)
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A failed test keeps the node logs (the filesystems go away).
            let keep = std::env::temp_dir().join(format!("rl-full-disk-{}", std::process::id()));
            let _ = std::fs::create_dir_all(&keep);
            for dir in &self.0 {
                let name = dir.file_name().unwrap().to_string_lossy().to_string();
                let _ = std::fs::copy(dir.join("node.log"), keep.join(format!("{name}.log")));
            }
            eprintln!("the node logs are kept in {}", keep.display());
        }
        for dir in &self.0 {
            let _ = Command::new("umount").arg("-l").arg(dir).status();
        }
    }
}

/// Fills the filesystem of `dir` with `dir/filler` until a write fails.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let block = vec![0xAAu8; 64 * 1024];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
    path
}

fn submit_quick(c: &LocalCluster, i: usize, n: usize) -> anyhow::Result<String> {
    c.nodes[i].client().submit(&format!(
        "name = \"quick-{n}\"\nkind = \"command\"\ncommand = [\"true\"]\nmax_restarts = 3\n"
    ))
}

fn job_ids(c: &LocalCluster, i: usize) -> BTreeSet<String> {
    c.nodes[i]
        .client()
        .status()
        .map(|s| s.jobs.into_iter().map(|j| j.id).collect())
        .unwrap_or_default()
}

fn wait_until(what: &str, wait: Duration, mut cond: impl FnMut() -> Option<String>) {
    let deadline = Instant::now() + wait;
    loop {
        let Some(why_not) = cond() else { return };
        assert!(
            Instant::now() < deadline,
            "{what}: not within {wait:?}: {why_not}"
        );
        std::thread::sleep(POLL);
    }
}

#[test]
fn a_full_disk_stops_the_chiefs_raft_and_it_recovers_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let Some(_mounts) = Mounts::try_new(dir.path(), "fd") else {
        println!("SKIPPED: needs root to mount a tmpfs");
        return;
    };
    let mut c = formed_cluster(dir.path(), "fd", NODES, &[], WAIT);
    let chief_name = c.status(0).unwrap().chief.unwrap().name;
    let full = c.nodes.iter().position(|n| n.name == chief_name).unwrap();
    let other = (full + 1) % NODES;
    let mut acked = Vec::new();
    for n in 0..3 {
        acked.push(submit_quick(&c, other, n).unwrap());
    }

    // The chief's disk fills up; submissions go on through another node.
    let filler = fill(&c.nodes[full].dir);
    let mut n = 3;
    wait_until("the full node's Raft stops", WAIT, || {
        if let Ok(id) = submit_quick(&c, other, n) {
            acked.push(id);
        }
        n += 1;
        let s = match c.status(full) {
            Ok(s) => s,
            Err(e) => return Some(e.to_string()),
        };
        match s.control_fault {
            Some(f) => {
                assert!(f.contains("No space left on device"), "unclear reason: {f}");
                None
            }
            None => Some(format!(
                "no control_fault yet; chief {:?}, term {:?}",
                s.chief, s.term
            )),
        }
    });
    let refused = submit_quick(&c, full, n).unwrap_err().to_string();
    assert!(
        refused.contains("control plane is stopped") && refused.contains("No space left"),
        "{refused}"
    );
    let text = ureq::get(format!("http://{}/metrics", c.nodes[full].info.api_addr))
        .header(
            "authorization",
            &format!(
                "Bearer {}",
                c.nodes[full].token.as_deref().unwrap_or_default()
            ),
        )
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    assert!(text.contains("\nringleader_control_stopped 1\n"), "{text}");
    // The others elect a chief and take writes.
    wait_until("a chief on the other side", WAIT, || {
        let s = match c.status(other) {
            Ok(s) => s,
            Err(e) => return Some(e.to_string()),
        };
        match s.chief {
            Some(ch) if ch.name != chief_name => None,
            ch => Some(format!("chief {ch:?}")),
        }
    });
    for _ in 0..3 {
        acked.push(submit_quick(&c, other, n).unwrap());
        n += 1;
    }

    // Space returns: Raft restarts on its files and catches up.
    std::fs::remove_file(&filler).unwrap();
    let want: BTreeSet<String> = acked.iter().cloned().collect();
    wait_until("the full node recovers and catches up", WAIT, || {
        let s = match c.status(full) {
            Ok(s) => s,
            Err(e) => return Some(e.to_string()),
        };
        if let Some(f) = s.control_fault {
            return Some(format!("still stopped: {f}"));
        }
        let have = job_ids(&c, full);
        let missing: Vec<_> = want.difference(&have).collect();
        (!missing.is_empty()).then(|| format!("missing {missing:?}"))
    });
    let id = submit_quick(&c, full, n).unwrap();
    acked.push(id);

    // Its files open again after a kill -9: the log was never corrupted.
    c.kill9(full).unwrap();
    // It comes back on new ports: it joins through another node (the first node had no seed).
    c.nodes[full].args = vec!["--join".into(), c.seed_of(other)];
    c.restart(full).unwrap();
    wait_formed(&c, NODES, WAIT);
    let want: BTreeSet<String> = acked.iter().cloned().collect();
    wait_until("every acknowledged job on every node", WAIT, || {
        for i in 0..NODES {
            let have = job_ids(&c, i);
            let missing: Vec<_> = want.difference(&have).collect();
            if !missing.is_empty() {
                return Some(format!("{} misses {missing:?}", c.nodes[i].name));
            }
        }
        None
    });
    for id in &acked {
        common::wait_job(&c, full, id, "ended", WAIT, |d| {
            matches!(d.state.as_str(), "succeeded" | "failed")
        });
    }
    c.stop_all();
}
