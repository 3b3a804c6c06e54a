//! The [`Watchdog`] of a GPU communicator: it keeps the TCP group that bootstrapped NCCL,
//! sends a heartbeat over it (a barrier) every `heartbeat_interval_ms`, and when a
//! heartbeat fails, aborts the GPU communicator with the heartbeat's error.
//!
//! Why a heartbeat over TCP: an NCCL kernel waiting for a dead peer spins on the GPU and
//! never returns, and NCCL does not say which rank is gone. The TCP group does: a killed
//! peer closes its sockets at once, a dead host is noticed by keepalive (`peer_silence_ms`),
//! a stalled one by the barrier's deadline (`op_timeout_ms`), and every failure is relayed
//! to all ranks. So the GPU path reports exactly what the TCP backend reports, and the
//! trainer's elastic path handles both alike.
//!
//! It starts while NCCL sets the communicator up (in non-blocking mode, which the GPU side
//! polls), so a peer that dies while the ranks connect aborts the set-up as it would abort
//! an operation.
//!
//! The decision is [`on_heartbeat`] (plain); [`Watchdog::spawn`] drives it on the tokio
//! runtime. The heartbeat runs whatever the GPU thread does, so a peer that is merely busy
//! in a long GPU operation is not mistaken for a dead one.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::abort::{AbortCell, Abortable};
use crate::communicator::Communicator;
use crate::error::CollectiveError;

/// Whether a heartbeat's outcome ends the generation, and with which cause.
///
/// Any failure does, with the heartbeat's own error unchanged: that is the error the TCP
/// backend returns for this generation. `PeerLost { rank }` when a peer died (seen directly
/// or relayed by another rank), `PeerAborted { rank, .. }` when a peer aborted (its NCCL
/// failed, or its user aborted), `Timeout` when a peer stopped answering heartbeats,
/// `Aborted` when this rank aborted.
pub(crate) fn on_heartbeat(r: Result<(), CollectiveError>) -> Option<CollectiveError> {
    r.err()
}

/// The rank a cause names as lost, when it names one.
pub(crate) fn lost_rank(cause: &CollectiveError) -> Option<usize> {
    match cause {
        CollectiveError::PeerLost { rank } => Some(*rank),
        _ => None,
    }
}

