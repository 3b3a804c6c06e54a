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
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    /// Symbolic value: how many times each rank's contribution is in it.
    type Sym = Vec<u32>;

    fn add(a: &mut Sym, b: &Sym) {
        for (x, y) in a.iter_mut().zip(b) {
            *x += y;
        }
    }

    fn unit(world: usize, r: usize) -> Sym {
        let mut s = vec![0; world];
        s[r] = 1;
        s
    }

    /// Runs every rank's [`ring_plan`] on symbolic values (rank `r` starts with the unit
    /// vector `r` in every element), over links of `slots` frames each: a send waits while
    /// its link is full, a receive while it is empty, a receive releases its frame at once
    /// (as the driver does). Checks that each received frame is the range the left
    /// neighbour sent, that every rank finishes (no deadlock), and returns the buffers and,
    /// per rank and element, how often a `ReduceOwned` receive touched it.
    #[allow(clippy::type_complexity)]
    fn simulate_ring(
        len: usize,
        world: usize,
        chunk: usize,
        group: usize,
        slots: usize,
        kind: RingKind,
    ) -> (Vec<Vec<Sym>>, Vec<Vec<u32>>) {
        let mut bufs: Vec<Vec<Sym>> = (0..world).map(|r| vec![unit(world, r); len]).collect();
        let mut owned = vec![vec![0u32; len]; world];
        let plans: Vec<Vec<RingAction>> = (0..world)
            .map(|r| ring_plan(r, world, len, chunk, group, kind))
            .collect();
        // links[r]: frames in flight from r to its right neighbour.
        let mut links: Vec<VecDeque<(Range<usize>, Vec<Sym>)>> = vec![VecDeque::new(); world];
        let mut pc = vec![0usize; world];
        loop {
            let mut progressed = false;
            for r in 0..world {
                while let Some(a) = plans[r].get(pc[r]) {
                    match a {
                        RingAction::Send(range) => {
                            if links[r].len() >= slots {
                                break;
                            }
                            links[r].push_back((range.clone(), bufs[r][range.clone()].to_vec()));
                        }
                        RingAction::Recv(range, mode) => {
                            let from = left(r, world);
                            let Some((sent, data)) = links[from].pop_front() else {
                                break;
                            };
                            assert_eq!(&sent, range, "rank {r} receives what {from} sent");
                            for (i, d) in range.clone().zip(data) {
                                match mode {
                                    RecvMode::Copy => bufs[r][i] = d,
                                    RecvMode::Reduce => add(&mut bufs[r][i], &d),
                                    RecvMode::ReduceOwned => {
                                        add(&mut bufs[r][i], &d);
                                        owned[r][i] += 1;
                                    }
                                }
                            }
                        }
                    }
                    pc[r] += 1;
                    progressed = true;
                }
            }
            if pc.iter().zip(&plans).all(|(p, plan)| *p == plan.len()) {
                assert!(links.iter().all(VecDeque::is_empty), "no frame left over");
                return (bufs, owned);
            }
            assert!(
                progressed,
                "ring deadlocks: len {len} world {world} chunk {chunk} group {group} slots {slots}: {pc:?}"
            );
        }
    }

    fn simulate_rd(world: usize) -> Vec<Sym> {
        let mut vals: Vec<Sym> = (0..world)
            .map(|r| {
                let mut s = vec![0; world];
                s[r] = 1;
                s
            })
            .collect();
        let plans: Vec<Vec<RdStep>> = (0..world).map(|r| recursive_doubling(r, world)).collect();
        let mut pc = vec![0usize; world];
        // Run rounds until every plan is done; a send completes only together with the
        // matching receive (rendezvous), which also checks the plans pair up without deadlock.
        loop {
            let mut progressed = false;
            for r in 0..world {
                let Some(step) = plans[r].get(pc[r]).copied() else {
                    continue;
                };
                match step {
                    RdStep::Exchange { peer, theirs_first } => {
                        if plans[peer].get(pc[peer])
                            == Some(&RdStep::Exchange {
                                peer: r,
                                theirs_first: !theirs_first,
                            })
                        {
                            let (a, b) = (vals[r].clone(), vals[peer].clone());
                            add(&mut vals[r], &b);
                            add(&mut vals[peer], &a);
                            pc[r] += 1;
                            pc[peer] += 1;
                            progressed = true;
                        }
                    }
                    RdStep::Send { to } => {
                        if let Some(RdStep::RecvReduce {
                            from,
                            theirs_first: true,
                        }) = plans[to].get(pc[to])
                        {
                            assert_eq!(*from, r);
                            let v = vals[r].clone();
                            add(&mut vals[to], &v);
                            pc[r] += 1;
                            pc[to] += 1;
                            progressed = true;
                        }
                    }
                    RdStep::SendResult { to } => {
                        if let Some(RdStep::RecvResult { from }) = plans[to].get(pc[to]) {
                            assert_eq!(*from, r);
                            vals[to] = vals[r].clone();
                            pc[r] += 1;
                            pc[to] += 1;
                            progressed = true;
                        }
                    }
                    RdStep::RecvReduce { .. } | RdStep::RecvResult { .. } => {}
                }
            }
            if pc.iter().zip(&plans).all(|(p, plan)| *p == plan.len()) {
                return vals;
            }
            assert!(
                progressed,
                "recursive doubling deadlocks at world {world}: {pc:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn segments_partition_the_buffer(len in 0usize..10_000, world in 1usize..64) {
            let mut next = 0;
            for i in 0..world {
                let r = segment(len, world, i);
                prop_assert_eq!(r.start, next);
                prop_assert!(r.len() == len / world || r.len() == len / world + 1);
                next = r.end;
            }
            prop_assert_eq!(next, len);
        }

        #[test]
        fn subchunks_cover_exactly_once(start in 0usize..1000, n in 0usize..5000, chunk in 0usize..700) {
            let mut next = start;
            for c in subchunks(start..start + n, chunk) {
                prop_assert_eq!(c.start, next);
                prop_assert!(!c.is_empty() && c.len() <= chunk.max(1));
                next = c.end;
            }
            prop_assert_eq!(next, start + n);
        }

        #[test]
        fn ring_allreduce_reduces_every_element_exactly_once(
            len in 0usize..60, world in 2usize..9, chunk in 1usize..7, group in 1usize..5,
        ) {
            // Links of `group` slots: the bound the plan promises to stay within.
            let (bufs, owned) = simulate_ring(len, world, chunk, group, group, RingKind::Allreduce);
            for (r, buf) in bufs.iter().enumerate() {
                for sym in buf {
                    prop_assert!(sym.iter().all(|&c| c == 1));
                }
                prop_assert_eq!(buf, &bufs[0]);
                for (i, &n) in owned[r].iter().enumerate() {
                    prop_assert_eq!(n, u32::from(segment(len, world, r).contains(&i)));
                }
            }
        }

        #[test]
        fn ring_reduce_scatter_completes_each_owned_segment_once(
            len in 0usize..60, world in 2usize..9, chunk in 1usize..7, group in 1usize..5,
        ) {
            let (bufs, owned) =
                simulate_ring(len, world, chunk, group, group, RingKind::ReduceScatter);
            for (r, buf) in bufs.iter().enumerate() {
                for i in segment(len, world, r) {
                    prop_assert!(buf[i].iter().all(|&c| c == 1));
                }
                for (i, &n) in owned[r].iter().enumerate() {
                    prop_assert_eq!(n, u32::from(segment(len, world, r).contains(&i)));
                }
            }
        }

        #[test]
        fn ring_allgather_gives_every_rank_every_segment(
            len in 0usize..60, world in 2usize..9, chunk in 1usize..7, group in 1usize..5,
        ) {
            let (bufs, _) = simulate_ring(len, world, chunk, group, group, RingKind::Allgather);
            for buf in &bufs {
                for owner in 0..world {
                    for i in segment(len, world, owner) {
                        prop_assert_eq!(&buf[i], &unit(world, owner));
                    }
                }
            }
        }

        #[test]
        fn ring_plans_send_one_frame_per_chunk_and_step(
            len in 0usize..200, world in 2usize..9, chunk in 1usize..9, group in 1usize..6,
        ) {
            let chunks = ring_chunks(len, world, chunk);
            for r in 0..world {
                let plan = ring_plan(r, world, len, chunk, group, RingKind::Allreduce);
                let sends = plan.iter().filter(|a| matches!(a, RingAction::Send(_))).count();
                prop_assert_eq!(sends, chunks * 2 * (world - 1));
                prop_assert_eq!(plan.len(), 2 * sends);
                for a in &plan {
                    let (RingAction::Send(x) | RingAction::Recv(x, _)) = a;
                    prop_assert!(x.len() <= chunk && x.end <= len);
                }
            }
        }

        #[test]
        fn ring_steps_send_and_receive_distinct_segments(rank in 0usize..32, world in 2usize..33, step in 0usize..31) {
            prop_assume!(rank < world && step < world - 1);
            let rs = reduce_scatter_step(rank, world, step);
            let ag = allgather_step(rank, world, step);
            prop_assert_ne!(rs.send, rs.recv);
            prop_assert_ne!(ag.send, ag.recv);
            // The left neighbour sends exactly what we expect to receive.
            prop_assert_eq!(reduce_scatter_step(left(rank, world), world, step).send, rs.recv);
            prop_assert_eq!(allgather_step(left(rank, world), world, step).send, ag.recv);
        }

        #[test]
        fn peers_are_symmetric(world in 1usize..40) {
            for r in 0..world {
                for p in peers(r, world) {
                    prop_assert!(p != r && p < world);
                    prop_assert!(peers(p, world).contains(&r));
                }
            }
        }
    }

    #[test]
    fn recursive_doubling_reduces_every_rank_once() {
        for world in 1..=33 {
            let vals = simulate_rd(world);
            for v in &vals {
                assert!(v.iter().all(|&c| c == 1), "world {world}: {v:?}");
            }
        }
    }

    #[test]
    fn recursive_doubling_is_logarithmic() {
        assert_eq!(recursive_doubling(0, 4).len(), 2);
        assert_eq!(recursive_doubling(5, 8).len(), 3);
        // Non powers of two: two extra rounds for the folded ranks.
        assert_eq!(recursive_doubling(1, 6).len(), 4);
        assert_eq!(recursive_doubling(0, 6).len(), 2);
    }
}
