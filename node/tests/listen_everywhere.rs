//! Nodes that listen on every interface of their hosts (`--listen 0.0.0.0:7070`) in network
//! namespaces, each host with an extra interface whose address is the same on every host (as
//! a container bridge's is): each node advertises that address too, and a datagram sent
//! there comes back to its sender's own host. Membership must still form, detect a killed
//! node and suspect nobody else: datagrams go to each advertised address until a member's
//! datagrams come, then where they come from; a node drops the ones it sent itself.
//!
//! Needs root and `ip netns`; otherwise it prints "SKIPPED: needs root and ip netns" and
//! passes. Every process is killed by PID and the namespaces removed, even on failure.

mod common;

use common::netns::{usable, Hosts, BRIDGE_ADDR};

const NODES: usize = 4;

#[test]
fn nodes_listening_everywhere_form_and_detect_a_death_despite_a_shared_bridge_address() {
    if !usable() {
        eprintln!("SKIPPED: needs root and ip netns");
        return;
    }
    let mut hosts = Hosts::up_listening_everywhere(NODES, "everywhere");
    let all: Vec<usize> = (1..=NODES).collect();
    hosts.wait(&all, "all alive everywhere", |s| {
        s.names_in("alive").len() == NODES
    });
    // The scenario is real: members advertise the bridge's address beside their own.
    let s = hosts.status(1).unwrap();
    for m in &s.members {
        assert!(
            m.p2p_addrs.iter().any(|a| a.contains(BRIDGE_ADDR)),
            "{} does not advertise {BRIDGE_ADDR}: {:?}",
            m.name,
            m.p2p_addrs
        );
    }

    hosts.kill(NODES);
    let survivors: Vec<usize> = (1..NODES).collect();
    hosts.wait(&survivors, "the killed node dead, the others alive", |s| {
        let dead = s.names_in("dead");
        dead == vec![format!("n{NODES}")] && s.names_in("alive").len() == NODES - 1
    });
    // Nobody suspected a live member: each survivor raised at most its one suspicion of
    // the killed node (a datagram lost to a wrong address would have failed probes).
    for &i in &survivors {
        let s = hosts.status(i).unwrap();
        assert!(
            s.counters.suspicions <= 1,
            "n{i} suspected live members: {:?}\n{}",
            s.counters,
            hosts.logs()
        );
        assert_eq!(s.counters.refused_datagrams, 0, "n{i}: {:?}", s.counters);
    }
}
