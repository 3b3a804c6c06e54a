//! A dataset's manifest: its files, their sizes, the hash of every chunk, and its root.
//!
//! Invariants, held by every [`Manifest`] value (checked by [`Manifest::new`], which
//! [`Manifest::build`] and [`Manifest::decode`] go through; the fields are private):
//!
//! - `chunk_bytes` is within [`CHUNK_BYTES_MIN`]`..=`[`CHUNK_BYTES_MAX`];
//! - there are 1 to [`FILES_MAX`] files, sorted by path (byte order), no path twice and no
//!   path below another file's path;
//! - every path is relative, `/`-separated, without `.`, `..` or empty components,
//!   backslashes or control characters, and at most [`PATH_BYTES_MAX`] bytes;
//! - a file of `size` bytes lists `ceil(size / chunk_bytes)` chunk hashes; chunk `i` covers
//!   bytes `i * chunk_bytes ..` up to `chunk_bytes` of them, so the chunks tile the file;
//! - the canonical encoding ([`Manifest::encode`]) is at most [`MANIFEST_BYTES_MAX`] bytes,
//!   so every manifest built here can be decoded by every peer.
//!
//! The canonical encoding is compact JSON: `{"chunk_bytes":N,"files":[{"path":"..",
//! "size":N,"chunks":["<64 hex>",..]},..]}`, files in path order, hashes in lowercase hex.
//! [`Manifest::root`] is its BLAKE3 hash, so `b3sum manifest.json` gives the root of a
//! manifest stored in canonical form. Changing the encoding changes every root.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::roots::{Access, HostAccess};
use super::DatasetError;

/// The chunk size of large datasets, in bytes (4 MiB); see [`chunk_bytes_for`].
pub const CHUNK_BYTES_DEFAULT: u32 = 4 << 20;
/// Up to this many chunks a dataset gets the smallest chunk size that stays under it
/// ([`chunk_bytes_for`]).
pub const CHUNKS_PREFERRED_MAX: u64 = 65_536;

/// The chunk size for a dataset of `total_bytes`: the smallest of 1, 2 and 4 MiB that keeps
/// it within [`CHUNKS_PREFERRED_MAX`] chunks (so up to 64 GiB in 1 MiB chunks), else 4 MiB.
/// Measured (`scripts/bench-datasets.sh`, 3 holders capped at 300 Mbit/s, 512 MiB): 1 MiB
/// chunks reach 0.96 of iperf3's goodput against 0.94 for 4 MiB, since the last chunks in
/// flight, which only some holders serve, are smaller; larger chunks keep the manifest of a
/// large dataset small (a chunk costs about 70 bytes of it).
pub fn chunk_bytes_for(total_bytes: u64) -> u32 {
    [1u32 << 20, 2 << 20, 4 << 20]
        .into_iter()
        .find(|&c| total_bytes.div_ceil(u64::from(c)) <= CHUNKS_PREFERRED_MAX)
        .unwrap_or(CHUNK_BYTES_DEFAULT)
}

/// The bytes of the regular files at `path` (a file, or every file below a directory),
/// from their metadata: what [`chunk_bytes_for`] needs before anything is read.
/// Looked at with `access`'s file access.
pub fn source_bytes(path: &Path, access: &HostAccess) -> Result<u64, DatasetError> {
    let meta = source_metadata(path, access)?;
    if meta.is_dir() {
        Ok(list_files(path, access)?.iter().map(|s| s.size).sum())
    } else {
        Ok(meta.len())
    }
}
/// The smallest chunk size a manifest may use, in bytes (1 MiB).
pub const CHUNK_BYTES_MIN: u32 = 1 << 20;
/// The largest chunk size a manifest may use, in bytes (4 MiB): one chunk is one transfer
/// and one buffer, so this bounds the memory a chunk in flight takes.
pub const CHUNK_BYTES_MAX: u32 = 4 << 20;
/// The most files one dataset may hold.
pub const FILES_MAX: usize = 100_000;
/// The largest manifest encoding accepted, in bytes (16 MiB): about 250,000 chunks, some
/// 1 TiB of data at the default chunk size.
pub const MANIFEST_BYTES_MAX: usize = 16 << 20;
/// The longest file path in a dataset, in bytes.
pub const PATH_BYTES_MAX: usize = 4096;

/// A chunk hash's share of the canonical encoding at least, in bytes: 64 hex digits and
/// two quotes (most also have a comma). Used to refuse an oversized dataset before reading it.
const CHUNK_ENCODED_BYTES_MIN: u64 = 66;
/// How much of an overlong path an error keeps, in bytes.
const PATH_IN_ERROR_BYTES_MAX: usize = 256;

