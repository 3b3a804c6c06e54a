//! The cluster key as a running node holds it: a value swapped at run time by a key rotation
//! (`ringleader key rotate`), read by everyone who derives from it at the moment of use.
//!
//! What it guarantees:
//!
//! - **One current key.** [`KeyRing::current`] is the key this node seals, dials and proves
//!   with; every holder of a derived key (the swarm's pre-shared-key layer for each new
//!   connection, the datagram seal, the dataset transport, the API's admin token) reads it
//!   here, never from a copy taken at start.
//! - **A bounded overlap.** After a switch the previous key is still *accepted* (a datagram
//!   that opens with it, a dataset handshake proved with it) for `overlap_ms`
//!   ([`KEY_OVERLAP_MS_DEFAULT`]), because members apply the switch a few milliseconds
//!   apart; then it is refused. [`Keys`] is the sans-IO core of that rule (time passed in),
//!   unit-tested below.
//! - **A pending key on disk before it counts.** A key offered by a rotation
//!   ([`KeyRing::offer`]) is written to `<key file>.next` (0600, atomically) and held as
//!   pending; only a switch naming its fingerprint (replicated in the log, see
//!   `domain::state::key_epoch`) makes it current. A node restarted between the offer and the
//!   switch finds the pending key again ([`KeyRing::open`]).
//! - **An atomic key file.** The switch writes the new key over the file the node loaded its
//!   key from (a temporary file, 0600, synced, then renamed over it), so a crash leaves either
//!   the old key or the new one there, never a torn file.
//!
//! The key's fingerprint ([`ClusterKey::fingerprint`]) names a key in the log and in
//! messages without revealing it.

use std::{
    io::Write,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, RwLock,
    },
    time::Instant,
};

use super::identity::{self, ClusterKey};

/// How long a previous key is still accepted after a switch, in milliseconds: members apply
/// the switch within a heartbeat or two of each other (and one down for a moment on
/// catching up), and a datagram or handshake in between must not fail.
pub const KEY_OVERLAP_MS_DEFAULT: u64 = 30_000;

/// The suffix of the pending key's file, beside the key file.
pub const PENDING_SUFFIX: &str = "next";
/// The suffix of the retired key's file (the key before the last switch, kept for values
/// sealed under it), beside the key file.
pub const RETIRED_SUFFIX: &str = "retired";

/// Why a key could not be offered or switched to.
#[derive(Debug, thiserror::Error)]
pub enum KeyRingError {
    /// The offered key's text is not a cluster key.
    #[error("the offered key is not a cluster key: {0}")]
    BadKey(String),
    /// A switch names a key this node was never offered.
    #[error(
        "the cluster switched to the key with fingerprint {wanted}, which this node was never \
         given (it was down or unreachable during `ringleader key rotate`): copy cluster.key \
         from a member to this host and restart with --cluster-key FILE"
    )]
    NotOffered {
        /// The fingerprint the switch names.
        wanted: String,
    },
    /// A key file could not be written or read.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The keys a node holds at one moment: the sans-IO core of [`KeyRing`].
#[derive(Clone)]
pub struct Keys {
    current: ClusterKey,
    /// The key before the last switch, accepted until the time (ms) beside it.
    previous: Option<(ClusterKey, u64)>,
    /// A key offered by a rotation and not switched to yet, with its epoch.
    pending: Option<(u64, ClusterKey)>,
}

impl Keys {
    /// Holding `current` alone.
    pub fn new(current: ClusterKey) -> Keys {
        Keys {
            current,
            previous: None,
            pending: None,
        }
    }

    /// The key this node seals, dials and proves with.
    pub fn current(&self) -> &ClusterKey {
        &self.current
    }

    /// The keys accepted at `now_ms`: the current one first, then the previous one while its
    /// overlap lasts (refused from `until` on).
    pub fn accepted(&self, now_ms: u64) -> Vec<ClusterKey> {
        let mut keys = vec![self.current];
        if let Some((previous, until)) = self.previous {
            if now_ms < until {
                keys.push(previous);
            }
        }
        keys
    }

