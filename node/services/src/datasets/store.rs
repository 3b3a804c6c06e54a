//! The node's dataset store on disk: whole copies, copies being fetched, and nothing
//! half-written where a reader looks.
//!
//! Layout under `<data-dir>/datasets/`:
//!
//! ```text
//! <root>/manifest.json        a whole copy: its manifest (canonical encoding) …
//! <root>/files/<path>         … and its files, byte for byte as added
//! <root>.part/manifest.json   a fetch under way (or interrupted): the manifest,
//! <root>.part/files/<path>    the files at their full length, verified chunks in place,
//! <root>.part/have            the verified chunks so far (u32 little-endian indexes, appended)
//! .import-<random>/           an add being copied in (removed at start if left over)
//! ```
//!
//! Only `<root>/` directories are whole, and one appears only by renaming a finished
//! `.import-*` or `.part` directory, so a reader never sees a partial file under a whole
//! root. A `.part` survives a crash or a full disk: [`Store::begin`] re-verifies every chunk
//! its `have` lists and goes on from there.
//!
//! Permissions: a copy added keeps at most its source's permission bits (within
//! [`STORED_MODE_MAX`], then the umask), so adding a file only its owner may read never
//! makes a copy others may; fetched copies and the store's own files are 0600.
//!
//! Chunks are numbered across the dataset (file after file in path order); [`ChunkIndex`]
//! maps that number to a file and an offset. Every function here is blocking: the service
//! calls them on the blocking pool.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rand::RngCore;

use super::manifest::open_source;
use super::roots::HostAccess;
use super::{DatasetError, Manifest, Root, MANIFEST_BYTES_MAX};

/// The widest mode of a file in the store, before the umask: a copy gets the source's
/// permission bits within this (never wider, and never executable), a fetched copy and the
/// store's own files 0600; the node runs with umask 077, which narrows every one to 0600.
pub const STORED_MODE_MAX: u32 = 0o666;
/// The mode of fetched copies and the store's own files (manifests, `have` lists).
const PRIVATE_MODE: u32 = 0o600;

const MANIFEST_FILE: &str = "manifest.json";
const FILES_DIR: &str = "files";
const HAVE_FILE: &str = "have";
const PART_SUFFIX: &str = ".part";
const IMPORT_PREFIX: &str = ".import-";

/// Where each of a dataset's chunks lies: chunk `g` (numbered across the dataset) is chunk
/// `g - starts[f]` of file `f`.
#[derive(Debug, Clone)]
pub struct ChunkIndex {
    /// The number of the first chunk of each file, then the total.
    starts: Vec<u64>,
}

/// Where one chunk lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPlace {
    /// The file's index in the manifest.
    pub file: usize,
    /// The chunk's index in the file.
    pub chunk: usize,
    /// Its offset in the file, bytes.
    pub offset: u64,
    /// Its length, bytes.
    pub len: u32,
}

impl ChunkIndex {
    /// The index of `manifest`'s chunks.
    pub fn new(manifest: &Manifest) -> Self {
        let mut starts = Vec::with_capacity(manifest.files().len() + 1);
        let mut next = 0u64;
        for file in manifest.files() {
            starts.push(next);
            next += file.chunks.len() as u64;
        }
        starts.push(next);
        ChunkIndex { starts }
    }

    /// How many chunks.
    pub fn len(&self) -> u64 {
        *self.starts.last().expect("at least the total")
    }

    /// Whether there are none (a dataset of empty files).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where chunk `g` lies, if there is one.
    pub fn place(&self, manifest: &Manifest, g: u64) -> Option<ChunkPlace> {
        if g >= self.len() {
            return None;
        }
        // The last file whose first chunk is at or before g, skipping empty files.
        let file = self.starts.partition_point(|&s| s <= g) - 1;
        let chunk = (g - self.starts[file]) as usize;
        let (offset, len) = manifest.chunk_range(file, chunk).ok()?;
        Some(ChunkPlace {
            file,
            chunk,
            offset,
            len,
        })
    }
}

/// A set of chunk numbers, as a bitmap (what `have` messages carry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkSet {
    bits: Vec<u8>,
    len: u64,
    count: u64,
}

impl ChunkSet {
    /// An empty set over `len` chunks.
    pub fn empty(len: u64) -> Self {
        ChunkSet {
            bits: vec![0; len.div_ceil(8) as usize],
            len,
            count: 0,
        }
    }

