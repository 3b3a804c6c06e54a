use super::*;

type Node = Membership<u32, u32>;

fn upd(id: u32, incarnation: u64, state: State, from: Option<u32>) -> Update<u32, u32> {
    Update {
        id,
        incarnation,
        state,
        meta: 0,
        meta_version: 0,
        from,
    }
}

fn gossip(from: u32, updates: Vec<Update<u32, u32>>) -> Event<u32, u32> {
    Event::Message {
        from,
        msg: Message::Gossip { updates },
    }
}

/// Node 0 knowing members `1..n` alive at incarnation 0, at time 1000.
fn node(n: u32, config: Config) -> Node {
    let mut m = Node::new(0, 0, config, 7, 1_000);
    let updates = (1..n).map(|id| upd(id, 0, State::Alive, None)).collect();
    m.handle(
        1_000,
        Event::Message {
            from: 1,
            msg: Message::PushPull {
                join: true,
                members: updates,
            },
        },
    );
    assert_eq!(m.alive_count(), n as usize);
    m
}

fn state(m: &Node, id: u32) -> State {
    m.member(&id).expect("known member").state
}

fn sends(actions: &[Action<u32, u32>]) -> Vec<(u32, &Message<u32, u32>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send { to, msg } => Some((*to, msg)),
            Action::Changed { .. } => None,
        })
        .collect()
}

#[test]
fn suspicion_timeout_formula() {
    assert_eq!(suspicion_timeout_ms(500, 3_000, 0, 3), 3_000);
    assert_eq!(suspicion_timeout_ms(500, 3_000, 1, 3), 1_750);
    assert_eq!(suspicion_timeout_ms(500, 3_000, 3, 3), 500);
    assert_eq!(suspicion_timeout_ms(500, 3_000, 9, 3), 500);
    assert_eq!(suspicion_timeout_ms(500, 3_000, 0, 0), 500);
}

#[test]
fn suspect_is_refuted_by_a_higher_incarnation() {
    let mut m = node(5, Config::default());
    m.handle(1_000, gossip(2, vec![upd(1, 0, State::Suspect, Some(2))]));
    assert_eq!(state(&m, 1), State::Suspect);
    // Alive at the same incarnation does not refute.
    m.handle(1_001, gossip(3, vec![upd(1, 0, State::Alive, None)]));
    assert_eq!(state(&m, 1), State::Suspect);
    let actions = m.handle(1_002, gossip(1, vec![upd(1, 1, State::Alive, None)]));
    assert_eq!(state(&m, 1), State::Alive);
    assert_eq!(m.member(&1).unwrap().incarnation, 1);
    assert!(actions.iter().any(|a| matches!(a, Action::Changed { member, previous: Some(State::Suspect) } if member.id == 1)));
    m.check_invariants().unwrap();
    // Suspect at a lower incarnation is stale now.
    m.handle(1_003, gossip(2, vec![upd(1, 0, State::Suspect, Some(2))]));
    assert_eq!(state(&m, 1), State::Alive);
}

#[test]
fn a_node_refutes_suspicion_of_itself() {
    let mut m = node(5, Config::default());
    let actions = m.handle(1_000, gossip(2, vec![upd(0, 0, State::Suspect, Some(2))]));
    assert_eq!(m.local().incarnation, 1);
    assert_eq!(m.local().state, State::Alive);
    assert_eq!(m.stats().refutations, 1);
    assert_eq!(m.health_score(), 1, "refuting raises the health score");
    // The refutation goes straight back to the accuser.
    let refutation = sends(&actions)
        .into_iter()
        .find(|(to, _)| *to == 2)
        .expect("refutation sent to the accuser");
    assert!(refutation
        .1
        .updates()
        .iter()
        .any(|u| u.id == 0 && u.incarnation == 1 && u.state == State::Alive));
    // Dead at an incarnation above ours: refute above it.
    m.handle(1_001, gossip(3, vec![upd(0, 5, State::Dead, None)]));
    assert_eq!(m.local().incarnation, 6);
}

