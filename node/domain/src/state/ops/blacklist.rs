//! `blacklist`: the chief keeps a member from placement for `cooldown_ms` × 2^(its strikes
//! so far), at most [`BLACKLIST_MS_MAX`].

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{
    truncate_at_char, Blacklisting, ControlResponse, ControlState, BLACKLIST_MS_MAX,
    REASON_BYTES_MAX,
};

/// The chief blacklists a member for `cooldown_ms` × 2^(strikes) (capped at
/// [`BLACKLIST_MS_MAX`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Blacklist {
    /// Its peer id.
    pub member: String,
    /// Its name.
    pub name: String,
    /// Base cooldown, ms.
    pub cooldown_ms: u64,
    /// Why.
    pub reason: String,
}

impl Command for Blacklist {
    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        let Blacklist {
            ref member,
            ref name,
            cooldown_ms,
            ref reason,
        } = *self;
        let entry = state
            .blacklist
            .entry(member.to_owned())
            .or_insert_with(|| Blacklisting {
                name: name.to_owned(),
                until_ms: 0,
                strikes: 0,
                reason: String::new(),
            });
        let factor = 1u64 << entry.strikes.min(20);
        entry.strikes = entry.strikes.saturating_add(1);
        entry.until_ms = at
            .at_ms
            .saturating_add(cooldown_ms.saturating_mul(factor).min(BLACKLIST_MS_MAX));
        entry.name = name.to_owned();
        entry.reason = reason.to_owned();
        truncate_at_char(&mut entry.reason, REASON_BYTES_MAX);
        ControlResponse::Applied
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Chief
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ops::testing::at;

    #[test]
    fn blacklist_doubles_the_cooldown_with_each_strike() {
        let mut state = ControlState::default();
        let blacklist = Blacklist {
            member: "id-1".into(),
            name: "m1".into(),
            cooldown_ms: 1_000,
            reason: "slow".into(),
        };
        assert_eq!(blacklist.apply(&mut state, at(0)), ControlResponse::Applied);
        assert_eq!(state.blacklist["id-1"].until_ms, 1_000);
        assert_eq!(
            blacklist.apply(&mut state, at(5_000)),
            ControlResponse::Applied
        );
        assert_eq!(state.blacklist["id-1"].until_ms, 7_000);
        assert_eq!(state.blacklist["id-1"].strikes, 2);
    }
}
