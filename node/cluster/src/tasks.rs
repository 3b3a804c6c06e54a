//! The tasks a node spawns, owned: each part of the node spawns into a [`Tasks`] (a
//! cancellation token and a tracker of the tasks), and [`Tasks::stop`] cancels them and
//! waits, within a bound, until every one has ended. `node::run` stops the parts in order
//! at SIGTERM (the API first, then the ranks, then the background writers and services,
//! then the control plane), so no task is detached and none outlives its part.
//!
//! Two ways to spawn: [`Tasks::spawn`] ends the task at its next await once the part stops
//! (for work whose interruption loses nothing: an accept loop, a connection, a proposal),
//! and [`Tasks::spawn_owned`] leaves the ending to the task, which watches
//! [`Tasks::stopping`] at its own safe points (a writer between two writes, the supervisor
//! once its ranks are stopped).
//!
//! The node's threads let the kernel fire their timers up to [`NODE_TIMER_SLACK_NS`] late
//! ([`relax_timers`], before the runtime starts), so that timers due within that window
//! share one wake-up; a rank gets Linux's default back ([`RANK_TIMER_SLACK_NS`]).
//!
//! May use: nothing of the node.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

/// One part's tasks. Cheap to clone: clones spawn into the same part.
#[derive(Clone, Debug, Default)]
pub struct Tasks {
    /// The part's name, in logs.
    name: &'static str,
    stop: CancellationToken,
    tracker: TaskTracker,
}

impl Tasks {
    /// The tasks of the part `name`.
    pub fn new(name: &'static str) -> Tasks {
        Tasks {
            name,
            stop: CancellationToken::new(),
            tracker: TaskTracker::new(),
        }
    }

    /// Spawns `task`, which ends at its next await once the part stops.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let stop = self.stop.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                biased;
                () = stop.cancelled() => {}
                () = task => {}
            }
        });
    }

    /// Spawns `task`, which ends itself once [`Tasks::stopping`] fires.
    pub fn spawn_owned(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.tracker.spawn(task);
    }

    /// The token that fires when the part stops.
    pub fn stopping(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Tasks of this part still running.
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    /// Whether no task of this part runs.
    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }

    /// Stops the part: fires [`Tasks::stopping`], then waits at most `within` for every task
    /// to end. `false` (and a warning naming the part) when some were still running then;
    /// they end with the runtime.
    pub async fn stop(&self, within: Duration) -> bool {
        self.stop.cancel();
        self.tracker.close();
        if tokio::time::timeout(within, self.tracker.wait())
            .await
            .is_ok()
        {
            return true;
        }
        warn!(
            part = self.name,
            running = self.tracker.len(),
            within_ms = within.as_millis() as u64,
            "tasks still running at shutdown"
        );
        false
    }
}

/// How late the kernel may fire a node thread's timers, in nanoseconds (Linux's timer slack,
/// `prctl(PR_SET_TIMERSLACK)`). An idle node's CPU is its wake-ups: its timers (the probe
/// cadence, Raft's tick, the supervisor's, the chores') fall a few ms apart and each woke the
/// node on its own; with this slack those within 20 ms of each other share one wake-up
/// (context switches of an idle node of 8: 35 a second, 29–30 with it). Every timer of the
/// node is tens of ms or longer (gossip rounds 100 ms, probe timeout 150 ms, heartbeats
/// 250 ms, elections 700–1,400 ms), so 20 ms late changes none of its figures; a pacer
/// that sleeps between slices keeps credit for late wake-ups (the datasets' throttle).
pub const NODE_TIMER_SLACK_NS: u64 = 20_000_000;

/// Linux's default timer slack of a normal thread (50 µs), in nanoseconds: what a rank's
/// process is given back, since a child inherits its parent's slack (training code's sleeps
/// and timeouts are not the node's).
pub const RANK_TIMER_SLACK_NS: u64 = 50_000;

/// Environment variable that sets the node's timer slack in nanoseconds instead of
/// [`NODE_TIMER_SLACK_NS`] (50000 is Linux's default): for measuring what the slack costs
/// and buys on a host (docs/book/src/design/scale-history.md), since no other thread can change a
/// thread's slack.
pub const TIMER_SLACK_ENV: &str = "RINGLEADER_TIMER_SLACK_NS";

/// Sets the calling thread's timer slack to [`NODE_TIMER_SLACK_NS`] (or what
/// [`TIMER_SLACK_ENV`] says); threads it starts later inherit it. Called once on the main
/// thread before the node's runtime is built.
pub fn relax_timers() {
    set_timer_slack(timer_slack(std::env::var(TIMER_SLACK_ENV).ok().as_deref()));
}

/// The node's timer slack given [`TIMER_SLACK_ENV`]'s value: the default when unset or not a
/// number of nanoseconds from 1 to 1 s.
fn timer_slack(env: Option<&str>) -> u64 {
    env.and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ns| (1..=1_000_000_000).contains(ns))
        .unwrap_or(NODE_TIMER_SLACK_NS)
}

/// Sets the calling thread's timer slack, in nanoseconds. Async-signal-safe (a `prctl`), so
/// a rank's `pre_exec` may call it. A refusal changes nothing but timing, so it is ignored.
pub fn set_timer_slack(ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK reads only its integer argument.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slack_is_the_default_unless_the_environment_names_a_sane_one() {
        assert_eq!(timer_slack(None), NODE_TIMER_SLACK_NS);
        assert_eq!(timer_slack(Some("50000")), 50_000);
        for bad in ["", "0", "-1", "20ms", "2000000000"] {
            assert_eq!(timer_slack(Some(bad)), NODE_TIMER_SLACK_NS, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn stop_ends_every_task_and_owned_ones_at_their_own_point() {
        let tasks = Tasks::new("test");
        tasks.spawn(std::future::pending());
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let stopping = tasks.stopping();
        tasks.spawn_owned(async move {
            stopping.cancelled().await;
            // The owned task's last unit of work runs to its end.
            tokio::task::yield_now().await;
            let _ = done_tx.send(());
        });
        assert_eq!(tasks.len(), 2);
        assert!(tasks.stop(Duration::from_secs(10)).await);
        assert!(tasks.is_empty());
        done_rx.await.unwrap();
    }

    #[tokio::test]
    async fn a_task_that_ignores_the_stop_is_reported_past_the_bound() {
        let tasks = Tasks::new("test");
        tasks.spawn_owned(std::future::pending());
        assert!(!tasks.stop(Duration::from_millis(20)).await);
        assert_eq!(tasks.len(), 1);
    }
}
