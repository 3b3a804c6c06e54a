//! The hierarchical allreduce schedule, chosen by placement: pure, no I/O.
//!
//! Ranks that share a host are grouped; the lowest rank of each host is its **leader**.
//! Phase 1 (local reduce): every other rank of a host hands its buffer to the leader (on a
//! real host through shared memory, `shm`), which reduces them into its own in ascending
//! rank order. Phase 2 (leader ring): the leaders run the ring allreduce of
//! [`crate::schedule::ring_plan`] among themselves, leader `i` (hosts ordered by their
//! lowest rank) being ring rank `i`. Phase 3 (local broadcast): each leader copies the
//! result to the other ranks of its host.
//!
//! **Placement.** A rank's host is what its data-plane address says: ranks whose addresses
//! carry the same IP share a host ([`Hierarchy::from_addrs`]), the same key the data plane
//! already uses to choose the shared-memory path between two ranks. Emulated hosts that
//! share one kernel (network namespaces, distinct IPs) are therefore distinct hosts here.
//!
//! **When.** Only when it helps: at least two hosts and at least one host with two ranks
//! ([`Hierarchy::worthwhile`]). The ring among `H` leaders takes `2·(H − 1)` rounds instead
//! of `2·(N − 1)`, plus the two local phases; every host's NIC carries `2·(H − 1)/H` of the
//! buffer each way, the flat ring's `2·(N − 1)/N` per crossing link (see [`Cost`]).
//!
//! **Run.** The communicator's engine walks [`Hierarchy::plan`] over its links (to the host's
//! leader, between neighbouring leaders; TCP, or shared memory where both ends allow it),
//! with frames tagged `Algorithm::Hierarchical`; `Avg` is divided by the whole world in
//! the leaders' ring, and every rank ends with its leader's bits. `collective/tests/
//! hierarchical.rs` checks it against the flat ring on 127.0.0.x "hosts".
//!
//! Invariant (property-tested against the flat ring on random integer inputs and random
//! placements): every rank ends with every rank's contribution exactly once.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::net::SocketAddr;

use crate::config::AllreduceChoice;

/// Ranks grouped by host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hierarchy {
    /// Ranks of each host in ascending order; hosts ordered by their lowest rank.
    hosts: Vec<Vec<usize>>,
    /// Host index of each rank.
    host_of: Vec<usize>,
}

/// One rank's part of a hierarchical allreduce, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// (Non-leader) hand the whole buffer to the host's leader.
    SendToLeader(usize),
    /// (Leader) reduce the whole buffer of this local rank into its own.
    ReduceFrom(usize),
    /// (Leader) run the ring allreduce among leaders as ring rank `rank` of `world`, with
    /// the leaders `left` and `right` as neighbours (a `world` of 1 does nothing).
    LeaderRing {
        /// This leader's ring rank.
        rank: usize,
        /// Leaders in the ring (hosts).
        world: usize,
        /// The global rank of the left neighbour.
        left: usize,
        /// The global rank of the right neighbour.
        right: usize,
    },
    /// (Leader) copy the reduced buffer to this local rank.
    BroadcastTo(usize),
    /// (Non-leader) receive the reduced buffer from the host's leader.
    ReceiveFromLeader(usize),
}

impl Hierarchy {
    /// Groups ranks by the host key of each (`placement[rank]`).
    pub fn new<K: Eq + Hash>(placement: &[K]) -> Self {
        let mut index: HashMap<&K, usize> = HashMap::new();
        let mut hosts: Vec<Vec<usize>> = Vec::new();
        let mut host_of = Vec::with_capacity(placement.len());
        for (rank, key) in placement.iter().enumerate() {
            let h = *index.entry(key).or_insert_with(|| {
                hosts.push(Vec::new());
                hosts.len() - 1
            });
            hosts[h].push(rank);
            host_of.push(h);
        }
        Self { hosts, host_of }
    }

    /// Groups ranks by the IP of their data-plane addresses (`host:port`, `[v6]:port`); an
    /// address that does not parse is a host of its own.
    pub fn from_addrs(addrs: &[String]) -> Self {
        let keys: Vec<String> = addrs
            .iter()
            .map(|a| match a.parse::<std::net::SocketAddr>() {
                Ok(sa) => sa.ip().to_string(),
                Err(_) => a.clone(),
            })
            .collect();
        Self::new(&keys)
    }

    /// Ranks in all.
    pub fn world(&self) -> usize {
        self.host_of.len()
    }