    /// Holds `key` as pending for `epoch` (a later offer replaces an earlier one: a rotation
    /// retried after a failure offers a fresh key).
    pub fn offer(&mut self, epoch: u64, key: ClusterKey) {
        self.pending = Some((epoch, key));
    }

    /// The key offered by a rotation and not switched to yet, if any.
    pub fn pending(&self) -> Option<ClusterKey> {
        self.pending.map(|(_, k)| k)
    }

    /// The pending key, if its fingerprint is `fingerprint`.
    pub fn pending_named(&self, fingerprint: &str) -> Option<ClusterKey> {
        self.pending
            .filter(|(_, k)| k.fingerprint() == fingerprint)
            .map(|(_, k)| k)
    }

    /// The key before the last switch, whether or not its overlap is over: what was sealed
    /// under it before the switch (a job's `[secrets]` in the log) still opens with it.
    pub fn retired(&self) -> Option<ClusterKey> {
        self.previous.map(|(k, _)| k)
    }

    /// Makes `new` current at `now_ms`; the old current key is accepted until
    /// `now_ms + overlap_ms`. Switching to the current key changes nothing.
    pub fn switch(&mut self, new: ClusterKey, now_ms: u64, overlap_ms: u64) {
        if new.fingerprint() == self.current.fingerprint() {
            return;
        }
        let old = std::mem::replace(&mut self.current, new);
        self.previous = Some((old, now_ms.saturating_add(overlap_ms)));
        self.pending = None;
    }
}

/// The node's keys, shared: a cheap handle (see the module doc).
#[derive(Clone)]
pub struct KeyRing {
    inner: Arc<Inner>,
}

struct Inner {
    keys: RwLock<Keys>,
    /// Grows by one at each switch: holders that cache something derived from the key
    /// (the datagram seal's ciphers) compare it to rebuild.
    generation: AtomicU64,
    /// The time origin of the overlap's deadlines.
    started: Instant,
    overlap_ms: u64,
    /// The file the key was loaded from and a switch writes; `None`: kept in memory only
    /// (tests, tools).
    file: Option<PathBuf>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyRing(REDACTED)")
    }
}

impl KeyRing {
    /// A ring holding `key` in memory only, with the default overlap.
    pub fn fixed(key: ClusterKey) -> KeyRing {
        Self::build(Keys::new(key), None, KEY_OVERLAP_MS_DEFAULT)
    }

