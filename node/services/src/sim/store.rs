//! The simulation's Raft storage: the real state machine ([`ControlState::apply`]) over a log
//! and a snapshot kept in memory, in a [`Disk`] that outlives a node's crash as its files
//! would.
//!
//! Why not the node's store (`control::store`): it writes on tokio's blocking pool, and a
//! blocking write ends on another thread at a moment real time decides, so the tasks that
//! run meanwhile (and what they see) would differ from one run of a seed to the next. Here
//! every write completes before its call returns, as the node's store's does from openraft's
//! side (it fsyncs before answering), so a crash loses the same things: nothing written, and
//! the state machine, which a restart rebuilds from the snapshot and the committed log. The
//! node's store has its own tests (openraft's storage suite, torn tails, corruption); what
//! the simulation tests is the state machine and openraft over faults, which this store runs
//! unchanged.
//!
//! A crash ends a life of the node, but not at once the tasks openraft spawned for it (a
//! replication task may be waiting on the network); a dead process would do nothing more.
//! So each life's stores are fenced: once a new life opens the disk, the old one's calls
//! fail (as its network calls do, [`super::net::Router`]), and a stale replication task
//! cannot read the new life's log and send it under an old term.
//!
//! The types ([`SimConfig`]) are the node's with [`SimRuntime`] as openraft's runtime, so
//! openraft's election timeouts come from the seed.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, LogState, OptionalSend, RaftLogReader,
    RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StorageIOError, StoredMembership,
    Vote,
};

use super::runtime::SimRuntime;
use crate::control::store::{replicable, NodeId, RaftNode};
use crate::domain::state::{ControlCommand, ControlResponse, ControlState};

openraft::declare_raft_types!(
    /// The control plane's openraft types, on the simulation's runtime.
    pub(crate) SimConfig:
        D = ControlCommand,
        R = ControlResponse,
        NodeId = NodeId,
        Node = RaftNode,
        Entry = openraft::Entry<SimConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = SimRuntime,
);

/// A snapshot as kept: metadata and the [`ControlState`] as JSON (as the node stores it).
#[derive(Debug, Clone)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, RaftNode>,
    data: Vec<u8>,
}

/// What a node keeps across a crash: what the node's store keeps in its files.
#[derive(Debug, Default)]
pub(crate) struct Disk {
    entries: BTreeMap<u64, Entry<SimConfig>>,
    purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    snapshot: Option<StoredSnapshot>,
    snapshots_built: u64,
    /// The life that has the disk now.
    life: u64,
}

/// A node's [`Disk`], shared by the stores of each of its lives.
pub(crate) type SharedDisk = Arc<Mutex<Disk>>;

/// One life's hold on the disk: it fails once a later life opened the disk.
#[derive(Clone)]
struct Held {
    disk: SharedDisk,
    life: u64,
}

/// A call from a life of the node that has crashed.
#[derive(Debug)]
struct Crashed(u64);

impl From<Crashed> for StorageError<NodeId> {
    fn from(c: Crashed) -> Self {
        let dead = AnyError::error(format!("life {} of this node has crashed", c.0));
        StorageIOError::read_logs(dead).into()
    }
}

impl Held {
    fn lock(&self) -> Result<MutexGuard<'_, Disk>, Crashed> {
        let disk = self.disk.lock().expect("disk lock");
        if disk.life != self.life {
            return Err(Crashed(self.life));
        }
        Ok(disk)
    }
}

/// openraft's log store over a [`Disk`].
#[derive(Clone)]
pub(crate) struct MemLog {
    disk: Held,
    /// Whether this is the reader replication streams use (`get_log_reader`): it answers
    /// only entries that begin at a range's start, as the node's does
    /// ([`crate::control::store::replicable`]).
    replication: bool,
}

/// A node's stores over its disk for its life `life` (first, or after a crash), which
/// fences off the stores of its earlier lives.
pub(crate) fn open(disk: &SharedDisk, life: u64) -> (MemLog, MemStateMachine) {
    disk.lock().expect("disk lock").life = life;
    let held = Held {
        disk: disk.clone(),
        life,
    };
    let log = MemLog {
        disk: held.clone(),
        replication: false,
    };
    (log, MemStateMachine::open(held))
}

