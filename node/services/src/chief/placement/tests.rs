use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

pub(crate) fn member(name: &str, cpus: u32, gpus: u32) -> Candidate {
    Candidate {
        id: format!("id-{name}"),
        name: name.into(),
        alive: true,
        blacklisted: false,
        cpus,
        gpus: (0..gpus).collect(),
        used_cpus: 0,
        used_gpus: BTreeSet::new(),
    }
}

fn req(workers: u32, cpus: u32, gpus: u32, placement: Placement) -> Request {
    Request {
        workers,
        cpus_per_worker: cpus,
        gpus_per_worker: gpus,
        placement,
    }
}

fn names(slots: &[Slot]) -> Vec<&str> {
    slots.iter().map(|s| s.name.as_str()).collect()
}

#[test]
fn spread_puts_one_worker_per_member_in_name_order() {
    let ms = [member("c", 8, 0), member("a", 8, 0), member("b", 8, 0)];
    let slots = place(&ms, &req(3, 1, 0, Placement::Spread)).unwrap();
    assert_eq!(names(&slots), ["a", "b", "c"]);
    assert!(slots
        .iter()
        .enumerate()
        .all(|(i, s)| s.rank as usize == i && s.local_rank == 0));
    assert_eq!(slots[0].member, "id-a");
}

#[test]
fn a_trials_run_waits_for_room_at_home_and_goes_elsewhere_only_once_home_is_gone() {
    let one = req(1, 1, 0, Placement::Spread);
    let mut ms = [member("a", 1, 0), member("b", 4, 0)];
    // Home has room: the run goes there, though b has more.
    let slots = place_at_home(&ms, &one, Some("id-a")).unwrap();
    assert_eq!(names(&slots), ["a"]);
    // Home is full: the run waits, saying where and why, while b idles.
    ms[0].used_cpus = 1;
    let e = place_at_home(&ms, &one, Some("id-a")).unwrap_err();
    assert!(
        e.reason
            .starts_with("waits for room on a, which holds its checkpoint"),
        "{e}"
    );
    // Home dead, blacklisted, unknown, or too small even idle: anywhere.
    for gone in [
        |c: &mut Candidate| c.alive = false,
        |c: &mut Candidate| c.blacklisted = true,
    ] {
        let mut ms = ms.clone();
        gone(&mut ms[0]);
        assert_eq!(
            names(&place_at_home(&ms, &one, Some("id-a")).unwrap()),
            ["b"]
        );
    }
    assert_eq!(
        names(&place_at_home(&ms, &one, Some("id-x")).unwrap()),
        ["b"]
    );
    assert_eq!(names(&place_at_home(&ms, &one, None).unwrap()), ["b"]);
    let two = req(2, 1, 0, Placement::Pack);
    assert_eq!(
        names(&place_at_home(&ms, &two, Some("id-a")).unwrap()),
        ["b", "b"]
    );
}

#[test]
fn spread_prefers_members_with_most_room() {
    let mut busy = member("a", 8, 0);
    busy.used_cpus = 7;
    let ms = [busy, member("b", 8, 0), member("c", 4, 0)];
    let slots = place(&ms, &req(2, 1, 0, Placement::Spread)).unwrap();
    assert_eq!(names(&slots), ["b", "c"]);
    // Five workers: b and c twice each (most room), a once.
    let slots = place(&ms, &req(5, 1, 0, Placement::Spread)).unwrap();
    assert_eq!(names(&slots), ["a", "b", "b", "c", "c"]);
    assert_eq!(
        slots.iter().map(|s| s.local_rank).collect::<Vec<_>>(),
        [0, 0, 1, 0, 1]
    );
}

#[test]
fn pack_fills_the_biggest_member_first() {
    let ms = [member("a", 2, 0), member("b", 8, 0), member("c", 4, 0)];
    let slots = place(&ms, &req(4, 1, 0, Placement::Pack)).unwrap();
    assert_eq!(names(&slots), ["b", "b", "b", "b"]);
    let slots = place(&ms, &req(10, 1, 0, Placement::Pack)).unwrap();
    assert_eq!(
        names(&slots),
        ["b", "b", "b", "b", "b", "b", "b", "b", "c", "c"]
    );
    assert_eq!(slots[9].local_rank, 1);
}

