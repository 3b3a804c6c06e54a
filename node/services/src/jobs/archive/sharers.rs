//! Which members share this node's store, and which of them writes an ended job's documents.
//!
//! With a store of its own (the default `file://<data-dir>/store`) a node writes every ended
//! job's record itself: its API answers for compacted jobs from there. A shared store (one
//! bucket, a shared file system) needs one copy, not one per node: 128 nodes on S3 made 128
//! PUTs of the same object for every job that ended. So each node leaves a marker
//! `members/<peer-id>` in its store, rewritten each time it lists `members/` (every
//! [`RESCAN_MS`], and soon after the cluster grows); another member's marker in its own
//! store, fresh ([`MARKER_STALE_MS`]), means that member shares it. Of
//! the members alive (or suspected, not yet dead) that share a store, the one that ranks
//! highest for the job (rendezvous hashing of peer id and job id) writes its documents: the
//! writes spread over the sharers, and a dead writer's jobs pass to the next in rank, each
//! checked in the store first (a copy of the right length is not written again).
//!
//! Views may differ for a while (a marker not yet listed, a death not yet detected): then two
//! nodes may both write a job (the same bytes), and a job whose writer died is written once
//! its death is known. A node never skips a job unless a sharer it believes alive ranks
//! above it, and the highest-ranked sharer alive always writes. A member that moved to
//! another store still counts as a sharer of the old one until its marker there is stale:
//! its jobs are written by the others then, minutes late, not lost.

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

use opendal::Operator;

use crate::domain::state::JobId;

/// Where the markers are, in the store.
pub const MARKERS_DIR: &str = "members/";

/// How often the markers are listed, in milliseconds, while the members stay: a sharer
/// that restarted is known within this (until then both may write the jobs it would write).
pub const RESCAN_MS: u64 = 60_000;

/// Age after which a marker no longer counts, in milliseconds: its member rewrites it at
/// every listing (at least every [`RESCAN_MS`]), so one older than this is a member's that
/// writes elsewhere now. This host's clock and the store's may differ by up to this less
/// [`RESCAN_MS`] (4 minutes).
pub const MARKER_STALE_MS: u64 = 5 * RESCAN_MS;

/// How soon the markers are listed again once the cluster has more members than at the
/// last listing (hosts joining), in milliseconds.
pub const RESCAN_SOON_MS: u64 = 3_000;

/// How often the members alive are looked up again while the store is shared, in
/// milliseconds: a dead writer's jobs pass on within this after its death is known.
pub const ALIVE_REFRESH_MS: u64 = 2_000;

/// This node and the members whose markers are in its store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sharers {
    me: u64,
    /// Other members' keys, by peer id text.
    others: Vec<(String, u64)>,
}

