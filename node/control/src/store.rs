//! Raft storage for the control plane (openraft 0.9, storage v2): a log store and a state
//! machine persisted as files under one directory.
//!
//! Layout of the directory:
//!
//! - `raft-log`: a write-ahead log of records (appends, truncations, purges, votes, committed
//!   log id), replayed on open. Every record that openraft must find after a crash (entries,
//!   votes, truncations, purges) is fsynced before openraft is told it is stored (votes,
//!   truncations and purges before the call returns, entries before their flush callback,
//!   see below); the committed log id is
//!   written without fsync (losing it only means fewer entries are re-applied at start-up).
//!   When purges have left the file mostly dead, it is rewritten to a temporary file, fsynced
//!   and renamed over the old one.
//! - `raft-snapshot`: the latest snapshot (metadata and the [`ControlState`] as JSON), written
//!   to a temporary file, fsynced and renamed. The state machine itself lives in memory: on
//!   open it is the snapshot's, and openraft re-applies committed entries after it.
//!
//! Both files start with an 8-byte magic (format and version). Records are framed as
//! `len: u32 LE | blake3(len)[..4] | blake3(len ‖ payload): 32 bytes | payload`; the short
//! check of the length tells a damaged length from a torn write. On open, a bad record at the
//! end of `raft-log` (its good header says it reaches the end of the file, or only zero bytes
//! follow it) is the torn tail of an append that was never acknowledged: it is cut off with a
//! warning. A bad record anywhere else, a bad magic, or any bad byte in `raft-snapshot` is
//! corruption: [`StoreError::Corrupt`], and the node refuses to start rather than serve a
//! damaged log. (Known limit: damage inside the payload of the very last record reads as a
//! torn tail, so that one entry is dropped; Raft re-replicates it unless this node was needed
//! for its quorum.) After a failed write the store refuses further writes until reopened.
//!
//! Entries are kept in memory as well (the control log is small and purged after snapshots);
//! readers never wait for disk I/O, and writes run on tokio's blocking pool.
//!
//! Appends are flushed as a group: an append writes its record and hands openraft's flush
//! callback to the store's flusher task, which fsyncs once for every append written since its
//! last fsync and only then calls their callbacks (so openraft still counts an entry only
//! once it is on disk). The chief proposes a pass's commands at once (a search's trial
//! starts, the nodes' reports of their exits), and openraft appends each on its own: one
//! fsync each, one after the other, made a pass of 48 trial starts wait for 48 fsyncs, about
//! a second on a host whose disk was busy.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Cursor, Write};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, LogState, OptionalSend, RaftLogReader,
    RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StorageIOError, StoredMembership,
    Vote,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use crate::domain::state::{ControlCommand, ControlResponse, ControlState};

/// Raft node id: derived from the libp2p peer id with [`node_id_of`].
pub type NodeId = u64;

/// What Raft knows about a node: enough to dial it and show it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RaftNode {
    /// libp2p peer id (base58), the address book key for Raft RPCs.
    pub peer_id: String,
    /// Node name.
    pub name: String,
}

impl fmt::Display for RaftNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name, self.peer_id)
    }
}