    /// Ranks of each host, ascending; hosts ordered by their lowest rank.
    pub fn hosts(&self) -> &[Vec<usize>] {
        &self.hosts
    }

    /// The leader (lowest rank) of `rank`'s host.
    pub fn leader_of(&self, rank: usize) -> usize {
        self.hosts[self.host_of[rank]][0]
    }

    /// At least two hosts, and at least one of them with two ranks: otherwise the flat ring
    /// (or the local path alone) does the same work with fewer phases.
    pub fn worthwhile(&self) -> bool {
        self.hosts.len() >= 2 && self.hosts.len() < self.world()
    }

    /// The ranks `rank` exchanges data with in [`Hierarchy::plan`]: its leader, or (a
    /// leader) its host's other ranks and the neighbouring leaders.
    pub fn peers(&self, rank: usize) -> BTreeSet<usize> {
        let mut set = BTreeSet::new();
        for step in self.plan(rank) {
            match step {
                Step::SendToLeader(p)
                | Step::ReceiveFromLeader(p)
                | Step::ReduceFrom(p)
                | Step::BroadcastTo(p) => {
                    set.insert(p);
                }
                Step::LeaderRing {
                    world, left, right, ..
                } if world > 1 => {
                    set.insert(left);
                    set.insert(right);
                }
                Step::LeaderRing { .. } => {}
            }
        }
        set
    }

    /// The hierarchy a TCP group runs its large allreduces on, if any: with
    /// [`AllreduceChoice::Auto`] when [`Hierarchy::worthwhile`], always with
    /// [`AllreduceChoice::Hierarchical`], never with [`AllreduceChoice::Ring`]. Every rank
    /// computes the same from the same configuration.
    pub(crate) fn for_group(addrs: &[SocketAddr], choice: AllreduceChoice) -> Option<Self> {
        let addrs: Vec<String> = addrs.iter().map(SocketAddr::to_string).collect();
        let h = Self::from_addrs(&addrs);
        match choice {
            AllreduceChoice::Ring => None,
            AllreduceChoice::Hierarchical => Some(h),
            AllreduceChoice::Auto => h.worthwhile().then_some(h),
        }
    }

    /// The steps of `rank`, in order.
    pub fn plan(&self, rank: usize) -> Vec<Step> {
        let h = self.host_of[rank];
        let host = &self.hosts[h];
        let leader = host[0];
        if rank != leader {
            return vec![Step::SendToLeader(leader), Step::ReceiveFromLeader(leader)];
        }
        let world = self.hosts.len();
        let mut steps: Vec<Step> = host[1..].iter().map(|&r| Step::ReduceFrom(r)).collect();
        steps.push(Step::LeaderRing {
            rank: h,
            world,
            left: self.hosts[(h + world - 1) % world][0],
            right: self.hosts[(h + 1) % world][0],
        });
        steps.extend(host[1..].iter().map(|&r| Step::BroadcastTo(r)));
        steps
    }
}

/// What an allreduce of `bytes` costs under a schedule: counts from the schedule, not
/// measurements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    /// Sequential communication rounds (each a latency; the ring's are per chunk, pipelined).
    pub rounds: usize,
    /// Most bytes one rank sends.
    pub rank_bytes_max: f64,
    /// Most bytes one host's NIC sends (between hosts).
    pub host_nic_bytes_max: f64,
    /// Bytes moved inside hosts (shared memory), all hosts together.
    pub local_bytes: f64,
}

/// The flat ring over all ranks in rank order.
pub fn flat_ring_cost(h: &Hierarchy, bytes: f64) -> Cost {
    let n = h.world();
    if n < 2 {
        return Cost {
            rounds: 0,
            rank_bytes_max: 0.0,
            host_nic_bytes_max: 0.0,
            local_bytes: 0.0,
        };
    }
    let per_link = 2.0 * (n - 1) as f64 / n as f64 * bytes;
    let mut crossing = vec![0usize; h.hosts.len()];
    let mut local = 0.0;
    for r in 0..n {
        let next = (r + 1) % n;
        if h.host_of[r] == h.host_of[next] {
            local += per_link;
        } else {
            crossing[h.host_of[r]] += 1;
        }
    }
    Cost {
        rounds: 2 * (n - 1),
        rank_bytes_max: per_link,
        host_nic_bytes_max: crossing.iter().copied().max().unwrap_or(0) as f64 * per_link,
        local_bytes: local,
    }
}

