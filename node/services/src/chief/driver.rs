//! The chief's loops: while this node is chief, every [`CHIEF_PERIOD_MS`] the proposals
//! [`super::decide`] returns, and [`CHIEF_WAKE_GAP_MS`] after any log entry is applied (a
//! rank exited, a trial reported) `decide` again, so a freed slot gets its next trial
//! without waiting for the period. Now and then (half the retention, 1 s to 1 min) it
//! compacts ended jobs past the retention. The members' view it decides with is copied from
//! the membership loop when that reports a change (`NodeHandle::member_changes`) or after
//! [`VIEW_MAX_AGE_MS`], not at every pass: a copy of every member four times a second was
//! most of an idle chief's own work at 128.
//!
//! Each trial start or promotion it commits is traced at debug level under the target
//! `ringleader::hops` (`hop="placed"`, with the wall clock's `at_ms`): the first of a
//! trial's hops, which `scripts/bench-search.sh` (HOPS=1) lines up with the node's
//! (`seen`, `spawned`, `exited`, `committed`, from `jobs`).
//!
//! Beside it, in the same task, the voter upkeep (the control plane's autopilot): at most one
//! voter change a period, from the decide loop's latest view. It runs apart because a change
//! on gossip's word first asks the member directly and may wait [`CONFIRM_TIMEOUT_MS`] for
//! its silence, and a membership change waits for its commit: the decisions (placements,
//! re-forms, trials) never wait behind either.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::debug;

use crate::cluster::net::MemberView;
#[cfg(doc)]
use crate::control::handle::CONFIRM_TIMEOUT_MS;
use crate::control::{
    handle::{wall_ms, ControlHandle},
    voters::VoterConfig,
};
use crate::domain::state::{compaction, new_ring_secret, JobId, Op};

/// Period of the chief's loop, in milliseconds.
pub const CHIEF_PERIOD_MS: u64 = 250;
/// After an applied entry wakes the loop, it waits this long for more to batch them, in
/// milliseconds.
pub const CHIEF_WAKE_GAP_MS: u64 = 5;

/// Oldest the chief's copy of the members' view gets while the membership loop reports no
/// change, in milliseconds (members forgotten an hour after their death leave the view
/// without a change).
pub const VIEW_MAX_AGE_MS: u64 = 5_000;

/// Shortest period between two compactions, in milliseconds.
pub const COMPACT_PERIOD_MIN_MS: u64 = 1_000;
/// Longest period between two compactions, in milliseconds.
pub const COMPACT_PERIOD_MAX_MS: u64 = 60_000;

/// The members' view the chief decides with: the members, the membership core's clock when
/// they were copied (ms), and when that was.
#[derive(Clone)]
struct View {
    members: Arc<Vec<MemberView>>,
    copied_ms: u64,
    at: tokio::time::Instant,
}

impl View {
    /// The membership core's clock now (both clocks monotonic, in ms).
    fn now_ms(&self) -> u64 {
        self.copied_ms + self.at.elapsed().as_millis() as u64
    }
}

/// Runs until the node shuts down. Ended jobs are compacted out of the live state
/// `retention_ms` after they finished (never when `retention_ms` is 0).
pub async fn run(ctl: ControlHandle, retention_ms: u64, policy: super::scheduler::Policy) {
    let (views, view) = watch::channel(None);
    // Either loop ends only when the node's loops are gone; the other goes with it.
    tokio::select! {
        _ = decide_loop(ctl.clone(), retention_ms, policy, views) => {}
        _ = voter_loop(ctl, view) => {}
    }
}

/// Decides and proposes while this node is chief, publishing each view it copies to `views`
/// for the voter upkeep.
async fn decide_loop(
    ctl: ControlHandle,
    retention_ms: u64,
    policy: super::scheduler::Policy,
    views: watch::Sender<Option<View>>,
) {
    let compact_every = Duration::from_millis(
        (retention_ms / 2).clamp(COMPACT_PERIOD_MIN_MS, COMPACT_PERIOD_MAX_MS),
    );
    let mut compacted_at = tokio::time::Instant::now();
    let period = Duration::from_millis(CHIEF_PERIOD_MS);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut applied = ctl.subscribe_applied();
    let mut changes = ctl.node().member_changes();
    let mut view: Option<View> = None;
    let view_max_age = Duration::from_millis(VIEW_MAX_AGE_MS);
    loop {
        // A node that does not lead sleeps until it does (only the chief decides).
        ctl.until_leader().await;
        tokio::select! {
            _ = tick.tick() => {}
            changed = applied.changed() => {
                if changed.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(CHIEF_WAKE_GAP_MS)).await;
                applied.borrow_and_update();
            }
        }
        if !ctl.is_chief() {
            continue;
        }
        // A loop that is gone errs: copied again, which ends this loop.
        let stale = match &view {
            Some(v) => v.at.elapsed() >= view_max_age || changes.has_changed().unwrap_or(true),
            None => true,
        };
        if stale {
            changes.borrow_and_update();
            let Ok((copied_ms, members)) = ctl.node().members().await else {
                return;
            };
            let copied = View {
                members: Arc::new(members),
                copied_ms,
                at: tokio::time::Instant::now(),
            };
            views.send_replace(Some(copied.clone()));
            view = Some(copied);
        }
        let Some(v) = &view else {
            continue;
        };
        let members = v.members.as_slice();
        let mut commands =
            ctl.read(|s| super::decide_with(policy, s, members, wall_ms(), &mut new_ring_secret));
        if retention_ms > 0 && compacted_at.elapsed() >= compact_every {
            compacted_at = tokio::time::Instant::now();
            let now = wall_ms();
            let ids = ctl.read(|s| compaction::compactable(s, now, retention_ms));
            commands.extend(compaction::command(ids, now));
        }
        // A trial's start as the hop trace names it (`search`, `trial`), before it is sent.
        let trials: Vec<Option<(JobId, u32)>> = commands
            .iter()
            .map(|c| match &c.op {
                Op::TrialStart(t) => Some((t.search, t.trial)),
                Op::TrialPromote(t) => Some((t.search, t.trial)),
                _ => None,
            })
            .collect();
        // All in flight at once, in order: a pass costs one commit round trip, not one per
        // command (a pass that started 8 trials one commit after the other took most of the
        // time a trivial trial's slot stood empty).
        for (result, trial) in ctl.propose_in_order(commands).await.into_iter().zip(trials) {
            match (result, trial) {
                (Err(e), _) => debug!("chief's command not recorded: {e}"),
                (Ok(_), Some((search, trial))) => {
                    debug!(target: "ringleader::hops", search = %search, trial, at_ms = wall_ms(), hop = "placed");
                }
                (Ok(_), None) => {}
            }
        }
    }
}

/// At most one voter change every [`CHIEF_PERIOD_MS`] while this node is chief, from the
/// latest view the decide loop copied (none before its first).
async fn voter_loop(ctl: ControlHandle, mut view: watch::Receiver<Option<View>>) {
    let voter_config = VoterConfig::default();
    let mut tick = tokio::time::interval(Duration::from_millis(CHIEF_PERIOD_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ctl.until_leader().await;
        tick.tick().await;
        if !ctl.is_chief() {
            continue;
        }
        let Some(v) = view.borrow_and_update().clone() else {
            // None copied yet: wait for the first (the sender gone ends this loop too).
            if view.changed().await.is_err() {
                return;
            }
            continue;
        };
        if let Err(e) = ctl
            .reconcile_voters(&voter_config, v.now_ms(), &v.members)
            .await
        {
            debug!("voter change not made: {e}");
        }
    }
}