openraft::declare_raft_types!(
    /// The control plane's openraft types.
    pub TypeConfig:
        D = ControlCommand,
        R = ControlResponse,
        NodeId = NodeId,
        Node = RaftNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The Raft node id of a peer: the first 8 bytes (LE) of blake3 of its peer id string.
///
/// Every node computes the same id for a peer; collisions among a cluster's members are
/// negligible (2^-64 per pair) and detected by the node when it builds the membership.
pub fn node_id_of(peer_id: &str) -> NodeId {
    let hash = blake3::hash(peer_id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// File name of the write-ahead log inside the store directory.
pub const LOG_FILE: &str = "raft-log";
/// File name of the snapshot inside the store directory.
pub const SNAPSHOT_FILE: &str = "raft-snapshot";
/// Largest record accepted, in bytes (an append of openraft's largest batch of specs fits).
pub const RECORD_BYTES_MAX: usize = 256 << 20;
/// Largest snapshot accepted from a leader or from disk, in bytes: one record of the
/// snapshot file, so at most [`RECORD_BYTES_MAX`] (a larger one could be received but not
/// written).
pub const SNAPSHOT_BYTES_MAX: usize = RECORD_BYTES_MAX;
/// Largest snapshot file read, in bytes: the magic and two records (meta and state), each
/// at most [`RECORD_BYTES_MAX`]. Checked before the file is read.
pub const SNAPSHOT_FILE_BYTES_MAX: u64 =
    (SNAPSHOT_MAGIC.len() + 2 * (FRAME_HEADER_BYTES + RECORD_BYTES_MAX)) as u64;
/// The log file is rewritten after a purge once it is at least this large and twice the size
/// it had after the last rewrite.
pub const LOG_COMPACT_BYTES_MIN: u64 = 8 << 20;
/// Most entries in one record when the log is rewritten.
const REWRITE_ENTRIES_PER_RECORD: usize = 256;

const LOG_MAGIC: &[u8; 8] = b"RLRLOG01";
const SNAPSHOT_MAGIC: &[u8; 8] = b"RLSNAP01";
const FRAME_HEADER_BYTES: usize = 4 + 4 + 32;

/// Errors opening or writing the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An operating-system I/O error (disk full, permissions, …): an operator problem.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The files are damaged somewhere other than a torn tail: stop, do not serve.
    #[error("corrupt {path} at byte {offset}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Byte offset of the bad record (or 0 for the magic).
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

fn io_err<'p>(op: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> StoreError + 'p {
    move |source| StoreError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

// ---------------------------------------------------------------------------------------------
// Record framing

fn frame_hash(payload: &[u8]) -> [u8; 32] {
    let len = u32::try_from(payload.len()).expect("payload checked against RECORD_BYTES_MAX");
    let mut h = blake3::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(payload);
    *h.finalize().as_bytes()
}

/// Check of the length field alone, so a damaged length is told from a torn write.
fn len_check(len: [u8; 4]) -> [u8; 4] {
    let h = blake3::hash(&len);
    h.as_bytes()[..4].try_into().expect("4 bytes")
}

fn encode_frame(payload: &[u8], out: &mut Vec<u8>) {
    assert!(
        payload.len() <= RECORD_BYTES_MAX,
        "record of {} bytes over RECORD_BYTES_MAX",
        payload.len()
    );
    let len = u32::try_from(payload.len())
        .expect("RECORD_BYTES_MAX fits u32")
        .to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&len_check(len));
    out.extend_from_slice(&frame_hash(payload));
    out.extend_from_slice(payload);
}

/// How a sequence of frames ends.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FrameEnd {
    /// The last frame ends exactly at the end of the buffer.
    Clean,
    /// The last write did not fully land: cut the buffer at `offset`.
    Torn { offset: usize, reason: String },
    /// Damage that is not a torn tail.
    Corrupt { offset: usize, reason: String },
}

/// Result of reading frames from a byte buffer (after the magic).
struct Frames<'a> {
    /// (offset in the buffer, payload) of every good frame, in order.
    good: Vec<(usize, &'a [u8])>,
    end: FrameEnd,
}

/// Reads frames from `start`. A bad frame is a torn tail when it can only be the last,
/// partly written append: fewer bytes than a header are left; or its header is bad and only
/// zeros follow (pages that never landed); or its header is good and the frame reaches the end
/// of the buffer (cut short, or its payload checksum fails). Anything else is corruption:
/// a damaged frame with data after it was acknowledged, and was followed by other writes.
fn read_frames(buf: &[u8], start: usize) -> Frames<'_> {
    let mut good = Vec::new();
    let mut at = start;
    while at < buf.len() {
        let rest = &buf[at..];
        let torn = |reason: String| FrameEnd::Torn { offset: at, reason };
        let corrupt = |reason: String| FrameEnd::Corrupt { offset: at, reason };
        if rest.len() < FRAME_HEADER_BYTES {
            return Frames {
                good,
                end: torn(format!("{} bytes, shorter than a frame header", rest.len())),
            };
        }
        let len_bytes: [u8; 4] = rest[..4].try_into().expect("4 bytes");
        if rest[4..8] != len_check(len_bytes) {
            let end = if rest.iter().all(|&b| b == 0) {
                torn("zero-filled tail".to_owned())
            } else {
                corrupt("frame header checksum mismatch".to_owned())
            };
            return Frames { good, end };
        }
        let len = u32::from_le_bytes(len_bytes) as usize;
        if len > RECORD_BYTES_MAX {
            return Frames {
                good,
                end: corrupt(format!("frame length {len} over {RECORD_BYTES_MAX}")),
            };
        }
        let extent = FRAME_HEADER_BYTES + len;
        if rest.len() < extent {
            return Frames {
                good,
                end: torn(format!("frame of {len} bytes cut short")),
            };
        }
        let payload = &rest[FRAME_HEADER_BYTES..extent];
        if rest[8..FRAME_HEADER_BYTES] != frame_hash(payload) {
            let end = if rest.len() == extent {
                torn("checksum mismatch in the last frame".to_owned())
            } else {
                corrupt("checksum mismatch".to_owned())
            };
            return Frames { good, end };
        }
        good.push((at, payload));
        at += extent;
    }
    Frames {
        good,
        end: FrameEnd::Clean,
    }
}

fn fsync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync directory", dir))
}

