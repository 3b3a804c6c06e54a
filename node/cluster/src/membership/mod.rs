//! Gossip membership: who is in the cluster, who is alive, and what each member
//! advertises.
//!
//! SWIM (Das et al. 2002) with HashiCorp memberlist's practical pieces and Lifeguard's
//! refinements (Dadgar et al. 2018), written as a sans-IO state machine:
//!
//! - **Probing.** Every `probe_interval_ms` a node pings the next member of a shuffled
//!   round-robin list; without an ack within `probe_timeout_ms` it asks `indirect_probes`
//!   others to ping it (ping-req) and forward the ack or send a nack; without any ack by
//!   the end of the probe the member becomes *suspect*, unless nobody answered at all (no
//!   nack either, the direct send not failed): such a silent probe accuses this node more
//!   than its target, and suspects nobody while at most
//!   [`core::SILENT_PROBES_TOLERATED`] come in a row. The driver's
//!   [`Event::Unreachable`] starts a probe at once.
//! - **Suspicion.** A suspect is declared *dead* when its suspicion times out; the
//!   timeout starts at `suspicion_max_mult ·` min and falls towards
//!   `min = suspicion_mult · max(1, log10 n) · probe_interval` as independent members
//!   confirm it (Lifeguard).
//! - **Incarnations.** Only a member raises its own incarnation: to refute a suspicion
//!   or death (it hears it, bumps above it, gossips alive) or to leave. Every claim
//!   carries its subject's signature of that incarnation ([`claims`]), so nobody else can
//!   raise it, say that a member left, or accuse it above what it signed. Precedence:
//!   alive(i) beats suspect/dead/left(< i); suspect(i) beats alive(≤ i); dead/left(i)
//!   beat alive/suspect(≤ i); left is final for its incarnation.
//! - **Dissemination.** Updates are piggybacked on every message (newest and least sent
//!   first, each up to `retransmit_mult · ceil(log10(n + 1))` times), plus a gossip
//!   round every `gossip_interval_ms`, a push-pull sync every `push_pull_interval_ms`,
//!   and a push-pull with a random dead member every `reconnect_interval_ms` so healed
//!   partitions merge.
//! - **Sync in bounded pieces.** A push-pull carries only a digest of the sender's view;
//!   a receiver whose view differs answers with its view in state pieces of at most
//!   `push_pull_piece_members` members, and the requester sends its own back. Each piece
//!   merges on its own (precedence makes the order irrelevant), so no message grows with
//!   the cluster and 10 000 members sync in 40 pieces; pieces past the protocol's limits
//!   are refused whole ([`message::MessageError`]).
//! - **Local health.** A score that rises on missed nacks, failed probes and refuted
//!   suspicions of self, and falls on acks, scales this node's probe timers so that a
//!   starved node does not accuse healthy ones.
//!
//! The driver owns sockets and the clock: it feeds [`Event`]s into
//! [`Membership::handle`] with the current time, performs the returned [`Action`]s, and
//! calls `handle(now, Event::Tick)` by [`Membership::next_wakeup_ms`]. [`sim`] runs many
//! members over an in-memory network with virtual time.

mod broadcast;
pub mod claims;
pub mod config;
pub mod core;
mod hash;
pub mod member;
pub mod message;
pub mod sim;

pub use self::claims::{Claim, ModelSigner, Signer};
pub use self::config::{Config, ConfigError};
pub use self::core::{suspicion_timeout_ms, Action, Event, Membership, Stats};
pub use self::member::{Member, Metadata, NodeId, State, Update};
pub use self::message::Message;