    /// Every chunk of `len`.
    pub fn full(len: u64) -> Self {
        let mut set = Self::empty(len);
        for g in 0..len {
            set.insert(g);
        }
        set
    }

    /// A set from a peer's bitmap over `len` chunks; `None` if the length is wrong or a bit
    /// past `len` is set.
    pub fn from_bitmap(len: u64, bits: Vec<u8>) -> Option<Self> {
        if bits.len() as u64 != len.div_ceil(8) {
            return None;
        }
        let count: u64 = bits.iter().map(|b| u64::from(b.count_ones())).sum();
        let set = ChunkSet { bits, len, count };
        let stray = (len..len.div_ceil(8) * 8).any(|g| set.bit(g));
        (!stray).then_some(set)
    }

    fn bit(&self, g: u64) -> bool {
        self.bits[(g / 8) as usize] & (1 << (g % 8)) != 0
    }

    /// Whether `g` is in the set.
    pub fn contains(&self, g: u64) -> bool {
        g < self.len && self.bit(g)
    }

    /// Adds `g` (ignored past the end); returns whether it was new.
    pub fn insert(&mut self, g: u64) -> bool {
        if g >= self.len || self.bit(g) {
            return false;
        }
        self.bits[(g / 8) as usize] |= 1 << (g % 8);
        self.count += 1;
        true
    }

    /// Removes `g`.
    pub fn remove(&mut self, g: u64) {
        if self.contains(g) {
            self.bits[(g / 8) as usize] &= !(1 << (g % 8));
            self.count -= 1;
        }
    }

    /// How many chunks are in the set.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// How many chunks the set ranges over.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no chunk is in the set.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether every chunk is in the set.
    pub fn is_full(&self) -> bool {
        self.count == self.len
    }

    /// The bitmap (bit `g % 8` of byte `g / 8`).
    pub fn bitmap(&self) -> &[u8] {
        &self.bits
    }
}

/// A dataset this node has on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Its root.
    pub root: Root,
    /// Whole (`true`) or a fetch's `.part` (`false`).
    pub complete: bool,
}

