//! Tests of `control::rpc`'s rules on what a peer may forward that need commands the chief
//! decides (`decide`'s placements, its tests' `submit`) or the job layer's admission
//! (`jobs::admit_forwarded`): they moved here from `control/rpc/tests.rs` when control became
//! a crate below the chief and the jobs.

use crate::{
    chief::{decide, tests as chief},
    cluster::membership::State,
    control::rpc::{
        authorize, authorize_principal, check_not_removed, check_user_limits, check_user_principal,
        PeerRefused,
    },
    domain::state::{
        ops, tokens::Principal, user_limits::OVER_LIMIT, ControlCommand, ControlState, JobId, Op,
    },
    jobs::admit_forwarded,
};

/// A rank's report of metric `loss` for job `id`'s `generation`.
fn metric(id: JobId, generation: u32, at_ms: u64) -> ControlCommand {
    ControlCommand {
        op: Op::Metric(ops::Metric {
            id,
            generation,
            name: "loss".into(),
            value: 1.0,
            step: None,
        }),
        at_ms,
    }
}

#[test]
fn members_forward_only_what_they_may_originate() {
    let mut state = ControlState::default();
    let id = chief::submit(&mut state, 1, 1);
    let members = vec![chief::member("a", State::Alive, 1)];
    let place = decide(&state, &members, 5, &mut || "ab".repeat(32));
    state.apply(2, &place[0]);
    let runner = members[0].id.to_string();
    let exited = ControlCommand {
        op: Op::WorkerExited(ops::WorkerExited {
            id,
            generation: 1,
            rank: 0,
            code: 0,
            end: None,
        }),
        at_ms: 1,
    };
    assert_eq!(authorize(&runner, &exited, &state, admit_forwarded), Ok(()));
    assert!(authorize("someone-else", &exited, &state, admit_forwarded).is_err());
    let stale = metric(id, 7, 1);
    assert!(authorize(&runner, &stale, &state, admit_forwarded).is_err());
    assert!(authorize(&runner, &place[0], &state, admit_forwarded)
        .unwrap_err()
        .contains("only the chief"));
    let cancel = ControlCommand {
        op: Op::Cancel(ops::Cancel { id }),
        at_ms: 1,
    };
    assert_eq!(
        authorize("anyone", &cancel, &state, admit_forwarded),
        Ok(())
    );
}

#[test]
fn only_a_report_naming_a_later_generation_waits_for_the_chief_to_catch_up() {
    let mut state = ControlState::default();
    let id = chief::submit(&mut state, 1, 1);
    let exited = |generation| ControlCommand {
        op: Op::WorkerExited(ops::WorkerExited {
            id,
            generation,
            rank: 0,
            code: 0,
            end: None,
        }),
        at_ms: 1,
    };
    // Not placed yet here (generation 0): the rank's node may have applied its placement
    // before this chief did.
    assert!(exited(1).origin().may_be_ahead(&state));
    let members = vec![chief::member("a", State::Alive, 1)];
    let place = decide(&state, &members, 5, &mut || "ab".repeat(32));
    state.apply(2, &place[0]);
    assert!(
        !exited(1).origin().may_be_ahead(&state),
        "current: judged as is"
    );
    assert!(exited(2).origin().may_be_ahead(&state));
    let mut later = ControlState::default();
    later.apply(1, &place[0]);
    assert!(
        exited(1).origin().may_be_ahead(&later),
        "a job not known here"
    );
    // A stale rank's report of an older generation, and what only a chief proposes, never
    // wait.
    let old = metric(id, 0, 1);
    assert!(!old.origin().may_be_ahead(&state));
    assert!(!place[0].origin().may_be_ahead(&state));
}

