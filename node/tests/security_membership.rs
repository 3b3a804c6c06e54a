//! Real-process tests of issue 47's membership attacks (the review's H2 and L1), each against
//! three nodes with a cluster key, sent from a UDP socket of the test's own with the cluster
//! key, as a holder of the key (a removed member, say) would send them:
//!
//! - H2: one `Gossip` naming another member (or a stranger) as its sender that says the
//!   victim is dead at incarnation 2^64 − 1, suspect at a high incarnation, or left, signed by
//!   the sender's own identity or not at all. Before: every node marked the victim dead within
//!   2 s, it could not refute, and the voter autopilot replaced it. Now: every node refuses
//!   each claim (counted), and the victim stays alive and a voter everywhere for 10 s, more
//!   than three times the failure detector's longest suspicion (3 s).
//! - L1: a datagram as a member sends it (sealed with the key, naming the member), sent twice (the second time from another address) and once sealed a minute ago. Before:
//!   every copy was taken and pointed the member's route at the replayer. Now: the first is
//!   taken, the replay and the old one are refused and counted, and the old one's warning
//!   names the clock skew.
//!
//! - A member an operator removed (`ringleader member remove`) still runs and still holds the
//!   key: the others drop its datagrams (counted), and its own signed claim, sent again as a
//!   datagram naming it, is dropped before it is read.
//!
//! Every wait polls with a deadline; nodes are stopped by PID (`LocalCluster`).

mod common;

