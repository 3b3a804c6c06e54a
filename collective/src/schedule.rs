//! The chunk schedules: pure, synchronous, no I/O. The async driver inside
//! [`crate::Communicator`] asks these functions what to send and receive at each step.
//!
//! **Ring** (bandwidth-optimal). The buffer of `len` elements is cut into `world` segments
//! ([`segment`]). Reduce-scatter runs `world − 1` steps; at step `s` rank `r` sends segment
//! `r − s − 1` to its right neighbour and receives segment `r − s − 2` from its left
//! neighbour, reducing it into its own copy (all indices mod `world`). Invariant: after the
//! last step rank `r` holds segment `r` reduced over all ranks, each contribution exactly
//! once. Allgather then runs `world − 1` steps; at step `s` rank `r` sends segment `r − s`
//! and receives (overwrites) segment `r − s − 1`. Invariant: afterwards every rank holds every
//! segment as reduced by its owner, so all ranks are bitwise equal. Each segment is cut into
//! frame-sized chunks, and [`ring_plan`] orders the steps **chunk-major**: a group of chunks
//! goes through every step before the next group starts, so a received chunk is reduced (or
//! copied) into the buffer and sent on while it is still in the cache.
//!
//! **Recursive doubling** (latency-optimal, `⌈log2 world⌉` rounds, +2 when `world` is not a
//! power of two). With `p` the largest power of two ≤ `world` and `rem = world − p`, ranks
//! below `2·rem` pair up first: the even one sends its vector to the odd one and waits for
//! the result at the end. The remaining `p` ranks exchange their whole vector with the
//! partner `v XOR 2^k` in round `k` and reduce, always in rank order (lower rank's value
//! first), so that both partners compute the same bits. Invariant: every rank ends with
//! every contribution exactly once, all ranks bitwise equal.

use std::collections::BTreeSet;
use std::ops::Range;

/// Range of elements of segment `i` when `len` elements are cut into `world` near-equal
/// segments (the first `len % world` segments are one element longer).
pub fn segment(len: usize, world: usize, i: usize) -> Range<usize> {
    debug_assert!(i < world);
    let base = len / world;
    let extra = len % world;
    let start = i * base + i.min(extra);
    let size = base + usize::from(i < extra);
    start..start + size
}

/// `(a − b) mod m` for small non-negative operands.
fn sub_mod(a: usize, b: usize, m: usize) -> usize {
    (a + m * (b / m + 1) - b) % m
}

/// The left (receive-from) neighbour in the ring.
pub fn left(rank: usize, world: usize) -> usize {
    sub_mod(rank, 1, world)
}

/// The right (send-to) neighbour in the ring.
pub fn right(rank: usize, world: usize) -> usize {
    (rank + 1) % world
}

/// One ring step: segment indices to send and to receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingStep {
    /// Segment sent to the right neighbour.
    pub send: usize,
    /// Segment received from the left neighbour.
    pub recv: usize,
}

/// Reduce-scatter step `step` (0 ≤ step < world − 1) of `rank`.
pub fn reduce_scatter_step(rank: usize, world: usize, step: usize) -> RingStep {
    RingStep {
        send: sub_mod(rank, step + 1, world),
        recv: sub_mod(rank, step + 2, world),
    }
}

/// Allgather step `step` (0 ≤ step < world − 1) of `rank`.
pub fn allgather_step(rank: usize, world: usize, step: usize) -> RingStep {
    RingStep {
        send: sub_mod(rank, step, world),
        recv: sub_mod(rank, step + 1, world),
    }
}

/// Sub-chunks of `range` of at most `chunk_elems` elements (at least one), in order,
/// covering it exactly. An empty range has no sub-chunks.
pub fn subchunks(range: Range<usize>, chunk_elems: usize) -> impl Iterator<Item = Range<usize>> {
    let chunk = chunk_elems.max(1);
    let end = range.end;
    (range.start..end)
        .step_by(chunk)
        .map(move |s| s..(s + chunk).min(end))
}

