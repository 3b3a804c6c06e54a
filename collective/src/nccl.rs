//! NCCL behind feature `cuda` (cudarc, libraries loaded at run time): the GPU twin of the
//! TCP [`Communicator`], with the same failure semantics.
//!
//! - Bootstrap ([`Communicator::nccl`]): over the TCP group, rank 0's NCCL unique id goes to
//!   every rank, and every rank says whether it can join (`bootstrap`), so a rank without a
//!   GPU or libnccl fails every rank at once with one clear error instead of leaving them
//!   inside NCCL's set-up. Then each rank creates its communicator in NCCL's non-blocking
//!   mode (`ncclCommInitRankConfig` with `blocking = 0`: NCCL connects the ranks on a thread
//!   of its own), starts the watchdog, and polls the set-up until NCCL reports it ready,
//!   within `init_timeout_ms`.
//! - Operations ([`NcclCommunicator::allreduce`], [`NcclCommunicator::broadcast`],
//!   [`NcclCommunicator::allgather`], their out-of-place forms, and
//!   [`NcclCommunicator::allreduce_queued`], one group call over many buffers) take device
//!   buffers and queue NCCL calls on [`NcclCommunicator::stream`]. In non-blocking mode an
//!   NCCL call returns at once (`ncclInProgress`) and NCCL queues the work on a thread of
//!   its own (the first operation also connects to its peers: lazy connection set-up); the
//!   caller polls `ncclCommGetAsyncError` until it is queued (the first call, which
//!   connects, within `init_timeout_ms`, like the set-up). The blocking operations then
//!   wait for the stream by polling it ([`NcclCommunicator::wait_queued`]), never in a call
//!   an abort cannot interrupt (`wait`).
//! - Failure: the TCP group stays connected, owned by a watchdog task that sends a heartbeat
//!   over it (`watchdog`) from before NCCL's set-up on. When a peer is lost the heartbeat
//!   fails on every rank, the watchdog calls `ncclCommAbort`, the pending wait returns, and
//!   every operation of this communicator returns the heartbeat's error:
//!   [`CollectiveError::PeerLost`] naming the lost rank, exactly as the TCP backend, so the
//!   trainer's elastic path is the same on GPUs. An error NCCL reports itself (say,
//!   `ncclRemoteError`) waits `fault_grace_ms` for the watchdog to name a cause, then aborts
//!   this rank's communicator and the TCP group, and the peers fail with
//!   [`CollectiveError::PeerAborted`] naming this rank. A set-up still running at
//!   `init_timeout_ms` (a rank that never joins) ends the same way, with an error naming
//!   this rank and the deadline.
//! - End: [`NcclCommunicator::finish`], the normal end on every rank, is a barrier (a
//!   one-element allreduce), then `ncclCommFinalize` (polled) and `ncclCommDestroy`; a
//!   communicator dropped without it (a failed or abandoned generation) is aborted, so no
//!   end ever waits on a lost peer's work.
//! - Locks: every NCCL call on a communicator runs under its `AbortCell`'s mutex, and in
//!   non-blocking mode every such call is short, so an abort never waits behind a set-up or
//!   a collective. A second mutex lets one thread queue at a time (NCCL refuses a call on a
//!   communicator while its previous call is still being queued).
//!
//! Without the feature [`Communicator::nccl`] still takes part in the bootstrap (the other
//! ranks learn at once that this one cannot join) and returns
//! [`CollectiveError::NotBuiltWithCuda`].
//!
//! Not covered: the part of `ncclCommInitRankConfig` that runs before it returns (this
//! process's CUDA and NCCL initialisation; no peer takes part) runs before the watchdog
//! starts. A peer that stays alive and keeps its heartbeats but never queues its side of an
//! operation (a bug in the caller, which the TCP backend reports as a mismatch) leaves the
//! operation waiting until a rank aborts. In non-blocking mode an argument NCCL rejects
//! (`ncclInvalidArgument`) fails the communicator, so it aborts the generation like any
//! other NCCL error; only the checks made here return [`CollectiveError::Invalid`].
//! `NCCL_COMM_BLOCKING=1` in the environment overrides the config and makes the calls
//! blocking again: leave it unset.

use crate::bootstrap::{self, Unready};
use crate::communicator::Communicator;
use crate::config::NcclConfig;
use crate::error::CollectiveError;
use crate::wait::{StreamState, Waiter};

/// A GPU communicator for the same group as the [`Communicator`] that created it.
///
/// Operations block the calling thread until the GPU has finished them (or the generation
/// failed), except `allreduce_queued`, which returns once its work is queued (`wait_queued`
/// waits for it); the watchdog is a task on the tokio runtime that created the
/// communicator, which must keep running: call the operations from a thread of their own
/// (the thread that drives the GPU, or `spawn_blocking`), not from a task of a
/// current-thread runtime. After any error but
/// [`CollectiveError::Invalid`] the communicator is aborted: every later operation returns
/// the same error; build a new generation to go on. Dropping it ends the communicator
/// (aborting work still queued) and closes the TCP group (the peers see this rank as lost).
pub struct NcclCommunicator {
    rank: usize,
    world: usize,
    #[cfg(feature = "cuda")]
    gpu: gpu::Gpu,
}