#[test]
fn gpus_bound_capacity() {
    let ms = [member("a", 64, 2), member("b", 64, 0), member("c", 64, 4)];
    let slots = place(&ms, &req(3, 1, 2, Placement::Spread)).unwrap();
    assert_eq!(names(&slots), ["a", "c", "c"]);
    let e = place(&ms, &req(4, 1, 2, Placement::Spread)).unwrap_err();
    assert_eq!(
        e.reason,
        "needs 4 workers with 1 cpu and 2 gpus each; 3 alive members have room for 3"
    );
}

fn devices(slots: &[Slot]) -> Vec<Vec<u32>> {
    slots.iter().map(|s| s.gpus.clone()).collect()
}

#[test]
fn workers_get_the_lowest_free_devices_and_never_share_one() {
    let mut ms = [member("a", 8, 4)];
    let one = req(2, 1, 1, Placement::Pack);
    let first = place(&ms, &one).unwrap();
    assert_eq!(devices(&first), [vec![0], vec![1]]);
    take(&mut ms, &first, &one);
    let second = place(&ms, &one).unwrap();
    assert_eq!(
        devices(&second),
        [vec![2], vec![3]],
        "disjoint from the first"
    );
    take(&mut ms, &second, &one);
    assert!(
        place(&ms, &req(1, 1, 1, Placement::Pack)).is_err(),
        "all held"
    );
    // Device 1 freed: the next worker gets it; a job without gpus gets none.
    ms[0].used_gpus.remove(&1);
    let third = place(&ms, &req(1, 1, 1, Placement::Pack)).unwrap();
    assert_eq!(devices(&third), [vec![1]]);
    assert_eq!(
        devices(&place(&ms, &req(1, 1, 0, Placement::Pack)).unwrap()),
        [Vec::<u32>::new()]
    );
    // Two per worker, in rank order within each member; members offer their own indices.
    let mut b = member("b", 8, 0);
    b.gpus = vec![7, 3, 5, 1];
    let slots = place(&[member("a", 8, 2), b], &req(3, 1, 2, Placement::Spread)).unwrap();
    assert_eq!(names(&slots), ["a", "b", "b"]);
    assert_eq!(devices(&slots), [vec![0, 1], vec![1, 3], vec![5, 7]]);
}

#[test]
fn reason_counts_excluded_members() {
    let mut dead = member("d", 8, 0);
    dead.alive = false;
    let mut black = member("e", 8, 0);
    black.blacklisted = true;
    let ms = [
        member("a", 1, 0),
        member("b", 1, 0),
        member("c", 1, 0),
        dead,
        black,
    ];
    let e = place(&ms, &req(4, 1, 0, Placement::Spread)).unwrap_err();
    assert_eq!(
            e.reason,
            "needs 4 workers with 1 cpu each; 3 alive members have room for 3 (1 blacklisted, 1 not alive left out)"
        );
    let e = place(&[], &req(1, 2, 0, Placement::Pack)).unwrap_err();
    assert_eq!(
        e.reason,
        "needs 1 worker with 2 cpus each; 0 alive members have room for 0"
    );
}

#[test]
fn used_resources_are_respected() {
    let mut a = member("a", 4, 0);
    a.used_cpus = 4;
    let mut b = member("b", 4, 0);
    b.used_cpus = 9; // more than it has (stale report): no room, no underflow
    let e = place(&[a, b], &req(1, 1, 0, Placement::Spread)).unwrap_err();
    assert!(
        e.reason.ends_with("2 alive members have room for 0"),
        "{}",
        e.reason
    );
}

#[test]
fn ties_broken_by_name_then_id() {
    let mut x = member("same", 4, 0);
    x.id = "id-2".into();
    let mut y = member("same", 4, 0);
    y.id = "id-1".into();
    let slots = place(&[x.clone(), y.clone()], &req(1, 1, 0, Placement::Pack)).unwrap();
    assert_eq!(slots[0].member, "id-1");
    let slots2 = place(&[y, x], &req(1, 1, 0, Placement::Pack)).unwrap();
    assert_eq!(slots, slots2);
}

#[test]
fn request_from_spec() {
    let spec = JobSpec::parse(
            "name = \"a\"\nkind = \"train\"\nworkers = 3\nplacement = \"pack\"\n[resources]\ncpus_per_worker = 2\ngpus_per_worker = 1\n",
        )
        .unwrap();
    assert_eq!(Request::from_spec(&spec), req(3, 2, 1, Placement::Pack));
}

