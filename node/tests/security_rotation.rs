//! Issue 47, point 3: a removed host is shut out by rotating the key. Real nodes on
//! 127.0.0.1: four form a cluster, `member remove` takes one out, `key rotate` gives the
//! other three a new key; then the removed host, restarted with its old key file,
//! can neither join nor have a datagram sealed with the old key accepted, and the old admin
//! token is refused (401) on every member; the members stay healthy and run a job.
//!
//! Before the rotation existed (the review's finding), the removed host's old key still
//! dialed the swarm, sealed datagrams every member opened (a forged `Dead` claim evicted a
//! member), and its derived admin token was accepted by every node's API.
//!
//! The removed node runs with its own copy of the key file (as a separate host would), the
//! others share the cluster's; waits poll with deadlines; nodes are stopped by PID when the
//! cluster is dropped.

use std::time::Duration;

mod common;

use common::{fails, ok, poll_until, wait_formed, wait_job};
use ringleader::{
    api::{auth::TokenFileText, client::ApiClient},
    cli::local::LocalCluster,
    cluster::{
        claim_keys,
        datagrams::{advertised_addrs, Seal},
        identity::{load_cluster_key, ClusterKey},
        membership::{Claim, Message, State, Update},
        meta::NodeMeta,
        wire,
    },
    security::bootstrap::API_TOKEN_FILE,
};

/// Bound on formation, replication and placement (a debug build on two loaded cores).
const WAIT: Duration = Duration::from_secs(120);
/// The overlap the nodes run with (`--key-overlap-ms`): short, so the test sees its end.
const OVERLAP_MS: u64 = 2_000;

/// Node `i`'s admin token as its `api.token` says now.
fn token_file(c: &LocalCluster, i: usize) -> String {
    let text = std::fs::read_to_string(c.nodes[i].dir.join(API_TOKEN_FILE)).unwrap();
    text.parse::<TokenFileText>().unwrap().token
}

/// A gossip datagram from `sender`, sealed with `key`, carrying `updates`.
fn gossip(
    key: &ClusterKey,
    sender: libp2p::PeerId,
    updates: Vec<Update<libp2p::PeerId, NodeMeta>>,
) -> Vec<u8> {
    let msg: Message<libp2p::PeerId, NodeMeta> = Message::Gossip { updates };
    Seal::new(Some(key), &sender).seal(&wire::encode(&msg).unwrap())
}

/// Gossip from a member that does not exist, sealed with `key`: `ghost` alive, signed with
/// its own identity (as a real member's claim is).
fn ghost_alive(key: &ClusterKey, ghost: &libp2p::identity::Keypair) -> Vec<u8> {
    let id = ghost.public().to_peer_id();
    let mut alive = Update {
        id,
        incarnation: 1,
        state: State::Alive,
        meta: common::ghost_meta("ghost"),
        meta_version: 1,
        from: None,
        sig: Vec::new(),
    };
    alive.sig = claim_keys::sign(ghost, &Claim::of(&alive));
    gossip(key, id, vec![alive])
}

