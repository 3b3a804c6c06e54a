//! [`NcclDouble`]: the CPU twin of [`crate::NcclCommunicator`], with NCCL's failure
//! semantics, so that the code above a device group (the trainer's elastic path) is tested
//! against what NCCL does on a GPU, not against what the TCP ring does.
//!
//! NCCL differs from the TCP ring in four ways that break code written for the ring, and
//! the double has all four:
//! - **work completes on enqueue**: [`NcclDouble::allreduce_queued`] returns once the work
//!   is on the "stream" (a thread of the double's own, running the operations in order
//!   over an in-process or TCP [`Communicator`], the double's "NCCL transport"); a
//!   failure surfaces only at a later [`NcclDouble::wait_queued`];
//! - **a collective blocks, never raises, when a peer is gone**: when the transport fails,
//!   the stream stops there, as an NCCL kernel spins on a dead peer, and every wait on it
//!   blocks until the communicator is aborted;
//! - **abort from another thread**: [`NcclDouble::abort`] (or the watchdog, when its
//!   heartbeats over the TCP group fail) ends a blocked wait, which returns the cause;
//! - **destroy waits on in-flight work unless aborted**: [`NcclDouble::finish`], the normal
//!   end, waits for the queued work and a barrier (one-element allreduce) before it ends the
//!   stream, so over a lost peer it blocks until an abort; dropping the double aborts it.
//!
//! The failure machinery is the NCCL communicator's own: the [`AbortCell`], the polling
//! [`wait_for`] and the heartbeat [`Watchdog`]; only the stream is a double. Buffers are
//! [`DeviceBuf`]s, host memory that the stream writes behind the caller's back, as NCCL
//! writes device memory.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::runtime::Handle;

use crate::abort::{AbortCell, Abortable};
use crate::communicator::{AbortHandle, Communicator};
use crate::config::NcclConfig;
use crate::error::{CollectiveError, ReduceOp};
use crate::wait::{wait_for, StreamState, Waiter};
use crate::watchdog::Watchdog;

/// "Device memory" of the double: the stream writes it when the queued work runs.
pub type DeviceBuf = Arc<Mutex<Vec<f32>>>;

/// How often a stream stopped on a failed transport looks for its abort, ms.
const STUCK_POLL_MS: u64 = 1;

/// One queued operation.
enum Work {
    Allreduce(Vec<DeviceBuf>, ReduceOp),
}

/// What the caller and the stream thread share.
#[derive(Debug, Default)]
struct Progress {
    queued: AtomicU64,
    done: AtomicU64,
    aborted: AtomicBool,
}

/// The stream: a thread that runs the queued work in order. Only the [`AbortCell`] holds it.
struct Stream {
    progress: Arc<Progress>,
    work: std_mpsc::Sender<Work>,
    thread: JoinHandle<()>,
    /// Ends a transport operation in progress (an abort ends NCCL's kernels early).
    transport: AbortHandle,
}

impl Abortable for Stream {
    fn abort(self) {
        self.progress.aborted.store(true, Ordering::SeqCst);
        self.transport.abort();
        drop(self.work);
        let _ = self.thread.join();
    }

    /// The end after the queued work is done (`ncclCommDestroy` after a finalize): the
    /// thread runs out of work and ends.
    fn destroy(self) {
        drop(self.work);
        let _ = self.thread.join();
    }
}

impl Stream {
    fn start(mut transport: Communicator, rt: Handle) -> Stream {
        let progress = Arc::new(Progress::default());
        let (work, queue) = std_mpsc::channel::<Work>();
        let abort = transport.abort_handle();
        let p = progress.clone();
        let thread = std::thread::spawn(move || {
            for w in queue {
                if p.aborted.load(Ordering::SeqCst) {
                    break;
                }
                let ok = match w {
                    Work::Allreduce(bufs, op) => bufs.iter().all(|b| {
                        let mut b = b.lock().unwrap_or_else(|e| e.into_inner());
                        rt.block_on(transport.allreduce(&mut b[..], op)).is_ok()
                    }),
                };
                if !ok {
                    // A kernel waiting for a dead peer: no error, no progress, until aborted.
                    while !p.aborted.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(STUCK_POLL_MS));
                    }
                    break;
                }
                p.done.fetch_add(1, Ordering::SeqCst);
            }
        });
        Stream {
            progress,
            work,
            thread,
            transport: abort,
        }
    }
}

/// The state of the stream: done when every queued operation has run.
fn stream_state(p: &Progress) -> StreamState {
    if p.done.load(Ordering::SeqCst) == p.queued.load(Ordering::SeqCst) {
        StreamState::Done
    } else {
        StreamState::Pending
    }
}

