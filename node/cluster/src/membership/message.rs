//! Wire messages. Decoding (with a size limit) is the driver's job; the core never
//! allocates from lengths found in a message, truncates piggybacked updates to its limits
//! and refuses a state piece that breaks the protocol's limits ([`Message::check`]).
//!
//! A full state never travels in one message: a push-pull request carries only a digest
//! of the sender's view, and a view travels as [`Message::StatePiece`]s of at most
//! [`PIECE_MEMBERS_MAX`] members each, every piece merged on its own as it arrives (the
//! merge is by precedence, so pieces converge in any order, lost ones are made good by
//! the next sync).

use super::member::Update;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Most members one state piece may carry, whatever the sender's configuration (count).
/// With the node's metadata (at most about 1.3 KB a member) a piece stays under 1.5 MB.
pub const PIECE_MEMBERS_MAX: usize = 1_024;
/// Most pieces one state may be cut into (count): `members_max` of 16 384 at the smallest
/// useful piece of 16 members.
pub const PIECES_MAX: u32 = 1_024;

/// A message that breaks the protocol's limits; the receiver refuses it whole.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum MessageError {
    /// A state piece carries more members than [`PIECE_MEMBERS_MAX`].
    #[error("state piece carries {members} members, over the limit of {limit}")]
    PieceTooLarge {
        /// Members in the piece.
        members: usize,
        /// [`PIECE_MEMBERS_MAX`].
        limit: usize,
    },
    /// A state claims more pieces than [`PIECES_MAX`], or none.
    #[error("state in {pieces} pieces, outside 1..={limit}")]
    PieceCount {
        /// Pieces claimed.
        pieces: u32,
        /// [`PIECES_MAX`].
        limit: u32,
    },
    /// A piece's index is not below the piece count.
    #[error("state piece {piece} of {pieces}: index out of range")]
    PieceIndex {
        /// Index claimed.
        piece: u32,
        /// Pieces claimed.
        pieces: u32,
    },
}

/// A membership message. Every variant but [`Message::StatePiece`] carries piggybacked
/// updates (at most `Config::piggyback_max` are sent and honoured); a state piece carries
/// at most [`PIECE_MEMBERS_MAX`] members.
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
    /// State sync request (anti-entropy, join, reconnect): the digest of the sender's
    /// view. A receiver whose view has another digest answers with its view in
    /// [`Message::StatePiece`]s (`answer: true`), and the requester sends its own back on
    /// the first of them; equal digests end the sync with nothing sent.
    PushPull {
        /// Sent as part of a join.
        join: bool,
        /// The digest of the sender's view (`Membership::digest`).
        digest: u64,
    },
    /// One bounded piece of a member's full view (tombstones included), merged on its own.
    StatePiece {
        /// Sent in answer to a `PushPull`: the receiver sends its own view back on piece 0.
        answer: bool,
        /// Index of this piece, `0..pieces`.
        piece: u32,
        /// Pieces the view was cut into.
        pieces: u32,
        /// At most [`PIECE_MEMBERS_MAX`] members.
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
            Message::StatePiece { .. } => "state-piece",
        }
    }

    /// Checks the protocol's limits on a state piece (other messages always pass: their
    /// piggybacked updates are truncated on receipt instead).
    pub fn check(&self) -> Result<(), MessageError> {
        let Message::StatePiece {
            piece,
            pieces,
            members,
            ..
        } = self
        else {
            return Ok(());
        };
        if members.len() > PIECE_MEMBERS_MAX {
            return Err(MessageError::PieceTooLarge {
                members: members.len(),
                limit: PIECE_MEMBERS_MAX,
            });
        }
        if *pieces == 0 || *pieces > PIECES_MAX {
            return Err(MessageError::PieceCount {
                pieces: *pieces,
                limit: PIECES_MAX,
            });
        }
        if piece >= pieces {
            return Err(MessageError::PieceIndex {
                piece: *piece,
                pieces: *pieces,
            });
        }
        Ok(())
    }

    /// Takes the piggybacked updates off the message (a push-pull and a state piece carry
    /// none: a state piece's members are its content, and stay).
    pub fn take_updates(&mut self) -> Vec<Update<I, M>> {
        match self {
            Message::Ping { updates, .. }
            | Message::Ack { updates, .. }
            | Message::PingReq { updates, .. }
            | Message::Nack { updates, .. }
            | Message::Gossip { updates } => std::mem::take(updates),
            Message::PushPull { .. } | Message::StatePiece { .. } => Vec::new(),
        }
    }

    /// The updates the message carries (piggybacked or a state piece).
    pub fn updates(&self) -> &[Update<I, M>] {
        match self {
            Message::Ping { updates, .. }
            | Message::Ack { updates, .. }
            | Message::PingReq { updates, .. }
            | Message::Nack { updates, .. }
            | Message::Gossip { updates } => updates,
            Message::PushPull { .. } => &[],
            Message::StatePiece { members, .. } => members,
        }
    }
}
