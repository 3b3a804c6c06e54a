//! The process groups of this node's running ranks, recorded on disk, so that a node killed
//! with SIGKILL (no drop guard runs then) kills what its ranks left behind when it starts
//! again. Each rank's group leader also gets `PR_SET_PDEATHSIG`, so it dies with the node at
//! once; its own children (a command job's shell's children) are killed here at the next
//! start.
//!
//! A record is `PGID STARTTIME` (the leader's start time in clock ticks since boot, from
//! `/proc/PGID/stat`): a group is killed only if a process of that id with that start time
//! still leads it, never a later process that reused the id.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use tracing::{info, warn};

/// The file under the jobs directory.
pub const FILE: &str = "running-groups";

/// The recorded groups of this node's running ranks.
#[derive(Debug)]
pub struct Groups {
    path: PathBuf,
    live: Mutex<BTreeMap<i32, u64>>,
}

/// Removes a group's record when dropped (its rank ended).
pub struct Recorded {
    groups: std::sync::Arc<Groups>,
    pgid: i32,
}

impl Drop for Recorded {
    fn drop(&mut self) {
        let mut live = self.groups.live.lock().expect("groups lock");
        live.remove(&self.pgid);
        self.groups.write(&live);
    }
}

/// The start time of process `pid` (field 22 of `/proc/PID/stat`), if it runs.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

impl Groups {
    /// Opens the record under `jobs_dir`, first killing every group a previous run of this
    /// node left recorded (and still running, by the same leader).
    pub fn open(jobs_dir: &std::path::Path) -> Groups {
        let path = jobs_dir.join(FILE);
        if let Ok(text) = std::fs::read_to_string(&path) {
            for line in text.lines() {
                let mut parts = line.split_whitespace();
                let (Some(Ok(pgid)), Some(Ok(started))) = (
                    parts.next().map(str::parse::<i32>),
                    parts.next().map(str::parse::<u64>),
                ) else {
                    continue;
                };
                if pgid > 1 && start_time(pgid) == Some(started) {
                    info!(
                        pgid,
                        "killing a rank's process group left by this node's previous run"
                    );
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pgid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        let groups = Groups {
            path,
            live: Mutex::new(BTreeMap::new()),
        };
        groups.write(&BTreeMap::new());
        groups
    }

    /// Records the group `pgid` (its leader just started) until the returned guard drops.
    pub fn record(self: &std::sync::Arc<Self>, pgid: i32) -> Recorded {
        let mut live = self.live.lock().expect("groups lock");
        if let Some(t) = start_time(pgid) {
            live.insert(pgid, t);
            self.write(&live);
        }
        Recorded {
            groups: self.clone(),
            pgid,
        }
    }

    fn write(&self, live: &BTreeMap<i32, u64>) {
        let text: String = live.iter().map(|(g, t)| format!("{g} {t}\n")).collect();
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = self.path.with_extension("tmp");
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = written {
            warn!(path = %self.path.display(), "recording ranks' process groups: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_left_recorded_is_killed_at_the_next_start_and_a_reused_id_is_not() {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id() as i32;
        let started = start_time(pgid).unwrap();
        // A stale record (another start time) is left alone; the real one is killed.
        std::fs::write(
            dir.path().join(FILE),
            format!("{pgid} {}\n{pgid} {started}\n", started + 1),
        )
        .unwrap();
        let _groups = Groups::open(dir.path());
        let status = child.wait().unwrap();
        assert!(!status.success(), "the left-over group was killed");
        assert_eq!(std::fs::read_to_string(dir.path().join(FILE)).unwrap(), "");
    }

    #[test]
    fn records_follow_the_ranks() {
        let dir = tempfile::tempdir().unwrap();
        let groups = std::sync::Arc::new(Groups::open(dir.path()));
        let me = std::process::id() as i32;
        {
            let _r = groups.record(me);
            let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
            assert!(text.starts_with(&format!("{me} ")), "{text}");
        }
        assert_eq!(std::fs::read_to_string(dir.path().join(FILE)).unwrap(), "");
    }
}
