//! The simulation's virtual clock: time that moves only when every task waits.
//!
//! [`run`] drives a future on a current-thread tokio runtime with a clock task beside it.
//! Every task the simulation's Raft spawns ([`spawn`]) and the driven future itself count
//! their polls; the clock task yields, and when a whole turn of the scheduler went by with
//! no poll (every task waits on a timer or on another task), it moves [`now`] to the
//! earliest deadline and wakes the timers due then, in the order they were set. A run of a
//! few virtual seconds takes as long as its work, and two runs of the same program on the
//! same inputs see the same times in the same order.
//!
//! Why not tokio's own paused time (`start_paused`): it needs tokio's `test-util` feature,
//! and as a dev-dependency that feature would split tokio's features between `cargo test`
//! and `cargo build`, so every crate above tokio (libp2p, hyper, the node) would be built
//! twice in `scripts/test.sh`. openraft takes all its time from its runtime
//! ([`super::runtime::SimRuntime`]), so a clock of our own serves it whole.
//!
//! The clock is thread-local: everything runs on the thread that calls [`run`], and a
//! timer or an instant used on another thread is a bug.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::ops::{Add, AddAssign, Sub, SubAssign};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Where every run's clock starts: far enough from zero that openraft's `now - interval`
/// never goes below it.
const EPOCH: Duration = Duration::from_secs(1_000_000);

/// Most turns of the scheduler the clock waits for the tasks to go idle before it calls
/// the run stuck (a task that never waits).
const BUSY_TURNS_MAX: u64 = 10_000_000;

/// The clock's state on this thread.
struct Clock {
    now: Duration,
    /// Pending timers by (deadline, order set); each with its task's waker.
    timers: BTreeMap<(Duration, u64), Waker>,
    timers_set: u64,
    /// Polls of counted tasks so far.
    polls: u64,
}

thread_local! {
    static CLOCK: RefCell<Clock> = const {
        RefCell::new(Clock { now: EPOCH, timers: BTreeMap::new(), timers_set: 0, polls: 0 })
    };
}

fn with<T>(f: impl FnOnce(&mut Clock) -> T) -> T {
    CLOCK.with(|c| f(&mut c.borrow_mut()))
}

/// An instant of virtual time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SimInstant(Duration);

/// The current virtual instant.
pub(crate) fn now() -> SimInstant {
    SimInstant(with(|c| c.now))
}

impl SimInstant {
    /// Virtual milliseconds since the run began.
    pub(crate) fn ms_since_start(self) -> u64 {
        (self.0 - EPOCH).as_millis() as u64
    }
}

impl Add<Duration> for SimInstant {
    type Output = SimInstant;
    fn add(self, d: Duration) -> SimInstant {
        SimInstant(self.0 + d)
    }
}

impl AddAssign<Duration> for SimInstant {
    fn add_assign(&mut self, d: Duration) {
        self.0 += d;
    }
}

impl Sub<Duration> for SimInstant {
    type Output = SimInstant;
    fn sub(self, d: Duration) -> SimInstant {
        SimInstant(self.0.saturating_sub(d))
    }
}

impl SubAssign<Duration> for SimInstant {
    fn sub_assign(&mut self, d: Duration) {
        self.0 = self.0.saturating_sub(d);
    }
}

impl Sub<SimInstant> for SimInstant {
    type Output = Duration;
    fn sub(self, other: SimInstant) -> Duration {
        self.0.saturating_sub(other.0)
    }
}

impl openraft::Instant for SimInstant {
    fn now() -> SimInstant {
        now()
    }
}

/// A future that ends at a virtual deadline.
#[derive(Debug)]
pub(crate) struct Sleep {
    deadline: Duration,
    /// Its place among the pending timers, once polled.
    key: Option<(Duration, u64)>,
}

/// Ends after `d` of virtual time.
pub(crate) fn sleep(d: Duration) -> Sleep {
    sleep_until(now() + d)
}

