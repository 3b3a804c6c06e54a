//! Tests over the real TCP data plane on 127.0.0.1: results, the handshake's refusals,
//! connect deadlines, and a rank killed in the middle of an operation. Data tests run with
//! the shared-memory path on (every link moves to shm: all ranks share this host) and off.

use std::net::SocketAddr;
use std::time::Duration;

use collective::testing::probe_handshake;
use collective::{
    bf16, f16, reference_reduce, CollectiveError, Communicator, Element, GroupConfig,
    HandshakeError, Limits, ReduceOp,
};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

mod common;

use common::SECRET;

/// `world` listeners on 127.0.0.1 (ephemeral ports) and their configs.
async fn group(world: usize, generation: u64, limits: Limits) -> Vec<(GroupConfig, TcpListener)> {
    common::group_on_hosts(&vec![1; world], 42, generation, limits).await
}

fn tcp_limits() -> Limits {
    Limits {
        chunk_bytes: 4096,
        small_bytes_max: 1024,
        ..Limits::for_test()
    }
}

/// Connects and checks the data path: with `shared_memory`, every link of a group on one
/// host is on shared memory; without, none.
async fn connect(cfg: GroupConfig, l: &TcpListener) -> Communicator {
    let shm = cfg.limits.shared_memory;
    let c = Communicator::connect_with_listener(cfg, l).await.unwrap();
    let links = collective::schedule::peers(c.rank(), c.world()).len();
    let want = if shm { links } else { 0 };
    assert_eq!(c.shared_memory_links(), want, "rank {}", c.rank());
    c
}

// Multi-threaded, so the links' reading tasks run beside the operations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_allreduce_equals_reference_shm_on_and_off() {
    for shared_memory in [true, false] {
        let limits = Limits {
            shared_memory,
            ..tcp_limits()
        };
        allreduce_equals_reference(limits).await;
    }
}

async fn allreduce_equals_reference(limits: Limits) {
    for world in 1..=5 {
        let mut set = JoinSet::new();
        for (cfg, l) in group(world, 1, limits.clone()).await {
            set.spawn(async move {
                let mut c = connect(cfg, &l).await;
                let r = c.rank();
                let mut outs = Vec::new();
                // Small (recursive doubling), odd, multi-chunk ring, and empty.
                for len in [3usize, 255, 10_007, 0] {
                    for op in [ReduceOp::Sum, ReduceOp::Avg] {
                        let mut buf: Vec<f32> =
                            (0..len).map(|i| ((r * 5 + i) % 11) as f32).collect();
                        c.allreduce(&mut buf, op).await.unwrap();
                        outs.push(buf);
                    }
                }
                (r, outs)
            });
        }
        let res = set.join_all().await;
        let mut k = 0;
        for len in [3usize, 255, 10_007, 0] {
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                let ins: Vec<Vec<f32>> = (0..world)
                    .map(|r| (0..len).map(|i| ((r * 5 + i) % 11) as f32).collect())
                    .collect();
                let want = reference_reduce(&ins, op);
                for (r, outs) in &res {
                    assert_eq!(
                        outs[k], want,
                        "world {world} len {len} {op:?} rank {r} {limits:?}"
                    );
                }
                k += 1;
            }
        }
    }
}

/// Exactly representable test values (small integers) for rank `r`, element `i`.
fn value(r: usize, i: usize) -> f32 {
    (((r * 7 + i * 3) % 17) as f32) - 8.0
}

/// Every op the floats have.
const FLOAT_OPS: &[ReduceOp] = &[ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max];
/// Every op the integers have (their mean is refused).
const INTEGER_OPS: &[ReduceOp] = &[ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max];

