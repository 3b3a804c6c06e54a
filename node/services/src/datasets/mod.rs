//! Datasets shared peer to peer, named by their content.
//!
//! A dataset is a file or a directory tree cut into fixed-size chunks. Its [`Manifest`]
//! lists every file (relative path, size) and the BLAKE3 hash of each chunk; the dataset's
//! name is the manifest's [`Root`], the BLAKE3 hash of the manifest's canonical encoding.
//! Trust flows down from the root: whoever knows the root can check a manifest fetched from
//! any peer (`Manifest::decode(bytes)?.root() == root`), and the manifest then checks every
//! chunk fetched from any peer ([`Manifest::verify_chunk`]) before it is used or passed on.
//! Nothing a peer sends is trusted until it has passed one of these checks.
//!
//! Chunks are hashed whole, not as a verified-streaming tree (iroh-blobs' BAO): a chunk is
//! the unit of transfer and at most 4 MiB, so checking it once it has arrived is enough,
//! and the manifest stays a plain list that `b3sum` can check.
//!
//! - [`manifest`]: the manifest, its limits, building one from local files, decoding one
//!   from a peer (every field checked), chunk ranges and chunk verification.
//! - [`store`]: the copies on disk — whole ones, fetches under way (`.part`, resumable),
//!   adds being copied in.
//! - [`export`]: `get --to DIR`, the files written in place under `DIR` as verified chunks
//!   arrive, each renamed to its path once all of it is in (a whole copy already in the
//!   store is copied, a reflink where the file system offers one; never a hard link).
//! - [`confined`]: the directory `get --to` writes under, walked without following a
//!   symbolic link, so a link planted there cannot redirect a write.
//!
//! Files and links: an add reads nothing through a symbolic link (the path named may not
//! be one, and none below it is followed) and refuses special files; the store's copies get
//! at most the source's permission bits (fetched ones 0600), never wider; `get --to` never
//! writes through a link ([`confined`]).
//! - [`fs_user`]: file access as another user for one call on one thread (`setfsuid`):
//!   what an add's reads and a `get --to`'s writes take under `--run-as`.
//! - [`roots`]: which host paths an add may read and a `get --to` may write, by token
//!   (`--dataset-source`, `--dataset-dest`, the paths refused to every token), checked on the
//!   descriptors actually opened, with the `--run-as` user's file access.
//! - [`transport`]: TCP connections authenticated with the cluster key, and the
//!   request/answer messages on them.
//! - [`serve`]: what this node holds and the server giving it to peers, with the rate cap
//!   that makes dataset traffic yield to a job's ring.
//! - [`fetch`]: the multi-source fetch (scheduler, one task per holder).
//! - [`service`]: the node's entry point — add, get, ls, rm; gossip of holdings; deleting
//!   content no name refers to.
//!
//! The registry of names is in the control state (`domain::state::datasets`); which members hold
//! what travels in member metadata (`cluster::meta::HeldDataset`).
//!
//! [`DatasetError`] is the room's error: the operator's files (I/O, unsupported files),
//! a peer's bad manifest, a peer's bad chunk.
//!
//! May use: `cluster` (member view, metadata, wire codec, the cluster key), `control` (the
//! registry, proposing), `domain::spec` (what a job is). Used by: the node, `api`, `jobs`'
//! supervisor (a train worker's dataset).

use std::io;
use std::path::PathBuf;

pub mod confined;
pub mod export;
pub mod fetch;
pub mod fs_user;
pub mod manifest;
pub mod roots;
pub mod serve;
pub mod service;
pub mod store;
pub mod transport;

pub use service::{DatasetDoc, Datasets, DatasetsConfig, DatasetsError};

pub use manifest::{
    ChunkHash, FileEntry, Manifest, Root, CHUNK_BYTES_DEFAULT, CHUNK_BYTES_MAX, CHUNK_BYTES_MIN,
    FILES_MAX, MANIFEST_BYTES_MAX, PATH_BYTES_MAX,
};

pub use crate::domain::state::datasets::{check_name, BUILTIN, NAME_BYTES_MAX};

