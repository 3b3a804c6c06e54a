//! Membership configuration: one documented struct, validated at start-up.

use super::message::{PIECES_MAX, PIECE_MEMBERS_MAX};
use serde::{Deserialize, Serialize};

/// Tunables of the membership protocol. Every duration is in milliseconds of the driver's
/// monotonic clock; every count is a plain number. `Config::default()` is for real clusters
/// (tuned with [`super::sim`]), `Config::for_test()` shortens every timer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Time between two in-turn probes, before scaling by the local health score + 1
    /// (ms; default 250).
    pub probe_interval_ms: u64,
    /// How long to wait for a direct ack before asking others to probe indirectly, before
    /// scaling by the local health score + 1 (ms; default 150). The indirect phase gets the
    /// same time again, so a probe lasts `max(probe_interval, 2 · probe_timeout)`.
    pub probe_timeout_ms: u64,
    /// Members asked to probe indirectly (ping-req) when a direct probe times out (count;
    /// default 3).
    pub indirect_probes: usize,
    /// Lower bound of the suspicion timeout, in probe intervals, multiplied by
    /// `max(1, log10(n))` for a cluster of n members (count; default 2).
    pub suspicion_mult: u32,
    /// Upper bound of the suspicion timeout as a multiple of the lower bound (count;
    /// default 6). A suspicion starts at the upper bound and shrinks towards the lower bound
    /// as independent confirmations arrive (Lifeguard).
    pub suspicion_max_mult: u32,
    /// Independent confirmations (distinct members suspecting the same member) that bring
    /// the suspicion timeout down to its lower bound (count; default 3).
    pub suspicion_confirmations: u32,
    /// Time between two gossip rounds (ms; default 100).
    pub gossip_interval_ms: u64,
    /// Members each gossip round sends to (count; default 3).
    pub gossip_fanout: usize,
    /// Each update is retransmitted up to `retransmit_mult · ceil(log10(n + 1))` times
    /// (count; default 4).
    pub retransmit_mult: u32,
    /// Most updates piggybacked on one message; incoming messages carrying more are
    /// truncated to this (count; default 32).
    pub piggyback_max: usize,
    /// Time between two full-state syncs with a random alive member, scaled up
    /// logarithmically above 32 members as memberlist does (ms; default 15 000).
    pub push_pull_interval_ms: u64,
    /// Members in one state piece of a sync (count; default 256, at most
    /// [`PIECE_MEMBERS_MAX`]): a view of n members travels as `ceil(n / this)` messages,
    /// each well inside the driver's frame limit.
    pub push_pull_piece_members: usize,
    /// Time between two attempts to sync with a random dead (not left) member, so that the
    /// two sides of a healed partition merge; also the longest wait between two retries of
    /// the seeds while alone, which start one probe interval after the join (ms; default
    /// 2 000).
    pub reconnect_interval_ms: u64,
    /// How long dead and left members are remembered (tombstones) before being forgotten
    /// (ms; default 3 600 000 = 1 h).
    pub tombstone_ms: u64,
    /// Dead members keep receiving gossip this long after their death, so that a live one
    /// wrongly declared dead learns it and refutes (ms; default 30 000).
    pub gossip_to_dead_ms: u64,
    /// Highest Lifeguard local health score; probe interval and timeout are scaled by
    /// `score + 1` (count; default 8).
    pub awareness_max: u32,
    /// Most members remembered, tombstones included; updates about further unknown members
    /// are ignored and counted (count; default 16 384).
    pub members_max: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            probe_interval_ms: 250,
            probe_timeout_ms: 150,
            indirect_probes: 3,
            suspicion_mult: 2,
            suspicion_max_mult: 6,
            suspicion_confirmations: 3,
            gossip_interval_ms: 100,
            gossip_fanout: 3,
            retransmit_mult: 4,
            piggyback_max: 32,
            push_pull_interval_ms: 15_000,
            push_pull_piece_members: 256,
            reconnect_interval_ms: 2_000,
            tombstone_ms: 3_600_000,
            gossip_to_dead_ms: 30_000,
            awareness_max: 8,
            members_max: 16_384,
        }
    }
}