/// Watches one rank's TCP group on behalf of its GPU communicator; dropping it stops the
/// heartbeats and closes the group (the peers then see this rank as lost).
#[derive(Debug)]
pub(crate) struct Watchdog {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the heartbeats of `group` on the current tokio runtime; a failed heartbeat
    /// aborts `cell` (and, through the group, tells every peer).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn<C: Abortable>(
        group: Communicator,
        cell: Arc<AbortCell<C>>,
        heartbeat_interval_ms: u64,
    ) -> Self {
        let (stop, stopped) = oneshot::channel();
        let interval = Duration::from_millis(heartbeat_interval_ms);
        let task = tokio::spawn(run(group, cell, interval, stopped));
        Watchdog {
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the heartbeats and waits until the group is closed.
    #[cfg(test)]
    pub async fn stop(mut self) {
        self.stop.take();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Dropping the sender wakes the task, which closes the group itself.
        self.stop.take();
        self.task.take();
    }
}

async fn run<C: Abortable>(
    mut group: Communicator,
    cell: Arc<AbortCell<C>>,
    interval: Duration,
    mut stopped: oneshot::Receiver<()>,
) {
    let aborted = group.abort_handle();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            _ = tokio::time::sleep(interval) => {}
            // The GPU side aborted the group: beat now, so the peers learn it at once.
            _ = aborted.wait() => {}
        }
        let r = tokio::select! {
            _ = &mut stopped => break,
            r = group.barrier() => r,
        };
        if let Some(cause) = on_heartbeat(r) {
            warn!(
                rank = group.rank(),
                generation = group.generation(),
                lost = ?lost_rank(&cause),
                error = %cause,
                "heartbeat failed, aborting the gpu communicator"
            );
            // ncclCommAbort may take a while (it joins NCCL's proxy threads).
            let cell = cell.clone();
            let _ = tokio::task::spawn_blocking(move || cell.abort(cause)).await;
            break;
        }
    }
    group.shutdown().await;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use super::*;
    use crate::abort::tests::FakeComm;
    use crate::error::AbortReason;
    use crate::wait::{wait_for, StreamState, Waiter};
    use crate::{Limits, NcclConfig};

    /// Test deadline for anything the watchdog should do within a few heartbeats.
    const DEADLINE_MS: u64 = 5_000;

    struct Rank {
        cell: Arc<AbortCell<FakeComm>>,
        fake: FakeComm,
        dog: Watchdog,
    }

    /// `world` in-memory ranks; the ranks in `watched` get a watchdog over a fake GPU
    /// communicator, the others' TCP communicators are returned.
    fn group(world: usize, watched: &[usize]) -> (Vec<Option<Rank>>, Vec<Option<Communicator>>) {
        let hb = NcclConfig::for_test().heartbeat_interval_ms;
        let mut ranks = Vec::new();
        let mut rest = Vec::new();
        for c in Communicator::in_memory(world, Limits::for_test()).unwrap() {
            if watched.contains(&c.rank()) {
                let fake = FakeComm::default();
                let cell = Arc::new(AbortCell::new(fake.clone(), c.abort_handle()));
                let dog = Watchdog::spawn(c, cell.clone(), hb);
                ranks.push(Some(Rank { cell, fake, dog }));
                rest.push(None);
            } else {
                ranks.push(None);
                rest.push(Some(c));
            }
        }
        (ranks, rest)
    }

    async fn cause_within(cell: &AbortCell<FakeComm>, ms: u64) -> Option<CollectiveError> {
        let deadline = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < deadline {
            if let Some(e) = cell.cause() {
                return Some(e);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        None
    }

    #[test]
    fn any_failed_heartbeat_aborts_with_its_own_error() {
        assert_eq!(on_heartbeat(Ok(())), None);
        for e in [
            CollectiveError::PeerLost { rank: 2 },
            CollectiveError::PeerAborted {
                rank: 1,
                reason: AbortReason::Aborted,
            },
            CollectiveError::Aborted,
        ] {
            assert_eq!(on_heartbeat(Err(e.clone())), Some(e));
        }
        assert_eq!(lost_rank(&CollectiveError::PeerLost { rank: 2 }), Some(2));
        assert_eq!(lost_rank(&CollectiveError::Aborted), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_healthy_group_keeps_beating() {
        let (ranks, _) = group(3, &[0, 1, 2]);
        tokio::time::sleep(Duration::from_millis(
            20 * NcclConfig::for_test().heartbeat_interval_ms,
        ))
        .await;
        for r in ranks.iter().flatten() {
            assert_eq!(r.cell.cause(), None);
            assert_eq!(r.fake.aborts.load(Ordering::SeqCst), 0);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_peer_aborts_every_survivor_naming_it() {
        let (ranks, mut rest) = group(4, &[0, 1, 2]);
        // Rank 0's GPU thread waits on work that can never finish (its peer is gone).
        let cell0 = ranks[0].as_ref().unwrap().cell.clone();
        let waiting = tokio::task::spawn_blocking(move || {
            wait_for(&cell0, Waiter::new(60_000), || StreamState::Pending)
        });
        // Let a few heartbeats pass, then rank 3 dies.
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(rest[3].take());
        for r in ranks.iter().flatten() {
            let cause = cause_within(&r.cell, DEADLINE_MS).await;
            assert_eq!(cause, Some(CollectiveError::PeerLost { rank: 3 }));
            assert_eq!(r.fake.aborts.load(Ordering::SeqCst), 1);
        }
        assert_eq!(
            waiting.await.unwrap(),
            Err(CollectiveError::PeerLost { rank: 3 })
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_local_nccl_fault_reaches_the_peers() {
        let (ranks, _) = group(3, &[0, 1, 2]);
        let cell1 = ranks[1].as_ref().unwrap().cell.clone();
        let grace = NcclConfig::for_test().fault_grace_ms;
        let r = tokio::task::spawn_blocking(move || {
            wait_for(&cell1, Waiter::new(grace), || {
                StreamState::Failed("ncclSystemError".into())
            })
        })
        .await
        .unwrap();
        assert_eq!(r, Err(CollectiveError::Nccl("ncclSystemError".into())));
        for rank in [0, 2] {
            let cause = cause_within(&ranks[rank].as_ref().unwrap().cell, DEADLINE_MS).await;
            assert_eq!(
                cause,
                Some(CollectiveError::PeerAborted {
                    rank: 1,
                    reason: AbortReason::Aborted
                }),
                "rank {rank}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_set_up_past_its_deadline_fails_this_rank_and_its_peers() {
        let (ranks, _) = group(3, &[0, 1, 2]);
        // Rank 2's set-up never completes (a peer that never joins NCCL looks like this).
        let cell2 = ranks[2].as_ref().unwrap().cell.clone();
        let deadline = CollectiveError::Nccl("set-up not done after 30 ms".into());
        let expired = deadline.clone();
        let r = tokio::task::spawn_blocking(move || {
            let w = Waiter::new(60_000).with_deadline(30, expired);
            wait_for(&cell2, w, || StreamState::Pending)
        })
        .await
        .unwrap();
        assert_eq!(r, Err(deadline));
        for rank in [0, 1] {
            let r = ranks[rank].as_ref().unwrap();
            let cause = cause_within(&r.cell, DEADLINE_MS).await;
            assert_eq!(
                cause,
                Some(CollectiveError::PeerAborted {
                    rank: 2,
                    reason: AbortReason::Aborted
                }),
                "rank {rank}"
            );
            assert_eq!(r.fake.aborts.load(Ordering::SeqCst), 1);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stopping_a_watchdog_is_a_lost_peer_for_the_others_only() {
        let (mut ranks, _) = group(2, &[0, 1]);
        let r0 = ranks[0].take().unwrap();
        r0.dog.stop().await;
        assert_eq!(r0.cell.cause(), None);
        assert_eq!(r0.fake.aborts.load(Ordering::SeqCst), 0);
        let r1 = ranks[1].as_ref().unwrap();
        let cause = cause_within(&r1.cell, DEADLINE_MS).await;
        assert_eq!(cause, Some(CollectiveError::PeerLost { rank: 0 }));
    }
}
