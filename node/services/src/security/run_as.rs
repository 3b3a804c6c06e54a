//! `--run-as USER`: ranks run as another, unprivileged user, so a rank cannot read the
//! node's secrets (cluster key, API token, identity key) or its Raft state.
//!
//! What a node started as root with `--run-as` does:
//! - at start ([`RunAs::resolve`]): refuses a user that does not exist, and a node that is not
//!   root (it could not change a rank's user);
//! - the data directory, `jobs/`, each `jobs/<id>/` and `jobs/<id>/generation-<g>/` are 0711
//!   ([`RunAs::traverse_dirs`], kept so by the modes pass at start): a rank may pass through
//!   them to its own work directory but not list them; every file the node keeps there (the
//!   keys, the token, `raft/`, the ranks' logs) stays 0600/0700 and node-owned;
//! - each rank gets a work directory `jobs/<id>/generation-<g>/worker-<w>/` owned by the user
//!   (its cwd and `HOME`), its spec file owned by the user too, and runs with the user's uid,
//!   its primary gid, and no supplementary groups;
//! - a train rank's checkpoint place in a `file://` store, `<store>/jobs/<id>/`, is made and
//!   owned by the user, below a node-owned `<store>/jobs/` (0711). A shared file store
//!   (NFS) must give the user the same rights on every host; an S3 store needs nothing (the
//!   rank gets its credentials in its environment, as without `--run-as`).
//!
//! - a shared dataset a rank trains on (`[data] dataset`, [`RunAs::share_dataset`]): the
//!   node's whole copy in `<data-dir>/datasets/<root>/` stays node-owned and goes to a group
//!   of the dataset's own, read only (directories 0750, files 0640), below a traversable
//!   `datasets/` (0711), when a rank that needs it starts; that rank runs with that group as
//!   its only group, so other jobs' ranks cannot read the copy, and the copy is taken back
//!   (the node's group, 0700/0600) when the last rank using it on this node ends.
//!
//! The node's own writes into a rank's place (a job's `record.json` in `<store>/jobs/<id>/`)
//! go through [`RunAs::node_storage`]: a private temporary file renamed into place, so a
//! link a rank left there is replaced, never followed.

use std::{
    io,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use crate::{
    domain::state::JobId,
    security::rank_dir::{Owner, RankDir},
};

/// Mode of a directory a rank passes through: traverse for everyone, list and write for the
/// node only.
pub const TRAVERSE_DIR_MODE: u32 = 0o711;
/// Mode of the directories a rank owns.
pub const RANK_DIR_MODE: u32 = 0o700;
/// Mode of the files a rank must read (its spec file), owned by the rank's user.
pub const RANK_FILE_MODE: u32 = 0o600;

/// Mode of a shared dataset's directories under `--run-as`: the node's, read and traverse
/// for the ranks' group.
pub const DATASET_DIR_MODE: u32 = 0o750;
/// Mode of a shared dataset's files under `--run-as`: the node's, read for the ranks' group.
pub const DATASET_FILE_MODE: u32 = 0o640;
/// Most entries [`RunAs::share_dataset`] visits in one copy (as the modes pass at start).
pub const SHARE_ENTRIES_MAX: usize = crate::security::modes::TIGHTEN_ENTRIES_MAX;

/// Why `--run-as` is refused at start.
#[derive(Debug, thiserror::Error)]
pub enum RunAsError {
    /// No user by that name or uid.
    #[error("--run-as {user}: no such user")]
    NoSuchUser {
        /// The name or uid given.
        user: String,
    },
    /// The user database could not be read.
    #[error("--run-as {user}: looking the user up: {source}")]
    Lookup {
        /// The name or uid given.
        user: String,
        /// The lookup's error.
        source: nix::Error,
    },
    /// The node is not root, so it cannot start processes as another user.
    #[error("--run-as {user}: the node must run as root to start ranks as another user (it runs as uid {euid})")]
    NotRoot {
        /// The name or uid given.
        user: String,
        /// The node's effective uid.
        euid: u32,
    },
    /// A directory could not be given its owner or mode.
    #[error("--run-as: preparing {path}: {source}")]
    Prepare {
        /// The directory.
        path: String,
        /// The I/O error.
        source: io::Error,
    },
}

/// The user ranks run as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid (the ranks' only group).
    pub gid: u32,
}

