//! Claims only their subject can raise: every update about a member carries that member's
//! own signature of the incarnation it is made at.
//!
//! A member signs its own state each time it changes it (joins, refutes, leaves, changes its
//! metadata): the signature covers its id, the incarnation, whether it left, and the
//! metadata at its version ([`Claim`]). Whoever passes a claim on passes the subject's
//! signature with it, whatever state it claims:
//!
//! - `Alive` and `Left` carry the subject's signature of exactly that (so `Left` about X is
//!   only ever X's own word);
//! - `Suspect` and `Dead` carry the subject's signature of `Alive` at the same incarnation:
//!   anyone may accuse a member, but only at an incarnation the member itself signed, so
//!   the accused refutes at the next one (the member's own signed incarnation + 1).
//!
//! A holder of the cluster key can therefore still accuse a live member (it refutes at
//! once, as SWIM intends), but no longer at an incarnation the member never reached (the
//! review's `Dead at 2^64 − 1`, which nobody could refute), never says that another member
//! left, and never changes another member's addresses or name.
//!
//! Incarnations are bounded besides: none above [`INCARNATION_MAX`] is believed (so `+ 1`
//! never saturates and a member can always refute), and a piggybacked claim may raise a
//! known member's incarnation by at most [`INCARNATION_JUMP_MAX`]. Only a full state sync
//! (a push-pull over an authenticated stream, where a member that was away a long time, or
//! this node after a restart, learns where the others got to) and the first sight of a
//! member may move further: both still need the subject's signature.
//!
//! The membership core is sans-IO and generic: the [`Signer`] is handed in. The node signs
//! with its libp2p Ed25519 identity (`cluster::claim_keys`), whose public key is its peer id;
//! the simulation and the core's tests use [`ModelSigner`].

use super::member::{State, Update};
use serde::Serialize;
use std::fmt::Debug;

/// No incarnation above this is believed (about 4.6 · 10^18): a member at most this high
/// refutes at `+ 1` without reaching `u64::MAX`, where `saturating_add` would trap it.
pub const INCARNATION_MAX: u64 = 1 << 62;
/// Most a piggybacked (datagram) claim may raise a known member's incarnation by. A member
/// raises its own by one per refutation, so a member this node heard from in the last
/// thousand refutations is never refused; farther jumps wait for a push-pull sync.
pub const INCARNATION_JUMP_MAX: u64 = 1_024;
/// The domain the signed bytes start with, so that a claim's signature never signs
/// anything else made with the same identity key.
pub const CLAIM_DOMAIN: &[u8] = b"ringleader membership claim v1\0";

/// What a member signs about itself.
#[derive(Debug, Serialize)]
pub struct Claim<'a, I, M> {
    /// The member (the signer).
    pub id: &'a I,
    /// The incarnation it is at.
    pub incarnation: u64,
    /// It left (`Left`); otherwise it is alive (`Alive`, and what `Suspect` and `Dead`
    /// accuse it of at that incarnation).
    pub left: bool,
    /// Version of `meta`.
    pub meta_version: u64,
    /// Its metadata.
    pub meta: &'a M,
}

impl<'a, I: Serialize, M: Serialize> Claim<'a, I, M> {
    /// The claim an update rests on: `Left` for a leave, `Alive` at its incarnation for
    /// every other state.
    pub fn of(u: &'a Update<I, M>) -> Self {
        Claim {
            id: &u.id,
            incarnation: u.incarnation,
            left: u.state == State::Left,
            meta_version: u.meta_version,
            meta: &u.meta,
        }
    }

    /// The bytes signed: [`CLAIM_DOMAIN`], then the claim in the node's wire codec (bincode:
    /// deterministic for the same values).
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = CLAIM_DOMAIN.to_vec();
        out.extend(crate::wire::encode(self).unwrap_or_default());
        out
    }
}

