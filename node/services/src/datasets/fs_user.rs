//! File access as another user, for one call on the calling thread: how a node run as root
//! reads what `dataset add` names and writes what `dataset get --to` names under
//! `--run-as USER`, so an API request never reaches more of the host than that user could
//! reach itself.
//!
//! Linux keeps credentials per thread. `setfsuid`/`setfsgid` change the ids the kernel checks
//! file access with, for the calling thread only; the supplementary groups are set with the
//! raw `setgroups` system call, which changes the calling thread alone (glibc's wrapper would
//! change every thread of the process). [`FsUser::acting`] switches the calling thread to the
//! user's uid, its primary gid and no other group, runs one blocking closure, and switches
//! back before it returns (on unwind too), so nothing that runs on the thread later (a tokio
//! blocking thread serves many calls) inherits the user's ids. A fsuid changed from 0 to
//! another id also drops the file capabilities (`CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`,
//! `CAP_FOWNER`, …) from the thread's effective set, and changing it back restores them: while
//! acting, root's overrides do not apply, so a file only root may read is refused.
//!
//! A descriptor keeps the access it was opened with: a file opened while acting is read or
//! written after the switch back without another check, which is what lets the node copy what
//! the user may read into its own store.

use std::io;

/// A user whose file access a call takes ([`FsUser::acting`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsUser {
    /// The uid file access is checked with.
    pub uid: u32,
    /// The only group file access is checked with (the user's primary group).
    pub gid: u32,
}

impl FsUser {
    /// Runs `f` on this thread with the file access of this user (uid, primary gid, no other
    /// group), and restores the thread's own before returning. Refused
    /// ([`io::ErrorKind::PermissionDenied`]) if the thread cannot take the user's ids (the
    /// node is not root).
    pub fn acting<T>(self, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let _back = Switch::to(self)?;
        f()
    }
}

/// Runs `f` as `user` ([`FsUser::acting`]), or with the node's own access for `None`.
pub fn acting<T>(user: Option<FsUser>, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    match user {
        Some(user) => user.acting(f),
        None => f(),
    }
}

/// The thread's file ids before a switch; dropping it switches back.
struct Switch {
    uid: u32,
    gid: u32,
    groups: Vec<libc::gid_t>,
}

/// The id `setfsuid`/`setfsgid` never take: a call with it only returns the current one.
const QUERY_ID: libc::c_long = -1;

fn setfsuid(uid: libc::c_long) -> u32 {
    // SAFETY: a system call with a plain integer argument; it returns the previous fsuid.
    unsafe { libc::syscall(libc::SYS_setfsuid, uid) as u32 }
}

fn setfsgid(gid: libc::c_long) -> u32 {
    // SAFETY: as `setfsuid`.
    unsafe { libc::syscall(libc::SYS_setfsgid, gid) as u32 }
}

/// The calling thread's supplementary groups.
fn thread_groups() -> io::Result<Vec<libc::gid_t>> {
    // SAFETY: a size query with no buffer.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups = vec![0 as libc::gid_t; n as usize];
    // SAFETY: the buffer holds `n` gids.
    let got = unsafe { libc::getgroups(n, groups.as_mut_ptr()) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    groups.truncate(got as usize);
    Ok(groups)
}

/// Sets the calling thread's supplementary groups (the raw call: this thread only).
fn set_thread_groups(groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: a system call reading `groups.len()` gids from a valid buffer.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_setgroups,
            groups.len() as libc::c_long,
            groups.as_ptr(),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Switch {
    fn to(user: FsUser) -> io::Result<Switch> {
        let back = Switch {
            uid: setfsuid(QUERY_ID),
            gid: setfsgid(QUERY_ID),
            groups: thread_groups()?,
        };
        // From here on, an early return switches back through `back`'s drop.
        set_thread_groups(&[user.gid])?;
        setfsgid(libc::c_long::from(user.gid));
        setfsuid(libc::c_long::from(user.uid));
        if (setfsuid(QUERY_ID), setfsgid(QUERY_ID)) != (user.uid, user.gid) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "cannot act as uid {} gid {} (the node must run as root)",
                    user.uid, user.gid
                ),
            ));
        }
        Ok(back)
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        setfsuid(libc::c_long::from(self.uid));
        setfsgid(libc::c_long::from(self.gid));
        let groups = set_thread_groups(&self.groups);
        if groups.is_err() || (setfsuid(QUERY_ID), setfsgid(QUERY_ID)) != (self.uid, self.gid) {
            // A thread of the node left with another user's ids would do the node's later
            // work with them: never go on.
            eprintln!("fatal: a thread's file ids could not be restored");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acting_takes_the_users_access_and_gives_it_back() {
        if setfsuid(QUERY_ID) != 0 {
            eprintln!("skipped: needs root (acting as another user takes CAP_SETUID)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"root's").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let nobody = FsUser {
            uid: 65534,
            gid: 65534,
        };
        let err = nobody.acting(|| std::fs::read(&secret)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        // Created while acting: the user's.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let made = dir.path().join("made");
        nobody.acting(|| std::fs::write(&made, b"x")).unwrap();
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&made).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
        // Back to root's access on this thread, and its groups as they were.
        assert_eq!(std::fs::read(&secret).unwrap(), b"root's");
        assert_eq!((setfsuid(QUERY_ID), setfsgid(QUERY_ID)), (0, 0));
        // A panic inside switches back too.
        let groups = thread_groups().unwrap();
        let _ =
            std::panic::catch_unwind(|| nobody.acting(|| -> io::Result<()> { panic!("inside") }));
        assert_eq!(setfsuid(QUERY_ID), 0);
        assert_eq!(thread_groups().unwrap(), groups);
    }

    #[test]
    fn no_user_is_the_nodes_own_access() {
        let euid = nix::unistd::geteuid().as_raw();
        assert_eq!(acting(None, || Ok(setfsuid(QUERY_ID))).unwrap(), euid);
    }
}
