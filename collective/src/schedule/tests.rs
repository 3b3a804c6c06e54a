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