#[test]
fn suspect_becomes_dead_after_timeout_and_sooner_with_confirmations() {
    // n = 10: min = 2 · 1 · 250 = 500 ms, max = 3 000 ms, k = 3.
    let mut m = node(10, Config::default());
    m.handle(1_000, gossip(2, vec![upd(1, 0, State::Suspect, Some(2))]));
    assert!(m.next_wakeup_ms() <= 4_000);
    m.handle(3_999, Event::Tick);
    assert_eq!(state(&m, 1), State::Suspect);
    let actions = m.handle(4_000, Event::Tick);
    assert_eq!(state(&m, 1), State::Dead);
    assert_eq!(m.stats().deaths_declared, 1);
    assert!(actions.iter().any(|a| matches!(a, Action::Changed { member, previous: Some(State::Suspect) } if member.id == 1 && member.state == State::Dead)));
    m.check_invariants().unwrap();

    // Same again with confirmations from distinct members.
    let mut m = node(10, Config::default());
    m.handle(1_000, gossip(2, vec![upd(1, 0, State::Suspect, Some(2))]));
    m.handle(1_010, gossip(3, vec![upd(1, 0, State::Suspect, Some(3))]));
    m.handle(1_020, gossip(3, vec![upd(1, 0, State::Suspect, Some(3))])); // not independent
    assert_eq!(m.stats().confirmations, 1);
    m.handle(2_749, Event::Tick);
    assert_eq!(state(&m, 1), State::Suspect, "one confirmation: 1 750 ms");
    m.handle(2_750, Event::Tick);
    assert_eq!(state(&m, 1), State::Dead);

    let mut m = node(10, Config::default());
    for (t, from) in [(1_000, 2), (1_010, 3), (1_020, 4), (1_030, 5)] {
        m.handle(t, gossip(from, vec![upd(1, 0, State::Suspect, Some(from))]));
    }
    m.handle(1_499, Event::Tick);
    assert_eq!(state(&m, 1), State::Suspect);
    m.handle(1_500, Event::Tick);
    assert_eq!(
        state(&m, 1),
        State::Dead,
        "k confirmations: the minimum, 500 ms"
    );
}

#[test]
fn failed_probe_goes_indirect_then_suspects_and_health_follows_nacks() {
    let config = Config::default();
    let mut m = node(6, config.clone());
    // Tick until a probe starts (gossip rounds come first).
    let (t0, target, seq) = loop {
        let t = m.next_wakeup_ms();
        let actions = m.handle(t, Event::Tick);
        let ping = sends(&actions).into_iter().find_map(|(to, msg)| match msg {
            Message::Ping { seq, .. } => Some((to, *seq)),
            _ => None,
        });
        if let Some((to, seq)) = ping {
            break (t, to, seq);
        }
        assert!(t < 2_000, "no probe within a second");
    };
    // Direct timeout: ping-req through 3 members, and the direct ping again.
    let actions = m.handle(t0 + config.probe_timeout_ms, Event::Tick);
    let relays: Vec<u32> = sends(&actions)
        .into_iter()
        .filter_map(|(to, msg)| {
            matches!(msg, Message::PingReq { target: t, .. } if *t == target).then_some(to)
        })
        .collect();
    assert_eq!(relays.len(), 3);
    assert!(!relays.contains(&target));
    // One relay nacks; the other two stay silent: two missed nacks.
    m.handle(
        t0 + 200,
        Event::Message {
            from: relays[0],
            msg: Message::Nack {
                seq,
                updates: vec![],
            },
        },
    );
    let actions = m.handle(t0 + 2 * config.probe_timeout_ms, Event::Tick);
    assert_eq!(state(&m, target), State::Suspect);
    assert_eq!(m.stats().suspicions_raised, 1);
    assert_eq!(m.stats().nacks_missed, 2);
    assert_eq!(m.health_score(), 2);
    // Buddy system: the suspect hears of it directly.
    assert!(sends(&actions).iter().any(|(to, msg)| *to == target
        && msg
            .updates()
            .iter()
            .any(|u| u.id == target && u.state == State::Suspect)));
    // Timers now scale by 3: the next probe's direct timeout is 450 ms.
    let mut now = t0 + 2 * config.probe_timeout_ms;
    for _ in 0..10 {
        now = m.next_wakeup_ms().max(now);
        let actions = m.handle(now, Event::Tick);
        for (to, msg) in sends(&actions) {
            if let Message::Ping { seq, .. } = msg {
                m.handle(
                    now + 1,
                    Event::Message {
                        from: to,
                        msg: Message::Ack {
                            seq: *seq,
                            updates: vec![],
                        },
                    },
                );
            }
        }
    }
    assert_eq!(m.health_score(), 0, "acks bring the score back down");
    m.check_invariants().unwrap();
}

