//! A rank's log rate cap: a token bucket over the bytes a rank's output adds to its log, so a
//! rank printing without pause (50 MB of junk) costs its node little and fills no disk.
//!
//! Contract:
//! - an ordinary line is written when the bucket holds its bytes (plus its newline), else
//!   dropped and counted;
//! - a protocol line (stdout, starting with [`PROTOCOL_PREFIX`]: metrics, heartbeats, rank
//!   stats, reports) is always written and always parsed; it is counted against the bucket,
//!   which may go below zero (down to minus one burst) so that a flood of them throttles the
//!   ordinary lines after it;
//! - an ordinary line written after some were dropped is preceded by one note saying how
//!   many bytes and lines were dropped ([`Dropped::note`]), at most one note per
//!   [`DROP_NOTE_INTERVAL_MS`], each charged [`NOTE_BYTES`]; what is still counted when the
//!   process ends is noted then.
//!
//! Pure: the time comes in as an argument.

/// Default cap on the bytes a rank adds to its log per second (the node's hidden
/// `--rank-log-bytes-per-s`; 0: no cap).
pub const RANK_LOG_BYTES_PER_S_MAX: u64 = 1_000_000;
/// The bucket's depth, in seconds at the cap: a burst of output this long is kept whole.
pub const RANK_LOG_BURST_S: u64 = 4;
/// Shortest gap between two notes of dropped output, in milliseconds.
pub const DROP_NOTE_INTERVAL_MS: u64 = 1_000;
/// Bytes a note is charged (about its length).
pub const NOTE_BYTES: i64 = 128;
/// The prefix of the lines the node parses from a rank's stdout.
pub const PROTOCOL_PREFIX: &[u8] = ringleader_protocol::PREFIX.as_bytes();

/// What the cap decided for one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Write the line, after a note of what was dropped before it, if anything was.
    Write(Option<Dropped>),
    /// Drop the line (it is counted).
    Drop,
}

/// Output dropped since the last note.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Bytes, newlines included.
    pub bytes: u64,
    /// Lines (or pieces of an overlong line).
    pub lines: u64,
}

impl Dropped {
    /// The line written to the log in their place.
    pub fn note(&self, bytes_per_s: u64) -> String {
        format!(
            "ringleader: log rate cap ({bytes_per_s} bytes/s): dropped {} bytes in {} lines",
            self.bytes, self.lines
        )
    }
}

/// One rank's token bucket (shared by its stdout and stderr).
#[derive(Debug)]
pub struct LogRate {
    /// The cap, bytes per second (0: none).
    bytes_per_s: u64,
    /// The bucket's depth, bytes.
    burst_bytes: i64,
    /// Bytes that may be written now (below zero after a flood of protocol lines).
    tokens: i64,
    /// When the bucket was last refilled, ms.
    last_ms: u64,
    /// Sub-byte refill carried over (bytes × 1000 / s units), so slow refills add up.
    carry: u64,
    dropped: Dropped,
    /// When the last note was written, ms.
    last_note_ms: Option<u64>,
}

impl LogRate {
    /// A full bucket for a cap of `bytes_per_s` (0: none), at time `now_ms`.
    pub fn new(bytes_per_s: u64, now_ms: u64) -> Self {
        let burst = bytes_per_s
            .saturating_mul(RANK_LOG_BURST_S)
            .min(i64::MAX as u64) as i64;
        LogRate {
            bytes_per_s,
            burst_bytes: burst,
            tokens: burst,
            last_ms: now_ms,
            carry: 0,
            dropped: Dropped::default(),
            last_note_ms: None,
        }
    }

    /// The cap, bytes per second (0: none).
    pub fn bytes_per_s(&self) -> u64 {
        self.bytes_per_s
    }

    /// Whether a line (its bytes without the newline) of a rank's output is written at
    /// `now_ms`; `protocol` lines always are.
    pub fn admit(&mut self, now_ms: u64, line_bytes: usize, protocol: bool) -> Verdict {
        if self.bytes_per_s == 0 {
            return Verdict::Write(None);
        }
        self.refill(now_ms);
        let cost = (line_bytes as i64).saturating_add(1);
        if protocol {
            self.tokens = self.tokens.saturating_sub(cost).max(-self.burst_bytes);
            return Verdict::Write(None);
        }
        if self.tokens < cost {
            self.dropped.bytes = self.dropped.bytes.saturating_add(cost as u64);
            self.dropped.lines = self.dropped.lines.saturating_add(1);
            return Verdict::Drop;
        }
        self.tokens -= cost;
        let note_due = self.dropped.lines > 0
            && self
                .last_note_ms
                .is_none_or(|t| now_ms.saturating_sub(t) >= DROP_NOTE_INTERVAL_MS);
        if !note_due {
            return Verdict::Write(None);
        }
        self.last_note_ms = Some(now_ms);
        self.tokens = (self.tokens - NOTE_BYTES).max(-self.burst_bytes);
        Verdict::Write(self.take_dropped())
    }