/// The store: a directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> DatasetError + '_ {
    move |source| DatasetError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Store {
    /// Opens (creating) the store at `dir`, removing adds a crash left half-copied.
    pub fn open(dir: &Path) -> Result<Store, DatasetError> {
        fs::create_dir_all(dir).map_err(io_at(dir))?;
        for entry in fs::read_dir(dir).map_err(io_at(dir))? {
            let entry = entry.map_err(io_at(dir))?;
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(IMPORT_PREFIX)
            {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
        Ok(Store {
            dir: dir.to_path_buf(),
        })
    }

    fn whole_dir(&self, root: &Root) -> PathBuf {
        self.dir.join(root.to_string())
    }

    fn part_dir(&self, root: &Root) -> PathBuf {
        self.dir.join(format!("{root}{PART_SUFFIX}"))
    }

    /// The directory of a whole copy's files, if this node has one.
    pub fn files_dir(&self, root: &Root) -> Option<PathBuf> {
        let dir = self.whole_dir(root);
        dir.join(MANIFEST_FILE)
            .is_file()
            .then(|| dir.join(FILES_DIR))
    }

    /// Every dataset on disk, whole or in part (a directory whose name is not a root is
    /// ignored).
    pub fn scan(&self) -> Result<Vec<Held>, DatasetError> {
        let mut held = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io_at(&self.dir))? {
            let entry = entry.map_err(io_at(&self.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let (hex, complete) = match name.strip_suffix(PART_SUFFIX) {
                Some(hex) => (hex.to_owned(), false),
                None => (name, true),
            };
            if let Ok(root) = hex.parse::<Root>() {
                if entry.path().join(MANIFEST_FILE).is_file() {
                    held.push(Held { root, complete });
                }
            }
        }
        held.sort_by_key(|h| (!h.complete, h.root.0));
        Ok(held)
    }

    /// The manifest of a dataset on disk (whole, else in part), checked against its root.
    pub fn manifest(&self, held: &Held) -> Result<Manifest, DatasetError> {
        let dir = if held.complete {
            self.whole_dir(&held.root)
        } else {
            self.part_dir(&held.root)
        };
        read_manifest(&dir, &held.root)
    }

    /// Adds the file or directory at `src`: builds its manifest, copies its files into the
    /// store (checking each chunk of the copy against the manifest, so a file changed while
    /// being added is refused, not recorded wrong), then makes the copy whole with one
    /// rename. Returns the manifest; adding content the store holds already is a no-op.
    pub fn import(&self, src: &Path, chunk_bytes: u32) -> Result<Manifest, DatasetError> {
        self.import_as(src, chunk_bytes, &HostAccess::node())
    }

    /// [`Store::import`] for a request: `src` is read with `access`'s file access and every
    /// file checked where it is ([`super::roots`]); the store is written with the node's.
    pub fn import_as(
        &self,
        src: &Path,
        chunk_bytes: u32,
        access: &HostAccess,
    ) -> Result<Manifest, DatasetError> {
        let manifest = Manifest::build_as(src, chunk_bytes, access)?;
        let root = manifest.root();
        if self.files_dir(&root).is_some() {
            return Ok(manifest);
        }
        let tmp = self.dir.join(format!("{IMPORT_PREFIX}{}", random_hex()));
        let result = copy_checked(src, &manifest, &tmp, access).and_then(|()| {
            write_file_synced(&tmp.join(MANIFEST_FILE), &manifest.encode())?;
            self.make_whole(&tmp, &root)
        });
        if result.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        result.map(|()| manifest)
    }

    /// Renames a finished directory to the whole copy of `root` (replacing a `.part`).
    fn make_whole(&self, from: &Path, root: &Root) -> Result<(), DatasetError> {
        let to = self.whole_dir(root);
        if to.exists() {
            // The same content arrived another way meanwhile.
            let _ = fs::remove_dir_all(from);
        } else {
            fs::rename(from, &to).map_err(io_at(&to))?;
            sync_dir(&self.dir);
        }
        let part = self.part_dir(root);
        if part.exists() && part != from {
            let _ = fs::remove_dir_all(part);
        }
        Ok(())
    }

    /// Starts or resumes a fetch of `manifest`'s dataset: a `.part` directory with every file
    /// at full length. A `.part` left by an earlier fetch is resumed: the chunks its `have`
    /// lists are read back and verified, and only those that pass count.
    pub fn begin(&self, manifest: &Manifest) -> Result<Partial, DatasetError> {
        let root = manifest.root();
        let dir = self.part_dir(&root);
        let index = ChunkIndex::new(manifest);
        let resumable = read_manifest(&dir, &root).is_ok();
        if !resumable && dir.exists() {
            fs::remove_dir_all(&dir).map_err(io_at(&dir))?;
        }
        let files_dir = dir.join(FILES_DIR);
        fs::create_dir_all(&files_dir).map_err(io_at(&files_dir))?;
        let mut files = Vec::with_capacity(manifest.files().len());
        for entry in manifest.files() {
            let path = files_dir.join(&entry.path);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).map_err(io_at(parent))?;
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(PRIVATE_MODE)
                .open(&path)
                .map_err(io_at(&path))?;
            // Sparse: space is taken as chunks arrive, so a full disk shows on a write.
            file.set_len(entry.size).map_err(io_at(&path))?;
            files.push(file);
        }
        if !resumable {
            write_file_synced(&dir.join(MANIFEST_FILE), &manifest.encode())?;
        }
        let mut have = ChunkSet::empty(index.len());
        let have_path = dir.join(HAVE_FILE);
        if resumable {
            // Streamed, a chunk number at a time: the list takes no memory whatever its
            // length (it only grows by appends; a chunk listed twice is checked once).
            let mut listed = File::open(&have_path).map(io::BufReader::new).ok();
            let mut buf = Vec::new();
            let mut g = [0u8; 4];
            // Until the end, or a torn last append.
            while listed
                .as_mut()
                .is_some_and(|r| r.read_exact(&mut g).is_ok())
            {
                let g = u64::from(u32::from_le_bytes(g));
                if have.contains(g) {
                    continue;
                }
                let Some(place) = index.place(manifest, g) else {
                    continue;
                };
                buf.resize(place.len as usize, 0);
                let ok = files[place.file]
                    .read_exact_at(&mut buf, place.offset)
                    .is_ok()
                    && manifest.verify_chunk(place.file, place.chunk, &buf).is_ok();
                if ok {
                    have.insert(g);
                }
            }
        }
        // Rewrite the list with the chunks that passed, in one go.
        let mut list = Vec::with_capacity(have.count() as usize * 4);
        for g in (0..index.len()).filter(|&g| have.contains(g)) {
            list.extend_from_slice(&(g as u32).to_le_bytes());
        }
        write_file_synced(&have_path, &list)?;
        let have_log = OpenOptions::new()
            .append(true)
            .open(&have_path)
            .map_err(io_at(&have_path))?;
        Ok(Partial {
            root,
            dir,
            index,
            files,
            have,
            have_log,
        })
    }

    /// Reads chunk `g` of a dataset on disk (whole, else its `.part`, where the caller
    /// checks the chunk is verified). Not verified here: the receiver verifies.
    pub fn read_chunk(
        &self,
        held: &Held,
        manifest: &Manifest,
        index: &ChunkIndex,
        g: u64,
    ) -> Result<Vec<u8>, DatasetError> {
        let place = index.place(manifest, g).ok_or(DatasetError::NoSuchChunk {
            file_index: usize::MAX,
            chunk_index: g as usize,
        })?;
        let base = if held.complete {
            self.whole_dir(&held.root)
        } else {
            self.part_dir(&held.root)
        };
        let path = base
            .join(FILES_DIR)
            .join(&manifest.files()[place.file].path);
        let file = File::open(&path).map_err(io_at(&path))?;
        let mut buf = vec![0u8; place.len as usize];
        file.read_exact_at(&mut buf, place.offset)
            .map_err(io_at(&path))?;
        Ok(buf)
    }

    /// Deletes a dataset's whole copy and any `.part` of it.
    pub fn remove(&self, root: &Root) -> Result<(), DatasetError> {
        for dir in [self.whole_dir(root), self.part_dir(root)] {
            if dir.exists() {
                fs::remove_dir_all(&dir).map_err(io_at(&dir))?;
            }
        }
        Ok(())
    }

    /// Finishes a fetch: flushes its files, drops its `have` list and renames the `.part`
    /// to the whole copy. Every chunk must be in.
    pub fn finish(&self, partial: Partial) -> Result<PathBuf, DatasetError> {
        assert!(partial.have.is_full(), "finish before every chunk is in");
        for file in &partial.files {
            file.sync_all().map_err(io_at(&partial.dir))?;
        }
        drop(partial.have_log);
        let _ = fs::remove_file(partial.dir.join(HAVE_FILE));
        self.make_whole(&partial.dir, &partial.root)?;
        Ok(self.whole_dir(&partial.root).join(FILES_DIR))
    }
}

/// A fetch's files on disk (see [`Store::begin`]).
#[derive(Debug)]
pub struct Partial {
    root: Root,
    dir: PathBuf,
    index: ChunkIndex,
    files: Vec<File>,
    have: ChunkSet,
    have_log: File,
}

impl Partial {
    /// The verified chunks so far.
    pub fn have(&self) -> &ChunkSet {
        &self.have
    }

    /// Reads chunk `place` back into `buf` (its length): a chunk in [`Self::have`] is
    /// verified (those a resumed fetch found are copied to its `--to` files from here).
    pub fn read_chunk(
        &self,
        manifest: &Manifest,
        place: ChunkPlace,
        buf: &mut [u8],
    ) -> Result<(), DatasetError> {
        self.files[place.file]
            .read_exact_at(buf, place.offset)
            .map_err(|source| DatasetError::Io {
                path: self
                    .dir
                    .join(FILES_DIR)
                    .join(&manifest.files()[place.file].path),
                source,
            })
    }

    /// Writes chunk `g`, which the caller has verified, and records it in `have`
    /// ([`Self::write_data`], then [`Self::record`]).
    pub fn write_chunk(
        &mut self,
        manifest: &Manifest,
        g: u64,
        bytes: &[u8],
    ) -> Result<(), DatasetError> {
        self.write_data(manifest, g, bytes)?;
        self.record(g)
    }

    /// Writes chunk `g`'s bytes, which the caller has verified, into place, not yet
    /// recorded: a shared borrow, so the holders of a fetch write their chunks at once (a
    /// positioned write each; their places never overlap). [`Self::record`] it afterwards,
    /// never before: a chunk in the `have` log is on disk.
    pub fn write_data(
        &self,
        manifest: &Manifest,
        g: u64,
        bytes: &[u8],
    ) -> Result<(), DatasetError> {
        let place = self
            .index
            .place(manifest, g)
            .ok_or(DatasetError::NoSuchChunk {
                file_index: usize::MAX,
                chunk_index: g as usize,
            })?;
        let path = || {
            self.dir
                .join(FILES_DIR)
                .join(&manifest.files()[place.file].path)
        };
        let file = &self.files[place.file];
        file.write_all_at(bytes, place.offset)
            .map_err(|source| DatasetError::Io {
                path: path(),
                source,
            })?;
        start_writeback(file, place.offset, bytes.len());
        Ok(())
    }

    /// Records chunk `g`, written by [`Self::write_data`], in `have` and its log (once: the
    /// second copy of an endgame chunk is not logged again).
    pub fn record(&mut self, g: u64) -> Result<(), DatasetError> {
        if self.have.contains(g) {
            return Ok(());
        }
        self.have_log
            .write_all(&(g as u32).to_le_bytes())
            .map_err(|source| DatasetError::Io {
                path: self.dir.join(HAVE_FILE),
                source,
            })?;
        self.have.insert(g);
        Ok(())
    }
}

/// Starts writing a range of `file` to disk without waiting for it (Linux'
/// `sync_file_range(SYNC_FILE_RANGE_WRITE)`), so the flush when a fetch finishes has little
/// left to do: the disk keeps up with the network as chunks arrive instead of taking a
/// second per 512 MiB at the end. Best effort: an error only means the final flush does it.
pub(super) fn start_writeback(file: &File, offset: u64, len: usize) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on an open descriptor; it reads no memory of ours.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

/// 16 random hex digits, for temporary names.
pub(super) fn random_hex() -> String {
    let mut bytes = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// Reads a stored manifest, refusing a file over [`MANIFEST_BYTES_MAX`] before reading it
/// (and stopping there should it grow meanwhile).
fn read_manifest(dir: &Path, root: &Root) -> Result<Manifest, DatasetError> {
    let path = dir.join(MANIFEST_FILE);
    let file = File::open(&path).map_err(io_at(&path))?;
    let len = file.metadata().map_err(io_at(&path))?.len();
    let too_large = |bytes: u64| DatasetError::ManifestTooLarge {
        bytes,
        max: MANIFEST_BYTES_MAX,
    };
    if len > MANIFEST_BYTES_MAX as u64 {
        return Err(too_large(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MANIFEST_BYTES_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io_at(&path))?;
    if bytes.len() > MANIFEST_BYTES_MAX {
        return Err(too_large(bytes.len() as u64));
    }
    let manifest = Manifest::decode(&bytes)?;
    if manifest.root() != *root {
        return Err(DatasetError::RootMismatch);
    }
    Ok(manifest)
}

/// Writes `bytes` to `path` (mode [`PRIVATE_MODE`] if new) and flushes it to disk.
fn write_file_synced(path: &Path, bytes: &[u8]) -> Result<(), DatasetError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(PRIVATE_MODE)
        .open(path)
        .map_err(io_at(path))?;
    file.write_all(bytes).map_err(io_at(path))?;
    file.sync_all().map_err(io_at(path))
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Copies `manifest`'s files from `src` (a file or the directory it was built from) into
/// `to/files/`, checking every chunk of what was read against the manifest. A source file
/// is opened without following a link and must be a regular file; its copy is created new
/// with at most the source's permission bits ([`STORED_MODE_MAX`]).
fn copy_checked(
    src: &Path,
    manifest: &Manifest,
    to: &Path,
    access: &HostAccess,
) -> Result<(), DatasetError> {
    let single = access
        .acting(|| fs::symlink_metadata(src))
        .map_err(io_at(src))?
        .is_file();
    let mut buf = vec![0u8; manifest.chunk_bytes() as usize];
    for (f, entry) in manifest.files().iter().enumerate() {
        let from = if single {
            src.to_path_buf()
        } else {
            src.join(&entry.path)
        };
        let dest = to.join(FILES_DIR).join(&entry.path);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(io_at(parent))?;
        }
        let mut input = open_source(&from, None, access)?;
        let mode = input.metadata().map_err(io_at(&from))?.permissions().mode();
        let mut output = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode & STORED_MODE_MAX)
            .open(&dest)
            .map_err(io_at(&dest))?;
        for c in 0..entry.chunks.len() {
            let (_, len) = manifest.chunk_range(f, c)?;
            let piece = &mut buf[..len as usize];
            input.read_exact(piece).map_err(io_at(&from))?;
            manifest
                .verify_chunk(f, c, piece)
                .map_err(|_| DatasetError::ChangedWhileAdding { path: from.clone() })?;
            output.write_all(piece).map_err(io_at(&dest))?;
        }
        if input.read(&mut buf[..1]).map_err(io_at(&from))? != 0 {
            return Err(DatasetError::ChangedWhileAdding { path: from });
        }
        output.sync_all().map_err(io_at(&dest))?;
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests;
