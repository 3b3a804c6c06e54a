//! The chief's loop: while this node is chief, every [`CHIEF_PERIOD_MS`] one voter change
//! (the control plane's autopilot) and the proposals [`super::decide`] returns; and
//! [`CHIEF_WAKE_GAP_MS`] after any log entry is applied (a rank exited, a trial reported),
//! `decide` again, so a freed slot gets its next trial without waiting for the period. Now
//! and then (half the retention, 1 s to 1 min) it compacts ended jobs past the retention.
//! The members' view it decides with is copied from the membership loop when that reports a
//! change (`NodeHandle::member_changes`) or after [`VIEW_MAX_AGE_MS`], not at every pass: a
//! copy of every member four times a second was most of an idle chief's own work at 128.

use std::time::Duration;

use tracing::debug;

use crate::cluster::net::MemberView;
use crate::control::{
    handle::{wall_ms, ControlHandle},
    voters::VoterConfig,
};
use crate::domain::state::{compaction, new_ring_secret};

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

/// Runs until the node shuts down. Ended jobs are compacted out of the live state
/// `retention_ms` after they finished (never when `retention_ms` is 0).
pub async fn run(ctl: ControlHandle, retention_ms: u64, policy: super::scheduler::Policy) {
    let compact_every = Duration::from_millis(
        (retention_ms / 2).clamp(COMPACT_PERIOD_MIN_MS, COMPACT_PERIOD_MAX_MS),
    );
    let mut compacted_at = tokio::time::Instant::now();
    let voter_config = VoterConfig::default();
    let period = Duration::from_millis(CHIEF_PERIOD_MS);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut applied = ctl.subscribe_applied();
    let mut voters_at: Option<tokio::time::Instant> = None;
    let mut changes = ctl.node().member_changes();
    // The members' view, the core's clock when it was copied, and when that was.
    let mut view: Option<(Vec<MemberView>, u64, tokio::time::Instant)> = None;
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
            Some((_, _, at)) => {
                at.elapsed() >= view_max_age || changes.has_changed().unwrap_or(true)
            }
            None => true,
        };
        if stale {
            changes.borrow_and_update();
            let Ok((now_ms, members)) = ctl.node().members().await else {
                return;
            };
            view = Some((members, now_ms, tokio::time::Instant::now()));
        }
        let Some((members, copied_ms, at)) = &view else {
            continue;
        };
        // The core's clock runs with this one (both monotonic, in ms).
        let members_now_ms = copied_ms + at.elapsed().as_millis() as u64;
        let members = members.as_slice();
        if voters_at.is_none_or(|t| t.elapsed() >= period) {
            voters_at = Some(tokio::time::Instant::now());
            if let Err(e) = ctl
                .reconcile_voters(&voter_config, members_now_ms, members)
                .await
            {
                debug!("voter change not made: {e}");
            }
        }
        let mut commands =
            ctl.read(|s| super::decide_with(policy, s, members, wall_ms(), &mut new_ring_secret));
        if retention_ms > 0 && compacted_at.elapsed() >= compact_every {
            compacted_at = tokio::time::Instant::now();
            let now = wall_ms();
            let ids = ctl.read(|s| compaction::compactable(s, now, retention_ms));
            commands.extend(compaction::command(ids, now));
        }
        for cmd in commands {
            if let Err(e) = ctl.propose(cmd).await {
                debug!("chief's command not recorded: {e}");
            }
        }
    }
}
