//! The data directory's lock: one node per data directory.
//!
//! Two nodes on one `--data-dir` would share an identity (one peer id in two places) and
//! write one Raft log from two processes. A node takes an exclusive `flock` on
//! `<data-dir>/node.lock` before it reads anything there and holds it until it exits (the
//! kernel drops it with the process, so a killed node leaves no stale lock); the file holds
//! the holder's PID, so a second node can name it.

use std::{
    fs::File,
    io::{Read, Seek, Write},
    path::Path,
};

use nix::fcntl::{Flock, FlockArg};

/// The lock file's name in the data directory.
pub const LOCK_FILE: &str = "node.lock";

/// Longest lock file read for the holder's PID, in bytes.
const LOCK_FILE_BYTES_MAX: u64 = 64;

/// Why the data directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another live process holds it.
    #[error("data directory {dir} is in use by another node (pid {holder}): give this node its own --data-dir")]
    Held {
        /// The directory.
        dir: String,
        /// The holder's PID as it wrote it ("unknown" if unreadable).
        holder: String,
    },
    /// The lock file could not be opened or locked.
    #[error("locking data directory {dir}: {source}")]
    Io {
        /// The directory.
        dir: String,
        /// The error.
        source: std::io::Error,
    },
}

/// The held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct DataDirLock {
    _lock: Flock<File>,
}

/// Locks `dir` for this process, or says which process holds it.
pub fn lock(dir: &Path) -> Result<DataDirLock, LockError> {
    let io = |source| LockError::Io {
        dir: dir.display().to_string(),
        source,
    };
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(mut lock) => {
            lock.set_len(0).map_err(io)?;
            lock.rewind().map_err(io)?;
            write!(lock, "{}", std::process::id()).map_err(io)?;
            lock.flush().map_err(io)?;
            Ok(DataDirLock { _lock: lock })
        }
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut text = String::new();
            let _ = (&mut file)
                .take(LOCK_FILE_BYTES_MAX)
                .read_to_string(&mut text);
            let holder = text.trim();
            Err(LockError::Held {
                dir: dir.display().to_string(),
                holder: if holder.is_empty() { "unknown" } else { holder }.to_string(),
            })
        }
        Err((_, errno)) => Err(io(std::io::Error::from(errno))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holder_and_a_released_one_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock(dir.path()).unwrap();
        let err = lock(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(held);
        lock(dir.path()).unwrap();
    }
}
