//! NCCL behind feature `cuda` (cudarc, libraries loaded at run time): the GPU twin of the
//! TCP [`Communicator`], with the same failure semantics.
//!
//! - Bootstrap ([`Communicator::nccl`]): over the TCP group, rank 0's NCCL unique id goes to
//!   every rank, and every rank says whether it can join (`bootstrap`), so a rank without a
//!   GPU or libnccl fails every rank at once with one clear error instead of leaving them
//!   inside NCCL's initialisation.
//! - Operations ([`NcclCommunicator::allreduce`], [`NcclCommunicator::broadcast`],
//!   [`NcclCommunicator::allgather`] and their out-of-place forms) take device buffers,
//!   queue the NCCL call on [`NcclCommunicator::stream`] and wait for it by polling the
//!   stream, never in a call an abort cannot interrupt (`wait`).
//! - Failure: the TCP group stays connected, owned by a watchdog task that sends a heartbeat
//!   over it (`watchdog`). When a peer is lost the heartbeat fails on every rank, the
//!   watchdog calls `ncclCommAbort`, the pending wait returns, and every operation of this
//!   communicator returns the heartbeat's error: [`CollectiveError::PeerLost`] naming the
//!   lost rank, exactly as the TCP backend, so the trainer's elastic path is the same on
//!   GPUs. An error NCCL reports itself (say, `ncclRemoteError`) waits `fault_grace_ms` for
//!   the watchdog to name a cause, then aborts this rank's communicator and the TCP group,
//!   and the peers fail with [`CollectiveError::PeerAborted`] naming this rank.
//!
//! Without the feature [`Communicator::nccl`] still takes part in the bootstrap (the other
//! ranks learn at once that this one cannot join) and returns
//! [`CollectiveError::NotBuiltWithCuda`].
//!
//! Not covered: a rank that dies *during* `ncclCommInitRank` (NCCL hands out no handle to
//! abort before that call returns; the readiness round just before keeps the window small),
//! and an enqueue that blocks inside NCCL (with lazy connection setup, the first operation
//! connects to its peers: set `NCCL_RUNTIME_CONNECT=0` to connect during initialisation).
//! The abort waits for such a call to return, since it frees the communicator the call uses.

use crate::bootstrap::{self, Unready};
use crate::communicator::Communicator;
use crate::config::NcclConfig;
use crate::error::CollectiveError;

/// A GPU communicator for the same group as the [`Communicator`] that created it.
///
/// Operations block the calling thread until the GPU has finished them (or the generation
/// failed); the watchdog is a task on the tokio runtime that created the communicator,
/// which must keep running: call the operations from a thread of their own (the thread
/// that drives the GPU, or `spawn_blocking`), not from a task of a current-thread runtime.
/// After any error but [`CollectiveError::Invalid`] the communicator is aborted: every later
/// operation returns the same error; build a new generation to go on. Dropping it ends the
/// communicator and closes the TCP group (the peers see this rank as lost).
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

/// Whether an NCCL error code is a caller's mistake, reported before anything was queued
/// (the communicator stays usable), rather than a failure of the communicator.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn is_usage_error(code: u32) -> bool {
    matches!(code, 4 | 5)
}

impl Communicator {
    /// Creates the NCCL communicator of this group on GPU `device`, consuming the TCP group,
    /// which stays connected for the watchdog's heartbeats (see the module docs of `nccl`).
    /// Every rank must call it. When some rank cannot join (no GPU, no libnccl, built
    /// without `cuda`), every rank returns the same [`CollectiveError::Nccl`] naming those
    /// ranks, and the group is closed.
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
        let init = tokio::task::spawn_blocking(move || gpu::init(stream, rank, world, id));
        let raw = init
            .await
            .map_err(|e| CollectiveError::Nccl(format!("init task: {e}")))??;
        Ok(NcclCommunicator {
            rank,
            world,
            gpu: gpu::Gpu::start(self, raw, cfg),
        })
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

    use std::mem::MaybeUninit;
    use std::sync::Arc;

