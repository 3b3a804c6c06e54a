//! Every job that ended is written to storage, as `jobs/<job-id>/record.json` (the job as the
//! control state held it): the record outlives the job's place in the live state, which
//! compaction frees after the retention (`domain::state::compaction`). The API answers for a
//! compacted job from here. A node with a store of its own writes every record; members that
//! share a store write each record once between them ([`sharers`]). The same loop writes
//! searches' summaries (`search::writer`).
//!
//! A record is needed once its job leaves the live state, days later by default, so a node
//! writes it [`record_delay_ms`] after the job ended (15–30 s, its own share by peer id),
//! not when the job ends: then every node of the cluster would write it at once (a directory
//! and a file each), on the hosts where the next jobs are being submitted and placed. A
//! node that restarts writes the records of every ended job still live that it has not.
//! Summaries are written at once.
//!
//! May use: `control::handle` (to read the state and follow applied entries), `cluster` (the
//! members alive, peer ids' texts).

pub mod sharers;

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

use tracing::{debug, info, warn};

use crate::cluster::{identity::peer_id_text, membership::State};
use crate::control::handle::ControlHandle;
use crate::domain::state::{Job, JobId};
use sharers::Sharers;

/// Where an ended job's record is, in the store.
pub fn record_path(id: &str) -> String {
    format!("jobs/{id}/record.json")
}

/// A document to write once for an ended job: its path in the store and bytes.
pub type Doc = (String, Vec<u8>);

/// When a document is written after its job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// As soon as the writer sees the job ended.
    AtOnce,
    /// [`record_delay_ms`] after the job ended, for a cluster whose ended jobs stay this
    /// long in the live state (`--job-retention-s` in ms; 0: for ever).
    Deferred { retention_ms: u64 },
}

/// Least time between a job's end and a node's write of its record, in milliseconds.
pub const RECORD_DELAY_MIN_MS: u64 = 15_000;
/// Over how many milliseconds beyond [`RECORD_DELAY_MIN_MS`] the nodes' writes of a record
/// are spread (each node its own share, by peer id).
pub const RECORD_DELAY_SPREAD_MS: u64 = 15_000;

/// How long after a job ended node `me` writes its record: [`RECORD_DELAY_MIN_MS`] and the
/// node's share of [`RECORD_DELAY_SPREAD_MS`], scaled down to within a quarter of the
/// retention when that is shorter (the record must be there when the job is compacted).
pub fn record_delay_ms(me: &str, retention_ms: u64) -> u64 {
    let wait = RECORD_DELAY_MIN_MS + sharers::key(me) % (RECORD_DELAY_SPREAD_MS + 1);
    let longest = RECORD_DELAY_MIN_MS + RECORD_DELAY_SPREAD_MS;
    match retention_ms / 4 {
        quarter if retention_ms > 0 && quarter < longest => wait * quarter / longest,
        _ => wait,
    }
}

