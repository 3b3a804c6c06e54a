//! The quota registry: per user (and per group, named `@GROUP`) what the scheduler
//! guarantees and allows, as plain replicated data.
//!
//! `ringleader quota set USER [--cpus N] [--gpus N] [--borrow-cpus N] [--borrow-gpus N]
//! [--gpu-hours H] [--weight W] [--max-priority P] [--group G]
//! [--may-refuse-preemption true|false]` proposes [`Op::QuotaSet`](crate::state::Op::QuotaSet)
//! (admin only): the fields it gives replace the user's, the others stay. What they mean
//! (enforced by `chief::scheduler`, a pure function of this registry and the jobs):
//!
//! - `cpus`, `gpus`: the user's nominal quota. Running ranks up to it are the user's own;
//!   above it they are *borrowed*: taken from capacity that no quota claims, or that a
//!   quota claims but its owner does not use now, and the first taken back.
//! - `borrow_cpus`, `borrow_gpus`: most the user may borrow above its quota; unset, any idle
//!   capacity; `0`, none. A user with no quota borrows everything it runs (quota 0).
//! - `gpu_hours`: a rolling budget over [`GPU_HOURS_WINDOW_MS`]; once spent, the user's
//!   new GPU jobs wait with that reason.
//! - `weight`: the user's weight in fair share (default 1): waiting jobs of users with the
//!   smaller dominant share per weight go first, at equal priority.
//! - `max_priority`: the highest `priority` the user may submit with (unset: any).
//! - `group`: the group whose quota (the record named `@GROUP`) the user's ranks also count
//!   against.
//! - `may_refuse_preemption`: the user may submit `preemptible = false` (unset: no; an
//!   admin always may; see `domain::admission`).
//!
//! Invariant: at most [`QUOTAS_MAX`] records; names follow `tokens::check_token_name` (a
//! group's after its `@`); every set field is within its bound ([`Quota::check`]).

use serde::{Deserialize, Serialize};

use super::{rejected, tokens::check_token_name, ControlResponse, ControlState};
use crate::spec::priority::PRIORITY_MAX;

/// Most quota records (users and groups).
pub const QUOTAS_MAX: usize = 1_000;
/// Largest cpu or gpu count a quota or borrow limit may name.
pub const QUOTA_UNITS_MAX: u32 = 1_000_000;
/// Largest fair-share weight.
pub const WEIGHT_MAX: u32 = 1_000;
/// Largest GPU-hours budget.
pub const GPU_HOURS_MAX: f64 = 10_000_000.0;
/// The window a GPU-hours budget rolls over, in milliseconds (7 days).
pub const GPU_HOURS_WINDOW_MS: u64 = 7 * 86_400_000;
/// The prefix that makes a quota record's name a group's.
pub const GROUP_PREFIX: char = '@';

/// One user's (or group's) quota; a field left unset has the meaning the module doc gives.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// Nominal cpus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// Nominal GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// Most cpus borrowed above `cpus` (unset: any idle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow_cpus: Option<u32>,
    /// Most GPUs borrowed above `gpus` (unset: any idle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow_gpus: Option<u32>,
    /// GPU-hours budget over [`GPU_HOURS_WINDOW_MS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_hours: Option<f64>,
    /// Fair-share weight (unset: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Highest priority the user may submit with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_priority: Option<u32>,
    /// The group whose quota the user's ranks count against too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Whether the user may submit `preemptible = false` (unset: no).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub may_refuse_preemption: Option<bool>,
}

impl Quota {
    /// Fair-share weight: 1 unless set.
    pub fn weight(&self) -> u32 {
        self.weight.unwrap_or(1).max(1)
    }

    /// Whether the admin allowed the user to submit `preemptible = false`.
    pub fn refuses_preemption(&self) -> bool {
        self.may_refuse_preemption == Some(true)
    }

    /// `self` with every field `patch` sets replaced.
    pub fn merged(&self, patch: &Quota) -> Quota {
        Quota {
            cpus: patch.cpus.or(self.cpus),
            gpus: patch.gpus.or(self.gpus),
            borrow_cpus: patch.borrow_cpus.or(self.borrow_cpus),
            borrow_gpus: patch.borrow_gpus.or(self.borrow_gpus),
            gpu_hours: patch.gpu_hours.or(self.gpu_hours),
            weight: patch.weight.or(self.weight),
            max_priority: patch.max_priority.or(self.max_priority),
            group: patch.group.clone().or_else(|| self.group.clone()),
            may_refuse_preemption: patch.may_refuse_preemption.or(self.may_refuse_preemption),
        }
    }