impl RunAs {
    /// Looks `user` up (a name, or a uid in decimal), without checking who the node is.
    pub fn lookup(user: &str) -> Result<RunAs, RunAsError> {
        let lookup = |source| RunAsError::Lookup {
            user: user.to_string(),
            source,
        };
        let found = match user.parse::<u32>() {
            Ok(uid) => nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)),
            Err(_) => nix::unistd::User::from_name(user),
        }
        .map_err(lookup)?
        .ok_or_else(|| RunAsError::NoSuchUser {
            user: user.to_string(),
        })?;
        Ok(RunAs {
            name: found.name,
            uid: found.uid.as_raw(),
            gid: found.gid.as_raw(),
        })
    }

    /// Looks `user` up and checks the node can switch to it (it runs as root).
    pub fn resolve(user: &str) -> Result<RunAs, RunAsError> {
        let run_as = RunAs::lookup(user)?;
        let euid = nix::unistd::Uid::effective().as_raw();
        if euid != 0 {
            return Err(RunAsError::NotRoot {
                user: user.to_string(),
                euid,
            });
        }
        Ok(run_as)
    }

    /// The directories below `data_dir` a rank passes through to its work directory, its
    /// dataset and its checkpoints (mode [`TRAVERSE_DIR_MODE`]): the data directory, `jobs/`,
    /// `datasets/`, and, for a `file://` store, the store's root and its `jobs/`.
    pub fn traverse_dirs(data_dir: &Path, storage: &str) -> Vec<PathBuf> {
        let mut dirs = vec![
            data_dir.to_path_buf(),
            data_dir.join("jobs"),
            data_dir.join(DATASETS_DIR),
        ];
        if let Some(root) = file_store_root(storage) {
            dirs.push(root.clone());
            dirs.push(root.join("jobs"));
        }
        dirs
    }

    /// Makes the [`RunAs::traverse_dirs`] (as the node's, if missing) and sets their mode.
    pub fn prepare(&self, data_dir: &Path, storage: &str) -> Result<(), RunAsError> {
        RunAs::prepare_dirs(data_dir, storage)
    }

    /// [`RunAs::prepare`] for any user (`--run-as-range`'s per-job users).
    pub fn prepare_dirs(data_dir: &Path, storage: &str) -> Result<(), RunAsError> {
        for dir in RunAs::traverse_dirs(data_dir, storage) {
            make_traverse_dir(&dir)?;
        }
        Ok(())
    }

    /// The owner of the places the node gives the user ([`RankDir`]).
    pub fn owner(&self) -> Owner {
        Owner {
            uid: self.uid,
            gid: self.gid,
        }
    }

    /// Makes `dir` (its parent must be node-owned, as `<store>/jobs/` is) and gives it to
    /// the user, mode [`RANK_DIR_MODE`], through descriptors that never follow a link
    /// ([`RankDir`]): a link at `dir` is refused. `may_take`: the uids other than the node's
    /// and the user's whose directory may be taken over (a job's earlier uid of the range).
    pub fn own_dir(&self, dir: &Path, may_take: &dyn Fn(u32) -> bool) -> Result<(), RunAsError> {
        let prepare = |source| RunAsError::Prepare {
            path: dir.display().to_string(),
            source,
        };
        let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
            return Err(prepare(io::Error::other("no parent directory")));
        };
        std::fs::create_dir_all(parent).map_err(prepare)?;
        RankDir::open_node_dir(parent)
            .and_then(|p| p.own_child_dir(name, self.owner(), RANK_DIR_MODE, may_take))
            .map(drop)
            .map_err(prepare)
    }

    /// Lets the ranks that use a dataset read the node's whole copy of it, given as the
    /// directory of its files (`<data-dir>/datasets/<root>/files`, a rank's
    /// `RINGLEADER_DATASET_DIR`; anything else is refused), until the last of them ends: the
    /// copy's directories and files stay the node's and go to the dataset's own group
    /// ([`RunAs::dataset_gid`]), modes [`DATASET_DIR_MODE`] and [`DATASET_FILE_MODE`] (nobody
    /// but the node writes them). A rank that uses the copy runs with that group as its only
    /// group; no other rank has it, so another job's ranks (the same user) cannot read the
    /// copy. When the returned [`DatasetShare`] of the last rank using it on this node is
    /// dropped, the copy is taken back (the node's group, 0700 and 0600). `datasets/`
    /// itself is one of the [`RunAs::traverse_dirs`], made so at the node's start. Links and
    /// special files are neither followed nor changed (the store holds none; only the node
    /// writes there). The copy's own directory is done last, so one with the dataset's group
    /// and that mode was shared whole and is not walked again. Blocking: a walk of the copy.
    pub fn share_dataset(&self, files_dir: &Path) -> Result<DatasetShare, RunAsError> {
        let copy = whole_copy(files_dir)?;
        let gid = RunAs::dataset_gid(&copy);
        let mut shares = SHARES.lock().expect("shares lock");
        walk_copy(&copy, Some((gid, DATASET_DIR_MODE, DATASET_FILE_MODE)))?;
        *shares.entry(copy.clone()).or_default() += 1;
        Ok(DatasetShare { copy, gid })
    }

    /// The group a dataset's copy is shared through (see [`RunAs::share_dataset`]): one of
    /// [`DATASET_GIDS`] gids from [`DATASET_GID_BASE`], by the copy's directory name (its
    /// root). A gid needs no entry in `/etc/group`; the host's own groups must not use this
    /// range.
    pub fn dataset_gid(copy: &Path) -> u32 {
        let name = copy
            .file_name()
            .map(|n| n.as_encoded_bytes())
            .unwrap_or(b"");
        let hash = blake3::hash(name);
        let n = u32::from_le_bytes(hash.as_bytes()[..4].try_into().expect("4 bytes"));
        DATASET_GID_BASE + n % DATASET_GIDS
    }

    /// A train rank's place in a `file://` store, `<root>/jobs/<id>/`; `None` for another
    /// store.
    pub fn store_job_dir(storage: &str, id: JobId) -> Option<PathBuf> {
        file_store_root(storage).map(|root| root.join("jobs").join(id.to_string()))
    }
}

