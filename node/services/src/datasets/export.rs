//! `get --to DIR`: a dataset's files written under a directory of the user's, in place as
//! the chunks arrive, each file appearing at its path only once all of it is in.
//!
//! An [`Export`] is made before anything is fetched: every file's place under `DIR` is
//! checked ([`Export::begin`]) and a temporary file of the file's length is created beside
//! it (`.<name>.ringleader-<random>`, mode 0600, sparse). The fetch then hands it each
//! chunk it has verified against the manifest and written to the store's `.part`
//! ([`Export::write_chunk`]), so the user's copy fills while the network is busy instead
//! of being copied out of the store afterwards. [`Export::finish`] flushes each file and
//! renames it to its path without replacing anything. Until then nothing is at a final
//! path; an export dropped unfinished (a failed fetch, a corrupt holder left alone, a full
//! disk) removes its temporaries, and the store's `.part` keeps the verified chunks for the
//! next `get`, which copies the ones it resumes from there ([`Export::write_chunk`] again).
//!
//! Invariants: only chunks that passed [`Manifest::verify_chunk`] are written (the caller
//! verifies; this module never sees an unverified chunk), a file is renamed into place only
//! after every one of its chunks is written and flushed, and nothing is ever written through
//! a symbolic link: `DIR`, every directory below it and every file's place are walked with
//! [`ConfinedDir`], so a link planted at any of them is refused
//! ([`DatasetError::ExportBlocked`]), never followed. A file already at its place with the
//! same bytes is left alone; one with other bytes is refused before anything is fetched
//! ([`DatasetError::ExportExists`]).
//!
//! The store's copy is never shared with the user's: no hard link (the user could change the
//! store's bytes through it). When the dataset is already whole in the store,
//! [`export_whole`] copies it with `copy_file_range` (through [`std::io::copy`]), which
//! clones the extents on a file system that offers it (Btrfs, XFS): a reflink, copy on write.
//!
//! Blocking calls: the fetch and the service run them on the blocking pool.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::confined::{ConfinedDir, Kind};
use super::store::{self, ChunkPlace};
use super::{DatasetError, Manifest};

/// What is written at one file's place.
#[derive(Debug)]
enum Target {
    /// A file with the same bytes is there already: left alone.
    Present,
    /// Being written under a temporary name in `dirs[dir]`.
    Writing(Temp),
    /// Renamed into place by [`Export::finish`].
    Placed,
}

#[derive(Debug)]
struct Temp {
    /// Index into [`Export::dirs`].
    dir: usize,
    /// The temporary name, in that directory.
    tmp: String,
    /// The file's name there.
    name: String,
    file: File,
}

/// A dataset's files being written under a directory (see the module documentation).
#[derive(Debug)]
pub struct Export {
    /// `DIR` itself, then each directory below it that holds a file, opened once.
    dirs: Vec<ConfinedDir>,
    /// One per manifest file, in manifest order.
    targets: Vec<Target>,
}

impl Export {
    /// Checks every file's place under `to` (creating the directories that are missing) and
    /// creates a temporary of each file's length beside it. Refuses a link or anything but a
    /// directory on the way, a link or special file at a file's place, and a file there with
    /// other bytes; on an error, nothing it created but directories is left.
    pub fn begin(manifest: &Manifest, to: &Path) -> Result<Export, DatasetError> {
        Export::begin_in(manifest, ConfinedDir::open_or_create(to)?)
    }

    /// [`Export::begin`] under a directory already opened (and checked: a request's
    /// `--to`, see [`super::roots`]); every file and directory is made with its file access.
    pub fn begin_in(manifest: &Manifest, to: ConfinedDir) -> Result<Export, DatasetError> {
        let mut export = Export {
            dirs: vec![to],
            targets: Vec::with_capacity(manifest.files().len()),
        };
        let mut dir_index: HashMap<&str, usize> = HashMap::new();
        let mut buf = vec![0u8; manifest.chunk_bytes() as usize];
        for (f, entry) in manifest.files().iter().enumerate() {
            // Manifest paths are checked: relative, `/`-separated, no `.`, `..` or empty part.
            let (parent, name) = match entry.path.rsplit_once('/') {
                Some((parent, name)) => (Some(parent), name),
                None => (None, entry.path.as_str()),
            };
            let dir = match parent {
                None => 0,
                Some(parent) => match dir_index.get(parent) {
                    Some(&d) => d,
                    None => {
                        let opened = export.walk(parent)?;
                        export.dirs.push(opened);
                        dir_index.insert(parent, export.dirs.len() - 1);
                        export.dirs.len() - 1
                    }
                },
            };
            let target = export.place(dir, name, manifest, f, &mut buf)?;
            export.targets.push(target);
        }
        Ok(export)
    }

    /// Opens the directory `rel` (`a/b`) below `DIR`, one component at a time.
    fn walk(&self, rel: &str) -> Result<ConfinedDir, DatasetError> {
        let mut below: Option<ConfinedDir> = None;
        for part in rel.split('/') {
            let next = below.as_ref().unwrap_or(&self.dirs[0]).subdir(part)?;
            below = Some(next);
        }
        Ok(below.expect("a parent has at least one component"))
    }