/// Writes, once each, the document `doc` makes of each ended job (none: nothing to write
/// for that job), looking when entries are applied (at most every [`PASS_GAP`]) and when a
/// deferred one is due ([`Timing`]), from now until `stop` fires (never in the middle of a
/// write). In a store shared with other members only the job's writer among them writes it
/// ([`sharers`]). `what` names the documents in logs.
pub async fn write_ended(
    stop: tokio_util::sync::CancellationToken,
    ctl: ControlHandle,
    storage: String,
    timing: Timing,
    what: &'static str,
    doc: impl Fn(&Job) -> Option<Doc>,
) {
    let op = match trainer::operator_from_url(&storage) {
        Ok(op) => op,
        Err(e) => {
            let storage = trainer::redact::redact_url(&storage);
            warn!(%storage, "{what}s will not be written: {e}");
            return;
        }
    };
    let me = ctl.me().to_string();
    let delay_ms = match timing {
        Timing::AtOnce => 0,
        Timing::Deferred { retention_ms } => record_delay_ms(&me, retention_ms),
    };
    // Jobs whose document is written (or has none), and those another sharer alive writes
    // (looked at again when the sharers or those alive change).
    let mut done: BTreeSet<JobId> = BTreeSet::new();
    let mut theirs: BTreeSet<JobId> = BTreeSet::new();
    let mut sharers = Sharers::new(&me, []);
    let mut alive: Vec<u64> = Vec::new();
    // When the markers were last listed, and the Raft members then.
    let mut scanned: Option<(Instant, usize)> = None;
    let mut alive_at = Instant::now();
    let mut applied = ctl.subscribe_applied();
    loop {
        let now = Instant::now();
        let members = ctl.raft_members();
        if now >= sharers::rescan_at(scanned, members, now) {
            if let Err(e) = sharers::mark(&op, &me).await {
                // Members sharing the store then write what this node would, too.
                warn!("{what}s: this node's marker not written: {e}");
            }
            match sharers::markers(&op, SystemTime::now()).await {
                Ok(markers) => {
                    let fresh = Sharers::new(&me, markers);
                    if fresh != sharers {
                        info!(
                            sharers = fresh.others(),
                            "{what}s: this node's store is shared with {} other members (their markers are in it): each is written once between them",
                            fresh.others()
                        );
                    }
                    sharers = fresh;
                }
                Err(e) => debug!("{what}s: markers not listed: {e}"),
            }
            scanned = Some((now, members));
            alive_at = now;
            // Compacted jobs are gone from the state for good.
            ctl.read(|s| done.retain(|id| s.jobs.contains_key(id)));
            theirs.clear();
        }
        if now >= alive_at {
            let fresh = match sharers.shared() {
                true => match alive_members(&ctl).await {
                    Some(members) => sharers.alive(&members),
                    None => return,
                },
                false => Vec::new(),
            };
            if fresh != alive {
                alive = fresh;
                theirs.clear();
            }
            alive_at = now + Duration::from_millis(sharers::ALIVE_REFRESH_MS);
        }
        // Jobs not due yet wait for the earliest of them (wall clock: a job's end is the
        // chief's).
        let now_ms = crate::control::handle::wall_ms();
        let mut due_in_ms: Option<u64> = None;
        let docs: Vec<(JobId, Option<Doc>)> = ctl.read(|s| {
            let mut docs = Vec::new();
            for j in s.jobs.values().filter(|j| j.state.is_terminal()) {
                if done.contains(&j.id) || theirs.contains(&j.id) {
                    continue;
                }
                let due_ms = j.finished_at_ms.unwrap_or(0).saturating_add(delay_ms);
                if due_ms > now_ms {
                    let wait = due_ms - now_ms;
                    due_in_ms = Some(due_in_ms.map_or(wait, |w| w.min(wait)));
                    continue;
                }
                match sharers.writes(j.id, &alive) {
                    true => docs.push((j.id, doc(j))),
                    false => {
                        theirs.insert(j.id);
                    }
                }
            }
            docs
        });
        for (id, doc) in docs {
            let Some((path, bytes)) = doc else {
                done.insert(id);
                continue;
            };
            // In a shared store another member may have written it (its writer before a
            // death, or this node before a restart): a copy of the same length is it.
            if sharers.shared()
                && op
                    .stat(&path)
                    .await
                    .is_ok_and(|m| m.content_length() == bytes.len() as u64)
            {
                debug!(job = %id, %path, "{what} already in the store");
                done.insert(id);
                continue;
            }
            match op.write(&path, bytes).await {
                Ok(_) => {
                    debug!(job = %id, %path, "{what} written");
                    done.insert(id);
                }
                // Tried again at the next applied entry.
                Err(e) => warn!(job = %id, %path, "{what} not written: {e}"),
            }
        }
        // Jobs another sharer writes pass to this node when it dies: look again soon.
        let rescan_at = sharers::rescan_at(scanned, members, now);
        let mut wake = match theirs.is_empty() {
            true => rescan_at,
            false => alive_at.min(rescan_at),
        };
        // The next job due, no sooner than a pass gap from this pass (jobs ending one after
        // another would otherwise wake a pass over every job for each).
        if let Some(ms) = due_in_ms {
            wake = wake.min(now + Duration::from_millis(ms).max(PASS_GAP));
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = applied.changed() => {
                if changed.is_err() {
                    return;
                }
                // Entries come in bursts (a job is three: its submit, placement and exit):
                // one pass for all of a burst's, and not every node scanning every job at
                // each entry while the commits that follow wait for the cores.
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep_until((now + PASS_GAP).into()) => {}
                }
            }
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
    }
}

/// Shortest time between two passes of [`write_ended`] woken by applied entries: a document
/// is not needed at once.
pub const PASS_GAP: Duration = Duration::from_millis(500);

