//! The simulation's openraft runtime: tasks on tokio's current-thread scheduler, time from
//! the virtual [`clock`], and randomness (openraft's election timeouts, drawn through
//! [`AsyncRuntime::thread_rng`]) from a generator the simulation seeds, so that two runs of
//! one seed draw the same timeouts at the same virtual times.
//!
//! openraft asks the runtime for a thread-local generator with no argument, so the seed
//! lives in a thread local: [`seed`] sets it on the thread that runs the simulation. Every
//! Raft runs on that thread ([`clock::run`]), so every draw happens there, in an order the
//! schedule fixes. Oneshot channels are tokio's.

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use openraft::async_runtime::TokioOneShotSender;
use openraft::{AsyncRuntime, OptionalSend};
use rand::{rngs::SmallRng, RngCore, SeedableRng};

use super::clock::{self, SimInstant};

thread_local! {
    /// This thread's openraft generator; [`seed`] resets it.
    static RNG: RefCell<SmallRng> = RefCell::new(SmallRng::seed_from_u64(0));
}

/// Seeds this thread's openraft generator: the draws that follow depend on `seed` alone.
pub(crate) fn seed(seed: u64) {
    RNG.with(|rng| *rng.borrow_mut() = SmallRng::seed_from_u64(seed));
}

/// A handle on this thread's seeded generator (openraft's `ThreadLocalRng`).
pub(crate) struct SeededRng;

impl RngCore for SeededRng {
    fn next_u32(&mut self) -> u32 {
        RNG.with(|rng| rng.borrow_mut().next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        RNG.with(|rng| rng.borrow_mut().next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        RNG.with(|rng| rng.borrow_mut().fill_bytes(dest))
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        RNG.with(|rng| rng.borrow_mut().try_fill_bytes(dest))
    }
}

/// tokio's tasks, the virtual [`clock`]'s time, [`SeededRng`]'s draws.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SimRuntime;

impl AsyncRuntime for SimRuntime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = clock::Sleep;
    type Instant = SimInstant;
    type TimeoutError = clock::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = clock::Timeout<T>;
    type ThreadLocalRng = SeededRng;
    type OneshotSender<T: OptionalSend> = TokioOneShotSender<T>;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        clock::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        clock::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        clock::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        clock::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        clock::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        SeededRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (TokioOneShotSender(tx), rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn a_seed_fixes_the_draws() {
        let draw = |s| {
            seed(s);
            (0..8)
                .map(|_| SimRuntime::thread_rng().gen_range(0..1_000u64))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }
}
