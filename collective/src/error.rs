//! Typed errors of the collective layer.

use std::fmt;

/// The kind of a collective operation, as carried in every frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollKind {
    /// [`crate::Communicator::allreduce`].
    Allreduce,
    /// [`crate::Communicator::reduce_scatter`].
    ReduceScatter,
    /// [`crate::Communicator::allgather`].
    Allgather,
    /// [`crate::Communicator::broadcast`].
    Broadcast,
    /// [`crate::Communicator::barrier`].
    Barrier,
}

/// Algorithm used for one operation; part of the frame header so that ranks configured with
/// different switch points fail with a [`CollectiveError::Mismatch`] instead of deadlocking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Ring reduce-scatter and/or allgather, chunked and pipelined (bandwidth-optimal).
    Ring,
    /// Recursive doubling (latency-optimal, for small messages and the barrier).
    RecursiveDoubling,
    /// Pipelined chain along the ring starting at the root (broadcast).
    Chain,
    /// Reduce inside each host, ring among one leader per host, broadcast back
    /// ([`crate::hierarchy`]).
    Hierarchical,
}

/// Element type on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// No payload (barrier).
    None,
    /// Unsigned bytes: `u8` tensors, and any element type moved as bytes (broadcast,
    /// allgather, the NCCL id exchange).
    U8,
    /// Two's-complement 32-bit integers.
    I32,
    /// Two's-complement 64-bit integers.
    I64,
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
}

impl DType {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::None => 0,
            DType::U8 => 1,
            DType::F16 | DType::Bf16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }
}

impl DType {
    /// Whether the type is an integer type (no mean: [`ReduceOp::Avg`] is refused).
    pub fn is_integer(self) -> bool {
        matches!(self, DType::U8 | DType::I32 | DType::I64)
    }
}

/// Reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Elementwise sum.
    Sum,
    /// Elementwise mean: the sum divided by the world size (computed once, on identical sums,
    /// so every rank holds the same bits).
    Avg,
    /// Elementwise minimum (`f32::min` semantics: a NaN loses against a number).
    Min,
    /// Elementwise maximum (`f32::max` semantics).
    Max,
}

/// What one rank believes the current operation is; compared field by field against every
/// incoming frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpDesc {
    /// Operation sequence number within the generation (0, 1, 2, … on every rank).
    pub seq: u64,
    /// Which collective.
    pub kind: CollKind,
    /// Which algorithm (chosen from the size, must agree).
    pub algo: Algorithm,
    /// Element type.
    pub dtype: DType,
    /// Reduction operator, for reducing collectives.
    pub op: Option<ReduceOp>,
    /// Number of elements of the whole operation (the full buffer).
    pub len: u64,
    /// Root rank (broadcast), else 0.
    pub root: u32,
}

impl fmt::Display for OpDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} {:?}/{:?} {:?} len={}",
            self.seq, self.kind, self.algo, self.dtype, self.len
        )?;
        if let Some(op) = self.op {
            write!(f, " op={op:?}")?;
        }
        if self.kind == CollKind::Broadcast {
            write!(f, " root={}", self.root)?;
        }
        Ok(())
    }
}

/// Why a peer aborted the generation (carried in abort frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortReason {
    /// The peer's operation hit its deadline.
    Timeout,
    /// The peer's user called `abort()`.
    Aborted,
    /// The peer received a malformed frame.
    Protocol,
}

