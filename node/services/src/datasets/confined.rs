//! Writing under a directory without ever following a symbolic link into somewhere else:
//! what `dataset get NAME --to DIR` writes through.
//!
//! A [`ConfinedDir`] is an open directory descriptor. Every name below it is resolved one
//! component at a time with `openat`/`fstatat`/`mkdirat` and `O_NOFOLLOW`, and files are
//! created with `O_CREAT | O_EXCL` (which never follows a link) under a fresh temporary name,
//! then renamed into place without replacing anything (`RENAME_NOREPLACE`). So a symbolic
//! link planted at `DIR`, at a directory below it or at a file's place is refused
//! ([`DatasetError::ExportBlocked`]), never followed, and cannot redirect a write outside
//! `DIR`; and a directory swapped for a link after it was checked is not reached either,
//! since the walk goes through descriptors, not paths. Each name a method takes is one plain
//! component, checked before any call (`a/b`, `..` and an empty name are refused,
//! `InvalidInput`): the manifest's paths are checked so already, and this holds without
//! them. The system calls themselves are the crate's `fs_at`, shared with the rank set-up's
//! walk; what a step does here is this file's.
//!
//! The components above `DIR` are the operator's: a symbolic link there is followed when it
//! belongs to root or to this process's user (`/var/run`, a home on another disk), and
//! refused when it belongs to anyone else (planted by another user, as Linux'
//! `protected_symlinks` reasons about sticky directories).
//!
//! Under `--run-as` a [`ConfinedDir`] opened with [`ConfinedDir::open_or_create_as`] makes
//! every system call with the user's file access ([`super::fs_user`]): what it
//! creates is the user's, and it creates nothing where the user could not.
//!
//! Blocking calls: the service runs them on the blocking pool.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use super::fs_user::{self, FsUser};
use super::DatasetError;
use crate::fs_at::{self, check, component, openat, Met};

/// Mode of the directories created under `--to` (narrowed further by the node's umask).
pub const DIR_MODE: libc::mode_t = 0o700;
/// Mode of the files written under `--to`: the manifest does not carry the source's mode,
/// and a dataset may hold anything, so only the node's user may read them until the
/// operator says otherwise (`chmod`).
pub const FILE_MODE: libc::mode_t = 0o600;

/// How the directories on the way are opened: for lookups only (`O_PATH`), which needs
/// search permission on them and not read permission, as a path walk does: a user may pass
/// through a directory it cannot list (mode 0711).
const DIR_FLAGS: libc::c_int = libc::O_PATH | libc::O_DIRECTORY;

/// What a name in a directory is, not following a symbolic link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link, with its owner's uid.
    Symlink {
        /// The link's owner.
        uid: u32,
    },
    /// Anything else: a FIFO, socket or device.
    Other(&'static str),
}

impl Kind {
    /// What it is in a message: `file`, `directory`, `symlink`, `fifo`, …
    pub fn name(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "directory",
            Kind::Symlink { .. } => "symlink",
            Kind::Other(name) => name,
        }
    }
}

/// An open directory that names are resolved under without following links.
#[derive(Debug)]
pub struct ConfinedDir {
    fd: OwnedFd,
    path: PathBuf,
    /// Whose file access every call takes (`None`: the node's).
    user: Option<FsUser>,
}

fn kind_at(dir: BorrowedFd<'_>, name: &CString) -> io::Result<Option<Kind>> {
    let Some(st) = fs_at::stat_at(dir, name)? else {
        return Ok(None);
    };
    Ok(Some(match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => Kind::File,
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Symlink { uid: st.st_uid },
        libc::S_IFIFO => Kind::Other("fifo"),
        libc::S_IFSOCK => Kind::Other("socket"),
        libc::S_IFBLK => Kind::Other("block device"),
        libc::S_IFCHR => Kind::Other("char device"),
        _ => Kind::Other("unknown"),
    }))
}

impl ConfinedDir {
    fn io(&self, name: &OsStr) -> impl FnOnce(io::Error) -> DatasetError {
        let path = self.path.join(name);
        move |source| DatasetError::Io { path, source }
    }

