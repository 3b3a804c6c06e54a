//! Key rotation (`ringleader key rotate`, `POST /v1/key/rotate`): a new cluster key for every
//! live member, none for a removed one. This is what makes `member remove` real: a removed
//! host keeps the old key, and once the members switch, the old key opens nothing.
//!
//! How it goes ([`rotate`], on the node whose API took the admin's request):
//!
//! 1. A fresh key is made. Its epoch is the cluster's current one + 1
//!    (`domain::state::key_epoch`).
//! 2. It is offered to every member gossip sees alive or suspect and the state does not list
//!    as removed, this node included, in a call (`RpcRequest::KeyOffer`) on the swarm's
//!    streams: Noise-authenticated (the receiver knows the caller's peer id and refuses a
//!    removed one) and encrypted. The key never travels in the replicated log, nor in a
//!    datagram. Each member writes it beside its key file (`<key file>.next`, 0600) and holds
//!    it as pending ([`KeyRing::offer`]); it answers with the key's fingerprint.
//! 3. Only when every one of them answered with the right fingerprint is
//!    `Op::KeySwitch` (its epoch and fingerprint) proposed. If any did not, nothing switches:
//!    the request fails naming those members, and a retry starts again with a fresh key
//!    (a pending key is replaced by the next offer).
//! 4. Every member applies the switch when its replica applies the entry ([`follow`]): the
//!    pending key is written over its key file (atomically, 0600) and becomes current; the
//!    previous key is still accepted for the ring's overlap (`key_ring`), then refused. The
//!    admin token derived from the key changes with it: the API accepts the new one at once,
//!    refuses the old one, and `<data-dir>/api.token` (0600) holds the new one, where the CLI
//!    on that host reads it.
//!
//! If the rotating node (or the chief) fails midway: before the switch is committed, nothing
//! changed but the members' pending keys, which the next rotation replaces; after it, every
//! member switches as it applies the entry, whoever proposed it. A switch is applied once per
//! epoch (a replayed or repeated one is ignored), so a retried rotation is safe.
//!
//! A member that was down or unreachable during a rotation misses the offer. If it was up
//! when the switch applied, it cannot switch and says so at error level ([`follow`]); if it
//! comes back later with the old key, its handshakes fail and its seed warning names the
//! cause. Either way the operator copies the new `cluster.key` from a member, as at a first
//! join, and restarts it with `--cluster-key FILE`: this is the documented way back (a host
//! holding only the old key cannot be told the new one safely, since a removed host holds
//! the old key too).
//!
//! Connections made before the switch keep the key of their handshake (the swarm's
//! pre-shared-key layer keys a connection once), so jobs, Raft and gossip go on across it;
//! every connection after it uses the new key. A removed member's connections are closed at
//! the switch: its redials need the new key.
//!
//! May use: `cluster` (the key ring, member view, wire codec), `domain` (the key epoch),
//! `control` (the handle: reads, calls, proposals), `security` (the admin token, the token
//! file).

use std::{path::PathBuf, sync::Arc};

use serde::Serialize;
use tracing::{error, info, warn};

use crate::{
    cluster::{identity, key_ring::KeyRing, membership::State, wire},
    control::{
        handle::{wall_ms, ControlHandle},
        protocol::{RpcRequest, RpcResponse, SecretText},
    },
    domain::state::{ops, ControlCommand, ControlResponse, Op},
    security::{api_token::ApiToken, bootstrap},
};

/// What a finished rotation reports.
#[derive(Debug, Clone, Serialize)]
pub struct Rotated {
    /// The key's new epoch.
    pub epoch: u64,
    /// The new key's fingerprint (public).
    pub fingerprint: String,
    /// The members given the key (peer ids), this node included.
    pub members: Vec<String>,
}

/// Why a rotation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    /// The cluster runs without a key.
    #[error("this cluster runs without a cluster key (--insecure): there is no key to rotate")]
    Insecure,
    /// Some live members did not take the key: nothing was switched.
    #[error(
        "key rotation to epoch {epoch} not done: {} member(s) did not take the new key ({}); \
         nothing was switched, retry (a retry offers a fresh key)",
        .missed.len(),
        .missed.join("; ")
    )]
    NotTaken {
        /// The epoch tried.
        epoch: u64,
        /// `name (peer id): why` of each member that did not take it.
        missed: Vec<String>,
    },
    /// The switch did not commit.
    #[error("key rotation to epoch {epoch}: the switch did not commit: {why}")]
    Switch {
        /// The epoch tried.
        epoch: u64,
        /// Why.
        why: String,
    },
    /// Another rotation switched first.
    #[error("key rotation to epoch {epoch}: another rotation switched the key first ({why}); run it again if a new key is still wanted")]
    Raced {
        /// The epoch tried.
        epoch: u64,
        /// What the state said.
        why: String,
    },
    /// The member view could not be read.
    #[error("reading the members: {0}")]
    Members(String),
}