/// A peer id's (or any text's) key: the first 8 bytes of its blake3 hash.
pub fn key(text: &str) -> u64 {
    let hash = blake3::hash(text.as_bytes());
    u64::from_le_bytes(hash.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// splitmix64's finalizer: the rank of a (member, job) pair from their keys.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Sharers {
    /// `me` (a peer id's text) sharing its store with the members named in `markers` (other
    /// names, and `me`'s own, are left out).
    pub fn new(me: &str, markers: impl IntoIterator<Item = String>) -> Sharers {
        let mut others: Vec<(String, u64)> = markers
            .into_iter()
            .filter(|m| m != me)
            .map(|m| {
                let k = key(&m);
                (m, k)
            })
            .collect();
        others.sort();
        others.dedup();
        Sharers {
            me: key(me),
            others,
        }
    }

    /// How many other members' markers are in this node's store.
    pub fn others(&self) -> usize {
        self.others.len()
    }

    /// Whether another member's marker is in this node's store.
    pub fn shared(&self) -> bool {
        !self.others.is_empty()
    }

    /// The sharers among `alive` (peer id texts): what [`Sharers::writes`] decides by.
    pub fn alive(&self, alive: &BTreeSet<String>) -> Vec<u64> {
        self.others
            .iter()
            .filter(|(m, _)| alive.contains(m))
            .map(|(_, k)| *k)
            .collect()
    }

    /// Whether this node writes `job`'s documents, `alive` the keys of the sharers alive
    /// ([`Sharers::alive`]): no sharer alive ranks above it (a tie: both write).
    pub fn writes(&self, job: JobId, alive: &[u64]) -> bool {
        let j = key(&job.to_string());
        let mine = mix(self.me ^ j);
        alive.iter().all(|&o| mix(o ^ j) <= mine)
    }
}

/// When to list the markers next: at once if never, [`RESCAN_SOON_MS`] after the last
/// listing if the Raft membership has grown since (`members` now, against then), else
/// [`RESCAN_MS`] after it.
pub fn rescan_at(scanned: Option<(Instant, usize)>, members: usize, now: Instant) -> Instant {
    match scanned {
        None => now,
        Some((at, then)) if members > then => at + Duration::from_millis(RESCAN_SOON_MS),
        Some((at, _)) => at + Duration::from_millis(RESCAN_MS),
    }
}

/// One marker write at a time in this process. A node's writers of ended jobs' documents
/// (job records, search summaries) each mark the same store, at the same moments (both list
/// at start and every [`RESCAN_MS`]); a file store writes a marker in place (truncate, write,
/// sync, stat), so the other's truncation between a write and its stat failed the write
/// with "writer got too much data" (logged as `search summarys: this node's marker not
/// written`, on a lone node most often: one whose cluster key no peer shares).
static MARKING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Leaves (or refreshes) this node's marker in the store.
pub async fn mark(op: &Operator, me: &str) -> opendal::Result<()> {
    let _one = MARKING.lock().await;
    op.write(&format!("{MARKERS_DIR}{me}"), me.as_bytes().to_vec())
        .await
        .map(|_| ())
}

/// The members whose markers in the store are fresh at `now` (their peer ids' texts): a
/// marker not rewritten for [`MARKER_STALE_MS`] is a member's that no longer writes there
/// (it moved to another store, or is gone). A store that lists no modification times keeps
/// every marker.
pub async fn markers(op: &Operator, now: SystemTime) -> opendal::Result<Vec<String>> {
    let entries = op.list(MARKERS_DIR).await?;
    let stale = Duration::from_millis(MARKER_STALE_MS);
    Ok(entries
        .into_iter()
        .filter(|e| e.metadata().is_file())
        .filter(|e| {
            // A time ahead of this host's clock reads as age 0.
            e.metadata()
                .last_modified()
                .is_none_or(|t| now.duration_since(SystemTime::from(t)).unwrap_or_default() < stale)
        })
        .map(|e| e.name().to_string())
        .filter(|n| !n.is_empty())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's two writers (job records, search summaries) mark one store at the same
    /// moments: a marker's writes never tear each other. (A file store writes in place:
    /// truncate, write, sync, stat; the other's truncation between a write and its stat
    /// failed the write with "writer got too much data".)
    #[test]
    fn one_nodes_writers_mark_its_store_at_once_without_failing() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let op = trainer::operator_from_url(&url).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let me = "12D3KooWmarker".repeat(4);
        let failed = rt.block_on(async {
            let mut failed = Vec::new();
            for _ in 0..MARKS {
                let both = [0, 1].map(|_| {
                    let (op, me) = (op.clone(), me.clone());
                    tokio::spawn(async move { mark(&op, &me).await })
                });
                for w in both {
                    if let Err(e) = w.await.unwrap() {
                        failed.push(e.to_string());
                    }
                }
            }
            failed
        });
        assert!(
            failed.is_empty(),
            "{} failed: {:?}",
            failed.len(),
            failed.first()
        );
    }

    /// How many times the two writers mark at once.
    const MARKS: usize = 2000;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("peer-{i}")).collect()
    }

    fn everyone_alive(names: &[String]) -> BTreeSet<String> {
        names.iter().cloned().collect()
    }

    /// Each job has exactly one writer among sharers who see the same members, the jobs
    /// spread over them, and a writer's death passes its jobs (and only those) on.
    #[test]
    fn one_writer_per_job_and_a_dead_writers_jobs_pass_on() {
        let all = names(8);
        let views: Vec<Sharers> = all.iter().map(|m| Sharers::new(m, all.clone())).collect();
        let alive = everyone_alive(&all);
        let writers_of = |views: &[Sharers], alive: &BTreeSet<String>, job: JobId| -> Vec<usize> {
            (0..views.len())
                .filter(|&i| alive.contains(&all[i]))
                .filter(|&i| views[i].writes(job, &views[i].alive(alive)))
                .collect()
        };
        let jobs: Vec<JobId> = (1..=800).map(JobId::from_log_index).collect();
        let mut per_writer = [0usize; 8];
        let mut before = Vec::new();
        for &job in &jobs {
            let w = writers_of(&views, &alive, job);
            assert_eq!(w.len(), 1, "job {job}: writers {w:?}");
            per_writer[w[0]] += 1;
            before.push(w[0]);
        }
        assert!(per_writer.iter().all(|&n| n > 50), "{per_writer:?}");

        let mut without_3 = alive.clone();
        without_3.remove(&all[3]);
        for (&job, &was) in jobs.iter().zip(&before) {
            let w = writers_of(&views, &without_3, job);
            assert_eq!(w.len(), 1, "job {job}: writers {w:?}");
            if was != 3 {
                assert_eq!(w[0], was, "job {job} moved though its writer lives");
            }
        }
    }

    /// A node alone (no marker but its own), or whose sharers are all dead, writes everything.
    #[test]
    fn alone_a_node_writes_every_job() {
        let me = "peer-0";
        let alone = Sharers::new(me, vec![me.to_string()]);
        assert!(!alone.shared());
        let shared = Sharers::new(me, names(4));
        assert!(shared.shared());
        let nobody = shared.alive(&BTreeSet::new());
        for job in (1..=100).map(JobId::from_log_index) {
            assert!(alone.writes(job, &alone.alive(&everyone_alive(&names(4)))));
            assert!(shared.writes(job, &nobody));
        }
    }

    /// A sharer a node does not know of yet makes it write more, never less: a job it skips
    /// has a writer it believes alive ranked above it.
    #[test]
    fn a_sharer_not_yet_listed_makes_two_writers_not_none() {
        let all = names(6);
        let alive = everyone_alive(&all);
        // peer-0 has not listed peer-5's marker yet; everyone else has.
        let mut views: Vec<Sharers> = all.iter().map(|m| Sharers::new(m, all.clone())).collect();
        views[0] = Sharers::new(&all[0], all[..5].to_vec());
        for job in (1..=500).map(JobId::from_log_index) {
            let n = views
                .iter()
                .filter(|v| v.writes(job, &v.alive(&alive)))
                .count();
            assert!((1..=2).contains(&n), "job {job}: {n} writers");
        }
    }

    #[test]
    fn markers_are_listed_again_soon_when_members_join() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_millis(10);
        assert_eq!(rescan_at(None, 3, now), now);
        assert_eq!(
            rescan_at(Some((t0, 3)), 3, now),
            t0 + Duration::from_millis(RESCAN_MS)
        );
        assert_eq!(
            rescan_at(Some((t0, 3)), 2, now),
            t0 + Duration::from_millis(RESCAN_MS)
        );
        assert_eq!(
            rescan_at(Some((t0, 3)), 4, now),
            t0 + Duration::from_millis(RESCAN_SOON_MS)
        );
    }

    #[tokio::test]
    async fn markers_in_a_shared_store_name_its_sharers() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let op = trainer::operator_from_url(&url).unwrap();
        let now = SystemTime::now();
        assert!(markers(&op, now).await.unwrap_or_default().is_empty());
        mark(&op, "peer-a").await.unwrap();
        mark(&op, "peer-b").await.unwrap();
        let mut found = markers(&op, now).await.unwrap();
        found.sort();
        assert_eq!(found, ["peer-a", "peer-b"]);
        assert!(Sharers::new("peer-a", found).shared());
        // A marker its member stopped refreshing no longer counts.
        let old = SystemTime::now() - Duration::from_millis(MARKER_STALE_MS + 1_000);
        let b = std::fs::File::options()
            .write(true)
            .open(dir.path().join("members/peer-b"))
            .unwrap();
        b.set_modified(old).unwrap();
        assert_eq!(markers(&op, now).await.unwrap(), ["peer-a"]);
    }
}
