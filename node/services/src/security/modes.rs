//! File modes: nothing a node writes is readable by other local users.
//!
//! The node sets its umask to [`UMASK`] before it creates anything, so every directory it
//! (or a rank it starts) makes is 0700 and every file 0600. [`tighten_tree`] upgrades a data
//! directory an older node left with 0755 directories and 0644 files; [`check_secret_file`]
//! refuses a key or token file that others may read or write (a world-writable token file
//! lets any local user choose the token).

use std::{
    io,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// The process umask: no bits for group or others.
pub const UMASK: u32 = 0o077;

/// Most entries [`tighten_tree`] visits (a bound on a data directory with millions of
/// dataset chunks; the rest keep their modes and the count is logged).
pub const TIGHTEN_ENTRIES_MAX: usize = 1_000_000;

/// Sets the process umask to [`UMASK`] (inherited by ranks).
pub fn set_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(UMASK as _));
}

/// What [`tighten_tree`] changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tightened {
    /// Entries whose group or other bits were cleared.
    pub changed: usize,
    /// Entries visited.
    pub visited: usize,
}

/// Clears group and other permission bits on `root` and everything below it (symlinks are
/// neither followed nor changed). Errors on single entries are skipped: the pass is an
/// upgrade, not a gate.
pub fn tighten_tree(root: &Path) -> io::Result<Tightened> {
    tighten_tree_with(root, &Exempt::default())
}

/// What [`tighten_tree_with`] leaves open: what `--run-as` needs (see
/// `security::run_as`), nothing by default.
#[derive(Debug, Default)]
pub struct Exempt {
    /// Directories that end with mode 0711 (ranks pass through them, nobody else lists
    /// them) instead of 0700.
    pub traverse: Vec<PathBuf>,
    /// Entries owned by these uids (the ranks' user, or `--run-as-range`) are neither
    /// changed nor descended into: they are the ranks', and a rank may swap a directory
    /// there for a link at any time.
    pub rank_uids: Option<std::ops::RangeInclusive<u32>>,
}

/// [`tighten_tree`], leaving open what `exempt` names.
pub fn tighten_tree_with(root: &Path, exempt: &Exempt) -> io::Result<Tightened> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Tightened::default();
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        if out.visited >= TIGHTEN_ENTRIES_MAX {
            break;
        }
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        out.visited += 1;
        if exempt
            .rank_uids
            .as_ref()
            .is_some_and(|uids| uids.contains(&meta.uid()))
        {
            continue;
        }
        let mode = meta.permissions().mode();
        let open = if meta.is_dir() && exempt.traverse.contains(&path) {
            0o011
        } else {
            0
        };
        if mode & 0o077 != open {
            let tight = std::fs::Permissions::from_mode((mode & 0o7700) | open);
            if std::fs::set_permissions(&path, tight).is_ok() {
                out.changed += 1;
            }
        }
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        }
    }
    Ok(out)
}

/// Why a secret file is refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    /// It could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: io::Error,
    },
    /// Group or others may read or write it.
    #[error("{what} {path} is open to group or others (mode {mode:o}): chmod 600 {path}")]
    Open {
        /// What the file holds ("cluster key", "API token").
        what: &'static str,
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
}

/// Refuses a secret file whose mode gives group or others any access.
pub fn check_secret_file(path: &Path, what: &'static str) -> Result<(), SecretFileError> {
    let meta = std::fs::metadata(path).map_err(|source| SecretFileError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(SecretFileError::Open {
            what,
            path: path.display().to_string(),
            mode,
        });
    }
    Ok(())
}

/// Writes `bytes` to `path` with mode 0600 through a temporary file renamed into place (a
/// reader never sees half a secret; an existing file is replaced).
pub fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        io::Write::write_all(&mut f, bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn tighten_clears_group_and_other_bits_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("data");
        std::fs::create_dir_all(root.join("jobs/j-1")).unwrap();
        std::fs::write(root.join("jobs/j-1/rank0.log"), "x").unwrap();
        std::fs::write(root.join("raft.log"), "x").unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        for p in [
            root.clone(),
            root.join("jobs"),
            root.join("jobs/j-1"),
            root.join("jobs/j-1/rank0.log"),
            root.join("raft.log"),
            outside.clone(),
        ] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let t = tighten_tree(&root).unwrap();
        assert_eq!(t.changed, 5);
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("jobs/j-1")), 0o700);
        assert_eq!(mode(&root.join("jobs/j-1/rank0.log")), 0o700);
        assert_eq!(mode(&outside), 0o755, "a link's target is not touched");
        assert_eq!(tighten_tree(&root).unwrap().changed, 0);
    }

    #[test]
    fn exempt_directories_stay_traversable_and_rank_entries_untouched() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("data");
        std::fs::create_dir_all(root.join("jobs/j-1/w")).unwrap();
        std::fs::write(root.join("cluster.key"), "k").unwrap();
        for p in [&root, &root.join("jobs"), &root.join("cluster.key")] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::set_permissions(
            root.join("jobs/j-1/w"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let rank_uid = std::fs::metadata(root.join("jobs/j-1/w")).unwrap().uid();
        let exempt = Exempt {
            traverse: vec![root.clone(), root.join("jobs")],
            rank_uids: None,
        };
        tighten_tree_with(&root, &exempt).unwrap();
        assert_eq!(mode(&root), 0o711);
        assert_eq!(mode(&root.join("jobs")), 0o711);
        assert_eq!(mode(&root.join("cluster.key")), 0o700);
        assert_eq!(mode(&root.join("jobs/j-1/w")), 0o700);
        // Entries of the ranks' user are theirs: not changed, not entered.
        std::fs::set_permissions(root.join("jobs"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let exempt = Exempt {
            traverse: Vec::new(),
            rank_uids: Some(rank_uid..=rank_uid),
        };
        let t = tighten_tree_with(&root, &exempt).unwrap();
        assert_eq!(t.changed, 0, "every entry is the (test's) rank user's");
        assert_eq!(mode(&root.join("jobs")), 0o755);
    }

    #[test]
    fn secret_files_open_to_others_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cluster.key");
        write_private(&p, b"k").unwrap();
        assert_eq!(mode(&p), 0o600);
        check_secret_file(&p, "cluster key").unwrap();
        for bad in [0o644, 0o602, 0o620, 0o640] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(bad)).unwrap();
            let err = check_secret_file(&p, "cluster key").unwrap_err();
            assert!(err.to_string().contains("chmod 600"), "{err}");
        }
        write_private(&p, b"k2").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"k2");
        assert_eq!(mode(&p), 0o600);
    }
}