    /// The ring of a node whose key was loaded from `file`: a pending key left beside it
    /// (`<file>.next`, by an offer before a restart) is pending again.
    pub fn open(key: ClusterKey, file: &Path, overlap_ms: u64) -> KeyRing {
        let mut keys = Keys::new(key);
        let read = |path: PathBuf| {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|text| identity::parse_cluster_key(&text).ok())
        };
        if let Some(pending) = read(sibling(file, PENDING_SUFFIX)) {
            keys.offer(0, pending);
        }
        // The key before the last switch, for sealed values only: its overlap is over.
        if let Some(retired) = read(sibling(file, RETIRED_SUFFIX)) {
            keys.previous = Some((retired, 0));
        }
        Self::build(keys, Some(file.to_path_buf()), overlap_ms)
    }

    fn build(keys: Keys, file: Option<PathBuf>, overlap_ms: u64) -> KeyRing {
        KeyRing {
            inner: Arc::new(Inner {
                keys: RwLock::new(keys),
                generation: AtomicU64::new(0),
                started: Instant::now(),
                overlap_ms,
                file,
            }),
        }
    }

    fn now_ms(&self) -> u64 {
        self.inner.started.elapsed().as_millis() as u64
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Keys> {
        self.inner.keys.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Keys> {
        self.inner.keys.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The key this node seals, dials and proves with now.
    pub fn current(&self) -> ClusterKey {
        *self.read().current()
    }

    /// The keys accepted now: the current one first, then the previous during its overlap.
    pub fn accepted(&self) -> Vec<ClusterKey> {
        self.read().accepted(self.now_ms())
    }

    /// The keys a peer may prove itself with to this node when this node speaks first
    /// and cannot choose: those [`KeyRing::accepted`] and the pending key (a member that has
    /// switched proves with the key this one was offered and has not switched to yet).
    pub fn provable(&self) -> Vec<ClusterKey> {
        let keys = self.read();
        let mut out = keys.accepted(self.now_ms());
        out.extend(keys.pending());
        out
    }

    /// Grows by one at each switch.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// Takes the key a rotation offers (`text` in the `swarm.key` format) for `epoch`:
    /// writes it to the pending file (0600) and holds it until a switch names it. Returns its
    /// fingerprint.
    pub fn offer(&self, epoch: u64, text: &str) -> Result<String, KeyRingError> {
        let key =
            identity::parse_cluster_key(text).map_err(|e| KeyRingError::BadKey(e.to_string()))?;
        if let Some(file) = &self.inner.file {
            let path = sibling(file, PENDING_SUFFIX);
            write_key(&path, &key, "writing the pending key")?;
        }
        self.write().offer(epoch, key);
        Ok(key.fingerprint())
    }

    /// Makes the key named by `fingerprint` current (see the module doc): nothing if it is
    /// current already; the pending key if it is that one, written over the key file first;
    /// [`KeyRingError::NotOffered`] otherwise. Returns the keys (old, new) when it switched.
    pub fn switch_to(
        &self,
        fingerprint: &str,
    ) -> Result<Option<(ClusterKey, ClusterKey)>, KeyRingError> {
        let mut keys = self.write();
        let old = *keys.current();
        if old.fingerprint() == fingerprint {
            return Ok(None);
        }
        let new = keys
            .pending_named(fingerprint)
            .ok_or_else(|| KeyRingError::NotOffered {
                wanted: fingerprint.to_string(),
            })?;
        if let Some(file) = &self.inner.file {
            let retired = sibling(file, RETIRED_SUFFIX);
            write_key(&retired, &old, "keeping the retired key in")?;
            write_key(file, &new, "writing the new key over")?;
            let _ = std::fs::remove_file(sibling(file, PENDING_SUFFIX));
        }
        keys.switch(new, self.now_ms(), self.inner.overlap_ms);
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
        Ok(Some((old, new)))
    }
}

/// `<file>.<suffix>`: where a pending key waits ([`PENDING_SUFFIX`]) or the retired one is
/// kept ([`RETIRED_SUFFIX`]).
pub fn sibling(file: &Path, suffix: &str) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(suffix);
    file.with_file_name(name)
}

/// A key derived from the cluster key for one use (a context string), read from the ring at
/// each use: a rotation changes it.
#[derive(Clone)]
pub struct DerivedKey(DerivedSource);

#[derive(Clone)]
enum DerivedSource {
    Fixed([u8; 32]),
    Ring(KeyRing, &'static str),
}

impl std::fmt::Debug for DerivedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DerivedKey(REDACTED)")
    }
}

impl DerivedKey {
    /// A key that never changes (tests, tools).
    pub fn fixed(key: [u8; 32]) -> DerivedKey {
        DerivedKey(DerivedSource::Fixed(key))
    }

    /// The key derived for `context` from `ring`'s current key, whichever it is at use.
    pub fn of(ring: &KeyRing, context: &'static str) -> DerivedKey {
        DerivedKey(DerivedSource::Ring(ring.clone(), context))
    }

    /// The key to seal or prove with now.
    pub fn current(&self) -> [u8; 32] {
        match &self.0 {
            DerivedSource::Fixed(k) => *k,
            DerivedSource::Ring(ring, context) => ring.current().derive(context),
        }
    }

    /// The current key, then the retired key's (see [`Keys::retired`]): what a value sealed
    /// before the last rotation opens with.
    pub fn with_retired(&self) -> Vec<[u8; 32]> {
        match &self.0 {
            DerivedSource::Fixed(k) => vec![*k],
            DerivedSource::Ring(ring, context) => {
                let keys = ring.read();
                std::iter::once(*keys.current())
                    .chain(keys.retired())
                    .map(|k| k.derive(context))
                    .collect()
            }
        }
    }
}

