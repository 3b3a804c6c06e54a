//! The chief's loop: while this node is chief, every [`CHIEF_PERIOD_MS`], one voter change
//! (the control plane's autopilot) and the proposals [`super::decide`] returns.

use std::time::Duration;

use tracing::debug;

use crate::control::{
    handle::{wall_ms, ControlHandle},
    state::new_ring_secret,
    voters::VoterConfig,
};

/// Period of the chief's loop, in milliseconds.
pub const CHIEF_PERIOD_MS: u64 = 250;

/// Runs until the node shuts down.
pub async fn run(ctl: ControlHandle) {
    let voter_config = VoterConfig::default();
    let mut tick = tokio::time::interval(Duration::from_millis(CHIEF_PERIOD_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !ctl.is_chief() {
            continue;
        }
        let Ok((members_now_ms, members)) = ctl.node().members().await else {
            return;
        };
        if let Err(e) = ctl
            .reconcile_voters(&voter_config, members_now_ms, &members)
            .await
        {
            debug!("voter change not made: {e}");
        }
        let commands = ctl.read(|s| super::decide(s, &members, wall_ms(), &mut new_ring_secret));
        for cmd in commands {
            if let Err(e) = ctl.propose(cmd).await {
                debug!("chief's command not recorded: {e}");
            }
        }
    }
}
