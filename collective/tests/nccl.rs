//! The NCCL path. Without a GPU (or without the `cuda` feature): the bootstrap fails on
//! every rank with one clear error and nothing hangs. With `cuda` on a host with a GPU and
//! libnccl: real NCCL operations on a world of one, and a world of two on the one GPU,
//! which NCCL refuses during its set-up: both ranks must fail, not hang; elsewhere those
//! print "SKIPPED: …". (The set-up with a rank that never joins NCCL is tested in the
//! crate's own tests, `nccl::tests::set_up`: it needs the bootstrap's internals.)

use std::time::Duration;

use collective::{nccl_available, CollectiveError, Communicator, Limits, NcclConfig};

/// Longer than any bootstrap over in-memory links should take.
const BOOTSTRAP_DEADLINE_MS: u64 = 10_000;

/// Every rank of an in-memory world calls [`Communicator::nccl`] on device 0; a rank still
/// inside after `deadline_ms` fails the test.
async fn bootstrap_all(
    world: usize,
    deadline_ms: u64,
) -> Vec<Result<collective::NcclCommunicator, CollectiveError>> {
    let mut set = tokio::task::JoinSet::new();
    for c in Communicator::in_memory(world, Limits::for_test()).unwrap() {
        set.spawn(async move {
            let r = c.rank();
            (r, c.nccl(0, NcclConfig::for_test()).await)
        });
    }
    let deadline = Duration::from_millis(deadline_ms);
    let mut all = tokio::time::timeout(deadline, set.join_all())
        .await
        .expect("a rank hangs in the nccl bootstrap");
    all.sort_by_key(|(r, _)| *r);
    all.into_iter().map(|(_, o)| o).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ranks_without_nccl_both_fail_clearly_and_neither_hangs() {
    if nccl_available() {
        eprintln!("SKIPPED: this host has CUDA and NCCL (the test needs a host without them)");
        return;
    }
    let out = bootstrap_all(2, BOOTSTRAP_DEADLINE_MS).await;
    for (rank, r) in out.into_iter().enumerate() {
        let e = r.expect_err("no nccl here");
        if cfg!(feature = "cuda") {
            assert_eq!(
                e,
                CollectiveError::Nccl(
                    "cannot bootstrap: rank 0: libcuda or libnccl not found; \
                     rank 1: libcuda or libnccl not found"
                        .into()
                ),
                "rank {rank}"
            );
        } else {
            assert_eq!(e, CollectiveError::NotBuiltWithCuda, "rank {rank}");
        }
    }
}

#[tokio::test]
async fn a_world_of_one_is_a_typed_error_or_works() {
    let c = Communicator::in_memory(1, Limits::for_test())
        .unwrap()
        .pop()
        .unwrap();
    let r = c.nccl(0, NcclConfig::for_test()).await;
    if !cfg!(feature = "cuda") {
        assert_eq!(r.unwrap_err(), CollectiveError::NotBuiltWithCuda);
    } else if nccl_available() {
        let n = r.expect("nccl with a GPU and libnccl");
        assert_eq!((n.rank(), n.world()), (0, 1));
    } else {
        eprintln!("SKIPPED: no CUDA driver/NCCL (libcuda or libnccl.so not found)");
        assert!(matches!(r, Err(CollectiveError::Nccl(_))), "{r:?}");
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    //! Real NCCL on the device: a world of one.

    use super::*;
    use collective::{NcclCommunicator, ReduceOp};
    use cudarc::driver::CudaSlice;

    async fn world_of_one() -> Option<NcclCommunicator> {
        if !nccl_available() {
            eprintln!("SKIPPED: no CUDA driver/NCCL (libcuda or libnccl.so not found)");
            return None;
        }
        let c = Communicator::in_memory(1, Limits::for_test())
            .unwrap()
            .pop()
            .unwrap();
        Some(c.nccl(0, NcclConfig::for_test()).await.expect("nccl init"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn allreduce_broadcast_allgather_on_the_device() {
        let Some(n) = world_of_one().await else {
            return;
        };
        tokio::task::spawn_blocking(move || {
            let s = n.stream();
            let host: Vec<f32> = (0..1000).map(|i| i as f32).collect();
            let mut buf = s.clone_htod(&host).unwrap();
            n.allreduce(&mut buf, ReduceOp::Sum).unwrap();
            n.allreduce(&mut buf, ReduceOp::Avg).unwrap();
            assert_eq!(s.clone_dtoh(&buf).unwrap(), host);
            let mut out = s.alloc_zeros::<f32>(1000).unwrap();
            n.allreduce_into(&buf, &mut out, ReduceOp::Max).unwrap();
            assert_eq!(s.clone_dtoh(&out).unwrap(), host);
            n.broadcast(&mut buf, 0).unwrap();
            assert_eq!(s.clone_dtoh(&buf).unwrap(), host);
            assert!(matches!(
                n.broadcast(&mut buf, 1),
                Err(CollectiveError::Invalid(_))
            ));
            n.allgather(&mut buf).unwrap();
            assert_eq!(s.clone_dtoh(&buf).unwrap(), host);
            n.allgather_into(&buf, &mut out).unwrap();
            assert_eq!(s.clone_dtoh(&out).unwrap(), host);
            assert_eq!(n.error(), None);
        })
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_an_abort_every_operation_returns_its_cause() {
        let Some(n) = world_of_one().await else {
            return;
        };
        tokio::task::spawn_blocking(move || {
            let s = n.stream();
            let mut buf = s.alloc_zeros::<f32>(16).unwrap();
            n.allreduce(&mut buf, ReduceOp::Sum).unwrap();
            n.abort();
            assert_eq!(n.error(), Some(CollectiveError::Aborted));
            assert_eq!(
                n.allreduce(&mut buf, ReduceOp::Sum),
                Err(CollectiveError::Aborted)
            );
            assert_eq!(n.allgather(&mut buf), Err(CollectiveError::Aborted));
            assert_eq!(
                n.allreduce_queued(&mut [&mut buf], ReduceOp::Sum),
                Err(CollectiveError::Aborted)
            );
            assert_eq!(n.wait_queued(), Err(CollectiveError::Aborted));
        })
        .await
        .unwrap();
    }

    /// `len` values of buffer `k`, distinct across buffers.
    fn values(k: usize, len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (1000 * k + i % 1000) as f32 * 0.5)
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_group_allreduces_of_several_buffers_on_the_device() {
        let Some(n) = world_of_one().await else {
            return;
        };
        tokio::task::spawn_blocking(move || {
            // Written and read on another stream of the context, as the trainer's gradients.
            let other = n.stream().context().new_stream().unwrap();
            let lens = [1, 7, 1000, 4097, 1 << 20];
            let hosts: Vec<Vec<f32>> = lens
                .iter()
                .enumerate()
                .map(|(k, &l)| values(k, l))
                .collect();
            let mut bufs: Vec<CudaSlice<f32>> =
                hosts.iter().map(|h| other.clone_htod(h).unwrap()).collect();
            // Two buckets, queued one after the other, then one wait.
            let (first, rest) = bufs.split_at_mut(2);
            let mut first: Vec<&mut CudaSlice<f32>> = first.iter_mut().collect();
            let mut rest: Vec<&mut CudaSlice<f32>> = rest.iter_mut().collect();
            n.allreduce_queued(&mut first, ReduceOp::Sum).unwrap();
            n.allreduce_queued(&mut rest, ReduceOp::Avg).unwrap();
            n.wait_queued().unwrap();
            // A world of one: the sum and the mean of one contribution are that contribution.
            for (k, (b, h)) in bufs.iter().zip(&hosts).enumerate() {
                assert_eq!(other.clone_dtoh(b).unwrap(), *h, "buffer {k}");
            }
            let wide: Vec<f64> = (0..333).map(|i| i as f64 / 3.0).collect();
            let mut w = n.stream().clone_htod(&wide).unwrap();
            n.allreduce_queued(&mut [&mut w], ReduceOp::Max).unwrap();
            n.wait_queued().unwrap();
            assert_eq!(n.stream().clone_dtoh(&w).unwrap(), wide);
            // An empty group queues nothing; a wait with nothing queued returns.
            n.allreduce_queued::<f32>(&mut [], ReduceOp::Sum).unwrap();
            n.wait_queued().unwrap();
            assert_eq!(n.error(), None);
        })
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_with_work_queued_ends_it_and_the_buffers_stay_usable() {
        let Some(n) = world_of_one().await else {
            return;
        };
        tokio::task::spawn_blocking(move || {
            let s = n.stream();
            let host = values(3, 1 << 24);
            let mut buf = s.clone_htod(&host).unwrap();
            n.allreduce_queued(&mut [&mut buf], ReduceOp::Sum).unwrap();
            drop(n);
            // In place over one rank, any part of the work leaves the values as they were.
            assert_eq!(s.clone_dtoh(&buf).unwrap(), host);
        })
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_ranks_on_one_gpu_both_fail_and_neither_hangs() {
        if !nccl_available() {
            eprintln!("SKIPPED: no CUDA driver/NCCL (libcuda or libnccl.so not found)");
            return;
        }
        // NCCL refuses a second rank on a GPU during its set-up ("duplicate GPU"): each rank
        // fails with that error, or with the other's abort that the first to fail sends.
        let deadline = NcclConfig::for_test().init_timeout_ms + BOOTSTRAP_DEADLINE_MS;
        let out = bootstrap_all(2, deadline).await;
        let refused = CollectiveError::Nccl("ncclInvalidUsage".into());
        for (rank, r) in out.iter().enumerate() {
            let e = r.as_ref().expect_err("two ranks on one gpu");
            let from_peer = matches!(
                e,
                CollectiveError::PeerAborted { rank: p, .. } | CollectiveError::PeerLost { rank: p }
                    if *p == 1 - rank
            );
            assert!(*e == refused || from_peer, "rank {rank}: {e}");
        }
        assert!(
            out.iter().any(|r| r.as_ref().err() == Some(&refused)),
            "{out:?}"
        );
    }
}