impl std::fmt::Debug for NcclCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclCommunicator")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish()
    }
}

#[cfg(not(feature = "cuda"))]
impl NcclCommunicator {
    /// The normal end (see the `cuda` build's); without the feature no communicator is ever
    /// made, so there is nothing to end.
    pub fn finish(self) -> Result<(), CollectiveError> {
        Ok(())
    }
}

impl NcclCommunicator {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }
}

/// Whether libcuda and libnccl can be loaded (cudarc panics on first use otherwise).
#[cfg(feature = "cuda")]
pub fn nccl_available() -> bool {
    // SAFETY: only tries to dlopen the libraries.
    unsafe { cudarc::driver::sys::is_culib_present() && cudarc::nccl::sys::is_culib_present() }
}

/// Whether libcuda and libnccl can be loaded: never without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub fn nccl_available() -> bool {
    false
}

/// The name of an `ncclResult_t` code, for error messages.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn nccl_code_name(code: u32) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        8 => "ncclTimeout",
        _ => "unknown nccl result",
    }
}

/// What a non-blocking communicator's state (`ncclCommGetAsyncError`) says of the last work
/// it was given, its set-up or the queuing of a call: done (`ncclSuccess`), still in
/// progress (`ncclInProgress`), or failed, for good.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn comm_state(code: u32) -> StreamState {
    match code {
        0 => StreamState::Done,
        7 => StreamState::Pending,
        failed => StreamState::Failed(nccl_code_name(failed).to_string()),
    }
}

/// The error of a set-up still in progress after `after_ms`: NCCL does not say which rank
/// it waits for, so it names this one.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn init_deadline_error(rank: usize, world: usize, after_ms: u64) -> CollectiveError {
    CollectiveError::Nccl(format!(
        "set-up of rank {rank} of {world} not done after {after_ms} ms (init_timeout_ms)"
    ))
}

/// The error of a first queued call still in progress after `after_ms`: NCCL connects to
/// the peers at the first operation (lazy connection set-up), and a peer that never queues
/// its side leaves it there.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn first_call_deadline_error(
    rank: usize,
    world: usize,
    after_ms: u64,
) -> CollectiveError {
    CollectiveError::Nccl(format!(
        "first operation of rank {rank} of {world} not queued after {after_ms} ms \
         (init_timeout_ms: nccl connects to the peers then)"
    ))
}

/// How a queued call waits until NCCL has queued it: the first call of a communicator (the
/// connection set-up) under the set-up's deadline, `init_timeout_ms`; later ones without
/// (they only wait for NCCL's own thread, and the watchdog ends them when a peer is lost).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn queue_waiter(first: bool, cfg: &NcclConfig, rank: usize, world: usize) -> Waiter {
    let waiter = Waiter::new(cfg.fault_grace_ms);
    if first {
        let after_ms = cfg.init_timeout_ms;
        waiter.with_deadline(after_ms, first_call_deadline_error(rank, world, after_ms))
    } else {
        waiter
    }
}

impl Communicator {
    /// Creates the NCCL communicator of this group on GPU `device`, consuming the TCP group,
    /// which stays connected for the watchdog's heartbeats (see the module docs of `nccl`).
    /// Every rank must call it. When some rank cannot join (no GPU, no libnccl, built
    /// without `cuda`), every rank returns the same [`CollectiveError::Nccl`] naming those
    /// ranks, and the group is closed. When a rank is lost during NCCL's set-up the others
    /// return [`CollectiveError::PeerLost`] naming it; when the set-up takes longer than
    /// `cfg.init_timeout_ms`, this rank returns a [`CollectiveError::Nccl`] saying so and the
    /// others [`CollectiveError::PeerAborted`] naming it.
    #[cfg(feature = "cuda")]
    pub async fn nccl(
        mut self,
        device: usize,
        cfg: NcclConfig,
    ) -> Result<NcclCommunicator, CollectiveError> {
        cfg.validate()?;
        let available = nccl_available();
        let make_id = || gpu::make_id(available);
        let prepare = || gpu::open(available, device);
        let (id, stream) = bootstrap::agree(&mut self, make_id, prepare).await?;
        let (rank, world) = (self.rank(), self.world());
        let joined = |e: tokio::task::JoinError| CollectiveError::Nccl(format!("init task: {e}"));
        let start = tokio::task::spawn_blocking(move || gpu::init_start(stream, rank, world, id));
        let raw = start.await.map_err(joined)??;
        // The watchdog starts before the set-up is done, so a peer lost meanwhile aborts it.
        let n = NcclCommunicator {
            rank,
            world,
            gpu: gpu::Gpu::start(self, raw, cfg),
        };
        let ready = tokio::task::spawn_blocking(move || n.gpu.wait_ready(rank, world).map(|()| n));
        ready.await.map_err(joined)?
    }

