//! The replicated commands, one file each: a command's struct (its fields as the log holds
//! them), its [`Command::check`] (what the log format and `apply` need, checked by
//! proposers and again by every replica), its [`Command::apply`] (what it changes in the
//! [`ControlState`]), its [`Command::origin`] (who may propose it) and its unit tests. As
//! openraft's `engine/handler/*`: a new command is a new file and a variant of [`Op`].
//!
//! [`Op::command`] is the one place that lists every variant; everything else asks the
//! command through the trait. Rules shared by several commands stay with what they share:
//! a placement's slots (`check_slots`), a job's attempt and generation guards
//! (`ControlState::current_attempt`, `ControlState::next_generation`), a search's trials
//! (`state::trials`), the registries (`state::datasets`, `state::tokens`, …).
//!
//! Format: `Op` is internally tagged (`op`), and a newtype variant of a struct writes the
//! same JSON object a struct variant did (the tag, then the struct's fields), so logs and
//! snapshots keep their bytes (`node/tests/control_format.rs` pins them).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::{BadCommand, ControlResponse, ControlState, Slot, RING_SECRET_HEX_LEN};
use crate::spec::{GPUS_PER_WORKER_MAX, WORKERS_MAX};

mod attempt_failed;
mod blacklist;
mod cancel;
mod compact;
mod dataset_add;
mod dataset_remove;
mod grow;
mod key_switch;
mod member_remove;
mod metric;
mod origin;
mod place;
mod preempt;
mod quota_set;
mod rank_lost;
mod rank_stats;
mod reform;
mod search_finished;
mod standby;
mod standby_dropped;
mod standby_ready;
mod submit;
mod token_create;
mod token_revoke;
mod trial_copy;
mod trial_promote;
mod trial_report;
mod trial_start;
mod unplaceable;
mod worker_exited;
mod worker_note;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use self::{
    attempt_failed::AttemptFailed,
    blacklist::Blacklist,
    cancel::Cancel,
    compact::Compact,
    dataset_add::DatasetAdd,
    dataset_remove::DatasetRemove,
    grow::Grow,
    key_switch::KeySwitch,
    member_remove::MemberRemove,
    metric::{Metric, STEP_METRIC},
    origin::Origin,
    place::Place,
    preempt::Preempt,
    quota_set::QuotaSet,
    rank_lost::RankLost,
    rank_stats::RankStats,
    reform::Reform,
    search_finished::SearchFinished,
    standby::Standby,
    standby_dropped::StandbyDropped,
    standby_ready::StandbyReady,
    submit::Submit,
    token_create::TokenCreate,
    token_revoke::TokenRevoke,
    trial_copy::TrialCopy,
    trial_promote::TrialPromote,
    trial_report::TrialReport,
    trial_start::TrialStart,
    unplaceable::Unplaceable,
    worker_exited::WorkerExited,
    worker_note::WorkerNote,
};

/// What a [`ControlCommand`](super::ControlCommand) changes: one variant per command, each
/// a struct in a file of its own (see the module doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum Op {
    /// A new job.
    Submit(Submit),
    /// The chief placed a pending job's next generation.
    Place(Place),
    /// The chief could not place a pending job.
    Unplaceable(Unplaceable),
    /// A rank's process exited.
    WorkerExited(WorkerExited),
    /// The current attempt failed as a whole.
    AttemptFailed(AttemptFailed),
    /// Latest value of a metric of a running generation.
    Metric(Metric),
    /// The chief re-formed a running elastic job's ring.
    Reform(Reform),
    /// A rank is lost although its member lives.
    RankLost(RankLost),
    /// The chief starts a joiner ahead of the re-form that takes it in.
    Standby(Standby),
    /// A standby rank is ready.
    StandbyReady(StandbyReady),
    /// A standby will not join.
    StandbyDropped(StandbyDropped),
    /// A rank's step timing.
    RankStats(RankStats),
    /// The chief blacklists a member.
    Blacklist(Blacklist),
    /// A user cancels a job.
    Cancel(Cancel),
    /// A preemption of one job, whole (see `state::preempt`).
    Preempt(Preempt),
    /// A shrunk elastic ring may grow again (see `state::preempt`).
    Grow(Grow),
    /// The chief starts a search's next trial.
    TrialStart(TrialStart),
    /// The chief promotes a paused trial.
    TrialPromote(TrialPromote),
    /// The chief starts a speculative copy of a slow trial.
    TrialCopy(TrialCopy),
    /// A trial's run reported the search's metric.
    TrialReport(TrialReport),
    /// The chief ends a search.
    SearchFinished(SearchFinished),
    /// A rank says something worth the job's history.
    WorkerNote(WorkerNote),
    /// The chief drops ended jobs past the retention from the live state.
    Compact(Compact),
    /// A dataset is registered.
    DatasetAdd(DatasetAdd),
    /// A dataset's name is removed.
    DatasetRemove(DatasetRemove),
    /// The admin makes an API token.
    TokenCreate(TokenCreate),
    /// The admin revokes an API token.
    TokenRevoke(TokenRevoke),
    /// The admin removes a member for good.
    MemberRemove(MemberRemove),
    /// The admin's key rotation.
    KeySwitch(KeySwitch),
    /// The admin sets a user's quota.
    QuotaSet(QuotaSet),
}

