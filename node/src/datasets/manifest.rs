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
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
pub fn source_bytes(path: &Path) -> Result<u64, DatasetError> {
    let meta = source_metadata(path)?;
    if meta.is_dir() {
        Ok(list_files(path)?.iter().map(|s| s.size).sum())
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
        check_chunk_bytes(chunk_bytes)?;
        let meta = source_metadata(path)?;
        let sources = if meta.is_dir() {
            let sources = list_files(path)?;
            // The directory listed must still be the one named (not swapped for a link to
            // another meanwhile); each file is checked again when it is opened.
            let again = source_metadata(path)?;
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
            .map(|source| hash_file(source, &mut buf))
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
fn source_metadata(path: &Path) -> Result<fs::Metadata, DatasetError> {
    let meta = fs::symlink_metadata(path).map_err(io_error(path))?;
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
pub(super) fn open_source(path: &Path, id: Option<(u64, u64)>) -> Result<File, DatasetError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
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
fn list_files(dir: &Path) -> Result<Vec<Source>, DatasetError> {
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
fn hash_file(source: Source, buf: &mut [u8]) -> Result<FileEntry, DatasetError> {
    let mut file = open_source(&source.local, Some(source.id))?;
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
mod tests {
    use std::io::Write;

    use proptest::prelude::*;

    use super::*;

    const MIB: u32 = 1 << 20;

    fn write(dir: &Path, path: &str, bytes: &[u8]) {
        let path = dir.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        File::create(path).unwrap().write_all(bytes).unwrap();
    }

    /// Deterministic bytes without repeats (no two chunks alike), different per seed.
    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        let mut out = vec![0; len];
        blake3::Hasher::new()
            .update(&[seed])
            .finalize_xof()
            .fill(&mut out);
        out
    }

    /// A directory with nested files, an empty file, and files of exactly 2 chunks and
    /// 2 chunks + 1 byte at 1 MiB chunks.
    fn sample_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "empty", b"");
        write(dir.path(), "exact", &bytes(2 * MIB as usize, 1));
        write(
            dir.path(),
            "sub/deeper/plus_one",
            &bytes(2 * MIB as usize + 1, 2),
        );
        write(dir.path(), "sub/small.txt", b"hello");
        dir
    }

    fn chunk_hashes(n: usize) -> Vec<ChunkHash> {
        (0..n).map(|i| ChunkHash([i as u8; 32])).collect()
    }

    fn entry(path: &str, size: u64, chunks: usize) -> FileEntry {
        FileEntry {
            path: path.to_owned(),
            size,
            chunks: chunk_hashes(chunks),
        }
    }

    /// JSON of a manifest without going through `Manifest`'s checks.
    fn raw(chunk_bytes: u32, files: &[FileEntry]) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({ "chunk_bytes": chunk_bytes, "files": files }))
            .unwrap()
    }

    fn decode_err(chunk_bytes: u32, files: &[FileEntry]) -> DatasetError {
        Manifest::decode(&raw(chunk_bytes, files)).unwrap_err()
    }

    #[test]
    fn build_lists_nested_files_sorted_with_chunk_counts() {
        let dir = sample_dir();
        let manifest = Manifest::build(dir.path(), MIB).unwrap();
        let listed: Vec<_> = manifest
            .files()
            .iter()
            .map(|f| (f.path.as_str(), f.size, f.chunks.len()))
            .collect();
        let mib = u64::from(MIB);
        assert_eq!(
            listed,
            [
                ("empty", 0, 0),
                ("exact", 2 * mib, 2),
                ("sub/deeper/plus_one", 2 * mib + 1, 3),
                ("sub/small.txt", 5, 1),
            ]
        );
        assert_eq!(manifest.total_bytes(), 4 * mib + 6);
        assert_eq!(manifest.chunk_count(), 6);
        assert_eq!(manifest.chunk_bytes(), MIB);
        assert_eq!(manifest.file_index("sub/small.txt"), Some(3));
        assert_eq!(manifest.file_index("sub"), None);
        let small = &manifest.files()[3];
        assert_eq!(small.chunks, [ChunkHash::from(blake3::hash(b"hello"))]);
    }

    #[test]
    fn build_of_a_file_names_it_by_its_file_name() {
        let dir = sample_dir();
        let manifest = Manifest::build(&dir.path().join("sub/small.txt"), MIB).unwrap();
        assert_eq!(manifest.files().len(), 1);
        assert_eq!(manifest.files()[0].path, "small.txt");
        assert_eq!(manifest.total_bytes(), 5);
    }

    #[test]
    fn root_is_stable_and_changes_with_one_byte() {
        let dir = sample_dir();
        let first = Manifest::build(dir.path(), MIB).unwrap();
        let root = first.root();
        assert_eq!(Manifest::build(dir.path(), MIB).unwrap().root(), root);

        let mut changed = bytes(2 * MIB as usize + 1, 2);
        changed[MIB as usize + 7] ^= 1;
        write(dir.path(), "sub/deeper/plus_one", &changed);
        let other = Manifest::build(dir.path(), MIB).unwrap();
        assert_ne!(other.root(), root);
        // Only the chunk holding the changed byte changed.
        let (old, new) = (&first.files()[2].chunks, &other.files()[2].chunks);
        assert_eq!((old[0], old[2]), (new[0], new[2]));
        assert_ne!(old[1], new[1]);
        assert_eq!(first.files()[1], other.files()[1]);

        // The chunk size is part of the name.
        let at_2_mib = Manifest::build(dir.path(), 2 * MIB).unwrap();
        assert_ne!(at_2_mib.root(), other.root());
    }

    #[test]
    fn build_refuses_symlinks_empty_directories_and_bad_chunk_sizes() {
        let dir = sample_dir();
        std::os::unix::fs::symlink(dir.path().join("exact"), dir.path().join("sub/link")).unwrap();
        let err = Manifest::build(dir.path(), MIB).unwrap_err();
        assert!(
            matches!(&err, DatasetError::UnsupportedFile { path, kind: "symlink" } if path.ends_with("sub/link")),
            "{err}"
        );

        let empty = tempfile::tempdir().unwrap();
        fs::create_dir_all(empty.path().join("a/b")).unwrap();
        let err = Manifest::build(empty.path(), MIB).unwrap_err();
        assert!(matches!(err, DatasetError::EmptyDirectory { .. }), "{err}");

        for chunk_bytes in [0, MIB - 1, 4 * MIB + 1] {
            let err = Manifest::build(empty.path(), chunk_bytes).unwrap_err();
            assert!(
                matches!(err, DatasetError::ChunkBytesOutOfRange { chunk_bytes: c } if c == chunk_bytes),
                "{err}"
            );
        }

        let err = Manifest::build(&empty.path().join("missing"), MIB).unwrap_err();
        assert!(matches!(err, DatasetError::Io { .. }), "{err}");
    }

    #[test]
    fn encode_decode_roundtrip_keeps_the_root() {
        let manifest = Manifest::build(sample_dir().path(), MIB).unwrap();
        let decoded = Manifest::decode(&manifest.encode()).unwrap();
        assert_eq!(decoded, manifest);
        assert_eq!(decoded.root(), manifest.root());

        // Another layout of the same content: same manifest, same root.
        let mut files = manifest.files().to_vec();
        files.reverse();
        let pretty = serde_json::to_vec_pretty(
            &serde_json::json!({ "files": files, "chunk_bytes": manifest.chunk_bytes() }),
        )
        .unwrap();
        assert_eq!(Manifest::decode(&pretty).unwrap().root(), manifest.root());
    }

    /// Pins the canonical encoding: if this fails, every dataset's root has changed.
    #[test]
    fn canonical_encoding_and_root_are_pinned() {
        let manifest = Manifest::new(MIB, vec![entry("b", 0, 0), entry("a/x", 3, 1)]).unwrap();
        let zeros = "00".repeat(32);
        let expected = format!(
            r#"{{"chunk_bytes":1048576,"files":[{{"path":"a/x","size":3,"chunks":["{zeros}"]}},{{"path":"b","size":0,"chunks":[]}}]}}"#
        );
        assert_eq!(String::from_utf8(manifest.encode()).unwrap(), expected);
        let root = manifest.root();
        assert_eq!(root, Root::from(blake3::hash(expected.as_bytes())));
        assert_eq!(root.to_string(), ROOT_PINNED);
        assert_eq!(root.to_string().len(), 64);
        assert_eq!(ROOT_PINNED.parse::<Root>().unwrap(), root);
        assert_eq!(
            serde_json::to_string(&root).unwrap(),
            format!("\"{ROOT_PINNED}\"")
        );
    }

    const ROOT_PINNED: &str = "ddfa7ece24fb15030a01be5fda525e32f55dde911fa3ba17bbc86689e5f28b23";

    #[test]
    fn small_datasets_get_small_chunks() {
        assert_eq!(chunk_bytes_for(0), 1 << 20);
        assert_eq!(chunk_bytes_for(64 << 30), 1 << 20);
        assert_eq!(chunk_bytes_for((64 << 30) + 1), 2 << 20);
        assert_eq!(chunk_bytes_for(200 << 30), 4 << 20);
        assert_eq!(chunk_bytes_for(u64::MAX), 4 << 20);
    }

    #[test]
    fn decode_refuses_oversized_and_malformed_manifests() {
        let err = Manifest::decode(&vec![b' '; MANIFEST_BYTES_MAX + 1]).unwrap_err();
        assert!(
            matches!(err, DatasetError::ManifestTooLarge { bytes, .. } if bytes == MANIFEST_BYTES_MAX as u64 + 1),
            "{err}"
        );

        let good = String::from_utf8(raw(MIB, &[entry("a", 1, 1)])).unwrap();
        let bad_hex = good.replacen("0000", "zz00", 1);
        let short_hex = good.replacen("0000", "", 1);
        let unknown_field = good.replacen("\"size\"", "\"mode\":1,\"size\"", 1);
        let missing_field = r#"{"files":[]}"#.to_owned();
        for bytes in [
            "".to_owned(),
            "{".to_owned(),
            "[]".to_owned(),
            bad_hex,
            short_hex,
            unknown_field,
            missing_field,
        ] {
            let err = Manifest::decode(bytes.as_bytes()).unwrap_err();
            assert!(matches!(err, DatasetError::Malformed(_)), "{bytes}: {err}");
        }
        Manifest::decode(good.as_bytes()).unwrap();
    }

    #[test]
    fn decode_refuses_unsafe_paths() {
        let long = "a/".repeat(PATH_BYTES_MAX / 2) + "b";
        for path in [
            "",
            "/etc/passwd",
            "../up",
            "a/../../up",
            "a/..",
            "./a",
            "a//b",
            "a/",
            "a\\b",
            "a\0b",
            "a\nb",
            long.as_str(),
        ] {
            let err = decode_err(MIB, &[entry(path, 1, 1)]);
            assert!(
                matches!(&err, DatasetError::UnsafePath { path: p, .. } if p.len() <= PATH_IN_ERROR_BYTES_MAX + 3),
                "{path:?}: {err}"
            );
        }
        // Dots inside names are fine.
        Manifest::decode(&raw(MIB, &[entry("a..b/.hidden/c.", 1, 1)])).unwrap();
    }

    #[test]
    fn decode_refuses_duplicate_and_conflicting_paths() {
        let err = decode_err(MIB, &[entry("a", 1, 1), entry("b", 1, 1), entry("a", 0, 0)]);
        assert!(
            matches!(&err, DatasetError::DuplicatePath { path } if path == "a"),
            "{err}"
        );
        // `a.txt` sorts between `a` and `a/b`.
        let err = decode_err(
            MIB,
            &[entry("a/b", 1, 1), entry("a.txt", 1, 1), entry("a", 1, 1)],
        );
        assert!(
            matches!(&err, DatasetError::PathConflict { path, file } if path == "a/b" && file == "a"),
            "{err}"
        );
        Manifest::decode(&raw(MIB, &[entry("a/b", 1, 1), entry("ab", 1, 1)])).unwrap();
    }

    #[test]
    fn decode_refuses_wrong_chunk_counts() {
        let mib = u64::from(MIB);
        for (size, chunks, expected) in [
            (0, 1, 0),
            (1, 0, 1),
            (mib, 2, 1),
            (mib + 1, 1, 2),
            (u64::MAX, 1, u64::MAX.div_ceil(mib)),
        ] {
            let err = decode_err(MIB, &[entry("f", size, chunks)]);
            assert!(
                matches!(&err, DatasetError::ChunkCountMismatch { path, size: s, chunks: c, expected: e }
                    if path == "f" && *s == size && *c == chunks && *e == expected),
                "{size} {chunks}: {err}"
            );
        }
    }

    #[test]
    fn decode_refuses_bad_chunk_sizes_and_file_counts() {
        for chunk_bytes in [0, MIB - 1, 4 * MIB + 1, u32::MAX] {
            let err = decode_err(chunk_bytes, &[entry("a", 0, 0)]);
            assert!(
                matches!(err, DatasetError::ChunkBytesOutOfRange { chunk_bytes: c } if c == chunk_bytes),
                "{err}"
            );
        }
        assert!(matches!(decode_err(MIB, &[]), DatasetError::NoFiles));

        let many: Vec<_> = (0..=FILES_MAX)
            .map(|i| entry(&i.to_string(), 0, 0))
            .collect();
        let err = decode_err(MIB, &many);
        assert!(
            matches!(err, DatasetError::TooManyFiles { max: FILES_MAX }),
            "{err}"
        );
    }

    #[test]
    fn new_refuses_a_manifest_too_large_to_decode() {
        // One file of 300,000 chunks: under the limit as a count, over it encoded.
        let chunks = 300_000;
        let err = Manifest::new(
            MIB,
            vec![entry("big", chunks as u64 * u64::from(MIB), chunks)],
        )
        .unwrap_err();
        assert!(
            matches!(err, DatasetError::ManifestTooLarge { .. }),
            "{err}"
        );
    }

    #[test]
    fn verify_chunk_accepts_the_right_bytes_only() {
        let dir = sample_dir();
        let manifest = Manifest::build(dir.path(), MIB).unwrap();
        let file = manifest.file_index("sub/deeper/plus_one").unwrap();
        let data = bytes(2 * MIB as usize + 1, 2);
        for chunk in 0..3 {
            let (offset, len) = manifest.chunk_range(file, chunk).unwrap();
            let piece = &data[offset as usize..][..len as usize];
            manifest.verify_chunk(file, chunk, piece).unwrap();
        }

        let mut flipped = data[..MIB as usize].to_vec();
        flipped[12345] ^= 0x10;
        let err = manifest.verify_chunk(file, 0, &flipped).unwrap_err();
        assert!(
            matches!(&err, DatasetError::CorruptChunk { path, index: 0 } if path == "sub/deeper/plus_one"),
            "{err}"
        );

        // A right chunk is accepted only where it belongs.
        let err = manifest
            .verify_chunk(file, 1, &data[..MIB as usize])
            .unwrap_err();
        assert!(
            matches!(err, DatasetError::CorruptChunk { index: 1, .. }),
            "{err}"
        );

        let err = manifest
            .verify_chunk(file, 0, &data[..MIB as usize - 1])
            .unwrap_err();
        assert!(
            matches!(err, DatasetError::ChunkLength { index: 0, expected, actual, .. }
                if expected == MIB && actual == MIB as usize - 1),
            "{err}"
        );
        let err = manifest.verify_chunk(file, 2, &data[..2]).unwrap_err();
        assert!(
            matches!(
                err,
                DatasetError::ChunkLength {
                    index: 2,
                    expected: 1,
                    actual: 2,
                    ..
                }
            ),
            "{err}"
        );

        let empty = manifest.file_index("empty").unwrap();
        for (f, c) in [(empty, 0), (file, 3), (manifest.files().len(), 0)] {
            let err = manifest.verify_chunk(f, c, b"").unwrap_err();
            assert!(matches!(err, DatasetError::NoSuchChunk { .. }), "{err}");
        }
    }

    #[test]
    fn error_messages_name_the_path() {
        let err = decode_err(MIB, &[entry("../x", 1, 1)]);
        assert_eq!(err.to_string(), r#"path "../x": `..` component"#);
        let err = decode_err(MIB, &[entry("f", 1, 2)]);
        assert_eq!(
            err.to_string(),
            r#"path "f": 2 chunks for 1 bytes, expected 1"#
        );
        let err = decode_err(7, &[entry("f", 1, 1)]);
        assert_eq!(
            err.to_string(),
            "chunk_bytes: 7 is outside 1048576..=4194304"
        );
    }

    fn file_entry() -> impl Strategy<Value = FileEntry> {
        // Sizes up to 20 chunks of the largest size, with the edges (0, k·chunk, k·chunk±1)
        // likely through the chunk-multiple strategy.
        let max = 20 * u64::from(CHUNK_BYTES_MAX);
        let size = prop_oneof![
            0..=max,
            (0u64..20, -1i64..=1).prop_map(|(k, d)| (k * u64::from(MIB)).saturating_add_signed(d)),
        ];
        ("[a-z]{1,8}(/[a-z.]{1,8}){0,2}", size).prop_map(|(path, size)| FileEntry {
            path,
            size,
            chunks: Vec::new(),
        })
    }

    fn manifest() -> impl Strategy<Value = Manifest> {
        (
            CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX,
            prop::collection::vec(file_entry(), 1..8),
        )
            .prop_filter_map(
                "paths must be distinct and not nest",
                |(chunk_bytes, files)| {
                    let files = files
                        .into_iter()
                        .map(|mut file| {
                            let n = file.size.div_ceil(u64::from(chunk_bytes)) as usize;
                            file.chunks = (0..n)
                                .map(|i| ChunkHash::from(blake3::hash(&i.to_le_bytes())))
                                .collect();
                            file
                        })
                        .collect();
                    Manifest::new(chunk_bytes, files).ok()
                },
            )
    }

    proptest! {
        /// Every file's chunk ranges tile it exactly: from 0, each where the last ended, all
        /// but the last `chunk_bytes` long, none empty, the last ending at the file's size.
        #[test]
        fn chunk_ranges_tile_each_file(manifest in manifest()) {
            let chunk_bytes = manifest.chunk_bytes();
            for (f, file) in manifest.files().iter().enumerate() {
                let mut end = 0u64;
                for c in 0..file.chunks.len() {
                    let (offset, len) = manifest.chunk_range(f, c).unwrap();
                    prop_assert_eq!(offset, end);
                    prop_assert!(len > 0 && len <= chunk_bytes);
                    if c + 1 < file.chunks.len() {
                        prop_assert_eq!(len, chunk_bytes);
                    }
                    end = offset + u64::from(len);
                }
                prop_assert_eq!(end, file.size);
                prop_assert!(manifest.chunk_range(f, file.chunks.len()).is_err());
            }
        }

        /// Decoding the canonical encoding gives the same manifest and root.
        #[test]
        fn encode_decode_roundtrip(manifest in manifest()) {
            let decoded = Manifest::decode(&manifest.encode()).unwrap();
            prop_assert_eq!(decoded.root(), manifest.root());
            prop_assert_eq!(decoded, manifest);
        }
    }
}
