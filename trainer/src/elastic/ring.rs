//! Connecting the ring of a generation: over TCP ([`TcpConnector`]) or in memory
//! ([`MemoryRing`], for tests and in-process simulations).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use collective::{
    CollectiveError, Communicator, GroupConfig, Limits, NcclCommunicator, NcclConfig, NcclDouble,
};

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

    /// The generation's NCCL-like device group on the CPU ([`NcclDouble`]), when this
    /// connector gives one ([`MemoryRing::with_nccl_doubles`]); every rank calls it right
    /// after [`RingConnector::nccl`]. None by default.
    fn nccl_double(
        &mut self,
        _generation: &Generation,
    ) -> impl Future<Output = Result<Option<NcclDouble>, TrainError>> + Send {
        async { Ok(None) }
    }
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
    /// Per generation, each rank's transport and heartbeat groups of its [`NcclDouble`];
    /// `None`: no doubles.
    doubles: Option<DoubleSlots>,
}

/// Each generation's ranks' (transport, heartbeat) groups, taken once by each rank.
type DoubleSlots = Arc<Mutex<HashMap<u64, Vec<Option<(Communicator, Communicator)>>>>>;

/// The heartbeat of the doubles' watchdogs, ms: a lost rank is seen within a few.
const DOUBLE_HEARTBEAT_MS: u64 = 10;

impl MemoryRing {
    /// Rings with these limits.
    pub fn new(limits: Limits) -> Self {
        MemoryRing {
            limits,
            groups: Arc::default(),
            doubles: None,
        }
    }

    /// The same rings, and for each generation an [`NcclDouble`] per rank (an NCCL-like
    /// device group: work completes on enqueue, a lost peer blocks it until the watchdog
    /// aborts it), through which ranks on the layer-wise engine average their gradients.
    /// Its waits block the thread: run the ranks on multi-threaded runtimes.
    pub fn with_nccl_doubles(mut self) -> Self {
        self.doubles = Some(Arc::default());
        self
    }

    /// Whether the ranks get [`NcclDouble`]s.
    pub fn gives_nccl_doubles(&self) -> bool {
        self.doubles.is_some()
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

    async fn nccl_double(&mut self, g: &Generation) -> Result<Option<NcclDouble>, TrainError> {
        let Some(doubles) = &self.doubles else {
            return Ok(None);
        };
        let taken = {
            let mut slots = doubles.lock().expect("memory ring lock");
            let slots = match slots.entry(g.generation) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => {
                    let t = Communicator::in_memory(g.world(), self.limits.clone())?;
                    let h = Communicator::in_memory(g.world(), self.limits.clone())?;
                    e.insert(t.into_iter().zip(h).map(Some).collect())
                }
            };
            slots.get_mut(g.rank).and_then(Option::take)
        };
        let (transport, heartbeat) = taken.ok_or_else(|| {
            CollectiveError::Invalid(format!(
                "rank {} of generation {} has no nccl double",
                g.rank, g.generation
            ))
        })?;
        let cfg = NcclConfig {
            heartbeat_interval_ms: DOUBLE_HEARTBEAT_MS,
            ..NcclConfig::default()
        };
        Ok(Some(NcclDouble::start(transport, Some(heartbeat), cfg)?))
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