pub use crate::domain::content::{ChunkHash, Root};

/// One file of a dataset, as listed in its manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Where the file lies in the dataset: relative, `/`-separated (the file's own name for a
    /// dataset of one file).
    pub path: String,
    /// Its length in bytes.
    pub size: u64,
    /// The hash of each chunk, in order: `ceil(size / chunk_bytes)` of them.
    pub chunks: Vec<ChunkHash>,
}

/// A dataset's manifest; see the [module documentation](self) for the invariants every
/// value holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Manifest {
    // The field order is the canonical encoding's: do not reorder.
    chunk_bytes: u32,
    files: Vec<FileEntry>,
}

/// What [`Manifest::decode`] parses, before [`Manifest::new`] checks it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestWire {
    chunk_bytes: u32,
    files: Vec<FileEntry>,
}

impl Manifest {
    /// A manifest of these files, sorted by path, once every invariant is checked.
    pub fn new(chunk_bytes: u32, mut files: Vec<FileEntry>) -> Result<Self, DatasetError> {
        check_chunk_bytes(chunk_bytes)?;
        if files.is_empty() {
            return Err(DatasetError::NoFiles);
        }
        if files.len() > FILES_MAX {
            return Err(DatasetError::TooManyFiles { max: FILES_MAX });
        }
        for file in &files {
            check_path(&file.path).map_err(|reason| DatasetError::UnsafePath {
                path: path_for_error(&file.path),
                reason,
            })?;
            let expected = file.size.div_ceil(u64::from(chunk_bytes));
            if file.chunks.len() as u64 != expected {
                return Err(DatasetError::ChunkCountMismatch {
                    path: file.path.clone(),
                    size: file.size,
                    chunks: file.chunks.len(),
                    expected,
                });
            }
        }
        files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
        check_tree(&files)?;
        let manifest = Self { chunk_bytes, files };
        let bytes = manifest.encoded_bytes();
        if bytes > MANIFEST_BYTES_MAX as u64 {
            return Err(DatasetError::ManifestTooLarge {
                bytes,
                max: MANIFEST_BYTES_MAX,
            });
        }
        Ok(manifest)
    }

    /// The manifest of a local file or directory, reading every file once in `chunk_bytes`
    /// pieces (one buffer of that size, whatever the dataset's size).
    ///
    /// A file gives a one-file dataset named by its file name. A directory gives every regular
    /// file below it, recursively, with paths relative to it; empty directories are not
    /// recorded, and a directory without any file is [`DatasetError::EmptyDirectory`].
    ///
    /// Nothing is read through a symbolic link, so a dataset never holds bytes from outside
    /// the file or directory named: `path` itself may not be one (its parent directories
    /// may: they are the operator's), and a symbolic link below it is refused even when it
    /// points inside (simpler to reason about than containment, and a dataset is a copy, so
    /// nothing is lost by copying the target instead). Links, FIFOs, sockets and devices are
    /// refused ([`DatasetError::UnsupportedFile`]), not skipped: a dataset silently missing
    /// files would be worse. Every file is opened without following a link
    /// (`O_NOFOLLOW`) and must be the very file listed (same device and inode), so one
    /// swapped for a link or another file after listing is refused
    /// ([`DatasetError::ChangedWhileAdding`]). A file's size is what was read, so a file
    /// growing while it is read gives a consistent (if mixed) entry.
    pub fn build(path: &Path, chunk_bytes: u32) -> Result<Self, DatasetError> {
        Manifest::build_as(path, chunk_bytes, &HostAccess::node())
    }

