//! The simulation's network: every node's Raft reachable in memory through one [`Router`],
//! which can cut a link (both ways), take a node down, and delay each call by a seeded
//! latency on the virtual clock. A call over a cut link or to a node that is down fails as
//! unreachable, as a dropped connection would; so does a call from an earlier life of a node
//! (a task of a Raft that crashed, still waiting on the network when the node restarted).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::{
    error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable},
    network::{RPCOption, RaftNetwork, RaftNetworkFactory},
    raft::{
        AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest,
        InstallSnapshotResponse, VoteRequest, VoteResponse,
    },
    Raft,
};
use rand::{rngs::SmallRng, Rng, SeedableRng};

use super::clock;
use super::store::SimConfig;
use crate::control::store::{NodeId, RaftNode};

/// Lowest one-way latency of a call, in milliseconds.
pub(crate) const LATENCY_MS_MIN: u64 = 1;
/// Highest one-way latency of a call, in milliseconds.
pub(crate) const LATENCY_MS_MAX: u64 = 5;

/// Who can reach whom: the running Rafts and the cut links.
#[derive(Default)]
pub(crate) struct Router {
    inner: Mutex<Links>,
}

#[derive(Default)]
struct Links {
    /// Rafts of the nodes that are up, with the life each is in.
    up: BTreeMap<NodeId, (u64, Raft<SimConfig>)>,
    /// Cut links, each as (lower id, higher id).
    cut: BTreeSet<(NodeId, NodeId)>,
    /// Draws the latencies.
    rng: Option<SmallRng>,
}

fn link(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    (a.min(b), a.max(b))
}

/// Why a call did not arrive.
#[derive(Debug)]
struct Down(String);

impl std::fmt::Display for Down {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Down {}

impl Router {
    /// A router whose latencies come from `seed`.
    pub(crate) fn new(seed: u64) -> Arc<Router> {
        let router = Router::default();
        router.inner.lock().unwrap().rng = Some(SmallRng::seed_from_u64(seed));
        Arc::new(router)
    }

    /// `id` is up in its life `life` with `raft`.
    pub(crate) fn up(&self, id: NodeId, life: u64, raft: Raft<SimConfig>) {
        self.inner.lock().unwrap().up.insert(id, (life, raft));
    }

    /// `id` is down: every call to or from it fails.
    pub(crate) fn down(&self, id: NodeId) {
        self.inner.lock().unwrap().up.remove(&id);
    }

    /// Cuts the link between `a` and `b`, both ways.
    pub(crate) fn cut(&self, a: NodeId, b: NodeId) {
        self.inner.lock().unwrap().cut.insert(link(a, b));
    }

    /// Mends every cut link.
    pub(crate) fn heal(&self) {
        self.inner.lock().unwrap().cut.clear();
    }

    /// Whether `from` reaches `to` now.
    pub(crate) fn reaches(&self, from: NodeId, to: NodeId) -> bool {
        let links = self.inner.lock().unwrap();
        links.up.contains_key(&to) && !links.cut.contains(&link(from, to))
    }

    /// `to`'s Raft, after a latency, if `from` (in its life `life`) reaches it.
    async fn reach(&self, from: NodeId, life: u64, to: NodeId) -> Result<Raft<SimConfig>, Down> {
        let delay = {
            let mut links = self.inner.lock().unwrap();
            let rng = links.rng.as_mut().expect("a seeded router");
            rng.gen_range(LATENCY_MS_MIN..=LATENCY_MS_MAX)
        };
        clock::sleep(Duration::from_millis(delay)).await;
        let links = self.inner.lock().unwrap();
        if links.up.get(&from).is_none_or(|(now, _)| *now != life) {
            return Err(Down(format!("node {from} crashed in life {life}")));
        }
        if links.cut.contains(&link(from, to)) {
            return Err(Down(format!("link {from}-{to} cut")));
        }
        links
            .up
            .get(&to)
            .map(|(_, raft)| raft.clone())
            .ok_or_else(|| Down(format!("node {to} down")))
    }
}

/// One node's side of the network: openraft's factory of connections.
#[derive(Clone)]
pub(crate) struct SimNetwork {
    /// The node that calls.
    pub from: NodeId,
    /// The life of `from` this network serves.
    pub life: u64,
    /// Everyone's links.
    pub router: Arc<Router>,
}

/// A connection from one node to another.
pub(crate) struct SimConn {
    from: NodeId,
    life: u64,
    to: NodeId,
    router: Arc<Router>,
}

impl RaftNetworkFactory<SimConfig> for SimNetwork {
    type Network = SimConn;

    async fn new_client(&mut self, target: NodeId, _node: &RaftNode) -> SimConn {
        SimConn {
            from: self.from,
            life: self.life,
            to: target,
            router: self.router.clone(),
        }
    }
}

fn unreachable<E: std::error::Error>(e: Down) -> RPCError<NodeId, RaftNode, E> {
    RPCError::Unreachable(Unreachable::new(&e))
}

/// The target's answer as the caller gets it: a Raft that stopped (shut down while
/// answering) is a network failure, any other error the target's own. (The error type is
/// openraft's, as its network trait returns it.)
#[allow(clippy::result_large_err)]
fn answer<T, E: std::error::Error>(
    to: NodeId,
    r: Result<T, RaftError<NodeId, E>>,
) -> Result<T, RPCError<NodeId, RaftNode, RaftError<NodeId, E>>> {
    match r {
        Ok(r) => Ok(r),
        Err(RaftError::Fatal(_)) => Err(RPCError::Network(NetworkError::new(&Down(
            "target stopped".into(),
        )))),
        Err(e) => Err(RPCError::RemoteError(RemoteError::new(to, e))),
    }
}

impl RaftNetwork<SimConfig> for SimConn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<SimConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, RaftNode, RaftError<NodeId>>> {
        let raft = self
            .router
            .reach(self.from, self.life, self.to)
            .await
            .map_err(unreachable)?;
        answer(self.to, raft.append_entries(rpc).await)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<SimConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, RaftNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let raft = self
            .router
            .reach(self.from, self.life, self.to)
            .await
            .map_err(unreachable)?;
        answer(self.to, raft.install_snapshot(rpc).await)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, RaftNode, RaftError<NodeId>>> {
        let raft = self
            .router
            .reach(self.from, self.life, self.to)
            .await
            .map_err(unreachable)?;
        answer(self.to, raft.vote(rpc).await)
    }
}
