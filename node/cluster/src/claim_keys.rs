//! The node's signatures of its membership claims ([`super::membership::claims`]): the node's
//! Ed25519 identity (`identity.key`, the key of its Noise handshakes) signs its own, and
//! each other member's peer id checks its claims, since an Ed25519 peer id is its public
//! key, inlined. A claim about a member whose id holds no public key (a hashed id, which
//! ringleader never makes) cannot be checked and is refused.
//!
//! Holding the cluster key lets a host send datagrams; only a member's identity key lets it
//! raise that member's incarnation, leave in its name or change its advertised addresses.

use libp2p::{
    identity::{Keypair, PublicKey},
    PeerId,
};

use crate::{
    membership::{claims::Claim, Signer},
    meta::NodeMeta,
};

/// The multihash code of an identity (inlined) multihash.
const IDENTITY_MULTIHASH_CODE: u64 = 0;

/// Signs with the node's identity, checks with the peer ids.
pub struct IdentitySigner {
    key: Keypair,
}

impl IdentitySigner {
    /// The signer of the node whose identity is `key`.
    pub fn new(key: Keypair) -> IdentitySigner {
        IdentitySigner { key }
    }
}

impl std::fmt::Debug for IdentitySigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentitySigner")
            .field("peer", &self.key.public().to_peer_id())
            .finish()
    }
}

/// The public key inlined in `peer`, when it holds one.
pub fn public_key(peer: &PeerId) -> Option<PublicKey> {
    let hash: &libp2p::multihash::Multihash<64> = peer.as_ref();
    if hash.code() != IDENTITY_MULTIHASH_CODE {
        return None;
    }
    let key = PublicKey::try_decode_protobuf(hash.digest()).ok()?;
    (key.to_peer_id() == *peer).then_some(key)
}

/// `claim` signed with `key` (which must be `claim.id`'s): what a member sends about
/// itself. Public so that tests can build a member's own claims.
pub fn sign(key: &Keypair, claim: &Claim<'_, PeerId, NodeMeta>) -> Vec<u8> {
    key.sign(&claim.bytes()).unwrap_or_default()
}

impl Signer<PeerId, NodeMeta> for IdentitySigner {
    fn sign(&self, claim: &Claim<'_, PeerId, NodeMeta>) -> Vec<u8> {
        sign(&self.key, claim)
    }

    fn verify(&self, claim: &Claim<'_, PeerId, NodeMeta>, sig: &[u8]) -> bool {
        public_key(claim.id).is_some_and(|key| key.verify(&claim.bytes(), sig))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::{State, Update};

    fn alive(key: &Keypair, incarnation: u64) -> Update<PeerId, NodeMeta> {
        let mut u = Update {
            id: key.public().to_peer_id(),
            incarnation,
            state: State::Alive,
            meta: NodeMeta::for_test("k0", 1, "127.0.0.1"),
            meta_version: 0,
            from: None,
            sig: Vec::new(),
        };
        u.sig = sign(key, &Claim::of(&u));
        u
    }

    #[test]
    fn a_member_signs_its_claims_and_nobody_else_can() {
        let key = Keypair::generate_ed25519();
        let signer = IdentitySigner::new(Keypair::generate_ed25519());
        let u = alive(&key, 3);
        assert!(signer.verify(&Claim::of(&u), &u.sig));
        // The same signature under another incarnation, another member, or a leave.
        let mut higher = u.clone();
        higher.incarnation = u64::MAX;
        let mut left = u.clone();
        left.state = State::Left;
        let mut other = u.clone();
        other.id = Keypair::generate_ed25519().public().to_peer_id();
        let mut moved = u.clone();
        moved.meta.p2p_addrs = vec!["/ip4/10.0.0.66/tcp/1".into()];
        for f in [higher, left, other, moved] {
            assert!(!signer.verify(&Claim::of(&f), &f.sig), "{f:?}");
        }
        // Signed with another member's key.
        let mut forged = u.clone();
        forged.sig = sign(&Keypair::generate_ed25519(), &Claim::of(&u));
        assert!(!signer.verify(&Claim::of(&forged), &forged.sig));
        // A peer id that holds no key (random bytes) checks nothing.
        let mut random = u.clone();
        random.id = PeerId::random();
        assert!(public_key(&random.id).is_none());
        assert!(!signer.verify(&Claim::of(&random), &random.sig));
    }
}
