//! The control plane's RPC messages between nodes (JSON in the node's wire codec): Raft's own
//! messages, writes forwarded to the chief, reads of rank logs.

use openraft::{
    error::{InstallSnapshotError, RaftError},
    raft::{
        AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest,
        InstallSnapshotResponse, VoteRequest, VoteResponse,
    },
};
use serde::{Deserialize, Serialize};

use crate::{
    control::{
        state::{ControlCommand, ControlResponse, JobId},
        store::{NodeId, TypeConfig},
    },
    jobs::logs::LogChunk,
};

/// RPCs between nodes' control planes.
#[derive(Debug, Serialize, Deserialize)]
#[allow(clippy::large_enum_variant)]
pub enum RpcRequest {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// A write forwarded to the chief.
    Propose(ControlCommand),
    /// A piece of a rank's log kept on the node that ran it.
    Logs {
        job: JobId,
        /// The generation the worker's process was started for.
        generation: u32,
        worker: u32,
        offset: u64,
    },
}

/// Answers to [`RpcRequest`]s.
#[derive(Debug, Serialize, Deserialize)]
pub enum RpcResponse {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    Propose(Result<ControlResponse, ProposeError>),
    Logs(LogChunk),
    /// The request could not be decoded.
    Malformed(String),
}

/// Why a write did not commit. Every variant but `Rejected` is worth retrying.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum ProposeError {
    /// No chief is known: an election is under way, or this side of a partition has no
    /// quorum. Nothing was committed.
    #[error("no chief: no quorum reachable (an election may be under way); nothing was committed, retry")]
    NoChief,
    /// The chief could not be reached or did not answer in time; the write may or may not
    /// have committed.
    #[error("chief unreachable: {0}; the write may or may not have committed, retry")]
    Unreachable(String),
    /// The command is not valid.
    #[error("rejected: {0}")]
    Rejected(String),
}
