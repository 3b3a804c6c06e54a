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
//! segment as reduced by its owner, so all ranks are bitwise equal. Each step's segment is
//! split into sub-chunks ([`subchunks`]) so that sending, receiving and reducing overlap.
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

    /// Symbolic value: how many times each rank's contribution is in it.
    type Sym = Vec<u32>;

    fn add(a: &mut Sym, b: &Sym) {
        for (x, y) in a.iter_mut().zip(b) {
            *x += y;
        }
    }

    /// Runs the ring schedule on symbolic values (one `Sym` per element per rank).
    fn simulate_ring(len: usize, world: usize, chunk: usize) -> Vec<Vec<Sym>> {
        let mut bufs: Vec<Vec<Sym>> = (0..world)
            .map(|r| {
                (0..len)
                    .map(|_| {
                        let mut s = vec![0; world];
                        s[r] = 1;
                        s
                    })
                    .collect()
            })
            .collect();
        for step in 0..world - 1 {
            // All ranks send at once: snapshot what is sent, then deliver.
            let sent: Vec<(usize, usize, Vec<Sym>)> = (0..world)
                .map(|r| {
                    let st = reduce_scatter_step(r, world, step);
                    let mut data = Vec::new();
                    for c in subchunks(segment(len, world, st.send), chunk) {
                        data.extend_from_slice(&bufs[r][c]);
                    }
                    (right(r, world), st.send, data)
                })
                .collect();
            for (to, seg, data) in sent {
                let st = reduce_scatter_step(to, world, step);
                assert_eq!(
                    st.recv, seg,
                    "receiver expects the segment the sender sends"
                );
                for (i, d) in segment(len, world, seg).zip(data) {
                    add(&mut bufs[to][i], &d);
                }
            }
        }
        for (r, buf) in bufs.iter().enumerate() {
            for i in segment(len, world, r) {
                assert!(
                    buf[i].iter().all(|&c| c == 1),
                    "rank {r} owns segment {r} fully reduced"
                );
            }
        }
        for step in 0..world - 1 {
            let sent: Vec<(usize, usize, Vec<Sym>)> = (0..world)
                .map(|r| {
                    let st = allgather_step(r, world, step);
                    (
                        right(r, world),
                        st.send,
                        bufs[r][segment(len, world, st.send)].to_vec(),
                    )
                })
                .collect();
            for (to, seg, data) in sent {
                assert_eq!(allgather_step(to, world, step).recv, seg);
                for (i, d) in segment(len, world, seg).zip(data) {
                    bufs[to][i] = d;
                }
            }
        }
        bufs
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
        fn ring_reduces_every_element_exactly_once(len in 0usize..40, world in 2usize..10, chunk in 1usize..7) {
            let bufs = simulate_ring(len, world, chunk);
            for buf in &bufs {
                for sym in buf {
                    prop_assert!(sym.iter().all(|&c| c == 1));
                }
                prop_assert_eq!(buf, &bufs[0]);
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