    /// What was dropped since the last note, if anything (the counts start again).
    pub fn take_dropped(&mut self) -> Option<Dropped> {
        (self.dropped.lines > 0).then(|| std::mem::take(&mut self.dropped))
    }

    fn refill(&mut self, now_ms: u64) {
        let elapsed_ms = now_ms.saturating_sub(self.last_ms);
        self.last_ms = self.last_ms.max(now_ms);
        let milli_bytes = self
            .bytes_per_s
            .saturating_mul(elapsed_ms)
            .saturating_add(self.carry);
        self.carry = milli_bytes % 1000;
        let add = (milli_bytes / 1000).min(i64::MAX as u64) as i64;
        self.tokens = self.tokens.saturating_add(add).min(self.burst_bytes);
    }
}

/// Whether a piece of a rank's output is a protocol line: a whole line (not the rest of an
/// overlong one) from stdout that starts with [`PROTOCOL_PREFIX`].
pub fn is_protocol(line: &[u8], is_stdout: bool, continuation: bool) -> bool {
    is_stdout && !continuation && line.starts_with(PROTOCOL_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_rate_holds_and_a_note_follows() {
        let mut r = LogRate::new(1_000, 0);
        // The burst: 4 s at 1000 bytes/s, 99 bytes + newline a line.
        let burst = (0..100)
            .filter(|_| r.admit(0, 99, false) != Verdict::Drop)
            .count();
        assert_eq!(burst, 40);
        assert_eq!(r.admit(0, 99, false), Verdict::Drop);
        // 100 ms later: 100 bytes more, one line, preceded by the note of the 61 dropped.
        assert_eq!(
            r.admit(100, 99, false),
            Verdict::Write(Some(Dropped {
                bytes: 6_100,
                lines: 61
            }))
        );
        assert_eq!(r.admit(100, 99, false), Verdict::Drop);
        assert_eq!(
            r.take_dropped(),
            Some(Dropped {
                bytes: 100,
                lines: 1
            })
        );
        assert_eq!(r.take_dropped(), None);
        // Over 10 s the bytes written stay within rate × time + burst.
        let mut written = 0u64;
        for ms in 200..10_200 {
            if let Verdict::Write(_) = r.admit(ms, 49, false) {
                written += 50;
            }
        }
        assert!(written <= 10_000 + 4_000, "{written}");
        assert!(written >= 8_000, "{written}");
    }

    #[test]
    fn protocol_lines_are_always_kept_and_throttle_what_follows() {
        let mut r = LogRate::new(1_000, 0);
        for i in 0..10_000u64 {
            assert_eq!(r.admit(i / 100, 60, true), Verdict::Write(None), "line {i}");
        }
        // The bucket went below zero (bounded): ordinary lines wait until it refills.
        assert_eq!(r.admit(100, 10, false), Verdict::Drop);
        assert_eq!(
            r.admit(8_200, 10, false),
            Verdict::Write(Some(Dropped {
                bytes: 11,
                lines: 1
            }))
        );
    }

    #[test]
    fn no_cap_writes_everything_and_slow_refills_add_up() {
        let mut open = LogRate::new(0, 0);
        assert!((0..1_000).all(|_| open.admit(0, 1 << 16, false) == Verdict::Write(None)));
        let mut slow = LogRate::new(3, 0);
        while slow.admit(0, 0, false) != Verdict::Drop {}
        slow.take_dropped();
        // 3 bytes/s refilled a millisecond at a time still gives 3 bytes a second (the
        // drops cleared each time, so that no note is charged).
        let mut kept = 0;
        for ms in 1..=1_000 {
            if let Verdict::Write(_) = slow.admit(ms, 0, false) {
                kept += 1;
            }
            slow.take_dropped();
        }
        assert_eq!(kept, 3);
    }

    #[test]
    fn only_whole_stdout_lines_with_the_prefix_are_protocol() {
        assert!(is_protocol(b"ringleader-metric loss 1", true, false));
        assert!(!is_protocol(b"ringleader-metric loss 1", false, false));
        assert!(!is_protocol(b"ringleader-metric loss 1", true, true));
        assert!(!is_protocol(b"junk ringleader-metric", true, false));
    }
}
