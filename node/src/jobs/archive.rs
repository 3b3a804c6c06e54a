//! Each node writes every job that ended to its storage, as `jobs/<job-id>/record.json` (the
//! job as the control state held it): the record outlives the job's place in the live state,
//! which compaction frees after the retention (`domain::state::compaction`). The API answers for a
//! compacted job from here. The same loop writes searches' summaries (`search::writer`).
//!
//! May use: `control::handle` (to read the state and follow applied entries).

use std::collections::BTreeSet;

use tracing::{debug, warn};

use crate::control::handle::ControlHandle;
use crate::domain::state::{ControlState, Job, JobId};

/// Where an ended job's record is, in the store.
pub fn record_path(id: &str) -> String {
    format!("jobs/{id}/record.json")
}

/// A document to write once for an ended job: its id, path in the store and bytes.
pub type Due = (JobId, String, Vec<u8>);

/// Writes, once each, the documents `due` names for the jobs not yet written, at every
/// applied entry, from now until `stop` fires (never in the middle of a write). `what`
/// names them in logs.
pub async fn write_ended(
    stop: tokio_util::sync::CancellationToken,
    ctl: ControlHandle,
    storage: String,
    what: &'static str,
    due: impl Fn(&ControlState, &BTreeSet<JobId>) -> Vec<Due>,
) {
    let op = match trainer::operator_from_url(&storage) {
        Ok(op) => op,
        Err(e) => {
            let storage = trainer::redact::redact_url(&storage);
            warn!(%storage, "{what}s will not be written: {e}");
            return;
        }
    };
    let mut written: BTreeSet<JobId> = BTreeSet::new();
    let mut applied = ctl.subscribe_applied();
    loop {
        let docs = ctl.read(|s| due(s, &written));
        for (id, path, bytes) in docs {
            match op.write(&path, bytes).await {
                Ok(_) => {
                    debug!(job = %id, %path, "{what} written");
                    written.insert(id);
                }
                // Tried again at the next applied entry.
                Err(e) => warn!(job = %id, %path, "{what} not written: {e}"),
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = applied.changed() => if changed.is_err() { return },
        }
    }
}

/// The records of ended jobs not yet written.
pub fn due_records(s: &ControlState, written: &BTreeSet<JobId>) -> Vec<Due> {
    s.jobs
        .values()
        .filter(|j| j.state.is_terminal() && !written.contains(&j.id))
        .filter_map(|j| {
            let bytes = serde_json::to_vec(j).ok()?;
            Some((j.id, record_path(&j.id.to_string()), bytes))
        })
        .collect()
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
    use crate::domain::state::{ControlCommand, ControlResponse, Op};

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
                op: Op::Submit {
                    spec: Box::new(spec),
                    token: None,
                },
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
