//! What the commands' unit tests share: a job pending or running in a fresh state, built
//! by the commands themselves.

use super::{Command, Place, Stamp, Submit};
use crate::spec::JobSpec;
use crate::state::{ControlResponse, ControlState, JobId, Slot};

/// Sets `user`'s quota fields that `quota` gives, as the admin's `quota set` does.
pub fn set_quota(state: &mut ControlState, user: &str, quota: crate::state::quotas::Quota) {
    let cmd = crate::state::ControlCommand::new(
        1,
        crate::state::Op::QuotaSet(super::QuotaSet {
            user: user.into(),
            quota,
        }),
    );
    assert_eq!(
        state.apply(state.applied_index + 1, &cmd),
        ControlResponse::Applied
    );
}

/// A placement secret of the right form.
pub fn secret() -> String {
    "ab".repeat(32)
}

/// Ranks `0..n`, one per member `id-<rank>`, without GPUs.
pub fn slots(n: u32) -> Vec<Slot> {
    (0..n)
        .map(|r| Slot {
            member: format!("id-{r}"),
            name: format!("m{r}"),
            rank: r,
            local_rank: 0,
            worker: r,
            gpus: Vec::new(),
        })
        .collect()
}

/// A command job of `workers` that may restart `max_restarts` times.
pub fn spec(workers: u32, max_restarts: u32) -> JobSpec {
    JobSpec::parse(&format!(
        "name = \"t\"\nkind = \"command\"\nworkers = {workers}\nmax_restarts = {max_restarts}\ncommand = [\"true\"]\n"
    ))
    .unwrap()
}

/// A command at the proposer's time `at_ms` (its log index matters only to commands that
/// make a job).
pub fn at(at_ms: u64) -> Stamp {
    Stamp {
        log_index: 1_000,
        at_ms,
    }
}

/// A state holding one pending job of `workers` (elastic down to `min_workers`), id j-1.
pub fn pending(workers: u32, min_workers: u32) -> (ControlState, JobId) {
    let mut state = ControlState::default();
    let text = format!(
        "name = \"t\"\nkind = \"command\"\nworkers = {workers}\nmin_workers = {min_workers}\ncommand = [\"true\"]\n"
    );
    let submit = Submit {
        spec: Box::new(JobSpec::parse(&text).unwrap()),
        token: None,
        owner: crate::state::users::admin_user(),
    };
    let r = submit.apply(
        &mut state,
        Stamp {
            log_index: 1,
            at_ms: 5,
        },
    );
    assert_eq!(
        r,
        ControlResponse::Submitted {
            id: JobId::from_log_index(1)
        }
    );
    (state, JobId::from_log_index(1))
}

/// As [`pending`], placed as generation 1.
pub fn running(workers: u32, min_workers: u32) -> (ControlState, JobId) {
    let (mut state, id) = pending(workers, min_workers);
    let place = Place {
        id,
        generation: 1,
        slots: slots(workers),
        secret: secret(),
    };
    assert_eq!(place.apply(&mut state, at(6)), ControlResponse::Applied);
    (state, id)
}
