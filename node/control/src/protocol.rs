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
    domain::state::{tokens::Principal, ControlCommand, ControlResponse, JobId},
    logs::LogChunk,
    store::{NodeId, TypeConfig, SNAPSHOT_BYTES_MAX},
};

/// RPCs between nodes' control planes.
#[derive(Debug, Serialize, Deserialize)]
#[allow(clippy::large_enum_variant)]
pub enum RpcRequest {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(SnapshotChunk),
    /// A write the node originates itself (a rank's report, an exit), forwarded to the
    /// chief; what an older node sends for every write. Read as [`Principal::Node`].
    Propose(ControlCommand),
    /// A piece of a rank's log kept on the node that ran it.
    Logs {
        job: JobId,
        /// The generation the worker's process was started for.
        generation: u32,
        worker: u32,
        offset: u64,
        /// Who the API that asked checked the caller to be (an older node sends none:
        /// [`Principal::Node`]).
        #[serde(default)]
        principal: Principal,
    },
    /// Are you there? Asked by the chief before it takes a vote away from a member that gossip
    /// reports down (`voters::hearsay_target`); any answer keeps the member (an older node
    /// answers `Malformed`, which is an answer too).
    Alive,
    /// A user's write (submit, cancel, dataset, token or member change) forwarded to the
    /// chief with the principal the forwarding node's API checked.
    ProposeAs {
        /// The write.
        command: ControlCommand,
        /// Who asked for it.
        principal: Principal,
    },
    /// A key rotation's new cluster key, offered to this member before the switch is
    /// proposed (`rotation`). It travels only in calls, on the swarm's Noise-encrypted,
    /// authenticated streams; answered by [`RpcResponse::KeyTaken`].
    KeyOffer {
        /// The epoch the key is for (the cluster's current one + 1).
        epoch: u64,
        /// The key, in the `swarm.key` text format.
        key: SecretText,
    },
}

/// A secret's text on the wire: `Debug` shows nothing of it, so logging a request never
/// prints it.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretText(pub String);

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("REDACTED")
    }
}

/// One chunk of a snapshot on the wire: openraft's `InstallSnapshotRequest` with its bytes
/// as hex. JSON would write them as a list of numbers, about 3.7 characters a byte, and a
/// chunk of openraft's default size would not fit a frame; hex takes 2, so a chunk of
/// [`SNAPSHOT_CHUNK_BYTES`] is about 2 MiB on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotChunk {
    vote: openraft::Vote<NodeId>,
    meta: openraft::SnapshotMeta<NodeId, crate::store::RaftNode>,
    offset: u64,
    data: String,
    done: bool,
}

/// A snapshot chunk as the RPC server hands it to Raft, once converted from a
/// [`SnapshotChunk`] (the conversion checks its length and offset).
pub type SnapshotRequest = InstallSnapshotRequest<TypeConfig>;

/// The largest snapshot chunk sent, in bytes (openraft's `snapshot_max_chunk_size`).
pub const SNAPSHOT_CHUNK_BYTES: u64 = 1 << 20;

impl From<InstallSnapshotRequest<TypeConfig>> for SnapshotChunk {
    fn from(r: InstallSnapshotRequest<TypeConfig>) -> Self {
        SnapshotChunk {
            vote: r.vote,
            meta: r.meta,
            offset: r.offset,
            data: hex::encode(&r.data),
            done: r.done,
        }
    }
}

impl TryFrom<SnapshotChunk> for InstallSnapshotRequest<TypeConfig> {
    type Error = String;

    /// Refuses a chunk over [`SNAPSHOT_CHUNK_BYTES`], and one reaching past
    /// [`SNAPSHOT_BYTES_MAX`]: openraft writes a chunk at its `offset` into the snapshot
    /// being received (a `Vec` that grows to `offset` first), so an unchecked offset from a
    /// peer would allocate whatever it announces.
    fn try_from(c: SnapshotChunk) -> Result<Self, String> {
        if c.data.len() as u64 > 2 * SNAPSHOT_CHUNK_BYTES {
            return Err(format!(
                "snapshot chunk of {} hex digits, more than the {} of {SNAPSHOT_CHUNK_BYTES} bytes",
                c.data.len(),
                2 * SNAPSHOT_CHUNK_BYTES
            ));
        }
        let end = c.offset.checked_add(c.data.len() as u64 / 2);
        if end.is_none_or(|end| end > SNAPSHOT_BYTES_MAX as u64) {
            return Err(format!(
                "snapshot chunk at offset {} reaches past the snapshot limit of {SNAPSHOT_BYTES_MAX} bytes",
                c.offset
            ));
        }
        let data = hex::decode(&c.data).map_err(|e| format!("snapshot chunk: {e}"))?;
        Ok(InstallSnapshotRequest {
            vote: c.vote,
            meta: c.meta,
            offset: c.offset,
            data,
            done: c.done,
        })
    }
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
    /// A [`RpcRequest::KeyOffer`] taken (the key's fingerprint), or why not.
    KeyTaken(Result<String, String>),
    /// The answer to [`RpcRequest::Alive`].
    Alive,
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
    /// This node's Raft is stopped: its log could not be written (see
    /// `ControlHandle::fault`). Nothing was committed; another node takes the write.
    #[error(
        "this node's control plane is stopped ({0}); nothing was committed, retry on another node"
    )]
    Stopped(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(offset: u64, data: &[u8]) -> SnapshotChunk {
        SnapshotChunk {
            vote: openraft::Vote::default(),
            meta: openraft::SnapshotMeta::default(),
            offset,
            data: hex::encode(data),
            done: false,
        }
    }

    /// A peer announcing a chunk far past the snapshot limit (openraft would grow the
    /// receiving buffer to its offset) gets an error naming the limit, not an allocation.
    #[test]
    fn chunks_past_the_snapshot_limit_are_refused() {
        let ok = SnapshotRequest::try_from(chunk(1 << 20, b"abc")).unwrap();
        assert_eq!((ok.offset, ok.data), (1 << 20, b"abc".to_vec()));
        let last = SNAPSHOT_BYTES_MAX as u64 - 3;
        assert!(SnapshotRequest::try_from(chunk(last, b"abc")).is_ok());
        for offset in [last + 1, 1 << 40, u64::MAX - 1, u64::MAX] {
            let e = SnapshotRequest::try_from(chunk(offset, b"abc")).unwrap_err();
            assert!(e.contains("snapshot limit"), "{e}");
        }
        let too_long = chunk(0, &vec![0u8; SNAPSHOT_CHUNK_BYTES as usize + 1]);
        let e = SnapshotRequest::try_from(too_long).unwrap_err();
        assert!(e.contains("hex digits"), "{e}");
    }

    /// The same through the RPC decoder, as the bytes arrive from a peer.
    #[test]
    fn an_rpc_announcing_a_huge_offset_is_malformed() {
        let rpc = RpcRequest::InstallSnapshot(chunk(1 << 50, b"x"));
        let bytes = crate::cluster::wire::encode_json(&rpc).unwrap();
        let Ok(RpcRequest::InstallSnapshot(c)) = crate::cluster::wire::decode_json(&bytes) else {
            panic!("decodes as a snapshot chunk");
        };
        assert!(SnapshotRequest::try_from(c).is_err());
    }
}
