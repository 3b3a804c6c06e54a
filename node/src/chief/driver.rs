//! The chief's loop: while this node is chief, every [`CHIEF_PERIOD_MS`] one voter change
//! (the control plane's autopilot) and the proposals [`super::decide`] returns; and
//! [`CHIEF_WAKE_GAP_MS`] after any log entry is applied (a rank exited, a trial reported),
//! `decide` again, so a freed slot gets its next trial without waiting for the period. Now
//! and then (half the retention, 1 s to 1 min) it compacts ended jobs past the retention.

use std::time::Duration;

use tracing::debug;

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

/// Shortest period between two compactions, in milliseconds.
pub const COMPACT_PERIOD_MIN_MS: u64 = 1_000;
/// Longest period between two compactions, in milliseconds.
pub const COMPACT_PERIOD_MAX_MS: u64 = 60_000;

/// Runs until the node shuts down. Ended jobs are compacted out of the live state
/// `retention_ms` after they finished (never when `retention_ms` is 0).
pub async fn run(ctl: ControlHandle, retention_ms: u64) {
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
        let Ok((members_now_ms, members)) = ctl.node().members().await else {
            return;
        };
        if voters_at.is_none_or(|t| t.elapsed() >= period) {
            voters_at = Some(tokio::time::Instant::now());
            if let Err(e) = ctl
                .reconcile_voters(&voter_config, members_now_ms, &members)
                .await
            {
                debug!("voter change not made: {e}");
            }
        }
        let mut commands =
            ctl.read(|s| super::decide(s, &members, wall_ms(), &mut new_ring_secret));
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