impl Op {
    /// The command inside: the one place that lists every variant.
    pub fn command(&self) -> &dyn Command {
        match self {
            Op::Submit(c) => c,
            Op::Place(c) => c,
            Op::Unplaceable(c) => c,
            Op::WorkerExited(c) => c,
            Op::AttemptFailed(c) => c,
            Op::Metric(c) => c,
            Op::Reform(c) => c,
            Op::RankLost(c) => c,
            Op::Standby(c) => c,
            Op::StandbyReady(c) => c,
            Op::StandbyDropped(c) => c,
            Op::RankStats(c) => c,
            Op::Blacklist(c) => c,
            Op::Cancel(c) => c,
            Op::Preempt(c) => c,
            Op::Grow(c) => c,
            Op::TrialStart(c) => c,
            Op::TrialPromote(c) => c,
            Op::TrialCopy(c) => c,
            Op::TrialReport(c) => c,
            Op::SearchFinished(c) => c,
            Op::WorkerNote(c) => c,
            Op::Compact(c) => c,
            Op::DatasetAdd(c) => c,
            Op::DatasetRemove(c) => c,
            Op::TokenCreate(c) => c,
            Op::TokenRevoke(c) => c,
            Op::MemberRemove(c) => c,
            Op::KeySwitch(c) => c,
            Op::QuotaSet(c) => c,
        }
    }
}

/// Where a command sits in the log: its entry's index and its proposer's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The entry's log index (a new job's id comes from it).
    pub log_index: u64,
    /// The proposer's clock, ms since the Unix epoch.
    pub at_ms: u64,
}

/// One replicated command: its rules in one place.
pub trait Command {
    /// What the log format and [`Command::apply`] need of the command alone; proposers call
    /// it before proposing, and every replica again before applying (a refused command is
    /// `Rejected` and changes nothing).
    fn check(&self) -> Result<(), BadCommand> {
        Ok(())
    }

    /// Applies the checked command committed at `at` to `state`. Deterministic: reads
    /// nothing but its arguments; never panics (a command the state does not allow is
    /// `Rejected`, a stale report `Ignored`).
    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse;

    /// Who may propose it (asked by the control layer of a forwarded command).
    fn origin(&self) -> Origin<'_>;
}

/// The check every placement shares (`Place`, `Reform`, `TrialStart`, `TrialPromote`,
/// `TrialCopy`): ranks `0..n` in order and at most [`WORKERS_MAX`], at most
/// [`GPUS_PER_WORKER_MAX`] GPUs a slot and no GPU of a member twice, a secret of
/// [`RING_SECRET_HEX_LEN`] lowercase hex digits.
fn check_slots(slots: &[Slot], secret: &str) -> Result<(), BadCommand> {
    let ordered = slots.iter().enumerate().all(|(i, s)| s.rank as usize == i);
    if slots.is_empty() || slots.len() > WORKERS_MAX as usize || !ordered {
        return Err(BadCommand::Slots);
    }
    let mut given = BTreeSet::new();
    let gpus_ok = slots.iter().all(|s| {
        s.gpus.len() <= GPUS_PER_WORKER_MAX as usize
            && s.gpus.iter().all(|g| given.insert((s.member.as_str(), *g)))
    });
    if !gpus_ok {
        return Err(BadCommand::Gpus);
    }
    let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    if secret.len() != RING_SECRET_HEX_LEN || !secret.chars().all(hex) {
        return Err(BadCommand::Secret);
    }
    Ok(())
}

/// Serde for an `f64` that may be non-finite: JSON has no NaN or infinity, and serde_json
/// would write `null` and then fail to read it back. Non-finite values are written as `null`
/// and read back as NaN.
mod finite_or_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else {
            s.serialize_none()
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ControlCommand, JobId};

    /// A newtype variant of a struct writes the object a struct variant wrote: the tag,
    /// the struct's fields in order, then the command's `at_ms`; and reads it back.
    #[test]
    fn a_command_keeps_its_json_line() {
        let id = JobId::from_log_index(1);
        let lines = [
            (
                Op::Cancel(Cancel { id }),
                r#"{"op":"cancel","id":"j-1","at_ms":7}"#,
            ),
            (
                Op::Metric(Metric {
                    id,
                    generation: 2,
                    name: "loss".into(),
                    value: 0.5,
                    step: None,
                }),
                r#"{"op":"metric","id":"j-1","generation":2,"name":"loss","value":0.5,"step":null,"at_ms":7}"#,
            ),
            (
                Op::WorkerNote(WorkerNote {
                    id,
                    generation: 1,
                    rank: 0,
                    message: "m".into(),
                    cannot_start: false,
                }),
                r#"{"op":"worker_note","id":"j-1","generation":1,"rank":0,"message":"m","at_ms":7}"#,
            ),
        ];
        for (op, line) in lines {
            let cmd = ControlCommand::new(7, op);
            assert_eq!(serde_json::to_string(&cmd).unwrap(), line);
            assert_eq!(serde_json::from_str::<ControlCommand>(line).unwrap(), cmd);
        }
    }

    /// The control layer asks a command who may propose it: users', ranks', standbys' and
    /// the chief's commands each say so.
    #[test]
    fn each_command_names_its_origin() {
        let id = JobId::from_log_index(1);
        assert_eq!(
            Op::Cancel(Cancel { id }).command().origin().user_command(),
            Some("cancel")
        );
        let revoke = Op::TokenRevoke(TokenRevoke { name: "ci".into() });
        assert!(revoke.command().origin().admin_only());
        let report = TrialReport {
            id,
            generation: 3,
            resource: 1,
            value: 0.5,
        };
        assert_eq!(
            report.origin(),
            Origin::Rank {
                id,
                generation: 3,
                rank: Some(0)
            }
        );
        assert_eq!(SearchFinished { search: id }.origin(), Origin::Chief);
    }
}