impl RunAs {
    /// The storage URL the node itself writes with: for a `file://` store, with opendal's
    /// `atomic_write_dir` set to `<root>/.node-tmp` (node-owned, mode 0700 under the node's
    /// umask), so that every write is a rename into place; any other URL as it is.
    pub fn node_storage(storage: &str) -> String {
        match file_store_root(storage) {
            Some(root) => {
                let sep = if storage.contains('?') { '&' } else { '?' };
                format!(
                    "{storage}{sep}atomic_write_dir={}",
                    root.join(NODE_TMP_DIR).display()
                )
            }
            None => storage.to_string(),
        }
    }
}

/// The node's dataset store, below its data directory.
pub const DATASETS_DIR: &str = "datasets";
/// A whole copy's files, below its directory in the store (`datasets::store`'s layout).
const DATASET_FILES_DIR: &str = "files";
/// A whole copy's manifest, beside its files.
const DATASET_MANIFEST: &str = "manifest.json";

/// The first gid of the dataset groups ([`RunAs::dataset_gid`]): above the ids `useradd`
/// and `systemd`'s dynamic users hand out.
pub const DATASET_GID_BASE: u32 = 2_000_000_000;
/// How many dataset groups there are: two datasets share one by chance once in 16 million.
pub const DATASET_GIDS: u32 = 1 << 24;

