//! Multi-rank tests over the in-memory transport: results against a reference reduction,
//! failure semantics (mismatch, abort, timeout, lost peer), gradient buckets.

use std::time::Duration;

use collective::{
    bf16, f16, reference_reduce, AbortReason, BucketConfig, Bucketer, CollKind, CollectiveError,
    Communicator, DType, Element, Limits, Ready, ReduceOp,
};
use tokio::task::JoinSet;

/// Exactly representable test values (small integers) for rank `r`, element `i`.
fn value(r: usize, i: usize) -> f32 {
    (((r * 7 + i * 3) % 17) as f32) - 8.0
}

fn inputs<T: Element>(world: usize, len: usize, conv: fn(f32) -> T) -> Vec<Vec<T>> {
    (0..world)
        .map(|r| (0..len).map(|i| conv(value(r, i))).collect())
        .collect()
}

/// Runs `allreduce` on every rank concurrently and returns each rank's buffer.
async fn allreduce_all<T: Element>(
    comms: Vec<Communicator>,
    ins: &[Vec<T>],
    op: ReduceOp,
) -> Vec<(Communicator, Vec<T>)> {
    let mut set = JoinSet::new();
    for (mut c, mut buf) in comms.into_iter().zip(ins.iter().cloned()) {
        set.spawn(async move {
            c.allreduce(&mut buf, op).await.expect("allreduce");
            (c, buf)
        });
    }
    let mut out: Vec<_> = set.join_all().await;
    out.sort_by_key(|(c, _)| c.rank());
    out
}

async fn check_dtype<T: Element>(conv: fn(f32) -> T) {
    // for_test: 64-byte chunks, recursive doubling up to 96 bytes, so both algorithms and
    // multi-frame pipelining run.
    for world in 1..=8 {
        let mut comms = Communicator::in_memory(world, Limits::for_test()).unwrap();
        for len in [0usize, 1, 5, 13, 24, 47, 100, 333] {
            for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max] {
                let ins = inputs(world, len, conv);
                let want = reference_reduce(&ins, op);
                let out = allreduce_all(comms, &ins, op).await;
                for (c, buf) in &out {
                    assert_eq!(
                        buf,
                        &want,
                        "world {world} len {len} {op:?} {:?} rank {}",
                        T::DTYPE,
                        c.rank()
                    );
                }
                comms = out.into_iter().map(|(c, _)| c).collect();
            }
        }
    }
}

#[tokio::test]
async fn allreduce_equals_reference_f32() {
    check_dtype::<f32>(|x| x).await;
}

#[tokio::test]
async fn allreduce_equals_reference_f64() {
    check_dtype::<f64>(|x| x as f64).await;
}

#[tokio::test]
async fn allreduce_equals_reference_f16() {
    check_dtype::<f16>(f16::from_f32).await;
}

#[tokio::test]
async fn allreduce_equals_reference_bf16() {
    check_dtype::<bf16>(bf16::from_f32).await;
}

#[tokio::test]
async fn reduce_scatter_allgather_broadcast_barrier() {
    for world in 1..=6 {
        for len in [0usize, 1, 7, 50, 301] {
            let comms = Communicator::in_memory(world, Limits::for_test()).unwrap();
            let ins = inputs::<f64>(world, len, |x| x as f64);
            let want = reference_reduce(&ins, ReduceOp::Sum);
            let mut set = JoinSet::new();
            for (mut c, mut buf) in comms.into_iter().zip(ins.clone()) {
                let want = want.clone();
                set.spawn(async move {
                    let r = c.rank();
                    c.reduce_scatter(&mut buf, ReduceOp::Sum).await.unwrap();
                    let own = c.segment(len, r);
                    assert_eq!(
                        &buf[own.clone()],
                        &want[own],
                        "reduce_scatter world {world} len {len}"
                    );
                    // Allgather of the reduced segments rebuilds the full sum everywhere.
                    c.allgather(&mut buf).await.unwrap();
                    assert_eq!(buf, want, "allgather world {world} len {len}");
                    // Broadcast from the last rank.
                    let root = world - 1;
                    let mut b: Vec<f32> = (0..len)
                        .map(|i| if r == root { i as f32 } else { -1.0 })
                        .collect();
                    c.broadcast(&mut b, root).await.unwrap();
                    assert!(
                        b.iter().enumerate().all(|(i, x)| *x == i as f32),
                        "broadcast"
                    );
                    c.barrier().await.unwrap();
                });
            }
            set.join_all().await;
        }
    }
}

