//! Freshness of membership datagrams: each carries the time it was sealed (inside the seal)
//! and a random nonce; a receiver takes one only when that time is within
//! [`REPLAY_WINDOW_MS`] of its own clock and the nonce was not seen within the window.
//!
//! A datagram captured on the network thus replays nowhere: not later (its time is outside
//! the window), not within the window (its nonce is remembered). The window is ±30 s: a
//! lab's hosts keep their clocks within milliseconds of each other by NTP, and a datagram is
//! a few milliseconds in flight. A host whose clock is off by more refuses every member's
//! datagrams (and they its), so it drifts out of the cluster; the node warns, naming the
//! skew it measured, so that the operator fixes the clock rather than the network.
//!
//! The cache of nonces is bounded ([`REPLAY_NONCES_MAX`]): when it is full the oldest nonce
//! is forgotten and every datagram sealed at or before that one's time is refused from then
//! on ("cannot tell": refused rather than believed), so no bound on memory opens a gap for
//! a replay. Sans-IO: the caller passes both clocks' readings.

use std::collections::{BTreeSet, HashSet};

/// How far a datagram's seal time may be from the receiver's clock, either way (ms).
pub const REPLAY_WINDOW_MS: u64 = 30_000;
/// Most nonces remembered (each about 40 bytes with its index): 2,000 datagrams a second
/// sustained over the whole window, far above what a member receives (a few dozen a second
/// at 128 members).
pub const REPLAY_NONCES_MAX: usize = 65_536;

/// Bytes of a datagram's nonce.
pub const NONCE_BYTES: usize = 12;

/// Why a datagram is not fresh.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    /// Sealed outside the window around this host's clock: `skew_ms` is its seal time less
    /// this host's time (positive: the sender's clock is ahead, or the datagram is from the
    /// future).
    #[error("sealed {skew_ms} ms from this host's clock, outside the replay window of ±{REPLAY_WINDOW_MS} ms (a clock off? check NTP on both hosts)")]
    Skewed {
        /// Seal time less this host's time (ms).
        skew_ms: i64,
    },
    /// Its nonce was seen within the window, or it was sealed no later than a nonce the
    /// full cache had to forget.
    #[error("a replay of a datagram seen before")]
    Replayed,
}

/// The nonces of the datagrams taken within the window, by seal time.
#[derive(Debug, Default)]
pub struct ReplayWindow {
    nonces: HashSet<[u8; NONCE_BYTES]>,
    by_time: BTreeSet<(u64, [u8; NONCE_BYTES])>,
    /// Datagrams sealed at or before this (ms) are refused: a nonce of theirs may have been
    /// forgotten to make room.
    floor_ms: u64,
}

impl ReplayWindow {
    /// An empty window.
    pub fn new() -> ReplayWindow {
        ReplayWindow::default()
    }

    /// Nonces remembered now.
    pub fn len(&self) -> usize {
        self.nonces.len()
    }

    /// Whether no nonce is remembered.
    pub fn is_empty(&self) -> bool {
        self.nonces.is_empty()
    }

    /// Takes a datagram sealed at `sent_ms` with `nonce`, received at `now_ms` (both wall
    /// clock, ms since the Unix epoch), or says why not. A datagram taken is remembered.
    pub fn admit(
        &mut self,
        now_ms: u64,
        sent_ms: u64,
        nonce: [u8; NONCE_BYTES],
    ) -> Result<(), Stale> {
        let skew_ms = sent_ms as i64 - now_ms as i64;
        if skew_ms.unsigned_abs() > REPLAY_WINDOW_MS {
            return Err(Stale::Skewed { skew_ms });
        }
        // Anything sealed before the window's start is refused by its time from now on.
        let start = now_ms.saturating_sub(REPLAY_WINDOW_MS);
        while let Some(&(at, old)) = self.by_time.first() {
            if at >= start {
                break;
            }
            self.by_time.pop_first();
            self.nonces.remove(&old);
        }
        if self.nonces.contains(&nonce) || sent_ms <= self.floor_ms {
            return Err(Stale::Replayed);
        }
        if self.nonces.len() >= REPLAY_NONCES_MAX {
            if let Some((at, old)) = self.by_time.pop_first() {
                self.nonces.remove(&old);
                self.floor_ms = self.floor_ms.max(at);
            }
            if sent_ms <= self.floor_ms {
                return Err(Stale::Replayed);
            }
        }
        self.nonces.insert(nonce);
        self.by_time.insert((sent_ms, nonce));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn nonce(i: u32) -> [u8; NONCE_BYTES] {
        let mut n = [0; NONCE_BYTES];
        n[..4].copy_from_slice(&i.to_le_bytes());
        n
    }

    #[test]
    fn a_datagram_is_taken_once_and_only_within_the_window() {
        let mut w = ReplayWindow::new();
        assert_eq!(w.admit(NOW, NOW - 5, nonce(1)), Ok(()));
        assert_eq!(w.admit(NOW + 10, NOW - 5, nonce(1)), Err(Stale::Replayed));
        // Either side of the window, by the skew measured.
        assert_eq!(
            w.admit(NOW, NOW - REPLAY_WINDOW_MS - 1, nonce(2)),
            Err(Stale::Skewed {
                skew_ms: -(REPLAY_WINDOW_MS as i64) - 1
            })
        );
        assert_eq!(
            w.admit(NOW, NOW + 45_000, nonce(3)),
            Err(Stale::Skewed { skew_ms: 45_000 })
        );
        assert_eq!(w.admit(NOW, NOW + REPLAY_WINDOW_MS, nonce(3)), Ok(()));
        // Once the window has passed, the first is refused by its time, and forgotten.
        assert_eq!(
            w.admit(NOW + REPLAY_WINDOW_MS + 6, NOW - 5, nonce(1)),
            Err(Stale::Skewed {
                skew_ms: -(REPLAY_WINDOW_MS as i64) - 11
            })
        );
        assert_eq!(
            w.admit(NOW + REPLAY_WINDOW_MS + 6, NOW + REPLAY_WINDOW_MS, nonce(4)),
            Ok(())
        );
        assert_eq!(w.len(), 2, "nonces outside the window are forgotten");
    }

    #[test]
    fn a_full_cache_refuses_what_it_can_no_longer_tell() {
        let mut w = ReplayWindow::new();
        for i in 0..REPLAY_NONCES_MAX as u32 {
            assert_eq!(
                w.admit(NOW, NOW - 20_000 + u64::from(i % 1000), nonce(i)),
                Ok(())
            );
        }
        assert_eq!(w.len(), REPLAY_NONCES_MAX);
        // A newer one is taken, the oldest forgotten: a replay of that one is refused by
        // its time, and so is anything sealed as early.
        let oldest = nonce(0);
        assert_eq!(w.admit(NOW, NOW, nonce(u32::MAX)), Ok(()));
        assert_eq!(w.len(), REPLAY_NONCES_MAX);
        assert_eq!(w.admit(NOW, NOW - 20_000, oldest), Err(Stale::Replayed));
        assert_eq!(
            w.admit(NOW, NOW - 20_000, nonce(u32::MAX - 1)),
            Err(Stale::Replayed)
        );
        assert_eq!(w.admit(NOW, NOW - 1, nonce(u32::MAX - 2)), Ok(()));
    }
}