use std::{
    net::{SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use libp2p::{identity::Keypair, PeerId};
use ringleader::{
    api::status::StatusDoc,
    cli::local::LocalCluster,
    cluster::{
        claim_keys,
        datagrams::{advertised_addrs, wall_ms, Seal},
        identity::{load_cluster_key, ClusterKey},
        membership::{Claim, Message, State, Update},
        meta::NodeMeta,
        wire,
    },
};

/// Bound on each wait (a debug build on two shared cores is slow).
const WAIT: Duration = Duration::from_secs(120);
/// How long the victim must stay alive and a voter after the forged datagrams: more than
/// three times the longest suspicion timeout of the default configuration (3 s), and the
/// autopilot's period several times over.
const HOLD: Duration = Duration::from_secs(10);

type Msg = Message<PeerId, NodeMeta>;

/// Three nodes with a cluster key, formed (all alive, a chief, three voters).
fn cluster(root: &std::path::Path) -> LocalCluster {
    common::formed_cluster(root, "m", 3, &[], WAIT)
}

fn key(c: &LocalCluster) -> ClusterKey {
    load_cluster_key(c.key_file()).expect("the cluster's key")
}

fn peer(c: &LocalCluster, i: usize) -> PeerId {
    c.nodes[i].info.id.parse().expect("a peer id")
}

/// Where node `i`'s datagrams are read.
fn udp_of(c: &LocalCluster, i: usize) -> SocketAddr {
    advertised_addrs(&c.nodes[i].info.p2p_addrs)[0]
}

fn meta(name: &str) -> NodeMeta {
    common::member_meta(name, "10.6.6.6:7070")
}

fn claim(id: PeerId, incarnation: u64, state: State, name: &str) -> Update<PeerId, NodeMeta> {
    Update {
        id,
        incarnation,
        state,
        meta: meta(name),
        meta_version: u64::MAX,
        from: None,
        sig: Vec::new(),
    }
}

/// `u` signed with `key` (the sender's own identity, which is not the subject's).
fn signed_by(key: &Keypair, mut u: Update<PeerId, NodeMeta>) -> Update<PeerId, NodeMeta> {
    u.sig = claim_keys::sign(key, &Claim::of(&u));
    u
}

fn gossip(updates: Vec<Update<PeerId, NodeMeta>>) -> Vec<u8> {
    wire::encode(&Msg::Gossip { updates }).unwrap()
}

fn victim_held(s: &StatusDoc, victim: &str) -> bool {
    s.members
        .iter()
        .any(|m| m.name == victim && m.state == "alive" && m.voter && m.incarnation < 1_000)
}

/// Polls every node until `cond` holds for all, up to `WAIT`.
fn wait_counter(c: &LocalCluster, what: &str, cond: impl Fn(&StatusDoc) -> bool) {
    if let Err(e) = c.wait_all(WAIT, what, cond) {
        panic!("{what}: {e}");
    }
}

#[test]
fn forged_claims_about_a_member_evict_nobody() {
    let root = tempfile::tempdir().unwrap();
    let c = cluster(root.path());
    let key = key(&c);
    let victim = peer(&c, 2);
    let victim_name = c.nodes[2].name.clone();
    // The insider: a host with the key (a removed member's identity, or any other), and a
    // member it names as sender.
    let insider = Keypair::generate_ed25519();
    let senders = [insider.public().to_peer_id(), peer(&c, 0)];
    let forged: Vec<Update<PeerId, NodeMeta>> = vec![
        // The review's datagram: the victim dead at 2^64 - 1.
        claim(victim, u64::MAX, State::Dead, &victim_name),
        // The same, signed by the insider's own key, at a plausible incarnation.
        signed_by(&insider, claim(victim, 1, State::Dead, &victim_name)),
        // Suspect far above anything the victim signed.
        signed_by(
            &insider,
            claim(victim, 1 << 40, State::Suspect, &victim_name),
        ),
        // Left, in the victim's name.
        claim(victim, 1, State::Left, &victim_name),
        signed_by(&insider, claim(victim, 2, State::Left, "moved")),
    ];
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut sent = 0u64;
    for sender in senders {
        let seal = Seal::new(Some(&key), &sender);
        for u in &forged {
            let d = seal.seal(&gossip(vec![u.clone()]));
            assert!(d.len() <= 1_400, "{} bytes", d.len());
            for i in 0..3 {
                socket.send_to(&d, udp_of(&c, i)).unwrap();
            }
        }
        sent += forged.len() as u64;
    }

    // Every node hears every forged claim and refuses it (m0 drops those naming it as
    // their sender before reading them: a node's own datagrams come back to it only by
    // mistake).
    let per_sender = forged.len() as u64;
    wait_counter(&c, "every forged claim refused", |s| {
        let expected = if s.node.name == "m0" {
            per_sender
        } else {
            sent
        };
        s.counters.refused_claims >= expected
    });
    // The victim stays alive, at a small incarnation, and a voter, everywhere, throughout.
    let start = Instant::now();
    while start.elapsed() < HOLD {
        for i in 0..3 {
            let s = c.status(i).unwrap();
            assert!(
                victim_held(&s, &victim_name),
                "node {i} after {:?}: {:?}",
                start.elapsed(),
                s.members
            );
            assert!(
                s.members.iter().all(|m| m.name != "moved"),
                "node {i} took a forged name"
            );
        }
        std::thread::sleep(common::POLL);
    }
}

#[test]
fn a_replayed_or_stale_datagram_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let c = cluster(root.path());
    let key = key(&c);
    // A datagram m1 sent m0, captured on the wire (loopback) as a host on the path would.
    let to = udp_of(&c, 0);
    let Some(captured) = capture(udp_of(&c, 1).port(), to.port(), WAIT) else {
        eprintln!("SKIPPED: no packet socket on lo (needs root and AF_PACKET): no capture");
        return;
    };
    let seal = Seal::new(Some(&key), &peer(&c, 1));
    let before = c.status(0).unwrap().counters;

    // It was taken when it came; the replay, from another address, is refused.
    let replayer = UdpSocket::bind("127.0.0.2:0").unwrap();
    replayer.send_to(&captured, to).unwrap();
    let deadline = Instant::now() + WAIT;
    let replayed = common::poll_until(
        WAIT,
        || c.status(0).unwrap().counters.replayed_datagrams,
        |&n| n > before.replayed_datagrams,
    );
    assert!(replayed.is_ok(), "the replay was not refused: {replayed:?}");

    // One sealed a minute ago (captured then, or a clock off): refused, with a warning that
    // names the skew.
    let old = seal.seal_at(&gossip(Vec::new()), wall_ms() - 60_000);
    replayer.send_to(&old, to).unwrap();
    let skewed = common::poll_until(
        deadline.saturating_duration_since(Instant::now()),
        || c.status(0).unwrap().counters.skewed_datagrams,
        |&n| n > before.skewed_datagrams,
    );
    assert!(
        skewed.is_ok(),
        "the old datagram was not refused: {skewed:?}"
    );
    let log = c.nodes[0].log();
    assert!(
        log.contains("clock is 60 s behind this host's") && log.contains("check NTP"),
        "no warning naming the skew: {log}"
    );
    // m1 is still heard (its own datagrams are fresh) and alive everywhere.
    c.wait_all(WAIT, "m1 alive", |s| s.names_in("alive").len() == 3)
        .unwrap();
}

#[test]
fn a_removed_members_datagrams_are_dropped() {
    let root = tempfile::tempdir().unwrap();
    let c = cluster(root.path());
    let key = key(&c);
    let chief = c.status(0).unwrap().chief.unwrap().name;
    let gone = (0..3).find(|i| c.nodes[*i].name != chief).unwrap();
    let gone_name = c.nodes[gone].name.clone();
    let stay: Vec<usize> = (0..3).filter(|i| *i != gone).collect();
    common::ok(
        c.cli(stay[0])
            .args(["member", "remove", &gone_name])
            .output()
            .unwrap(),
    );

    // It keeps running and sending; the others drop what it sends.
    for &i in &stay {
        let dropped = common::poll_until(
            WAIT,
            || c.status(i).unwrap().counters.removed_datagrams,
            |&n| n > 0,
        );
        assert!(dropped.is_ok(), "node {i} still reads the removed member");
    }
    // Its own claim, signed with its identity, at a higher incarnation: dropped unread.
    let bytes = std::fs::read(root.path().join(&gone_name).join("identity.key")).unwrap();
    let identity = Keypair::from_protobuf_encoding(&bytes).unwrap();
    let me = peer(&c, gone);
    let own = signed_by(&identity, claim(me, 7, State::Alive, &gone_name));
    let seal = Seal::new(Some(&key), &me);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for &i in &stay {
        let before = c.status(i).unwrap().counters;
        socket
            .send_to(&seal.seal(&gossip(vec![own.clone()])), udp_of(&c, i))
            .unwrap();
        let dropped = common::poll_until(
            WAIT,
            || c.status(i).unwrap().counters.removed_datagrams,
            |&n| n > before.removed_datagrams,
        );
        assert!(dropped.is_ok(), "node {i} read it");
        let s = c.status(i).unwrap();
        assert_eq!(
            s.counters.refused_claims, before.refused_claims,
            "never read"
        );
        let m = s.members.iter().find(|m| m.name == gone_name).unwrap();
        assert!(m.state == "removed", "node {i}: {m:?}");
        assert!(m.incarnation < 7, "node {i} took its claim: {m:?}");
        // Its vote goes with the chief's next voter change (asynchronous to the removal).
        let voter = common::poll_until(
            WAIT,
            || {
                let s = c.status(i).unwrap();
                s.members.iter().any(|m| m.name == gone_name && m.voter)
            },
            |&v| !v,
        );
        assert!(voter.is_ok(), "node {i}: the removed member keeps its vote");
    }
}

/// The payload of the next UDP datagram on loopback from port `from` to port `to`, captured
/// with a packet socket as a host on the path would (`None` when no packet socket opens:
/// that needs root).
fn capture(from: u16, to: u16, within: Duration) -> Option<Vec<u8>> {
    let all = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket calls on a descriptor this function owns and closes; the
    // addresses and buffers passed live across each call and their sizes are given.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, i32::from(all));
        if fd < 0 {
            return None;
        }
        let mut at: libc::sockaddr_ll = std::mem::zeroed();
        at.sll_family = libc::AF_PACKET as u16;
        at.sll_protocol = all;
        at.sll_ifindex = libc::if_nametoindex(c"lo".as_ptr()) as i32;
        let bound = libc::bind(
            fd,
            (&raw const at).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        );
        let wait = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const wait).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
        let deadline = Instant::now() + within;
        let mut buf = vec![0u8; 65_536];
        let mut found = None;
        while bound == 0 && found.is_none() && Instant::now() < deadline {
            let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            if n > 0 {
                found = udp_payload(&buf[..n as usize], from, to);
            }
        }
        libc::close(fd);
        found
    }
}