/// Which ring collective a plan is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingKind {
    /// `world − 1` reduce-scatter steps per chunk.
    ReduceScatter,
    /// `world − 1` allgather steps per chunk.
    Allgather,
    /// Reduce-scatter then allgather steps, `2·(world − 1)` per chunk.
    Allreduce,
}

/// What a received frame does to its range of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvMode {
    /// Reduce into the buffer (a partial sum, sent on by a later action).
    Reduce,
    /// Reduce into the buffer; this completes a chunk of the rank's own segment (the place
    /// to divide for `Avg`).
    ReduceOwned,
    /// Overwrite the buffer (allgather).
    Copy,
}

/// One action of a ring plan, on a range of the caller's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingAction {
    /// Send `buf[range]` to the right neighbour as one frame (an empty range: an empty frame).
    Send(Range<usize>),
    /// Receive one frame of `range.len()` elements from the left neighbour into `buf[range]`.
    Recv(Range<usize>, RecvMode),
}

/// Range of chunk `chunk` of segment `seg`: the segment cut at multiples of `chunk_elems`
/// from its start; empty past its end (segments differ by one element, so one segment may
/// have a chunk fewer than another).
pub fn ring_chunk(
    len: usize,
    world: usize,
    seg: usize,
    chunk: usize,
    chunk_elems: usize,
) -> Range<usize> {
    let s = segment(len, world, seg);
    let ce = chunk_elems.max(1);
    let start = (s.start + chunk * ce).min(s.end);
    start..(start + ce).min(s.end)
}

/// Chunks per segment in a ring plan: enough for the largest segment, at least one (an
/// empty buffer still sends one empty frame per step, so that it synchronises and is
/// checked).
pub fn ring_chunks(len: usize, world: usize, chunk_elems: usize) -> usize {
    len.div_ceil(world).div_ceil(chunk_elems.max(1)).max(1)
}

/// The ring plan of `rank`, in the order of its frames on both of its ring links.
///
/// **Chunk-major** (the order NCCL uses): chunks are taken `group` at a time; each group
/// goes through every step of the collective before the next group starts. Step `t` of
/// chunk `c` sends chunk `c` of the step's segment; for `t ≥ 1` it is sent right after the
/// left neighbour's step `t − 1` of the same chunk (the same segment) was received into the
/// buffer, so the data forwarded is still in the cache, and the receiver never needs to hold
/// a frame while it sends. Within a group the order on a link is `(c₀, 0), (c₁, 0), …,
/// (c₀, 1), (c₁, 1), …`: a rank may run `group` frames ahead of its left neighbour, and
/// a link never needs more than `group` frames in flight (see the deadlock test), so links
/// with at least `group` slots cannot deadlock.
///
/// The steps are those of [`reduce_scatter_step`] and [`allgather_step`]: a reduce-scatter
/// step `t` sends segment `rank − t − 1` and receives (reduces) segment `rank − t − 2`; an
/// allgather step `u` sends segment `rank − u` and receives (copies) segment `rank − u − 1`.
/// In an allreduce the last reduce-scatter receive completes the rank's own chunk, which the
/// first allgather step sends on.
pub fn ring_plan(
    rank: usize,
    world: usize,
    len: usize,
    chunk_elems: usize,
    group: usize,
    kind: RingKind,
) -> Vec<RingAction> {
    let mut plan = Vec::new();
    if world <= 1 {
        return plan;
    }
    let rs = world - 1;
    let (steps, first_ag) = match kind {
        RingKind::ReduceScatter => (rs, usize::MAX),
        RingKind::Allgather => (rs, 0),
        RingKind::Allreduce => (2 * rs, rs),
    };
    // (segment sent, segment received, what the receive does) of step `t`.
    let step = |t: usize| {
        if t < first_ag {
            let st = reduce_scatter_step(rank, world, t);
            let mode = if t + 1 == rs {
                RecvMode::ReduceOwned
            } else {
                RecvMode::Reduce
            };
            (st.send, st.recv, mode)
        } else {
            let st = allgather_step(rank, world, t - first_ag);
            (st.send, st.recv, RecvMode::Copy)
        }
    };
    let chunks = ring_chunks(len, world, chunk_elems);
    let group = group.max(1);
    let chunk = |seg, c| ring_chunk(len, world, seg, c, chunk_elems);
    for g in (0..chunks).step_by(group) {
        let cs = g..(g + group).min(chunks);
        for t in 0..steps {
            for c in cs.clone() {
                if t > 0 {
                    let (_, recv, mode) = step(t - 1);
                    plan.push(RingAction::Recv(chunk(recv, c), mode));
                }
                plan.push(RingAction::Send(chunk(step(t).0, c)));
            }
        }
        for c in cs {
            let (_, recv, mode) = step(steps - 1);
            plan.push(RingAction::Recv(chunk(recv, c), mode));
        }
    }
    plan
}