    fn blocked(&self, name: &OsStr, kind: Kind) -> DatasetError {
        DatasetError::ExportBlocked {
            path: self.path.join(name),
            kind: kind.name(),
        }
    }

    /// Opens the directory `path` (absolute, without `..`), creating what is missing of it.
    /// `path` itself may not be a symbolic link; one above it is followed only if root or
    /// this process's user owns it (see the module doc).
    pub fn open_or_create(path: &Path) -> Result<ConfinedDir, DatasetError> {
        ConfinedDir::open_or_create_as(path, None)
    }

    /// [`ConfinedDir::open_or_create`] with `user`'s file access, for this call and every
    /// later one on the directory and those reached below it (`None`: the node's).
    pub fn open_or_create_as(
        path: &Path,
        user: Option<FsUser>,
    ) -> Result<ConfinedDir, DatasetError> {
        let bad = |reason: &'static str| DatasetError::UnsafePath {
            path: path.display().to_string(),
            reason,
        };
        if !path.is_absolute() {
            return Err(bad("not absolute"));
        }
        let fd = fs_user::acting(user, || fs_at::open(c"/", DIR_FLAGS)).map_err(|source| {
            DatasetError::Io {
                path: PathBuf::from("/"),
                source,
            }
        })?;
        let mut dir = ConfinedDir {
            fd,
            path: PathBuf::from("/"),
            user,
        };
        let names: Vec<&OsStr> = path
            .components()
            .filter_map(|c| match c {
                Component::Normal(name) => Some(Ok(name)),
                Component::ParentDir => Some(Err(())),
                _ => None,
            })
            .collect::<Result<_, ()>>()
            .map_err(|()| bad("holds a '..' component"))?;
        let me = match user {
            Some(user) => user.uid,
            // SAFETY: geteuid cannot fail.
            None => unsafe { libc::geteuid() },
        };
        for (i, name) in names.iter().enumerate() {
            let last = i + 1 == names.len();
            dir = dir.step(name, |uid| !last && (uid == 0 || uid == me))?;
        }
        Ok(dir)
    }

    /// The subdirectory `name` (one component), created if missing; a symbolic link or
    /// anything but a directory there is refused.
    pub fn subdir(&self, name: &str) -> Result<ConfinedDir, DatasetError> {
        self.step(OsStr::new(name), |_| false)
    }

    /// The directory `name` below this one, created (mode [`DIR_MODE`]) if missing; a
    /// symbolic link owned by `uid` is followed only if `follow(uid)`.
    fn step(
        &self,
        name: &OsStr,
        follow: impl Fn(u32) -> bool,
    ) -> Result<ConfinedDir, DatasetError> {
        let c = component(name).map_err(self.io(name))?;
        let dir_flags = DIR_FLAGS;
        let kind = self
            .acting(|| kind_at(self.fd.as_fd(), &c))
            .map_err(self.io(name))?;
        let fd = self
            .acting(|| match kind {
                None => {
                    // Made by someone else meanwhile (no error): opened without following below.
                    fs_at::mkdirat(self.fd.as_fd(), &c, DIR_MODE)?;
                    openat(self.fd.as_fd(), &c, dir_flags | libc::O_NOFOLLOW, 0).map(Some)
                }
                Some(Kind::Dir) => {
                    openat(self.fd.as_fd(), &c, dir_flags | libc::O_NOFOLLOW, 0).map(Some)
                }
                Some(Kind::Symlink { uid }) if follow(uid) => {
                    openat(self.fd.as_fd(), &c, dir_flags, 0).map(Some)
                }
                Some(_) => Ok(None),
            })
            .map_err(|e| match fs_at::met(&e) {
                // A link or a file swapped in after the check.
                Some(Met::Link) => self.blocked(name, Kind::Symlink { uid: u32::MAX }),
                Some(Met::NotDir) => self.blocked(name, Kind::File),
                _ => self.io(name)(e),
            })?;
        let Some(fd) = fd else {
            let kind = kind.expect("only something there is refused");
            return Err(self.blocked(name, kind));
        };
        Ok(ConfinedDir {
            fd,
            path: self.path.join(name),
            user: self.user,
        })
    }

    /// Runs `f` with this directory's file access.
    fn acting<T>(&self, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        fs_user::acting(self.user, f)
    }

    /// Another handle on the same directory (a duplicated descriptor).
    pub fn try_clone(&self) -> Result<ConfinedDir, DatasetError> {
        Ok(ConfinedDir {
            fd: self.fd.try_clone().map_err(self.io(OsStr::new("")))?,
            path: self.path.clone(),
            user: self.user,
        })
    }

    /// What `name` is here (not following a link), if anything.
    pub fn kind(&self, name: &str) -> Result<Option<Kind>, DatasetError> {
        let c = component(OsStr::new(name)).map_err(self.io(OsStr::new(name)))?;
        self.acting(|| kind_at(self.fd.as_fd(), &c))
            .map_err(self.io(OsStr::new(name)))
    }

    /// Opens the regular file `name` for reading, never through a link.
    pub fn open_file(&self, name: &str) -> Result<File, DatasetError> {
        let os = OsStr::new(name);
        let c = component(os).map_err(self.io(os))?;
        let fd = self
            .acting(|| {
                openat(
                    self.fd.as_fd(),
                    &c,
                    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
                    0,
                )
            })
            .map_err(|e| match fs_at::met(&e) {
                Some(Met::Link) => self.blocked(os, Kind::Symlink { uid: u32::MAX }),
                _ => self.io(os)(e),
            })?;
        Ok(File::from(fd))
    }

    /// Creates the file `name` (mode [`FILE_MODE`]), which must not exist: never a link.
    pub fn create_new(&self, name: &str) -> Result<File, DatasetError> {
        let os = OsStr::new(name);
        let c = component(os).map_err(self.io(os))?;
        let fd = self
            .acting(|| {
                openat(
                    self.fd.as_fd(),
                    &c,
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                    FILE_MODE,
                )
            })
            .map_err(self.io(os))?;
        Ok(File::from(fd))
    }

    /// Renames `from` to `to` in this directory, refusing to replace anything at `to`
    /// ([`DatasetError::ExportBlocked`] naming what is there).
    pub fn rename_new(&self, from: &str, to: &str) -> Result<(), DatasetError> {
        let os = OsStr::new(to);
        let (f, t) = (
            component(OsStr::new(from)).map_err(self.io(os))?,
            component(os).map_err(self.io(os))?,
        );
        let fd = self.fd.as_raw_fd();
        let renamed = self.acting(|| {
            // SAFETY: a syscall on a valid descriptor and NUL-terminated names.
            let ret =
                unsafe { libc::renameat2(fd, f.as_ptr(), fd, t.as_ptr(), libc::RENAME_NOREPLACE) };
            Ok(check(ret))
        });
        match renamed.and_then(|r| r) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let kind = self.kind(to)?.unwrap_or(Kind::File);
                Err(self.blocked(os, kind))
            }
            // A file system without RENAME_NOREPLACE: a hard link fails the same way when
            // `to` exists (and never follows a link at `to`).
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
                let linked = self.acting(|| {
                    // SAFETY: as above.
                    let ret = unsafe { libc::linkat(fd, f.as_ptr(), fd, t.as_ptr(), 0) };
                    Ok(check(ret))
                });
                match linked.and_then(|r| r) {
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        let kind = self.kind(to)?.unwrap_or(Kind::File);
                        Err(self.blocked(os, kind))
                    }
                    r => {
                        r.map_err(self.io(os))?;
                        self.remove_file(from);
                        Ok(())
                    }
                }
            }
            Err(e) => Err(self.io(os)(e)),
        }
    }

    /// Removes the file `name` here, if it is there (best effort: a leftover temporary).
    pub fn remove_file(&self, name: &str) {
        if let Ok(c) = component(OsStr::new(name)) {
            let _ = self.acting(|| fs_at::unlinkat(self.fd.as_fd(), &c));
        }
    }

    /// The path this directory was reached by (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl AsFd for ConfinedDir {
    /// The open directory: what [`super::roots::HostAccess::check_open`] checks.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::{symlink, PermissionsExt};

    use super::*;

    #[test]
    fn creates_what_is_missing_and_writes_only_new_files() {
        let tmp = tempfile::tempdir().unwrap();
        let to = tmp.path().join("a/b");
        let dir = ConfinedDir::open_or_create(&to).unwrap();
        let sub = dir.subdir("c").unwrap();
        let mut f = sub.create_new(".x.tmp").unwrap();
        f.write_all(b"hi").unwrap();
        sub.rename_new(".x.tmp", "x").unwrap();
        assert_eq!(std::fs::read(to.join("c/x")).unwrap(), b"hi");
        let mode = std::fs::metadata(to.join("c/x"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}: no group or other bits");
        assert_eq!(sub.kind("x").unwrap(), Some(Kind::File));
        assert!(sub.create_new("x").is_err(), "never over an existing file");
        sub.create_new(".y.tmp").unwrap();
        let err = sub.rename_new(".y.tmp", "x").unwrap_err();
        assert!(
            matches!(err, DatasetError::ExportBlocked { kind: "file", .. }),
            "{err}"
        );
    }

    #[test]
    fn symlinks_at_dir_below_it_or_at_a_file_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("victim"), b"keep").unwrap();

        // DIR itself a link.
        let link = tmp.path().join("to");
        symlink(&outside, &link).unwrap();
        let err = ConfinedDir::open_or_create(&link).unwrap_err();
        assert!(
            matches!(&err, DatasetError::ExportBlocked { path, kind: "symlink" } if *path == link),
            "{err}"
        );
        assert!(
            err.to_string().contains(&link.display().to_string()),
            "{err}"
        );

        // A directory below DIR a link.
        let real = tmp.path().join("real");
        let dir = ConfinedDir::open_or_create(&real).unwrap();
        symlink(&outside, real.join("sub")).unwrap();
        let err = dir.subdir("sub").unwrap_err();
        assert!(
            matches!(
                err,
                DatasetError::ExportBlocked {
                    kind: "symlink",
                    ..
                }
            ),
            "{err}"
        );

        // A file's place a link: not opened, not created through, not replaced.
        symlink(outside.join("victim"), real.join("f")).unwrap();
        assert_eq!(dir.kind("f").unwrap().map(Kind::name), Some("symlink"));
        assert!(dir.open_file("f").is_err());
        assert!(dir.create_new("f").is_err());
        dir.create_new(".f.tmp").unwrap();
        assert!(dir.rename_new(".f.tmp", "f").is_err());
        assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"keep");

        // An ancestor link this user owns is followed (the operator's own).
        let via = link.join("deeper");
        ConfinedDir::open_or_create(&via).unwrap();
        assert!(outside.join("deeper").is_dir());
        assert!(matches!(
            ConfinedDir::open_or_create(Path::new("/tmp/../etc")),
            Err(DatasetError::UnsafePath { .. })
        ));
    }

    #[test]
    fn a_name_that_is_not_one_component_is_refused_before_any_call() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ConfinedDir::open_or_create(&tmp.path().join("d")).unwrap();
        std::fs::write(tmp.path().join("victim"), b"keep").unwrap();
        for name in ["../victim", "..", ".", "", "a/b"] {
            let refused = |r: Result<(), DatasetError>| match r {
                Err(DatasetError::Io { source, .. }) => {
                    source.kind() == io::ErrorKind::InvalidInput
                }
                _ => false,
            };
            assert!(
                refused(dir.open_file(name).map(drop)),
                "open_file({name:?})"
            );
            assert!(
                refused(dir.create_new(name).map(drop)),
                "create_new({name:?})"
            );
            assert!(refused(dir.subdir(name).map(drop)), "subdir({name:?})");
            assert!(refused(dir.kind(name).map(drop)), "kind({name:?})");
        }
        assert_eq!(std::fs::read(tmp.path().join("victim")).unwrap(), b"keep");
        assert!(!tmp.path().join("d/a").exists());
    }
}
