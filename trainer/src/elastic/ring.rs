//! Connecting the ring of a generation: over TCP ([`TcpConnector`]) or in memory
//! ([`MemoryRing`], for tests and in-process simulations).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use collective::{CollectiveError, Communicator, GroupConfig, Limits, NcclCommunicator};

use crate::elastic::generation::Generation;
use crate::error::TrainError;
use crate::gpu::connect_nccl;

/// Builds this rank's communicator for a generation.
pub trait RingConnector: Send {
    /// Connects the ring of `generation` (every rank of it calls this).
    fn connect(
        &mut self,
        generation: &Generation,
    ) -> impl Future<Output = Result<Communicator, CollectiveError>> + Send;

    /// The generation's NCCL communicator when every rank trains on CUDA
    /// ([`connect_nccl`], `on_cuda` from [`crate::gpu::Device::trains_on_cuda`]); every rank calls it
    /// right after [`RingConnector::connect`].
    fn nccl(
        &mut self,
        generation: &Generation,
        comm: &mut Communicator,
        on_cuda: bool,
    ) -> impl Future<Output = Result<Option<NcclCommunicator>, TrainError>> + Send;
}

/// Connects over TCP with [`Communicator::connect`]: the generation number goes into the
/// handshake, so a connection from an older generation is refused.
#[derive(Debug, Clone)]
pub struct TcpConnector {
    /// The job's group id (the same in every generation).
    pub group_id: u64,
    /// The collective's limits.
    pub limits: Limits,
}

impl TcpConnector {
    fn config(&self, g: &Generation) -> GroupConfig {
        GroupConfig {
            rank: g.rank,
            world: g.world(),
            group_id: self.group_id,
            generation: g.generation,
            addrs: g.addrs.clone(),
            secret: g.secret.clone().into_bytes(),
            limits: self.limits.clone(),
        }
    }
}

impl RingConnector for TcpConnector {
    async fn connect(&mut self, g: &Generation) -> Result<Communicator, CollectiveError> {
        Communicator::connect(self.config(g)).await
    }

    async fn nccl(
        &mut self,
        g: &Generation,
        comm: &mut Communicator,
        on_cuda: bool,
    ) -> Result<Option<NcclCommunicator>, TrainError> {
        connect_nccl(comm, &self.config(g), on_cuda).await
    }
}

/// In-memory rings shared by the ranks of one process: the first rank to connect to a
/// generation creates its whole group ([`Communicator::in_memory`], world = the number of
/// addresses; the addresses themselves are not used) and every rank takes its own
/// communicator. Cheap to clone; clones share the rings.
#[derive(Debug, Clone)]
pub struct MemoryRing {
    limits: Limits,
    groups: Arc<Mutex<HashMap<u64, Vec<Option<Communicator>>>>>,
}

impl MemoryRing {
    /// Rings with these limits.
    pub fn new(limits: Limits) -> Self {
        MemoryRing {
            limits,
            groups: Arc::default(),
        }
    }
}

impl RingConnector for MemoryRing {
    /// Never: in-memory rings are for CPU ranks.
    async fn nccl(
        &mut self,
        _: &Generation,
        _: &mut Communicator,
        _: bool,
    ) -> Result<Option<NcclCommunicator>, TrainError> {
        Ok(None)
    }

    async fn connect(&mut self, g: &Generation) -> Result<Communicator, CollectiveError> {
        let mut groups = self.groups.lock().expect("memory ring lock");
        let slots = match groups.entry(g.generation) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let comms = Communicator::in_memory(g.world(), self.limits.clone())?;
                e.insert(comms.into_iter().map(Some).collect())
            }
        };
        if slots.len() != g.world() {
            return Err(CollectiveError::Invalid(format!(
                "generation {} has {} ranks, asked for {}",
                g.generation,
                slots.len(),
                g.world()
            )));
        }
        slots.get_mut(g.rank).and_then(Option::take).ok_or_else(|| {
            CollectiveError::Invalid(format!(
                "rank {} of generation {} already connected",
                g.rank, g.generation
            ))
        })
    }
}