#[test]
fn unreachable_hint_probes_at_once_and_a_failed_send_goes_indirect() {
    let mut m = node(6, Config::default());
    let actions = m.handle(1_001, Event::Unreachable { id: 3 });
    assert!(matches!(sends(&actions)[..], [(3, Message::Ping { .. })]));
    let actions = m.handle(1_002, Event::Unreachable { id: 3 });
    let ping_reqs = sends(&actions)
        .iter()
        .filter(|(_, msg)| matches!(msg, Message::PingReq { target: 3, .. }))
        .count();
    assert_eq!(ping_reqs, 3);
    assert_eq!(m.stats().probes_sent, 1);
    // Dead members are not probed on a hint.
    m.handle(1_003, gossip(2, vec![upd(4, 0, State::Dead, None)]));
    assert!(sends(&m.handle(1_004, Event::Unreachable { id: 4 })).is_empty());
}

#[test]
fn intermediary_forwards_ack_or_nacks() {
    let config = Config::default();
    let mut m = node(4, config.clone());
    let actions = m.handle(
        1_000,
        Event::Message {
            from: 1,
            msg: Message::PingReq {
                seq: 77,
                target: 2,
                updates: vec![],
            },
        },
    );
    let my_seq = sends(&actions)
        .into_iter()
        .find_map(|(to, msg)| match msg {
            Message::Ping { seq, target: 2, .. } if to == 2 => Some(*seq),
            _ => None,
        })
        .expect("pings the target");
    let actions = m.handle(
        1_010,
        Event::Message {
            from: 2,
            msg: Message::Ack {
                seq: my_seq,
                updates: vec![],
            },
        },
    );
    assert!(matches!(
        sends(&actions)[..],
        [(1, Message::Ack { seq: 77, .. })]
    ));
    // No answer this time: a nack at 80% of the probe timeout.
    m.handle(
        2_000,
        Event::Message {
            from: 1,
            msg: Message::PingReq {
                seq: 78,
                target: 3,
                updates: vec![],
            },
        },
    );
    let nack_at = 2_000 + config.probe_timeout_ms * NACK_TIMEOUT_PERCENT / 100;
    assert!(m.next_wakeup_ms() <= nack_at);
    let actions = m.handle(nack_at, Event::Tick);
    assert!(sends(&actions)
        .iter()
        .any(|(to, msg)| *to == 1 && matches!(msg, Message::Nack { seq: 78, .. })));
}

#[test]
fn leave_announces_left_to_everyone_in_a_small_cluster() {
    let mut m = node(5, Config::default());
    let actions = m.handle(1_000, Event::Leave);
    assert_eq!(m.local().state, State::Left);
    assert_eq!(m.local().incarnation, 1);
    let told: BTreeSet<u32> = sends(&actions)
        .into_iter()
        .filter(|(_, msg)| {
            msg.updates()
                .iter()
                .any(|u| u.id == 0 && u.state == State::Left && u.incarnation == 1)
        })
        .map(|(to, _)| to)
        .collect();
    assert_eq!(told, (1..5).collect());
    // A left node does not refute, and left is final at its incarnation.
    m.handle(1_001, gossip(1, vec![upd(0, 1, State::Dead, None)]));
    assert_eq!(m.local().state, State::Left);
    let mut other = node(5, Config::default());
    other.handle(1_000, gossip(3, vec![upd(3, 1, State::Left, None)]));
    assert_eq!(state(&other, 3), State::Left);
    other.handle(1_001, gossip(2, vec![upd(3, 1, State::Alive, None)]));
    other.handle(1_001, gossip(2, vec![upd(3, 1, State::Dead, None)]));
    assert_eq!(state(&other, 3), State::Left);
    other.handle(1_002, gossip(3, vec![upd(3, 2, State::Alive, None)]));
    assert_eq!(
        state(&other, 3),
        State::Alive,
        "a higher incarnation rejoins"
    );
    other.check_invariants().unwrap();
}

#[test]
fn metadata_higher_version_wins() {
    let mut m = node(3, Config::default());
    let mut u = upd(1, 0, State::Alive, None);
    u.meta = 9;
    u.meta_version = 2;
    m.handle(1_000, gossip(1, vec![u.clone()]));
    assert_eq!(m.member(&1).unwrap().meta, 9);
    u.meta = 5;
    u.meta_version = 1;
    m.handle(1_001, gossip(2, vec![u]));
    assert_eq!(m.member(&1).unwrap().meta, 9);
    let actions = m.handle(1_002, Event::SetMeta(4));
    assert_eq!((m.local().meta, m.local().meta_version), (4, 1));
    assert!(actions.iter().any(
        |a| matches!(a, Action::Changed { member, .. } if member.id == 0 && member.meta == 4)
    ));
}