/// The members alive or suspected (not yet dead), by peer id text; `None` once the node's
/// event loop is gone.
async fn alive_members(ctl: &ControlHandle) -> Option<BTreeSet<String>> {
    let (_, members) = ctl.node().members().await.ok()?;
    Some(
        members
            .iter()
            .filter(|m| matches!(m.state, State::Alive | State::Suspect))
            .map(|m| peer_id_text(&m.id))
            .collect(),
    )
}

/// An ended job's record.
pub fn record(j: &Job) -> Option<Doc> {
    let bytes = serde_json::to_vec(j).ok()?;
    Some((record_path(&j.id.to_string()), bytes))
}

/// Largest job record read back, bytes: a job holds at most `METRICS_PER_JOB_MAX` metrics
/// of `METRIC_HISTORY_POINTS_MAX` points and `EVENTS_PER_JOB_MAX` events (a few MiB at
/// most); a longer object in the store is not one we wrote, and is not read.
pub const JOB_RECORD_BYTES_MAX: u64 = 16 << 20;

/// Reads an ended job's record back from the store at `storage` (`None` if there is none,
/// or it is over [`JOB_RECORD_BYTES_MAX`] or undecodable).
pub async fn read_record(storage: &str, id: JobId) -> Option<Job> {
    let op = trainer::operator_from_url(storage).ok()?;
    let path = record_path(&id.to_string());
    let bytes = match trainer::read_capped(&op, &path, JOB_RECORD_BYTES_MAX).await {
        Ok(b) => b,
        Err(e @ trainer::ReadCappedError::TooLarge { .. }) => {
            warn!(job = %id, "job record not read: {e}");
            return None;
        }
        Err(_) => return None,
    };
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::state::{ops, ControlCommand, ControlResponse, ControlState, Op};

    /// A node writes a record 15–30 s after its job ended, its own share of the spread; within
    /// a quarter of a shorter retention.
    #[test]
    fn records_wait_the_nodes_share_and_within_a_short_retention() {
        let lo = RECORD_DELAY_MIN_MS;
        let hi = lo + RECORD_DELAY_SPREAD_MS;
        let week_ms = 7 * 24 * 3600 * 1000;
        let waits: BTreeSet<u64> = (0..200)
            .map(|i| record_delay_ms(&format!("peer-{i}"), week_ms))
            .collect();
        assert!(waits.iter().all(|w| (lo..=hi).contains(w)), "{waits:?}");
        assert!(waits.len() > 150, "spread: {waits:?}");
        assert_eq!(record_delay_ms("p", 0), record_delay_ms("p", week_ms));
        for retention_ms in [1, 2_000, 60_000, 119_999] {
            let w = record_delay_ms("p", retention_ms);
            assert!(
                w <= retention_ms / 4,
                "{w} ms for a retention of {retention_ms}"
            );
        }
        assert_eq!(record_delay_ms("p", 120_000), record_delay_ms("p", week_ms));
    }

    /// A record padded past the limit with whitespace (still valid JSON) is not read; the
    /// same record within it is.
    #[test]
    fn records_over_the_limit_are_not_read() {
        let spec = crate::domain::spec::JobSpec::parse(
            "name = \"t\"\nkind = \"command\"\nworkers = 1\ncommand = [\"true\"]\n",
        )
        .unwrap();
        let mut state = ControlState::default();
        let ControlResponse::Submitted { id } = state.apply(
            1,
            &ControlCommand {
                op: Op::Submit(ops::Submit {
                    spec: Box::new(spec),
                    token: None,
                    owner: crate::domain::state::users::admin_user(),
                }),
                at_ms: 10,
            },
        ) else {
            panic!("submitted");
        };
        let record = serde_json::to_vec(state.job(id).unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let storage = format!("file://{}", dir.path().display());
        let path = dir.path().join(record_path(&id.to_string()));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();

        std::fs::write(&path, &record).unwrap();
        assert_eq!(rt.block_on(read_record(&storage, id)).unwrap().id, id);

        let mut padded = record.clone();
        padded.resize(JOB_RECORD_BYTES_MAX as usize + 1, b' ');
        std::fs::write(&path, &padded).unwrap();
        assert!(serde_json::from_slice::<Job>(&padded).is_ok());
        assert!(rt.block_on(read_record(&storage, id)).is_none());
    }
}
