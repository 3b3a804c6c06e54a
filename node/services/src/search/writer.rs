//! Every search that ended is written to storage, as `experiments/<job-id>/summary.json`
//! ([`super::summary::Summary`]): the record outlives the cluster (with per-node `file://`
//! stores every node keeps a copy; members sharing a store write it once between them, see
//! `jobs::archive::sharers`).
//!
//! May use: `control::handle` (to read the state and follow applied entries), `jobs::archive`
//! (the loop that writes ended jobs' documents).

use super::summary::{summary_path, Summary};
use crate::control::handle::ControlHandle;

/// Writes the summary of every ended search once, from now until `stop` fires (never in
/// the middle of a write).
pub async fn run(stop: tokio_util::sync::CancellationToken, ctl: ControlHandle, storage: String) {
    use crate::jobs::archive::{write_ended, Timing};
    write_ended(stop, ctl, storage, Timing::AtOnce, "search summary", |j| {
        let doc = Summary::of(j)?;
        let bytes = serde_json::to_vec_pretty(&doc).ok()?;
        Some((summary_path(&j.id.to_string()), bytes))
    })
    .await
}
