//! System calls at a directory descriptor, never following a link on their own: the base of
//! the two walkers that open a path one component at a time, [`crate::datasets::confined`]
//! (`ConfinedDir`: where `dataset get --to` reads and writes) and
//! [`crate::security::rank_dir`] (`RankDir`: a rank's places set up as root).
//!
//! Why one base: a walk by descriptor is only as sound as its smallest pieces. Each call here
//! takes the directory as a borrowed descriptor and one name, opens with `O_CLOEXEC` into a
//! descriptor owned at once, looks a name up with `AT_SYMLINK_NOFOLLOW`, and says what an
//! `O_NOFOLLOW` open met instead of what it asked for ([`Met`]), so both walkers read the
//! kernel's answers the same way. What a walker does at each step (create what is missing,
//! follow an operator's link, give a place to a user, which errors it reports and how) is its
//! own policy, in its own file.
//!
//! Contract: no call here follows a symbolic link unless the caller's `flags` leave out
//! `O_NOFOLLOW` (an `openat` follows a link at its last component then, as the kernel does);
//! `name` is looked up in `dir` alone, so it should be one component (see [`component`]).
//! Every call is one blocking system call.

use std::{
    ffi::{CStr, CString, OsStr},
    io,
    os::{
        fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
};

/// `name` as a C string for a system call; a NUL in it is refused (`InvalidInput`).
fn c_name(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// `name` as a C string, refused (`InvalidInput`, naming it) unless it is one plain path
/// component: not empty, not `.` or `..`, no `/` and no NUL.
pub(crate) fn component(name: &OsStr) -> io::Result<CString> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not one plain path component"),
        ));
    }
    c_name(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a name"))
}

/// A libc return checked: negative is the thread's `errno` as an error, anything else is
/// returned as it is.
pub(crate) fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Opens `path` (resolved by the kernel from the working directory, every component but a
/// last one under `O_NOFOLLOW` followed) with `flags | O_CLOEXEC`.
pub(crate) fn open(path: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: a syscall on a NUL-terminated path; the descriptor it returns is ours alone.
    let fd = check(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `name` in `dir` with `flags | O_CLOEXEC` (`mode`: a file's mode when `flags` create
/// one, narrowed by the umask).
pub(crate) fn openat(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    // SAFETY: a syscall on a valid descriptor and a NUL-terminated name; the descriptor it
    // returns is ours alone.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            libc::c_uint::from(mode),
        )
    })?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes the directory `name` in `dir` with `mode` (narrowed by the umask); something already
/// there under that name, whatever it is, is no error: the open that follows, without
/// following a link, tells what it is.
pub(crate) fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: a syscall on a valid descriptor and a NUL-terminated name.
    match check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        r => r.map(drop),
    }
}

/// Removes the name `name` from `dir` (a link itself, never its target; not a directory).
pub(crate) fn unlinkat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: a syscall on a valid descriptor and a NUL-terminated name.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) }).map(drop)
}