#[tokio::test]
async fn mismatched_collective_fails_everywhere_naming_it() {
    // Rank 2 runs an allreduce of another length: every rank fails with Mismatch, and the
    // rank that saw the bad frame names both operations.
    let comms = Communicator::in_memory(3, Limits::for_test()).unwrap();
    let mut set = JoinSet::new();
    for mut c in comms {
        set.spawn(async move {
            let len = if c.rank() == 2 { 40 } else { 41 };
            let mut buf = vec![1.0f32; len];
            (c.rank(), c.allreduce(&mut buf, ReduceOp::Sum).await)
        });
    }
    let res = set.join_all().await;
    let mut named = false;
    for (rank, r) in res {
        match r {
            Err(CollectiveError::Mismatch { ours, theirs, .. }) => {
                assert_eq!(ours.kind, CollKind::Allreduce);
                if ours.len != theirs.len {
                    named = true;
                    let msg = CollectiveError::Mismatch { rank, ours, theirs }.to_string();
                    assert!(msg.contains("len=40") && msg.contains("len=41"), "{msg}");
                }
            }
            other => panic!("rank {rank}: expected a mismatch, got {other:?}"),
        }
    }
    assert!(named, "some rank reports the differing length");

    // Different dtypes of the same length are a mismatch too.
    let comms = Communicator::in_memory(2, Limits::for_test()).unwrap();
    let mut set = JoinSet::new();
    for mut c in comms {
        set.spawn(async move {
            if c.rank() == 0 {
                c.allreduce(&mut [1.0f32; 8], ReduceOp::Sum).await
            } else {
                c.allreduce(&mut [1.0f64; 8], ReduceOp::Sum).await
            }
        });
    }
    for r in set.join_all().await {
        match r {
            Err(CollectiveError::Mismatch { ours, theirs, .. }) => {
                assert_ne!(ours.dtype, theirs.dtype);
                assert!([ours.dtype, theirs.dtype].contains(&DType::F64));
            }
            other => panic!("expected a dtype mismatch, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn lost_peer_fails_every_survivor_and_poisons() {
    // Ranks 0, 1, 3 enter an allreduce; rank 2 is dropped instead: all fail with PeerLost{2}
    // long before the operation deadline, and the next operation fails at once.
    let limits = Limits {
        op_timeout_ms: 30_000,
        ..Limits::for_test()
    };
    let mut comms = Communicator::in_memory(4, limits).unwrap();
    let dead = comms.remove(2);
    let start = tokio::time::Instant::now();
    let mut set = JoinSet::new();
    for mut c in comms {
        set.spawn(async move {
            let mut buf = vec![1.0f32; 1000];
            let first = c.allreduce(&mut buf, ReduceOp::Sum).await;
            let next = c.allreduce(&mut buf, ReduceOp::Sum).await;
            (c.rank(), first, next)
        });
    }
    drop(dead);
    for (rank, first, next) in set.join_all().await {
        assert_eq!(
            first,
            Err(CollectiveError::PeerLost { rank: 2 }),
            "rank {rank}"
        );
        assert_eq!(next, first, "poisoned communicator repeats the error");
    }
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "failed within about a second"
    );
}

#[tokio::test]
async fn abort_handle_cancels_in_flight_and_peers_follow() {
    let comms = Communicator::in_memory(
        3,
        Limits {
            op_timeout_ms: 30_000,
            ..Limits::for_test()
        },
    )
    .unwrap();
    let mut it = comms.into_iter();
    let (mut c0, mut c1, mut c2) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    let h0 = c0.abort_handle();
    // Ranks 0 and 1 enter an allreduce that cannot finish (rank 2 is not there yet).
    let t0 = tokio::spawn(async move { c0.allreduce(&mut [1.0f32; 100], ReduceOp::Sum).await });
    let t1 = tokio::spawn(async move { c1.allreduce(&mut [1.0f32; 100], ReduceOp::Sum).await });
    h0.abort();
    assert_eq!(t0.await.unwrap(), Err(CollectiveError::Aborted));
    let peer_aborted = CollectiveError::PeerAborted {
        rank: 0,
        reason: AbortReason::Aborted,
    };
    assert_eq!(t1.await.unwrap(), Err(peer_aborted.clone()));
    // Rank 2 arrives late: its next operation fails at once.
    assert_eq!(
        c2.allreduce(&mut [1.0f32; 100], ReduceOp::Sum).await,
        Err(peer_aborted)
    );
}

#[tokio::test]
async fn operation_deadline_fails_with_timeout_and_tells_peers() {
    let limits = Limits {
        op_timeout_ms: 200,
        ..Limits::for_test()
    };
    let mut comms = Communicator::in_memory(2, limits).unwrap();
    let mut c1 = comms.pop().unwrap();
    let mut c0 = comms.pop().unwrap();
    let r = c0.barrier().await;
    assert!(
        matches!(r, Err(CollectiveError::Timeout { op, after_ms: 200 }) if op.kind == CollKind::Barrier),
        "{r:?}"
    );
    // Rank 0's barrier frame was delivered before it gave up, so rank 1's barrier may
    // complete; its next operation must fail with the relayed timeout.
    let mut r = c1.barrier().await;
    if r.is_ok() {
        r = c1.barrier().await;
    }
    assert_eq!(
        r,
        Err(CollectiveError::PeerAborted {
            rank: 0,
            reason: AbortReason::Timeout
        })
    );
}

#[tokio::test]
async fn bucketer_fuses_and_unpacks_in_place_all_at_once_or_tensor_by_tensor() {
    let world = 3;
    // Empty tensors too, in the middle and at the end.
    let sizes = [1usize, 300, 0, 5, 1000, 7, 64, 0];
    let cfg = BucketConfig {
        bucket_bytes: 256,
        first_bucket_bytes: 64,
        op: ReduceOp::Avg,
        ..BucketConfig::default()
    };
    let comms = Communicator::in_memory(world, Limits::for_test()).unwrap();
    let mut set = JoinSet::new();
    for c in comms {
        let cfg = cfg.clone();
        set.spawn(async move {
            let r = c.rank();
            let mut b = Bucketer::<f32>::new(c, cfg).unwrap();
            let mut results = Vec::new();
            for step in 0..2 {
                let mut tensors: Vec<Vec<f32>> = sizes
                    .iter()
                    .enumerate()
                    .map(|(t, &n)| (0..n).map(|i| value(r + step, i + t)).collect())
                    .collect();
                for (i, t) in tensors.iter().enumerate() {
                    b.push(t).await.unwrap();
                    if step == 1 && i == 1 {
                        // A cut where a layer ends: the partial bucket goes now.
                        assert!(b.pending() > 0);
                        b.send_partial().await.unwrap();
                        assert_eq!(b.pending(), 0);
                    }
                    if step == 1 && (i == 3 || i == 4) {
                        // A gather among the buckets, with the bucket being filled left open.
                        let local: Vec<f32> =
                            (0..5).map(|j| (100 * r + 10 * i + j) as f32).collect();
                        b.push_gather(&local).await.unwrap();
                    }
                }
                let mut views: Vec<&mut [f32]> =
                    tensors.iter_mut().map(|t| t.as_mut_slice()).collect();
                if step == 0 {
                    b.finish(&mut views).await.unwrap();
                } else {
                    // Each tensor is handed out once, in order, complete.
                    let mut seen: Vec<(usize, Vec<f32>)> = Vec::new();
                    let mut gathered: Vec<(usize, Vec<f32>)> = Vec::new();
                    b.finish_each(&mut views, |ready| match ready {
                        Ready::Tensor(i, t) => seen.push((i, t.to_vec())),
                        Ready::Gathered(i, g) => gathered.push((i, g.to_vec())),
                    })
                    .await
                    .unwrap();
                    for (k, (i, g)) in gathered.iter().enumerate() {
                        assert_eq!(*i, k, "gathers in order");
                        let layer = 3 + k;
                        let want: Vec<f32> = (0..world)
                            .flat_map(|q| (0..5).map(move |j| (100 * q + 10 * layer + j) as f32))
                            .collect();
                        assert_eq!(g, &want, "every rank's contribution, in rank order");
                    }
                    assert_eq!(gathered.len(), 2);
                    let order: Vec<usize> = seen.iter().map(|(i, _)| *i).collect();
                    assert_eq!(order, (0..sizes.len()).collect::<Vec<_>>());
                    for (i, v) in &seen {
                        assert_eq!(v, &tensors[*i], "tensor {i} handed out before it was whole");
                    }
                }
                results.push(tensors);
            }
            let c = b.into_communicator().await.unwrap();
            assert_eq!(c.rank(), r);
            results
        });
    }
    let all = set.join_all().await;
    for step in 0..2 {
        for (t, &n) in sizes.iter().enumerate() {
            let ins: Vec<Vec<f32>> = (0..world)
                .map(|r| (0..n).map(|i| value(r + step, i + t)).collect())
                .collect();
            let want = reference_reduce(&ins, ReduceOp::Avg);
            for res in &all {
                assert_eq!(res[step][t], want, "step {step} tensor {t}");
            }
        }
    }
}
