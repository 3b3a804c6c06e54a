//! The hierarchical allreduce on real communicators: ranks on 127.0.0.1 and 127.0.0.2 (and
//! 127.0.0.3) are different hosts to the placement, so a group spread over them runs the
//! hierarchical plan; its results equal the flat ring's on the same inputs (f32 sum and
//! avg, i64 sum/min/max, odd lengths, multi-frame), and a killed rank fails every survivor
//! with the usual `PeerLost`.

use collective::{
    reference_reduce, AllreduceChoice, CollectiveError, Communicator, Element, GroupConfig, Limits,
    ReduceOp,
};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

mod common;

/// Lengths: odd, below and above the recursive-doubling threshold, multi-frame.
const LENS: [usize; 4] = [3, 257, 1001, 10_007];

/// One listener per rank on `127.0.0.{hosts[rank]}` and their configs.
async fn group(hosts: &[u8], generation: u64, limits: Limits) -> Vec<(GroupConfig, TcpListener)> {
    common::group_on_hosts(hosts, 7, generation, limits).await
}

fn limits(allreduce: AllreduceChoice) -> Limits {
    Limits {
        chunk_bytes: 1024,
        small_bytes_max: 256,
        allreduce,
        ..Limits::for_test()
    }
}

/// Exactly representable values (small integers) for rank `r`, element `i`.
fn value(r: usize, i: usize) -> f64 {
    (((r * 7 + i * 3) % 17) as f64) - 8.0
}

/// Every rank's outputs, in rank order, for every (len, op) of `ops`.
async fn run<T: Element>(
    hosts: &[u8],
    choice: AllreduceChoice,
    shared_memory: bool,
    conv: fn(f64) -> T,
    ops: &'static [ReduceOp],
) -> Vec<Vec<Vec<T>>> {
    let mut set = JoinSet::new();
    let limits = Limits {
        shared_memory,
        ..limits(choice)
    };
    for (cfg, l) in group(hosts, 1, limits).await {
        set.spawn(async move {
            let mut c = Communicator::connect_with_listener(cfg, &l).await.unwrap();
            let r = c.rank();
            let mut outs = Vec::new();
            for len in LENS {
                for &op in ops {
                    let mut buf: Vec<T> = (0..len).map(|i| conv(value(r, i))).collect();
                    c.allreduce(&mut buf, op).await.unwrap();
                    outs.push(buf);
                }
            }
            (r, c.hierarchical(), outs)
        });
    }
    let mut res = set.join_all().await;
    res.sort_by_key(|(r, _, _)| *r);
    let want_hier = choice != AllreduceChoice::Ring;
    res.into_iter()
        .map(|(r, hier, outs)| {
            assert_eq!(hier, want_hier, "rank {r} {choice:?} on {hosts:?}");
            outs
        })
        .collect()
}

/// Over shared memory (every link: one real host) and over TCP alone.
async fn equals_flat_ring<T: Element>(hosts: &[u8], conv: fn(f64) -> T, ops: &'static [ReduceOp]) {
    for shm in [true, false] {
        equals_flat_ring_with(hosts, shm, conv, ops).await;
    }
}

async fn equals_flat_ring_with<T: Element>(
    hosts: &[u8],
    shm: bool,
    conv: fn(f64) -> T,
    ops: &'static [ReduceOp],
) {
    let hier = run(hosts, AllreduceChoice::Auto, shm, conv, ops).await;
    let flat = run(hosts, AllreduceChoice::Ring, shm, conv, ops).await;
    let mut k = 0;
    for len in LENS {
        for &op in ops {
            let ins: Vec<Vec<T>> = (0..hosts.len())
                .map(|r| (0..len).map(|i| conv(value(r, i))).collect())
                .collect();
            let want = reference_reduce(&ins, op);
            for r in 0..hosts.len() {
                assert!(
                    hier[r][k] == flat[r][k] && hier[r][k] == want,
                    "hosts {hosts:?} shm {shm} len {len} {op:?} rank {r}"
                );
            }
            k += 1;
        }
    }
}

/// Placements: two hosts of unequal size, interleaved ranks; three hosts, one of them alone.
const PLACEMENTS: [&[u8]; 2] = [&[1, 2, 1, 2, 1], &[1, 1, 2, 3, 3, 2]];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f32_sum_and_avg_equal_the_flat_ring() {
    for hosts in PLACEMENTS {
        equals_flat_ring::<f32>(hosts, |v| v as f32, &[ReduceOp::Sum, ReduceOp::Avg]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i64_sum_min_max_equal_the_flat_ring() {
    for hosts in PLACEMENTS {
        equals_flat_ring::<i64>(
            hosts,
            |v| v as i64 * 1_000_000_007,
            &[ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max],
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_or_one_rank_a_host_stays_on_the_ring() {
    for hosts in [&[1u8, 1, 1][..], &[1, 2, 3]] {
        let mut set = JoinSet::new();
        for (cfg, l) in group(hosts, 1, limits(AllreduceChoice::Auto)).await {
            set.spawn(async move {
                let c = Communicator::connect_with_listener(cfg, &l).await.unwrap();
                c.hierarchical()
            });
        }
        assert!(!set.join_all().await.into_iter().any(|h| h), "{hosts:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_rank_fails_every_survivor_with_peer_lost() {
    // Six ranks on three hosts allreduce 1 MiB in a loop; rank 5 (not a leader) is killed
    // (its sockets close) while operations run. Every survivor, leaders and the ranks of
    // other hosts too, fails with PeerLost{5}, well inside the operation deadline.
    let limits = Limits {
        op_timeout_ms: 30_000,
        chunk_bytes: 64 * 1024,
        ..limits(AllreduceChoice::Auto)
    };
    let ranks = group(&[1, 1, 2, 2, 3, 3], 3, limits)
        .await
        .into_iter()
        .map(|(cfg, l)| {
            (cfg.rank, async move {
                let c = Communicator::connect_with_listener(cfg, &l).await.unwrap();
                assert!(c.hierarchical());
                c
            })
        })
        .collect();
    let (res, _) = common::allreduce_until_a_rank_is_killed(ranks, 5, 1 << 18).await;
    assert_eq!(res.len(), 5);
    for (rank, err, _) in res {
        assert_eq!(err, CollectiveError::PeerLost { rank: 5 }, "rank {rank}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_hierarchical_on_one_host_and_one_rank_a_host() {
    // Forced where Auto would not choose it: one host (no leaders' ring) and one rank a
    // host (only the ring). Results equal the reference.
    const OPS: &[ReduceOp] = &[ReduceOp::Sum, ReduceOp::Avg];
    for hosts in [&[1u8, 1, 1][..], &[1, 2, 3]] {
        let outs = run::<f32>(
            hosts,
            AllreduceChoice::Hierarchical,
            false,
            |v| v as f32,
            OPS,
        )
        .await;
        let mut k = 0;
        for len in LENS {
            for &op in OPS {
                let ins: Vec<Vec<f32>> = (0..hosts.len())
                    .map(|r| (0..len).map(|i| value(r, i) as f32).collect())
                    .collect();
                let want = reference_reduce(&ins, op);
                for (r, o) in outs.iter().enumerate() {
                    assert!(o[k] == want, "hosts {hosts:?} len {len} {op:?} rank {r}");
                }
                k += 1;
            }
        }
    }
}
