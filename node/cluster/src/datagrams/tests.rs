use super::*;
use crate::{identity::parse_cluster_key, membership::State};
use proptest::prelude::*;

fn key() -> ClusterKey {
    parse_cluster_key(&crate::identity::generate_cluster_key()).unwrap()
}

/// The sender and frame of `d`, opened by `seal`.
fn opened(seal: &Seal, d: &[u8]) -> Result<(PeerId, Vec<u8>), OpenError> {
    seal.open(d).map(|o| (o.from, o.frame))
}

fn update(name: &str, labels: usize) -> Update<PeerId, NodeMeta> {
    let mut meta = NodeMeta::for_test(name, 4, "10.0.0.1");
    meta.p2p_addrs = vec!["/ip4/10.0.0.1/tcp/7070".into()];
    meta.labels = (0..labels)
        .map(|l| (format!("{l:0>64}"), "v".repeat(64)))
        .collect();
    Update {
        id: PeerId::random(),
        incarnation: 3,
        state: State::Alive,
        meta,
        meta_version: 1,
        from: None,
        sig: vec![7; 64],
    }
}

#[test]
fn a_sealed_datagram_opens_only_with_the_same_key_and_unaltered() {
    let (k, me) = (key(), PeerId::random());
    let seal = Seal::new(Some(&k), &me);
    let frame = b"a membership frame".to_vec();
    let d = seal.seal(&frame);
    assert_eq!(d.len(), seal.overhead() + frame.len());
    assert_eq!(opened(&seal, &d), Ok((me, frame.clone())));
    // Another node of the same cluster opens it too.
    assert_eq!(
        opened(&Seal::new(Some(&k), &PeerId::random()), &d),
        Ok((me, frame.clone()))
    );
    // Two seals of the same frame differ (a fresh nonce each).
    assert_ne!(seal.seal(&frame), d);
    // Another key, any byte altered, a cut: refused.
    let stranger = Seal::new(Some(&key()), &PeerId::random());
    assert_eq!(stranger.open(&d), Err(OpenError::Forged));
    for i in 0..d.len() {
        let mut bad = d.clone();
        bad[i] ^= 0x20;
        assert!(seal.open(&bad).is_err(), "byte {i} altered and it opened");
    }
    assert!(seal.open(&d[..d.len() - 1]).is_err());
    assert_eq!(
        seal.open(&d[..10]),
        Err(OpenError::Short { len: 10 }),
        "shorter than nonce and tag"
    );
}

