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
        let mut export = Export {
            dirs: vec![ConfinedDir::open_or_create(to)?],
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
    let export = Export::begin(manifest, to)?;
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
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::datasets::store::tests::tree;
    use crate::datasets::store::{ChunkIndex, Held, Store};
    use crate::datasets::CHUNK_BYTES_MIN;

    /// A store holding `tree`, its manifest and every chunk in dataset order.
    fn stored(dir: &Path) -> (PathBuf, Manifest, Vec<(ChunkPlace, Vec<u8>)>) {
        let src = tree(dir);
        let store = Store::open(&dir.join("store")).unwrap();
        let m = store.import(&src, CHUNK_BYTES_MIN).unwrap();
        let held = Held {
            root: m.root(),
            complete: true,
        };
        let index = ChunkIndex::new(&m);
        let chunks = (0..index.len())
            .map(|g| {
                let place = index.place(&m, g).unwrap();
                (place, store.read_chunk(&held, &m, &index, g).unwrap())
            })
            .collect();
        (src, m, chunks)
    }

    fn same_tree(a: &Path, b: &Path) {
        for rel in ["a.bin", "empty", "sub/b.txt"] {
            assert_eq!(
                fs::read(a.join(rel)).unwrap(),
                fs::read(b.join(rel)).unwrap()
            );
        }
    }

    /// Every name under `dir`, relative, sorted (directories included).
    fn names(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
                if p.is_dir() {
                    stack.push(p);
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn chunks_written_in_any_order_appear_only_at_finish_and_byte_identical() {
        let dir = tempfile::tempdir().unwrap();
        let (src, m, chunks) = stored(dir.path());
        let to = dir.path().join("to");
        let export = Export::begin(&m, &to).unwrap();
        for (place, bytes) in chunks.iter().rev() {
            export.write_chunk(*place, bytes).unwrap();
            for rel in ["a.bin", "empty", "sub/b.txt"] {
                assert!(!to.join(rel).exists(), "{rel} visible before finish");
            }
        }
        assert!(names(&to).iter().any(|n| n.contains(".a.bin.ringleader-")));
        export.finish().unwrap();
        same_tree(&src, &to);
        assert_eq!(
            names(&to),
            ["a.bin", "empty", "sub", "sub/b.txt"],
            "no temporary left"
        );
        let mode = fs::metadata(to.join("a.bin")).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}: private");
    }

    #[test]
    fn an_export_dropped_unfinished_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let (_, m, chunks) = stored(dir.path());
        let to = dir.path().join("to");
        let export = Export::begin(&m, &to).unwrap();
        export.write_chunk(chunks[0].0, &chunks[0].1).unwrap();
        drop(export); // a fetch that failed
        assert_eq!(names(&to), ["sub"], "only directories");
    }

    #[test]
    fn same_bytes_are_left_alone_and_other_bytes_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let (src, m, chunks) = stored(dir.path());
        let to = dir.path().join("to");
        fs::create_dir_all(to.join("sub")).unwrap();
        fs::copy(src.join("a.bin"), to.join("a.bin")).unwrap();
        let export = Export::begin(&m, &to).unwrap();
        let a = m.file_index("a.bin").unwrap();
        assert!(!export.writes(a), "a.bin is there with the same bytes");
        assert!(export.writes(m.file_index("sub/b.txt").unwrap()));
        for (place, bytes) in &chunks {
            export.write_chunk(*place, bytes).unwrap();
        }
        export.finish().unwrap();
        same_tree(&src, &to);

        let clash = dir.path().join("clash");
        fs::create_dir_all(clash.join("sub")).unwrap();
        fs::write(clash.join("sub/b.txt"), b"mine").unwrap();
        let err = Export::begin(&m, &clash).unwrap_err();
        assert!(
            matches!(&err, DatasetError::ExportExists { path } if *path == clash.join("sub/b.txt")),
            "{err}"
        );
        assert_eq!(fs::read(clash.join("sub/b.txt")).unwrap(), b"mine");
        // The temporaries made for the files before it are gone again.
        assert_eq!(names(&clash), ["sub", "sub/b.txt"]);
    }

    #[test]
    fn a_file_that_appears_at_its_place_meanwhile_is_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let (_, m, chunks) = stored(dir.path());
        let to = dir.path().join("to");
        let export = Export::begin(&m, &to).unwrap();
        for (place, bytes) in &chunks {
            export.write_chunk(*place, bytes).unwrap();
        }
        fs::write(to.join("sub/b.txt"), b"theirs").unwrap();
        let err = export.finish().unwrap_err();
        assert!(
            matches!(err, DatasetError::ExportBlocked { kind: "file", .. }),
            "{err}"
        );
        assert_eq!(fs::read(to.join("sub/b.txt")).unwrap(), b"theirs");
        assert!(
            !names(&to).iter().any(|n| n.contains(".ringleader-")),
            "temporaries removed: {:?}",
            names(&to)
        );
    }

    /// `get --to` never writes through a link: not at the directory, not at a directory
    /// below it, not at a file's place; what the links point to is left untouched.
    #[test]
    fn an_export_never_writes_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let src = tree(dir.path());
        let store = Store::open(&dir.path().join("store")).unwrap();
        let m = store.import(&src, CHUNK_BYTES_MIN).unwrap();
        let files = store.files_dir(&m.root()).unwrap();
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("b.txt"), b"victim").unwrap();

        let to = dir.path().join("to-link");
        std::os::unix::fs::symlink(&outside, &to).unwrap();
        let err = export_whole(&files, &m, &to).unwrap_err();
        assert!(
            matches!(&err, DatasetError::ExportBlocked { path, kind: "symlink" } if *path == to),
            "{err}"
        );

        let to = dir.path().join("out-1");
        fs::create_dir(&to).unwrap();
        std::os::unix::fs::symlink(&outside, to.join("sub")).unwrap();
        let err = export_whole(&files, &m, &to).unwrap_err();
        assert!(
            matches!(&err, DatasetError::ExportBlocked { path, kind: "symlink" } if *path == to.join("sub")),
            "{err}"
        );

        let to = dir.path().join("out-2");
        fs::create_dir_all(to.join("sub")).unwrap();
        std::os::unix::fs::symlink(outside.join("b.txt"), to.join("sub/b.txt")).unwrap();
        let err = export_whole(&files, &m, &to).unwrap_err();
        assert!(
            matches!(&err, DatasetError::ExportBlocked { path, kind: "symlink" } if *path == to.join("sub/b.txt")),
            "{err}"
        );
        assert!(err.to_string().contains("sub/b.txt"), "{err}");
        assert_eq!(fs::read(outside.join("b.txt")).unwrap(), b"victim");
        assert_eq!(
            fs::read_dir(&outside).unwrap().count(),
            1,
            "nothing written there"
        );
        assert!(
            !names(&to).iter().any(|n| n.contains(".ringleader-")),
            "{:?}",
            names(&to)
        );

        // A plain directory works, twice (the same bytes again are fine), and its files
        // are private.
        let to = dir.path().join("out-3");
        export_whole(&files, &m, &to).unwrap();
        export_whole(&files, &m, &to).unwrap();
        same_tree(&src, &to);
        let mode = fs::metadata(to.join("a.bin")).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }
}