fn arb_candidate() -> impl Strategy<Value = Candidate> {
    (
        0u8..6,
        0u8..3,
        any::<bool>(),
        any::<bool>(),
        0u32..9,
        0u32..4,
        0u32..6,
        0u32..3,
    )
        .prop_map(
            |(n, id, alive, black, cpus, gpus, ucpus, ugpus)| Candidate {
                id: format!("id-{id}-{n}"),
                name: format!("m{n}"),
                alive: alive || black, // bias towards alive
                blacklisted: black && !alive,
                cpus,
                gpus: (0..gpus).collect(),
                used_cpus: ucpus,
                // Held devices may be ones the member no longer offers (it restarted
                // with fewer).
                used_gpus: (0..ugpus).map(|g| g * 2).collect(),
            },
        )
}

proptest! {
    #[test]
    fn placement_invariants(
        raw in proptest::collection::vec(arb_candidate(), 0..8),
        workers in 1u32..12,
        cpw in 1u32..4,
        gpw in 0u32..3,
        pack in any::<bool>(),
    ) {
        // Peer ids are unique in a real view.
        let mut seen = std::collections::BTreeSet::new();
        let ms: Vec<Candidate> = raw.into_iter().filter(|c| seen.insert(c.id.clone())).collect();
        let placement = if pack { Placement::Pack } else { Placement::Spread };
        let r = req(workers, cpw, gpw, placement);
        let room: u64 = ms.iter().filter(|c| c.alive && !c.blacklisted).map(|c| capacity(c, &r)).sum();
        match place(&ms, &r) {
            Err(_) => prop_assert!(room < u64::from(workers)),
            Ok(slots) => {
                prop_assert_eq!(slots.len(), workers as usize);
                // Ranks contiguous 0..n.
                for (i, s) in slots.iter().enumerate() {
                    prop_assert_eq!(s.rank as usize, i);
                }
                let mut per: BTreeMap<&str, u32> = BTreeMap::new();
                for s in &slots {
                    *per.entry(s.member.as_str()).or_default() += 1;
                }
                // Never over-commits, only eligible members.
                for (id, n) in &per {
                    let c = ms.iter().find(|c| c.id == *id).unwrap();
                    prop_assert!(c.alive && !c.blacklisted);
                    prop_assert!(u64::from(*n) <= capacity(c, &r));
                    prop_assert!(c.used_cpus + n * cpw <= c.cpus);
                    prop_assert!(free_gpus(c).len() as u32 >= n * gpw);
                }
                // Devices: gpw each, offered by the member, free, never shared.
                let mut given = std::collections::BTreeSet::new();
                for s in &slots {
                    let c = ms.iter().find(|c| c.id == s.member).unwrap();
                    prop_assert_eq!(s.gpus.len(), gpw as usize);
                    for g in &s.gpus {
                        prop_assert!(c.gpus.contains(g) && !c.used_gpus.contains(g));
                        prop_assert!(given.insert((s.member.clone(), *g)), "shared: {:?}", slots);
                    }
                }
                // Same member adjacent, local ranks count within it.
                let mut runs: Vec<&str> = Vec::new();
                for (i, s) in slots.iter().enumerate() {
                    if i == 0 || slots[i - 1].member != s.member {
                        prop_assert!(!runs.contains(&s.member.as_str()), "member split: {:?}", slots);
                        runs.push(&s.member);
                        prop_assert_eq!(s.local_rank, 0);
                    } else {
                        prop_assert_eq!(s.local_rank, slots[i - 1].local_rank + 1);
                    }
                }
                let mut caps: Vec<u64> = ms.iter().filter(|c| c.alive && !c.blacklisted)
                    .map(|c| capacity(c, &r)).collect();
                caps.sort_unstable_by(|a, b| b.cmp(a));
                if pack {
                    // Fewest members possible.
                    let mut acc = 0;
                    let fewest = caps.iter().take_while(|c| { let before = acc; acc += **c; before < u64::from(workers) }).count();
                    prop_assert_eq!(per.len(), fewest);
                } else {
                    // Balanced: a member below max - 1 is at capacity.
                    let max = per.values().copied().max().unwrap();
                    for c in ms.iter().filter(|c| c.alive && !c.blacklisted) {
                        let n = per.get(c.id.as_str()).copied().unwrap_or(0);
                        prop_assert!(n + 1 >= max || u64::from(n) == capacity(c, &r));
                    }
                }
                // Deterministic under input order.
                let mut rev = ms.clone();
                rev.reverse();
                prop_assert_eq!(place(&rev, &r).unwrap(), slots);
            }
        }
    }
}
