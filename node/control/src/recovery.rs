//! Restarting Raft after a storage failure (a full or failing disk).
//!
//! openraft stops a node's Raft for good when its storage returns an error: the write of a log
//! record or snapshot failed, so this replica can no longer promise what it acknowledged. The
//! store has already cut any partial record and refuses further writes (see `store`), so the
//! files on disk hold exactly what was acknowledged. This node then behaves as if cut off: it
//! names no chief, refuses writes with [`ProposeError::Stopped`] (the reason in the error and
//! in `status`), and the others go on without it (a stopped leader sends no heartbeats, so the
//! voters elect another; its own ranks stop like a minority's, see the supervisor's fence).
//!
//! [`restart_after_storage_failures`] watches for that, probes every [`PROBE_EVERY_MS`] whether
//! the Raft directory takes a write of [`PROBE_BYTES`] again (written, fsynced and removed),
//! and then reopens the log from its files and starts a new Raft on them and on the same state
//! machine, which catches up from the chief like any lagging replica. Nothing is lost: the log
//! on disk holds every entry this node acknowledged.
//!
//! [`ProposeError::Stopped`]: crate::protocol::ProposeError::Stopped

use std::{io::Write, path::Path, time::Duration};

use openraft::{error::Fatal, Raft};
use tracing::{error, info, warn};

use crate::{handle::ControlHandle, network::Network, store::LogStore};

/// How often a stopped node checks whether its disk takes writes again, in milliseconds.
pub const PROBE_EVERY_MS: u64 = 2_000;
/// What the probe writes: room for a few log records (a record is usually a few KiB).
pub const PROBE_BYTES: usize = 1 << 20;
/// The probe's file in the Raft directory (removed after each probe).
const PROBE_FILE: &str = "space-probe";

/// Whether `dir` takes a write of [`PROBE_BYTES`], fsynced; the probe file is removed either
/// way.
pub fn probe(dir: &Path) -> std::io::Result<()> {
    let path = dir.join(PROBE_FILE);
    let written = std::fs::File::create(&path).and_then(|mut f| {
        f.write_all(&vec![0u8; PROBE_BYTES])?;
        f.sync_all()
    });
    let _ = std::fs::remove_file(&path);
    written
}

/// Runs for the life of the node: each time this node's Raft stops on a storage error, waits
/// until the disk takes writes and restarts Raft on the same files.
pub async fn restart_after_storage_failures(ctl: ControlHandle) {
    loop {
        let raft = ctl.raft();
        let mut metrics = raft.metrics();
        // A storage error stops the core; so may a panic on the way (openraft asserts on
        // its I/O state). `Stopped` is the node shutting down: nothing to restart.
        let failed = |m: &openraft::RaftMetrics<_, _>| match &m.running_state {
            Err(Fatal::StorageError(e)) => Some(e.to_string()),
            Err(Fatal::Panicked) => Some("Raft panicked".to_string()),
            _ => None,
        };
        let fatal = loop {
            if let Some(e) = failed(&metrics.borrow()) {
                break e;
            }
            if metrics.borrow().running_state.is_err() || metrics.changed().await.is_err() {
                match failed(&metrics.borrow()) {
                    Some(e) => break e,
                    None => return,
                }
            }
        };
        let dir = ctl.raft_dir.clone();
        let reason = format!("cannot write the Raft log in {}: {fatal}", dir.display());
        error!(
            "{reason}. This node names no chief and refuses writes until the disk takes writes \
             again (checked every {PROBE_EVERY_MS} ms); the others go on without it"
        );
        *ctl.fault.lock().expect("fault lock") = Some(reason);
        let _ = raft.shutdown().await;
        let mut logged = false;
        loop {
            tokio::time::sleep(Duration::from_millis(PROBE_EVERY_MS)).await;
            let probe_dir = dir.clone();
            match tokio::task::spawn_blocking(move || probe(&probe_dir)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    if !logged {
                        warn!("the Raft directory still takes no writes: {e}");
                        logged = true;
                    }
                    continue;
                }
                Err(e) => {
                    warn!("space probe failed: {e}");
                    continue;
                }
            }
            match restart(&ctl).await {
                Ok(new) => {
                    ctl.replace_raft(new);
                    *ctl.fault.lock().expect("fault lock") = None;
                    info!("the Raft directory takes writes again: Raft restarted on its files");
                    break;
                }
                Err(e) => {
                    // A log that does not open (corrupt) stays stopped: say so each time.
                    error!("cannot restart Raft: {e:#}");
                    *ctl.fault.lock().expect("fault lock") =
                        Some(format!("cannot restart Raft: {e:#}"));
                }
            }
        }
    }
}

/// A new Raft on the log files and the node's state machine.
async fn restart(ctl: &ControlHandle) -> anyhow::Result<Raft<crate::store::TypeConfig>> {
    let dir = ctl.raft_dir.clone();
    let log = tokio::task::spawn_blocking(move || LogStore::open(&dir)).await??;
    let network = Network::new(ctl.node().clone(), &ctl.sm);
    network.runs(ctl.live.clone());
    let raft = Raft::new(
        ctl.node_id,
        ctl.config.clone(),
        network,
        log,
        ctl.sm.clone(),
    )
    .await?;
    Ok(raft)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        probe(dir.path()).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert!(probe(&dir.path().join("missing")).is_err());
    }
}