    /// [`Manifest::build`] for a request: every directory listed and every file opened with
    /// `access`'s file access, and every file opened checked against its roots where it is
    /// ([`HostAccess::check_open`]).
    pub fn build_as(
        path: &Path,
        chunk_bytes: u32,
        access: &HostAccess,
    ) -> Result<Self, DatasetError> {
        check_chunk_bytes(chunk_bytes)?;
        let meta = source_metadata(path, access)?;
        let sources = if meta.is_dir() {
            let sources = list_files(path, access)?;
            // The directory listed must still be the one named (not swapped for a link to
            // another meanwhile); each file is checked again when it is opened.
            let again = source_metadata(path, access)?;
            if (again.dev(), again.ino()) != (meta.dev(), meta.ino()) {
                return Err(DatasetError::ChangedWhileAdding {
                    path: path.to_path_buf(),
                });
            }
            if sources.is_empty() {
                return Err(DatasetError::EmptyDirectory {
                    path: path.to_path_buf(),
                });
            }
            sources
        } else if meta.is_file() {
            let name = path.file_name().ok_or_else(|| DatasetError::UnsafePath {
                path: path.display().to_string(),
                reason: "no file name",
            })?;
            let name = name.to_str().ok_or_else(|| DatasetError::NonUtf8Path {
                path: path.to_path_buf(),
            })?;
            vec![Source {
                path: name.to_owned(),
                local: path.to_path_buf(),
                size: meta.len(),
                id: (meta.dev(), meta.ino()),
            }]
        } else {
            return Err(DatasetError::UnsupportedFile {
                path: path.to_path_buf(),
                kind: kind_name(meta.file_type()),
            });
        };

        // Refuse a dataset whose manifest would be too large before hashing terabytes.
        let chunks: u64 = sources
            .iter()
            .map(|source| source.size.div_ceil(u64::from(chunk_bytes)))
            .sum();
        let bytes = chunks.saturating_mul(CHUNK_ENCODED_BYTES_MIN);
        if bytes > MANIFEST_BYTES_MAX as u64 {
            return Err(DatasetError::ManifestTooLarge {
                bytes,
                max: MANIFEST_BYTES_MAX,
            });
        }

        let mut buf = vec![0u8; chunk_bytes as usize];
        let files = sources
            .into_iter()
            .map(|source| hash_file(source, &mut buf, access))
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(chunk_bytes, files)
    }

    /// A manifest from a peer's bytes, every invariant checked; the size limit before parsing.
    ///
    /// Any JSON layout of the right fields is accepted (files in any order, hex in either
    /// case); the root is always that of the canonical re-encoding, so check a fetched
    /// manifest with `Manifest::decode(bytes)?.root() == wanted`.
    pub fn decode(bytes: &[u8]) -> Result<Self, DatasetError> {
        if bytes.len() > MANIFEST_BYTES_MAX {
            return Err(DatasetError::ManifestTooLarge {
                bytes: bytes.len() as u64,
                max: MANIFEST_BYTES_MAX,
            });
        }
        let wire: ManifestWire = serde_json::from_slice(bytes).map_err(DatasetError::Malformed)?;
        Self::new(wire.chunk_bytes, wire.files)
    }

    /// The canonical encoding: compact JSON, files in path order, at most
    /// [`MANIFEST_BYTES_MAX`] bytes.
    pub fn encode(&self) -> Vec<u8> {
        // Serialising plain structs of strings and integers into memory cannot fail.
        serde_json::to_vec(self).expect("a manifest serialises")
    }

    /// The dataset's name: the BLAKE3 hash of [`encode`](Self::encode)'s bytes.
    pub fn root(&self) -> Root {
        Root::from(blake3::hash(&self.encode()))
    }

    /// The chunk size, in bytes; every chunk but a file's last is this long.
    pub fn chunk_bytes(&self) -> u32 {
        self.chunk_bytes
    }

    /// The files, sorted by path; a file's index here is what the chunk methods take.
    pub fn files(&self) -> &[FileEntry] {
        &self.files
    }

    /// The index of the file at `path`, if the dataset has one.
    pub fn file_index(&self, path: &str) -> Option<usize> {
        self.files
            .binary_search_by(|file| file.path.as_str().cmp(path))
            .ok()
    }

    /// The dataset's size: all files' bytes.
    pub fn total_bytes(&self) -> u64 {
        // Cannot overflow: each size is at most its chunk count times `chunk_bytes`, and the
        // chunk count is bounded by the manifest's size.
        self.files.iter().map(|file| file.size).sum()
    }

    /// How many chunks the dataset has, all files together.
    pub fn chunk_count(&self) -> usize {
        self.files.iter().map(|file| file.chunks.len()).sum()
    }

    /// Where chunk `chunk_index` of file `file_index` lies in that file: (offset in bytes,
    /// length in bytes). The length is `chunk_bytes` except for a file's last chunk, and
    /// never 0; the chunks of a file tile it exactly.
    pub fn chunk_range(
        &self,
        file_index: usize,
        chunk_index: usize,
    ) -> Result<(u64, u32), DatasetError> {
        let no_such = || DatasetError::NoSuchChunk {
            file_index,
            chunk_index,
        };
        let file = self.files.get(file_index).ok_or_else(no_such)?;
        if chunk_index >= file.chunks.len() {
            return Err(no_such());
        }
        let offset = chunk_index as u64 * u64::from(self.chunk_bytes);
        // The chunk count is ceil(size / chunk_bytes), so offset < size here.
        debug_assert!(offset < file.size);
        let len = (file.size - offset).min(u64::from(self.chunk_bytes)) as u32;
        Ok((offset, len))
    }