/// Writes `bytes` to `path` atomically: temporary file, fsync, rename, fsync of the directory.
/// A failed write removes its temporary file (on a full disk it holds the space another write
/// needs).
fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = path.with_extension("tmp");
    let written = File::create(&tmp)
        .map_err(io_err("create", &tmp))
        .and_then(|mut f| {
            f.write_all(bytes).map_err(io_err("write", &tmp))?;
            f.sync_all().map_err(io_err("fsync", &tmp))
        });
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, path).map_err(io_err("rename", &tmp))?;
    fsync_dir(dir)
}

// ---------------------------------------------------------------------------------------------
// Log store

/// One record of the write-ahead log.
///
/// Externally tagged on purpose: serde buffers internally tagged enums, and its buffer cannot
/// read JSON's string map keys back as the integer node ids of a membership.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum LogRecord {
    Append { entries: Vec<Entry<TypeConfig>> },
    Truncate { since: u64 },
    Purge { upto: LogId<NodeId> },
    Vote { vote: Vote<NodeId> },
    Committed { committed: Option<LogId<NodeId>> },
}

/// The log as readers see it.
#[derive(Debug, Default)]
struct LogMem {
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
}

impl LogMem {
    fn apply(&mut self, rec: LogRecord) {
        match rec {
            LogRecord::Append { entries } => {
                for e in entries {
                    self.entries.insert(e.log_id.index, e);
                }
            }
            LogRecord::Truncate { since } => {
                self.entries.split_off(&since);
            }
            LogRecord::Purge { upto } => {
                self.entries = self.entries.split_off(&(upto.index + 1));
                if self.purged.is_none_or(|p| p < upto) {
                    self.purged = Some(upto);
                }
            }
            LogRecord::Vote { vote } => self.vote = Some(vote),
            LogRecord::Committed { committed } => self.committed = committed,
        }
    }
}

/// The open log file; only the log store's write path touches it.
struct LogFile {
    dir: PathBuf,
    path: PathBuf,
    file: File,
    bytes: u64,
    bytes_after_rewrite: u64,
    /// [`LOG_COMPACT_BYTES_MIN`], lowered by tests.
    compact_bytes_min: u64,
    /// A write failed: no more writes until the store is reopened.
    poisoned: bool,
}

