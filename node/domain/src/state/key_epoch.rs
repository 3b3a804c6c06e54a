//! The cluster key's epoch (`ringleader key rotate`): the one replicated fact of a key
//! rotation, the point at which every member switches to the new key.
//!
//! The key itself never enters the log: the rotating node offers it to each member over the
//! swarm's authenticated, encrypted streams first (`rotation`), and only once every live,
//! non-removed member has taken it does it propose [`Op::KeySwitch`](super::Op::KeySwitch),
//! which names the new key by its public fingerprint. Each member applies the switch when its
//! replica applies the entry: the pending key with that fingerprint becomes its key. A member
//! that was not given it (down, or removed) cannot switch and is told so.
//!
//! Origin rule: the admin only (the admin token, or a member forwarding it; a removed member
//! is refused everything). Check: a fingerprint of 64 hex digits and an epoch above 0.
//! Apply: only the next epoch (the current one + 1) is taken; a replayed or stale switch is
//! ignored, so a rotation retried after a chief's failure switches at most once per epoch.

use serde::{Deserialize, Serialize};

use super::{ignored, ControlResponse, ControlState};

/// Length of a key's fingerprint in hex digits (`ClusterKey::fingerprint`).
pub const FINGERPRINT_HEX_LEN: usize = 64;

/// The key the cluster runs on since a rotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyEpoch {
    /// How many rotations the cluster's key has been through (the first key is epoch 0,
    /// which is never recorded).
    pub epoch: u64,
    /// The current key's public fingerprint.
    pub fingerprint: String,
    /// When the switch was proposed (proposer's clock, ms since the Unix epoch).
    pub at_ms: u64,
}

/// Whether `fingerprint` has a fingerprint's shape.
pub fn check_fingerprint(fingerprint: &str) -> Result<(), String> {
    let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    if fingerprint.len() != FINGERPRINT_HEX_LEN || !fingerprint.chars().all(hex) {
        return Err(format!(
            "key switch: the fingerprint must be {FINGERPRINT_HEX_LEN} lowercase hex digits"
        ));
    }
    Ok(())
}

impl ControlState {
    /// The epoch of the cluster's key (0: never rotated).
    pub fn key_epoch(&self) -> u64 {
        self.key.as_ref().map_or(0, |k| k.epoch)
    }

    /// Applies `KeySwitch`.
    pub(super) fn key_switch(
        &mut self,
        epoch: u64,
        fingerprint: &str,
        at_ms: u64,
    ) -> ControlResponse {
        let current = self.key_epoch();
        if epoch != current + 1 {
            return ignored(format!(
                "key switch to epoch {epoch}: the cluster's key is at epoch {current}"
            ));
        }
        self.key = Some(KeyEpoch {
            epoch,
            fingerprint: fingerprint.to_owned(),
            at_ms,
        });
        ControlResponse::Applied
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ops, ControlCommand, Op};

    fn switch(epoch: u64, fingerprint: &str) -> ControlCommand {
        ControlCommand {
            op: Op::KeySwitch(ops::KeySwitch {
                epoch,
                fingerprint: fingerprint.into(),
            }),
            at_ms: 7,
        }
    }

    #[test]
    fn a_key_switch_takes_only_the_next_epoch() {
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        let mut s = ControlState::default();
        assert_eq!(s.key_epoch(), 0);
        assert!(matches!(
            s.apply(1, &switch(2, &a)),
            ControlResponse::Ignored { .. }
        ));
        assert_eq!(s.apply(2, &switch(1, &a)), ControlResponse::Applied);
        assert_eq!(s.key_epoch(), 1);
        assert_eq!(s.key.as_ref().unwrap().fingerprint, a);
        // A retried rotation's second switch to the same epoch is ignored.
        assert!(matches!(
            s.apply(3, &switch(1, &b)),
            ControlResponse::Ignored { .. }
        ));
        assert_eq!(s.key.as_ref().unwrap().fingerprint, a);
        assert_eq!(s.apply(4, &switch(2, &b)), ControlResponse::Applied);
        assert_eq!(s.key_epoch(), 2);
        // Not a fingerprint: refused before it reaches the state.
        for (index, bad) in (5..).zip(["", "xyz", &"A".repeat(64), &"a".repeat(63)]) {
            assert!(matches!(
                s.apply(index, &switch(3, bad)),
                ControlResponse::Rejected { .. }
            ));
        }
        assert_eq!(s.key_epoch(), 2);
    }

    #[test]
    fn a_key_switch_is_the_admin_s_alone() {
        let cmd = switch(1, &"a".repeat(64));
        assert!(
            cmd.origin().admin_only(),
            "control::rpc::admin_only asks this"
        );
    }
}
