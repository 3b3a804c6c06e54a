//! Partition safety with real node processes in network namespaces (`scripts/netns.sh`):
//! 5 nodes split 2 | 3. The 2-side reports no chief and refuses writes with "no quorum"; the
//! 3-side keeps or elects a chief and accepts jobs; after healing there is one chief and every
//! node lists the same jobs. A poller records every node's (term, chief) about every 100 ms
//! throughout, and the test asserts that no term ever had two different chiefs.
//!
//! Needs root and `ip netns`; otherwise it prints "SKIPPED: needs root and ip netns" and
//! passes. Every process is killed by PID and the namespaces removed, even on failure.

mod common;

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use common::netns::{netns, usable, Hosts, WAIT};
use ringleader::api::client::ApiClient;
use ringleader::api::status::StatusDoc;

const NODES: usize = 5;
/// Poll period of the background poller.
const POLL: Duration = Duration::from_millis(100);

/// What the poller saw: for each term, the chief every node named in it.
#[derive(Default)]
struct Observed {
    /// term → (chief id, first node that named it).
    chiefs: BTreeMap<u64, (String, usize)>,
    /// Two different chiefs named for one term.
    conflicts: Vec<String>,
    samples: u64,
}

fn spawn_poller(
    stop: Arc<AtomicBool>,
    clients: Vec<ApiClient>,
) -> (Arc<Mutex<Observed>>, std::thread::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Observed::default()));
    let out = seen.clone();
    let handle = std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            for (i, c) in clients.iter().enumerate() {
                let Ok(s) = c.status() else { continue };
                let mut o = seen.lock().unwrap();
                o.samples += 1;
                let (Some(chief), Some(term)) = (s.chief, s.term) else {
                    continue;
                };
                match o.chiefs.get(&term) {
                    None => {
                        o.chiefs.insert(term, (chief.id.clone(), i + 1));
                    }
                    Some((id, first)) if *id != chief.id => {
                        let msg = format!(
                            "term {term}: n{first} named {id}, n{} named {} ({})",
                            i + 1,
                            chief.id,
                            chief.name
                        );
                        o.conflicts.push(msg);
                    }
                    Some(_) => {}
                }
            }
            std::thread::sleep(POLL);
        }
    });
    (out, handle)
}

fn job_states(s: &StatusDoc) -> Vec<(String, String)> {
    let mut v: Vec<_> = s
        .jobs
        .iter()
        .map(|j| (j.id.clone(), j.state.clone()))
        .collect();
    v.sort();
    v
}

const TRIVIAL: &str = "name = \"t\"\nkind = \"command\"\nworkers = 1\ncommand = [\"true\"]\n";

#[test]
fn a_two_three_split_keeps_one_chief_per_term_and_only_the_majority_writes() {
    if !usable() {
        println!("SKIPPED: needs root and ip netns");
        return;
    }
    let all: Vec<usize> = (1..=NODES).collect();
    let hosts = Hosts::up(NODES, "partition", |_| Vec::new());
    let (seen, poller) = spawn_poller(
        hosts.stop.clone(),
        (1..=NODES).map(|i| hosts.client(i)).collect(),
    );

    // Phase: the cluster forms (5 alive everywhere, a chief, 3 voters).
    hosts.wait(&all, "formed", |s| {
        s.names_in("alive").len() == NODES
            && s.chief.is_some()
            && s.members.iter().filter(|m| m.voter).count() == 3
    });

    // Phase: choose the split. The 2-side holds the chief (one voter, so it must step down)
    // and a non-voter; the 3-side holds the other two voters: a quorum of the three.
    let s = hosts.status(1).unwrap();
    let chief = s.chief.clone().unwrap();
    let index_of = |name: &str| name.trim_start_matches('n').parse::<usize>().unwrap();
    let chief_i = index_of(&chief.name);
    let learner_i = s
        .members
        .iter()
        .filter(|m| !m.voter)
        .map(|m| index_of(&m.name))
        .min()
        .expect("a non-voter");
    let minority = vec![chief_i, learner_i];
    let majority: Vec<usize> = all
        .iter()
        .copied()
        .filter(|i| !minority.contains(i))
        .collect();
    let group = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    eprintln!("chief n{chief_i}; cutting {minority:?} | {majority:?}");
    netns(&["partition", &group(&minority), &group(&majority)]);
    let minority_names: Vec<String> = minority.iter().map(|i| format!("n{i}")).collect();

    // Phase: the 2-side reports no chief; the 3-side has one of its own and sees the 2-side
    // gone (so placement does not pick it).
    hosts.wait(&minority, "no chief on the 2-side", |s| s.chief.is_none());
    hosts.wait(&majority, "a chief on the 3-side", |s| {
        s.chief
            .as_ref()
            .is_some_and(|c| !minority_names.contains(&c.name))
            && minority_names
                .iter()
                .all(|n| !s.names_in("alive").contains(n))
    });
    for &i in &minority {
        let start = Instant::now();
        let err = hosts
            .client(i)
            .submit(TRIVIAL)
            .expect_err("a write on the 2-side must fail")
            .to_string();
        assert!(
            err.contains("no quorum") || err.contains("no chief"),
            "n{i}: {err}"
        );
        eprintln!(
            "n{i} refused a write in {} ms: {err}",
            start.elapsed().as_millis()
        );
    }
    let id = hosts.client(majority[0]).submit(TRIVIAL).expect("submit");
    hosts.wait(&majority, "the job succeeds on the 3-side", |s| {
        job_states(s) == vec![(id.clone(), "succeeded".to_string())]
    });

    // Phase: heal; one chief everywhere, and every node lists the same jobs and states.
    netns(&["heal"]);
    hosts.wait(&all, "one chief and the same jobs after healing", |s| {
        s.chief.is_some() && job_states(s) == vec![(id.clone(), "succeeded".to_string())]
    });
    let mut chiefs = std::collections::BTreeSet::new();
    let deadline = Instant::now() + WAIT;
    loop {
        chiefs.clear();
        for &i in &all {
            if let Ok(s) = hosts.status(i) {
                chiefs.insert(s.chief.map(|c| c.id));
            }
        }
        if chiefs.len() == 1 && !chiefs.contains(&None) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "chiefs after healing: {chiefs:?}"
        );
        std::thread::sleep(POLL);
    }

    // Across the whole run, no term had two chiefs.
    hosts.stop.store(true, Ordering::SeqCst);
    poller.join().unwrap();
    let o = seen.lock().unwrap();
    eprintln!(
        "poller: {} samples, terms with a chief: {:?}",
        o.samples,
        o.chiefs.keys().collect::<Vec<_>>()
    );
    assert!(o.samples > 0);
    assert!(o.conflicts.is_empty(), "{:?}", o.conflicts);
}
