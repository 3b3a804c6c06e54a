//! A rank's places set up as root without ever following a link: the work directory, the
//! directories and files of `[[files]]`, a train rank's spec file, a `file://` store's
//! `<store>/jobs/<id>/` under `--run-as`.
//!
//! Why: those places are (or lie inside) directories the rank's user owns, and a process as
//! that user (the rank itself, a rank of another job under one shared `--run-as` user) may
//! swap any entry in them for a symbolic link at any moment. A set-up by path (`lchown` then
//! a `chmod` that follows links, or any path whose middle components the kernel resolves)
//! then changes what the link names: root chmods `/etc/shadow` or `/usr` on the user's say.
//!
//! What holds here ([`RankDir`]):
//! - every step starts from a directory descriptor the node opened on a node-owned
//!   directory (`jobs/<id>/generation-<g>/`, `<store>/jobs/`: the user writes neither) and
//!   goes down one component at a time with `openat(O_NOFOLLOW | O_DIRECTORY)`: a link at
//!   any component fails the set-up (`ELOOP`/`ENOTDIR`), never resolves;
//! - owner and mode are set with `fchown`/`fchmod` on the descriptor just opened, so they land
//!   on that inode whatever its name points at a moment later;
//! - a file is written fresh: its old name is unlinked (`unlinkat` removes a link, not its
//!   target), the new one made with `O_CREAT | O_EXCL | O_NOFOLLOW` (a link planted between
//!   the two makes the create fail), then given to the user through its descriptor;
//! - a directory is taken only from the node, the user, or a uid the node may give places to
//!   (its `--run-as-range`): one owned by anybody else was not made for a rank and is refused.
//!
//! The system calls themselves are the crate's `fs_at`, shared with `get --to`'s walk
//! ([`crate::datasets::confined`]); what a step does here is this file's.

use std::{
    ffi::{CString, OsStr},
    io,
    os::{
        fd::{AsFd, AsRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Component, Path},
};

use crate::fs_at::{self, check, component};

/// An open directory the node sets a rank's places up below.
#[derive(Debug)]
pub struct RankDir {
    fd: OwnedFd,
}

/// The owner and mode a place is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Its uid.
    pub uid: u32,
    /// Its gid.
    pub gid: u32,
}

fn give(fd: &OwnedFd, owner: Owner, mode: u32) -> io::Result<()> {
    // SAFETY: plain syscalls on an open descriptor.
    check(unsafe { libc::fchown(fd.as_raw_fd(), owner.uid, owner.gid) })?;
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) })?;
    Ok(())
}

impl RankDir {
    /// Opens `path`, a directory the node owns and only the node writes (its components
    /// are resolved by the kernel, so nothing above it may be the user's); its last
    /// component must not be a link.
    pub fn open_node_dir(path: &Path) -> io::Result<RankDir> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))?;
        let fd = fs_at::open(&c, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW)?;
        let st = fs_at::fstat(fd.as_fd())?;
        let node = nix::unistd::Uid::effective().as_raw();
        if st.st_uid != node {
            return Err(io::Error::other(format!(
                "{} is owned by uid {}, not the node's ({node}): refused",
                path.display(),
                st.st_uid
            )));
        }
        Ok(RankDir { fd })
    }

    /// Opens `name` just below this directory with `flags`, never following a link
    /// (`O_NOFOLLOW`; a file made is 0600 until given away).
    fn open_below(&self, name: &OsStr, c: &CString, flags: libc::c_int) -> io::Result<OwnedFd> {
        fs_at::openat(self.fd.as_fd(), c, flags | libc::O_NOFOLLOW, 0o600)
            .map_err(|e| refused_link(name, e))
    }

    /// Makes (if missing) and opens the directory `name` just below this one without
    /// following a link, refuses it unless the node, `owner` or a uid `may_take` allows
    /// owns it, and gives it to `owner` with `mode`.
    pub fn own_child_dir(
        &self,
        name: &OsStr,
        owner: Owner,
        mode: u32,
        may_take: &dyn Fn(u32) -> bool,
    ) -> io::Result<RankDir> {
        let c = component(name)?;
        fs_at::mkdirat(self.fd.as_fd(), &c, 0o700)?;
        let fd = self.open_below(name, &c, libc::O_RDONLY | libc::O_DIRECTORY)?;
        let st = fs_at::fstat(fd.as_fd())?;
        let node = nix::unistd::Uid::effective().as_raw();
        if st.st_uid != node && st.st_uid != owner.uid && !may_take(st.st_uid) {
            return Err(io::Error::other(format!(
                "directory {name:?} is owned by uid {}, neither the node's nor the rank's: refused",
                st.st_uid
            )));
        }
        give(&fd, owner, mode)?;
        Ok(RankDir { fd })
    }

    /// Opens (making them, given to `owner` with `mode`) the directories of `relative`, a
    /// path of plain components below this one, and returns the last one.
    pub fn own_dirs(
        &self,
        relative: &Path,
        owner: Owner,
        mode: u32,
        may_take: &dyn Fn(u32) -> bool,
    ) -> io::Result<Option<RankDir>> {
        let mut at: Option<RankDir> = None;
        for part in relative.components() {
            let Component::Normal(name) = part else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is not a plain relative path", relative.display()),
                ));
            };
            let next = at
                .as_ref()
                .unwrap_or(self)
                .own_child_dir(name, owner, mode, may_take)?;
            at = Some(next);
        }
        Ok(at)
    }

    /// Writes the file `name` just below this directory afresh with `contents`, owned by
    /// `owner` with `mode`: whatever was at the name (a link included) is unlinked, never
    /// followed, and the file is made new (`O_EXCL | O_NOFOLLOW`).
    pub fn write_file(
        &self,
        name: &OsStr,
        contents: &[u8],
        owner: Owner,
        mode: u32,
    ) -> io::Result<()> {
        use std::io::Write as _;
        let c = component(name)?;
        match fs_at::unlinkat(self.fd.as_fd(), &c) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let fd = self.open_below(name, &c, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL)?;
        give(&fd, owner, mode)?;
        let mut file = std::fs::File::from(fd);
        file.write_all(contents)?;
        file.flush()
    }
}