/// Every op of `OPS`, N = 2..5, odd and empty lengths, both algorithms and multi-frame
/// rings (1 KiB frames), over one group per world.
async fn every_dtype<T: Element>(conv: fn(f32) -> T, limits: &Limits, ops: &'static [ReduceOp]) {
    const LENS: [usize; 5] = [0, 1, 13, 1001, 5003];
    let limits = Limits {
        chunk_bytes: 1024,
        small_bytes_max: 256,
        ..limits.clone()
    };
    for world in 2..=5 {
        let ins = |len: usize| -> Vec<Vec<T>> {
            (0..world)
                .map(|r| (0..len).map(|i| conv(value(r, i))).collect())
                .collect()
        };
        let mut set = JoinSet::new();
        for (cfg, l) in group(world, 2, limits.clone()).await {
            set.spawn(async move {
                let mut c = connect(cfg, &l).await;
                let r = c.rank();
                let mut outs = Vec::new();
                for len in LENS {
                    for &op in ops {
                        let mut buf: Vec<T> = (0..len).map(|i| conv(value(r, i))).collect();
                        let shm = c.shared_memory_links();
                        c.allreduce(&mut buf, op)
                            .await
                            .unwrap_or_else(|e| panic!("rank {r} len {len} {op:?} shm {shm}: {e}"));
                        outs.push(buf);
                    }
                }
                (r, outs)
            });
        }
        let res = set.join_all().await;
        let mut k = 0;
        for len in LENS {
            for &op in ops {
                let want = reference_reduce(&ins(len), op);
                for (r, outs) in &res {
                    assert_eq!(
                        outs[k],
                        want,
                        "world {world} len {len} {op:?} {:?} rank {r} shm {}",
                        T::DTYPE,
                        limits.shared_memory
                    );
                }
                k += 1;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_every_dtype_equals_reference_shm_on_and_off() {
    for shared_memory in [true, false] {
        let limits = Limits {
            shared_memory,
            ..tcp_limits()
        };
        every_dtype::<f32>(|x| x, &limits, FLOAT_OPS).await;
        every_dtype::<f64>(|x| x as f64, &limits, FLOAT_OPS).await;
        every_dtype::<f16>(f16::from_f32, &limits, FLOAT_OPS).await;
        every_dtype::<bf16>(bf16::from_f32, &limits, FLOAT_OPS).await;
        every_dtype::<i32>(|x| x as i32, &limits, INTEGER_OPS).await;
        every_dtype::<i64>(|x| x as i64 * (1 << 40), &limits, INTEGER_OPS).await;
        every_dtype::<u8>(|x| (x + 8.0) as u8, &limits, INTEGER_OPS).await;
    }
}

#[tokio::test]
async fn handshake_refuses_wrong_secret_and_stale_generation() {
    let mut g = group(2, 7, tcp_limits()).await;
    let (cfg1, l1) = g.pop().unwrap();
    let (cfg0, l0) = g.pop().unwrap();
    let addr1 = cfg1.addrs[1];
    // Rank 1 accepts (rank 0 dials it); it keeps accepting after refusing strangers.
    let acceptor = tokio::spawn(async move {
        let c = Communicator::connect_with_listener(cfg1, &l1).await;
        (c, l1)
    });
    let wrong = probe_handshake(addr1, b"wrong secret", 42, 7, 0, 1).await;
    assert!(
        matches!(wrong, Err(HandshakeError::BadMac { .. })),
        "{wrong:?}"
    );
    let stale = probe_handshake(addr1, SECRET, 42, 6, 0, 1).await;
    assert_eq!(stale, Err(HandshakeError::Refused { rank: 1 }));
    let stray = probe_handshake(addr1, SECRET, 43, 7, 0, 1).await;
    assert_eq!(stray, Err(HandshakeError::Refused { rank: 1 }));
    let bad_rank = probe_handshake(addr1, SECRET, 42, 7, 1, 1).await;
    assert_eq!(bad_rank, Err(HandshakeError::Refused { rank: 1 }));
    // The real rank 0 still gets in, and the group works.
    let mut c0 = Communicator::connect_with_listener(cfg0, &l0)
        .await
        .unwrap();
    let (c1, _l1) = acceptor.await.unwrap();
    let mut c1 = c1.unwrap();
    let (mut x, mut y) = ([1.0f64, 2.0], [3.0f64, 4.0]);
    let (a, b) = tokio::join!(
        c0.allreduce(&mut x, ReduceOp::Sum),
        c1.allreduce(&mut y, ReduceOp::Sum)
    );
    a.unwrap();
    b.unwrap();
    assert_eq!((x, y), ([4.0, 6.0], [4.0, 6.0]));
}

#[tokio::test]
async fn dialer_with_wrong_secret_fails_to_connect() {
    let limits = Limits {
        connect_timeout_ms: 400,
        ..tcp_limits()
    };
    let mut g = group(2, 1, limits).await;
    let (cfg1, l1) = g.pop().unwrap();
    let (mut cfg0, l0) = g.pop().unwrap();
    cfg0.secret = b"another secret".to_vec();
    let (a, b) = tokio::join!(
        Communicator::connect_with_listener(cfg0, &l0),
        Communicator::connect_with_listener(cfg1, &l1)
    );
    assert!(
        matches!(
            a,
            Err(CollectiveError::Handshake(HandshakeError::BadMac { .. }))
        ),
        "{a:?}"
    );
    assert!(
        matches!(b, Err(CollectiveError::Connect { rank: 0, .. })),
        "{b:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_rank_mid_operation_fails_every_survivor_over_shm() {
    killed_rank_mid_operation(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_rank_mid_operation_fails_every_survivor_over_tcp() {
    killed_rank_mid_operation(false).await;
}

async fn killed_rank_mid_operation(shared_memory: bool) {
    // Four ranks allreduce 4 MiB buffers in a loop; rank 2's task is killed (its sockets
    // close, as when the process dies) while operations are running. Every survivor fails
    // with PeerLost{2} within about a second, far inside the 30 s operation deadline — over
    // shared memory too, where the survivors may be asleep on a ring.
    let limits = Limits {
        op_timeout_ms: 30_000,
        chunk_bytes: 64 * 1024,
        shared_memory,
        ..tcp_limits()
    };
    let ranks = group(4, 3, limits)
        .await
        .into_iter()
        .map(|(cfg, l)| (cfg.rank, async move { connect(cfg, &l).await }))
        .collect();
    let (res, killed_at) = common::allreduce_until_a_rank_is_killed(ranks, 2, 1 << 20).await;
    for (rank, err, at) in res {
        assert_eq!(err, CollectiveError::PeerLost { rank: 2 }, "rank {rank}");
        let after = at.duration_since(killed_at);
        assert!(
            after < Duration::from_millis(1500),
            "rank {rank} failed after {after:?}"
        );
    }
}

/// Runs `body` for each rank of a 4-rank shared-memory group with blocking waits, each rank
/// on a thread of its own with its own runtime, its operations inside `block_on` (the way
/// `ringleader._native.Ring` drives them). Returns what each rank's body returned.
fn blocking_group<R: Send + 'static>(
    limits: Limits,
    body: fn(&tokio::runtime::Runtime, Communicator) -> R,
) -> Vec<R> {
    const WORLD: usize = 4;
    let ls: Vec<std::net::TcpListener> = (0..WORLD)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    let threads: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(rank, l)| {
            let cfg = GroupConfig {
                rank,
                world: WORLD,
                group_id: 42,
                generation: 5,
                addrs: addrs.clone(),
                secret: SECRET.to_vec(),
                limits: limits.clone(),
            };
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .unwrap();
                let c = rt.block_on(async move {
                    l.set_nonblocking(true).unwrap();
                    let l = TcpListener::from_std(l).unwrap();
                    connect(cfg, &l).await
                });
                body(&rt, c)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn blocking_limits() -> Limits {
    Limits {
        blocking_waits: true,
        shared_memory: true,
        op_timeout_ms: 30_000,
        ..tcp_limits()
    }
}

#[test]
fn blocking_waits_over_shm_equal_reference() {
    // 4 KiB frames: the longer buffers need many frames per ring step, so producers find
    // the rings full and consumers find them empty, both asleep on the futex.
    const LENS: [usize; 4] = [0, 13, 1001, 100_003];
    let res = blocking_group(blocking_limits(), |rt, mut c| {
        let r = c.rank();
        let outs: Vec<Vec<f32>> = LENS
            .iter()
            .map(|&len| {
                let mut buf: Vec<f32> = (0..len).map(|i| value(r, i)).collect();
                rt.block_on(c.allreduce(&mut buf, ReduceOp::Sum)).unwrap();
                buf
            })
            .collect();
        (r, outs)
    });
    for (k, len) in LENS.iter().enumerate() {
        let ins: Vec<Vec<f32>> = (0..4)
            .map(|r| (0..*len).map(|i| value(r, i)).collect())
            .collect();
        let want = reference_reduce(&ins, ReduceOp::Sum);
        for (r, outs) in &res {
            assert_eq!(outs[k], want, "len {len} rank {r}");
        }
    }
}

#[test]
fn blocking_waits_see_a_killed_rank_within_a_second() {
    // Rank 2 leaves after 3 operations (its connections close, as when its process dies)
    // while the others are already in the 4th, asleep on their rings' futexes: each wakes
    // at its next slice, sees the loss and fails with PeerLost{2}, not at the 30 s deadline.
    let res = blocking_group(blocking_limits(), |rt, mut c| {
        let mut buf = vec![1.0f32; 1 << 18];
        for _ in 0..3 {
            rt.block_on(c.allreduce(&mut buf, ReduceOp::Max)).unwrap();
        }
        if c.rank() == 2 {
            drop(c);
            return None;
        }
        let started = std::time::Instant::now();
        let e = rt
            .block_on(c.allreduce(&mut buf, ReduceOp::Max))
            .unwrap_err();
        let (rank, took) = (c.rank(), started.elapsed());
        // The relay of the failure to the peers runs on this runtime: let it finish, as a
        // process keeps its ring until it closes it, or the peers see this rank vanish.
        rt.block_on(c.shutdown());
        Some((rank, e, took))
    });
    for (rank, err, took) in res.into_iter().flatten() {
        assert_eq!(err, CollectiveError::PeerLost { rank: 2 }, "rank {rank}");
        assert!(took < Duration::from_secs(1), "rank {rank} took {took:?}");
    }
}