#[test]
fn keyed_and_insecure_nodes_refuse_each_other_and_say_which() {
    let k = key();
    let keyed = Seal::new(Some(&k), &PeerId::random());
    let me = PeerId::random();
    let open = Seal::new(None, &me);
    let plain = open.seal(b"hello");
    assert_eq!(opened(&open, &plain), Ok((me, b"hello".to_vec())));
    assert_eq!(keyed.open(&plain), Err(OpenError::Unsealed));
    assert_eq!(open.open(&keyed.seal(b"hello")), Err(OpenError::Sealed));
    assert_eq!(keyed.open(b"GET / HTTP/1.1"), Err(OpenError::NotOurs));
    assert_eq!(keyed.open(b""), Err(OpenError::Short { len: 0 }));
    // A plain datagram whose peer id is cut short, or not a peer id.
    let nonce = [0u8; NONCE_BYTES];
    let plain = |rest: &[u8]| [PLAIN_MAGIC.as_slice(), &nonce, rest].concat();
    assert_eq!(open.open(&plain(b"\x26abc")), Err(OpenError::BadSender));
    assert_eq!(
        open.open(&plain(b"\x03abcframe")),
        Err(OpenError::BadSender)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any bytes on the port: refused or opened, never a panic; with a key, only what was
    /// sealed with it opens.
    #[test]
    fn any_bytes_are_refused_without_a_panic(b in proptest::collection::vec(any::<u8>(), 0..1600)) {
        let keyed = Seal::new(Some(&key()), &PeerId::random());
        prop_assert!(keyed.open(&b).is_err());
        let _ = Seal::new(None, &PeerId::random()).open(&b);
    }
}

#[test]
fn a_message_that_fits_goes_whole_and_one_that_does_not_goes_bare_then_as_gossip() {
    let seal = Seal::new(Some(&key()), &PeerId::random());
    let budget = seal.frame_budget();
    assert!(budget >= 1_300, "room for a frame: {budget}");
    let target = PeerId::random();
    let small = Msg::Ping {
        seq: 7,
        target,
        updates: vec![update("a", 0)],
    };
    let (frames, rest) = datagram_frames(&small, budget).unwrap();
    assert_eq!(frames, vec![wire::encode(&small).unwrap()]);
    assert!(rest.is_none());

    // 32 updates of about 300 bytes and one of about 3 KB.
    let mut updates: Vec<_> = (0..32).map(|i| update(&format!("m{i}"), 1)).collect();
    let huge = update("huge", 20);
    updates.insert(5, huge.clone());
    let big = Msg::Ping {
        seq: 8,
        target,
        updates: updates.clone(),
    };
    let (frames, rest) = datagram_frames(&big, budget).unwrap();
    assert!(frames.len() > 2, "{} frames", frames.len());
    let mut seen = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        assert!(f.len() <= budget, "frame {i}: {} bytes", f.len());
        match wire::decode::<Msg>(f).unwrap() {
            Msg::Ping {
                seq: 8,
                target: t,
                updates,
            } if i == 0 => {
                assert_eq!(t, target);
                assert!(updates.is_empty(), "the probe goes bare");
            }
            Msg::Gossip { updates } if i > 0 => seen.extend(updates),
            other => panic!("frame {i}: {other:?}"),
        }
    }
    assert_eq!(
        rest,
        Some(Msg::Gossip {
            updates: vec![huge.clone()]
        }),
        "the update no datagram holds goes on the stream"
    );
    seen.push(huge);
    let key = |u: &Update<PeerId, NodeMeta>| u.meta.name.clone();
    seen.sort_by_key(key);
    updates.sort_by_key(key);
    assert_eq!(seen, updates, "every update once");

    // Gossip too large for one datagram is cut into gossip, with no bare message.
    let gossip = Msg::Gossip {
        updates: (0..32).map(|i| update(&format!("g{i}"), 1)).collect(),
    };
    let (frames, rest) = datagram_frames(&gossip, budget).unwrap();
    assert!(rest.is_none());
    let n: usize = frames
        .iter()
        .map(|f| wire::decode::<Msg>(f).unwrap().updates().len())
        .sum();
    assert_eq!(n, 32);
    assert!(frames.iter().all(|f| f.len() <= budget));
}

#[test]
fn a_member_is_tried_at_its_addresses_that_are_not_loopback() {
    let addrs = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let at = |a: &[&str]| {
        a.iter()
            .map(|s| s.parse().unwrap())
            .collect::<Vec<SocketAddr>>()
    };
    assert_eq!(
        advertised_addrs(&addrs(&[
            "/ip4/127.0.0.1/tcp/7070",
            "/ip4/172.17.0.1/tcp/7070",
            "/ip4/10.1.2.3/tcp/7070"
        ])),
        at(&["172.17.0.1:7070", "10.1.2.3:7070"])
    );
    assert_eq!(
        advertised_addrs(&addrs(&["/ip4/127.0.0.5/tcp/9"])),
        at(&["127.0.0.5:9"])
    );
    assert_eq!(
        advertised_addrs(&addrs(&["/ip6/::1/tcp/7070"])),
        at(&["[::1]:7070"])
    );
    assert!(advertised_addrs(&addrs(&["/dns/example.com/tcp/1", "junk"])).is_empty());
    let many: Vec<String> = (1..=9).map(|i| format!("/ip4/10.0.0.{i}/tcp/1")).collect();
    assert_eq!(advertised_addrs(&many).len(), ADVERTISED_TRIED_MAX);
}