/// What `name` in `dir` is, not following a link (a link's own `stat`), or `None` when
/// nothing has that name.
pub(crate) fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Option<libc::stat>> {
    // SAFETY: `stat` is plain data that fstatat fills in.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a syscall on a valid descriptor, a NUL-terminated name and our own buffer.
    let ret = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    match check(ret) {
        Ok(_) => Ok(Some(st)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// What the open descriptor `fd` is.
pub(crate) fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: `stat` is plain data that fstat fills in.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a syscall on an open descriptor and our own buffer.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// What an open met at a name instead of what its flags asked for: how the kernel says "not
/// what you meant to open" (a walker refuses each, each in its own words).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Met {
    /// A symbolic link under `O_NOFOLLOW` (`ELOOP`).
    Link,
    /// Something not a directory under `O_DIRECTORY`, or at a component a walk went through
    /// (`ENOTDIR`); a link too, under `O_NOFOLLOW | O_DIRECTORY` (the kernel may find it no
    /// directory before it finds it a link: a walker takes both as refused).
    NotDir,
    /// Something already there under `O_CREAT | O_EXCL`, a link included (`EEXIST`).
    Exists,
}

/// What an open's error `e` says it met instead, if that is what it says.
pub(crate) fn met(e: &io::Error) -> Option<Met> {
    match e.raw_os_error()? {
        libc::ELOOP => Some(Met::Link),
        libc::ENOTDIR => Some(Met::NotDir),
        libc::EEXIST => Some(Met::Exists),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::os::unix::fs::symlink;

    use super::*;

    fn dir_fd(path: &std::path::Path) -> OwnedFd {
        open(
            &c_name(path.as_os_str()).unwrap(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )
        .unwrap()
    }

    fn c(name: &str) -> CString {
        component(OsStr::new(name)).unwrap()
    }

    #[test]
    fn a_link_at_a_component_is_met_and_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("victim"), b"keep").unwrap();
        let base = tmp.path().join("base");
        std::fs::create_dir(&base).unwrap();
        symlink(&outside, base.join("d")).unwrap();
        symlink(outside.join("victim"), base.join("f")).unwrap();
        let dir = dir_fd(&base);
        let dir = dir.as_fd();

        // Looked up: the link itself, not what it names.
        let st = stat_at(dir, &c("d")).unwrap().unwrap();
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFLNK);

        // Opened as a directory on the way down: refused (as a link, or as no directory),
        // never opened; opened as a file: refused as a link.
        let dirs = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        for flags in [dirs, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW] {
            let e = openat(dir, &c("d"), flags, 0).unwrap_err();
            assert!(matches!(met(&e), Some(Met::Link | Met::NotDir)), "{e}");
        }
        let e = openat(dir, &c("f"), libc::O_RDONLY | libc::O_NOFOLLOW, 0).unwrap_err();
        assert_eq!(met(&e), Some(Met::Link), "{e}");

        // Created over: refused, the target neither made nor written.
        let create = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let e = openat(dir, &c("f"), create, 0o600).unwrap_err();
        assert_eq!(met(&e), Some(Met::Exists), "{e}");
        symlink(outside.join("made"), base.join("dangling")).unwrap();
        let e = openat(dir, &c("dangling"), create, 0o600).unwrap_err();
        assert_eq!(met(&e), Some(Met::Exists), "{e}");
        assert!(
            !outside.join("made").exists(),
            "nothing made through the link"
        );

        // A directory made where the link is: the link stays, nothing made through it.
        mkdirat(dir, &c("d"), 0o700).unwrap();
        assert!(std::fs::symlink_metadata(base.join("d"))
            .unwrap()
            .file_type()
            .is_symlink());

        // Unlinked: the link goes, its target stays.
        unlinkat(dir, &c("f")).unwrap();
        assert!(stat_at(dir, &c("f")).unwrap().is_none());
        assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"keep");

        // A file where a directory is asked for: not a directory.
        std::fs::write(base.join("plain"), b"").unwrap();
        let e = openat(dir, &c("plain"), dirs, 0).unwrap_err();
        assert_eq!(met(&e), Some(Met::NotDir), "{e}");

        // The base itself a link: refused by `open` under `O_NOFOLLOW`.
        symlink(&base, tmp.path().join("base-link")).unwrap();
        let e = open(
            &c_name(tmp.path().join("base-link").as_os_str()).unwrap(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )
        .unwrap_err();
        assert!(matches!(met(&e), Some(Met::Link | Met::NotDir)), "{e}");
    }

    #[test]
    fn a_missing_component_is_reported_as_missing() {
        let tmp = tempfile::tempdir().unwrap();
        let fd = dir_fd(tmp.path());
        let dir = fd.as_fd();
        assert!(stat_at(dir, &c("none")).unwrap().is_none());
        let e = openat(dir, &c("none"), libc::O_PATH | libc::O_DIRECTORY, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert_eq!(met(&e), None);
        let e = unlinkat(dir, &c("none")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");

        // Made, then made again (someone else first): both fine, one directory.
        mkdirat(dir, &c("new"), 0o700).unwrap();
        mkdirat(dir, &c("new"), 0o700).unwrap();
        let sub = openat(
            dir,
            &c("new"),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
        .unwrap();
        let st = fstat(sub.as_fd()).unwrap();
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFDIR);
    }

    #[test]
    fn names_that_are_not_one_plain_component_are_refused() {
        for bad in ["", ".", "..", "a/b", "/abs"] {
            let e = component(OsStr::new(bad)).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
            assert!(e.to_string().contains("plain path component"), "{e}");
        }
        let e = component(OsStr::new("a\0b")).unwrap_err();
        assert_eq!(e.to_string(), "NUL in a name");
        let e = c_name(OsStr::new("a\0b")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(c("a.b").as_bytes(), b"a.b");
    }
}