impl LogFile {
    /// Opens (or creates) the log and replays it.
    fn open(dir: &Path) -> Result<(LogFile, LogMem), StoreError> {
        fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
        let path = dir.join(LOG_FILE);
        let tmp = path.with_extension("tmp");
        if tmp.exists() {
            // A rewrite that did not reach its rename: the old log is intact.
            fs::remove_file(&tmp).map_err(io_err("remove", &tmp))?;
        }
        if !path.exists() {
            write_atomically(dir, &path, LOG_MAGIC)?;
        }
        let buf = fs::read(&path).map_err(io_err("read", &path))?;
        if buf.len() < LOG_MAGIC.len() || &buf[..LOG_MAGIC.len()] != LOG_MAGIC {
            return Err(StoreError::Corrupt {
                path,
                offset: 0,
                reason: "not a ringleader raft log (bad magic)".into(),
            });
        }
        let frames = read_frames(&buf, LOG_MAGIC.len());
        let mut mem = LogMem::default();
        for (offset, payload) in &frames.good {
            let rec: LogRecord =
                serde_json::from_slice(payload).map_err(|e| StoreError::Corrupt {
                    path: path.clone(),
                    offset: *offset as u64,
                    reason: format!("undecodable record: {e}"),
                })?;
            mem.apply(rec);
        }
        let mut len = buf.len() as u64;
        match frames.end {
            FrameEnd::Clean => {}
            FrameEnd::Corrupt { offset, reason } => {
                return Err(StoreError::Corrupt {
                    path,
                    offset: offset as u64,
                    reason,
                });
            }
            FrameEnd::Torn { offset, reason } => {
                tracing::warn!(path = %path.display(), offset, %reason, "cutting torn tail of raft log");
                let f = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io_err("open", &path))?;
                f.set_len(offset as u64)
                    .map_err(io_err("truncate", &path))?;
                f.sync_all().map_err(io_err("fsync", &path))?;
                len = offset as u64;
            }
        }
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io_err("open", &path))?;
        let log = LogFile {
            dir: dir.to_owned(),
            path,
            file,
            bytes: len,
            bytes_after_rewrite: len,
            compact_bytes_min: LOG_COMPACT_BYTES_MIN,
            poisoned: false,
        };
        Ok((log, mem))
    }

    fn write(&mut self, rec: &LogRecord, sync: bool) -> Result<(), StoreError> {
        if self.poisoned {
            return Err(StoreError::Io {
                op: "append",
                path: self.path.clone(),
                source: io::Error::other("an earlier write failed; reopen the store"),
            });
        }
        let payload = serde_json::to_vec(rec).map_err(|e| StoreError::Io {
            op: "encode record for",
            path: self.path.clone(),
            source: io::Error::new(io::ErrorKind::InvalidData, e),
        })?;
        if payload.len() > RECORD_BYTES_MAX {
            return Err(StoreError::Io {
                op: "append",
                path: self.path.clone(),
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("record of {} bytes", payload.len()),
                ),
            });
        }
        let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + payload.len());
        encode_frame(&payload, &mut frame);
        let written = self
            .file
            .write_all(&frame)
            .map_err(io_err("append", &self.path));
        let synced = match written {
            Ok(()) if sync => self.file.sync_data().map_err(io_err("fsync", &self.path)),
            other => other,
        };
        if let Err(e) = synced {
            // Cut a partial frame so later appends cannot follow garbage (which would read as
            // corruption on open). After a failed fsync the page cache cannot be trusted:
            // refuse further writes either way.
            self.poisoned = true;
            if let Err(cut) = self.file.set_len(self.bytes) {
                tracing::error!(path = %self.path.display(), error = %cut, "cannot cut a failed append");
            }
            return Err(e);
        }
        self.bytes += frame.len() as u64;
        Ok(())
    }

    fn wants_rewrite(&self) -> bool {
        self.bytes >= self.compact_bytes_min && self.bytes >= 2 * self.bytes_after_rewrite
    }

    /// Flushes what was written to disk (`fdatasync`); a failure poisons the store, as a
    /// failed write does.
    fn sync(&mut self) -> io::Result<()> {
        if self.poisoned {
            return Err(io::Error::other(
                "an earlier write failed; reopen the store",
            ));
        }
        let synced = self.file.sync_data();
        if synced.is_err() {
            self.poisoned = true;
        }
        synced
    }

    /// Replaces the file with one holding only `mem`. On failure the store is poisoned: the
    /// open handle may point at a file that is no longer the log.
    fn rewrite(&mut self, mem: &LogMem) -> Result<(), StoreError> {
        let r = self.rewrite_inner(mem);
        if r.is_err() {
            self.poisoned = true;
        }
        r
    }

    fn rewrite_inner(&mut self, mem: &LogMem) -> Result<(), StoreError> {
        let mut buf = LOG_MAGIC.to_vec();
        let mut push = |rec: &LogRecord| {
            encode_frame(
                &serde_json::to_vec(rec).expect("log records serialize"),
                &mut buf,
            )
        };
        if let Some(vote) = mem.vote {
            push(&LogRecord::Vote { vote });
        }
        if let Some(upto) = mem.purged {
            push(&LogRecord::Purge { upto });
        }
        push(&LogRecord::Committed {
            committed: mem.committed,
        });
        let entries: Vec<&Entry<TypeConfig>> = mem.entries.values().collect();
        for chunk in entries.chunks(REWRITE_ENTRIES_PER_RECORD) {
            push(&LogRecord::Append {
                entries: chunk.iter().map(|e| (*e).clone()).collect(),
            });
        }
        write_atomically(&self.dir, &self.path, &buf)?;
        self.file = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(io_err("open", &self.path))?;
        self.bytes = buf.len() as u64;
        self.bytes_after_rewrite = self.bytes;
        Ok(())
    }
}

