//! ringleader's collective communication library.
//!
//! The trainer uses it every step to sum gradients across the workers of a job: a
//! [`Communicator`] is one rank of a fixed group (rank, world size, group id, generation)
//! and runs [`Communicator::allreduce`] (sum, avg, min, max over `f32`, `f64`, `f16`,
//! `bf16`), [`Communicator::reduce_scatter`], [`Communicator::allgather`],
//! [`Communicator::broadcast`] and [`Communicator::barrier`], in place on slices, async
//! (tokio). A [`Bucketer`] fuses many small gradient tensors into large buckets and starts
//! each bucket's allreduce while later ones are still being filled.
//!
//! It knows nothing of the node: the node forms the ring (members, ranks, generation, shared
//! secret, data-plane addresses) and hands it to [`Communicator::connect`]. When a peer dies,
//! operations fail fast with [`CollectiveError::PeerLost`] on every rank, and the node builds
//! the next generation.
//!
//! On GPUs, [`Communicator::nccl`] turns a connected group into an [`NcclCommunicator`]
//! (feature `cuda`): allreduce, broadcast and allgather on device buffers through NCCL,
//! bootstrapped over the TCP group, which then stays connected for a watchdog's heartbeats.
//! When a peer dies, the watchdog aborts the NCCL communicator and its operations fail with
//! the same [`CollectiveError::PeerLost`] as the TCP backend's, so the node's elastic path
//! is the same on CPUs and GPUs. Without the feature the same API returns
//! [`CollectiveError::NotBuiltWithCuda`].
//!
//! Layout: [`schedule`] holds the pure chunk schedules (ring, recursive doubling), property
//! tested; [`hierarchy`] the hierarchical allreduce's schedule by placement (reduce inside
//! each host, ring among one leader a host, broadcast back) and the schedules' round and
//! byte counts (the `schedule-counts` binary prints them). The communicator runs it for
//! allreduces above `small_bytes_max` when the group spans at least two hosts (ranks grouped
//! by the IPs of their data-plane addresses) and some host has two ranks, with extra links
//! from each rank to its host's leader and between neighbouring leaders;
//! [`Limits::allreduce`] or `RINGLEADER_ALLREDUCE=auto|ring|hierarchical` forces the choice
//! (`scripts/bench-hier.sh` measures both). `communicator` drives them over `transport`
//! links (TCP with the handshake of `tcp`, or in-memory channels; between ranks on the same
//! host the data frames of a TCP link move to a shared-memory ring, `shm`); `frame` is the
//! 32-byte frame header. The GPU path: `nccl` (behind `cuda`) calls NCCL; its CPU-side
//! logic is plain code tested without a GPU: `bootstrap` (the id exchange and readiness round), `abort` (the cell that
//! holds a communicator and aborts it once), `wait` (polling the stream under an abort
//! flag, with a deadline for NCCL's set-up) and `watchdog` (the heartbeat over the TCP
//! group and the abort decision). [`NcclDouble`] (`nccl_double`) is the NCCL
//! communicator's CPU twin with NCCL's failure semantics (work completes on enqueue, a
//! collective blocks when a peer is gone, abort from any thread, destroy waits unless
//! aborted), on that same machinery, for testing the code above a device group without a
//! GPU. [`cuda_libs`] finds the CUDA libraries on a host (CUDA 12
//! or 13, toolkit or Python wheels) and links them by the names cudarc loads, for the ranks
//! a node starts.

// The GPU path's plain parts: used by `nccl` only with `cuda`, tested in both builds.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod abort;
mod agree;
mod bootstrap;
mod bucketer;
mod communicator;
mod config;
pub mod cuda_libs;
mod element;
mod error;
mod frame;
pub mod hierarchy;
mod nccl;
mod nccl_double;
pub mod schedule;
mod shm;
mod tcp;
mod transport;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod wait;
mod watchdog;

