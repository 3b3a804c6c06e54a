//! NCCL behind feature `cuda` (cudarc, loaded dynamically), bootstrapped over the TCP group:
//! rank 0 creates the NCCL unique id and broadcasts it on the [`Communicator`]. Without the
//! feature the same entry point returns [`CollectiveError::NotBuiltWithCuda`].

use crate::communicator::Communicator;
use crate::error::CollectiveError;
#[cfg(feature = "cuda")]
use crate::error::{DType, ReduceOp};

/// A GPU communicator for the same group as the [`Communicator`] that created it.
///
/// Not `Send`: NCCL communicators belong to the thread that drives their GPU.
pub struct NcclCommunicator {
    rank: usize,
    world: usize,
    #[cfg(feature = "cuda")]
    comm: cudarc::nccl::Comm,
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

impl Communicator {
    /// Creates the NCCL communicator of this group on GPU `device`: rank 0 makes the unique
    /// id, the TCP group broadcasts it, every rank joins. Blocks the calling thread inside
    /// NCCL initialisation until all ranks have joined.
    #[cfg(feature = "cuda")]
    pub async fn nccl(&mut self, device: usize) -> Result<NcclCommunicator, CollectiveError> {
        use cudarc::nccl::{Comm, Id};
        let nerr = |e: &dyn std::fmt::Debug| CollectiveError::Nccl(format!("{e:?}"));
        let available = nccl_available();
        // Every rank takes part in the id broadcast, so one rank without a GPU cannot leave
        // the others waiting: it sends an all-zero id, which they reject.
        let mut id_bytes = [0u8; 129];
        if self.rank() == 0 && available {
            let id = Id::new().map_err(|e| nerr(&e))?;
            for (d, s) in id_bytes[1..].iter_mut().zip(id.internal()) {
                *d = *s as u8;
            }
            id_bytes[0] = 1;
        }
        self.broadcast_raw(&mut id_bytes, DType::U8, 0).await?;
        if !available {
            return Err(CollectiveError::Nccl("libcuda or libnccl not found".into()));
        }
        if id_bytes[0] != 1 {
            return Err(CollectiveError::Nccl(
                "rank 0 could not create an nccl id".into(),
            ));
        }
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, s) in internal.iter_mut().zip(&id_bytes[1..]) {
            *d = *s as std::ffi::c_char;
        }
        let ctx = cudarc::driver::CudaContext::new(device).map_err(|e| nerr(&e))?;
        let comm = Comm::from_rank(
            ctx.default_stream(),
            self.rank(),
            self.world(),
            Id::uninit(internal),
        )
        .map_err(|e| nerr(&e))?;
        Ok(NcclCommunicator {
            rank: self.rank(),
            world: self.world(),
            comm,
        })
    }

    /// Creates the NCCL communicator of this group: not available in this build.
    #[cfg(not(feature = "cuda"))]
    pub async fn nccl(&mut self, _device: usize) -> Result<NcclCommunicator, CollectiveError> {
        Err(CollectiveError::NotBuiltWithCuda)
    }
}

#[cfg(feature = "cuda")]
impl NcclCommunicator {
    /// The stream NCCL operations are queued on.
    pub fn stream(&self) -> std::sync::Arc<cudarc::driver::CudaStream> {
        self.comm.stream()
    }

    /// Allreduce of a device buffer in place (queued on [`NcclCommunicator::stream`]).
    pub fn allreduce<T: cudarc::nccl::NcclType>(
        &self,
        buf: &mut cudarc::driver::CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        use cudarc::nccl::ReduceOp as N;
        let op = match op {
            ReduceOp::Sum => N::Sum,
            ReduceOp::Avg => N::Avg,
            ReduceOp::Min => N::Min,
            ReduceOp::Max => N::Max,
        };
        self.comm
            .all_reduce_in_place(buf, &op)
            .map(|_| ())
            .map_err(|e| CollectiveError::Nccl(format!("{e:?}")))
    }

    /// Broadcast of a device buffer from `root`, in place.
    pub fn broadcast<T: cudarc::nccl::NcclType>(
        &self,
        buf: &mut cudarc::driver::CudaSlice<T>,
        root: usize,
    ) -> Result<(), CollectiveError> {
        self.comm
            .broadcast_in_place(buf, root as i32)
            .map(|_| ())
            .map_err(|e| CollectiveError::Nccl(format!("{e:?}")))
    }
}
