//! The node's own request budget, beside each peer IP's ([`super::server::RateLimiter`]):
//! at most [`ApiBudget::rate_per_s`] requests a second in all (bursts of
//! [`ApiBudget::burst`]) and at most [`ApiBudget::in_flight_max`] being answered at once.
//!
//! Why: a per-IP budget is one per address a client can send from, and a local client has
//! the whole of 127.0.0.0/8 (the review made its requests from several 127.0.0.x); the
//! node's work has to be bounded whatever the addresses. A request over the node's rate
//! gets `429`, one over its concurrency `503`, both at once, before the router runs; the
//! per-IP budget is taken first, so one noisy peer empties its own bucket before the
//! node's.
//!
//! Pure counting (time comes in as an argument) behind a lock and an atomic: no I/O.

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc, Mutex,
};

/// Default node-wide rate, requests per second: four peers' worth at the per-IP default.
pub const API_REQUESTS_TOTAL_PER_S: u16 = 2_000;
/// Default node-wide burst, requests.
pub const API_REQUESTS_TOTAL_BURST: u16 = 4_000;
/// Default most requests being answered at once (below the connection cap, 512: every
/// connection may be open, not every one busy).
pub const API_REQUESTS_IN_FLIGHT_MAX: u16 = 256;

/// Why a request is over the node's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OverBudget {
    /// The node's rate.
    #[error("too many requests to this node from all peers together: at most {rate_per_s} per second (bursts of {burst})")]
    Rate {
        /// The rate.
        rate_per_s: u32,
        /// The burst.
        burst: u32,
    },
    /// The node's concurrency.
    #[error("too many requests being answered on this node at once: at most {max}; retry")]
    Busy {
        /// The cap.
        max: usize,
    },
}

/// The node's request budget.
#[derive(Debug)]
pub struct ApiBudget {
    /// Requests a second in all (0: no limit).
    pub rate_per_s: u32,
    /// Requests at once after a quiet spell.
    pub burst: u32,
    /// Requests being answered at once (0: no limit).
    pub in_flight_max: usize,
    bucket: Mutex<TokenBucket>,
    in_flight: Arc<AtomicUsize>,
}

impl ApiBudget {
    /// A full budget at `now_ms`.
    pub fn new(rate_per_s: u32, burst: u32, in_flight_max: usize, now_ms: u64) -> ApiBudget {
        let burst = burst.max(1);
        ApiBudget {
            rate_per_s,
            burst,
            in_flight_max,
            bucket: Mutex::new(TokenBucket::full(burst, now_ms)),
            in_flight: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Takes a request's share at `now_ms`: a token of the node's rate and a place among
    /// the requests answered at once, held until the [`InFlight`] drops.
    pub fn admit(&self, now_ms: u64) -> Result<InFlight, OverBudget> {
        // Counted first, so that two requests at once cannot both take the last place (a
        // refused one gives its place back as its guard drops).
        let place = InFlight(self.in_flight.clone());
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= self.in_flight_max
            && self.in_flight_max > 0
        {
            return Err(OverBudget::Busy {
                max: self.in_flight_max,
            });
        }
        if self.rate_per_s > 0
            && !self
                .bucket
                .lock()
                .expect("budget lock")
                .take(now_ms, self.rate_per_s, self.burst)
        {
            return Err(OverBudget::Rate {
                rate_per_s: self.rate_per_s,
                burst: self.burst,
            });
        }
        Ok(place)
    }
}

/// A request being answered, counted until dropped.
#[derive(Debug)]
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request allowance (one peer's, or the node's): `burst` tokens refilled at
/// `rate_per_s`; a request takes one. Invariant: `0 <= tokens <= burst`.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    tokens: f64,
    last_ms: u64,
}

impl TokenBucket {
    /// A full bucket at `now_ms`.
    pub fn full(burst: u32, now_ms: u64) -> Self {
        TokenBucket {
            tokens: f64::from(burst),
            last_ms: now_ms,
        }
    }

    fn refill(&mut self, now_ms: u64, rate_per_s: u32, burst: u32) {
        let elapsed_ms = now_ms.saturating_sub(self.last_ms);
        self.tokens = (self.tokens + elapsed_ms as f64 * f64::from(rate_per_s) / 1_000.0)
            .min(f64::from(burst));
        self.last_ms = self.last_ms.max(now_ms);
    }

    /// Takes a token at `now_ms` if there is one.
    pub fn take(&mut self, now_ms: u64, rate_per_s: u32, burst: u32) -> bool {
        self.refill(now_ms, rate_per_s, burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whether the bucket is full again at `now_ms` (the same as having no bucket).
    pub fn is_full(&self, now_ms: u64, rate_per_s: u32, burst: u32) -> bool {
        let mut b = self.clone();
        b.refill(now_ms, rate_per_s, burst);
        b.tokens >= f64::from(burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_budget_caps_the_rate_of_all_peers_and_what_runs_at_once() {
        let b = ApiBudget::new(10, 3, 2, 0);
        let one = b.admit(0).unwrap();
        let two = b.admit(0).unwrap();
        assert_eq!(b.admit(0).unwrap_err(), OverBudget::Busy { max: 2 });
        drop(one);
        drop(two);
        let _three = b.admit(0).unwrap();
        let e = b.admit(0).unwrap_err();
        assert_eq!(
            e,
            OverBudget::Rate {
                rate_per_s: 10,
                burst: 3
            },
            "the burst of 3 is spent"
        );
        assert!(e.to_string().contains("all peers together"), "{e}");
        assert!(b.admit(100).is_ok(), "refilled at 10 a second");
        let open = ApiBudget::new(0, 0, 0, 0);
        let held: Vec<_> = (0..1_000).map(|_| open.admit(0).unwrap()).collect();
        assert_eq!(held.len(), 1_000, "0: no limit");
    }
}
