//! Group configuration and named limits.

use std::fmt;
use std::net::SocketAddr;

use crate::error::CollectiveError;

/// Tunables of a communicator. Every rank of a group must use the same values for
/// `chunk_bytes` and `small_bytes_max` (a difference is detected as a mismatch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Deadline for establishing every data-plane connection, ms. Default 10 000.
    pub connect_timeout_ms: u64,
    /// Deadline for one handshake once TCP is connected, ms. Default 2 000.
    pub handshake_timeout_ms: u64,
    /// Deadline of every collective operation, ms. Default 60 000.
    pub op_timeout_ms: u64,
    /// Payload bytes per frame: the pipelining granularity of the ring. A multiple of 8.
    /// Default 512 KiB (measured on loopback, N = 4, 64 MiB: 128 KiB–4 MiB are within noise;
    /// 512 KiB was never worse).
    pub chunk_bytes: usize,
    /// Messages of at most this many bytes use recursive doubling instead of the ring.
    /// Default 64 KiB: the measured crossover on loopback (`collective-bench --algo rd|ring`):
    /// between 64 and 96 KiB for N = 4, 128–256 KiB for N = 3, about 64–128 KiB for N = 2.
    pub small_bytes_max: usize,
    /// `SO_SNDBUF`/`SO_RCVBUF` for data-plane sockets; `None` keeps the kernel's autotuning
    /// (which on Linux grows further than an explicit size capped by `rmem_max`).
    pub socket_buffer_bytes: Option<usize>,
    /// A peer that sends nothing and acknowledges nothing for this long (its host died
    /// without closing its connections) is lost: TCP keepalive and `TCP_USER_TIMEOUT`, ms.
    /// Default 5 000. (A killed process is seen at once: its kernel closes the sockets.)
    pub peer_silence_ms: u64,
    /// Frames each link's reading task may read ahead of the operation (each `chunk_bytes`
    /// of memory). Default 4; at least 3 is used (the ring's chunk-major order needs a link to
    /// hold 4 frames).
    pub read_ahead_frames: usize,
    /// Upper bound on any frame payload, bytes. Default 16 MiB.
    pub frame_bytes_max: usize,
    /// How long a failing rank keeps its connections open to deliver abort frames, ms.
    /// Default 1 000.
    pub abort_linger_ms: u64,
    /// Move a link's data frames to a shared-memory segment when its peer proves it is on
    /// the same host (the TCP connection stays, for aborts and liveness). Both ends must
    /// allow it. Default true (measured in BENCH.md).
    pub shared_memory: bool,
    /// Wait for a shared-memory frame (or a free slot) by sleeping on the segment's futex
    /// on the operation's own thread, instead of through the link's waker thread and the
    /// runtime: one wake-up instead of two on the path of every frame that had to wait,
    /// which on a host with more ranks than cores is most of the time an allreduce spends.
    /// Only for a communicator whose operations run on a thread of their own
    /// (`Runtime::block_on` from a dedicated thread, as `ringleader._native.Ring` does): the
    /// thread is blocked for up to `shm::BLOCKING_WAIT_SLICE_MS` at a time, then yields to
    /// its runtime (timeouts, aborts). Never set it where operations run on a runtime's
    /// worker threads. Default false.
    pub blocking_waits: bool,
    /// Which allreduce runs above `small_bytes_max`. Default [`AllreduceChoice::Ring`]: at
    /// 8 emulated hosts × 2 ranks on 1 Gbit/s the hierarchical plan took 1,530 ms for
    /// 64 MiB against the flat ring's 1,316 (its leader steps do not overlap the leaders'
    /// ring), so it runs only when asked (`auto`: by placement, or `hierarchical`). The
    /// environment variable `RINGLEADER_ALLREDUCE` (`auto`, `ring`, `hierarchical`)
    /// overrides it at [`crate::Communicator::connect`], for measurements. Every rank must
    /// choose alike (a difference is detected as a mismatch).
    pub allreduce: AllreduceChoice,
}

/// The environment variable that overrides [`Limits::allreduce`].
pub const ALLREDUCE_ENV: &str = "RINGLEADER_ALLREDUCE";

/// Which algorithm [`crate::Communicator::allreduce`] uses above `small_bytes_max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllreduceChoice {
    /// Hierarchical ([`crate::hierarchy`]) when the group spans at least two hosts and some
    /// host has two ranks; the flat ring otherwise.
    #[default]
    Auto,
    /// Always the flat ring.
    Ring,
    /// Always hierarchical (on TCP groups; in-memory groups have no placement and use the
    /// ring).
    Hierarchical,
}

impl AllreduceChoice {
    /// Parses `auto`, `ring` or `hierarchical`.
    pub fn parse(s: &str) -> Result<Self, CollectiveError> {
        match s {
            "auto" => Ok(Self::Auto),
            "ring" => Ok(Self::Ring),
            "hierarchical" => Ok(Self::Hierarchical),
            other => Err(CollectiveError::Invalid(format!(
                "{ALLREDUCE_ENV}={other:?}: expected auto, ring or hierarchical"
            ))),
        }
    }

