use super::super::claims::{ModelSigner, INCARNATION_JUMP_MAX, INCARNATION_MAX};
use super::super::message::{PIECES_MAX, PIECE_MEMBERS_MAX};
use super::*;

type Node = Membership<u32, u32>;

/// A claim signed by its subject (as every honest member's is).
fn upd(id: u32, incarnation: u64, state: State, from: Option<u32>) -> Update<u32, u32> {
    ModelSigner::signed(Update {
        id,
        incarnation,
        state,
        meta: 0,
        meta_version: 0,
        from,
        sig: Vec::new(),
    })
}

fn gossip(from: u32, updates: Vec<Update<u32, u32>>) -> Event<u32, u32> {
    Event::Message {
        from,
        msg: Message::Gossip { updates },
    }
}

/// Node 0 knowing members `1..n` alive at incarnation 0, at time 1000.
fn node(n: u32, config: Config) -> Node {
    let mut m = Node::new(0, 0, config, 7, 1_000, Box::new(ModelSigner));
    let updates = (1..n).map(|id| upd(id, 0, State::Alive, None)).collect();
    m.handle(
        1_000,
        Event::Message {
            from: 1,
            msg: Message::StatePiece {
                answer: false,
                piece: 0,
                pieces: 1,
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
fn silence_from_everyone_suspects_nobody_until_it_lasts() {
    let mut m = node(6, Config::default());
    let mut now = 1_000;
    // Nothing answers anything: each probe fails with no ack and no nack.
    let silent = u64::from(SILENT_PROBES_TOLERATED);
    while m.stats().probes_failed <= silent {
        assert_eq!(m.stats().suspicions_raised, 0, "silence suspected at once");
        now = m.next_wakeup_ms().max(now);
        m.handle(now, Event::Tick);
        assert!(now < 120_000, "probes do not fail");
    }
    assert_eq!(m.stats().silent_probes, silent);
    assert_eq!(
        m.stats().suspicions_raised,
        1,
        "silence that lasts suspects as before"
    );
    assert!(
        m.health_score() > 0,
        "each missed nack still counts against us"
    );
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
    // Dead members are not probed on a hint (the verdict comes from a member alive long
    // enough for it to be taken as it is).
    let later = 1_000 + RETURNED_CLAIMS_PROBES * Config::default().probe_interval_ms;
    m.handle(later, gossip(2, vec![upd(4, 0, State::Dead, None)]));
    assert_eq!(state(&m, 4), State::Dead);
    assert!(sends(&m.handle(later + 1, Event::Unreachable { id: 4 })).is_empty());
}

#[test]
fn a_verdict_of_death_from_a_member_just_back_is_a_suspicion_with_the_whole_timeout() {
    let config = Config::default();
    let mut m = node(6, config.clone());
    let t0 = 1_000 + RETURNED_CLAIMS_PROBES * config.probe_interval_ms;
    // From a member alive all along, a verdict is taken as it is.
    m.handle(t0, gossip(1, vec![upd(2, 0, State::Dead, None)]));
    assert_eq!(state(&m, 2), State::Dead);
    // While dead here, and just after it refuted, 2's own verdicts are suspicions.
    m.handle(t0 + 1, gossip(2, vec![upd(3, 0, State::Dead, None)]));
    assert_eq!(state(&m, 3), State::Suspect);
    m.handle(t0 + 2, gossip(2, vec![upd(2, 1, State::Alive, None)]));
    assert_eq!(state(&m, 2), State::Alive);
    m.handle(t0 + 3, gossip(2, vec![upd(4, 0, State::Dead, None)]));
    assert_eq!(state(&m, 4), State::Suspect);
    // No confirmation shortens them: 3 and 4 get the whole upper bound to refute
    // (2 · 250 ms · 6 with 6 members), then die by this node's own timer.
    let max_ms = 2 * config.probe_interval_ms * u64::from(config.suspicion_max_mult);
    m.handle(t0 + 4, gossip(5, vec![upd(4, 0, State::Suspect, Some(5))]));
    m.handle(t0 + 1 + max_ms - 1, Event::Tick);
    assert_eq!(state(&m, 3), State::Suspect);
    m.handle(t0 + 3 + max_ms, Event::Tick);
    assert_eq!((state(&m, 3), state(&m, 4)), (State::Dead, State::Dead));
    m.check_invariants().unwrap();
}

#[test]
fn a_join_nobody_answers_is_retried_soon_then_backs_off() {
    // A seed that accepted the connection before its membership ran drops the first join.
    let config = Config::default();
    let mut m = Node::new(0, 0, config.clone(), 7, 1_000, Box::new(ModelSigner));
    let joins = |actions: &[Action<u32, u32>]| {
        sends(actions)
            .iter()
            .filter(|(to, msg)| *to == 1 && matches!(msg, Message::PushPull { join: true, .. }))
            .count()
    };
    assert_eq!(joins(&m.handle(1_000, Event::Join { seeds: vec![1] })), 1);
    let mut at = 1_000;
    for delay in [250, 500, 1_000, 2_000, 2_000] {
        assert_eq!(
            joins(&m.handle(at + delay - 1, Event::Tick)),
            0,
            "before {delay} ms"
        );
        at += delay;
        assert_eq!(joins(&m.handle(at, Event::Tick)), 1, "after {delay} ms");
    }
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
    let u = ModelSigner::signed(u);
    m.handle(1_000, gossip(1, vec![u.clone()]));
    assert_eq!(m.member(&1).unwrap().meta, 9);
    let mut u = u;
    u.meta = 5;
    u.meta_version = 1;
    m.handle(1_001, gossip(2, vec![ModelSigner::signed(u)]));
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
    let msg: Message<u32, u32> = Message::StatePiece {
        answer: true,
        piece: 1,
        pieces: 2,
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

/// (id, state, incarnation, meta version) of every member, sorted.
fn view(m: &Node) -> Vec<(u32, State, u64, u64)> {
    let mut v: Vec<_> = m
        .members()
        .map(|x| (x.id, x.state, x.incarnation, x.meta_version))
        .collect();
    v.sort_by_key(|x| x.0);
    v
}

fn piece_of(msg: &Message<u32, u32>) -> &[Update<u32, u32>] {
    match msg {
        Message::StatePiece { members, .. } => members,
        other => panic!("not a state piece: {}", other.kind()),
    }
}

#[test]
fn a_sync_in_step_costs_one_message_and_one_out_of_step_swaps_pieces() {
    let config = Config {
        push_pull_piece_members: 2,
        members_max: 1_000,
        ..Config::for_test()
    };
    let mut a = Node::new(1, 0, config.clone(), 1, 1_000, Box::new(ModelSigner));
    let mut b = Node::new(2, 0, config.clone(), 2, 1_000, Box::new(ModelSigner));
    // Both learn of each other and of member 3: same views, same digests.
    let everyone = vec![
        upd(1, 0, State::Alive, None),
        upd(2, 0, State::Alive, None),
        upd(3, 0, State::Alive, None),
    ];
    a.handle(1_000, gossip(2, everyone.clone()));
    b.handle(1_000, gossip(1, everyone));
    assert_eq!(a.digest(), b.digest());
    let push_pull = Event::Message {
        from: 1,
        msg: Message::PushPull {
            join: false,
            digest: a.digest(),
        },
    };
    let out = b.handle(1_000, push_pull.clone());
    assert!(sends(&out).is_empty(), "views in step: nothing to send");
    assert_eq!(b.stats().push_pulls_in_step, 1);
    // b learns of 4 and 5: a's push-pull is answered by b's view in pieces of two.
    b.handle(
        1_000,
        gossip(
            3,
            vec![upd(4, 0, State::Alive, None), upd(5, 1, State::Alive, None)],
        ),
    );
    let out = b.handle(1_000, push_pull);
    let pieces: Vec<Message<u32, u32>> = sends(&out)
        .into_iter()
        .map(|(to, m)| {
            assert_eq!(to, 1);
            m.clone()
        })
        .collect();
    assert_eq!(pieces.len(), 3, "5 members in pieces of 2");
    // a merges them in reverse order and answers with its own view on piece 0 only.
    let mut answered = 0;
    for msg in pieces.into_iter().rev() {
        let out = a.handle(1_000, Event::Message { from: 2, msg });
        for (to, m) in sends(&out) {
            assert_eq!(to, 2);
            assert!(matches!(m, Message::StatePiece { answer: false, .. }));
            answered += 1;
        }
    }
    assert_eq!(
        answered, 3,
        "a's view (now 5 members) goes back in 3 pieces"
    );
    assert_eq!(view(&a), view(&b));
    assert_eq!(a.digest(), b.digest());
    a.check_invariants().unwrap();
}

#[test]
fn an_oversized_or_malformed_piece_is_refused_whole() {
    let mut m = node(4, Config::default());
    let before = view(&m);
    let too_many = (10..10 + PIECE_MEMBERS_MAX as u32 + 1)
        .map(|id| upd(id, 0, State::Alive, None))
        .collect();
    let bad = [
        (
            Message::StatePiece {
                answer: false,
                piece: 0,
                pieces: 1,
                members: too_many,
            },
            "state piece carries 1025 members, over the limit of 1024",
        ),
        (
            Message::StatePiece {
                answer: true,
                piece: 3,
                pieces: 3,
                members: vec![upd(9, 0, State::Alive, None)],
            },
            "state piece 3 of 3: index out of range",
        ),
        (
            Message::StatePiece {
                answer: true,
                piece: 0,
                pieces: 0,
                members: vec![upd(9, 0, State::Alive, None)],
            },
            "state in 0 pieces, outside 1..=1024",
        ),
        (
            Message::StatePiece {
                answer: false,
                piece: 0,
                pieces: PIECES_MAX + 1,
                members: vec![upd(9, 0, State::Alive, None)],
            },
            "state in 1025 pieces, outside 1..=1024",
        ),
    ];
    for (i, (msg, text)) in bad.into_iter().enumerate() {
        assert_eq!(msg.check().unwrap_err().to_string(), text);
        let out = m.handle(1_000, Event::Message { from: 1, msg });
        assert!(sends(&out).is_empty(), "a refused piece is not answered");
        assert_eq!(m.stats().messages_refused, i as u64 + 1);
    }
    assert_eq!(view(&m), before, "nothing of a refused piece is merged");
}

fn arb_update() -> impl proptest::strategy::Strategy<Value = Update<u32, u32>> {
    use proptest::prelude::*;
    (
        1u32..40,
        0u64..4,
        prop_oneof![
            Just(State::Alive),
            Just(State::Suspect),
            Just(State::Dead),
            Just(State::Left)
        ],
        0u64..3,
        proptest::option::of(1u32..40),
    )
        .prop_map(|(id, incarnation, state, meta_version, from)| {
            ModelSigner::signed(Update {
                id,
                incarnation,
                state,
                meta: meta_version as u32,
                meta_version,
                from,
                sig: Vec::new(),
            })
        })
}

proptest::proptest! {
    /// A view cut into pieces of any size covers every member exactly once, and its
    /// pieces merged in any order, some twice, leave the receiver where the whole view
    /// in one message does.
    #[test]
    fn pieces_reassemble_and_converge_in_any_order(
        history in proptest::collection::vec(arb_update(), 1..120),
        piece_members in 1usize..9,
        order_seed in proptest::prelude::any::<u64>(),
    ) {
        let config = Config { push_pull_piece_members: piece_members, members_max: 1_000, ..Config::for_test() };
        let mut source = Node::new(50, 0, config.clone(), 3, 1_000, Box::new(ModelSigner));
        // Every member first joins alive, then the random claims arrive.
        let joins: Vec<_> = (1..40).map(|id| upd(id, 0, State::Alive, None)).collect();
        for chunk in joins.chunks(config.piggyback_max).chain(history.chunks(config.piggyback_max)) {
            source.handle(1_000, gossip(60, chunk.to_vec()));
        }
        let pieces = source.state_pieces(false);
        let n = source.members().count();
        proptest::prop_assert_eq!(pieces.len(), n.div_ceil(piece_members));
        let mut covered: Vec<u32> = pieces.iter().flat_map(|p| piece_of(p).iter().map(|u| u.id)).collect();
        covered.sort_unstable();
        let mut ids: Vec<u32> = source.members().map(|m| m.id).collect();
        ids.sort_unstable();
        proptest::prop_assert_eq!(covered, ids);
        for p in &pieces {
            proptest::prop_assert!(p.check().is_ok());
            proptest::prop_assert!(piece_of(p).len() <= piece_members);
        }

        let whole: Vec<_> = pieces.iter().flat_map(|p| piece_of(p).to_vec()).collect();
        let mut at_once = Node::new(0, 0, config.clone(), 4, 1_000, Box::new(ModelSigner));
        at_once.handle(1_000, Event::Message {
            from: 50,
            msg: Message::StatePiece { answer: false, piece: 0, pieces: 1, members: whole },
        });
        let mut shuffled = pieces.clone();
        let mut rng = SmallRng::seed_from_u64(order_seed);
        let again: Vec<_> = shuffled.choose_multiple(&mut rng, 2).cloned().collect();
        shuffled.extend(again);
        shuffled.shuffle(&mut rng);
        let mut in_pieces = Node::new(0, 0, config, 4, 1_000, Box::new(ModelSigner));
        for msg in shuffled {
            in_pieces.handle(1_000, Event::Message { from: 50, msg });
        }
        proptest::prop_assert_eq!(view(&in_pieces), view(&at_once));
        proptest::prop_assert!(in_pieces.check_invariants().is_ok());
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        let cfg = bincode::config::standard().with_limit::<{ 1 << 20 }>();
        let _ = bincode::serde::decode_from_slice::<Message<u32, super::super::sim::SimMeta>, _>(&bytes, cfg);
    }
}

/// A seed answers a joiner's join with its view once; the joiner's retries within
/// `JOIN_ANSWER_REPEAT_MS` (the answer is on its way) get nothing, a retry after it gets the
/// view again (the answer may have been lost), and a periodic push-pull is always answered.
#[test]
fn a_joiners_retries_get_one_answer_a_second() {
    let mut seed = node(4, Config::default());
    let join = |digest| Event::Message {
        from: 9,
        msg: Message::PushPull { join: true, digest },
    };
    let answers = |out: &[Action<u32, u32>]| {
        sends(out)
            .iter()
            .filter(|(to, m)| *to == 9 && matches!(m, Message::StatePiece { answer: true, .. }))
            .count()
    };
    let out = seed.handle(1_000, join(1));
    assert_eq!(answers(&out), 1, "the first join is answered");
    for at in [1_250, 1_750, 1_999] {
        let out = seed.handle(at, join(1));
        assert_eq!(
            answers(&out),
            0,
            "a retry at {at} ms, within the repeat window"
        );
    }
    assert_eq!(seed.stats().join_repeats_unanswered, 3);
    let periodic = Event::Message {
        from: 9,
        msg: Message::PushPull {
            join: false,
            digest: 1,
        },
    };
    assert_eq!(answers(&seed.handle(1_999, periodic)), 1, "not a join");
    let out = seed.handle(1_000 + JOIN_ANSWER_REPEAT_MS, join(1));
    assert_eq!(
        answers(&out),
        1,
        "a retry past the window is answered again"
    );
    // The record of answers is pruned at the reaps: a late retry finds nothing stale.
    seed.handle(10_000, Event::Tick);
    assert!(seed.join_answers.is_empty());
    seed.check_invariants().unwrap();
}

#[test]
fn an_idle_member_wakes_only_at_its_probe_ticks_and_still_does_its_chores() {
    // Every probe acked at once, nothing to gossip: the only wake-ups are probe ticks, the
    // push-pull syncs (every 15 s) riding on them rather than waking the loop on their own.
    let config = Config::default();
    let mut m = node(6, config.clone());
    let mut now = 1_000;
    // Past the join's gossip (its updates go out for a few rounds).
    while m.broadcasts.len() > 0 {
        now = m.next_wakeup_ms().max(now);
        m.handle(now, Event::Tick);
        assert!(now < 20_000, "the join's updates never ran out");
    }
    let (start, sync0) = (now, m.stats().push_pulls_sent);
    let mut wakes = 0;
    while now < start + 40_000 {
        now = m.next_wakeup_ms().max(now + 1);
        wakes += 1;
        let actions = m.handle(now, Event::Tick);
        let ping = sends(&actions).into_iter().find_map(|(to, msg)| match msg {
            Message::Ping { seq, .. } => Some((to, *seq)),
            _ => None,
        });
        let Some((to, seq)) = ping else {
            panic!("woken at {now} for no probe");
        };
        m.handle(
            now,
            Event::Message {
                from: to,
                msg: Message::Ack {
                    seq,
                    updates: vec![],
                },
            },
        );
    }
    let syncs = m.stats().push_pulls_sent - sync0;
    assert!((2..=3).contains(&syncs), "{syncs} push-pulls in 40 s");
    let per_s = wakes as f64 / 40.0;
    assert!(
        per_s <= 1_000.0 / config.probe_interval_ms as f64 + 0.1,
        "{per_s} wake-ups a second"
    );
    m.check_invariants().unwrap();
}

// ----- claims only their subject can raise (`claims`) -----

/// `members` as one state piece from `from` (a push-pull's answer).
fn whole_view(from: u32, members: Vec<Update<u32, u32>>) -> Event<u32, u32> {
    Event::Message {
        from,
        msg: Message::StatePiece {
            answer: false,
            piece: 0,
            pieces: 1,
            members,
        },
    }
}

/// `u` with a signature that is not its subject's.
fn forged(mut u: Update<u32, u32>) -> Update<u32, u32> {
    u.sig = vec![0; 16];
    u
}

#[test]
fn a_claim_without_its_subjects_signature_is_refused() {
    let mut m = node(5, Config::default());
    // The review's datagram: "1 dead at 2^64 - 1", and the same at a plausible incarnation.
    for u in [
        forged(upd(1, u64::MAX, State::Dead, None)),
        forged(upd(1, 1, State::Dead, None)),
        forged(upd(1, 1, State::Suspect, Some(3))),
        forged(upd(1, 0, State::Suspect, Some(3))),
        forged(upd(1, 1, State::Left, None)),
        // Left resting on the member's signature of being alive is not its leave.
        {
            let mut u = upd(1, 1, State::Alive, None);
            u.state = State::Left;
            u
        },
    ] {
        m.handle(1_000, gossip(2, vec![u]));
    }
    assert_eq!(state(&m, 1), State::Alive);
    assert_eq!(m.member(&1).unwrap().incarnation, 0);
    assert_eq!(m.stats().claims_refused, 6);
    // Unsigned in a state piece too, and a member never seen is not made up.
    m.handle(
        1_001,
        whole_view(
            2,
            vec![
                forged(upd(1, 3, State::Left, None)),
                forged(upd(9, 0, State::Alive, None)),
            ],
        ),
    );
    assert_eq!(state(&m, 1), State::Alive);
    assert!(m.member(&9).is_none());
    assert_eq!(m.stats().claims_refused, 8);
    // The member's own leave, and an accusation at an incarnation it signed, are believed.
    m.handle(1_002, gossip(2, vec![upd(1, 0, State::Suspect, Some(2))]));
    assert_eq!(state(&m, 1), State::Suspect);
    m.handle(1_003, gossip(1, vec![upd(1, 1, State::Left, None)]));
    assert_eq!(state(&m, 1), State::Left);
    m.check_invariants().unwrap();
}

#[test]
fn a_forged_claim_changes_no_metadata() {
    let mut m = node(3, Config::default());
    let mut u = upd(1, 0, State::Suspect, Some(2));
    u.meta = 66;
    u.meta_version = 9;
    m.handle(1_000, gossip(2, vec![u]));
    let member = m.member(&1).unwrap();
    assert_eq!(
        (member.meta, member.meta_version, member.state),
        (0, 0, State::Alive)
    );
    assert_eq!(m.stats().claims_refused, 1);
}

#[test]
fn incarnations_are_bounded_and_jump_far_only_in_a_sync() {
    let mut m = node(4, Config::default());
    // Signed, but past the bound: refused wherever it comes from.
    m.handle(
        1_000,
        gossip(1, vec![upd(1, INCARNATION_MAX + 1, State::Alive, None)]),
    );
    assert_eq!(m.member(&1).unwrap().incarnation, 0);
    // A jump past INCARNATION_JUMP_MAX by datagram is refused; in a state piece believed.
    let far = upd(2, INCARNATION_JUMP_MAX + 1, State::Alive, None);
    m.handle(1_001, gossip(2, vec![far.clone()]));
    assert_eq!(m.member(&2).unwrap().incarnation, 0);
    m.handle(
        1_001,
        gossip(2, vec![upd(2, INCARNATION_JUMP_MAX, State::Alive, None)]),
    );
    assert_eq!(m.member(&2).unwrap().incarnation, INCARNATION_JUMP_MAX);
    m.handle(
        1_002,
        whole_view(3, vec![upd(3, 1 << 40, State::Alive, None)]),
    );
    assert_eq!(m.member(&3).unwrap().incarnation, 1 << 40);
    assert_eq!(m.stats().claims_refused, 2);
}

#[test]
fn a_member_signs_what_it_says_about_itself() {
    let mut m = node(3, Config::default());
    let actions = m.handle(1_000, gossip(1, vec![upd(0, 0, State::Suspect, Some(1))]));
    let mine: Vec<&Update<u32, u32>> = sends(&actions)
        .into_iter()
        .flat_map(|(_, msg)| msg.updates())
        .filter(|u| u.id == 0)
        .collect();
    assert!(!mine.is_empty(), "the refutation goes out");
    for u in mine {
        assert_eq!((u.incarnation, u.state), (1, State::Alive));
        assert_eq!(*u, ModelSigner::signed(u.clone()), "signed by its subject");
    }
    // New metadata, and its leave, too.
    m.handle(1_001, Event::SetMeta(5));
    let actions = m.handle(1_002, Event::Leave);
    let left = sends(&actions)
        .into_iter()
        .flat_map(|(_, msg)| msg.updates())
        .find(|u| u.id == 0 && u.state == State::Left)
        .expect("the leave goes out")
        .clone();
    assert_eq!((left.incarnation, left.meta, left.meta_version), (2, 5, 1));
    assert_eq!(left, ModelSigner::signed(left.clone()));
}

#[test]
fn a_member_can_always_refute_without_saturating() {
    let mut m = node(3, Config::default());
    // Only an older instance of this node could have signed INCARNATION_MAX (after 2^62
    // refutations): it refutes above it, one short of nothing.
    m.handle(
        1_000,
        whole_view(1, vec![upd(0, INCARNATION_MAX, State::Dead, None)]),
    );
    assert_eq!(m.local().incarnation, INCARNATION_MAX + 1);
    assert_eq!(m.local().state, State::Alive);
    // Nothing above the bound is believed, signed or not: the review's u64::MAX included.
    m.handle(
        1_001,
        gossip(
            1,
            vec![upd(0, INCARNATION_MAX + 1, State::Suspect, Some(1))],
        ),
    );
    m.handle(
        1_002,
        gossip(1, vec![forged(upd(0, u64::MAX, State::Dead, None))]),
    );
    m.handle(1_003, gossip(1, vec![upd(0, u64::MAX, State::Dead, None)]));
    assert_eq!(m.local().incarnation, INCARNATION_MAX + 1);
    assert_eq!(m.stats().claims_refused, 3);
}

proptest::proptest! {
    /// Whatever a key holder sends without its subject's signature (any member, incarnation,
    /// state, metadata; by datagram or in a state piece), the view does not move.
    #[test]
    fn an_unsigned_claim_never_moves_the_view(
        claims in proptest::collection::vec(arb_update(), 1..40),
        incarnations in proptest::collection::vec(proptest::prelude::any::<u64>(), 40),
        sigs in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20), 40),
        in_a_piece in proptest::prelude::any::<bool>(),
    ) {
        let mut m = node(6, Config::default());
        let before = view(&m);
        let forged: Vec<_> = claims
            .into_iter()
            .zip(incarnations)
            .zip(sigs)
            .map(|((mut u, incarnation), sig)| {
                u.id %= 6;
                u.incarnation = incarnation;
                u.sig = sig;
                u
            })
            .filter(|u| *u != ModelSigner::signed(u.clone()))
            .collect();
        let n = forged.len() as u64;
        for chunk in forged.chunks(Config::default().piggyback_max) {
            let event = if in_a_piece { whole_view(2, chunk.to_vec()) } else { gossip(2, chunk.to_vec()) };
            m.handle(1_000, event);
        }
        proptest::prop_assert_eq!(view(&m), before);
        proptest::prop_assert_eq!(m.stats().claims_refused, n);
        proptest::prop_assert!(m.check_invariants().is_ok());
    }
}
