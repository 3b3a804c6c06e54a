//! The NCCL path. Without a GPU (or without the `cuda` feature): the bootstrap fails on
//! every rank with one clear error and nothing hangs. With `cuda` on a host with a GPU and
//! libnccl: real NCCL operations on a world of one (one GPU cannot hold two NCCL ranks);
//! elsewhere those print "SKIPPED: …".

use std::time::Duration;

use collective::{nccl_available, CollectiveError, Communicator, Limits, NcclConfig};

/// Longer than any bootstrap over in-memory links should take.
const BOOTSTRAP_DEADLINE_MS: u64 = 10_000;

async fn bootstrap_all(world: usize) -> Vec<Result<collective::NcclCommunicator, CollectiveError>> {
    let mut set = tokio::task::JoinSet::new();
    for c in Communicator::in_memory(world, Limits::for_test()).unwrap() {
        set.spawn(async move {
            let r = c.rank();
            (r, c.nccl(0, NcclConfig::for_test()).await)
        });
    }
    let deadline = Duration::from_millis(BOOTSTRAP_DEADLINE_MS);
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
    let out = bootstrap_all(2).await;
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
        })
        .await
        .unwrap();
    }
}
