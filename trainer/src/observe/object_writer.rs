//! One task that owns writing one object: training hands it whole new contents.

use std::sync::Arc;
use std::time::Duration;

use opendal::Operator;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

/// Longest [`ObjectWriter::close`] waits for the last write, ms: a store that hangs must
/// not keep a finished worker from exiting.
pub const OBJECT_CLOSE_TIMEOUT_MS: u64 = 30_000;

/// What the task has done: the newest version it attempted and that attempt's error.
#[derive(Debug, Clone, Default)]
struct Progress {
    attempted: u64,
    error: Option<String>,
}

/// Handle to a task that writes the newest contents handed to it at one path.
///
/// [`ObjectWriter::put`] returns at once. Contents superseded before the task reaches them
/// are skipped (a slow store never makes training wait or queue memory: at most one
/// pending copy). A failed write is logged (`warn`) and never stops the task or the
/// caller: observability must not fail training.
#[derive(Debug)]
pub struct ObjectWriter {
    path: String,
    latest: watch::Sender<Option<(u64, Arc<Vec<u8>>)>>,
    progress: watch::Receiver<Progress>,
    version: u64,
    task: JoinHandle<()>,
}

impl ObjectWriter {
    /// Starts the task on the current tokio runtime, writing `path` under `op`.
    pub fn spawn(op: Operator, path: String) -> Self {
        let (latest, mut rx) = watch::channel::<Option<(u64, Arc<Vec<u8>>)>>(None);
        let (ptx, progress) = watch::channel(Progress::default());
        let task_path = path.clone();
        let task = tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let Some((version, bytes)) = rx.borrow_and_update().clone() else {
                    continue;
                };
                let error = match op.write(&task_path, bytes.to_vec()).await {
                    Ok(_) => {
                        debug!(path = %task_path, bytes = bytes.len(), "object written");
                        None
                    }
                    Err(e) => {
                        warn!(path = %task_path, error = %e, "observability write failed");
                        Some(e.to_string())
                    }
                };
                ptx.send_replace(Progress {
                    attempted: version,
                    error,
                });
            }
        });
        ObjectWriter {
            path,
            latest,
            progress,
            version: 0,
            task,
        }
    }

    /// The path written.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Hands over the object's whole new contents; returns at once.
    pub fn put(&mut self, bytes: Vec<u8>) {
        self.version += 1;
        self.latest
            .send_replace(Some((self.version, Arc::new(bytes))));
    }

    /// Waits (at most `timeout`) until the last contents handed over are written, then
    /// stops the task. `Err`: that write failed or did not finish in time (already logged
    /// by the task in the first case).
    pub async fn close(self, timeout: Duration) -> Result<(), String> {
        let want = self.version;
        let mut progress = self.progress;
        let waited = tokio::time::timeout(timeout, async {
            if want == 0 {
                return Ok(());
            }
            match progress.wait_for(|p| p.attempted >= want).await {
                Ok(p) => p.error.clone().map_or(Ok(()), Err),
                Err(_) => Err("writer task ended".to_string()),
            }
        })
        .await;
        drop(self.latest);
        match waited {
            Ok(r) => {
                let _ = self.task.await;
                r
            }
            Err(_) => {
                self.task.abort();
                Err(format!(
                    "writing {} took over {} ms",
                    self.path,
                    timeout.as_millis()
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> Operator {
        Operator::via_iter("memory", Vec::<(String, String)>::new()).unwrap()
    }

    #[tokio::test]
    async fn the_newest_contents_are_written_by_close() {
        let op = memory();
        let mut w = ObjectWriter::spawn(op.clone(), "a/b.bin".into());
        for i in 0..50u8 {
            w.put(vec![i; 10]);
        }
        w.close(Duration::from_secs(5)).await.unwrap();
        assert_eq!(op.read("a/b.bin").await.unwrap().to_vec(), vec![49u8; 10]);
    }

    #[tokio::test]
    async fn a_failed_write_is_reported_by_close_not_by_put() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the object's parent directory should be.
        std::fs::write(dir.path().join("blocked"), b"x").unwrap();
        let op = crate::operator_from_url(&format!("file://{}", dir.path().display())).unwrap();
        let mut w = ObjectWriter::spawn(op, "blocked/obj".into());
        w.put(vec![1, 2, 3]);
        assert!(w.close(Duration::from_secs(30)).await.is_err());
    }

    #[tokio::test]
    async fn closing_without_contents_writes_nothing() {
        let op = memory();
        let w = ObjectWriter::spawn(op.clone(), "x".into());
        w.close(Duration::from_secs(1)).await.unwrap();
        assert!(!op.exists("x").await.unwrap());
    }
}
