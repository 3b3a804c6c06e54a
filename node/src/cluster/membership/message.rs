//! Wire messages. Decoding (with a size limit) is the driver's job; the core never
//! allocates from lengths found in a message and truncates what it receives to its limits.

use super::member::Update;
use serde::{Deserialize, Serialize};

/// A membership message. Every variant carries piggybacked updates (at most
/// `Config::piggyback_max` are sent and honoured); push-pull carries a full state of at
/// most the sender's member count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Message<I, M> {
    /// Direct probe; answered by `Ack` with the same `seq`. `target` is the id the sender
    /// means to reach: a receiver with another id ignores it.
    Ping {
        /// Sender-chosen sequence number.
        seq: u64,
        /// Intended receiver.
        target: I,
        /// Piggybacked updates.
        updates: Vec<Update<I, M>>,
    },
    /// Answer to `Ping`, or an indirect ack forwarded by the member asked by `PingReq`.
    Ack {
        /// The `seq` of the ping (or ping-req) answered.
        seq: u64,
        /// Piggybacked updates.
        updates: Vec<Update<I, M>>,
    },
    /// Asks the receiver to probe `target` and forward its ack (or send `Nack` when none
    /// comes in time).
    PingReq {
        /// Sender-chosen sequence number, echoed in the `Ack` or `Nack`.
        seq: u64,
        /// Member to probe.
        target: I,
        /// Piggybacked updates.
        updates: Vec<Update<I, M>>,
    },
    /// The receiver of a `PingReq` got no ack from the target in time (Lifeguard). Tells
    /// the prober that its own links work, so missing nacks mean the prober is unwell.
    Nack {
        /// The `seq` of the ping-req.
        seq: u64,
        /// Piggybacked updates.
        updates: Vec<Update<I, M>>,
    },
    /// A gossip round: updates only.
    Gossip {
        /// Piggybacked updates.
        updates: Vec<Update<I, M>>,
    },
    /// Full-state sync request (anti-entropy, join, reconnect); answered by
    /// `PushPullReply`.
    PushPull {
        /// Sent as part of a join.
        join: bool,
        /// The sender's full state (tombstones included).
        members: Vec<Update<I, M>>,
    },
    /// Answer to `PushPull`: the receiver's full state after merging the request.
    PushPullReply {
        /// The replier's full state (tombstones included).
        members: Vec<Update<I, M>>,
    },
}

impl<I, M> Message<I, M> {
    /// Short lowercase name for logs and counters.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Ping { .. } => "ping",
            Message::Ack { .. } => "ack",
            Message::PingReq { .. } => "ping-req",
            Message::Nack { .. } => "nack",
            Message::Gossip { .. } => "gossip",
            Message::PushPull { .. } => "push-pull",
            Message::PushPullReply { .. } => "push-pull-reply",
        }
    }

    /// The updates the message carries (piggybacked or full state).
    pub fn updates(&self) -> &[Update<I, M>] {
        match self {
            Message::Ping { updates, .. }
            | Message::Ack { updates, .. }
            | Message::PingReq { updates, .. }
            | Message::Nack { updates, .. }
            | Message::Gossip { updates } => updates,
            Message::PushPull { members, .. } | Message::PushPullReply { members } => members,
        }
    }
}
