//! `--run-as-range LOW-HIGH`: each job's ranks on this node run under a uid (and a gid of the
//! same number) of their own, drawn from a range the operator sets aside, as systemd's
//! `DynamicUser` and Nomad's per-task users do.
//!
//! Why: under one shared `--run-as` user every job's ranks are the same uid, and a uid may
//! read the `/proc/PID/environ` of its own processes (their secrets, their checkpoint
//! capability), signal them and write into their work directories. `PR_SET_DUMPABLE=0`
//! cannot close `/proc` for them: `execve` sets a process dumpable again whenever it runs a
//! program that is not set-uid and that the user may read (measured by
//! `tests::exec_makes_a_process_dumpable_again`), so the only fence the kernel keeps between
//! jobs is a uid of their own.
//!
//! What holds ([`JobUsers`]):
//! - a job gets a uid when its first rank starts on this node and keeps it while the job
//!   lives in the replicated state or any of its ranks still runs here (its re-forms and
//!   re-runs find their places owned by the same uid); it is freed when the job has ended
//!   and its last rank here is gone;
//! - two live jobs never hold one uid;
//! - a range every uid of which is held refuses the next job's rank at once
//!   ([`Exhausted`]): the rank fails to start with that reason in the job's events (the
//!   chief's retry tries another member), it does not wait;
//! - the range holds no uid of a user in `/etc/passwd` and not uid 0 ([`UidRange::check`]), so
//!   a rank never runs as a real account.

use std::{collections::BTreeMap, fmt, str::FromStr};

use crate::{domain::state::JobId, security::run_as::RunAs};

/// The most uids one range may hold (as systemd's dynamic range, 61184–65519, holds 4,336).
pub const RANGE_UIDS_MAX: u32 = 65_536;

/// A range of uids, both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidRange {
    /// Its first uid.
    pub low: u32,
    /// Its last uid.
    pub high: u32,
}

/// Why a `--run-as-range` is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RangeError {
    /// Not `LOW-HIGH` with `0 < LOW <= HIGH`.
    #[error("--run-as-range {given:?}: want LOW-HIGH, two uids with 0 < LOW <= HIGH and at most {RANGE_UIDS_MAX} of them (e.g. 60000-60999)")]
    Malformed {
        /// What was given.
        given: String,
    },
    /// A user of the host holds a uid of the range.
    #[error("--run-as-range {low}-{high}: uid {uid} is the user {name:?} in /etc/passwd; give a range no account uses")]
    Taken {
        /// The range's ends.
        low: u32,
        high: u32,
        /// The user's uid and name.
        uid: u32,
        name: String,
    },
}

impl FromStr for UidRange {
    type Err = RangeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let malformed = || RangeError::Malformed { given: s.into() };
        let (low, high) = s.trim().split_once('-').ok_or_else(malformed)?;
        let (low, high): (u32, u32) = (
            low.parse().map_err(|_| malformed())?,
            high.parse().map_err(|_| malformed())?,
        );
        if low == 0 || high < low || high - low >= RANGE_UIDS_MAX {
            return Err(malformed());
        }
        Ok(UidRange { low, high })
    }
}

impl fmt::Display for UidRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.low, self.high)
    }
}

impl UidRange {
    /// Whether `uid` is in the range.
    pub fn contains(&self, uid: u32) -> bool {
        (self.low..=self.high).contains(&uid)
    }