impl RaftLogReader<SimConfig> for MemLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + fmt::Debug + OptionalSend>(
        &mut self,
        r: RB,
    ) -> Result<Vec<Entry<SimConfig>>, StorageError<NodeId>> {
        let disk = self.disk.lock()?;
        if self.replication {
            return Ok(replicable(r.start_bound(), disk.entries.range(r.clone())));
        }
        Ok(disk.entries.range(r).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<SimConfig> for MemLog {
    type LogReader = MemLog;

    async fn get_log_state(&mut self) -> Result<LogState<SimConfig>, StorageError<NodeId>> {
        let disk = self.disk.lock()?;
        let last = disk
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id)
            .or(disk.purged);
        Ok(LogState {
            last_purged_log_id: disk.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> MemLog {
        MemLog {
            disk: self.disk.clone(),
            replication: true,
        }
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.disk.lock()?.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.disk.lock()?.vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        self.disk.lock()?.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.disk.lock()?.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<SimConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<SimConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut disk = self.disk.lock()?;
        for e in entries {
            disk.entries.insert(e.log_id.index, e);
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut disk = self.disk.lock()?;
        disk.entries.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut disk = self.disk.lock()?;
        disk.entries = disk.entries.split_off(&(log_id.index + 1));
        if disk.purged.is_none_or(|p| p < log_id) {
            disk.purged = Some(log_id);
        }
        Ok(())
    }
}

/// The state machine as it lives in memory (lost in a crash).
#[derive(Debug)]
struct Applied {
    state: ControlState,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, RaftNode>,
}

/// openraft's state machine: the real [`ControlState`], snapshots on the [`Disk`].
#[derive(Clone)]
pub(crate) struct MemStateMachine {
    disk: Held,
    applied: Arc<RwLock<Applied>>,
}

fn decode_state(data: &[u8]) -> Result<ControlState, String> {
    serde_json::from_slice(data).map_err(|e| format!("undecodable control state: {e}"))
}

fn to_snapshot(s: &StoredSnapshot) -> Snapshot<SimConfig> {
    Snapshot {
        meta: s.meta.clone(),
        snapshot: Box::new(Cursor::new(s.data.clone())),
    }
}

impl MemStateMachine {
    /// The state machine a node starts with: its disk's snapshot, or an empty state
    /// (openraft re-applies the committed log after it).
    fn open(disk: Held) -> MemStateMachine {
        let mut applied = Applied {
            state: ControlState::default(),
            last_applied: None,
            membership: StoredMembership::default(),
        };
        if let Some(snap) = &disk.lock().expect("this life's disk").snapshot {
            applied.state = decode_state(&snap.data).expect("a snapshot this store wrote");
            applied.last_applied = snap.meta.last_log_id;
            applied.membership = snap.meta.last_membership.clone();
        }
        MemStateMachine {
            disk,
            applied: Arc::new(RwLock::new(applied)),
        }
    }

    /// Reads the current state under a lock.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&ControlState) -> T) -> T {
        f(&self.applied.read().expect("state machine lock").state)
    }

    /// Keeps `snap` on the disk unless a newer one is there.
    fn keep(&self, snap: &StoredSnapshot) -> Result<(), Crashed> {
        let mut disk = self.disk.lock()?;
        if disk
            .snapshot
            .as_ref()
            .is_none_or(|c| c.meta.last_log_id <= snap.meta.last_log_id)
        {
            disk.snapshot = Some(snap.clone());
        }
        Ok(())
    }
}

impl RaftSnapshotBuilder<SimConfig> for MemStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<SimConfig>, StorageError<NodeId>> {
        let built = {
            let mut disk = self.disk.lock()?;
            disk.snapshots_built += 1;
            disk.snapshots_built
        };
        let snap = {
            let applied = self.applied.read().expect("state machine lock");
            let data = serde_json::to_vec(&applied.state).expect("control state serializes");
            let snapshot_id = match applied.last_applied {
                Some(l) => format!("{l}-{built}"),
                None => format!("none-{built}"),
            };
            let meta = SnapshotMeta {
                last_log_id: applied.last_applied,
                last_membership: applied.membership.clone(),
                snapshot_id,
            };
            StoredSnapshot { meta, data }
        };
        self.keep(&snap)?;
        Ok(to_snapshot(&snap))
    }
}

impl RaftStateMachine<SimConfig> for MemStateMachine {
    type SnapshotBuilder = MemStateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, RaftNode>), StorageError<NodeId>>
    {
        let applied = self.applied.read().expect("state machine lock");
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ControlResponse>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<SimConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut applied = self.applied.write().expect("state machine lock");
        let mut out = Vec::new();
        for entry in entries {
            applied.last_applied = Some(entry.log_id);
            out.push(match entry.payload {
                EntryPayload::Blank => ControlResponse::Empty,
                EntryPayload::Normal(cmd) => applied.state.apply(entry.log_id.index, &cmd),
                EntryPayload::Membership(m) => {
                    applied.membership = StoredMembership::new(Some(entry.log_id), m);
                    ControlResponse::Empty
                }
            });
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> MemStateMachine {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, RaftNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        let state = decode_state(&data).map_err(|reason| {
            StorageIOError::read_snapshot(Some(meta.signature()), AnyError::error(reason))
        })?;
        self.keep(&StoredSnapshot {
            meta: meta.clone(),
            data,
        })?;
        let mut applied = self.applied.write().expect("state machine lock");
        applied.state = state;
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<SimConfig>>, StorageError<NodeId>> {
        let disk = self.disk.lock()?;
        Ok(disk.snapshot.as_ref().map(to_snapshot))
    }
}