/// The hierarchical schedule of [`Hierarchy::plan`].
pub fn hierarchical_cost(h: &Hierarchy, bytes: f64) -> Cost {
    let hosts = h.hosts.len();
    let largest = h.hosts.iter().map(Vec::len).max().unwrap_or(0);
    let local_phases = if largest > 1 { 2 } else { 0 };
    let ring = if hosts > 1 {
        2.0 * (hosts - 1) as f64 / hosts as f64 * bytes
    } else {
        0.0
    };
    let local: usize = h.hosts.iter().map(|g| g.len() - 1).sum();
    Cost {
        rounds: 2 * (hosts.max(1) - 1) + local_phases,
        // A leader sends its ring share and the result to each other rank of its host.
        rank_bytes_max: ring + (largest.max(1) - 1) as f64 * bytes,
        host_nic_bytes_max: ring,
        local_bytes: 2.0 * local as f64 * bytes,
    }
}

/// Recursive doubling over all ranks (the small-message algorithm).
pub fn recursive_doubling_cost(h: &Hierarchy, bytes: f64) -> Cost {
    let n = h.world();
    let p = if n == 0 {
        0
    } else {
        1usize << (usize::BITS - 1 - n.leading_zeros())
    };
    let rounds = p.trailing_zeros() as usize + if n > p { 2 } else { 0 };
    Cost {
        rounds,
        rank_bytes_max: rounds as f64 * bytes,
        // Every rank of a host may talk to another host each round.
        host_nic_bytes_max: h.hosts.iter().map(Vec::len).max().unwrap_or(0) as f64
            * rounds as f64
            * bytes,
        local_bytes: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{left, ring_plan, RecvMode, RingAction, RingKind};
    use proptest::prelude::*;
    use std::collections::VecDeque;
    use std::ops::Range;

    /// Runs the ring allreduce plans of `world` ranks on integer buffers, over unbounded
    /// links; `ring[i]` is the buffer of ring rank `i`. Returns the frames sent.
    fn run_ring(ring: &mut [Vec<i64>], chunk: usize) -> usize {
        let world = ring.len();
        let len = ring.first().map_or(0, Vec::len);
        let plans: Vec<Vec<RingAction>> = (0..world)
            .map(|r| ring_plan(r, world, len, chunk, 2, RingKind::Allreduce))
            .collect();
        let mut links: Vec<VecDeque<(Range<usize>, Vec<i64>)>> = vec![VecDeque::new(); world];
        let mut pc = vec![0usize; world];
        let mut frames = 0;
        loop {
            let mut progressed = false;
            for r in 0..world {
                while let Some(a) = plans[r].get(pc[r]) {
                    match a {
                        RingAction::Send(range) => {
                            links[r].push_back((range.clone(), ring[r][range.clone()].to_vec()));
                            frames += 1;
                        }
                        RingAction::Recv(range, mode) => {
                            let Some((sent, data)) = links[left(r, world)].pop_front() else {
                                break;
                            };
                            assert_eq!(&sent, range);
                            for (i, d) in range.clone().zip(data) {
                                match mode {
                                    RecvMode::Copy => ring[r][i] = d,
                                    RecvMode::Reduce | RecvMode::ReduceOwned => {
                                        ring[r][i] = ring[r][i].wrapping_add(d)
                                    }
                                }
                            }
                        }
                    }
                    pc[r] += 1;
                    progressed = true;
                }
            }
            if pc.iter().zip(&plans).all(|(p, plan)| *p == plan.len()) {
                return frames;
            }
            assert!(progressed, "ring deadlocks");
        }
    }

    /// Runs every rank's [`Hierarchy::plan`] on integer buffers.
    fn run_hierarchical(h: &Hierarchy, bufs: &mut [Vec<i64>], chunk: usize) {
        // Phase 1: leaders reduce their locals, in the order of their plans.
        for host in h.hosts() {
            let leader = host[0];
            for step in h.plan(leader) {
                if let Step::ReduceFrom(r) = step {
                    assert!(h.plan(r).contains(&Step::SendToLeader(leader)));
                    let theirs = bufs[r].clone();
                    for (x, y) in bufs[leader].iter_mut().zip(theirs) {
                        *x = x.wrapping_add(y);
                    }
                }
            }
        }
        // Phase 2: the leaders' ring, neighbours as the plans name them.
        let leaders: Vec<usize> = h.hosts().iter().map(|g| g[0]).collect();
        for (i, &l) in leaders.iter().enumerate() {
            let ring = h
                .plan(l)
                .into_iter()
                .find_map(|s| match s {
                    Step::LeaderRing {
                        rank,
                        world,
                        left,
                        right,
                    } => Some((rank, world, left, right)),
                    _ => None,
                })
                .expect("a leader runs the ring");
            let w = leaders.len();
            assert_eq!(ring, (i, w, leaders[(i + w - 1) % w], leaders[(i + 1) % w]));
        }
        let mut ring: Vec<Vec<i64>> = leaders.iter().map(|&l| bufs[l].clone()).collect();
        run_ring(&mut ring, chunk);
        for (&l, b) in leaders.iter().zip(ring) {
            bufs[l] = b;
        }
        // Phase 3: broadcast.
        for host in h.hosts() {
            for step in h.plan(host[0]) {
                if let Step::BroadcastTo(r) = step {
                    assert!(h.plan(r).contains(&Step::ReceiveFromLeader(host[0])));
                    bufs[r] = bufs[host[0]].clone();
                }
            }
        }
    }

    fn placement_and_inputs() -> impl Strategy<Value = (Vec<u8>, Vec<Vec<i64>>, usize)> {
        (1usize..24, 0usize..40, 1usize..9).prop_flat_map(|(world, len, hosts)| {
            (
                proptest::collection::vec(0u8..hosts as u8, world),
                proptest::collection::vec(proptest::collection::vec(any::<i64>(), len), world),
                1usize..6,
            )
        })
    }

    proptest! {
        #[test]
        fn hierarchical_equals_the_flat_ring_on_random_inputs(
            (placement, inputs, chunk) in placement_and_inputs()
        ) {
            let h = Hierarchy::new(&placement);
            let mut flat = inputs.clone();
            run_ring(&mut flat, chunk);
            let mut hier = inputs.clone();
            run_hierarchical(&h, &mut hier, chunk);
            let len = inputs[0].len();
            let sum: Vec<i64> = (0..len)
                .map(|i| inputs.iter().fold(0i64, |s, b| s.wrapping_add(b[i])))
                .collect();
            for r in 0..inputs.len() {
                prop_assert_eq!(&hier[r], &sum, "rank {}", r);
                if inputs.len() > 1 {
                    prop_assert_eq!(&flat[r], &sum, "rank {}", r);
                }
            }
        }

        #[test]
        fn every_rank_is_in_one_host_and_led_by_its_lowest(placement in proptest::collection::vec(0u8..6, 1..40)) {
            let h = Hierarchy::new(&placement);
            let mut seen: Vec<usize> = h.hosts().iter().flatten().copied().collect();
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..placement.len()).collect::<Vec<_>>());
            for r in 0..placement.len() {
                let l = h.leader_of(r);
                prop_assert_eq!(placement[l], placement[r]);
                prop_assert!(l <= r);
            }
        }
    }

    #[test]
    fn hosts_come_from_the_addresses_ips() {
        let addrs: Vec<String> = [
            "10.0.0.1:7072",
            "10.0.0.1:7073",
            "10.0.0.2:7072",
            "[::1]:7072",
            "10.0.0.2:9000",
            "not an address",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let h = Hierarchy::from_addrs(&addrs);
        assert_eq!(h.hosts(), &[vec![0, 1], vec![2, 4], vec![3], vec![5]]);
        assert!(h.worthwhile());
        assert!(!Hierarchy::new(&[1, 2, 3]).worthwhile(), "one rank a host");
        assert!(!Hierarchy::new(&[1, 1, 1]).worthwhile(), "one host");
    }

    #[test]
    fn costs_at_64_ranks_on_8_hosts() {
        let placement: Vec<usize> = (0..64).map(|r| r / 8).collect();
        let h = Hierarchy::new(&placement);
        let flat = flat_ring_cost(&h, 1.0);
        let hier = hierarchical_cost(&h, 1.0);
        assert_eq!(flat.rounds, 126);
        assert_eq!(hier.rounds, 2 * 7 + 2);
        assert!((hier.host_nic_bytes_max - 2.0 * 7.0 / 8.0).abs() < 1e-9);
        assert!((flat.host_nic_bytes_max - 2.0 * 63.0 / 64.0).abs() < 1e-9);
        // The ring's frames are the count the cost model assumes: 2·(H − 1) per chunk.
        let mut ring = vec![vec![1i64; 8]; 8];
        assert_eq!(run_ring(&mut ring, 1), 8 * 2 * 7);
    }
}
