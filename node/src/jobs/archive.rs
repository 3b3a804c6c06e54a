//! Each node writes every job that ended to its storage, as `jobs/<job-id>/record.json` (the
//! job as the control state held it): the record outlives the job's place in the live state,
//! which compaction frees after the retention (`control::compaction`). The API answers for a
//! compacted job from here. The same loop writes searches' summaries (`search::writer`).
//!
//! May use: `control::handle` (to read the state and follow applied entries).

use std::collections::BTreeSet;

use tracing::{debug, warn};

use crate::control::{
    handle::ControlHandle,
    state::{ControlState, Job, JobId},
};

/// Where an ended job's record is, in the store.
pub fn record_path(id: &str) -> String {
    format!("jobs/{id}/record.json")
}

/// A document to write once for an ended job: its id, path in the store and bytes.
pub type Due = (JobId, String, Vec<u8>);

/// Writes, once each, the documents `due` names for the jobs not yet written, at every
/// applied entry, from now until the node stops. `what` names them in logs.
pub async fn write_ended(
    ctl: ControlHandle,
    storage: String,
    what: &'static str,
    due: impl Fn(&ControlState, &BTreeSet<JobId>) -> Vec<Due>,
) {
    let op = match trainer::operator_from_url(&storage) {
        Ok(op) => op,
        Err(e) => {
            let storage = crate::api::redact::redact_url(&storage);
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
        if applied.changed().await.is_err() {
            return;
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

/// Reads an ended job's record back from the store at `storage`.
pub async fn read_record(storage: &str, id: JobId) -> Option<Job> {
    let op = trainer::operator_from_url(storage).ok()?;
    let bytes = op.read(&record_path(&id.to_string())).await.ok()?;
    serde_json::from_slice(&bytes.to_vec()).ok()
}