/// Rotates the cluster's key (see the module doc): returns once every member it offered the
/// key to took it and the switch is committed.
pub async fn rotate(control: &ControlHandle) -> Result<Rotated, RotateError> {
    let ring = control.key_ring.clone().ok_or(RotateError::Insecure)?;
    let epoch = control.read(|s| s.key_epoch()) + 1;
    let (_, members) = control
        .node()
        .members()
        .await
        .map_err(|e| RotateError::Members(e.to_string()))?;
    let me = control.me().to_string();
    let targets: Vec<(libp2p::PeerId, String)> = control.read(|s| {
        members
            .iter()
            .filter(|m| matches!(m.state, State::Alive | State::Suspect))
            .filter(|m| !s.is_removed(&m.id.to_string()))
            .map(|m| (m.id, m.meta.name.clone()))
            .collect()
    });
    let text = identity::generate_cluster_key();
    let fingerprint = identity::parse_cluster_key(&text)
        .expect("a generated key parses")
        .fingerprint();
    let offers = targets.iter().map(|(peer, name)| {
        let (ring, text, fingerprint, me) = (&ring, &text, &fingerprint, &me);
        async move {
            let taken = if peer.to_string() == *me {
                ring.offer(epoch, text).map_err(|e| e.to_string())
            } else {
                offer(control, *peer, epoch, text).await
            };
            match taken {
                Ok(f) if f == *fingerprint => Ok(peer.to_string()),
                Ok(f) => Err(format!("{name} ({peer}): took a key with fingerprint {f}")),
                Err(why) => Err(format!("{name} ({peer}): {why}")),
            }
        }
    });
    let results = futures::future::join_all(offers).await;
    let (given, missed): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
    let given: Vec<String> = given.into_iter().map(Result::unwrap).collect();
    let missed: Vec<String> = missed.into_iter().map(|r| r.unwrap_err()).collect();
    if !missed.is_empty() {
        warn!(
            epoch,
            missed = missed.len(),
            "key rotation not switched: members did not take the key"
        );
        return Err(RotateError::NotTaken { epoch, missed });
    }
    let cmd = ControlCommand {
        op: Op::KeySwitch(ops::KeySwitch {
            epoch,
            fingerprint: fingerprint.clone(),
        }),
        at_ms: wall_ms(),
    };
    match control.propose(cmd).await {
        Ok(ControlResponse::Applied) => {
            info!(epoch, %fingerprint, members = given.len(), "cluster key rotated");
            Ok(Rotated {
                epoch,
                fingerprint,
                members: given,
            })
        }
        Ok(ControlResponse::Ignored { reason }) => Err(RotateError::Raced { epoch, why: reason }),
        Ok(other) => Err(RotateError::Switch {
            epoch,
            why: format!("{other:?}"),
        }),
        Err(e) => Err(RotateError::Switch {
            epoch,
            why: e.to_string(),
        }),
    }
}

/// Offers the key to `peer` in a call; its fingerprint as the peer computed it.
async fn offer(
    control: &ControlHandle,
    peer: libp2p::PeerId,
    epoch: u64,
    text: &str,
) -> Result<String, String> {
    let request = RpcRequest::KeyOffer {
        epoch,
        key: SecretText(text.to_string()),
    };
    let payload = wire::encode_json(&request).map_err(|e| e.to_string())?;
    let answer = control
        .node()
        .rpc(peer, payload)
        .await
        .map_err(|e| e.to_string())?;
    match wire::decode_json::<RpcResponse>(&answer) {
        Ok(RpcResponse::KeyTaken(taken)) => taken,
        Ok(RpcResponse::Malformed(why)) => Err(format!("refused the offer: {why}")),
        Ok(_) => Err("answered something else than the offer".into()),
        Err(e) => Err(format!("unreadable answer: {e}")),
    }
}

/// What [`follow`] changes on this node at a switch.
pub struct Follower {
    /// The node's key ring.
    pub ring: KeyRing,
    /// The tokens the API accepts (`None`: none is derived from the key).
    pub token: Option<Arc<ApiToken>>,
    /// `<data-dir>`, where `api.token` is written.
    pub data_dir: PathBuf,
    /// The pin the API's TLS key has (written beside the token).
    pub tls: Option<crate::security::tls::Fingerprint>,
}

/// Applies every key switch this replica applies (see the module doc): runs until the
/// control plane stops.
pub async fn follow(control: ControlHandle, f: Follower) {
    let mut applied = control.subscribe_applied();
    let mut told: Option<String> = None;
    loop {
        let wanted = control.read(|s| s.key.clone());
        if let Some(wanted) = wanted {
            match f.ring.switch_to(&wanted.fingerprint) {
                Ok(None) => {}
                Ok(Some((old, new))) => {
                    let (old_admin, new_admin) =
                        (bootstrap::admin_token(&old), bootstrap::admin_token(&new));
                    if let Some(token) = &f.token {
                        token.replace(&old_admin, &new_admin);
                    }
                    if let Err(e) = bootstrap::write_api_token(&f.data_dir, &new, f.tls) {
                        error!("the new admin token could not be written: {e:#}");
                    }
                    // A removed member's connections were keyed with the old key: closed,
                    // its redials need the new one.
                    let removed: Vec<libp2p::PeerId> =
                        control.read(|s| s.removed.keys().filter_map(|p| p.parse().ok()).collect());
                    control.node().disconnect(removed).await;
                    info!(epoch = wanted.epoch, fingerprint = %wanted.fingerprint, "switched to the rotated cluster key; the old admin token is refused from now on");
                }
                Err(e) => {
                    if told.as_deref() != Some(wanted.fingerprint.as_str()) {
                        error!(epoch = wanted.epoch, "{e}");
                        told = Some(wanted.fingerprint.clone());
                    }
                }
            }
        }
        if applied.changed().await.is_err() {
            return;
        }
    }
}