    /// Takes part in the NCCL bootstrap, so the other ranks learn at once that this one
    /// cannot join, and returns [`CollectiveError::NotBuiltWithCuda`].
    #[cfg(not(feature = "cuda"))]
    pub async fn nccl(
        mut self,
        _device: usize,
        cfg: NcclConfig,
    ) -> Result<NcclCommunicator, CollectiveError> {
        cfg.validate()?;
        let no_id = || Err(Unready::NotBuilt);
        let not_built = || Err::<(), _>(Unready::NotBuilt);
        let _ = bootstrap::agree(&mut self, no_id, not_built).await;
        Err(CollectiveError::NotBuiltWithCuda)
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    //! The parts that call CUDA and NCCL.

    use std::sync::{Arc, Mutex};

    use cudarc::driver::{sys as cu, CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
    use cudarc::nccl::{result, sys, NcclType};
    use tracing::warn;

    use super::{
        comm_state, init_deadline_error, nccl_code_name, queue_waiter, NcclCommunicator, Unready,
    };
    use crate::abort::{AbortCell, Abortable};
    use crate::bootstrap::{NcclId, NCCL_ID_BYTES};
    use crate::communicator::Communicator;
    use crate::config::NcclConfig;
    use crate::error::{CollectiveError, ReduceOp};
    use crate::wait::{wait_for, StreamState, Waiter};
    use crate::watchdog::Watchdog;

    /// `NCCL_CONFIG_UNDEF_INT`: a config field left to NCCL's default.
    const CONFIG_UNDEF_INT: i32 = i32::MIN;
    /// The `magic` of an `ncclConfig_t` made by `NCCL_CONFIG_INITIALIZER`.
    const CONFIG_MAGIC: u32 = 0xcafe_beef;

    /// The config of a non-blocking communicator: what `NCCL_CONFIG_INITIALIZER` makes in
    /// the header of NCCL `version` (a version code, `ncclGetVersion`), with `blocking = 0`.
    ///
    /// cudarc lays out the newest struct it knows (NCCL 2.30); every release appends its
    /// fields to the previous ones, and NCCL copies `min(size, its own size)` bytes, then
    /// reads the fields that exist up to `version`. So a library older than the layout
    /// reads its own prefix, a newer one keeps its defaults for the fields we lack.
    pub(super) fn nonblocking_config(version: i32) -> sys::ncclConfig_t {
        let undef = CONFIG_UNDEF_INT;
        sys::ncclConfig_t {
            size: std::mem::size_of::<sys::ncclConfig_t>(),
            magic: CONFIG_MAGIC,
            version: version as u32,
            blocking: 0,
            cgaClusterSize: undef,
            minCTAs: undef,
            maxCTAs: undef,
            netName: std::ptr::null(),
            splitShare: undef,
            trafficClass: undef,
            commName: std::ptr::null(),
            collnetEnable: undef,
            CTAPolicy: undef,
            shrinkShare: undef,
            nvlsCTAs: undef,
            nChannelsPerNetPeer: undef,
            nvlinkCentricSched: undef,
            graphUsageMode: undef,
            numRmaCtx: undef,
            maxP2pPeers: undef,
        }
    }

    /// A non-blocking NCCL communicator (from its set-up on); only the [`AbortCell`] holds
    /// one.
    pub(super) struct RawComm {
        handle: sys::ncclComm_t,
        /// Keeps the CUDA context alive until the communicator is gone.
        stream: Arc<CudaStream>,
    }

    // SAFETY: an NCCL communicator may be used from any thread as long as calls on it do not
    // overlap (ncclCommAbort from another thread is what NCCL's fault tolerance expects);
    // the AbortCell runs every call under its mutex.
    unsafe impl Send for RawComm {}

    impl Abortable for RawComm {
        fn abort(self) {
            if let Err(e) = self.stream.context().bind_to_thread() {
                warn!(error = ?e, "binding the cuda context before ncclCommAbort failed");
            }
            // SAFETY: the handle came from ncclCommInitRankConfig and the AbortCell aborts it
            // once; a non-blocking communicator may be aborted at any point, its set-up
            // included.
            if let Err(e) = unsafe { result::comm_abort(self.handle) } {
                warn!(error = nccl_code_name(e.0 as u32), "ncclCommAbort failed");
            }
        }

        /// `ncclCommDestroy`, after `ncclCommFinalize` has completed (`NcclCommunicator::finish`):
        /// frees the communicator without waiting for a peer.
        fn destroy(self) {
            if let Err(e) = self.stream.context().bind_to_thread() {
                warn!(error = ?e, "binding the cuda context before ncclCommDestroy failed");
            }
            // SAFETY: a live handle, finalized, destroyed once (the AbortCell's invariant).
            if let Err(e) = unsafe { result::comm_destroy(self.handle) } {
                warn!(error = nccl_code_name(e.0 as u32), "ncclCommDestroy failed");
            }
        }
    }

    impl RawComm {
        /// NCCL's state of the communicator (see [`comm_state`]), which also reports errors
        /// of its background threads and kernels. Never blocks.
        fn state(&self) -> StreamState {
            let mut r = sys::ncclResult_t::ncclSuccess;
            // SAFETY: a live handle (we are inside AbortCell::with) and a valid out-pointer.
            let q = unsafe { sys::ncclCommGetAsyncError(self.handle, &mut r) };
            if q != sys::ncclResult_t::ncclSuccess {
                let name = nccl_code_name(q as u32);
                return StreamState::Failed(format!("ncclCommGetAsyncError: {name}"));
            }
            comm_state(r as u32)
        }
    }

    /// Rank 0's id, or why there is none.
    pub(super) fn make_id(available: bool) -> Result<NcclId, Unready> {
        if !available {
            return Err(Unready::NoLibrary);
        }
        let id = result::get_uniqueid().map_err(|e| {
            warn!(error = nccl_code_name(e.0 as u32), "ncclGetUniqueId failed");
            Unready::IdFailed
        })?;
        let mut out = [0u8; NCCL_ID_BYTES];
        for (d, s) in out.iter_mut().zip(id.internal.iter()) {
            *d = *s as u8;
        }
        Ok(out)
    }

    /// Opens `device` and a stream of its own for NCCL.
    pub(super) fn open(available: bool, device: usize) -> Result<Arc<CudaStream>, Unready> {
        if !available {
            return Err(Unready::NoLibrary);
        }
        let no_device = |e: cudarc::driver::DriverError| {
            warn!(device, error = ?e, "cannot open the cuda device");
            Unready::NoDevice
        };
        let ctx = CudaContext::new(device).map_err(no_device)?;
        ctx.new_stream().map_err(no_device)
    }

    fn bind(stream: &CudaStream) -> Result<(), CollectiveError> {
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| CollectiveError::Nccl(format!("bind cuda context: {e:?}")))
    }

    /// Starts NCCL's set-up of this rank's communicator and returns as soon as NCCL has
    /// taken it in hand (the rest runs on a thread of NCCL's: poll the communicator's state).
    /// A set-up that failed after NCCL handed out a handle is returned too; its state says
    /// so.
    pub(super) fn init_start(
        stream: Arc<CudaStream>,
        rank: usize,
        world: usize,
        id: NcclId,
    ) -> Result<RawComm, CollectiveError> {
        let nerr = |what: &str, code: u32| {
            CollectiveError::Nccl(format!("{what}: {}", nccl_code_name(code)))
        };
        bind(&stream)?;
        let mut internal = [0 as std::ffi::c_char; NCCL_ID_BYTES];
        for (d, s) in internal.iter_mut().zip(id) {
            *d = s as std::ffi::c_char;
        }
        let world_i32 =
            i32::try_from(world).map_err(|_| CollectiveError::Invalid("world".into()))?;
        let version = result::get_nccl_version().map_err(|e| nerr("ncclGetVersion", e.0 as u32))?;
        let mut config = nonblocking_config(version);
        let mut handle: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: valid pointers to the handle and the config (NCCL copies the config before
        // returning); rank < world (the group's invariant).
        let r = unsafe {
            sys::ncclCommInitRankConfig(
                &mut handle,
                world_i32,
                sys::ncclUniqueId { internal },
                rank as i32,
                &mut config,
            )
        };
        if handle.is_null() {
            return Err(nerr("ncclCommInitRankConfig", r as u32));
        }
        Ok(RawComm { handle, stream })
    }

    fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
        match op {
            ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
            ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
            ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
            ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        }
    }

    /// An NCCL call that NCCL refused at once: its name and code.
    type Refused = (&'static str, u32);

    /// The outcome of NCCL call `name`: issued (done, or in progress in the background), or
    /// refused.
    fn issued(
        name: &'static str,
        r: Result<result::NcclStatus, result::NcclError>,
    ) -> Result<(), Refused> {
        r.map(|_| ()).map_err(|e| (name, e.0 as u32))
    }

    /// One poll of the work queued on `stream`.
    fn query(stream: &CudaStream) -> StreamState {
        // SAFETY: a live stream of a live context.
        match unsafe { cu::cuStreamQuery(stream.cu_stream()) } {
            cu::CUresult::CUDA_SUCCESS => StreamState::Done,
            cu::CUresult::CUDA_ERROR_NOT_READY => StreamState::Pending,
            e => StreamState::Failed(format!("cuStreamQuery: {e:?}")),
        }
    }

    /// The GPU side of an [`NcclCommunicator`].
    pub(super) struct Gpu {
        stream: Arc<CudaStream>,
        cell: Arc<AbortCell<RawComm>>,
        /// Held while a call is queued, until NCCL has queued it: one at a time. True once
        /// a first call was queued (NCCL's connections are made).
        queuing: Mutex<bool>,
        rank: usize,
        world: usize,
        cfg: NcclConfig,
        /// Dropped after `cell` is closed (see `Drop for NcclCommunicator`).
        _watchdog: Watchdog,
    }

    impl Gpu {
        /// Hands `group` to a new watchdog over `raw`.
        pub(super) fn start(group: Communicator, raw: RawComm, cfg: NcclConfig) -> Self {
            let (rank, world) = (group.rank(), group.world());
            let stream = raw.stream.clone();
            let cell = Arc::new(AbortCell::new(raw, group.abort_handle()));
            let watchdog = Watchdog::spawn(group, cell.clone(), cfg.heartbeat_interval_ms);
            Gpu {
                stream,
                cell,
                queuing: Mutex::new(false),
                rank,
                world,
                cfg,
                _watchdog: watchdog,
            }
        }

        /// NCCL's state of the communicator; `Pending` once it is aborted (the waiter reads
        /// the cause next).
        fn comm_state(&self) -> StreamState {
            self.cell
                .with(|c| Ok(c.state()))
                .unwrap_or(StreamState::Pending)
        }

        /// Waits until NCCL's set-up of the communicator is done, for `init_timeout_ms` at
        /// most.
        pub(super) fn wait_ready(&self, rank: usize, world: usize) -> Result<(), CollectiveError> {
            bind(&self.stream)?;
            let after_ms = self.cfg.init_timeout_ms;
            let waiter = Waiter::new(self.cfg.fault_grace_ms)
                .with_deadline(after_ms, init_deadline_error(rank, world, after_ms));
            wait_for(&self.cell, waiter, || self.comm_state())
        }

        /// Queues NCCL work, one caller at a time: `prepare` takes the buffers' pointers
        /// for the stream, with cudarc's guards (taking them orders the stream after the
        /// buffers' writers; dropping them records the buffers' use at the stream's end);
        /// `calls` makes NCCL calls on the communicator with them, under the cell's lock
        /// (they must not block, which non-blocking mode ensures); then this polls, the lock
        /// released in between, until NCCL has queued the work on the stream, and only then
        /// drops the guards. Returns once queued, not done.
        fn queue<P>(
            &self,
            prepare: impl FnOnce() -> P,
            calls: impl FnOnce(sys::ncclComm_t, &P) -> Result<(), Refused>,
        ) -> Result<(), CollectiveError> {
            bind(&self.stream)?;
            // NCCL refuses a call, and CUDA work on the stream is not allowed, while a
            // previous call is being queued.
            let mut connected = self.queuing.lock().unwrap_or_else(|p| p.into_inner());
            let prepared = prepare();
            // The first call connects to the peers: under the set-up's deadline.
            let waiter = queue_waiter(!*connected, &self.cfg, self.rank, self.world);
            *connected = true;
            let queued = match self.cell.with(|c| Ok(calls(c.handle, &prepared))) {
                Err(cause) => {
                    self.cell.settle();
                    Err(cause)
                }
                Ok(Ok(())) => wait_for(&self.cell, waiter, || self.comm_state()),
                Ok(Err((name, code))) => {
                    let detail = format!("{name}: {}", nccl_code_name(code));
                    wait_for(&self.cell, waiter, || StreamState::Failed(detail.clone()))
                }
            };
            // NCCL's kernels are on the stream (or the communicator is gone): the buffers'
            // next users come after them.
            drop(prepared);
            queued
        }

        /// The normal end: `ncclCommFinalize` (non-blocking: it flushes the queued work,
        /// polled until done, abortable like any wait), then `ncclCommDestroy`.
        fn finalize(&self) -> Result<(), CollectiveError> {
            bind(&self.stream)?;
            let refused = self.cell.with(|c| {
                // SAFETY: a live handle, under the cell's lock.
                Ok(unsafe { result::comm_finalize(c.handle) }.err())
            })?;
            let waiter = Waiter::new(self.cfg.fault_grace_ms);
            match refused {
                Some(e) => {
                    let detail = format!("ncclCommFinalize: {}", nccl_code_name(e.0 as u32));
                    wait_for(&self.cell, waiter, || StreamState::Failed(detail.clone()))?
                }
                None => wait_for(&self.cell, waiter, || self.comm_state())?,
            }
            self.cell.destroy();
            Ok(())
        }

        /// Waits until everything queued on the stream is done.
        fn wait_stream(&self) -> Result<(), CollectiveError> {
            bind(&self.stream)?;
            let waiter = Waiter::new(self.cfg.fault_grace_ms);
            wait_for(&self.cell, waiter, || match query(&self.stream) {
                StreamState::Pending => match self.comm_state() {
                    StreamState::Failed(detail) => StreamState::Failed(detail),
                    _ => StreamState::Pending,
                },
                s => s,
            })
        }
    }

    fn invalid(what: String) -> CollectiveError {
        CollectiveError::Invalid(what)
    }

    impl NcclCommunicator {
        /// The stream NCCL operations run on; allocate their buffers with it.
        pub fn stream(&self) -> Arc<CudaStream> {
            self.gpu.stream.clone()
        }

        /// The error that aborted this communicator, if any.
        pub fn error(&self) -> Option<CollectiveError> {
            self.gpu.cell.cause()
        }

        /// Aborts the generation: this rank's operations fail with
        /// [`CollectiveError::Aborted`], the peers' with [`CollectiveError::PeerAborted`].
        pub fn abort(&self) {
            self.gpu.cell.abort_group(CollectiveError::Aborted);
        }

        /// The normal end of a generation, on every rank: a barrier (a one-element
        /// allreduce), the wait for everything queued, `ncclCommFinalize` and
        /// `ncclCommDestroy`. Blocks while a peer is gone until the watchdog aborts, and
        /// returns the abort's cause; the communicator is then aborted, not destroyed (as
        /// it is when dropped without `finish`).
        pub fn finish(self) -> Result<(), CollectiveError> {
            let stream = self.stream();
            let mut barrier = stream
                .alloc_zeros::<f32>(1)
                .map_err(|e| CollectiveError::Nccl(format!("barrier buffer: {e:?}")))?;
            self.allreduce(&mut barrier, ReduceOp::Sum)?;
            drop(barrier);
            self.gpu.finalize()
        }

        /// Queues, inside one ncclGroupStart/ncclGroupEnd, an in-place `op` allreduce of
        /// every buffer, on this communicator's stream, and returns once queued (not done).
        /// cudarc's event tracking orders it after the work that wrote the buffers on other
        /// streams of the same context (`device_ptr_mut`), and orders later users of the
        /// buffers after it.
        ///
        /// Every rank must queue the same buffers' lengths in the same order. Calls queued
        /// one after another run in that order; [`NcclCommunicator::wait_queued`] waits for
        /// all of them. Fails, without queuing, with the cause of an abort.
        pub fn allreduce_queued<T: NcclType>(
            &self,
            bufs: &mut [&mut CudaSlice<T>],
            op: ReduceOp,
        ) -> Result<(), CollectiveError> {
            let stream = &self.gpu.stream;
            let prepare = move || {
                let mut parts = Vec::with_capacity(bufs.len());
                let mut guards = Vec::with_capacity(bufs.len());
                for buf in bufs {
                    let n = buf.len();
                    let (p, guard) = buf.device_ptr_mut(stream);
                    parts.push((p, n));
                    guards.push(guard);
                }
                (parts, guards)
            };
            self.gpu.queue(prepare, |comm, (parts, _)| {
                issued("ncclGroupStart", result::group_start())?;
                let mut first = Ok(());
                for &(p, n) in parts {
                    // SAFETY: `p` is `n` elements of T on this communicator's device, not
                    // freed before the queued work has run (cudarc's events).
                    let r = unsafe {
                        result::all_reduce(
                            p as _,
                            p as _,
                            n,
                            T::as_nccl_type(),
                            nccl_op(op),
                            comm,
                            stream.cu_stream() as _,
                        )
                    };
                    first = first.and(issued("ncclAllReduce", r));
                }
                // Closes the group even after a refused call, which NCCL then reports.
                first.and(issued("ncclGroupEnd", result::group_end()))
            })
        }

        /// Waits, as the blocking operations do (polling, abortable by the watchdog, failing
        /// with the generation's cause), until everything queued on this communicator's
        /// stream is done. Use it, not a stream synchronisation, so that the wait counts as
        /// the step's wait for its gradients (it runs outside every compute section).
        pub fn wait_queued(&self) -> Result<(), CollectiveError> {
            self.gpu.wait_stream()
        }

        /// Sums (or averages, min, max) `buf` across all ranks, in place.
        pub fn allreduce<T: NcclType>(
            &self,
            buf: &mut CudaSlice<T>,
            op: ReduceOp,
        ) -> Result<(), CollectiveError> {
            self.allreduce_queued(&mut [buf], op)?;
            self.wait_queued()
        }

        /// Reduces every rank's `send` into every rank's `recv` (same length).
        pub fn allreduce_into<T: NcclType>(
            &self,
            send: &CudaSlice<T>,
            recv: &mut CudaSlice<T>,
            op: ReduceOp,
        ) -> Result<(), CollectiveError> {
            let n = send.len();
            if recv.len() != n {
                return Err(invalid(format!("recv of {} for send of {n}", recv.len())));
            }
            let stream = &self.gpu.stream;
            let prepare = move || {
                let recv = recv; // moved: its guard outlives this closure
                (send.device_ptr(stream), recv.device_ptr_mut(stream))
            };
            self.gpu.queue(prepare, |comm, ((s, _), (r, _))| {
                // SAFETY: both are `n` elements of T on this communicator's device.
                issued("ncclAllReduce", unsafe {
                    result::all_reduce(
                        *s as _,
                        *r as _,
                        n,
                        T::as_nccl_type(),
                        nccl_op(op),
                        comm,
                        stream.cu_stream() as _,
                    )
                })
            })?;
            self.wait_queued()
        }

        /// Copies `root`'s `buf` into every rank's `buf`.
        pub fn broadcast<T: NcclType>(
            &self,
            buf: &mut CudaSlice<T>,
            root: usize,
        ) -> Result<(), CollectiveError> {
            if root >= self.world {
                return Err(invalid(format!("root {root}")));
            }
            let n = buf.len();
            let stream = &self.gpu.stream;
            let prepare = move || {
                let buf = buf; // moved: its guard outlives this closure
                buf.device_ptr_mut(stream)
            };
            self.gpu.queue(prepare, |comm, (p, _)| {
                // SAFETY: `p` is `n` elements of T on this communicator's device.
                issued("ncclBroadcast", unsafe {
                    result::broadcast(
                        *p as _,
                        *p as _,
                        n,
                        T::as_nccl_type(),
                        root as i32,
                        comm,
                        stream.cu_stream() as _,
                    )
                })
            })?;
            self.wait_queued()
        }

        /// Allgather in place, as [`Communicator::allgather`]: rank `r` contributes
        /// `buf[r·len/world .. (r+1)·len/world]`, and afterwards every rank holds every
        /// part. NCCL needs equal parts: `buf.len()` must be a multiple of the world size.
        pub fn allgather<T: NcclType>(
            &self,
            buf: &mut CudaSlice<T>,
        ) -> Result<(), CollectiveError> {
            let n = buf.len();
            if !n.is_multiple_of(self.world) {
                return Err(invalid(format!(
                    "allgather of {n} elements over {} ranks",
                    self.world
                )));
            }
            let part = n / self.world;
            let offset = (self.rank * part * std::mem::size_of::<T>()) as u64;
            let stream = &self.gpu.stream;
            let prepare = move || {
                let buf = buf; // moved: its guard outlives this closure
                buf.device_ptr_mut(stream)
            };
            self.gpu.queue(prepare, |comm, (p, _)| {
                // SAFETY: `p` is `n` = world·part elements of T; the send part lies inside.
                issued("ncclAllGather", unsafe {
                    result::all_gather(
                        (*p + offset) as _,
                        *p as _,
                        part,
                        T::as_nccl_type(),
                        comm,
                        stream.cu_stream() as _,
                    )
                })
            })?;
            self.wait_queued()
        }

        /// Gathers every rank's `send` into `recv` (world · `send.len()` elements, in rank
        /// order).
        pub fn allgather_into<T: NcclType>(
            &self,
            send: &CudaSlice<T>,
            recv: &mut CudaSlice<T>,
        ) -> Result<(), CollectiveError> {
            let part = send.len();
            if recv.len() != part * self.world {
                return Err(invalid(format!(
                    "recv of {} for {} ranks of {part}",
                    recv.len(),
                    self.world
                )));
            }
            let stream = &self.gpu.stream;
            let prepare = move || {
                let recv = recv; // moved: its guard outlives this closure
                (send.device_ptr(stream), recv.device_ptr_mut(stream))
            };
            self.gpu.queue(prepare, |comm, ((s, _), (r, _))| {
                // SAFETY: sizes checked above; both on this communicator's device.
                issued("ncclAllGather", unsafe {
                    result::all_gather(
                        *s as _,
                        *r as _,
                        part,
                        T::as_nccl_type(),
                        comm,
                        stream.cu_stream() as _,
                    )
                })
            })?;
            self.wait_queued()
        }
    }

    impl Drop for NcclCommunicator {
        fn drop(&mut self) {
            // Without `finish` (a failed or abandoned generation): end the communicator
            // here, on the thread that drives it; the watchdog then closes the TCP group. Work queued and not waited for is aborted with it
            // (ncclCommAbort ends NCCL's kernels early; cudarc frees buffers in stream
            // order, after them): waiting instead could block for ever on a peer that never
            // queues its side, and the peers lose this rank either way.
            self.gpu.cell.close();
        }
    }

    #[cfg(test)]
    mod tests {
        use std::mem::offset_of;

        use super::*;

        #[test]
        fn the_config_is_non_blocking_and_leaves_the_rest_to_nccl() {
            let c = nonblocking_config(22809);
            assert_eq!(c.size, std::mem::size_of::<sys::ncclConfig_t>());
            assert_eq!((c.magic, c.version, c.blocking), (0xcafebeef, 22809, 0));
            for field in [
                c.cgaClusterSize,
                c.minCTAs,
                c.maxCTAs,
                c.splitShare,
                c.trafficClass,
                c.collnetEnable,
                c.CTAPolicy,
                c.shrinkShare,
                c.nvlsCTAs,
                c.nChannelsPerNetPeer,
                c.nvlinkCentricSched,
                c.graphUsageMode,
                c.numRmaCtx,
                c.maxP2pPeers,
            ] {
                assert_eq!(field, i32::MIN);
            }
            assert!(c.netName.is_null() && c.commName.is_null());
        }

        /// NCCL 2.28's `ncclConfig_t` (nccl.h of v2.28.9), field by field on x86-64 and
        /// aarch64: the layout cudarc's struct must begin with, since 2.28 copies and reads
        /// that prefix.
        #[test]
        fn the_config_begins_with_the_layout_of_nccl_2_28() {
            type C = sys::ncclConfig_t;
            let offsets = [
                (offset_of!(C, size), 0),
                (offset_of!(C, magic), 8),
                (offset_of!(C, version), 12),
                (offset_of!(C, blocking), 16),
                (offset_of!(C, cgaClusterSize), 20),
                (offset_of!(C, minCTAs), 24),
                (offset_of!(C, maxCTAs), 28),
                (offset_of!(C, netName), 32),
                (offset_of!(C, splitShare), 40),
                (offset_of!(C, trafficClass), 44),
                (offset_of!(C, commName), 48),
                (offset_of!(C, collnetEnable), 56),
                (offset_of!(C, CTAPolicy), 60),
                (offset_of!(C, shrinkShare), 64),
                (offset_of!(C, nvlsCTAs), 68),
                (offset_of!(C, nChannelsPerNetPeer), 72),
                (offset_of!(C, nvlinkCentricSched), 76),
            ];
            for (i, (got, want)) in offsets.into_iter().enumerate() {
                assert_eq!(got, want, "field {i}");
            }
            assert!(std::mem::size_of::<C>() >= 80);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_states_read_as_the_waiter_expects() {
        assert_eq!(comm_state(0), StreamState::Done);
        assert_eq!(comm_state(7), StreamState::Pending);
        assert_eq!(comm_state(6), StreamState::Failed("ncclRemoteError".into()));
        assert_eq!(
            comm_state(4),
            StreamState::Failed("ncclInvalidArgument".into())
        );
        assert_eq!(
            comm_state(99),
            StreamState::Failed("unknown nccl result".into())
        );
    }

    #[test]
    fn only_the_first_queued_call_waits_under_the_set_up_deadline() {
        let cfg = NcclConfig {
            init_timeout_ms: 50,
            ..NcclConfig::for_test()
        };
        let mut first = queue_waiter(true, &cfg, 1, 2);
        assert!(matches!(
            first.step(49, StreamState::Pending, None),
            crate::wait::Step::Sleep(_)
        ));
        assert_eq!(
            first.step(50, StreamState::Pending, None),
            crate::wait::Step::Fault(first_call_deadline_error(1, 2, 50))
        );
        let mut later = queue_waiter(false, &cfg, 1, 2);
        assert!(matches!(
            later.step(1_000_000, StreamState::Pending, None),
            crate::wait::Step::Sleep(_)
        ));
        assert!(first_call_deadline_error(1, 2, 50)
            .to_string()
            .contains("first operation of rank 1 of 2 not queued after 50 ms"));
    }

    #[test]
    fn the_set_up_deadline_names_the_rank_and_the_wait() {
        assert_eq!(
            init_deadline_error(1, 4, 60_000).to_string(),
            "nccl: set-up of rank 1 of 4 not done after 60000 ms (init_timeout_ms)"
        );
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn nccl_codes_match_cudarc() {
        use cudarc::nccl::sys::ncclResult_t as R;
        for (r, name) in [
            (R::ncclSuccess, "ncclSuccess"),
            (R::ncclSystemError, "ncclSystemError"),
            (R::ncclInvalidArgument, "ncclInvalidArgument"),
            (R::ncclInvalidUsage, "ncclInvalidUsage"),
            (R::ncclRemoteError, "ncclRemoteError"),
            (R::ncclInProgress, "ncclInProgress"),
        ] {
            assert_eq!(nccl_code_name(r as u32), name);
        }
    }

    /// NCCL's set-up with a peer that took part in the bootstrap but never joins NCCL: on
    /// a GPU with libnccl (device 0), else skipped.
    #[cfg(feature = "cuda")]
    mod set_up {
        use std::time::{Duration, Instant};

        use super::*;
        use crate::Limits;

        /// Longer than any outcome these tests wait for.
        const TEST_DEADLINE_MS: u64 = 30_000;

        /// A world of two whose rank 1 goes through the bootstrap as a ready rank, then never
        /// joins NCCL: it leaves at once (`leaves`), or keeps its group idle until rank 0 is
        /// done. Rank 0 calls [`Communicator::nccl`] with `cfg`. Returns rank 0's outcome and
        /// how long it took.
        async fn rank1_never_joins(
            cfg: NcclConfig,
            leaves: bool,
        ) -> (Result<NcclCommunicator, CollectiveError>, Duration) {
            let mut comms = Communicator::in_memory(2, Limits::for_test()).unwrap();
            let mut c1 = comms.pop().unwrap();
            let c0 = comms.pop().unwrap();
            let peer = tokio::spawn(async move {
                let ready = bootstrap::agree(&mut c1, || Err(Unready::NoId), || Ok(())).await;
                ready.expect("rank 1's bootstrap");
                (!leaves).then_some(c1)
            });
            let start = Instant::now();
            let r = tokio::time::timeout(Duration::from_millis(TEST_DEADLINE_MS), c0.nccl(0, cfg))
                .await
                .expect("rank 0 hangs in the nccl set-up");
            let took = start.elapsed();
            drop(peer.await.unwrap());
            (r, took)
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_peer_that_leaves_after_the_bootstrap_is_named_as_lost() {
            if !nccl_available() {
                eprintln!("SKIPPED: no CUDA driver/NCCL (libcuda or libnccl.so not found)");
                return;
            }
            let cfg = NcclConfig::for_test();
            let (r, took) = rank1_never_joins(cfg.clone(), true).await;
            assert_eq!(r.unwrap_err(), CollectiveError::PeerLost { rank: 1 });
            assert!(
                took < Duration::from_millis(cfg.init_timeout_ms),
                "{took:?}"
            );
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_peer_that_never_joins_fails_the_set_up_at_its_deadline() {
            if !nccl_available() {
                eprintln!("SKIPPED: no CUDA driver/NCCL (libcuda or libnccl.so not found)");
                return;
            }
            // Shorter than the group's op deadline, after which the heartbeats would fail.
            let cfg = NcclConfig {
                init_timeout_ms: 1_500,
                ..NcclConfig::for_test()
            };
            assert!(cfg.init_timeout_ms < Limits::for_test().op_timeout_ms);
            let (r, took) = rank1_never_joins(cfg, false).await;
            assert_eq!(r.unwrap_err(), init_deadline_error(0, 2, 1_500));
            assert!(took >= Duration::from_millis(1_500), "{took:?}");
            assert!(took < Duration::from_millis(1_500 + 5_000), "{took:?}");
        }
    }
}