    /// Checks a chunk received for file `file_index`, chunk `chunk_index`: its length must be
    /// the one [`chunk_range`](Self::chunk_range) gives ([`DatasetError::ChunkLength`]) and
    /// its BLAKE3 hash the manifest's ([`DatasetError::CorruptChunk`]). Only a chunk that
    /// passes may be written, used or served to other peers.
    pub fn verify_chunk(
        &self,
        file_index: usize,
        chunk_index: usize,
        bytes: &[u8],
    ) -> Result<(), DatasetError> {
        let (_, len) = self.chunk_range(file_index, chunk_index)?;
        let file = &self.files[file_index];
        if bytes.len() != len as usize {
            return Err(DatasetError::ChunkLength {
                path: file.path.clone(),
                index: chunk_index,
                expected: len,
                actual: bytes.len(),
            });
        }
        // blake3::Hash compares in constant time; not needed here, but free.
        let expected = blake3::Hash::from_bytes(file.chunks[chunk_index].0);
        if blake3::hash(bytes) != expected {
            return Err(DatasetError::CorruptChunk {
                path: file.path.clone(),
                index: chunk_index,
            });
        }
        Ok(())
    }

    /// The canonical encoding's length, without building it.
    fn encoded_bytes(&self) -> u64 {
        let mut counter = ByteCounter(0);
        serde_json::to_writer(&mut counter, self).expect("a manifest serialises");
        counter.0
    }
}

/// An `io::Write` that only counts.
struct ByteCounter(u64);

impl io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A local file to hash: its dataset path, where it is, its size when listed.
struct Source {
    path: String,
    local: PathBuf,
    size: u64,
    /// The listed file's device and inode: what is opened must be this file.
    id: (u64, u64),
}

/// The metadata of the file or directory an add names, without following a symbolic link
/// at `path` itself (refused: see [`Manifest::build`]).
fn source_metadata(path: &Path, access: &HostAccess) -> Result<fs::Metadata, DatasetError> {
    let meta = access
        .acting(|| fs::symlink_metadata(path))
        .map_err(io_error(path))?;
    if meta.file_type().is_symlink() {
        return Err(DatasetError::UnsupportedFile {
            path: path.to_path_buf(),
            kind: kind_name(meta.file_type()),
        });
    }
    Ok(meta)
}

/// Opens a file being added for reading: never through a symbolic link at its place
/// (`O_NOFOLLOW`), never blocking on a FIFO swapped in (`O_NONBLOCK`, no effect on a regular
/// file), and only if it is a regular file whose device and inode are `id` (the listed
/// file), else [`DatasetError::ChangedWhileAdding`] or [`DatasetError::UnsupportedFile`].
/// `id` `None` checks only that it is a regular file.
/// The file is opened with `access`'s file access and checked where it is
/// ([`HostAccess::check_open`]).
pub(super) fn open_source(
    path: &Path,
    id: Option<(u64, u64)>,
    access: &HostAccess,
) -> Result<File, DatasetError> {
    let file = access
        .acting(|| {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(path)
        })
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ELOOP) => DatasetError::UnsupportedFile {
                path: path.to_path_buf(),
                kind: "symlink",
            },
            _ => DatasetError::Io {
                path: path.to_path_buf(),
                source,
            },
        })?;
    let meta = file.metadata().map_err(io_error(path))?;
    if !meta.is_file() {
        return Err(DatasetError::UnsupportedFile {
            path: path.to_path_buf(),
            kind: kind_name(meta.file_type()),
        });
    }
    if id.is_some_and(|id| id != (meta.dev(), meta.ino())) {
        return Err(DatasetError::ChangedWhileAdding {
            path: path.to_path_buf(),
        });
    }
    access.check_open(Access::Read, file.as_fd(), path)?;
    Ok(file)
}

fn check_chunk_bytes(chunk_bytes: u32) -> Result<(), DatasetError> {
    if (CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX).contains(&chunk_bytes) {
        Ok(())
    } else {
        Err(DatasetError::ChunkBytesOutOfRange { chunk_bytes })
    }
}

/// Whether `path` is a safe relative dataset path; if not, why.
fn check_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("empty");
    }
    if path.len() > PATH_BYTES_MAX {
        return Err("longer than PATH_BYTES_MAX (4096 bytes)");
    }
    if path.starts_with('/') {
        return Err("absolute");
    }
    if path.contains('\\') {
        return Err("backslash");
    }
    if path.chars().any(char::is_control) {
        return Err("NUL or other control character");
    }
    for component in path.split('/') {
        match component {
            "" => return Err("empty component"),
            "." => return Err("`.` component"),
            ".." => return Err("`..` component"),
            _ => {}
        }
    }
    Ok(())
}

