//! A 2 | 3 partition while an elastic train job runs across it, with real nodes in network
//! namespaces (`scripts/netns.sh`): one worker per host, 5 in all. The majority re-forms the
//! ring and trains on; the minority's ranks stop (a node without a chief for
//! `FENCE_AFTER_MS` stops its ranks); after healing the ring grows back to 5 and the job
//! finishes, having never run two attempts. Needs root and `ip netns`; otherwise SKIPPED.

mod common;

use std::{
    process::Command,
    time::{Duration, Instant},
};

use common::netns::{netns, usable, Hosts};
use ringleader::api::status::JobDoc;

const NODES: usize = 5;
const WAIT: Duration = Duration::from_secs(90);
/// For the job to finish after healing: 1,200 steps of at least 20 ms each, less those done
/// before, on a loaded 2-core host. (The ring grows back at about step 500 here: the
/// partition, the minority's fence and the heal take about 10 s, the member's
/// `rejoin_after_s` 1 s, and the step delay caps the steps at 50 a second.)
const FINISH_WAIT: Duration = Duration::from_secs(240);

const JOB: &str = r#"
name = "across"
kind = "train"
workers = 5
min_workers = 2
max_workers = 5
max_restarts = 0
env = { RINGLEADER_NO_SHM = "true" }
[resources]
cpus_per_worker = 2
[model]
arch = "mlp"
hidden = [32]
[data]
dataset = "digits"
[train]
epochs = 1000
max_steps = 1200
batch_per_worker = 16
lr = 0.05
[checkpoint]
every_steps = 100000
keep = 1
commit_every_steps = 5
[elastic]
rejoin_after_s = 1
"#;

/// Train workers of job `id` running in host `i`'s namespace.
fn workers_in(i: usize, id: &str) -> usize {
    let out = Command::new("ip")
        .args(["netns", "pids", &common::netns::namespace(i)])
        .output()
        .expect("ip netns pids");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains("train-worker") && cmd.contains(id)
        })
        .count()
}

fn job(hosts: &Hosts, i: usize, id: &str) -> Option<JobDoc> {
    hosts.client(i).job(id).ok()
}

fn wait_job(
    hosts: &Hosts,
    i: usize,
    id: &str,
    what: &str,
    cond: impl Fn(&JobDoc) -> bool,
) -> JobDoc {
    wait_job_for(hosts, i, id, what, WAIT, cond)
}

fn wait_job_for(
    hosts: &Hosts,
    i: usize,
    id: &str,
    what: &str,
    wait: Duration,
    cond: impl Fn(&JobDoc) -> bool,
) -> JobDoc {
    let start = Instant::now();
    let deadline = start + wait;
    loop {
        if let Some(d) = job(hosts, i, id) {
            if cond(&d) {
                println!("{what}: after {:.1} s", start.elapsed().as_secs_f64());
                return d;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {wait:?}; last {d:#?}\n{}",
                hosts.logs()
            );
        } else {
            assert!(
                Instant::now() < deadline,
                "{what}: job not readable\n{}",
                hosts.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_partition_stops_the_minority_ranks_and_the_ring_grows_back_after_healing() {
    if !usable() {
        println!("SKIPPED: needs root and ip netns");
        return;
    }
    // The test-only step delay (20 ms a step) reaches the ranks through the nodes'
    // environment, inherited from this process's (`ip netns exec` keeps it): a spec's `env`
    // may not name a test hook. The only test of this file, so no other thread reads it.
    std::env::set_var("RINGLEADER_TEST_STEP_DELAY_MS", "20");
    let hosts = Hosts::up(NODES, "partition-elastic", |_| {
        vec!["--cpus".into(), "2".into()]
    });
    let all: Vec<usize> = (1..=NODES).collect();
    hosts.wait(&all, "formed", |s| {
        s.names_in("alive").len() == NODES
            && s.chief.is_some()
            && s.members.iter().filter(|m| m.voter).count() == 3
    });
    // The minority is two hosts without the chief and with at most one of the three voters
    // (two voters would make the two-host side the one with a quorum): a non-chief voter
    // and a non-voter, so the chief's side loses a voter too and must still go on.
    let formed = hosts.status(1).unwrap();
    let host = |name: &str| -> usize { name.trim_start_matches('n').parse().unwrap() };
    let chief_host = host(&formed.chief.unwrap().name);
    let voter = |i: usize| formed.members.iter().any(|m| m.voter && host(&m.name) == i);
    let minority: Vec<usize> = [
        all.iter().copied().find(|&i| i != chief_host && voter(i)),
        all.iter().copied().find(|&i| !voter(i)),
    ]
    .into_iter()
    .map(|i| i.expect("three voters among five members"))
    .collect();
    println!("chief n{chief_host}, minority {minority:?}");
    let majority: Vec<usize> = all
        .iter()
        .copied()
        .filter(|i| !minority.contains(i))
        .collect();
    let id = hosts.client(chief_host).submit(JOB).unwrap();
    let started = wait_job(&hosts, chief_host, &id, "all 5 training", |d| {
        d.state == "running" && d.ring.len() == NODES && d.step.unwrap_or(0) > 20
    });
    let attempt = started.attempt;

    let group = |g: &[usize]| {
        g.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    netns(&["partition", &group(&minority), &group(&majority)]);
    // The majority re-forms without the minority and trains on.
    let reformed = wait_job(&hosts, chief_host, &id, "re-formed on the majority", |d| {
        d.ring.len() == majority.len()
    });
    let step = reformed.step.unwrap_or(0);
    wait_job(&hosts, chief_host, &id, "training on the majority", |d| {
        d.step.unwrap_or(0) > step + 20
    });
    // The minority's ranks stop.
    let deadline = Instant::now() + WAIT;
    while minority.iter().any(|&i| workers_in(i, &id) > 0) {
        assert!(
            Instant::now() < deadline,
            "the minority's ranks still run\n{}",
            hosts.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    netns(&["heal"]);
    let grown = wait_job(&hosts, chief_host, &id, "the ring grows back to 5", |d| {
        d.ring.len() == NODES
    });
    assert_eq!(grown.attempt, attempt, "a re-form is not a new attempt");
    println!(
        "grown back at step {:?} (of the spec's max_steps)",
        grown.step
    );
    let done = wait_job_for(&hosts, chief_host, &id, "finished", FINISH_WAIT, |d| {
        matches!(d.state.as_str(), "succeeded" | "failed" | "cancelled")
    });
    assert_eq!(done.state, "succeeded", "{done:#?}");
    assert_eq!(done.attempt, attempt, "the job never ran a second attempt");
    for i in all {
        assert_eq!(workers_in(i, &id), 0, "a worker outlived the job on n{i}");
    }
}
