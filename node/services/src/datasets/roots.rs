//! The host paths the API may read and write: `dataset add` reads a path on the node and
//! `dataset get --to` writes one, so the API would otherwise reach the whole host as the
//! node's user (root, often).
//!
//! What holds ([`HostAccess`], one per request):
//! - **Refused whatever the token and the flags**: the node's data directory (its keys, its
//!   token, its Raft state, the ranks' work directories), its `file://` store (every job's
//!   checkpoints), `/proc`, `/sys` and `/dev`; and any directory that holds one of them (an
//!   add of `/var/lib` would read the data directory below it).
//! - **A made token** (`ringleader token create`) reads only below a `--dataset-source DIR` and
//!   writes only below a `--dataset-dest DIR` of the node's (each repeatable). A node started
//!   without them refuses both, naming the flag.
//! - **The admin token** reads and writes any other path.
//! - **Under `--run-as USER`** the reads and the writes are done with the user's file access
//!   ([`super::fs_user`]), so a request gets no more than the user could read or
//!   write itself, whatever the roots say.
//!
//! Paths are checked where they lead, not as written: the request's path is resolved
//! canonically ([`HostAccess::precheck`]: links followed, `..` resolved) before anything is
//! opened, and then every descriptor the node actually reads a file through or writes below
//! is checked again by the path the kernel gives for it (`/proc/self/fd/N`,
//! [`HostAccess::check_open`]). So a link that escapes a root is refused, and so is a
//! directory renamed or swapped for a link between the check and the open: what is read or
//! written is what was checked. (Below `--to` nothing is followed at all: [`super::confined`].)
//! A hard link inside a root to a file outside it reads as inside; Linux'
//! `protected_hardlinks` (on by default) keeps a user from making one to a file it could not
//! read and write itself.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::fs_user::{self, FsUser};

/// Refused whatever the token and the flags, beside the node's data directory and store.
pub const SYSTEM_REFUSED: [&str; 3] = ["/proc", "/sys", "/dev"];

/// Which way a request touches the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `dataset add` reads a file or a directory.
    Read,
    /// `dataset get --to` writes below a directory.
    Write,
}

impl Access {
    /// The node flag that bounds it for a made token.
    pub fn flag(self) -> &'static str {
        match self {
            Access::Read => "--dataset-source",
            Access::Write => "--dataset-dest",
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
        }
    }
}

