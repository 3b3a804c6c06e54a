//! The asynchronous checkpoint writer: one task owns the store; training hands it snapshots.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::checkpoint::CheckpointStore;
use crate::error::TrainError;
use crate::state::TrainState;

/// What the writer has done: the newest step it attempted and the error of that attempt.
#[derive(Debug, Clone, Default)]
struct Progress {
    attempted: Option<u64>,
    error: Option<String>,
}

/// Handle to the writer task. [`Checkpointer::save`] returns at once; the task writes the
/// newest snapshot handed to it (a snapshot superseded before the task reaches it is
/// skipped, so a slow store never makes training wait or queue memory), then prunes to `keep`.
#[derive(Debug)]
pub struct Checkpointer {
    latest: watch::Sender<Option<Arc<TrainState>>>,
    progress: watch::Receiver<Progress>,
    requested: Option<u64>,
    task: JoinHandle<()>,
}

impl Checkpointer {
    /// Starts the writer task on the current tokio runtime.
    pub fn spawn(store: CheckpointStore, keep: usize) -> Self {
        let (latest, mut rx) = watch::channel::<Option<Arc<TrainState>>>(None);
        let (ptx, progress) = watch::channel(Progress::default());
        let task = tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let Some(state) = rx.borrow_and_update().clone() else {
                    continue;
                };
                let step = state.meta.step;
                let result = match store.write(&state).await {
                    Ok(()) => store.prune(keep).await.map(|_| ()),
                    Err(e) => Err(e),
                };
                let error = match result {
                    Ok(()) => {
                        info!(step, dir = %store.dir(step), "checkpoint committed");
                        None
                    }
                    Err(e) => {
                        warn!(step, error = %e, "checkpoint write failed");
                        Some(e.to_string())
                    }
                };
                ptx.send_replace(Progress {
                    attempted: Some(step),
                    error,
                });
            }
        });
        Checkpointer {
            latest,
            progress,
            requested: None,
            task,
        }
    }

    /// Hands a snapshot to the writer; returns at once.
    pub fn save(&mut self, state: Arc<TrainState>) {
        self.requested = Some(state.meta.step);
        self.latest.send_replace(Some(state));
    }

    /// Waits until the last snapshot handed over is written (or its write failed).
    pub async fn flush(&mut self) -> Result<(), TrainError> {
        let Some(want) = self.requested else {
            return Ok(());
        };
        let p = self
            .progress
            .wait_for(|p| p.attempted.is_some_and(|s| s >= want))
            .await
            .map_err(|_| TrainError::WriterStopped("task ended".into()))?
            .clone();
        match p.error {
            Some(e) => Err(TrainError::WriterStopped(e)),
            None => Ok(()),
        }
    }

    /// Flushes, then stops the task.
    pub async fn close(mut self) -> Result<(), TrainError> {
        let r = self.flush().await;
        drop(self.latest);
        self.task
            .await
            .map_err(|e| TrainError::WriterStopped(e.to_string()))?;
        r
    }
}