/// openraft's log store: entries, vote and committed log id, persisted in `raft-log`.
pub struct LogStore {
    mem: Arc<RwLock<LogMem>>,
    file: Arc<Mutex<LogFile>>,
    /// The flush callbacks of appends written but not yet fsynced, to the flusher task
    /// ([`flusher`], started at the first append; it ends when this store is dropped).
    flushes: Option<mpsc::Sender<LogFlushed<TypeConfig>>>,
}

/// Most appends written and waiting for the flusher's next fsync; an append beyond them
/// waits for room.
pub const FLUSH_QUEUE_DEPTH: usize = 1024;

/// The flusher of `file`: takes every flush callback waiting, fsyncs once, calls them all
/// with the result, and again, until the sender is dropped.
fn flusher(file: Arc<Mutex<LogFile>>) -> mpsc::Sender<LogFlushed<TypeConfig>> {
    let (tx, mut rx) = mpsc::channel::<LogFlushed<TypeConfig>>(FLUSH_QUEUE_DEPTH);
    tokio::spawn(async move {
        let mut batch = Vec::new();
        while rx.recv_many(&mut batch, FLUSH_QUEUE_DEPTH).await > 0 {
            let file = file.clone();
            let synced =
                tokio::task::spawn_blocking(move || file.lock().expect("log file lock").sync())
                    .await
                    .unwrap_or_else(|e| Err(io::Error::other(e.to_string())));
            for callback in batch.drain(..) {
                let result = match &synced {
                    Ok(()) => Ok(()),
                    Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
                };
                callback.log_io_completed(result);
            }
        }
    });
    tx
}

/// A cheap handle that reads the log (used by replication tasks).
#[derive(Clone)]
pub struct LogReader {
    mem: Arc<RwLock<LogMem>>,
}

impl LogStore {
    /// Opens the log in `dir` (created if missing), recovering from a torn tail.
    pub fn open(dir: &Path) -> Result<LogStore, StoreError> {
        let (file, mem) = LogFile::open(dir)?;
        Ok(LogStore {
            mem: Arc::new(RwLock::new(mem)),
            file: Arc::new(Mutex::new(file)),
            flushes: None,
        })
    }

    /// Writes `rec` durably (when `sync`) on the blocking pool, then applies it in memory.
    async fn persist(&mut self, rec: LogRecord, sync: bool) -> Result<(), StorageError<NodeId>> {
        let file = self.file.clone();
        let mem = self.mem.clone();
        let compact = matches!(rec, LogRecord::Purge { .. });
        let join = tokio::task::spawn_blocking(move || -> Result<(), StoreError> {
            let mut file = file.lock().expect("log file lock");
            file.write(&rec, sync)?;
            let mut mem = mem.write().expect("log lock");
            mem.apply(rec);
            if compact && file.wants_rewrite() {
                file.rewrite(&mem)?;
            }
            Ok(())
        })
        .await;
        match join {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StorageIOError::write_logs(AnyError::new(&e)).into()),
            Err(e) => Err(StorageIOError::write_logs(AnyError::new(&e)).into()),
        }
    }
}

fn read_range<RB: RangeBounds<u64>>(mem: &RwLock<LogMem>, range: RB) -> Vec<Entry<TypeConfig>> {
    let mem = mem.read().expect("log lock");
    mem.entries.range(range).map(|(_, e)| e.clone()).collect()
}