pub use bucketer::{BucketConfig, Bucketer, Ready};
pub use communicator::{AbortHandle, Communicator};
pub use config::{AllreduceChoice, GroupConfig, Limits, NcclConfig, ALLREDUCE_ENV};
#[doc(hidden)]
pub use element::reference_reduce;
pub use element::Element;
pub use error::{
    AbortReason, Algorithm, CollKind, CollectiveError, DType, HandshakeError, OpDesc, ReduceOp,
    Result,
};
pub use half::{bf16, f16};
pub use nccl::{nccl_available, NcclCommunicator};
pub use nccl_double::{DeviceBuf, NcclDouble};

#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing {
    //! Hooks for integration tests of this workspace (not a stable API).
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicU32, Ordering};

    pub use crate::tcp::probe_handshake;

    /// Length of a data-plane frame header, bytes.
    pub const FRAME_HEADER_BYTES: usize = crate::frame::HEADER_BYTES;

    /// Decodes a data-plane frame header as a peer sent it (for the hostile-bytes tests
    /// and fuzz targets): `Ok(())` if it is a valid header, else the decoder's error.
    pub fn decode_frame_header(b: &[u8; FRAME_HEADER_BYTES]) -> Result<(), String> {
        crate::frame::Header::decode(b).map(|_| ())
    }

    /// Length of the dialer's first handshake message (D1), bytes.
    pub const HANDSHAKE_HELLO_BYTES: usize = crate::tcp::D1_BYTES;
    /// Length of the dialer's data-path offer (S1), bytes.
    pub const HANDSHAKE_OFFER_BYTES: usize = crate::tcp::PATH_MSG_BYTES;

    /// Decodes a dialer's first handshake message as the acceptor of (`group_id`,
    /// `generation`) at rank `me`, which takes dials from the ranks in `expected`, decodes it
    /// on every accepted connection (for the hostile-bytes tests and fuzz targets): the
    /// dialer's rank, or why the connection is refused.
    pub fn decode_handshake_hello(
        bytes: &[u8],
        group_id: u64,
        generation: u64,
        me: usize,
        expected: &std::collections::BTreeSet<usize>,
    ) -> Result<usize, crate::HandshakeError> {
        crate::tcp::decode_hello(bytes, "fuzz", group_id, generation, me, expected)
    }

    /// Decodes a dialer's data-path offer as an acceptor does after the handshake: the
    /// path of the shared-memory segment it would open (`None`: no segment offered, or a
    /// malformed name, which the acceptor declines), or why the connection is refused.
    pub fn decode_handshake_offer(
        bytes: &[u8],
    ) -> Result<Option<std::path::PathBuf>, crate::HandshakeError> {
        Ok(crate::tcp::decode_offer(bytes, "fuzz")?.and_then(|n| crate::shm::segment_path(n).ok()))
    }

    /// First port [`unused_local_port`] hands out.
    const TEST_PORT_MIN: u32 = 12_000;
    /// Ports it hands out: `TEST_PORT_MIN..TEST_PORT_MIN + TEST_PORTS` (below the workers'
    /// 20000–31000 and the ephemeral range).
    const TEST_PORTS: u32 = 7_000;

    /// A TCP port on 127.0.0.1 that is free now, for a process the test starts to bind.
    /// Unlike a port the OS picks for `:0` (and that the test releases), it lies below the
    /// ephemeral range, so no outgoing connection can take it before the process binds it;
    /// calls within a process never repeat one, and processes start at different places.
    ///
    /// # Panics
    /// If every port of the range is taken.
    pub fn unused_local_port() -> u16 {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let start = (std::process::id() % 64) * (TEST_PORTS / 64);
        for _ in 0..TEST_PORTS {
            let k = NEXT.fetch_add(1, Ordering::Relaxed);
            let port = (TEST_PORT_MIN + (start + k) % TEST_PORTS) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
        panic!(
            "no free port in {TEST_PORT_MIN}..{}",
            TEST_PORT_MIN + TEST_PORTS
        );
    }
}