    /// Refuses a range holding the uid of a user in `passwd` (the text of `/etc/passwd`).
    pub fn check(&self, passwd: &str) -> Result<(), RangeError> {
        for line in passwd.lines() {
            let mut fields = line.split(':');
            let (Some(name), _, Some(uid)) = (fields.next(), fields.next(), fields.next()) else {
                continue;
            };
            if let Ok(uid) = uid.parse::<u32>() {
                if self.contains(uid) {
                    return Err(RangeError::Taken {
                        low: self.low,
                        high: self.high,
                        uid,
                        name: name.into(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Every uid of the range is held by a live job.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--run-as-range {range} exhausted: all {held} uids are held by live jobs on this node; the rank is refused here (more uids, or fewer jobs at once, on this node)")]
pub struct Exhausted {
    /// The range.
    pub range: UidRange,
    /// Uids held.
    pub held: usize,
}

/// Which live job holds which uid of the range.
#[derive(Debug)]
pub struct JobUsers {
    range: UidRange,
    /// Each job's uid and how many of its ranks' tasks run here now.
    held: BTreeMap<JobId, (u32, usize)>,
    /// Where the next search for a free uid starts (a freed uid is not given again at once).
    next: u32,
}

impl JobUsers {
    /// No uid held.
    pub fn new(range: UidRange) -> JobUsers {
        JobUsers {
            range,
            held: BTreeMap::new(),
            next: range.low,
        }
    }

    /// The range.
    pub fn range(&self) -> UidRange {
        self.range
    }

    /// The user a starting rank of `job` runs as: the uid the job holds, or a free one of
    /// the range. The rank counts as running until [`JobUsers::ended_run`].
    pub fn assign(&mut self, job: JobId) -> Result<RunAs, Exhausted> {
        if let Some((uid, runs)) = self.held.get_mut(&job) {
            *runs += 1;
            return Ok(user(*uid));
        }
        let size = self.range.high - self.range.low + 1;
        let taken: std::collections::HashSet<u32> = self.held.values().map(|h| h.0).collect();
        for i in 0..size {
            let uid = self.range.low + (self.next - self.range.low + i) % size;
            if !taken.contains(&uid) {
                self.held.insert(job, (uid, 1));
                self.next = if uid == self.range.high {
                    self.range.low
                } else {
                    uid + 1
                };
                return Ok(user(uid));
            }
        }
        Err(Exhausted {
            range: self.range,
            held: self.held.len(),
        })
    }

    /// A rank of `job` that [`JobUsers::assign`] gave a uid has ended (its process group
    /// is gone).
    pub fn ended_run(&mut self, job: JobId) {
        if let Some((_, runs)) = self.held.get_mut(&job) {
            *runs = runs.saturating_sub(1);
        }
    }

    /// Frees the uid of every job with no rank running here that `live` (the job is in the
    /// replicated state and has not ended) says is over.
    pub fn retain(&mut self, live: impl Fn(JobId) -> bool) {
        self.held.retain(|job, (_, runs)| *runs > 0 || live(*job));
    }

    /// The uid `job` holds.
    pub fn of(&self, job: JobId) -> Option<u32> {
        self.held.get(&job).map(|h| h.0)
    }
}

/// The user of a uid of the range: its gid the same number, a name for `USER`.
fn user(uid: u32) -> RunAs {
    RunAs {
        name: format!("ringleader-{uid}"),
        uid,
        gid: uid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_bad_ones_name_the_flag() {
        assert_eq!(
            "60000-60999".parse::<UidRange>(),
            Ok(UidRange {
                low: 60000,
                high: 60999
            })
        );
        for bad in ["", "60000", "0-10", "10-9", "a-b", "1-70000", "-5"] {
            let e = bad.parse::<UidRange>().unwrap_err().to_string();
            assert!(e.starts_with("--run-as-range"), "{bad}: {e}");
        }
        let r: UidRange = "60000-60999".parse().unwrap();
        let passwd = "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n";
        assert_eq!(r.check(passwd), Ok(()));
        let e = r
            .check("svc:x:60500:60500::/:/bin/false\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("uid 60500 is the user \"svc\""), "{e}");
    }

    #[test]
    fn live_jobs_never_share_a_uid_and_an_exhausted_range_refuses_at_once() {
        let id = JobId::from_log_index;
        let mut users = JobUsers::new("60000-60001".parse().unwrap());
        let a = users.assign(id(1)).unwrap();
        let b = users.assign(id(2)).unwrap();
        assert_ne!(a.uid, b.uid);
        assert_eq!((a.uid, a.gid), (60000, 60000));
        assert_eq!(users.assign(id(1)).unwrap(), a, "a job keeps its uid");
        let e = users.assign(id(3)).unwrap_err();
        assert_eq!(e.held, 2);
        assert!(e.to_string().contains("exhausted"), "{e}");
        // Job 1 ended, but a rank of it still runs here: its uid stays held.
        users.retain(|j| j != id(1));
        assert!(users.assign(id(3)).is_err());
        // Its ranks are gone (each assign counted one): the uid is free for job 3, and job
        // 2, live, keeps its own although no rank of it runs.
        users.ended_run(id(1));
        users.ended_run(id(1));
        users.ended_run(id(2));
        users.retain(|j| j != id(1));
        let c = users.assign(id(3)).unwrap();
        assert_eq!(c.uid, a.uid);
        assert_eq!(users.of(id(2)), Some(b.uid));
        assert_eq!(users.of(id(1)), None);
    }

    /// The measurement behind the module's doc: a process that set itself non-dumpable is
    /// dumpable again after `execve` of an ordinary program (the kernel resets the flag),
    /// so `PR_SET_DUMPABLE=0` in a rank's `pre_exec` would not close its `/proc/PID/environ`.
    #[test]
    fn exec_makes_a_process_dumpable_again() {
        use std::os::unix::process::CommandExt as _;
        // The files of a non-dumpable process in /proc belong to root; a dumpable one's to
        // its user. As root, the child runs as nobody's uid so the two differ.
        let uid = match nix::unistd::Uid::effective().as_raw() {
            0 => 65_534,
            me => me,
        };
        let mut cmd = std::process::Command::new("sh");
        if uid == 65_534 {
            cmd.uid(uid).gid(65_534);
        }
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_DUMPABLE, 0);
                Ok(())
            });
        }
        let out = cmd
            .args(["-c", "stat -c %u /proc/$$/environ"])
            .output()
            .unwrap();
        let owner: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert_eq!(
            owner, uid,
            "dumpable again after exec: its /proc/PID/environ is the user's, open to the user's other processes"
        );
    }
}
