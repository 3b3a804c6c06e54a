use super::*;

#[test]
fn a_settled_cluster_syncs_in_step_and_spreads_a_death() {
    let f = run_scale_benchmark(300, Config::default(), 0.0, 11);
    assert!(f.death_spread_s < 10.0, "{f:?}");
    assert_eq!(f.false_suspicions, 0, "{f:?}");
    assert!(f.bytes_per_member_s > 0.0, "{f:?}");
    // Views are in step, so no sync needs a state piece.
    assert_eq!(f.pieces_per_member_s, 0.0, "{f:?}");
}

fn dead_or_gone(m: Option<&Member<u32, SimMeta>>) -> bool {
    m.is_none_or(|m| m.state == State::Dead)
}

/// A converged cluster of `n` on `Config::for_test()`.
fn cluster(n: usize, net: NetConfig, seed: u64) -> Sim {
    let mut sim = Sim::new(n, Config::for_test(), net, seed);
    sim.join_all(0, 10);
    let t = sim.run_until(60_000, Sim::converged);
    assert!(t.is_some(), "seed {seed}: {n} members did not converge");
    sim.check_invariants()
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    sim
}

#[test]
fn large_lossy_cluster_joins_and_learns_of_a_death() {
    for seed in [1, 2] {
        let net = NetConfig {
            loss: 0.05,
            ..NetConfig::default()
        };
        let mut sim = cluster(200, net, seed);
        let victim = 1 + (seed as u32 * 37) % 199;
        sim.crash(victim);
        let t = sim.run_until(30_000, |s| s.all_see(victim, dead_or_gone));
        assert!(
            t.is_some(),
            "seed {seed}: death of {victim} not known to all"
        );
        // Nobody else was taken for dead on the way.
        let wrongly_dead = sim
            .running()
            .flat_map(|m| m.members())
            .filter(|m| m.id != victim && m.state != State::Alive)
            .count();
        assert_eq!(wrongly_dead, 0, "seed {seed}: live members marked down");
        sim.check_invariants()
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}

#[test]
fn leave_is_seen_as_left_at_once() {
    let seed = 3;
    let mut sim = cluster(8, NetConfig::default(), seed);
    sim.inject(3, Event::Leave);
    sim.run_for(10); // well under one probe interval
    assert!(
        sim.all_see(3, |m| m
            .is_some_and(|m| m.state == State::Left && m.incarnation == 1)),
        "seed {seed}: leave not seen at once"
    );
}

#[test]
fn restarted_member_refutes_its_death_and_is_alive_everywhere() {
    let seed = 4;
    let mut sim = cluster(12, NetConfig::default(), seed);
    // Give member 5 a non-zero incarnation first: it refutes a suspicion.
    sim.inject(
        5,
        Event::Message {
            from: 1,
            msg: Message::Gossip {
                updates: vec![sim.view(1, 5).unwrap().to_update(None)]
                    .into_iter()
                    .map(|mut u| {
                        u.state = State::Suspect;
                        u.from = Some(1);
                        // Resting on 5's own signature of that incarnation, as node 1
                        // would send it.
                        super::super::claims::ModelSigner::signed(u)
                    })
                    .collect(),
            },
        },
    );
    sim.run_for(1);
    assert_eq!(sim.node(5).unwrap().local().incarnation, 1);
    assert!(sim
        .run_until(5_000, |s| s
            .all_see(5, |m| m.is_some_and(|m| m.incarnation == 1)))
        .is_some());
    sim.crash(5);
    assert!(
        sim.run_until(10_000, |s| s.all_see(5, dead_or_gone))
            .is_some(),
        "seed {seed}"
    );
    sim.restart(5, vec![0]);
    let t = sim.run_until(10_000, |s| {
        s.all_see(5, |m| m.is_some_and(|m| m.state == State::Alive))
    });
    assert!(
        t.is_some(),
        "seed {seed}: restarted member not alive everywhere"
    );
    assert_eq!(
        sim.node(5).unwrap().local().incarnation,
        2,
        "refuted dead(1) with 1 + 1"
    );
    assert!(
        sim.run_until(10_000, Sim::converged).is_some(),
        "seed {seed}"
    );
    sim.check_invariants().unwrap();
}

#[test]
fn partition_heals_and_both_sides_merge_back_to_alive() {
    let seed = 5;
    let mut sim = cluster(20, NetConfig::default(), seed);
    let (a, b): (Vec<u32>, Vec<u32>) = (0..20).partition(|id| id % 2 == 0);
    sim.partition(&[a.clone(), b.clone()]);
    let split = sim.run_until(30_000, |s| {
        a.iter().all(|&x| {
            b.iter()
                .all(|&y| dead_or_gone(s.view(x, y)) && dead_or_gone(s.view(y, x)))
        })
    });
    assert!(
        split.is_some(),
        "seed {seed}: the sides did not mark each other dead"
    );
    sim.heal();
    let merged = sim.run_until(60_000, Sim::converged);
    assert!(merged.is_some(), "seed {seed}: partition did not heal");
    assert!(
        sim.running().all(|m| m.local().incarnation >= 1),
        "everyone refuted its death"
    );
    sim.check_invariants().unwrap();
}

#[test]
fn a_healed_minority_does_not_kill_the_majority_with_its_old_verdicts() {
    // 2 | 3: each side declares the other dead, and the minority still carries its verdicts
    // when the partition heals (its two members gossip them to each other only). Taken as
    // they are, they killed members of the majority in the majority's own eyes (a real
    // 5-node cluster lost a running ring that way); as suspicions, the accused refute them.
    for seed in [21, 22, 23, 24, 25] {
        let mut sim = cluster(5, NetConfig::default(), seed);
        let (minority, majority) = (vec![1, 2], vec![0, 3, 4]);
        sim.partition(&[minority.clone(), majority.clone()]);
        let split = sim.run_until(30_000, |s| {
            minority.iter().all(|&x| {
                majority
                    .iter()
                    .all(|&y| dead_or_gone(s.view(x, y)) && dead_or_gone(s.view(y, x)))
            })
        });
        assert!(split.is_some(), "seed {seed}: the sides did not split");
        let healed_at = sim.now_ms();
        sim.heal();
        assert!(
            sim.run_until(60_000, Sim::converged).is_some(),
            "seed {seed}: did not merge"
        );
        let wrong: Vec<_> = sim
            .deaths
            .iter()
            .filter(|(observer, about, at)| {
                *at >= healed_at && majority.contains(observer) && majority.contains(about)
            })
            .collect();
        assert!(
            wrong.is_empty(),
            "seed {seed}: majority members killed by old verdicts: {wrong:?}"
        );
        sim.check_invariants().unwrap();
    }
}

#[test]
fn metadata_update_spreads() {
    let seed = 6;
    let mut sim = cluster(30, NetConfig::default(), seed);
    sim.inject(7, Event::SetMeta(SimMeta { label: 42 }));
    let t = sim.run_until(5_000, |s| {
        s.all_see(7, |m| {
            m.is_some_and(|m| m.meta.label == 42 && m.meta_version == 1)
        })
    });
    assert!(t.is_some(), "seed {seed}: metadata did not spread");
}

#[test]
fn loaded_member_is_not_suspected_with_default_timers() {
    // 40 ms more each way (a saturated host) stays inside the default probe timeout.
    let seed = 8;
    let mut sim = Sim::new(6, Config::default(), NetConfig::default(), seed);
    sim.join_all(0, 10);
    assert!(sim.run_until(10_000, Sim::converged).is_some());
    sim.set_delay(4, 40);
    sim.run_for(20_000);
    let suspicions: u64 = sim.running().map(|m| m.stats().suspicions_raised).sum();
    assert_eq!(suspicions, 0, "seed {seed}: a loaded member was suspected");
    assert!(sim.converged());
}

#[test]
fn unreachable_hints_speed_up_detection() {
    let seed = 9;
    let hinted = NetConfig {
        unreachable_hints: true,
        ..NetConfig::default()
    };
    let with = run_benchmark_on(5, Config::default(), hinted, seed);
    let without = run_benchmark_on(5, Config::default(), NetConfig::default(), seed);
    assert!(with.detect_s < 2.0, "seed {seed}: {with:?}");
    assert!(
        with.detect_s <= without.detect_s,
        "seed {seed}: {with:?} vs {without:?}"
    );
}

/// `cargo test --release -- --ignored --nocapture benchmark` prints the figures.
#[test]
#[ignore = "benchmark: run in release"]
fn benchmark_figures() {
    let hinted = NetConfig {
        unreachable_hints: true,
        ..NetConfig::default()
    };
    for seed in [42, 43, 44] {
        println!(
            "5 members, unreachable hints: {:?}",
            run_benchmark_on(5, Config::default(), hinted.clone(), seed)
        );
    }
    for n in [5usize, 100, 1000] {
        let start = std::time::Instant::now();
        let f = run_benchmark(n, Config::default(), 0.0, 42);
        println!("{f:?} (wall {:.1} s)", start.elapsed().as_secs_f64());
    }
}

/// Tasks that derive something from the view (the supervisor's members' hosts) look again
/// only when the core reports a change (`NodeHandle::member_changes`): in a formed, idle
/// cluster nothing may be reported however long it runs, and a death must be.
#[test]
fn an_idle_cluster_reports_no_change_until_a_member_dies() {
    let mut sim = Sim::new(16, Config::default(), NetConfig::default(), 5);
    sim.join_all(0, 10);
    assert!(
        sim.run_until(60_000, Sim::converged).is_some(),
        "16 members did not converge"
    );
    // Past the first rounds of push-pull (15 s, scaled) and reconnects.
    sim.run_for(30_000);
    let before = sim.changes;
    sim.run_for(120_000);
    assert_eq!(
        sim.changes,
        before,
        "an idle cluster reported {} changes in 120 s",
        sim.changes - before
    );
    sim.crash(7);
    let t = sim.run_until(30_000, |s| s.all_see(7, dead_or_gone));
    assert!(t.is_some(), "the death of 7 not known to all");
    assert!(
        sim.changes >= before + 15,
        "a death must be reported by every survivor: {} changes",
        sim.changes - before
    );
}

/// The review's H2 in the simulation: a key holder tells every member that member 5 is dead
/// at 2^64 - 1, suspect far above its incarnation and left, without 5's signature. Nobody
/// believes it; 5 stays alive at incarnation 0 everywhere, long past every suspicion
/// timeout, and every member counted the claims it refused.
#[test]
fn forged_claims_evict_nobody() {
    let seed = 9;
    let mut sim = cluster(8, NetConfig::default(), seed);
    let victim = 5;
    let forged = |incarnation: u64, state: State| {
        let mut u = sim.view(1, victim).unwrap().to_update(Some(1));
        u.incarnation = incarnation;
        u.state = state;
        u
    };
    let updates = vec![
        forged(u64::MAX, State::Dead),
        forged(1 << 40, State::Suspect),
        forged(1, State::Left),
        forged(1, State::Dead),
    ];
    for id in 0..8 {
        sim.inject(
            id,
            Event::Message {
                from: 1 + (id + 1) % 7,
                msg: Message::Gossip {
                    updates: updates.clone(),
                },
            },
        );
    }
    sim.run_for(30_000);
    assert!(
        sim.all_see(victim, |m| m
            .is_some_and(|m| m.state == State::Alive && m.incarnation == 0)),
        "seed {seed}: the forged claims were believed"
    );
    for m in sim.running() {
        assert!(m.stats().claims_refused >= 4, "{:?}", m.stats());
    }
}
