//! Tests of `rpc` (a sibling file: the module is long enough without them).

use super::*;
use crate::domain::state::{ops, Op};

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