/// A configuration value that cannot work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The field must be greater than zero.
    Zero {
        /// Name of the field.
        field: &'static str,
    },
    /// The field is inconsistent with another one.
    Inconsistent {
        /// Name of the field.
        field: &'static str,
        /// What is wrong, lowercase.
        reason: &'static str,
    },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Zero { field } => write!(f, "membership config: {field} must be > 0"),
            ConfigError::Inconsistent { field, reason } => {
                write!(f, "membership config: {field}: {reason}")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Short timers for fast tests and simulations (probe every 50 ms).
    #[cfg(test)]
    pub fn for_test() -> Self {
        Self {
            probe_interval_ms: 50,
            probe_timeout_ms: 20,
            gossip_interval_ms: 20,
            push_pull_interval_ms: 2_000,
            reconnect_interval_ms: 300,
            tombstone_ms: 10_000,
            gossip_to_dead_ms: 3_000,
            ..Self::default()
        }
    }

    /// Checks that the values can work together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive: [(&'static str, u64); 13] = [
            ("probe_interval_ms", self.probe_interval_ms),
            ("probe_timeout_ms", self.probe_timeout_ms),
            ("suspicion_mult", self.suspicion_mult.into()),
            ("suspicion_max_mult", self.suspicion_max_mult.into()),
            ("gossip_interval_ms", self.gossip_interval_ms),
            ("gossip_fanout", self.gossip_fanout as u64),
            ("retransmit_mult", self.retransmit_mult.into()),
            ("piggyback_max", self.piggyback_max as u64),
            ("push_pull_interval_ms", self.push_pull_interval_ms),
            (
                "push_pull_piece_members",
                self.push_pull_piece_members as u64,
            ),
            ("reconnect_interval_ms", self.reconnect_interval_ms),
            ("tombstone_ms", self.tombstone_ms),
            ("members_max", self.members_max as u64),
        ];
        if let Some((field, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(ConfigError::Zero { field });
        }
        if self.members_max < 2 {
            return Err(ConfigError::Inconsistent {
                field: "members_max",
                reason: "must leave room for self and one other member",
            });
        }
        if self.push_pull_piece_members > PIECE_MEMBERS_MAX {
            return Err(ConfigError::Inconsistent {
                field: "push_pull_piece_members",
                reason: "must be at most PIECE_MEMBERS_MAX (1024), which receivers enforce",
            });
        }
        if self.members_max.div_ceil(self.push_pull_piece_members) > PIECES_MAX as usize {
            return Err(ConfigError::Inconsistent {
                field: "members_max",
                reason: "a full view must fit PIECES_MAX (1024) pieces of push_pull_piece_members",
            });
        }
        if self.gossip_to_dead_ms > self.tombstone_ms {
            return Err(ConfigError::Inconsistent {
                field: "gossip_to_dead_ms",
                reason: "must not exceed tombstone_ms",
            });
        }
        if self.awareness_max > 1_000 {
            return Err(ConfigError::Inconsistent {
                field: "awareness_max",
                reason: "must be at most 1000 (timers scale by it)",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_test_config_validate() {
        assert_eq!(Config::default().validate(), Ok(()));
        assert_eq!(Config::for_test().validate(), Ok(()));
    }

    #[test]
    fn validate_rejects_zero_and_inconsistent() {
        let c = Config {
            gossip_fanout: 0,
            ..Config::default()
        };
        assert_eq!(
            c.validate(),
            Err(ConfigError::Zero {
                field: "gossip_fanout"
            })
        );
        let c = Config {
            gossip_to_dead_ms: 10,
            tombstone_ms: 5,
            ..Config::default()
        };
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Inconsistent { .. })
        ));
    }
}