/// Two nodes' sockets on loopback: until a datagram came from a member it is sent to every
/// address it advertises; then to the address its datagrams come from; its own datagrams,
/// come back to it through an address another advertised, are dropped; `forget` goes back
/// to the advertised addresses.
#[tokio::test]
async fn a_member_is_sent_to_where_its_datagrams_come_from_once_they_came() {
    let key = key();
    let open = |ip: &str| {
        let listen: Multiaddr = format!("/ip4/{ip}/tcp/0").parse().unwrap();
        let (listen, udp) = bind(&listen).unwrap();
        let id = PeerId::random();
        let d = Datagrams::new(udp, Seal::new(Some(&key), &id)).unwrap();
        (d, id, listen.to_string())
    };
    let (mut a, a_id, a_listen) = open("127.0.0.1");
    let (mut b, b_id, b_listen) = open("127.0.0.2");
    // b advertises an address that leads back to a (as a container bridge does), and its own.
    let b_advertised = vec![a_listen.clone(), b_listen.clone()];
    let to_b = a.destinations(&b_id, &b_advertised);
    assert_eq!(to_b.len(), 2, "every advertised address while unheard");
    a.send(&to_b, b"hello").unwrap();
    let Received::Frame { from, frame } = b.recv().await else {
        panic!("b got no frame")
    };
    assert_eq!((from, frame), (a_id, b"hello".to_vec()));
    // b answers at a's advertised address; a drops its own datagram and reads b's.
    b.send(
        &b.destinations(&a_id, std::slice::from_ref(&a_listen)),
        b"ack",
    )
    .unwrap();
    let Received::Frame { from, frame } = a.recv().await else {
        panic!("a got no frame")
    };
    assert_eq!((from, frame), (b_id, b"ack".to_vec()));
    let b_at = multiaddr_to_socket(&b_listen.parse().unwrap()).unwrap();
    assert_eq!(a.destinations(&b_id, &b_advertised), vec![b_at]);
    a.forget(&b_id);
    assert_eq!(a.destinations(&b_id, &b_advertised).len(), 2);
}

#[test]
fn a_listen_on_port_zero_gets_one_port_free_for_tcp_and_udp() {
    let listen: Multiaddr = "/ip4/127.0.0.1/tcp/0".parse().unwrap();
    let (bound, udp) = bind(&listen).unwrap();
    let at = multiaddr_to_socket(&bound).unwrap();
    assert_ne!(at.port(), 0);
    assert_eq!(udp.local_addr().unwrap(), at);
    // The same port again: the UDP one is taken.
    let err = bind(&bound).unwrap_err();
    assert!(
        matches!(&err, BindError::Udp(e) if e.kind() == io::ErrorKind::AddrInUse),
        "{err}"
    );
    let dns: Multiaddr = "/dns/localhost/tcp/0".parse().unwrap();
    assert!(matches!(bind(&dns), Err(BindError::NoIp(_))));
}

#[test]
fn a_datagram_carries_its_seal_time_and_nonce_inside_the_seal() {
    let (k, me) = (key(), PeerId::random());
    let seal = Seal::new(Some(&k), &me);
    let d = seal.seal_at(b"frame", 1_800_000_000_123);
    let o = seal.open(&d).unwrap();
    assert_eq!(
        (o.sent_ms, o.frame.as_slice()),
        (1_800_000_000_123, b"frame".as_slice())
    );
    assert_eq!(&o.nonce[..], &d[4..4 + NONCE_BYTES]);
    // The time is sealed: no byte of the datagram changes it and still opens.
    for i in 0..d.len() {
        let mut bad = d.clone();
        bad[i] ^= 1;
        assert!(seal.open(&bad).is_err(), "byte {i}");
    }
    // Sealed now, by default.
    let now = wall_ms();
    let sent = seal.open(&seal.seal(b"x")).unwrap().sent_ms;
    assert!(sent >= now && sent < now + 5_000, "{sent} vs {now}");
}

