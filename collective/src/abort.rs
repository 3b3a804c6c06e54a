//! The [`AbortCell`]: the one place that holds a GPU communicator, shared by the thread
//! that drives it and the watchdog that may abort it.
//!
//! Plain code (a mutex, a once-cell): the NCCL communicator is one implementation of
//! [`Abortable`], the tests use a double that records what happened to it.

use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::communicator::AbortHandle;
use crate::error::CollectiveError;

/// A communicator that can be torn down from any thread, ending whatever it has in flight
/// (`ncclCommAbort`), or destroyed once its work is done (`ncclCommDestroy` after
/// `ncclCommFinalize`: the normal end).
pub(crate) trait Abortable: Send + 'static {
    /// Ends the communicator: pending operations return, its resources are freed.
    fn abort(self);

    /// Ends a communicator whose work is done and finalized; must not wait for a peer.
    /// Without a destructor of its own, the abort.
    fn destroy(self)
    where
        Self: Sized,
    {
        self.abort();
    }
}

/// Holds a communicator until it is aborted or closed.
///
/// Invariants:
/// - the communicator is used only inside [`AbortCell::with`], under the mutex, so an abort
///   never frees it while a call is using it;
/// - `with` runs only short calls that never wait for a peer (NCCL's non-blocking mode: an
///   enqueue returns at once, its progress is polled in separate calls), so an abort waits
///   for the mutex a few microseconds at most, never behind a collective;
/// - the first cause wins: once [`AbortCell::abort`] has recorded one, every later call of
///   `with` returns it, and so does every operation of the owner;
/// - [`Abortable::abort`] runs exactly once (abort, close or drop), under the mutex: who
///   holds the lock after the cause is set sees the communicator gone.
pub(crate) struct AbortCell<C: Abortable> {
    comm: Mutex<Option<C>>,
    cause: OnceLock<CollectiveError>,
    /// The TCP group the communicator was bootstrapped on: aborting it tells the peers.
    group: AbortHandle,
}