/// Signs this node's own claims and checks others' claims against their subject's key.
pub trait Signer<I, M>: Debug + Send + Sync {
    /// The local member's signature of `claim` (always about the local member).
    fn sign(&self, claim: &Claim<'_, I, M>) -> Vec<u8>;
    /// Whether `sig` is `claim.id`'s signature of `claim`.
    fn verify(&self, claim: &Claim<'_, I, M>, sig: &[u8]) -> bool;
}

/// The simulation's and the tests' stand-in: a signature is a hash of the claim, which
/// anyone can compute. It models honest members; a forged claim in a test carries no or a
/// wrong signature.
#[derive(Clone, Copy, Debug, Default)]
pub struct ModelSigner;

impl ModelSigner {
    /// The model signature of `claim`.
    pub fn signature<I: Serialize, M: Serialize>(claim: &Claim<'_, I, M>) -> Vec<u8> {
        blake3::hash(&claim.bytes()).as_bytes()[..16].to_vec()
    }

    /// `u` signed as its subject would sign it.
    pub fn signed<I: Serialize, M: Serialize>(mut u: Update<I, M>) -> Update<I, M> {
        u.sig = Self::signature(&Claim::of(&u));
        u
    }
}

impl<I: Serialize + Debug + Send + Sync, M: Serialize + Debug + Send + Sync> Signer<I, M>
    for ModelSigner
{
    fn sign(&self, claim: &Claim<'_, I, M>) -> Vec<u8> {
        Self::signature(claim)
    }

    fn verify(&self, claim: &Claim<'_, I, M>, sig: &[u8]) -> bool {
        Self::signature(claim) == sig
    }
}

/// Why a claim was not believed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Its subject's signature is missing or wrong.
    #[error("not signed by its subject")]
    Unsigned,
    /// Its incarnation is above [`INCARNATION_MAX`].
    #[error("incarnation {incarnation} above the limit of {INCARNATION_MAX}")]
    TooHigh {
        /// The incarnation claimed.
        incarnation: u64,
    },
    /// A piggybacked claim raises the known incarnation by more than
    /// [`INCARNATION_JUMP_MAX`].
    #[error("incarnation {incarnation} jumps more than {INCARNATION_JUMP_MAX} above {known}")]
    Jump {
        /// The incarnation claimed.
        incarnation: u64,
        /// The incarnation known here.
        known: u64,
    },
}

/// The bounds on a claim's incarnation: never above [`INCARNATION_MAX`]; when `piggyback`
/// and the member is `known` at an incarnation, at most [`INCARNATION_JUMP_MAX`] above it.
pub fn check_incarnation(
    incarnation: u64,
    known: Option<u64>,
    piggyback: bool,
) -> Result<(), Refused> {
    if incarnation > INCARNATION_MAX {
        return Err(Refused::TooHigh { incarnation });
    }
    if let (true, Some(known)) = (piggyback, known) {
        if incarnation > known.saturating_add(INCARNATION_JUMP_MAX) {
            return Err(Refused::Jump { incarnation, known });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(incarnation: u64) -> Update<u32, u32> {
        Update {
            id: 3,
            incarnation,
            state: State::Alive,
            meta: 7,
            meta_version: 1,
            from: None,
            sig: Vec::new(),
        }
    }

    #[test]
    fn a_signature_covers_id_incarnation_leave_and_metadata() {
        let u = ModelSigner::signed(alive(4));
        assert!(ModelSigner.verify(&Claim::of(&u), &u.sig));
        // An accusation at the same incarnation rests on the same signature.
        let mut dead = u.clone();
        dead.state = State::Dead;
        assert!(ModelSigner.verify(&Claim::of(&dead), &dead.sig));
        // Each field changed breaks it.
        let mut left = u.clone();
        left.state = State::Left;
        let mut higher = u.clone();
        higher.incarnation = 5;
        let mut other = u.clone();
        other.id = 4;
        let mut meta = u.clone();
        meta.meta = 8;
        let mut version = u.clone();
        version.meta_version = 2;
        for f in [left, higher, other, meta, version] {
            assert!(!ModelSigner.verify(&Claim::of(&f), &f.sig), "{f:?}");
        }
        assert!(!ModelSigner.verify(&Claim::of(&alive(4)), &[]));
    }

    #[test]
    fn incarnations_are_bounded() {
        assert_eq!(check_incarnation(INCARNATION_MAX, None, true), Ok(()));
        assert_eq!(
            check_incarnation(u64::MAX, Some(u64::MAX), false),
            Err(Refused::TooHigh {
                incarnation: u64::MAX
            })
        );
        assert_eq!(
            check_incarnation(10 + INCARNATION_JUMP_MAX, Some(10), true),
            Ok(())
        );
        assert_eq!(
            check_incarnation(11 + INCARNATION_JUMP_MAX, Some(10), true),
            Err(Refused::Jump {
                incarnation: 11 + INCARNATION_JUMP_MAX,
                known: 10
            })
        );
        // A state sync, or a member seen first, may move further.
        assert_eq!(check_incarnation(1 << 40, Some(10), false), Ok(()));
        assert_eq!(check_incarnation(1 << 40, None, true), Ok(()));
    }
}
