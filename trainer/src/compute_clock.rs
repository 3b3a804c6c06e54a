//! How long a worker's training thread has been inside one compute section (a forward or
//! backward pass, with no await inside): the progress heartbeat that tells a rank stuck in
//! its own computation (a deadlock, an endless loop) from ranks waiting for it on the
//! network, which are never inside a compute section.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};
use std::time::{SystemTime, UNIX_EPOCH};

/// A cheap, cloneable clock: [`ComputeClock::enter`] marks the start of a compute section,
/// its guard the end; [`ComputeClock::computing_ms`] reads it from any thread.
#[derive(Clone, Debug, Default)]
pub struct ComputeClock {
    /// When the current section started (ms since the Unix epoch), 0 outside one.
    since_ms: Arc<AtomicU64>,
}

/// Ends a compute section when dropped.
#[derive(Debug)]
pub struct ComputeSection {
    since_ms: Arc<AtomicU64>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_millis().max(1) as u64)
}

impl ComputeClock {
    /// Starts a compute section; it ends when the returned guard drops.
    pub fn enter(&self) -> ComputeSection {
        self.since_ms.store(now_ms(), Ordering::Relaxed);
        ComputeSection {
            since_ms: self.since_ms.clone(),
        }
    }

    /// How long the current compute section has run, ms; 0 outside one.
    pub fn computing_ms(&self) -> u64 {
        match self.since_ms.load(Ordering::Relaxed) {
            0 => 0,
            since => now_ms().saturating_sub(since),
        }
    }
}

impl Drop for ComputeSection {
    fn drop(&mut self) {
        self.since_ms.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_counts_until_its_guard_drops() {
        let clock = ComputeClock::default();
        assert_eq!(clock.computing_ms(), 0);
        let section = clock.clone().enter();
        clock.since_ms.fetch_sub(1_500, Ordering::Relaxed);
        assert!(clock.computing_ms() >= 1_500);
        drop(section);
        assert_eq!(clock.computing_ms(), 0);
    }
}