#[test]
fn a_removed_host_is_shut_out_by_rotating_the_key() {
    let root = tempfile::tempdir().unwrap();
    let mut c = LocalCluster::new(common::exe(), root.path());
    let extra = vec![
        "--cpus".to_string(),
        "1".to_string(),
        "--key-overlap-ms".to_string(),
        OVERLAP_MS.to_string(),
    ];
    // The host to remove keeps its own copy of the key, as a separate host does.
    let old_key_text = std::fs::read_to_string(c.key_file()).unwrap();
    let own_key = root.path().join("rt3.key");
    common::write_private(&own_key, &old_key_text);
    let old_key = load_cluster_key(c.key_file()).unwrap();
    c.start("rt0", &extra).unwrap();
    for i in 1..3 {
        c.start_joining(&format!("rt{i}"), &extra).unwrap();
    }
    let mut gone_args = extra.clone();
    gone_args.extend(["--cluster-key".to_string(), own_key.display().to_string()]);
    let gone = c.start_joining("rt3", &gone_args).unwrap();
    wait_formed(&c, 4, WAIT);
    let stay = [0usize, 1, 2];
    let old_token = c.nodes[0].token.clone().unwrap();
    assert_eq!(token_file(&c, 0), old_token);

    // Phase 1: the admin removes rt3 (not the chief: it joined last).
    let chief = c.status(0).unwrap().chief.unwrap().name;
    assert_ne!(chief, "rt3", "the removed member must not be the chief");
    ok(c.cli(0).args(["member", "remove", "rt3"]).output().unwrap());
    for i in stay {
        poll_until(
            WAIT,
            || {
                c.status(i)
                    .ok()
                    .and_then(|s| s.members.into_iter().find(|m| m.name == "rt3"))
            },
            |m| m.as_ref().is_some_and(|m| m.state == "removed"),
        )
        .unwrap_or_else(|m| panic!("rt{i} does not show rt3 removed: {m:?}"));
    }

    // Phase 2: the admin rotates the key on a follower's API; a made token may not.
    let made = ok(c.cli(0).args(["token", "create", "user"]).output().unwrap());
    let made = made.trim().to_string();
    let err = fails(
        c.cli(1)
            .env("RINGLEADER_TOKEN", &made)
            .args(["key", "rotate"])
            .output()
            .unwrap(),
    );
    assert!(err.contains("only the admin token"), "{err}");
    let said = ok(c.cli(1).args(["key", "rotate"]).output().unwrap());
    assert!(said.contains("rotated to epoch 1"), "{said}");
    assert!(
        said.contains("3 member(s)"),
        "rt3 must not be given the key: {said}"
    );

    // Phase 3: every member writes the new admin token (0600) and the new key file; the
    // removed host's copy is the old key still, and no pending key is left anywhere.
    let new_token = poll_until(
        WAIT,
        || stay.map(|i| token_file(&c, i)),
        |t| t.iter().all(|t| *t != old_token),
    )
    .unwrap_or_else(|t| panic!("api.token not rewritten everywhere: {t:?}"))[0]
        .clone();
    for i in stay {
        assert_eq!(
            token_file(&c, i),
            new_token,
            "rt{i}: one admin token for every node"
        );
        assert_eq!(common::mode(&c.nodes[i].dir.join(API_TOKEN_FILE)), 0o600);
    }
    let new_key = load_cluster_key(c.key_file()).unwrap();
    assert_ne!(new_key.fingerprint(), old_key.fingerprint());
    assert_eq!(common::mode(c.key_file()), 0o600);
    assert_eq!(
        ringleader::security::bootstrap::admin_token(&new_key),
        new_token
    );
    assert_eq!(
        load_cluster_key(&own_key).unwrap().fingerprint(),
        old_key.fingerprint(),
        "the removed host never received the new key"
    );
    assert_eq!(token_file(&c, gone), old_token);
    for i in stay {
        c.nodes[i].token = Some(new_token.clone());
    }
    // The removed member's connections, keyed with the old key, are closed at the switch.
    poll_until(
        WAIT,
        || {
            stay.iter().any(|&i| {
                c.nodes[i]
                    .log()
                    .contains("a removed member, at a key switch")
            })
        },
        |&closed| closed,
    )
    .unwrap_or_else(|_| panic!("no member closed its connections to rt3"));

    // Phase 4: the old admin token gets 401 on every member; the new one works.
    for i in stay {
        let api = &c.nodes[i].info.api_addr;
        let refused = poll_until(
            WAIT,
            || {
                ApiClient::new(api, Some(old_token.clone()))
                    .status()
                    .err()
                    .map(|e| format!("{e:#}"))
            },
            |e| {
                e.as_ref()
                    .is_some_and(|e| e.contains("refused") || e.contains("401"))
            },
        );
        refused.unwrap_or_else(|e| panic!("rt{i} still takes the old admin token: {e:?}"));
        ApiClient::new(api, Some(new_token.clone()))
            .status()
            .unwrap_or_else(|e| panic!("rt{i} refuses the new admin token: {e:#}"));
    }

    // Phase 5: the removed host stops; after the overlap a datagram sealed with the old key
    // changes nothing. An empty gossip is sent until the member refuses it (the overlap's
    // end), then the review's forgery: rt3 claiming rt1 dead at the highest incarnation, and
    // a ghost member alive.
    c.terminate(gone).unwrap();
    let to = advertised_addrs(&c.nodes[0].info.p2p_addrs)[0];
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let rt3: libp2p::PeerId = c.nodes[gone].info.id.parse().unwrap();
    let rt1: libp2p::PeerId = c.nodes[1].info.id.parse().unwrap();
    // The probe names a sender that was never removed (the ghost): a removed sender's
    // datagrams are refused whatever their key.
    let ghost = libp2p::identity::Keypair::generate_ed25519();
    let refused_before = c.status(0).unwrap().counters.refused_datagrams;
    poll_until(
        WAIT,
        || {
            socket
                .send_to(
                    &gossip(&old_key, ghost.public().to_peer_id(), Vec::new()),
                    to,
                )
                .unwrap();
            c.status(0).unwrap().counters.refused_datagrams
        },
        |&n| n > refused_before,
    )
    .unwrap_or_else(|n| panic!("old-key datagrams still opened after the overlap ({n} refused)"));
    let rt1_meta = {
        let s = c.status(0).unwrap();
        assert!(s.names_in("alive").contains(&"rt1".to_string()));
        common::ghost_meta("rt1")
    };
    let forged = [
        gossip(
            &old_key,
            rt3,
            vec![Update {
                id: rt1,
                incarnation: u64::MAX,
                state: State::Dead,
                meta: rt1_meta,
                meta_version: u64::MAX,
                from: Some(rt3),
                sig: Vec::new(),
            }],
        ),
        ghost_alive(&old_key, &ghost),
    ];
    let before = c.status(0).unwrap().counters.refused_datagrams;
    for d in &forged {
        socket.send_to(d, to).unwrap();
    }
    poll_until(
        WAIT,
        || c.status(0).unwrap().counters.refused_datagrams,
        |&n| n >= before + forged.len() as u64,
    )
    .unwrap_or_else(|n| panic!("the forged datagrams were not refused ({n}, from {before})"));

    // Phase 6: restarted with its old key file, the removed host cannot join: its seed's
    // handshake fails (and it says what to do), the members refuse its connections.
    let refused_conns = c.status(0).unwrap().counters.refused_connections;
    c.restart(gone).unwrap();
    let seen = poll_until(
        WAIT,
        || {
            c.status(gone)
                .map(|s| s.counters.seed_dial_failures)
                .unwrap_or(0)
        },
        |&n| n >= 2,
    );
    seen.unwrap_or_else(|n| panic!("rt3's seed dials did not fail ({n})"));
    let s = c.status(gone).unwrap();
    let others: Vec<_> = s.members.iter().filter(|m| m.name != "rt3").collect();
    assert!(others.is_empty(), "rt3 reached the cluster: {others:?}");
    assert!(
        c.nodes[gone]
            .log()
            .contains("key was rotated while this node was away"),
        "rt3 is not told what to do"
    );
    // rt3 sees its dial fail before node 0 has counted the refusal: waited for, not read once.
    poll_until(
        WAIT,
        || c.status(0).unwrap().counters.refused_connections,
        |&n| n > refused_conns,
    )
    .unwrap_or_else(|n| panic!("node 0 refused no connection of rt3 ({n}, from {refused_conns})"));

    // Phase 7: the members stay healthy (rt1 alive, no ghost, a chief) and run a job.
    for i in stay {
        let s = c.status(i).unwrap();
        let alive = s.names_in("alive");
        assert_eq!(alive, vec!["rt0", "rt1", "rt2"], "rt{i}: {s:?}");
        assert!(
            s.members.iter().all(|m| m.name != "ghost"),
            "rt{i} heard the ghost"
        );
        assert!(s.chief.is_some(), "rt{i}: no chief");
    }
    let api = ApiClient::new(&c.nodes[2].info.api_addr, Some(new_token.clone()));
    let id = api
        .submit(
            "name = \"after-rotation\"\nkind = \"command\"\nworkers = 2\n\
             command = [\"sh\", \"-c\", \"echo rotated-ok\"]\n",
        )
        .unwrap();
    let doc = wait_job(&c, 2, &id, "ended", WAIT, common::ended);
    assert_eq!(doc.state, "succeeded", "{doc:#?}");

    // Phase 8: the datagram path itself works: the same ghost sealed with the new key is
    // heard (so the refusals above were the old key's, not a dead socket's).
    socket.send_to(&ghost_alive(&new_key, &ghost), to).unwrap();
    let heard = poll_until(
        WAIT,
        || ApiClient::new(&c.nodes[0].info.api_addr, Some(new_token.clone())).status(),
        |s| {
            s.as_ref()
                .is_ok_and(|s| s.members.iter().any(|m| m.name == "ghost"))
        },
    );
    assert!(
        heard.is_ok(),
        "a datagram sealed with the new key was not heard"
    );
}
