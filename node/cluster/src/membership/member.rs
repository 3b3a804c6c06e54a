//! Member identity, state and the update record that gossip carries.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt::{Debug, Display};
use std::hash::Hash;

/// What identifies a member (a libp2p peer id in the node, `u32` in the simulation).
pub trait NodeId:
    Clone + Eq + Ord + Hash + Debug + Display + Serialize + DeserializeOwned + Send + Sync + 'static
{
}

impl<T> NodeId for T where
    T: Clone
        + Eq
        + Ord
        + Hash
        + Debug
        + Display
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// Application metadata a member advertises (name, addresses, resources, …). It travels
/// with the member's state; a higher `meta_version` wins.
pub trait Metadata:
    Clone + Debug + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static
{
}

impl<T> Metadata for T where
    T: Clone + Debug + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static
{
}

/// A member's state as one member sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum State {
    /// Answering probes.
    Alive,
    /// Missed a probe; declared dead when the suspicion times out unless it refutes.
    Suspect,
    /// Declared dead; kept as a tombstone for `tombstone_ms`.
    Dead,
    /// Left gracefully; final for its incarnation; kept as a tombstone.
    Left,
}

impl State {
    /// `"alive"`, `"suspect"`, `"dead"` or `"left"`, as the API and CLI print it.
    pub fn as_str(&self) -> &'static str {
        match self {
            State::Alive => "alive",
            State::Suspect => "suspect",
            State::Dead => "dead",
            State::Left => "left",
        }
    }

    /// Alive or suspect: still probed and counted in the cluster size.
    pub fn is_live(&self) -> bool {
        matches!(self, State::Alive | State::Suspect)
    }

    /// Dead or left: a tombstone.
    pub fn is_gone(&self) -> bool {
        !self.is_live()
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One member as the local node sees it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Member<I, M> {
    /// The member's id.
    pub id: I,
    /// Incarnation number: only the member itself raises it, to refute a suspicion or
    /// announce that it left; ordering between claims about the member follows it.
    pub incarnation: u64,
    /// Current state in the local view.
    pub state: State,
    /// The member's advertised metadata.
    pub meta: M,
    /// Version of `meta`; only the member itself raises it.
    pub meta_version: u64,
    /// Local time (ms, driver's clock) at which `state` was entered. Not sent on the wire.
    pub state_since_ms: u64,
}

impl<I: Clone, M: Clone> Member<I, M> {
    /// The claim about this member that gossip carries, without its signature (the core
    /// keeps it beside the member and adds it).
    pub fn to_update(&self, from: Option<I>) -> Update<I, M> {
        Update {
            id: self.id.clone(),
            incarnation: self.incarnation,
            state: self.state,
            meta: self.meta.clone(),
            meta_version: self.meta_version,
            from,
            sig: Vec::new(),
        }
    }
}

/// A claim about one member, as gossip and push-pull carry it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Update<I, M> {
    /// The member the claim is about.
    pub id: I,
    /// Incarnation the claim is made at.
    pub incarnation: u64,
    /// Claimed state.
    pub state: State,
    /// The member's metadata at `meta_version`.
    pub meta: M,
    /// Version of `meta`.
    pub meta_version: u64,
    /// For `Suspect`: the member that suspects it (counted as an independent confirmation
    /// of the suspicion). `None` otherwise.
    pub from: Option<I>,
    /// The subject's own signature of the claim this rests on (`claims::Claim::of`): of
    /// `Left` for a leave, of `Alive` at `incarnation` for every other state. Empty when
    /// unsigned (refused by every receiver).
    pub sig: Vec<u8>,
}