/// A replayed datagram, one sealed outside the window, and one from a removed member are
/// refused, and none of them moves the sender's route; a fresh one does.
#[tokio::test]
async fn only_a_fresh_datagram_first_seen_moves_a_route() {
    let listen: Multiaddr = "/ip4/127.0.0.1/tcp/0".parse().unwrap();
    let (_, udp) = bind(&listen).unwrap();
    let key = key();
    let mut d = Datagrams::new(udp, Seal::new(Some(&key), &PeerId::random())).unwrap();
    let peer = PeerId::random();
    let theirs = Seal::new(Some(&key), &peer);
    let home: SocketAddr = "10.0.0.1:7000".parse().unwrap();
    let elsewhere: SocketAddr = "10.6.6.6:53".parse().unwrap();
    let now = wall_ms();
    let first = theirs.open(&theirs.seal_at(b"ping", now)).unwrap();
    assert!(d.take(now, home, first.clone()).is_ok());
    assert_eq!(d.destinations(&peer, &[]), vec![home]);
    // The same datagram again, from elsewhere: refused, the route stays.
    assert_eq!(
        d.take(now + 10, elsewhere, first),
        Err(OpenError::Stale(Stale::Replayed))
    );
    // One sealed 31 s ago or 31 s ahead (a clock off): refused, naming the skew.
    let old = theirs.open(&theirs.seal_at(b"ping", now - 31_000)).unwrap();
    assert_eq!(
        d.take(now, elsewhere, old),
        Err(OpenError::Stale(Stale::Skewed { skew_ms: -31_000 }))
    );
    let ahead = theirs.open(&theirs.seal_at(b"ping", now + 31_000)).unwrap();
    let e = d.take(now, elsewhere, ahead).unwrap_err();
    assert!(e.to_string().contains("31000 ms"), "{e}");
    assert_eq!(d.destinations(&peer, &[]), vec![home]);
    // A removed member's datagram: refused, and its route forgotten.
    d.set_removed([peer]);
    let fresh = theirs.open(&theirs.seal_at(b"ping", now + 20)).unwrap();
    assert_eq!(
        d.take(now + 20, elsewhere, fresh.clone()),
        Err(OpenError::Removed(peer))
    );
    assert!(d.destinations(&peer, &[]).is_empty());
    // Back in (not removed): a fresh one from the new address moves the route.
    d.set_removed([]);
    assert!(d.take(now + 20, elsewhere, fresh).is_ok());
    assert_eq!(d.destinations(&peer, &[]), vec![elsewhere]);
}

/// Two advertised addresses that lead to the same member each get a datagram of their own,
/// so the member takes both (one datagram twice would be a replay).
#[tokio::test]
async fn two_addresses_of_one_member_each_get_a_datagram_of_their_own() {
    let key = key();
    let listen: Multiaddr = "/ip4/127.0.0.1/tcp/0".parse().unwrap();
    let (a_listen, a_udp) = bind(&listen).unwrap();
    let (_, b_udp) = bind(&listen).unwrap();
    let mut a = Datagrams::new(a_udp, Seal::new(Some(&key), &PeerId::random())).unwrap();
    let b = Datagrams::new(b_udp, Seal::new(Some(&key), &PeerId::random())).unwrap();
    let a_at = multiaddr_to_socket(&a_listen).unwrap();
    b.send(&[a_at, a_at], b"twice").unwrap();
    for copy in 0..2 {
        match a.recv().await {
            Received::Frame { frame, .. } => assert_eq!(frame, b"twice"),
            Received::Refused { error, .. } => panic!("copy {copy} refused: {error}"),
            Received::Failed(e) => panic!("{e}"),
        }
    }
}