/// One action of recursive doubling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdStep {
    /// Send the whole vector to `to` (fold-in of an extra rank).
    Send {
        /// Peer rank.
        to: usize,
    },
    /// Receive a whole vector from `from` and reduce it into ours.
    RecvReduce {
        /// Peer rank.
        from: usize,
        /// Whether the peer's value goes first (the peer has the lower rank).
        theirs_first: bool,
    },
    /// Send ours to `peer` and receive theirs at the same time, then reduce.
    Exchange {
        /// Peer rank.
        peer: usize,
        /// Whether the peer's value goes first.
        theirs_first: bool,
    },
    /// Receive the final result from `from` (overwrite ours).
    RecvResult {
        /// Peer rank.
        from: usize,
    },
    /// Send the final result to `to`.
    SendResult {
        /// Peer rank.
        to: usize,
    },
}

/// The recursive-doubling plan of `rank` in a group of `world`.
pub fn recursive_doubling(rank: usize, world: usize) -> Vec<RdStep> {
    let mut plan = Vec::new();
    if world <= 1 {
        return plan;
    }
    let p = 1usize << (usize::BITS - 1 - world.leading_zeros());
    let rem = world - p;
    if rank < 2 * rem && rank.is_multiple_of(2) {
        plan.push(RdStep::Send { to: rank + 1 });
        plan.push(RdStep::RecvResult { from: rank + 1 });
        return plan;
    }
    let vrank = if rank < 2 * rem { rank / 2 } else { rank - rem };
    let real = |v: usize| if v < rem { 2 * v + 1 } else { v + rem };
    if rank < 2 * rem {
        plan.push(RdStep::RecvReduce {
            from: rank - 1,
            theirs_first: true,
        });
    }
    let mut mask = 1;
    while mask < p {
        let peer = real(vrank ^ mask);
        plan.push(RdStep::Exchange {
            peer,
            theirs_first: peer < rank,
        });
        mask <<= 1;
    }
    if rank < 2 * rem {
        plan.push(RdStep::SendResult { to: rank - 1 });
    }
    plan
}

/// The ranks `rank` needs a connection to: its ring neighbours and its recursive-doubling
/// partners. The relation is symmetric, so each pair opens one connection (the lower rank
/// dials).
pub fn peers(rank: usize, world: usize) -> BTreeSet<usize> {
    let mut set = BTreeSet::new();
    if world <= 1 {
        return set;
    }
    set.insert(left(rank, world));
    set.insert(right(rank, world));
    for step in recursive_doubling(rank, world) {
        let p = match step {
            RdStep::Send { to } | RdStep::SendResult { to } => to,
            RdStep::RecvReduce { from, .. } | RdStep::RecvResult { from } => from,
            RdStep::Exchange { peer, .. } => peer,
        };
        set.insert(p);
    }
    set
}

#[cfg(test)]
mod tests;