    /// Checks file `f`'s place, `name` in `dirs[dir]`, and creates its temporary.
    fn place(
        &self,
        dir: usize,
        name: &str,
        manifest: &Manifest,
        f: usize,
        buf: &mut [u8],
    ) -> Result<Target, DatasetError> {
        let d = &self.dirs[dir];
        match d.kind(name)? {
            None => {}
            Some(Kind::File) => {
                let existing = d.open_file(name)?;
                if same_content(&existing, manifest, f, buf) {
                    return Ok(Target::Present);
                }
                return Err(DatasetError::ExportExists {
                    path: d.path().join(name),
                });
            }
            Some(kind) => {
                return Err(DatasetError::ExportBlocked {
                    path: d.path().join(name),
                    kind: kind.name(),
                })
            }
        }
        let tmp = format!(".{name}.ringleader-{}", store::random_hex());
        let file = d.create_new(&tmp)?;
        // Sparse: space is taken as chunks arrive, so a full disk shows on a write.
        if let Err(source) = file.set_len(manifest.files()[f].size) {
            d.remove_file(&tmp);
            return Err(DatasetError::Io {
                path: d.path().join(&tmp),
                source,
            });
        }
        Ok(Target::Writing(Temp {
            dir,
            tmp,
            name: name.to_owned(),
            file,
        }))
    }

    fn temp_path(&self, t: &Temp) -> PathBuf {
        self.dirs[t.dir].path().join(&t.tmp)
    }

    /// Writes a chunk the caller has verified at its place in its file's temporary (nothing
    /// for a file that was there already), and starts writing it to disk.
    pub fn write_chunk(&self, place: ChunkPlace, bytes: &[u8]) -> Result<(), DatasetError> {
        let Some(Target::Writing(t)) = self.targets.get(place.file) else {
            return Ok(());
        };
        t.file
            .write_all_at(bytes, place.offset)
            .map_err(|source| DatasetError::Io {
                path: self.temp_path(t),
                source,
            })?;
        store::start_writeback(&t.file, place.offset, bytes.len());
        Ok(())
    }

    /// Whether file `f` is being written (not there already with the same bytes).
    pub fn writes(&self, f: usize) -> bool {
        matches!(self.targets.get(f), Some(Target::Writing(_)))
    }

    /// Flushes every file and renames it to its path, refusing to replace anything that
    /// appeared there meanwhile ([`DatasetError::ExportBlocked`]). The caller has written
    /// every chunk. On an error the files not yet renamed are removed.
    pub fn finish(mut self) -> Result<(), DatasetError> {
        for i in 0..self.targets.len() {
            let Target::Writing(t) = &self.targets[i] else {
                continue;
            };
            t.file.sync_all().map_err(|source| DatasetError::Io {
                path: self.temp_path(t),
                source,
            })?;
            self.dirs[t.dir].rename_new(&t.tmp, &t.name)?;
            self.targets[i] = Target::Placed;
        }
        Ok(())
    }
}

impl Drop for Export {
    /// An export not finished leaves nothing of its own behind.
    fn drop(&mut self) {
        for target in &self.targets {
            if let Target::Writing(t) = target {
                self.dirs[t.dir].remove_file(&t.tmp);
            }
        }
    }
}

/// Writes a whole copy's files (`files_dir`, the store's) under `to`: [`Export::begin`],
/// then each file copied whole (`copy_file_range`: a reflink where the file system offers
/// one), then [`Export::finish`].
pub fn export_whole(files_dir: &Path, manifest: &Manifest, to: &Path) -> Result<(), DatasetError> {
    export_whole_in(files_dir, manifest, ConfinedDir::open_or_create(to)?)
}

/// [`export_whole`] under a directory already opened ([`Export::begin_in`]): the store's
/// files are read with the node's access, the copies written with the directory's.
pub fn export_whole_in(
    files_dir: &Path,
    manifest: &Manifest,
    to: ConfinedDir,
) -> Result<(), DatasetError> {
    let export = Export::begin_in(manifest, to)?;
    for (f, entry) in manifest.files().iter().enumerate() {
        let Some(Target::Writing(t)) = export.targets.get(f) else {
            continue;
        };
        let from = files_dir.join(&entry.path);
        let mut input = File::open(&from).map_err(|source| DatasetError::Io {
            path: from.clone(),
            source,
        })?;
        let mut output = &t.file;
        io::copy(&mut input, &mut output).map_err(|source| DatasetError::Io {
            path: export.temp_path(t),
            source,
        })?;
    }
    export.finish()
}

/// Whether `file` holds exactly file `f`'s bytes (every chunk verified).
fn same_content(file: &File, manifest: &Manifest, f: usize, buf: &mut [u8]) -> bool {
    let entry = &manifest.files()[f];
    if file.metadata().map(|m| m.len()).ok() != Some(entry.size) {
        return false;
    }
    (0..entry.chunks.len()).all(|c| {
        let Ok((offset, len)) = manifest.chunk_range(f, c) else {
            return false;
        };
        let piece = &mut buf[..len as usize];
        file.read_exact_at(piece, offset).is_ok() && manifest.verify_chunk(f, c, piece).is_ok()
    })
}

#[cfg(test)]
mod tests;