/// A user command needs the admin or a live token; token and member changes the admin;
/// a removed member is refused everything.
#[test]
fn forwarded_commands_carry_a_principal_the_state_still_accepts() {
    use crate::domain::state::tokens::new_token;
    let mut state = ControlState::default();
    let (_, hash) = new_token();
    let create = ControlCommand {
        op: Op::TokenCreate(ops::TokenCreate {
            name: "ci".into(),
            hash: hash.clone(),
            created_by: "admin".into(),
            user: None,
            role: crate::domain::state::users::Role::User,
        }),
        at_ms: 1,
    };
    assert_eq!(
        state.apply(1, &create),
        crate::domain::ControlResponse::Applied
    );
    let id = chief::submit(&mut state, 2, 1);
    let cancel = ControlCommand {
        op: Op::Cancel(ops::Cancel { id }),
        at_ms: 2,
    };
    let token = Principal::Token { hash: hash.clone() };
    let peer = libp2p::PeerId::random().to_string();
    assert_eq!(
        authorize_principal(&peer, &Principal::Admin, &cancel, &state),
        Ok(())
    );
    // The token's user is "ci": the admin's job is not its to cancel, its own is.
    let e = authorize_principal(&peer, &token, &cancel, &state).unwrap_err();
    assert!(
        e.contains(&format!("{id} belongs to admin; ci may not cancel it")),
        "{e}"
    );
    let own = ControlCommand::new(
        3,
        Op::Submit(ops::Submit {
            spec: state.job(id).unwrap().spec.clone().into(),
            token: None,
            owner: "ci".into(),
        }),
    );
    assert_eq!(authorize_principal(&peer, &token, &own, &state), Ok(()));
    let crate::domain::ControlResponse::Submitted { id: own_id } = state.apply(3, &own) else {
        panic!("not submitted")
    };
    let cancel_own = ControlCommand::new(4, Op::Cancel(ops::Cancel { id: own_id }));
    assert_eq!(
        authorize_principal(&peer, &token, &cancel_own, &state),
        Ok(())
    );
    // A token submits only as its own user.
    let as_admin = ControlCommand::new(
        3,
        Op::Submit(ops::Submit {
            spec: state.job(id).unwrap().spec.clone().into(),
            token: None,
            owner: "admin".into(),
        }),
    );
    let e = authorize_principal(&peer, &token, &as_admin, &state).unwrap_err();
    assert!(e.contains("ci may not act as admin"), "{e}");
    // An older node states no principal: served, as the key grants what the admin does.
    assert_eq!(
        authorize_principal(&peer, &Principal::Node, &cancel, &state),
        Ok(())
    );
    // A token may not make tokens or remove members.
    let e = authorize_principal(&peer, &token, &create, &state).unwrap_err();
    assert!(e.contains("only the admin"), "{e}");
    let remove = ControlCommand {
        op: Op::MemberRemove(ops::MemberRemove {
            peer_id: libp2p::PeerId::random().to_string(),
            name: "c".into(),
        }),
        at_ms: 3,
    };
    assert!(authorize_principal(&peer, &token, &remove, &state).is_err());
    assert_eq!(
        authorize_principal(&peer, &Principal::Admin, &remove, &state),
        Ok(())
    );
    // A node's own report needs no user principal.
    let report = metric(id, 0, 3);
    assert_eq!(
        authorize_principal(&peer, &Principal::Node, &report, &state),
        Ok(())
    );
    // Revoked between the follower's check and the chief's: refused.
    let revoke = ControlCommand {
        op: Op::TokenRevoke(ops::TokenRevoke { name: "ci".into() }),
        at_ms: 4,
    };
    let index = state.applied_index + 1;
    state.apply(index, &revoke);
    let e = authorize_principal(&peer, &token, &cancel_own, &state).unwrap_err();
    assert!(e.contains("revoked"), "{e}");
    assert!(check_user_principal(&token, &state).is_err());
    // A removed member: nothing, not even the admin's requests or its own reports.
    let gone = ControlCommand {
        op: Op::MemberRemove(ops::MemberRemove {
            peer_id: peer.clone(),
            name: "p".into(),
        }),
        at_ms: 5,
    };
    let index = state.applied_index + 1;
    state.apply(index, &gone);
    assert_eq!(
        check_not_removed(&peer, &state),
        Err(PeerRefused::Removed { peer: peer.clone() })
    );
    assert!(authorize_principal(&peer, &Principal::Admin, &cancel, &state).is_err());
    assert!(authorize_principal(&peer, &Principal::Node, &report, &state).is_err());
}

/// The chief holds a forwarded submit to its owner's limits in its own state (the
/// forwarding node's replica may not have seen the owner's latest submits); admins and
/// older nodes are not limited.
#[test]
fn a_forwarded_submit_is_held_to_its_owners_limits_in_the_chiefs_state() {
    use crate::domain::state::{tokens::new_token, user_limits::UserLimits, users::Role};
    let mut state = ControlState::default();
    let (_, hash) = new_token();
    let create = ControlCommand::new(
        1,
        Op::TokenCreate(ops::TokenCreate {
            name: "bob".into(),
            hash: hash.clone(),
            created_by: "admin".into(),
            user: None,
            role: Role::User,
        }),
    );
    state.apply(1, &create);
    let id = chief::submit(&mut state, 2, 1);
    let spec = state.job(id).unwrap().spec.clone();
    let submit = |owner: &str| {
        ControlCommand::new(
            3,
            Op::Submit(ops::Submit {
                spec: spec.clone().into(),
                token: None,
                owner: owner.into(),
            }),
        )
    };
    let one = UserLimits {
        pending_jobs_max: 1,
        spec_bytes_max: 0,
    };
    let bob = Principal::Token { hash };
    assert_eq!(
        check_user_limits(&bob, &submit("bob"), &state, &one),
        Ok(())
    );
    state.apply(3, &submit("bob"));
    let e = check_user_limits(&bob, &submit("bob"), &state, &one).unwrap_err();
    assert!(
        e.contains(OVER_LIMIT) && e.contains("bob has 1 jobs"),
        "{e}"
    );
    // The admin's own job counts for the admin, who is not limited.
    for p in [Principal::Admin, Principal::Node] {
        assert_eq!(
            check_user_limits(&p, &submit("admin"), &state, &one),
            Ok(())
        );
    }
}