#[test]
fn tombstones_are_forgotten_after_tombstone_ms() {
    let config = Config::for_test();
    let mut m = node(4, config.clone());
    m.handle(1_000, gossip(2, vec![upd(1, 0, State::Dead, None)]));
    assert_eq!(m.members().count(), 4, "tombstone kept");
    let mut now = 1_000;
    while now < 1_000 + config.tombstone_ms + 2 * REAP_INTERVAL_MS {
        now = m.next_wakeup_ms();
        m.handle(now, Event::Tick);
    }
    // (2 and 3 never answer probes here, so they die and go too.)
    assert!(m.member(&1).is_none());
    assert!(m.stats().tombstones_reaped >= 1);
    // Old news about a forgotten member does not bring it back.
    m.handle(now, gossip(2, vec![upd(1, 0, State::Dead, None)]));
    assert!(m.member(&1).is_none());
    m.check_invariants().unwrap();
}

#[test]
fn bogus_messages_are_ignored_and_counted() {
    let config = Config::default();
    let mut m = node(4, config.clone());
    let before = m
        .members()
        .map(|x| (x.id, x.state, x.incarnation))
        .collect::<Vec<_>>();
    let bogus: Vec<Event<u32, u32>> = vec![
        Event::Message {
            from: 1,
            msg: Message::Ack {
                seq: 999,
                updates: vec![],
            },
        },
        Event::Message {
            from: 1,
            msg: Message::Nack {
                seq: 999,
                updates: vec![],
            },
        },
        Event::Message {
            from: 1,
            msg: Message::Ping {
                seq: 1,
                target: 42,
                updates: vec![],
            },
        },
        Event::Message {
            from: 0,
            msg: Message::Gossip {
                updates: vec![upd(1, 9, State::Dead, None)],
            },
        },
        Event::Message {
            from: 2,
            msg: Message::PingReq {
                seq: 1,
                target: 2,
                updates: vec![],
            },
        },
    ];
    for e in bogus {
        let actions = m.handle(1_000, e);
        assert!(sends(&actions).is_empty());
    }
    assert_eq!(m.stats().messages_ignored, 5);
    // Claims about unknown members other than alive ones are dropped quietly.
    m.handle(
        1_000,
        gossip(
            1,
            vec![
                upd(50, 0, State::Suspect, Some(1)),
                upd(51, 3, State::Dead, None),
            ],
        ),
    );
    assert!(m.member(&50).is_none() && m.member(&51).is_none());
    // More than piggyback_max updates: the excess is dropped and counted.
    let many = (100..100 + config.piggyback_max as u32 + 5)
        .map(|id| upd(id, 0, State::Alive, None))
        .collect();
    m.handle(1_000, gossip(1, many));
    assert_eq!(m.stats().updates_dropped, 5);
    assert_eq!(m.members().count(), 4 + config.piggyback_max);
    let after = m
        .members()
        .filter(|x| x.id < 100)
        .map(|x| (x.id, x.state, x.incarnation))
        .collect::<Vec<_>>();
    assert_eq!(before, after);
    // The table never grows past members_max.
    let small = Config {
        members_max: 6,
        ..Config::default()
    };
    let mut m = node(4, small);
    m.handle(
        1_000,
        gossip(
            1,
            (10..20).map(|id| upd(id, 0, State::Alive, None)).collect(),
        ),
    );
    assert_eq!(m.members().count(), 6);
    m.check_invariants().unwrap();
}

#[test]
fn message_codec_round_trips() {
    let msg: Message<u32, u32> = Message::PushPull {
        join: true,
        members: vec![
            upd(1, 2, State::Suspect, Some(3)),
            upd(4, 5, State::Left, None),
        ],
    };
    let cfg = bincode::config::standard().with_limit::<{ 1 << 20 }>();
    let bytes = bincode::serde::encode_to_vec(&msg, cfg).unwrap();
    let (back, _): (Message<u32, u32>, usize) =
        bincode::serde::decode_from_slice(&bytes, cfg).unwrap();
    assert_eq!(back, msg);
}

proptest::proptest! {
    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        let cfg = bincode::config::standard().with_limit::<{ 1 << 20 }>();
        let _ = bincode::serde::decode_from_slice::<Message<u32, super::super::sim::SimMeta>, _>(&bytes, cfg);
    }
}