/// The error of an `openat` that met a link (or anything else it must not follow).
fn refused_link(name: &OsStr, e: io::Error) -> io::Error {
    match fs_at::met(&e) {
        Some(_) => io::Error::other(format!(
            "{name:?} is a symbolic link or not what the set-up made (changed under it): refused ({e})"
        )),
        None => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// The test process's own ids: giving a place to them needs no privilege.
    fn me() -> Owner {
        Owner {
            uid: nix::unistd::Uid::effective().as_raw(),
            gid: nix::unistd::Gid::effective().as_raw(),
        }
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    /// A victim the rank's user wants root to change: 0644.
    fn victim(dir: &Path) -> std::path::PathBuf {
        let v = dir.join("victim");
        std::fs::write(&v, b"keep").unwrap();
        std::fs::set_permissions(&v, std::fs::Permissions::from_mode(0o644)).unwrap();
        v
    }

    #[test]
    fn a_link_planted_at_a_files_path_is_replaced_and_its_target_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = victim(tmp.path());
        let gen = tmp.path().join("generation-0");
        std::fs::create_dir(&gen).unwrap();
        let base = RankDir::open_node_dir(&gen).unwrap();
        let work = base
            .own_child_dir(OsStr::new("worker-0"), me(), 0o700, &|_| false)
            .unwrap();
        // The rank's user (another job's rank under one shared user) plants the link
        // before the node writes the job's file.
        std::os::unix::fs::symlink(&victim, gen.join("worker-0/f")).unwrap();
        work.write_file(OsStr::new("f"), b"spec", me(), 0o600)
            .unwrap();
        assert_eq!(mode(&victim), 0o644, "the link's target kept its mode");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let f = gen.join("worker-0/f");
        assert!(std::fs::symlink_metadata(&f).unwrap().is_file());
        assert_eq!(
            (mode(&f), std::fs::read(&f).unwrap()),
            (0o600, b"spec".to_vec())
        );
    }

    #[test]
    fn a_link_at_any_directory_component_fails_the_set_up_and_is_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let victim_dir = tmp.path().join("usr");
        std::fs::create_dir(&victim_dir).unwrap();
        std::fs::set_permissions(&victim_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let gen = tmp.path().join("generation-0");
        std::fs::create_dir_all(gen.join("worker-0")).unwrap();
        // The work directory itself, and a `[[files]]` subdirectory, swapped for links.
        std::os::unix::fs::symlink(&victim_dir, gen.join("worker-1")).unwrap();
        std::os::unix::fs::symlink(&victim_dir, gen.join("worker-0/sub")).unwrap();
        let base = RankDir::open_node_dir(&gen).unwrap();
        let e = base
            .own_child_dir(OsStr::new("worker-1"), me(), 0o700, &|_| false)
            .unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = base
            .own_dirs(Path::new("worker-0/sub/deeper"), me(), 0o700, &|_| false)
            .unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(mode(&victim_dir), 0o755, "the link's target kept its mode");
        assert!(
            !victim_dir.join("deeper").exists(),
            "nothing made through the link"
        );
        // A base that is itself a link is refused too.
        std::os::unix::fs::symlink(&gen, tmp.path().join("gen-link")).unwrap();
        assert!(RankDir::open_node_dir(&tmp.path().join("gen-link")).is_err());
        // Not plain components: refused.
        for bad in ["../x", "/abs", "a/../b"] {
            assert!(
                base.own_dirs(Path::new(bad), me(), 0o700, &|_| false)
                    .is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn directories_and_files_go_to_the_owner_with_their_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let base = RankDir::open_node_dir(tmp.path()).unwrap();
        let sub = base
            .own_dirs(Path::new("w/a/b"), me(), 0o700, &|_| false)
            .unwrap()
            .unwrap();
        sub.write_file(OsStr::new("x"), b"1", me(), 0o600).unwrap();
        // Again (a re-run in the same place): the file is written afresh.
        let sub = base
            .own_dirs(Path::new("w/a/b"), me(), 0o700, &|_| false)
            .unwrap()
            .unwrap();
        sub.write_file(OsStr::new("x"), b"2", me(), 0o600).unwrap();
        let x = tmp.path().join("w/a/b/x");
        assert_eq!(std::fs::read(&x).unwrap(), b"2");
        for d in ["w", "w/a", "w/a/b"] {
            let p = tmp.path().join(d);
            assert_eq!(mode(&p), 0o700, "{d}");
            assert_eq!(std::fs::metadata(&p).unwrap().uid(), me().uid);
        }
    }
}