/// How many ranks on this node use each shared copy (by its directory). The store is the
/// process's, so this is too; held while a copy is walked, so a share and a take-back of
/// one copy never interleave.
static SHARES: std::sync::Mutex<std::collections::BTreeMap<PathBuf, usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// A rank's use of a shared dataset copy ([`RunAs::share_dataset`]); dropped when the rank
/// has ended: the last one dropped takes the copy back.
#[derive(Debug)]
pub struct DatasetShare {
    copy: PathBuf,
    gid: u32,
}

impl DatasetShare {
    /// The group the rank runs with to read the copy.
    pub fn gid(&self) -> u32 {
        self.gid
    }
}

/// One rank fewer uses `copy`: the last one takes it back. Blocking: a walk.
fn release(copy: &Path) -> Result<(), RunAsError> {
    let mut shares = SHARES.lock().expect("shares lock");
    let left = shares.get_mut(copy).map(|n| {
        *n = n.saturating_sub(1);
        *n
    });
    if left == Some(0) {
        shares.remove(copy);
        walk_copy(copy, None)?;
    }
    Ok(())
}

impl Drop for DatasetShare {
    fn drop(&mut self) {
        let copy = std::mem::take(&mut self.copy);
        let release = move || {
            if let Err(e) = release(&copy) {
                tracing::warn!("a dataset copy not taken back from its ranks' group: {e}");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(release)),
            Err(_) => release(),
        }
    }
}

/// The whole copy whose files `files_dir` is (`<copy>/files` beside `<copy>/manifest.json`).
fn whole_copy(files_dir: &Path) -> Result<PathBuf, RunAsError> {
    let prepare = |path: &Path| {
        let path = path.display().to_string();
        move |source| RunAsError::Prepare { path, source }
    };
    let copy = files_dir
        .parent()
        .filter(|copy| {
            files_dir.file_name() == Some(std::ffi::OsStr::new(DATASET_FILES_DIR))
                && std::fs::symlink_metadata(copy.join(DATASET_MANIFEST)).is_ok_and(|m| m.is_file())
        })
        .ok_or_else(|| {
            prepare(files_dir)(io::Error::other("not the files of a dataset's whole copy"))
        })?;
    let meta = std::fs::symlink_metadata(copy).map_err(prepare(copy))?;
    if !meta.is_dir() {
        return Err(prepare(copy)(io::Error::other("not a directory")));
    }
    Ok(copy.to_path_buf())
}

/// Gives every directory and file of `copy` (the copy's own directory last) the group and
/// modes `to` says (gid, directory mode, file mode), or, for `None`, takes them back: the
/// node's group, 0700 and 0600. A copy already shared whole with `to` is not walked.
fn walk_copy(copy: &Path, to: Option<(u32, u32, u32)>) -> Result<(), RunAsError> {
    use std::os::unix::fs::MetadataExt;
    let prepare = |path: &Path| {
        let path = path.display().to_string();
        move |source| RunAsError::Prepare { path, source }
    };
    let (gid, dir_mode, file_mode) =
        to.unwrap_or((nix::unistd::Gid::effective().as_raw(), 0o700, 0o600));
    let meta = std::fs::symlink_metadata(copy).map_err(prepare(copy))?;
    if to.is_some() && meta.gid() == gid && meta.mode() & 0o777 == dir_mode {
        return Ok(());
    }
    let set = |path: &Path, dir: bool| {
        let mode = if dir { dir_mode } else { file_mode };
        std::os::unix::fs::lchown(path, None, Some(gid)).map_err(prepare(path))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(prepare(path))
    };
    let mut stack = vec![copy.to_path_buf()];
    let mut visited = 0usize;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(prepare(&dir))? {
            let path = entry.map_err(prepare(&dir))?.path();
            visited += 1;
            if visited > SHARE_ENTRIES_MAX {
                return Err(prepare(copy)(io::Error::other(format!(
                    "more than {SHARE_ENTRIES_MAX} entries"
                ))));
            }
            let kind = std::fs::symlink_metadata(&path)
                .map_err(prepare(&path))?
                .file_type();
            if kind.is_dir() {
                set(&path, true)?;
                stack.push(path);
            } else if kind.is_file() {
                set(&path, false)?;
            }
        }
    }
    set(copy, true)
}