/// Why a dataset could not be built, decoded or checked.
///
/// Building reads the operator's files: [`Io`](Self::Io), [`UnsupportedFile`](Self::UnsupportedFile),
/// [`NonUtf8Path`](Self::NonUtf8Path) and [`EmptyDirectory`](Self::EmptyDirectory) are theirs
/// to fix. Decoding and verifying read what a peer sent: those errors mean the peer's data is
/// bad (corrupt or hostile), and fetching the same thing from the same peer again will not help.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// Reading a local file or directory failed.
    #[error("reading {}: {source}", path.display())]
    Io {
        /// The file or directory being read.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// A dataset holds only regular files and directories; symbolic links (refused, not
    /// followed, so a dataset never reaches outside its directory: the path added itself
    /// included, and one below it even when it points inside), FIFOs, sockets and devices
    /// are refused.
    #[error("{}: a {kind}, only regular files and directories can be shared", path.display())]
    UnsupportedFile {
        /// The offending entry.
        path: PathBuf,
        /// What it is: `symlink`, `fifo`, `socket`, `block device`, `char device`, `unknown`.
        kind: &'static str,
    },
    /// A file name is not UTF-8, so it has no portable `/`-separated path.
    #[error("{}: file name is not utf-8", path.display())]
    NonUtf8Path {
        /// The offending entry.
        path: PathBuf,
    },
    /// The directory holds no regular file, even in its subdirectories.
    #[error("{}: no files to share", path.display())]
    EmptyDirectory {
        /// The directory.
        path: PathBuf,
    },
    /// The manifest lists no files.
    #[error("manifest lists no files")]
    NoFiles,
    /// More files than [`FILES_MAX`].
    #[error("files: more than {max}")]
    TooManyFiles {
        /// The limit, [`FILES_MAX`].
        max: usize,
    },
    /// The manifest's encoding is (or, when building, would be) over [`MANIFEST_BYTES_MAX`].
    #[error("manifest: {bytes} bytes, more than {max}")]
    ManifestTooLarge {
        /// Its size in bytes (when building, a lower bound reckoned before reading files).
        bytes: u64,
        /// The limit, [`MANIFEST_BYTES_MAX`].
        max: usize,
    },
    /// The manifest is not the expected JSON (syntax, a missing or unknown field, a hash
    /// that is not 64 hex digits).
    #[error("malformed manifest: {0}")]
    Malformed(#[source] serde_json::Error),
    /// `chunk_bytes` is outside [`CHUNK_BYTES_MIN`]`..=`[`CHUNK_BYTES_MAX`].
    #[error("chunk_bytes: {chunk_bytes} is outside {CHUNK_BYTES_MIN}..={CHUNK_BYTES_MAX}")]
    ChunkBytesOutOfRange {
        /// The value given.
        chunk_bytes: u32,
    },
    /// A path that could escape the dataset's directory or is not portable: empty, absolute,
    /// a `.`, `..` or empty component, a backslash, a NUL or other control character, or
    /// longer than [`PATH_BYTES_MAX`].
    #[error("path {path:?}: {reason}")]
    UnsafePath {
        /// The path (its first 256 bytes when it is longer).
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Two files with the same path.
    #[error("path {path:?}: listed twice")]
    DuplicatePath {
        /// The path.
        path: String,
    },
    /// A path below another file's path (`a` and `a/b`): no directory tree holds both.
    #[error("path {path:?}: below {file:?}, which is a file")]
    PathConflict {
        /// The path below.
        path: String,
        /// The file above it.
        file: String,
    },
    /// A file's chunk count is not `ceil(size / chunk_bytes)` (0 for an empty file).
    #[error("path {path:?}: {chunks} chunks for {size} bytes, expected {expected}")]
    ChunkCountMismatch {
        /// The file.
        path: String,
        /// Its size in bytes.
        size: u64,
        /// How many chunk hashes it lists.
        chunks: usize,
        /// How many it should list.
        expected: u64,
    },
    /// No such file index, or no such chunk in that file.
    #[error("file {file_index} chunk {chunk_index}: no such chunk")]
    NoSuchChunk {
        /// The file index asked for.
        file_index: usize,
        /// The chunk index asked for.
        chunk_index: usize,
    },
    /// A chunk whose length is not the manifest's for that chunk (short or long).
    #[error("path {path:?} chunk {index}: {actual} bytes, expected {expected}")]
    ChunkLength {
        /// The file.
        path: String,
        /// The chunk's index in the file.
        index: usize,
        /// The length the manifest gives, in bytes.
        expected: u32,
        /// The length received, in bytes.
        actual: usize,
    },
    /// A manifest whose root is not the one asked for.
    #[error("manifest does not hash to the dataset's root")]
    RootMismatch,
    /// A file being added changed between hashing and copying.
    #[error("{}: changed while being added; add it again once it is stable", path.display())]
    ChangedWhileAdding {
        /// The file.
        path: PathBuf,
    },
    /// `--to` names a file that exists with other bytes.
    #[error("{}: exists with other content; remove it or choose another --to", path.display())]
    ExportExists {
        /// The file.
        path: PathBuf,
    },
    /// `--to` would write through a symbolic link (at the directory itself, a directory
    /// below it or a file's place) or through something else than a directory: refused,
    /// never followed or replaced, so a link planted there cannot redirect the write.
    #[error("{}: a {kind} where --to writes; it is never followed or replaced: remove it or choose another --to", path.display())]
    ExportBlocked {
        /// The link, file or other thing in the way.
        path: PathBuf,
        /// What it is: `symlink`, `file`, `directory`, `fifo`, …
        kind: &'static str,
    },
    /// The path is outside what this request may read or write on the host
    /// ([`roots`]): refused, nothing read or written there.
    #[error(transparent)]
    Refused(#[from] roots::RootsError),
    /// A chunk whose BLAKE3 hash is not the manifest's: corrupt or forged, never to be used.
    #[error("path {path:?} chunk {index}: hash does not match the manifest")]
    CorruptChunk {
        /// The file.
        path: String,
        /// The chunk's index in the file.
        index: usize,
    },
}

impl DatasetError {
    /// Whether this is a write that found the disk full (`ENOSPC`, which the standard
    /// library reads as [`std::io::ErrorKind::StorageFull`]): said as "disk full" to the
    /// operator, who frees space and tries again.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, DatasetError::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull)
    }
}