/// Ends at `deadline`.
pub(crate) fn sleep_until(deadline: SimInstant) -> Sleep {
    Sleep {
        deadline: deadline.0,
        key: None,
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        let key = self.key;
        let (ready, key) = with(|c| {
            if c.now >= deadline {
                if let Some(k) = key {
                    c.timers.remove(&k);
                }
                return (true, None);
            }
            let k = key.unwrap_or_else(|| {
                c.timers_set += 1;
                (deadline, c.timers_set)
            });
            c.timers.insert(k, cx.waker().clone());
            (false, Some(k))
        });
        self.key = key;
        if ready {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(k) = self.key {
            // The thread-local may be gone when a runtime is dropped at thread exit.
            let _ = CLOCK.try_with(|c| c.borrow_mut().timers.remove(&k));
        }
    }
}

/// A deadline passed before the future ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Elapsed;

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline elapsed")
    }
}

impl std::error::Error for Elapsed {}

/// A future with a virtual deadline.
pub(crate) struct Timeout<F> {
    future: Pin<Box<F>>,
    sleep: Sleep,
}

/// `future`, or [`Elapsed`] once `d` of virtual time went by first.
pub(crate) fn timeout<F: Future>(d: Duration, future: F) -> Timeout<F> {
    timeout_at(now() + d, future)
}

/// `future`, or [`Elapsed`] at `deadline` if it has not ended.
pub(crate) fn timeout_at<F: Future>(deadline: SimInstant, future: F) -> Timeout<F> {
    Timeout {
        future: Box::pin(future),
        sleep: sleep_until(deadline),
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(v) = self.future.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        match Pin::new(&mut self.sleep).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A future whose polls the clock counts (a task that runs is not idle).
struct Counted<F>(Pin<Box<F>>);

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        with(|c| c.polls += 1);
        self.0.as_mut().poll(cx)
    }
}

/// Spawns a task the clock counts.
pub(crate) fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(Counted(Box::pin(future)))
}

/// Moves the clock on whenever every counted task waits.
async fn tick() {
    let mut busy = 0;
    loop {
        let before = with(|c| c.polls);
        tokio::task::yield_now().await;
        if with(|c| c.polls) != before {
            busy += 1;
            assert!(
                busy < BUSY_TURNS_MAX,
                "the simulation never went idle in {BUSY_TURNS_MAX} turns"
            );
            continue;
        }
        busy = 0;
        let due = with(|c| {
            let (&(deadline, _), _) = c.timers.first_key_value()?;
            c.now = c.now.max(deadline);
            let later = c.timers.split_off(&(deadline, u64::MAX));
            Some(std::mem::replace(&mut c.timers, later))
        });
        let Some(due) = due else {
            panic!("the simulation is stuck: every task waits and no timer is set");
        };
        for (_, waker) in due {
            waker.wake();
        }
    }
}

/// Runs `future` to its end on virtual time starting at 0, on this thread.
pub(crate) fn run<F: Future>(future: F) -> F::Output {
    with(|c| {
        c.now = EPOCH;
        c.timers.clear();
        c.polls = 0;
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    let out = rt.block_on(async {
        let clock = tokio::spawn(tick());
        let out = Counted(Box::pin(future)).await;
        clock.abort();
        out
    });
    drop(rt);
    with(|c| c.timers.clear());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_end_in_deadline_order_at_their_virtual_times() {
        let order = run(async {
            let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            for ms in [300u64, 100, 200, 100] {
                let seen = seen.clone();
                tasks.push(spawn(async move {
                    sleep(Duration::from_millis(ms)).await;
                    seen.lock().unwrap().push((ms, now().ms_since_start()));
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let late = timeout(Duration::from_millis(50), sleep(Duration::from_secs(60))).await;
            assert_eq!(late, Err(Elapsed));
            assert_eq!(now().ms_since_start(), 350);
            let v = seen.lock().unwrap().clone();
            v
        });
        assert_eq!(order, [(100, 100), (100, 100), (200, 200), (300, 300)]);
    }
}