/// A device group with NCCL's semantics on the CPU (see the module docs).
///
/// Like [`crate::NcclCommunicator`], its waits block the calling thread while its watchdog
/// runs on the tokio runtime that created it: call them from a thread of a multi-threaded
/// runtime (inside `block_in_place`) or a thread of their own.
pub struct NcclDouble {
    rank: usize,
    world: usize,
    cell: Arc<AbortCell<Stream>>,
    progress: Arc<Progress>,
    cfg: NcclConfig,
    _watchdog: Option<Watchdog>,
}

impl std::fmt::Debug for NcclDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclDouble")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("cause", &self.cell.cause())
            .finish()
    }
}

impl NcclDouble {
    /// The double of this rank: operations run over `transport`; `heartbeat`, when given,
    /// is the TCP group its watchdog beats over (as the NCCL communicator keeps the group it
    /// was bootstrapped on), without it nothing but [`NcclDouble::abort`] ends a blocked
    /// wait. Both groups have the same rank and world.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(
        transport: Communicator,
        heartbeat: Option<Communicator>,
        cfg: NcclConfig,
    ) -> Result<NcclDouble, CollectiveError> {
        cfg.validate()?;
        let (rank, world) = (transport.rank(), transport.world());
        if let Some(h) = &heartbeat {
            if (h.rank(), h.world()) != (rank, world) {
                return Err(CollectiveError::Invalid(format!(
                    "heartbeat group rank {} of {} for a transport rank {rank} of {world}",
                    h.rank(),
                    h.world()
                )));
            }
        }
        let group = match &heartbeat {
            Some(h) => h.abort_handle(),
            None => transport.abort_handle(),
        };
        let stream = Stream::start(transport, Handle::current());
        let progress = stream.progress.clone();
        let cell = Arc::new(AbortCell::new(stream, group));
        let watchdog =
            heartbeat.map(|h| Watchdog::spawn(h, cell.clone(), cfg.heartbeat_interval_ms));
        Ok(NcclDouble {
            rank,
            world,
            cell,
            progress,
            cfg,
            _watchdog: watchdog,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The error that aborted this double, if any.
    pub fn error(&self) -> Option<CollectiveError> {
        self.cell.cause()
    }

    /// Aborts the generation from any thread: a blocked wait returns
    /// [`CollectiveError::Aborted`], and the peers' watchdogs abort theirs.
    pub fn abort(&self) {
        self.cell.abort_group(CollectiveError::Aborted);
    }

    /// Queues an in-place `op` allreduce of every buffer and returns at once: a lost peer
    /// does not fail it (the wait blocks instead). Fails, without queuing, with the cause of
    /// an abort.
    pub fn allreduce_queued(
        &self,
        bufs: &[DeviceBuf],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        self.cell.with(|s| {
            s.progress.queued.fetch_add(1, Ordering::SeqCst);
            s.work
                .send(Work::Allreduce(bufs.to_vec(), op))
                .map_err(|_| CollectiveError::Invalid("stream ended".into()))
        })
    }

    /// Waits until everything queued is done, polling, as the NCCL communicator waits for
    /// its stream: only an abort (this rank's, or its watchdog's) ends a wait on a lost
    /// peer, with the abort's cause.
    pub fn wait_queued(&self) -> Result<(), CollectiveError> {
        let waiter = Waiter::new(self.cfg.fault_grace_ms);
        wait_for(&self.cell, waiter, || stream_state(&self.progress))
    }

    /// The normal end, as NCCL's: a barrier (a one-element allreduce), the wait for all
    /// queued work (`ncclCommFinalize`), then the end of the stream (`ncclCommDestroy`).
    /// Blocks while a peer is gone, until an abort, whose cause it returns; the double is
    /// then aborted, not destroyed.
    pub fn finish(self) -> Result<(), CollectiveError> {
        let barrier: DeviceBuf = Arc::new(Mutex::new(vec![0.0]));
        self.allreduce_queued(&[barrier], ReduceOp::Sum)?;
        self.wait_queued()?;
        self.cell.destroy();
        Ok(())
    }
}

impl Drop for NcclDouble {
    fn drop(&mut self) {
        // Not finished: work still queued is aborted (a wait could block for ever on a peer
        // that never queues its side), as the NCCL communicator's drop does. After
        // `finish` the stream is gone and this does nothing.
        self.cell.close();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::Limits;

    /// Longer than any outcome these tests wait for.
    const TEST_DEADLINE: Duration = Duration::from_secs(30);

    fn bufs(v: f32) -> DeviceBuf {
        Arc::new(Mutex::new(vec![v; 4]))
    }

    /// `world` doubles of one process, with heartbeats when `watched`.
    fn doubles(world: usize, watched: bool) -> Vec<NcclDouble> {
        let transport = Communicator::in_memory(world, Limits::for_test()).unwrap();
        let mut beats: Vec<Option<Communicator>> = if watched {
            Communicator::in_memory(world, Limits::for_test())
                .unwrap()
                .into_iter()
                .map(Some)
                .collect()
        } else {
            (0..world).map(|_| None).collect()
        };
        transport
            .into_iter()
            .zip(beats.iter_mut())
            .map(|(t, h)| NcclDouble::start(t, h.take(), NcclConfig::for_test()).unwrap())
            .collect()
    }

    /// Runs `f` on a thread of its own, and waits for it with the tests' deadline.
    fn within<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
        let (tx, rx) = std_mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(TEST_DEADLINE)
            .expect("blocked past the deadline")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_work_runs_in_order_and_sums_on_every_rank() {
        let ds = doubles(3, true);
        let handles: Vec<_> = ds
            .into_iter()
            .map(|d| {
                std::thread::spawn(move || {
                    let a = bufs(d.rank() as f32);
                    let b = bufs(1.0);
                    d.allreduce_queued(std::slice::from_ref(&a), ReduceOp::Sum)
                        .unwrap();
                    d.allreduce_queued(&[a.clone(), b.clone()], ReduceOp::Sum)
                        .unwrap();
                    d.wait_queued().unwrap();
                    let out = (a.lock().unwrap()[0], b.lock().unwrap()[0]);
                    d.finish().unwrap();
                    out
                })
            })
            .collect();
        for h in handles {
            // (0 + 1 + 2) summed, then summed again over 3 ranks; 1 summed over 3.
            assert_eq!(h.join().unwrap(), (9.0, 3.0));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn enqueue_succeeds_and_the_wait_blocks_when_a_peer_is_gone_until_aborted() {
        let mut ds = doubles(2, false);
        drop(ds.pop());
        let d = Arc::new(ds.pop().unwrap());
        // Completes on enqueue: the lost peer is not seen here.
        d.allreduce_queued(&[bufs(1.0)], ReduceOp::Sum).unwrap();
        let (started_tx, started) = std_mpsc::channel();
        let d2 = d.clone();
        let waiter = std::thread::spawn(move || {
            started_tx.send(()).unwrap();
            d2.wait_queued()
        });
        started.recv().unwrap();
        // Blocked, not failed: still waiting after the transport has long seen the loss.
        let still = Instant::now() + Duration::from_millis(200);
        while Instant::now() < still {
            assert!(!waiter.is_finished(), "the wait raised instead of blocking");
            std::thread::sleep(Duration::from_millis(10));
        }
        d.abort();
        let r = within(move || waiter.join().unwrap());
        assert_eq!(r, Err(CollectiveError::Aborted));
        assert_eq!(d.error(), Some(CollectiveError::Aborted));
        // Every later operation fails with the cause.
        assert_eq!(
            d.allreduce_queued(&[bufs(1.0)], ReduceOp::Sum),
            Err(CollectiveError::Aborted)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_watchdog_ends_a_blocked_wait_naming_the_lost_rank() {
        let mut ds = doubles(3, true);
        let lost = ds.pop().unwrap();
        let survivors: Vec<_> = ds
            .into_iter()
            .map(|d| {
                std::thread::spawn(move || {
                    d.allreduce_queued(&[bufs(1.0)], ReduceOp::Sum).unwrap();
                    d.wait_queued()
                })
            })
            .collect();
        drop(lost);
        for s in survivors {
            let r = within(move || s.join().unwrap());
            assert!(
                matches!(
                    r,
                    Err(CollectiveError::PeerLost { rank: 2 } | CollectiveError::PeerAborted { .. })
                ),
                "{r:?}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn finish_waits_on_in_flight_work_until_an_abort_from_another_thread() {
        let mut ds = doubles(2, false);
        let peer = ds.pop().unwrap();
        let d = ds.pop().unwrap();
        let progress = d.progress.clone();
        let cell = d.cell.clone();
        drop(peer);
        let finishing = std::thread::spawn(move || d.finish());
        let still = Instant::now() + Duration::from_millis(200);
        while Instant::now() < still {
            assert!(!finishing.is_finished(), "finish returned over a lost peer");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(stream_state(&progress) == StreamState::Pending);
        cell.abort_group(CollectiveError::PeerLost { rank: 1 });
        let r = within(move || finishing.join().unwrap());
        assert_eq!(r, Err(CollectiveError::PeerLost { rank: 1 }));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_an_unfinished_double_aborts_rather_than_waits() {
        let mut ds = doubles(2, false);
        let _peer_never_queues = ds.pop().unwrap();
        let d = ds.pop().unwrap();
        d.allreduce_queued(&[bufs(1.0)], ReduceOp::Sum).unwrap();
        within(move || drop(d));
    }
}