    /// The choice `RINGLEADER_ALLREDUCE` names, if set.
    pub fn from_env() -> Result<Option<Self>, CollectiveError> {
        match std::env::var(ALLREDUCE_ENV) {
            Ok(v) => Self::parse(v.trim()).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(e) => Err(CollectiveError::Invalid(format!("{ALLREDUCE_ENV}: {e}"))),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connect_timeout_ms: 10_000,
            handshake_timeout_ms: 2_000,
            op_timeout_ms: 60_000,
            chunk_bytes: 512 * 1024,
            small_bytes_max: 64 * 1024,
            socket_buffer_bytes: None,
            peer_silence_ms: 5_000,
            read_ahead_frames: 4,
            frame_bytes_max: 16 * 1024 * 1024,
            abort_linger_ms: 1_000,
            shared_memory: true,
            blocking_waits: false,
            allreduce: AllreduceChoice::Ring,
        }
    }
}

impl Limits {
    /// Short timers and small chunks, so tests exercise pipelining and fail fast.
    #[cfg(any(test, feature = "testing"))]
    pub fn for_test() -> Self {
        Limits {
            connect_timeout_ms: 5_000,
            handshake_timeout_ms: 1_000,
            op_timeout_ms: 5_000,
            chunk_bytes: 64,
            small_bytes_max: 96,
            socket_buffer_bytes: None,
            peer_silence_ms: 2_000,
            read_ahead_frames: 2,
            frame_bytes_max: 1024 * 1024,
            abort_linger_ms: 500,
            shared_memory: true,
            blocking_waits: false,
            allreduce: AllreduceChoice::Auto,
        }
    }

    /// Checks the limits are usable.
    pub fn validate(&self) -> Result<(), CollectiveError> {
        let bad = |m: &str| Err(CollectiveError::Invalid(m.into()));
        if self.chunk_bytes == 0 || !self.chunk_bytes.is_multiple_of(8) {
            return bad("chunk_bytes must be a positive multiple of 8");
        }
        if self.chunk_bytes > self.frame_bytes_max || self.frame_bytes_max > u32::MAX as usize {
            return bad("chunk_bytes must not exceed frame_bytes_max (≤ 4 GiB)");
        }
        if self.op_timeout_ms == 0 || self.connect_timeout_ms == 0 || self.peer_silence_ms == 0 {
            return bad("timeouts must be positive");
        }
        Ok(())
    }
}

/// Tunables of an [`crate::NcclCommunicator`]: its watchdog and how it waits for the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclConfig {
    /// Interval between two heartbeats (a barrier on the TCP group that bootstrapped NCCL),
    /// ms. Default 100. A killed peer closes its TCP links at once, a dead host is noticed
    /// after the group's `peer_silence_ms`; the NCCL communicator is aborted at the next
    /// heartbeat after that. A peer whose heartbeats stop (its runtime stalls) is declared
    /// after the group's `op_timeout_ms`.
    pub heartbeat_interval_ms: u64,
    /// When NCCL itself reports an error, how long to wait for the watchdog to name its
    /// cause (usually a lost peer, seen over TCP) before aborting with the NCCL error and
    /// telling the other ranks, ms. Default 1 000.
    pub fault_grace_ms: u64,
    /// Deadline for NCCL's set-up of the communicator (`ncclCommInitRankConfig` until the
    /// communicator reports ready), ms. Default 60 000. Past it, this rank aborts its
    /// communicator and the TCP group, so every rank fails instead of waiting for a peer that
    /// never joins. A peer that dies is noticed sooner, by the heartbeats.
    pub init_timeout_ms: u64,
}

impl Default for NcclConfig {
    fn default() -> Self {
        NcclConfig {
            heartbeat_interval_ms: 100,
            fault_grace_ms: 1_000,
            init_timeout_ms: 60_000,
        }
    }
}

impl NcclConfig {
    /// Short timers for tests. The set-up deadline (10 s) is still long enough for NCCL to
    /// set up a world of one on a busy host.
    #[cfg(any(test, feature = "testing"))]
    pub fn for_test() -> Self {
        NcclConfig {
            heartbeat_interval_ms: 10,
            fault_grace_ms: 100,
            init_timeout_ms: 10_000,
        }
    }

    /// Checks the tunables are usable.
    pub fn validate(&self) -> Result<(), CollectiveError> {
        if self.heartbeat_interval_ms == 0 || self.init_timeout_ms == 0 {
            return Err(CollectiveError::Invalid(
                "heartbeat_interval_ms and init_timeout_ms must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// Everything needed to create one rank of a group.
#[derive(Clone)]
pub struct GroupConfig {
    /// This rank, `0..world`.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Identifies the group (e.g. a hash of the job id).
    pub group_id: u64,
    /// Generation of the group; a connection from another generation is refused.
    pub generation: u64,
    /// Data-plane address of every rank (index = rank).
    pub addrs: Vec<SocketAddr>,
    /// Shared secret; connections are authenticated with a blake3 MAC keyed from it.
    pub secret: Vec<u8>,
    /// Tunables.
    pub limits: Limits,
}

impl fmt::Debug for GroupConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupConfig")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("group_id", &self.group_id)
            .field("generation", &self.generation)
            .field("addrs", &self.addrs)
            .field("secret", &"<redacted>")
            .field("limits", &self.limits)
            .finish()
    }
}

impl GroupConfig {
    /// Checks ranks, addresses and limits.
    pub fn validate(&self) -> Result<(), CollectiveError> {
        if self.world == 0 || self.rank >= self.world {
            return Err(CollectiveError::Invalid(format!(
                "rank {} of world {}",
                self.rank, self.world
            )));
        }
        if self.addrs.len() != self.world {
            return Err(CollectiveError::Invalid(format!(
                "{} addresses for world {}",
                self.addrs.len(),
                self.world
            )));
        }
        if self.world > u32::MAX as usize {
            return Err(CollectiveError::Invalid("world too large".into()));
        }
        self.limits.validate()
    }
}