/// Checks sorted files for a path listed twice or below another file's path.
fn check_tree(files: &[FileEntry]) -> Result<(), DatasetError> {
    for pair in files.windows(2) {
        if pair[0].path == pair[1].path {
            return Err(DatasetError::DuplicatePath {
                path: pair[0].path.clone(),
            });
        }
    }
    // Paths below `a` start with `a/` and, sorted, lie together (not always right after `a`:
    // `a.txt` sorts between). A binary search per file: O(n log n) comparisons, each at
    // most one path long, whatever a hostile manifest holds.
    for (i, file) in files.iter().enumerate() {
        let prefix = format!("{}/", file.path);
        let rest = &files[i + 1..];
        let at = rest.partition_point(|other| other.path < prefix);
        if let Some(below) = rest.get(at).filter(|other| other.path.starts_with(&prefix)) {
            return Err(DatasetError::PathConflict {
                path: below.path.clone(),
                file: file.path.clone(),
            });
        }
    }
    Ok(())
}

/// At most [`PATH_IN_ERROR_BYTES_MAX`] bytes of `path`, cut on a character boundary.
fn path_for_error(path: &str) -> String {
    if path.len() <= PATH_IN_ERROR_BYTES_MAX {
        return path.to_owned();
    }
    let mut end = PATH_IN_ERROR_BYTES_MAX;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &path[..end])
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> DatasetError + '_ {
    move |source| DatasetError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn kind_name(kind: fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_symlink() {
        "symlink"
    } else if kind.is_fifo() {
        "fifo"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_block_device() {
        "block device"
    } else if kind.is_char_device() {
        "char device"
    } else {
        "unknown"
    }
}

/// Every regular file below `dir`, sorted by dataset path; anything else but a directory is
/// refused. Paths and the file count are checked against their limits while walking, so a
/// huge tree is refused early.
fn list_files(dir: &Path, access: &HostAccess) -> Result<Vec<Source>, DatasetError> {
    access
        .acting(|| Ok(list_files_here(dir)))
        .map_err(io_error(dir))?
}

/// [`list_files`] with this thread's file access.
fn list_files_here(dir: &Path) -> Result<Vec<Source>, DatasetError> {
    let mut files = Vec::new();
    // An explicit stack: the depth of a tree is the operator's, not the thread stack's.
    let mut dirs = vec![(String::new(), dir.to_path_buf())];
    while let Some((prefix, dir)) = dirs.pop() {
        for entry in fs::read_dir(&dir).map_err(io_error(&dir))? {
            let entry = entry.map_err(io_error(&dir))?;
            let local = entry.path();
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                return Err(DatasetError::NonUtf8Path { path: local });
            };
            let path = if prefix.is_empty() {
                name.to_owned()
            } else {
                format!("{prefix}/{name}")
            };
            check_path(&path).map_err(|reason| DatasetError::UnsafePath {
                path: path_for_error(&path),
                reason,
            })?;
            // `DirEntry::file_type` does not follow symbolic links.
            let kind = entry.file_type().map_err(io_error(&local))?;
            if kind.is_dir() {
                dirs.push((path, local));
            } else if kind.is_file() {
                // `DirEntry::metadata` does not follow symbolic links either.
                let meta = entry.metadata().map_err(io_error(&local))?;
                files.push(Source {
                    path,
                    local,
                    size: meta.len(),
                    id: (meta.dev(), meta.ino()),
                });
                if files.len() > FILES_MAX {
                    return Err(DatasetError::TooManyFiles { max: FILES_MAX });
                }
            } else {
                return Err(DatasetError::UnsupportedFile {
                    path: local,
                    kind: kind_name(kind),
                });
            }
        }
    }
    files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// Reads `source` in `buf.len()` pieces, hashing each.
fn hash_file(
    source: Source,
    buf: &mut [u8],
    access: &HostAccess,
) -> Result<FileEntry, DatasetError> {
    let mut file = open_source(&source.local, Some(source.id), access)?;
    let mut size = 0u64;
    let mut chunks = Vec::new();
    loop {
        let n = fill(&mut file, buf).map_err(io_error(&source.local))?;
        if n == 0 {
            break;
        }
        chunks.push(ChunkHash::from(blake3::hash(&buf[..n])));
        size += n as u64;
        if n < buf.len() {
            break;
        }
    }
    Ok(FileEntry {
        path: source.path,
        size,
        chunks,
    })
}

/// Reads until `buf` is full or the file ends; how many bytes were read.
fn fill(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests;
