//! Members removed from the cluster by an operator (`ringleader member remove`).
//!
//! A removal is replicated ([`Removal`], by peer id) and never undone: the chief's voter
//! upkeep takes the member out of the Raft membership (voter and learner) and never adds it
//! back (`voters::exclude_removed`), the RPC server refuses its messages
//! (`rpc::check_not_removed`), and placement treats it as unavailable. Its ranks that run
//! already are not stopped by the removal.
//!
//! A removed host still holds the cluster key until the key is rotated
//! (`ringleader key rotate`, see `key_epoch` and `rotation`): the new key goes to every live
//! member but a removed one, after which its old key, and the admin token derived from it,
//! open nothing.

use serde::{Deserialize, Serialize};

use super::{ignored, rejected, ControlResponse, ControlState};

/// Most removed members remembered (the list lives in every snapshot).
pub const REMOVED_MAX: usize = 10_000;
/// Longest peer id accepted in a removal, in bytes (a base58 Ed25519 peer id is 52).
pub const PEER_ID_BYTES_MAX: usize = 128;

/// One removed member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removal {
    /// Its name when it was removed.
    pub name: String,
    /// When (proposer's clock, ms since the Unix epoch).
    pub at_ms: u64,
}

impl ControlState {
    /// Applies `MemberRemove`.
    pub(super) fn member_remove(
        &mut self,
        peer_id: &str,
        name: &str,
        at_ms: u64,
    ) -> ControlResponse {
        if self.removed.contains_key(peer_id) {
            return ignored(format!("member {peer_id} is removed already"));
        }
        if self.removed.len() >= REMOVED_MAX {
            return rejected(format!("{REMOVED_MAX} members are removed already"));
        }
        self.removed.insert(
            peer_id.to_owned(),
            Removal {
                name: name.to_owned(),
                at_ms,
            },
        );
        ControlResponse::Applied
    }

    /// Whether the member `peer_id` was removed from the cluster.
    pub fn is_removed(&self, peer_id: &str) -> bool {
        self.removed.contains_key(peer_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ops, ControlCommand, Op};

    fn remove(peer: &str) -> ControlCommand {
        ControlCommand {
            op: Op::MemberRemove(ops::MemberRemove {
                peer_id: peer.into(),
                name: "c".into(),
            }),
            at_ms: 9,
        }
    }

    #[test]
    fn a_member_is_removed_once_and_for_good() {
        let peer = libp2p::PeerId::random().to_string();
        let mut s = ControlState::default();
        assert_eq!(s.apply(1, &remove(&peer)), ControlResponse::Applied);
        assert!(s.is_removed(&peer));
        assert_eq!(s.removed[&peer].name, "c");
        assert!(matches!(
            s.apply(2, &remove(&peer)),
            ControlResponse::Ignored { .. }
        ));
        assert!(s.is_removed(&peer));
        // Not a peer id: refused before it reaches the state.
        assert!(matches!(
            s.apply(3, &remove("nope")),
            ControlResponse::Rejected { .. }
        ));
        assert!(!s.is_removed("nope"));
    }
}
