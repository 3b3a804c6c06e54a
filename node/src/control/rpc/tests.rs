//! Tests of `rpc` (a sibling file: the module is long enough without them).

use super::*;
use crate::{
    chief::{decide, tests as chief},
    cluster::membership::State,
    domain::state::{ops, Op},
    jobs::admit_forwarded,
};

/// A membership of voters `voters` and learners `learners`, each a peer id string.
fn membership(voters: &[&str], learners: &[&str]) -> Membership<NodeId, RaftNode> {
    let node = |p: &&str| {
        (
            node_id_of(p),
            RaftNode {
                peer_id: p.to_string(),
                name: p.to_string(),
            },
        )
    };
    let nodes: std::collections::BTreeMap<_, _> = voters.iter().chain(learners).map(node).collect();
    let voter_ids: std::collections::BTreeSet<_> = voters.iter().map(|p| node_id_of(p)).collect();
    Membership::new(vec![voter_ids], nodes)
}

fn vote_from(candidate: &str, last_log: Option<u64>) -> VoteRequest<NodeId> {
    VoteRequest {
        vote: openraft::Vote::new(3, node_id_of(candidate)),
        last_log_id: last_log
            .map(|i| openraft::LogId::new(openraft::CommittedLeaderId::new(2, 0), i)),
    }
}

fn append_from(leader: &str, prev: Option<u64>) -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        vote: openraft::Vote::new_committed(3, node_id_of(leader)),
        prev_log_id: prev.map(|i| openraft::LogId::new(openraft::CommittedLeaderId::new(3, 0), i)),
        entries: vec![],
        leader_commit: None,
    }
}

/// A vote request only from the candidate it names; append-entries and snapshots only
/// from the leader they name; all only from a voter or learner.
#[test]
fn raft_messages_only_from_the_node_they_name_and_only_from_members() {
    let m = membership(&["a", "b"], &["c"]);
    let ours = Some(10);
    let (named, log) = vote_sender(&vote_from("a", Some(10)));
    assert_eq!(
        check_raft_sender(RaftRpc::Vote, "a", named, log, &m, ours),
        Ok(())
    );
    // b speaks for a: refused, naming both.
    let err = check_raft_sender(RaftRpc::Vote, "b", named, log, &m, ours).unwrap_err();
    assert_eq!(
        err,
        PeerRefused::NotTheNamedNode {
            rpc: RaftRpc::Vote,
            named: Some(node_id_of("a")),
            sender: node_id_of("b"),
        }
    );
    assert!(err.to_string().contains("candidate"), "{err}");
    // A learner's heartbeat as leader of its own: it is a member, so heard (Raft
    // decides); an outsider with a log no longer than ours is not.
    let (named, log) = append_sender(&append_from("c", Some(9)));
    assert_eq!(
        check_raft_sender(RaftRpc::AppendEntries, "c", named, log, &m, ours),
        Ok(())
    );
    let (named, log) = append_sender(&append_from("x", Some(10)));
    let err = check_raft_sender(RaftRpc::AppendEntries, "x", named, log, &m, ours).unwrap_err();
    assert!(
        matches!(
            err,
            PeerRefused::NotAMember {
                rpc: RaftRpc::AppendEntries,
                ..
            }
        ),
        "{err}"
    );
    let (named, log) = vote_sender(&vote_from("x", Some(3)));
    assert!(check_raft_sender(RaftRpc::Vote, "x", named, log, &m, ours).is_err());
    // A leader naming another leader than itself.
    let (named, log) = append_sender(&append_from("a", Some(10)));
    assert!(matches!(
        check_raft_sender(RaftRpc::AppendEntries, "b", named, log, &m, ours),
        Err(PeerRefused::NotTheNamedNode { .. })
    ));
}

/// A node joining (empty membership) hears its leader; a lagging node hears a leader
/// added by an entry it has not received yet (the leader's log is past its own).
#[test]
fn joining_and_lagging_nodes_still_hear_their_leader() {
    let empty = membership(&[], &[]);
    let (named, log) = append_sender(&append_from("leader", None));
    assert_eq!(
        check_raft_sender(RaftRpc::AppendEntries, "leader", named, log, &empty, None),
        Ok(())
    );
    // Even when joining, nobody may speak for another node.
    assert!(check_raft_sender(RaftRpc::AppendEntries, "other", named, log, &empty, None).is_err());
    let old = membership(&["a", "b", "c"], &[]);
    let (named, log) = append_sender(&append_from("d", Some(40)));
    assert_eq!(
        check_raft_sender(RaftRpc::AppendEntries, "d", named, log, &old, Some(12)),
        Ok(())
    );
    let (named, log) = vote_sender(&vote_from("d", Some(40)));
    assert_eq!(
        check_raft_sender(RaftRpc::Vote, "d", named, log, &old, Some(12)),
        Ok(())
    );
    // A member's peer id must match the one recorded for its node id.
    let mut forged = membership(&["a"], &[]);
    let (named, log) = vote_sender(&vote_from("a", Some(1)));
    assert_eq!(
        check_raft_sender(RaftRpc::Vote, "a", named, log, &forged, Some(1)),
        Ok(())
    );
    forged = Membership::new(
        vec![[node_id_of("a")].into_iter().collect()],
        [(
            node_id_of("a"),
            RaftNode {
                peer_id: "not-a".into(),
                name: "a".into(),
            },
        )]
        .into_iter()
        .collect::<std::collections::BTreeMap<_, _>>(),
    );
    assert!(check_raft_sender(RaftRpc::Vote, "a", named, log, &forged, Some(1)).is_err());
}

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

/// An older node's requests (no principal) still decode: a log read as `Node`.
#[test]
fn requests_without_a_principal_still_decode() {
    let old = br#"{"Logs":{"job":"j-1","generation":1,"worker":0,"offset":0}}"#;
    match crate::cluster::wire::decode_json::<RpcRequest>(old) {
        Ok(RpcRequest::Logs { principal, .. }) => assert_eq!(principal, Principal::Node),
        other => panic!("{other:?}"),
    }
    let new = RpcRequest::ProposeAs {
        command: ControlCommand {
            op: Op::TokenRevoke(ops::TokenRevoke { name: "ci".into() }),
            at_ms: 1,
        },
        principal: Principal::Admin,
    };
    let bytes = crate::cluster::wire::encode_json(&new).unwrap();
    assert!(matches!(
        crate::cluster::wire::decode_json::<RpcRequest>(&bytes),
        Ok(RpcRequest::ProposeAs {
            principal: Principal::Admin,
            ..
        })
    ));
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