/// The node's temporary files in a `file://` store under `--run-as` (see
/// [`RunAs::node_storage`]).
pub const NODE_TMP_DIR: &str = ".node-tmp";

/// Makes `dir` if missing and sets it to [`TRAVERSE_DIR_MODE`] (a node-owned directory a
/// rank passes through).
pub fn make_traverse_dir(dir: &Path) -> Result<(), RunAsError> {
    let prepare = |source| RunAsError::Prepare {
        path: dir.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(prepare)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(TRAVERSE_DIR_MODE))
        .map_err(prepare)
}

/// The root directory of a `file://` (or `fs://`) storage URL.
pub fn file_store_root(storage: &str) -> Option<PathBuf> {
    let rest = storage
        .strip_prefix("file://")
        .or_else(|| storage.strip_prefix("fs://"))?;
    let path = rest.split_once('?').map_or(rest, |(p, _)| p);
    path.starts_with('/').then(|| PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_resolve_by_name_and_uid_and_unknown_ones_are_refused() {
        let root = RunAs::lookup("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(RunAs::lookup("0").unwrap().name, "root");
        let err = RunAs::lookup("no-such-user-rl").unwrap_err();
        assert!(matches!(err, RunAsError::NoSuchUser { .. }), "{err}");
        assert!(err.to_string().contains("no such user"), "{err}");
    }

    #[test]
    fn the_node_replaces_a_link_a_rank_left_in_its_place_and_never_writes_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let place = store.join("jobs/j-1");
        std::fs::create_dir_all(&place).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        std::os::unix::fs::symlink(&victim, place.join("record.json")).unwrap();
        let url = format!("file://{}", store.display());
        assert_eq!(RunAs::node_storage("s3://b/p"), "s3://b/p");
        let op = trainer::operator_from_url(&RunAs::node_storage(&url)).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(op.write("jobs/j-1/record.json", b"{}".to_vec()))
            .unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        let meta = std::fs::symlink_metadata(place.join("record.json")).unwrap();
        assert!(meta.is_file(), "the link was replaced by the record");
    }

    /// A copy as the store leaves it: node-owned, 0700 directories, 0600 files, and a link
    /// no one should follow.
    fn stored_copy(store: &Path) -> PathBuf {
        let files = store.join("abc123").join("files");
        std::fs::create_dir_all(files.join("sub")).unwrap();
        std::fs::write(store.join("abc123/manifest.json"), "{}").unwrap();
        std::fs::write(files.join("a.txt"), "a").unwrap();
        std::fs::write(files.join("sub/b.txt"), "b").unwrap();
        let outside = store.join("outside.txt");
        std::fs::write(&outside, "not the dataset's").unwrap();
        std::os::unix::fs::symlink(&outside, files.join("link")).unwrap();
        for (p, m) in [
            (store.to_path_buf(), 0o700),
            (store.join("abc123"), 0o700),
            (files.clone(), 0o700),
            (files.join("sub"), 0o700),
            (files.join("a.txt"), 0o600),
            (files.join("sub/b.txt"), 0o600),
            (outside, 0o600),
        ] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        }
        files
    }

    #[test]
    fn a_shared_dataset_goes_read_only_to_its_group_and_links_are_left_alone() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let store = tmp.path().join("datasets");
        let files = stored_copy(&store);
        let copy = files.parent().unwrap().to_path_buf();
        let above = std::fs::metadata(tmp.path()).unwrap().permissions().mode() & 0o777;
        // The process's own group: chown to it needs no privilege.
        let gid = nix::unistd::Gid::effective().as_raw();
        let shared = Some((gid, DATASET_DIR_MODE, DATASET_FILE_MODE));
        walk_copy(&copy, shared).unwrap();
        let meta = |p: &Path| std::fs::symlink_metadata(p).unwrap();
        let mode = |p: &Path| meta(p).mode() & 0o777;
        assert_eq!(mode(&store), 0o700, "the store is the start's to open");
        for dir in [&copy, &files, &files.join("sub")] {
            assert_eq!((mode(dir), meta(dir).gid()), (DATASET_DIR_MODE, gid));
        }
        for file in [files.join("a.txt"), files.join("sub/b.txt")] {
            assert_eq!((mode(&file), meta(&file).gid()), (DATASET_FILE_MODE, gid));
        }
        assert!(meta(&files.join("link")).file_type().is_symlink());
        assert_eq!(
            mode(&store.join("outside.txt")),
            0o600,
            "the link was not followed"
        );
        // Shared whole: a second walk does not go below (a file tightened since stays so).
        std::fs::set_permissions(files.join("a.txt"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        walk_copy(&copy, shared).unwrap();
        assert_eq!(mode(&files.join("a.txt")), 0o600);
        // Taken back: the node's group, 0700 and 0600, every entry.
        walk_copy(&copy, None).unwrap();
        for dir in [&copy, &files, &files.join("sub")] {
            assert_eq!(mode(dir), 0o700);
        }
        for file in [files.join("a.txt"), files.join("sub/b.txt")] {
            assert_eq!(mode(&file), 0o600);
        }
        // Nothing but a whole copy's files: not its directory, not a copy without its
        // manifest, not a directory that is not named so.
        let user = RunAs {
            name: "ranks".into(),
            uid: 65534,
            gid,
        };
        for wrong in [copy.clone(), tmp.path().join("files")] {
            std::fs::create_dir_all(&wrong).unwrap();
            let e = user.share_dataset(&wrong).unwrap_err().to_string();
            assert!(e.contains("not the files of a dataset's whole copy"), "{e}");
        }
        assert!(user.share_dataset(Path::new("/")).is_err());
        assert_eq!(mode(tmp.path()), above, "nothing above a copy was touched");
    }

    #[test]
    fn a_copy_is_its_ranks_until_the_last_of_them_ends() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: needs root (a copy goes to a dataset group the test is not in)");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let files = stored_copy(&tmp.path().join("datasets"));
        let copy = files.parent().unwrap().to_path_buf();
        let user = RunAs::lookup("root").unwrap();
        let gid = RunAs::dataset_gid(&copy);
        assert!((DATASET_GID_BASE..DATASET_GID_BASE + DATASET_GIDS).contains(&gid));
        let (a, b) = (
            user.share_dataset(&files).unwrap(),
            user.share_dataset(&files).unwrap(),
        );
        assert_eq!((a.gid(), b.gid()), (gid, gid));
        let meta = |p: &Path| std::fs::symlink_metadata(p).unwrap();
        let file = files.join("a.txt");
        assert_eq!(
            (meta(&file).gid(), meta(&file).mode() & 0o777),
            (gid, 0o640)
        );
        // One rank ended (outside a runtime: taken back at once if it were the last).
        drop(a);
        assert_eq!(meta(&file).gid(), gid, "still shared: a rank uses it");
        drop(b);
        assert_eq!((meta(&file).gid(), meta(&file).mode() & 0o777), (0, 0o600));
        assert_eq!(meta(&copy).mode() & 0o777, 0o700);
    }

    #[test]
    fn only_file_stores_get_directories() {
        let data = Path::new("/d");
        assert_eq!(
            RunAs::traverse_dirs(data, "file:///d/store"),
            [
                PathBuf::from("/d"),
                "/d/jobs".into(),
                "/d/datasets".into(),
                "/d/store".into(),
                "/d/store/jobs".into()
            ]
        );
        assert_eq!(RunAs::traverse_dirs(data, "s3://bucket/p").len(), 3);
        assert_eq!(
            RunAs::store_job_dir("file:///s?x=1", JobId::from_log_index(3)),
            Some(PathBuf::from(format!(
                "/s/jobs/{}",
                JobId::from_log_index(3)
            )))
        );
        assert_eq!(
            RunAs::store_job_dir("memory://", JobId::from_log_index(3)),
            None
        );
    }
}
