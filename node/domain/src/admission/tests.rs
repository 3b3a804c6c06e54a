use super::*;
use crate::state::ops::testing::set_quota;

fn spec(extra: &str, cpus: u32, gpus: u32, workers: u32) -> JobSpec {
    JobSpec::parse(&format!(
        "name = \"j\"\nkind = \"command\"\nworkers = {workers}\ncommand = [\"true\"]\n{extra}\n\
         [resources]\ncpus_per_worker = {cpus}\ngpus_per_worker = {gpus}\n"
    ))
    .unwrap()
}

fn sizes(members: &[(u32, u32)]) -> Vec<MemberSize> {
    members
        .iter()
        .map(|&(cpus, gpus)| MemberSize { cpus, gpus })
        .collect()
}

#[test]
fn a_priority_above_the_ceiling_is_refused_by_field() {
    let mut state = ControlState::default();
    let ceiling = Quota {
        max_priority: Some(priority::NORMAL),
        ..Quota::default()
    };
    set_quota(&mut state, "alice", ceiling);
    let high = spec("priority = \"high\"", 1, 0, 1);
    let (kind, field, problem) = refuse(&high, "alice", Role::User, &state, &[]).unwrap();
    assert_eq!((kind, field), (Refusal::Spec, "priority"));
    assert!(
        problem.contains("above alice's ceiling normal"),
        "{problem}"
    );
    assert_eq!(refuse(&high, "bob", Role::User, &state, &[]), None);
}

#[test]
fn a_job_no_member_could_ever_hold_is_refused_naming_the_field() {
    let state = ControlState::default();
    let members = sizes(&[(16, 1), (8, 1)]);
    let wide = spec("", 64, 0, 1);
    let (_, field, problem) = refuse(&wide, "bob", Role::User, &state, &members).unwrap();
    assert_eq!(field, "resources.cpus_per_worker");
    assert!(
        problem.contains("64 cpus per worker, but the largest member has 16"),
        "{problem}"
    );
    let two = spec("", 1, 2, 1);
    let (_, field, problem) = refuse(&two, "bob", Role::User, &state, &members).unwrap();
    assert_eq!(field, "resources.gpus_per_worker");
    assert!(problem.contains("no member has more than 1"), "{problem}");
    // Three GPU ranks on two members of one GPU each.
    let gang = spec("", 1, 1, 3);
    let (_, field, problem) = refuse(&gang, "bob", Role::User, &state, &members).unwrap();
    assert_eq!(field, "workers");
    assert!(problem.contains("all members together hold 2"), "{problem}");
    // Cpus: 16 + 8 hold three ranks of 8, not four; an elastic floor names min_workers.
    let cpus = spec("min_workers = 4", 8, 0, 6);
    let (_, field, problem) = refuse(&cpus, "bob", Role::User, &state, &members).unwrap();
    assert_eq!(field, "min_workers");
    assert!(
        problem.contains("4 ranks of 8 cpus, but all members together hold 3"),
        "{problem}"
    );
    // What fits the members whole is admitted, whatever runs now or the owner's quota.
    assert_eq!(
        refuse(&spec("", 8, 0, 3), "bob", Role::User, &state, &members),
        None
    );
    // Nothing known of the members yet: nothing refused for size.
    assert_eq!(refuse(&wide, "bob", Role::User, &state, &[]), None);
}

#[test]
fn only_admins_and_users_the_admin_allowed_may_refuse_preemption() {
    let mut state = ControlState::default();
    let firm = spec("preemptible = false", 1, 0, 1);
    let (kind, field, problem) = refuse(&firm, "alice", Role::User, &state, &[]).unwrap();
    assert_eq!((kind, field), (Refusal::Role, "preemptible"));
    assert!(
        problem.contains("alice may not refuse preemption")
            && problem.contains("--may-refuse-preemption true"),
        "{problem}"
    );
    assert_eq!(refuse(&firm, "root", Role::Admin, &state, &[]), None);
    // A quota record alone does not allow it; the admin's word does, until taken back.
    let allow = |may| Quota {
        may_refuse_preemption: Some(may),
        ..Quota::default()
    };
    set_quota(
        &mut state,
        "alice",
        Quota {
            cpus: Some(4),
            ..Quota::default()
        },
    );
    assert!(refuse(&firm, "alice", Role::User, &state, &[]).is_some());
    set_quota(&mut state, "alice", allow(true));
    assert_eq!(refuse(&firm, "alice", Role::User, &state, &[]), None);
    assert_eq!(state.quotas["alice"].cpus, Some(4), "other fields kept");
    set_quota(&mut state, "alice", allow(false));
    assert!(refuse(&firm, "alice", Role::User, &state, &[]).is_some());
    // A preemptible job needs no permission.
    assert_eq!(
        refuse(&spec("", 1, 0, 1), "bob", Role::User, &state, &[]),
        None
    );
}