/// The entries a replication stream may send for a range beginning at `start`: those that
/// begin exactly there and follow one another, or none.
///
/// openraft 0.9.25's replication sends what its log reader returns right after the
/// `prev_log_id` it asked from, without checking the first index. A stream of a leader that
/// was deposed and then purged its log still runs for a while; reading a purged range, it got
/// the entries after the purge and sent them after a gap, and a follower still in that term
/// appended them (a hole in its log; in a debug build openraft's assertion in
/// `following_handler` stops it: the control simulation found it, `SIM_SEED=1032`). An empty
/// answer is taken as a heartbeat (openraft logs it and waits 10 ms) until the stream ends.
/// The store's own reads keep openraft's contract (entries not found are left out; its suite
/// reads past a purge so).
pub fn replicable<'a, E: Clone + 'a>(
    start: Bound<&u64>,
    entries: impl Iterator<Item = (&'a u64, &'a E)>,
) -> Vec<E> {
    let mut next = match start {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => Some(s + 1),
        Bound::Unbounded => None,
    };
    let mut out = Vec::new();
    for (&index, entry) in entries {
        if next.is_some_and(|n| n != index) {
            break;
        }
        out.push(entry.clone());
        next = Some(index + 1);
    }
    out
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + fmt::Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        let mem = self.mem.read().expect("log lock");
        Ok(replicable(
            range.start_bound(),
            mem.entries.range(range.clone()),
        ))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + fmt::Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        Ok(read_range(&self.mem, range))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let mem = self.mem.read().expect("log lock");
        let last = mem
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id)
            .or(mem.purged);
        Ok(LogState {
            last_purged_log_id: mem.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> LogReader {
        LogReader {
            mem: self.mem.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.persist(LogRecord::Vote { vote: *vote }, true).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.mem.read().expect("log lock").vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        // Not fsynced: a committed id older than the truth is always safe.
        self.persist(LogRecord::Committed { committed }, false)
            .await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.mem.read().expect("log lock").committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        if entries.is_empty() {
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        // Written now, fsynced by the flusher with whatever else is written meanwhile.
        if let Err(e) = self.persist(LogRecord::Append { entries }, false).await {
            callback.log_io_completed(Err(io::Error::other(e.to_string())));
            return Err(e);
        }
        let file = &self.file;
        let flushes = self.flushes.get_or_insert_with(|| flusher(file.clone()));
        if let Err(mpsc::error::SendError(callback)) = flushes.send(callback).await {
            // The flusher ended (its runtime is going away): flush here.
            let file = self.file.clone();
            let synced =
                tokio::task::spawn_blocking(move || file.lock().expect("log file lock").sync())
                    .await
                    .unwrap_or_else(|e| Err(io::Error::other(e.to_string())));
            callback.log_io_completed(synced);
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.persist(
            LogRecord::Truncate {
                since: log_id.index,
            },
            true,
        )
        .await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.persist(LogRecord::Purge { upto: log_id }, true).await
    }
}

// ---------------------------------------------------------------------------------------------
// State machine

/// A snapshot as stored: metadata and the serialized [`ControlState`].
#[derive(Debug, Clone)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, RaftNode>,
    data: Vec<u8>,
}

#[derive(Debug)]
struct SmInner {
    state: ControlState,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, RaftNode>,
    current: Option<StoredSnapshot>,
    snapshots_built: u64,
}

/// openraft's state machine: the [`ControlState`] in memory, snapshots in `raft-snapshot`.
///
/// Clone it to read the state from elsewhere ([`StateMachineStore::read`],
/// [`StateMachineStore::subscribe`]).
#[derive(Clone)]
pub struct StateMachineStore {
    dir: PathBuf,
    inner: Arc<RwLock<SmInner>>,
    applied: Arc<watch::Sender<u64>>,
}

/// Builds snapshots of the state machine (openraft runs it on its own task).
pub struct SnapshotBuilder {
    sm: StateMachineStore,
}

impl StateMachineStore {
    /// Opens the state machine in `dir`: the latest snapshot, or an empty state.
    pub fn open(dir: &Path) -> Result<StateMachineStore, StoreError> {
        fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
        let path = dir.join(SNAPSHOT_FILE);
        let tmp = path.with_extension("tmp");
        if tmp.exists() {
            fs::remove_file(&tmp).map_err(io_err("remove", &tmp))?;
        }
        let mut inner = SmInner {
            state: ControlState::default(),
            last_applied: None,
            membership: StoredMembership::default(),
            current: None,
            snapshots_built: 0,
        };
        if path.exists() {
            let buf = read_snapshot_file(&path)?;
            let snap = decode_snapshot_file(&path, &buf)?;
            let state = decode_state(&snap.data).map_err(|reason| StoreError::Corrupt {
                path: path.clone(),
                offset: 0,
                reason,
            })?;
            inner.state = state;
            inner.last_applied = snap.meta.last_log_id;
            inner.membership = snap.meta.last_membership.clone();
            inner.current = Some(snap);
        }
        let index = inner.last_applied.map_or(0, |l| l.index);
        let (tx, _) = watch::channel(index);
        Ok(StateMachineStore {
            dir: dir.to_owned(),
            inner: Arc::new(RwLock::new(inner)),
            applied: Arc::new(tx),
        })
    }

    /// Reads the current state under a lock (keep `f` short; it must not block).
    pub fn read<T>(&self, f: impl FnOnce(&ControlState) -> T) -> T {
        f(&self.inner.read().expect("state machine lock").state)
    }

    /// The last applied log id.
    pub fn last_applied(&self) -> Option<LogId<NodeId>> {
        self.inner.read().expect("state machine lock").last_applied
    }

    /// A receiver of the last applied log index; it changes after every applied batch and
    /// installed snapshot.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    fn persist_snapshot(&self, snap: &StoredSnapshot) -> Result<(), StoreError> {
        let meta = serde_json::to_vec(&snap.meta).expect("snapshot meta serializes");
        let mut buf = SNAPSHOT_MAGIC.to_vec();
        encode_frame(&meta, &mut buf);
        encode_frame(&snap.data, &mut buf);
        write_atomically(&self.dir, &self.dir.join(SNAPSHOT_FILE), &buf)
    }

    async fn persist_snapshot_blocking(
        &self,
        snap: StoredSnapshot,
    ) -> Result<StoredSnapshot, StorageError<NodeId>> {
        let sm = self.clone();
        let join =
            tokio::task::spawn_blocking(move || sm.persist_snapshot(&snap).map(|()| snap)).await;
        let signature = None;
        match join {
            Ok(Ok(snap)) => Ok(snap),
            Ok(Err(e)) => Err(StorageIOError::write_snapshot(signature, AnyError::new(&e)).into()),
            Err(e) => Err(StorageIOError::write_snapshot(signature, AnyError::new(&e)).into()),
        }
    }
}

fn decode_state(data: &[u8]) -> Result<ControlState, String> {
    if data.len() > SNAPSHOT_BYTES_MAX {
        return Err(format!(
            "snapshot of {} bytes over {SNAPSHOT_BYTES_MAX}",
            data.len()
        ));
    }
    serde_json::from_slice(data).map_err(|e| format!("undecodable control state: {e}"))
}

/// Reads the snapshot file, refusing one over [`SNAPSHOT_FILE_BYTES_MAX`] before reading
/// (and stopping there should it grow meanwhile).
fn read_snapshot_file(path: &Path) -> Result<Vec<u8>, StoreError> {
    use std::io::Read;
    let too_large = |len: u64| StoreError::Corrupt {
        path: path.to_owned(),
        offset: 0,
        reason: format!(
            "snapshot file of {len} bytes, over the limit of {SNAPSHOT_FILE_BYTES_MAX} bytes"
        ),
    };
    let file = File::open(path).map_err(io_err("open", path))?;
    let len = file.metadata().map_err(io_err("stat", path))?.len();
    if len > SNAPSHOT_FILE_BYTES_MAX {
        return Err(too_large(len));
    }
    let mut buf = Vec::with_capacity(len as usize);
    file.take(SNAPSHOT_FILE_BYTES_MAX + 1)
        .read_to_end(&mut buf)
        .map_err(io_err("read", path))?;
    if buf.len() as u64 > SNAPSHOT_FILE_BYTES_MAX {
        return Err(too_large(buf.len() as u64));
    }
    Ok(buf)
}

fn decode_snapshot_file(path: &Path, buf: &[u8]) -> Result<StoredSnapshot, StoreError> {
    let corrupt = |offset: usize, reason: String| StoreError::Corrupt {
        path: path.to_owned(),
        offset: offset as u64,
        reason,
    };
    if buf.len() < SNAPSHOT_MAGIC.len() || &buf[..SNAPSHOT_MAGIC.len()] != SNAPSHOT_MAGIC {
        return Err(corrupt(
            0,
            "not a ringleader raft snapshot (bad magic)".into(),
        ));
    }
    let frames = read_frames(buf, SNAPSHOT_MAGIC.len());
    // Written by rename after fsync: a snapshot file is never torn, any bad byte is damage.
    if let FrameEnd::Torn { offset, reason } | FrameEnd::Corrupt { offset, reason } = frames.end {
        return Err(corrupt(offset, reason));
    }
    let [(meta_at, meta), (_, data)] = frames.good[..] else {
        return Err(corrupt(
            SNAPSHOT_MAGIC.len(),
            format!("{} frames, expected 2", frames.good.len()),
        ));
    };
    let meta = serde_json::from_slice(meta)
        .map_err(|e| corrupt(meta_at, format!("undecodable snapshot meta: {e}")))?;
    Ok(StoredSnapshot {
        meta,
        data: data.to_vec(),
    })
}

fn to_snapshot(s: &StoredSnapshot) -> Snapshot<TypeConfig> {
    Snapshot {
        meta: s.meta.clone(),
        snapshot: Box::new(Cursor::new(s.data.clone())),
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let snap = {
            let mut inner = self.sm.inner.write().expect("state machine lock");
            inner.snapshots_built += 1;
            let data = serde_json::to_vec(&inner.state).expect("control state serializes");
            let snapshot_id = match inner.last_applied {
                Some(l) => format!("{l}-{}", inner.snapshots_built),
                None => format!("none-{}", inner.snapshots_built),
            };
            let meta = SnapshotMeta {
                last_log_id: inner.last_applied,
                last_membership: inner.membership.clone(),
                snapshot_id,
            };
            StoredSnapshot { meta, data }
        };
        let snap = self.sm.persist_snapshot_blocking(snap).await?;
        let out = to_snapshot(&snap);
        let mut inner = self.sm.inner.write().expect("state machine lock");
        // A snapshot installed meanwhile may be newer; keep the newest.
        if inner
            .current
            .as_ref()
            .is_none_or(|c| c.meta.last_log_id <= snap.meta.last_log_id)
        {
            inner.current = Some(snap);
        }
        Ok(out)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, RaftNode>), StorageError<NodeId>>
    {
        let inner = self.inner.read().expect("state machine lock");
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ControlResponse>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        let index = {
            let mut inner = self.inner.write().expect("state machine lock");
            for entry in entries {
                inner.last_applied = Some(entry.log_id);
                let resp = match entry.payload {
                    EntryPayload::Blank => ControlResponse::Empty,
                    EntryPayload::Normal(cmd) => inner.state.apply(entry.log_id.index, &cmd),
                    EntryPayload::Membership(m) => {
                        inner.membership = StoredMembership::new(Some(entry.log_id), m);
                        ControlResponse::Empty
                    }
                };
                out.push(resp);
            }
            inner.last_applied.map_or(0, |l| l.index)
        };
        self.applied.send_replace(index);
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder { sm: self.clone() }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, RaftNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        let state = decode_state(&data).map_err(|reason| {
            StorageIOError::read_snapshot(Some(meta.signature()), AnyError::error(reason))
        })?;
        let snap = self
            .persist_snapshot_blocking(StoredSnapshot {
                meta: meta.clone(),
                data,
            })
            .await?;
        let index = {
            let mut inner = self.inner.write().expect("state machine lock");
            inner.state = state;
            inner.last_applied = meta.last_log_id;
            inner.membership = meta.last_membership.clone();
            inner.current = Some(snap);
            inner.last_applied.map_or(0, |l| l.index)
        };
        self.applied.send_replace(index);
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        Ok(self
            .inner
            .read()
            .expect("state machine lock")
            .current
            .as_ref()
            .map(to_snapshot))
    }
}

/// Opens both halves of the store in `dir`.
pub fn open(dir: &Path) -> Result<(LogStore, StateMachineStore), StoreError> {
    Ok((LogStore::open(dir)?, StateMachineStore::open(dir)?))
}

#[cfg(test)]
mod tests;