/// Handshake failures: the connection is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The MAC did not verify: a different shared secret, or tampering.
    #[error("bad mac from {addr}")]
    BadMac {
        /// Remote address.
        addr: String,
    },
    /// The peer belongs to another group or generation (a stale or stray connection).
    #[error("wrong group/generation from {addr}: group {group_id} generation {generation}")]
    WrongGroup {
        /// Remote address.
        addr: String,
        /// Group id the peer sent.
        group_id: u64,
        /// Generation the peer sent.
        generation: u64,
    },
    /// The peer claims a rank we do not expect a connection from.
    #[error("unexpected rank {from} -> {to} from {addr}")]
    UnexpectedRank {
        /// Remote address.
        addr: String,
        /// Claimed sender rank.
        from: u32,
        /// Claimed recipient rank.
        to: u32,
    },
    /// Malformed handshake bytes or protocol version.
    #[error("malformed handshake from {addr}: {detail}")]
    Malformed {
        /// Remote address.
        addr: String,
        /// What was wrong.
        detail: String,
    },
    /// The acceptor refused us (it sent a reject code).
    #[error("refused by rank {rank}")]
    Refused {
        /// The refusing rank.
        rank: usize,
    },
}

/// Errors of the collective layer.
///
/// Operator errors (`PeerLost`, `Timeout`, `Aborted`, `PeerAborted`, `Mismatch`) mean the
/// generation is over: the communicator is poisoned and the caller builds a new one. The
/// type is `Clone` so a poisoned communicator can return the original error again.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CollectiveError {
    /// A peer's connection closed or reset (the process died or aborted), seen directly or
    /// relayed by another rank.
    #[error("peer lost: rank {rank}")]
    PeerLost {
        /// The rank whose connection was lost first.
        rank: usize,
    },
    /// Ranks disagree about the current operation (a mismatched collective).
    #[error("mismatched collective with rank {rank}: ours {ours}, theirs {theirs}")]
    Mismatch {
        /// The rank whose frame disagreed.
        rank: usize,
        /// Our operation.
        ours: OpDesc,
        /// The operation that rank is running.
        theirs: OpDesc,
    },
    /// The operation did not finish within `op_timeout_ms`.
    #[error("operation {op} timed out after {after_ms} ms")]
    Timeout {
        /// The operation.
        op: OpDesc,
        /// The deadline that passed.
        after_ms: u64,
    },
    /// Cancelled locally through [`crate::Communicator::abort`] or an [`crate::AbortHandle`].
    #[error("aborted")]
    Aborted,
    /// Another rank aborted the generation (timeout, abort, protocol error).
    #[error("aborted by rank {rank}: {reason:?}")]
    PeerAborted {
        /// The rank that aborted first.
        rank: usize,
        /// Why.
        reason: AbortReason,
    },
    /// A malformed frame (corruption or a bug): stop.
    #[error("protocol error from rank {rank}: {detail}")]
    Protocol {
        /// The sending rank.
        rank: usize,
        /// What was wrong.
        detail: String,
    },
    /// A data-plane connection could not be established before the connect deadline.
    #[error("connect to rank {rank} failed: {detail}")]
    Connect {
        /// The peer rank.
        rank: usize,
        /// The last error seen.
        detail: String,
    },
    /// Binding or accepting on the local data-plane address failed.
    #[error("listen on {addr} failed: {detail}")]
    Listen {
        /// The address.
        addr: String,
        /// The error.
        detail: String,
    },
    /// The handshake failed (wrong secret, stale generation, ...).
    #[error("handshake: {0}")]
    Handshake(#[from] HandshakeError),
    /// Invalid configuration or arguments (a bug in the caller).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A reduction the element type has no exact meaning for ([`ReduceOp::Avg`] of
    /// integers), refused on every rank before the operation is numbered: the communicator
    /// stays usable.
    #[error("unsupported: {op:?} of {dtype:?} elements")]
    Unsupported {
        /// The reduction asked for.
        op: ReduceOp,
        /// The element type.
        dtype: DType,
    },
    /// A GPU operation was asked of a build without the `cuda` feature.
    #[error("not built with cuda (enable the `cuda` feature)")]
    NotBuiltWithCuda,
    /// CUDA or NCCL failed or is unavailable at run time.
    #[error("nccl: {0}")]
    Nccl(String),
}

/// Result alias for this crate.
pub type Result<T, E = CollectiveError> = std::result::Result<T, E>;