/// The UDP payload of IPv4 packet `p` when it goes from port `from` to port `to`.
fn udp_payload(p: &[u8], from: u16, to: u16) -> Option<Vec<u8>> {
    if p.len() < 28 || p[0] >> 4 != 4 || p[9] != 17 {
        return None;
    }
    let udp = p.get(usize::from(p[0] & 0x0f) * 4..)?;
    let ports = (
        u16::from_be_bytes([udp[0], udp[1]]),
        u16::from_be_bytes([udp[2], udp[3]]),
    );
    (ports == (from, to)).then(|| udp[8..].to_vec())
}

/// The other side of the voter autopilot's confirmation: a voter that is really gone (killed)
/// does not answer the chief's direct call, so gossip's word stands and it is removed from
/// the voters after the dead grace (30 s), as before the call was asked.
#[test]
fn a_voter_that_is_really_gone_is_still_removed() {
    let root = tempfile::tempdir().unwrap();
    let mut c = cluster(root.path());
    let chief = c.status(0).unwrap().chief.unwrap().name;
    let gone = (0..3).find(|i| c.nodes[*i].name != chief).unwrap();
    let gone_name = c.nodes[gone].name.clone();
    c.kill9(gone).unwrap();
    // Dead (a few seconds), the grace (30 s), a silent call (at most 3 s): well within WAIT.
    c.wait_all(WAIT, "the dead voter removed from the voters", |s| {
        s.members
            .iter()
            .any(|m| m.name == gone_name && m.state == "dead" && !m.voter)
    })
    .unwrap();
}
