//! Ranks' logs: where a rank's output is kept on the node that ran it, and reading it back
//! in bounded pieces (for `ringleader logs`, locally or for another node over RPC).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::domain::state::JobId;

/// Largest piece of a log returned by one read, in bytes.
pub const LOG_CHUNK_BYTES_MAX: u64 = 256 * 1024;

/// A piece of one rank's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogChunk {
    /// The worker's rank in the current generation.
    pub rank: u32,
    /// The worker's id (see [`crate::domain::state::Slot::worker`]): offsets are per worker,
    /// since an elastic train worker keeps its log through re-forms while its rank changes.
    #[serde(default)]
    pub worker: u32,
    /// The generation the worker's process was started for: a new one starts a new log.
    pub generation: u32,
    /// Byte offset of `text` in the rank's log.
    pub offset: u64,
    pub text: String,
    /// Where the next read starts.
    pub next_offset: u64,
    /// Why this rank's log could not be read, if it could not.
    pub error: Option<String>,
}

impl LogChunk {
    /// No text of `worker`'s log of `generation` from `offset` (its `rank` the worker id
    /// until the caller sets the current rank), with why, if it could not be read.
    pub fn empty(worker: u32, generation: u32, offset: u64, error: Option<String>) -> LogChunk {
        LogChunk {
            rank: worker,
            worker,
            generation,
            offset,
            text: String::new(),
            next_offset: offset,
            error,
        }
    }
}

/// Where a worker's log lives under the jobs directory: by the generation its process was
/// started for and its worker id (see [`crate::domain::state::Job::process_generation`]).
pub fn log_path(jobs_dir: &Path, id: JobId, generation: u32, worker: u32) -> PathBuf {
    jobs_dir
        .join(id.to_string())
        .join(format!("generation-{generation}"))
        .join(format!("worker-{worker}.log"))
}

/// Reads up to [`LOG_CHUNK_BYTES_MAX`] of a local rank log from `offset`.
/// The chunk's `rank` is the worker id; the caller sets the current rank.
pub fn read_log(
    jobs_dir: &Path,
    job: JobId,
    generation: u32,
    worker: u32,
    offset: u64,
) -> LogChunk {
    use std::io::{Read, Seek, SeekFrom};
    let path = log_path(jobs_dir, job, generation, worker);
    let mut chunk = LogChunk::empty(worker, generation, offset, None);
    let result = (|| -> std::io::Result<()> {
        let mut f = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        f.seek(SeekFrom::Start(offset))?;
        let mut buf = Vec::new();
        f.take(LOG_CHUNK_BYTES_MAX).read_to_end(&mut buf)?;
        chunk.next_offset = offset + buf.len() as u64;
        chunk.text = String::from_utf8_lossy(&buf).into_owned();
        Ok(())
    })();
    if let Err(e) = result {
        chunk.error = Some(format!("{}: {e}", path.display()));
    }
    chunk
}
