//! The chief's loop: while this node is chief, every [`CHIEF_PERIOD_MS`] one voter change
//! (the control plane's autopilot) and the proposals [`super::decide`] returns; and
//! [`CHIEF_WAKE_GAP_MS`] after any log entry is applied (a rank exited, a trial reported),
//! `decide` again, so a freed slot gets its next trial without waiting for the period.

use std::time::Duration;

use tracing::debug;

use crate::control::{
    handle::{wall_ms, ControlHandle},
    state::new_ring_secret,
    voters::VoterConfig,
};

/// Period of the chief's loop, in milliseconds.
pub const CHIEF_PERIOD_MS: u64 = 250;
/// After an applied entry wakes the loop, it waits this long for more to batch them, in
/// milliseconds.
pub const CHIEF_WAKE_GAP_MS: u64 = 5;

/// Runs until the node shuts down.
pub async fn run(ctl: ControlHandle) {
    let voter_config = VoterConfig::default();
    let period = Duration::from_millis(CHIEF_PERIOD_MS);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut applied = ctl.subscribe_applied();
    let mut voters_at: Option<tokio::time::Instant> = None;
    loop {
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
        let commands = ctl.read(|s| super::decide(s, &members, wall_ms(), &mut new_ring_secret));
        for cmd in commands {
            if let Err(e) = ctl.propose(cmd).await {
                debug!("chief's command not recorded: {e}");
            }
        }
    }
}