impl<C: Abortable> AbortCell<C> {
    /// Holds `comm`, bootstrapped on the group that `group` aborts.
    pub fn new(comm: C, group: AbortHandle) -> Self {
        AbortCell {
            comm: Mutex::new(Some(comm)),
            cause: OnceLock::new(),
            group,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<C>> {
        // A panic inside `with` leaves the communicator in an unknown state; aborting it is
        // still right, so a poisoned lock is used as is.
        self.comm.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the communicator, or returns the cause of its abort.
    pub fn with<R>(
        &self,
        f: impl FnOnce(&C) -> Result<R, CollectiveError>,
    ) -> Result<R, CollectiveError> {
        let guard = self.lock();
        if let Some(e) = self.cause() {
            return Err(e);
        }
        match guard.as_ref() {
            Some(c) => f(c),
            None => Err(CollectiveError::Invalid("communicator closed".into())),
        }
    }

    /// Why the communicator was aborted, once an abort has begun.
    pub fn cause(&self) -> Option<CollectiveError> {
        self.cause.get().cloned()
    }

    /// Records `cause` (unless one is already recorded) and aborts the communicator, waiting
    /// for a call in progress in [`AbortCell::with`] to return first. Returns whether this
    /// call recorded its cause. Idempotent.
    pub fn abort(&self, cause: CollectiveError) -> bool {
        let first = self.cause.set(cause).is_ok();
        // Under the lock: `with` and `settle` wait until the communicator is gone.
        let mut guard = self.lock();
        if let Some(c) = guard.take() {
            c.abort();
        }
        first
    }

    /// [`AbortCell::abort`], and abort the TCP group too, so that every peer's watchdog
    /// aborts its own communicator (they see `PeerAborted` naming this rank).
    pub fn abort_group(&self, cause: CollectiveError) -> bool {
        let first = self.abort(cause);
        self.group.abort();
        first
    }

    /// Finishes an abort that has begun: once it returns, the communicator is freed. (The
    /// thread that recorded the cause may not hold the lock yet; then this one aborts the
    /// communicator itself: whoever takes it first does.) Does nothing without a cause.
    pub fn settle(&self) {
        if self.cause().is_some() {
            let mut guard = self.lock();
            if let Some(c) = guard.take() {
                c.abort();
            }
        }
    }

    /// Destroys the communicator whose work the caller has waited for and finalized (the
    /// normal end); once aborted, it is already gone and this does nothing.
    pub fn destroy(&self) {
        let mut guard = self.lock();
        if let Some(c) = guard.take() {
            c.destroy();
        }
    }

    /// Ends the communicator without recording a cause, aborting what it has in flight (an
    /// end without [`AbortCell::destroy`]: a drop, a generation left).
    pub fn close(&self) {
        let mut guard = self.lock();
        if let Some(c) = guard.take() {
            c.abort();
        }
    }
}

impl<C: Abortable> Drop for AbortCell<C> {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    use super::*;
    use crate::{Communicator, Limits};

    /// A communicator double: counts its aborts, and can hold `with` for a while.
    #[derive(Debug, Default, Clone)]
    pub(crate) struct FakeComm {
        pub aborts: Arc<AtomicUsize>,
    }

    impl Abortable for FakeComm {
        fn abort(self) {
            self.aborts.fetch_add(1, Ordering::SeqCst);
        }
    }

    pub(crate) fn group_handle() -> AbortHandle {
        let comms = Communicator::in_memory(1, Limits::for_test()).unwrap();
        comms[0].abort_handle()
    }

    #[test]
    fn first_cause_wins_and_abort_runs_once() {
        let fake = FakeComm::default();
        let cell = AbortCell::new(fake.clone(), group_handle());
        assert_eq!(cell.with(|_| Ok(7)), Ok(7));
        assert!(cell.abort(CollectiveError::PeerLost { rank: 2 }));
        assert!(!cell.abort(CollectiveError::Aborted));
        assert_eq!(cell.cause(), Some(CollectiveError::PeerLost { rank: 2 }));
        assert_eq!(
            cell.with(|_| Ok(())),
            Err(CollectiveError::PeerLost { rank: 2 })
        );
        cell.close();
        drop(cell);
        assert_eq!(fake.aborts.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn close_and_drop_end_the_communicator_without_a_cause() {
        let fake = FakeComm::default();
        let cell = AbortCell::new(fake.clone(), group_handle());
        cell.close();
        assert_eq!(cell.cause(), None);
        assert!(cell.with(|_| Ok(())).is_err());
        drop(cell);
        assert_eq!(fake.aborts.load(Ordering::SeqCst), 1);
        let fake = FakeComm::default();
        drop(AbortCell::new(fake.clone(), group_handle()));
        assert_eq!(fake.aborts.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn abort_waits_for_a_call_in_progress() {
        let fake = FakeComm::default();
        let cell = Arc::new(AbortCell::new(fake.clone(), group_handle()));
        let inside = Arc::new(Barrier::new(2));
        let (c2, in2) = (cell.clone(), inside.clone());
        let user = std::thread::spawn(move || {
            c2.with(|c| {
                in2.wait();
                std::thread::sleep(std::time::Duration::from_millis(50));
                // Still ours: the abort has not freed it.
                Ok(c.aborts.load(Ordering::SeqCst))
            })
        });
        inside.wait();
        cell.abort(CollectiveError::PeerLost { rank: 1 });
        assert_eq!(user.join().unwrap(), Ok(0));
        assert_eq!(fake.aborts.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn settle_frees_the_communicator_once_a_cause_is_recorded() {
        let fake = FakeComm::default();
        let cell = AbortCell::new(fake.clone(), group_handle());
        cell.settle();
        assert_eq!(
            fake.aborts.load(Ordering::SeqCst),
            0,
            "no cause, nothing to settle"
        );
        // The aborting thread has recorded its cause but not yet taken the lock.
        cell.cause
            .set(CollectiveError::PeerLost { rank: 1 })
            .unwrap();
        cell.settle();
        assert_eq!(fake.aborts.load(Ordering::SeqCst), 1);
        cell.abort(CollectiveError::Aborted);
        assert_eq!(fake.aborts.load(Ordering::SeqCst), 1);
        assert_eq!(cell.cause(), Some(CollectiveError::PeerLost { rank: 1 }));
    }

    #[test]
    fn abort_group_tells_the_tcp_group() {
        let group = group_handle();
        let cell = AbortCell::new(FakeComm::default(), group.clone());
        cell.abort_group(CollectiveError::Nccl("remote error".into()));
        assert!(group.is_aborted());
    }
}