    /// Every set field within its bound, named when not.
    pub fn check(&self) -> Result<(), String> {
        let units = [
            ("cpus", self.cpus),
            ("gpus", self.gpus),
            ("borrow_cpus", self.borrow_cpus),
            ("borrow_gpus", self.borrow_gpus),
        ];
        for (field, v) in units {
            if let Some(n) = v.filter(|n| *n > QUOTA_UNITS_MAX) {
                return Err(format!(
                    "{field}: must be at most {QUOTA_UNITS_MAX}, got {n}"
                ));
            }
        }
        if let Some(h) = self.gpu_hours {
            if !h.is_finite() || !(0.0..=GPU_HOURS_MAX).contains(&h) {
                return Err(format!("gpu_hours: must be 0 to {GPU_HOURS_MAX}, got {h}"));
            }
        }
        if let Some(w) = self.weight {
            if !(1..=WEIGHT_MAX).contains(&w) {
                return Err(format!("weight: must be 1 to {WEIGHT_MAX}, got {w}"));
            }
        }
        if let Some(p) = self.max_priority.filter(|p| *p > PRIORITY_MAX) {
            return Err(format!(
                "max_priority: must be at most {PRIORITY_MAX}, got {p}"
            ));
        }
        if let Some(g) = &self.group {
            check_token_name(g).map_err(|e| format!("group: {e}"))?;
        }
        Ok(())
    }
}

/// A quota record's name: a user's (`check_token_name`'s rule) or `@` and a group's.
pub fn check_quota_name(name: &str) -> Result<(), String> {
    let bare = name.strip_prefix(GROUP_PREFIX).unwrap_or(name);
    check_token_name(bare).map_err(|e| format!("user: {e}"))
}

impl ControlState {
    /// Applies `QuotaSet` (the command is checked: name and fields well formed).
    pub(super) fn quota_set(&mut self, user: &str, patch: &Quota) -> ControlResponse {
        if !self.quotas.contains_key(user) && self.quotas.len() >= QUOTAS_MAX {
            return rejected(format!("at most {QUOTAS_MAX} quota records"));
        }
        let merged = self
            .quotas
            .get(user)
            .cloned()
            .unwrap_or_default()
            .merged(patch);
        self.quotas.insert(user.to_owned(), merged);
        ControlResponse::Applied
    }

    /// The highest priority `user` may submit with, if the admin set one.
    pub fn max_priority_of(&self, user: &str) -> Option<u32> {
        self.quotas.get(user).and_then(|q| q.max_priority)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ops, ControlCommand, Op};

    fn set(state: &mut ControlState, index: u64, user: &str, quota: Quota) -> ControlResponse {
        state.apply(
            index,
            &ControlCommand::new(
                1,
                Op::QuotaSet(ops::QuotaSet {
                    user: user.into(),
                    quota,
                }),
            ),
        )
    }

    #[test]
    fn a_set_replaces_the_fields_it_gives_and_keeps_the_others() {
        let mut s = ControlState::default();
        let first = Quota {
            cpus: Some(4),
            weight: Some(2),
            ..Quota::default()
        };
        assert_eq!(set(&mut s, 1, "alice", first), ControlResponse::Applied);
        let second = Quota {
            cpus: Some(8),
            borrow_cpus: Some(0),
            ..Quota::default()
        };
        assert_eq!(set(&mut s, 2, "alice", second), ControlResponse::Applied);
        let q = &s.quotas["alice"];
        assert_eq!((q.cpus, q.borrow_cpus, q.weight()), (Some(8), Some(0), 2));
    }

    #[test]
    fn bad_fields_and_names_are_rejected_by_name() {
        let mut s = ControlState::default();
        let r = set(
            &mut s,
            1,
            "alice",
            Quota {
                weight: Some(0),
                ..Quota::default()
            },
        );
        assert!(matches!(r, ControlResponse::Rejected { reason } if reason.contains("weight")));
        let r = set(&mut s, 2, "no one", Quota::default());
        assert!(matches!(r, ControlResponse::Rejected { reason } if reason.contains("user")));
        let r = set(
            &mut s,
            3,
            "@lab",
            Quota {
                gpus: Some(8),
                ..Quota::default()
            },
        );
        assert_eq!(r, ControlResponse::Applied);
        assert!(s.quotas.contains_key("@lab"));
    }

    #[test]
    fn the_log_form_reads_back_and_leaves_unset_fields_out() {
        let cmd = ControlCommand::new(
            7,
            Op::QuotaSet(ops::QuotaSet {
                user: "bob".into(),
                quota: Quota {
                    gpu_hours: Some(40.0),
                    ..Quota::default()
                },
            }),
        );
        let text = serde_json::to_string(&cmd).unwrap();
        assert_eq!(
            text,
            r#"{"op":"quota_set","user":"bob","quota":{"gpu_hours":40.0},"at_ms":7}"#
        );
        assert_eq!(serde_json::from_str::<ControlCommand>(&text).unwrap(), cmd);
    }
}
