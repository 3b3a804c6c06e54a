//! Each node writes every search that ended to its storage, as
//! `experiments/<job-id>/summary.json` ([`super::summary::Summary`]): the record outlives the
//! cluster (with per-node `file://` stores every node keeps a copy; with a shared store the
//! copies are the same document).
//!
//! May use: `control::handle` (to read the state and follow applied entries).

use std::collections::BTreeSet;

use tracing::{info, warn};

use super::summary::{summary_path, Summary};
use crate::control::{handle::ControlHandle, state::JobId};

/// Writes the summary of every ended search once, from now until the node stops.
pub async fn run(ctl: ControlHandle, storage: String) {
    let op = match trainer::operator_from_url(&storage) {
        Ok(op) => op,
        Err(e) => {
            let storage = crate::api::redact::redact_url(&storage);
            warn!(%storage, "search summaries will not be written: {e}");
            return;
        }
    };
    let mut written: BTreeSet<JobId> = BTreeSet::new();
    let mut applied = ctl.subscribe_applied();
    loop {
        let due: Vec<(JobId, Summary)> = ctl.read(|s| {
            s.jobs
                .values()
                .filter(|j| j.state.is_terminal() && !written.contains(&j.id))
                .filter_map(|j| Summary::of(j).map(|doc| (j.id, doc)))
                .collect()
        });
        for (id, doc) in due {
            let path = summary_path(&id.to_string());
            let bytes = match serde_json::to_vec_pretty(&doc) {
                Ok(b) => b,
                Err(e) => {
                    warn!(job = %id, "summary not encoded: {e}");
                    written.insert(id);
                    continue;
                }
            };
            match op.write(&path, bytes).await {
                Ok(_) => {
                    info!(job = %id, %path, "search summary written");
                    written.insert(id);
                }
                // Tried again at the next applied entry.
                Err(e) => warn!(job = %id, %path, "search summary not written: {e}"),
            }
        }
        if applied.changed().await.is_err() {
            return;
        }
    }
}