/// Writes `key` to `path` ([`write_private_atomically`]); `what` names the write in errors.
fn write_key(path: &Path, key: &ClusterKey, what: &'static str) -> Result<(), KeyRingError> {
    write_private_atomically(path, key.to_swarm_key_text().as_bytes()).map_err(|source| {
        KeyRingError::Io {
            what,
            path: path.display().to_string(),
            source,
        }
    })
}

/// Writes `bytes` to `path` through a temporary file beside it (0600, synced, renamed over
/// `path`): a reader sees the old content or the new, never a part. The temporary file's name
/// is this process's own, so nodes sharing one key file (one host's test cluster) never
/// write into each other's.
fn write_private_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(name);
    let _ = std::fs::remove_file(&tmp);
    {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts.open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        // The rename itself, durable.
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{generate_cluster_key, parse_cluster_key};
    use std::os::unix::fs::PermissionsExt;

    fn key() -> ClusterKey {
        parse_cluster_key(&generate_cluster_key()).unwrap()
    }

    fn names(keys: &[ClusterKey]) -> Vec<String> {
        keys.iter().map(ClusterKey::fingerprint).collect()
    }

    #[test]
    fn the_previous_key_is_accepted_only_during_the_overlap() {
        let (a, b, c) = (key(), key(), key());
        let mut keys = Keys::new(a);
        assert_eq!(names(&keys.accepted(0)), names(&[a]));
        keys.switch(b, 1_000, 500);
        assert_eq!(keys.current().fingerprint(), b.fingerprint());
        assert_eq!(names(&keys.accepted(1_000)), names(&[b, a]));
        assert_eq!(names(&keys.accepted(1_499)), names(&[b, a]));
        assert_eq!(
            names(&keys.accepted(1_500)),
            names(&[b]),
            "refused at the end"
        );
        assert_eq!(names(&keys.accepted(u64::MAX)), names(&[b]));
        // A second switch drops the first key at once: only one previous key is kept.
        keys.switch(c, 1_200, 500);
        assert_eq!(names(&keys.accepted(1_200)), names(&[c, b]));
        // Switching to the current key changes nothing (a replayed switch).
        keys.switch(c, 5_000, 500);
        assert_eq!(names(&keys.accepted(1_600)), names(&[c, b]));
        // An overlap that would pass the end of time ends there.
        let mut keys = Keys::new(a);
        keys.switch(b, u64::MAX - 1, 500);
        assert_eq!(names(&keys.accepted(u64::MAX - 1)), names(&[b, a]));
    }

    #[test]
    fn only_the_offered_key_named_by_its_fingerprint_is_switched_to() {
        let (a, b, c) = (key(), key(), key());
        let mut keys = Keys::new(a);
        assert!(keys.pending_named(&b.fingerprint()).is_none());
        keys.offer(1, b);
        assert!(keys.pending_named(&c.fingerprint()).is_none());
        assert!(keys.pending_named(&b.fingerprint()).is_some());
        // A retried rotation offers a fresh key: the older offer is gone.
        keys.offer(1, c);
        assert!(keys.pending_named(&b.fingerprint()).is_none());
        keys.switch(c, 0, 10);
        assert!(keys.pending_named(&c.fingerprint()).is_none(), "taken");
    }

    #[test]
    fn a_switch_writes_the_key_file_atomically_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cluster.key");
        let (a, b) = (key(), key());
        std::fs::write(&file, a.to_swarm_key_text()).unwrap();
        let ring = KeyRing::open(a, &file, 1_000);
        let err = ring.switch_to(&b.fingerprint()).unwrap_err();
        assert!(err.to_string().contains("copy cluster.key"), "{err}");
        assert!(ring.offer(1, "not a key").is_err());
        assert_eq!(
            ring.offer(1, &b.to_swarm_key_text()).unwrap(),
            b.fingerprint()
        );
        let pending = sibling(&file, PENDING_SUFFIX);
        let mode = std::fs::metadata(&pending).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A restart between the offer and the switch finds the pending key again.
        let ring = KeyRing::open(a, &file, 1_000);
        assert_eq!(ring.generation(), 0);
        let (old, new) = ring.switch_to(&b.fingerprint()).unwrap().unwrap();
        assert_eq!(
            (old.fingerprint(), new.fingerprint()),
            (a.fingerprint(), b.fingerprint())
        );
        assert_eq!(ring.generation(), 1);
        assert_eq!(ring.current().fingerprint(), b.fingerprint());
        assert_eq!(names(&ring.accepted()), names(&[b, a]));
        let on_disk = identity::load_cluster_key(&file).unwrap();
        assert_eq!(on_disk.fingerprint(), b.fingerprint());
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!pending.exists());
        // The switch applied again (a replayed log) changes nothing.
        assert!(ring.switch_to(&b.fingerprint()).unwrap().is_none());
        assert_eq!(ring.generation(), 1);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left.len(), 2, "no temporary file left: {left:?}");
        // A restart after the switch: the retired key opens what was sealed under it, and
        // is accepted for nothing else.
        let again = KeyRing::open(b, &file, 1_000);
        assert_eq!(names(&again.accepted()), names(&[b]));
        let secrets = DerivedKey::of(&again, "ctx");
        assert_eq!(secrets.current(), b.derive("ctx"));
        assert_eq!(
            secrets.with_retired(),
            vec![b.derive("ctx"), a.derive("ctx")]
        );
        let mode = std::fs::metadata(sibling(&file, RETIRED_SUFFIX))
            .unwrap()
            .permissions();
        assert_eq!(mode.mode() & 0o777, 0o600);
    }

    /// A ring that switched from `a` to `b` with `overlap_ms`.
    fn switched(a: ClusterKey, b: ClusterKey, overlap_ms: u64) -> KeyRing {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cluster.key");
        let ring = KeyRing::open(a, &file, overlap_ms);
        ring.offer(1, &b.to_swarm_key_text()).unwrap();
        ring.switch_to(&b.fingerprint()).unwrap().unwrap();
        ring
    }

    /// The datagram seal follows the ring: after a switch it seals with the new key, opens
    /// the old key's datagrams during the overlap and refuses them after it.
    #[test]
    fn datagrams_sealed_with_the_old_key_open_only_during_the_overlap() {
        use crate::datagrams::{OpenError, Seal};
        let (a, b) = (key(), key());
        let sender = libp2p::PeerId::random();
        let old = Seal::new(Some(&a), &sender).seal(b"hello");
        let new = Seal::new(Some(&b), &sender).seal(b"hello");
        let during = Seal::with_ring(Some(switched(a, b, 60_000)), &sender);
        assert_eq!(during.open(&old).unwrap().frame, b"hello");
        assert_eq!(during.open(&new).unwrap().frame, b"hello");
        let sealed = during.seal(b"x");
        assert!(
            Seal::new(Some(&b), &sender).open(&sealed).is_ok(),
            "seals with the new key"
        );
        assert!(Seal::new(Some(&a), &sender).open(&sealed).is_err());
        let after = Seal::with_ring(Some(switched(a, b, 0)), &sender);
        assert!(matches!(after.open(&old), Err(OpenError::Forged)));
        assert_eq!(after.open(&new).unwrap().frame, b"hello");
        // A member offered `b` and not yet switched opens what one that switched seals.
        let waiting = KeyRing::fixed(a);
        waiting.offer(1, &b.to_swarm_key_text()).unwrap();
        let waiting = Seal::with_ring(Some(waiting), &sender);
        assert_eq!(waiting.open(&new).unwrap().frame, b"hello");
        assert_eq!(waiting.open(&old).unwrap().frame, b"hello");
        let stranger = Seal::new(Some(&key()), &sender).seal(b"hello");
        assert!(matches!(waiting.open(&stranger), Err(OpenError::Forged)));
    }
}