    use cudarc::driver::{sys as cu, CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
    use cudarc::nccl::{result, sys, NcclType};
    use tracing::warn;

    use super::{is_usage_error, nccl_code_name, NcclCommunicator, Unready};
    use crate::abort::{AbortCell, Abortable};
    use crate::bootstrap::{NcclId, NCCL_ID_BYTES};
    use crate::communicator::Communicator;
    use crate::config::NcclConfig;
    use crate::error::{CollectiveError, ReduceOp};
    use crate::wait::{wait_for, StreamState};
    use crate::watchdog::Watchdog;

    /// An initialised NCCL communicator; only the [`AbortCell`] holds one.
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
            // SAFETY: the handle came from ncclCommInitRank and the AbortCell aborts it once.
            if let Err(e) = unsafe { result::comm_abort(self.handle) } {
                warn!(error = nccl_code_name(e.0 as u32), "ncclCommAbort failed");
            }
        }
    }

    impl RawComm {
        /// An error NCCL's background threads or kernels ran into, if any.
        fn async_error(&self) -> Option<String> {
            let mut r = sys::ncclResult_t::ncclSuccess;
            // SAFETY: a live handle (we are inside AbortCell::with) and a valid out-pointer.
            let q = unsafe { sys::ncclCommGetAsyncError(self.handle, &mut r) };
            if q != sys::ncclResult_t::ncclSuccess {
                return Some(format!(
                    "ncclCommGetAsyncError: {}",
                    nccl_code_name(q as u32)
                ));
            }
            match r {
                sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => None,
                other => Some(nccl_code_name(other as u32).to_string()),
            }
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

    /// Joins the NCCL communicator (blocks until every rank has joined).
    pub(super) fn init(
        stream: Arc<CudaStream>,
        rank: usize,
        world: usize,
        id: NcclId,
    ) -> Result<RawComm, CollectiveError> {
        let nerr = |what: &str, code: u32| {
            CollectiveError::Nccl(format!("{what}: {}", nccl_code_name(code)))
        };
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| CollectiveError::Nccl(format!("bind cuda context: {e:?}")))?;
        let mut internal = [0 as std::ffi::c_char; NCCL_ID_BYTES];
        for (d, s) in internal.iter_mut().zip(id) {
            *d = s as std::ffi::c_char;
        }
        let world_i32 =
            i32::try_from(world).map_err(|_| CollectiveError::Invalid("world".into()))?;
        let mut handle = MaybeUninit::uninit();
        // SAFETY: a valid out-pointer; rank < world (the group's invariant).
        unsafe {
            result::comm_init_rank(
                handle.as_mut_ptr(),
                world_i32,
                sys::ncclUniqueId { internal },
                rank as i32,
            )
        }
        .map_err(|e| nerr("ncclCommInitRank", e.0 as u32))?;
        Ok(RawComm {
            // SAFETY: initialised by the successful call above.
            handle: unsafe { handle.assume_init() },
            stream,
        })
    }

    fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
        match op {
            ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
            ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
            ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
            ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        }
    }

    /// One poll of the queued work.
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
        cfg: NcclConfig,
        /// Dropped after `cell` is closed (see `Drop for NcclCommunicator`).
        _watchdog: Watchdog,
    }

    impl Gpu {
        /// Hands `group` to a new watchdog over `raw`.
        pub(super) fn start(group: Communicator, raw: RawComm, cfg: NcclConfig) -> Self {
            let stream = raw.stream.clone();
            let cell = Arc::new(AbortCell::new(raw, group.abort_handle()));
            let watchdog = Watchdog::spawn(group, cell.clone(), cfg.heartbeat_interval_ms);
            Gpu {
                stream,
                cell,
                cfg,
                _watchdog: watchdog,
            }
        }

        /// Queues one NCCL call and waits for it.
        fn run(
            &self,
            enqueue: impl FnOnce(&RawComm) -> Result<result::NcclStatus, result::NcclError>,
        ) -> Result<(), CollectiveError> {
            self.stream
                .context()
                .bind_to_thread()
                .map_err(|e| CollectiveError::Nccl(format!("bind cuda context: {e:?}")))?;
            let grace = self.cfg.fault_grace_ms;
            match self.cell.with(|c| Ok(enqueue(c))) {
                Err(cause) => {
                    self.cell.settle();
                    return Err(cause);
                }
                Ok(Err(e)) => {
                    let code = e.0 as u32;
                    if is_usage_error(code) {
                        return Err(CollectiveError::Invalid(format!(
                            "nccl: {}",
                            nccl_code_name(code)
                        )));
                    }
                    let detail = nccl_code_name(code).to_string();
                    return wait_for(&self.cell, grace, || StreamState::Failed(detail.clone()));
                }
                Ok(Ok(_)) => {}
            }
            wait_for(&self.cell, grace, || match query(&self.stream) {
                StreamState::Pending => match self.cell.with(|c| Ok(c.async_error())) {
                    Ok(Some(detail)) => StreamState::Failed(detail),
                    // Aborted meanwhile: the waiter reads the cause next.
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

        /// Sums (or averages, min, max) `buf` across all ranks, in place.
        pub fn allreduce<T: NcclType>(
            &self,
            buf: &mut CudaSlice<T>,
            op: ReduceOp,
        ) -> Result<(), CollectiveError> {
            let n = buf.len();
            let stream = &self.gpu.stream;
            self.gpu.run(|c| {
                let (p, _record) = buf.device_ptr_mut(stream);
                // SAFETY: `p` is `n` elements of T on this communicator's device.
                unsafe {
                    result::all_reduce(
                        p as _,
                        p as _,
                        n,
                        T::as_nccl_type(),
                        nccl_op(op),
                        c.handle,
                        stream.cu_stream() as _,
                    )
                }
            })
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
            self.gpu.run(|c| {
                let (s, _rs) = send.device_ptr(stream);
                let (r, _rr) = recv.device_ptr_mut(stream);
                // SAFETY: both are `n` elements of T on this communicator's device.
                unsafe {
                    result::all_reduce(
                        s as _,
                        r as _,
                        n,
                        T::as_nccl_type(),
                        nccl_op(op),
                        c.handle,
                        stream.cu_stream() as _,
                    )
                }
            })
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
            self.gpu.run(|c| {
                let (p, _record) = buf.device_ptr_mut(stream);
                // SAFETY: `p` is `n` elements of T on this communicator's device.
                unsafe {
                    result::broadcast(
                        p as _,
                        p as _,
                        n,
                        T::as_nccl_type(),
                        root as i32,
                        c.handle,
                        stream.cu_stream() as _,
                    )
                }
            })
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
            self.gpu.run(|c| {
                let (p, _record) = buf.device_ptr_mut(stream);
                // SAFETY: `p` is `n` = world·part elements of T; the send part lies inside.
                unsafe {
                    result::all_gather(
                        (p + offset) as _,
                        p as _,
                        part,
                        T::as_nccl_type(),
                        c.handle,
                        stream.cu_stream() as _,
                    )
                }
            })
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
            self.gpu.run(|c| {
                let (s, _rs) = send.device_ptr(stream);
                let (r, _rr) = recv.device_ptr_mut(stream);
                // SAFETY: sizes checked above; both on this communicator's device.
                unsafe {
                    result::all_gather(
                        s as _,
                        r as _,
                        part,
                        T::as_nccl_type(),
                        c.handle,
                        stream.cu_stream() as _,
                    )
                }
            })
        }
    }

    impl Drop for NcclCommunicator {
        fn drop(&mut self) {
            // Operations are synchronous: nothing is in flight. End the communicator here,
            // on the thread that drives it; the watchdog then closes the TCP group.
            self.gpu.cell.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_are_the_callers_and_named() {
        assert!(is_usage_error(4) && is_usage_error(5));
        for fatal in [1, 2, 3, 6, 8] {
            assert!(!is_usage_error(fatal));
        }
        assert_eq!(nccl_code_name(6), "ncclRemoteError");
        assert_eq!(nccl_code_name(99), "unknown nccl result");
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn nccl_codes_match_cudarc() {
        use cudarc::nccl::sys::ncclResult_t as R;
        for (r, name) in [
            (R::ncclSystemError, "ncclSystemError"),
            (R::ncclInvalidUsage, "ncclInvalidUsage"),
            (R::ncclRemoteError, "ncclRemoteError"),
        ] {
            assert_eq!(nccl_code_name(r as u32), name);
        }
    }
}
