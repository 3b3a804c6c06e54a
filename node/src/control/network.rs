//! openraft's network: Raft's own RPCs (append entries, vote, install snapshot) sent to a
//! peer over the swarm's request-response protocol as [`RpcRequest`]s, in the node's wire
//! codec. One client per target; an unreachable peer is reported to openraft, which retries.

use std::time::Duration;

use libp2p::PeerId;
use openraft::{
    error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable},
    network::{RPCOption, RaftNetwork, RaftNetworkFactory},
    raft::{
        AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest,
        InstallSnapshotResponse, VoteRequest, VoteResponse,
    },
};

use crate::{
    cluster::{net::NodeHandle, wire},
    control::{
        protocol::{RpcRequest, RpcResponse},
        store::{NodeId, RaftNode, TypeConfig},
    },
};

/// openraft's network: one client per target, over the node's RPC protocol.
#[derive(Clone)]
pub(super) struct Network {
    pub(super) node: NodeHandle,
}

pub(super) struct Conn {
    node: NodeHandle,
    target: NodeId,
    peer: Option<PeerId>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Conn;

    async fn new_client(&mut self, target: NodeId, node: &RaftNode) -> Conn {
        Conn {
            node: self.node.clone(),
            target,
            peer: node.peer_id.parse().ok(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failure(String);

impl Conn {
    async fn call<E: std::error::Error>(
        &self,
        req: &RpcRequest,
        ttl: Duration,
    ) -> Result<RpcResponse, RPCError<NodeId, RaftNode, E>> {
        let peer = self.peer.ok_or_else(|| {
            RPCError::Unreachable(Unreachable::new(&Failure("bad peer id".into())))
        })?;
        let payload =
            wire::encode_json(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let bytes = tokio::time::timeout(ttl, self.node.rpc(peer, payload))
            .await
            .map_err(|_| {
                RPCError::Unreachable(Unreachable::new(&Failure(format!("no answer in {ttl:?}"))))
            })?
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        wire::decode_json(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))
    }
}

fn unexpected<E: std::error::Error>() -> RPCError<NodeId, RaftNode, E> {
    RPCError::Network(NetworkError::new(&Failure("unexpected answer".into())))
}

impl RaftNetwork<TypeConfig> for Conn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, RaftNode, RaftError<NodeId>>> {
        match self
            .call(&RpcRequest::AppendEntries(rpc), option.hard_ttl())
            .await?
        {
            RpcResponse::AppendEntries(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(unexpected()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, RaftNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self
            .call(&RpcRequest::InstallSnapshot(rpc.into()), option.hard_ttl())
            .await?
        {
            RpcResponse::InstallSnapshot(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(unexpected()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, RaftNode, RaftError<NodeId>>> {
        match self.call(&RpcRequest::Vote(rpc), option.hard_ttl()).await? {
            RpcResponse::Vote(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(unexpected()),
        }
    }
}