/// Why a path is refused, or a root flag is wrong.
#[derive(Debug, thiserror::Error)]
pub enum RootsError {
    /// The path is, is below, or holds a path refused whatever the token and the flags.
    #[error("{}: refused: {} is never read or written through the API, whatever the token and the node's flags (the node's data directory, its store, /proc, /sys and /dev are not)", shown(path, real), refused.display())]
    Refused {
        /// The path as the request gave it.
        path: PathBuf,
        /// Where it leads.
        real: PathBuf,
        /// The refused path it meets.
        refused: PathBuf,
    },
    /// A made token, and the node has no root for this access.
    #[error("{}: a made token may {} only below a directory the node was started with {flag} DIR, and this node has none (the admin token may {} any path but the refused ones)", shown(path, real), access.verb(), access.verb(), flag = access.flag())]
    NoRoot {
        /// The path as the request gave it.
        path: PathBuf,
        /// Where it leads.
        real: PathBuf,
        /// Read or write.
        access: Access,
    },
    /// A made token, and the path is below none of the node's roots for this access.
    #[error("{}: outside this node's {flag} directories ({roots}): a made token may {} only below them", shown(path, real), access.verb(), flag = access.flag())]
    Outside {
        /// The path as the request gave it.
        path: PathBuf,
        /// Where it leads.
        real: PathBuf,
        /// Read or write.
        access: Access,
        /// The roots, comma-separated.
        roots: String,
    },
    /// The path could not be resolved (missing, or not readable by the acting user).
    #[error("{}: {source}", path.display())]
    Resolve {
        /// The path as the request gave it.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A root flag's directory is unusable (start-up).
    #[error("{flag} {}: {reason}", path.display())]
    BadRoot {
        /// The flag.
        flag: &'static str,
        /// Its value.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

fn shown(path: &Path, real: &Path) -> String {
    if path == real {
        path.display().to_string()
    } else {
        format!("{} (which is {})", path.display(), real.display())
    }
}

/// The node's roots and refused paths, canonical (see the module doc).
#[derive(Clone, Debug, Default)]
pub struct HostRoots {
    sources: Vec<PathBuf>,
    dests: Vec<PathBuf>,
    refused: Vec<PathBuf>,
}

impl HostRoots {
    /// The roots of `--dataset-source` (`sources`) and `--dataset-dest` (`dests`), each an
    /// existing directory (resolved canonically), and the refused paths: `refused` (the data
    /// directory, a `file://` store's root; resolved where they exist) and
    /// [`SYSTEM_REFUSED`]. An error names the flag.
    pub fn new(
        sources: &[PathBuf],
        dests: &[PathBuf],
        refused: &[PathBuf],
    ) -> Result<HostRoots, RootsError> {
        let root = |flag: &'static str, path: &PathBuf| {
            let bad = |reason: String| RootsError::BadRoot {
                flag,
                path: path.clone(),
                reason,
            };
            if !path.is_absolute() {
                return Err(bad("give an absolute directory".into()));
            }
            let real = std::fs::canonicalize(path).map_err(|e| bad(e.to_string()))?;
            if !real.is_dir() {
                return Err(bad("not a directory".into()));
            }
            Ok(real)
        };
        let sources = sources
            .iter()
            .map(|p| root("--dataset-source", p))
            .collect::<Result<_, _>>()?;
        let dests = dests
            .iter()
            .map(|p| root("--dataset-dest", p))
            .collect::<Result<_, _>>()?;
        let refused = refused
            .iter()
            .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
            .chain(SYSTEM_REFUSED.iter().map(PathBuf::from))
            .collect();
        Ok(HostRoots {
            sources,
            dests,
            refused,
        })
    }

    /// The paths refused whatever the token and the flags.
    pub fn refused(&self) -> &[PathBuf] {
        &self.refused
    }

    /// Checks `real` (canonical, where `path` leads) for `access` by the admin or a made
    /// token.
    pub fn check(
        &self,
        access: Access,
        admin: bool,
        path: &Path,
        real: &Path,
    ) -> Result<(), RootsError> {
        let err_path = || (path.to_path_buf(), real.to_path_buf());
        if let Some(refused) = self
            .refused
            .iter()
            .find(|r| real.starts_with(r) || r.starts_with(real))
        {
            let (path, real) = err_path();
            return Err(RootsError::Refused {
                path,
                real,
                refused: refused.clone(),
            });
        }
        if admin {
            return Ok(());
        }
        let roots = match access {
            Access::Read => &self.sources,
            Access::Write => &self.dests,
        };
        if roots.is_empty() {
            let (path, real) = err_path();
            return Err(RootsError::NoRoot { path, real, access });
        }
        if roots.iter().any(|r| real.starts_with(r)) {
            return Ok(());
        }
        let (path, real) = err_path();
        Err(RootsError::Outside {
            path,
            real,
            access,
            roots: roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

/// One request's reach into the host: the node's roots, whether the token is the admin's,
/// and the user whose file access its reads and writes take (`--run-as`). `None` roots: the
/// node's own work (a rank's dataset, tests), unchecked.
#[derive(Clone, Debug, Default)]
pub struct HostAccess {
    roots: Option<Arc<HostRoots>>,
    admin: bool,
    /// The user reads and writes act as ([`fs_user`]); `None`: the node's own access.
    pub user: Option<FsUser>,
}

impl HostAccess {
    /// A request's reach: `roots` checked for the admin (`admin`) or a made token, file
    /// access as `user`.
    pub fn request(roots: Arc<HostRoots>, admin: bool, user: Option<FsUser>) -> HostAccess {
        HostAccess {
            roots: Some(roots),
            admin,
            user,
        }
    }

    /// The node's own reach: no roots, its own access.
    pub fn node() -> HostAccess {
        HostAccess::default()
    }

    /// Runs `f` with this request's file access ([`fs_user::acting`]).
    pub fn acting<T>(&self, f: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
        fs_user::acting(self.user, f)
    }

    /// Checks the path a request names before anything is opened: where it leads now
    /// (canonical, resolved with the request's file access: the deepest part that exists,
    /// the rest as given).
    pub fn precheck(&self, access: Access, path: &Path) -> Result<(), RootsError> {
        let Some(roots) = &self.roots else {
            return Ok(());
        };
        let resolve = |p: &Path| self.acting(|| std::fs::canonicalize(p));
        // The deepest part that exists decides, the rest as given: so a path that does not
        // exist outside the roots reads as outside them, not as missing (a made token learns
        // nothing of what is there), and `--to` may name a directory it makes.
        let mut existing = path.to_path_buf();
        let mut rest = Vec::new();
        let resolved = loop {
            match resolve(&existing) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let Some(name) = existing.file_name().map(|n| n.to_owned()) else {
                        break Err(e);
                    };
                    rest.push(name);
                    existing.pop();
                }
                other => break other,
            }
        };
        let mut real = resolved.map_err(|source| RootsError::Resolve {
            path: path.to_path_buf(),
            source,
        })?;
        real.extend(rest.iter().rev());
        roots.check(access, self.admin, path, &real)?;
        if access == Access::Read && !rest.is_empty() {
            return Err(RootsError::Resolve {
                path: path.to_path_buf(),
                source: std::io::ErrorKind::NotFound.into(),
            });
        }
        Ok(())
    }

    /// Checks a descriptor the node opened for this request (a file it reads, a directory
    /// it writes below) by where the kernel says it is: a path swapped after
    /// [`HostAccess::precheck`] is caught here, on what is actually read or written. `shown`
    /// is the path as the request reached it, for the message.
    pub fn check_open(
        &self,
        access: Access,
        fd: BorrowedFd<'_>,
        shown: &Path,
    ) -> Result<(), RootsError> {
        let Some(roots) = &self.roots else {
            return Ok(());
        };
        let real =
            std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|source| {
                RootsError::Resolve {
                    path: shown.to_path_buf(),
                    source,
                }
            })?;
        roots.check(access, self.admin, shown, &real)
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    fn roots(tmp: &Path) -> HostRoots {
        for d in ["src", "dst", "data", "elsewhere"] {
            std::fs::create_dir_all(tmp.join(d)).unwrap();
        }
        HostRoots::new(&[tmp.join("src")], &[tmp.join("dst")], &[tmp.join("data")]).unwrap()
    }

    #[test]
    fn refused_paths_hold_for_every_token_and_roots_bound_made_tokens() {
        let tmp = tempfile::tempdir().unwrap();
        let tmp = std::fs::canonicalize(tmp.path()).unwrap();
        let r = roots(&tmp);
        let check = |access, admin, p: &Path| r.check(access, admin, p, p);
        for admin in [true, false] {
            for p in [
                tmp.join("data"),
                tmp.join("data/cluster.key"),
                PathBuf::from("/proc/self/environ"),
                PathBuf::from("/sys/kernel"),
                PathBuf::from("/dev/sda"),
                // A directory holding a refused one.
                tmp.clone(),
                PathBuf::from("/"),
            ] {
                for access in [Access::Read, Access::Write] {
                    let e = check(access, admin, &p).unwrap_err();
                    assert!(matches!(e, RootsError::Refused { .. }), "{e}");
                    assert!(e.to_string().contains("refused"), "{e}");
                }
            }
        }
        // The admin: anything else.
        check(Access::Read, true, Path::new("/etc/shadow")).unwrap();
        check(Access::Write, true, Path::new("/etc/cron.d")).unwrap();
        // A made token: only below its roots, each access its own flag.
        check(Access::Read, false, &tmp.join("src/a/b")).unwrap();
        check(Access::Write, false, &tmp.join("dst/x")).unwrap();
        let e = check(Access::Read, false, &tmp.join("dst/x")).unwrap_err();
        assert!(e.to_string().contains("--dataset-source"), "{e}");
        let e = check(Access::Write, false, Path::new("/etc/cron.d")).unwrap_err();
        assert!(matches!(e, RootsError::Outside { .. }), "{e}");
        assert!(e.to_string().contains("--dataset-dest"), "{e}");
        // A sibling whose name only starts like a root is not below it.
        let e = check(Access::Read, false, &tmp.join("srcx")).unwrap_err();
        assert!(matches!(e, RootsError::Outside { .. }), "{e}");
        // No roots at all: the message names the flag.
        let none = HostRoots::new(&[], &[], &[tmp.join("data")]).unwrap();
        let e = none
            .check(
                Access::Read,
                false,
                Path::new("/etc/shadow"),
                Path::new("/etc/shadow"),
            )
            .unwrap_err();
        assert!(matches!(e, RootsError::NoRoot { .. }), "{e}");
        assert!(e.to_string().contains("--dataset-source DIR"), "{e}");
    }

    #[test]
    fn a_root_flag_must_name_an_existing_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, b"").unwrap();
        for (bad, what) in [
            (PathBuf::from("relative"), "absolute"),
            (tmp.path().join("missing"), "No such file"),
            (file, "not a directory"),
        ] {
            let e = HostRoots::new(&[bad], &[], &[]).unwrap_err().to_string();
            assert!(e.starts_with("--dataset-source"), "{e}");
            assert!(e.contains(what), "{e}");
        }
        let e = HostRoots::new(&[], &[PathBuf::from("rel")], &[])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--dataset-dest"), "{e}");
    }

    #[test]
    fn links_are_checked_where_they_lead_and_descriptors_where_they_are() {
        let tmp = tempfile::tempdir().unwrap();
        let tmp = std::fs::canonicalize(tmp.path()).unwrap();
        let r = Arc::new(roots(&tmp));
        std::fs::write(tmp.join("data/cluster.key"), b"secret").unwrap();
        std::fs::write(tmp.join("elsewhere/f"), b"x").unwrap();
        std::os::unix::fs::symlink(tmp.join("data"), tmp.join("src/to-data")).unwrap();
        std::os::unix::fs::symlink(tmp.join("elsewhere"), tmp.join("src/out")).unwrap();
        let made = HostAccess::request(r.clone(), false, None);
        let admin = HostAccess::request(r, true, None);
        let e = made
            .precheck(Access::Read, &tmp.join("src/to-data/cluster.key"))
            .unwrap_err();
        assert!(matches!(e, RootsError::Refused { .. }), "{e}");
        assert!(e.to_string().contains("which is"), "{e}");
        let e = made
            .precheck(Access::Read, &tmp.join("src/out/f"))
            .unwrap_err();
        assert!(matches!(e, RootsError::Outside { .. }), "{e}");
        admin
            .precheck(Access::Read, &tmp.join("src/out/f"))
            .unwrap();
        // A missing path: outside the roots it reads as outside (nothing learnt of what is
        // there), inside as missing.
        let e = made
            .precheck(Access::Read, Path::new("/no/such/place"))
            .unwrap_err();
        assert!(matches!(e, RootsError::Outside { .. }), "{e}");
        let e = made
            .precheck(Access::Read, &tmp.join("src/missing"))
            .unwrap_err();
        assert!(matches!(e, RootsError::Resolve { .. }), "{e}");
        // A write below a missing directory: the part that exists decides.
        made.precheck(Access::Write, &tmp.join("dst/new/deeper"))
            .unwrap();
        let e = made
            .precheck(Access::Write, &tmp.join("src/to-data/new"))
            .unwrap_err();
        assert!(matches!(e, RootsError::Refused { .. }), "{e}");
        // A descriptor: where it is, whatever path it was opened by.
        let inside = std::fs::File::open(tmp.join("src")).unwrap();
        made.check_open(Access::Read, inside.as_fd(), Path::new("/x"))
            .unwrap();
        let escaped = std::fs::File::open(tmp.join("src/out/f")).unwrap();
        let e = made
            .check_open(Access::Read, escaped.as_fd(), &tmp.join("src/out/f"))
            .unwrap_err();
        assert!(matches!(e, RootsError::Outside { .. }), "{e}");
        let key = std::fs::File::open(tmp.join("src/to-data/cluster.key")).unwrap();
        let e = admin
            .check_open(Access::Read, key.as_fd(), Path::new("/x"))
            .unwrap_err();
        assert!(matches!(e, RootsError::Refused { .. }), "{e}");
        // The node's own reach checks nothing.
        HostAccess::node()
            .check_open(Access::Read, key.as_fd(), Path::new("/x"))
            .unwrap();
    }
}
