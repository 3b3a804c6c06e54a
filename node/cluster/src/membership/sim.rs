//! Deterministic discrete-event simulation of many members over an in-memory network:
//! seeded latency and loss, partitions, crashes and restarts, virtual time.
//!
//! Time jumps to the next event (a message delivery or a member's wakeup), so thousands
//! of members run seconds of protocol in well under a second of real time. The same seed
//! gives the same run.

use super::config::Config;
use super::core::{Action, Event, Membership};
use super::member::{Member, State};
use super::message::Message;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Metadata of a simulated member.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimMeta {
    /// An application value (tests change it to check metadata dissemination).
    pub label: u32,
}

/// A simulated member's state machine.
pub type SimMember = Membership<u32, SimMeta>;

/// How the simulated network behaves.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConfig {
    /// Lowest one-way latency (µs; default 200).
    pub latency_min_us: u64,
    /// Highest one-way latency, drawn uniformly (µs; default 2 000).
    pub latency_max_us: u64,
    /// Probability that a message is lost (0..=1; default 0).
    pub loss: f64,
    /// Tell a sender `Event::Unreachable` when it sends to a crashed member, as a driver
    /// whose connection closed would (default false: pure SWIM detection).
    pub unreachable_hints: bool,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            latency_min_us: 200,
            latency_max_us: 2_000,
            loss: 0.0,
            unreachable_hints: false,
        }
    }
}

/// What the benchmark measured.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimFigures {
    /// Cluster size.
    pub members: usize,
    /// Join convergence in probe intervals.
    pub converge_rounds: f64,
    /// Time from everyone starting to join (all through member 0) until every member
    /// sees all members alive (s of virtual time; infinite if it never did).
    pub converge_s: f64,
    /// Time from killing one member until every live member marks it dead (s).
    pub detect_s: f64,
    /// Detection in probe intervals.
    pub detect_rounds: f64,
}

enum Pending {
    Deliver {
        from: u32,
        to: u32,
        msg: Message<u32, SimMeta>,
    },
    Wakeup {
        node: u32,
        epoch: u64,
    },
    Unreachable {
        node: u32,
        about: u32,
        epoch: u64,
    },
    Inject {
        node: u32,
        epoch: u64,
        event: Event<u32, SimMeta>,
    },
}

struct Queued {
    at_us: u64,
    seq: u64,
    what: Pending,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.at_us, self.seq) == (other.at_us, other.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Queued {
    /// Reversed: `BinaryHeap` pops the earliest first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at_us, other.seq).cmp(&(self.at_us, self.seq))
    }
}

struct SimNode {
    member: Option<SimMember>,
    /// Bumped by crash and restart; events of an older epoch are dropped.
    epoch: u64,
    /// The wakeup currently queued (µs), `u64::MAX` if none.
    wake_us: u64,
    group: u32,
    /// Extra delay on every message to or from this member (µs): a loaded host.
    delay_us: u64,
}

/// Predicates are checked this often (virtual ms) by [`Sim::run_until`].
pub const CHECK_INTERVAL_MS: u64 = 5;

/// A simulated cluster of members with ids `0..n`.
pub struct Sim {
    config: Config,
    net: NetConfig,
    seed: u64,
    rng: SmallRng,
    now_us: u64,
    seq: u64,
    nodes: Vec<SimNode>,
    queue: BinaryHeap<Queued>,
    /// Messages delivered so far.
    pub delivered: u64,
    /// Messages lost to loss or partitions so far.
    pub dropped: u64,
    /// Membership changes reported (`Action::Changed`) so far.
    pub changes: u64,
    /// Every verdict of death so far: (observer, member, virtual ms).
    pub deaths: Vec<(u32, u32, u64)>,
    /// Count the encoded size of every message sent ([`Sim::bytes_sent`]); off by default
    /// since encoding costs time.
    pub measure_bytes: bool,
    /// Bytes sent so far (the node's wire codec; counted while `measure_bytes`).
    pub bytes_sent: u64,
    /// Member updates carried by messages sent so far (counted while `measure_bytes`).
    pub updates_sent: u64,
}

impl Sim {
    /// `n` members, each alone at time 0 (call [`Sim::join_all`] to form the cluster).
    pub fn new(n: usize, config: Config, net: NetConfig, seed: u64) -> Self {
        let nodes = (0..n as u32)
            .map(|id| SimNode {
                member: Some(Membership::new(
                    id,
                    SimMeta::default(),
                    config.clone(),
                    node_seed(seed, id, 0),
                    0,
                    Box::new(super::claims::ModelSigner),
                )),
                epoch: 0,
                wake_us: u64::MAX,
                group: 0,
                delay_us: 0,
            })
            .collect();
        let mut sim = Self {
            config,
            net,
            seed,
            rng: SmallRng::seed_from_u64(seed),
            now_us: 0,
            seq: 0,
            nodes,
            queue: BinaryHeap::new(),
            delivered: 0,
            dropped: 0,
            changes: 0,
            deaths: Vec::new(),
            measure_bytes: false,
            bytes_sent: 0,
            updates_sent: 0,
        };
        for id in 0..n as u32 {
            sim.reschedule(id);
        }
        sim
    }

    /// The seed the simulation was built with (print it in assertion messages).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Virtual time (ms).
    pub fn now_ms(&self) -> u64 {
        self.now_us / 1_000
    }

    /// Members, running or not.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no members.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// A running member's state machine.
    pub fn node(&self, id: u32) -> Option<&SimMember> {
        self.nodes.get(id as usize).and_then(|n| n.member.as_ref())
    }

    /// Running members.
    pub fn running(&self) -> impl Iterator<Item = &SimMember> {
        self.nodes.iter().filter_map(|n| n.member.as_ref())
    }

    /// How `observer` sees `about`.
    pub fn view(&self, observer: u32, about: u32) -> Option<&Member<u32, SimMeta>> {
        self.node(observer).and_then(|m| m.member(&about))
    }

    /// Delays every message to or from member `id` by `delay_ms` more, as a host whose
    /// CPU is saturated would.
    pub fn set_delay(&mut self, id: u32, delay_ms: u64) {
        self.nodes[id as usize].delay_us = delay_ms * 1_000;
    }

    /// Sets the message loss probability.
    pub fn set_loss(&mut self, loss: f64) {
        self.net.loss = loss;
    }

    /// Feeds `event` to member `id` now.
    pub fn inject(&mut self, id: u32, event: Event<u32, SimMeta>) {
        let epoch = self.nodes[id as usize].epoch;
        self.push(
            self.now_us,
            Pending::Inject {
                node: id,
                epoch,
                event,
            },
        );
    }

    /// Gives every member a view of every other member alive at incarnation 0, as if the
    /// cluster had formed and settled (nothing queued for gossip): large runs start here.
    pub fn assume_converged(&mut self) {
        let n = self.nodes.len() as u32;
        for node in &mut self.nodes {
            if let Some(m) = node.member.as_mut() {
                m.assume_view((0..n).map(|id| {
                    super::claims::ModelSigner::signed(super::member::Update {
                        id,
                        incarnation: 0,
                        state: State::Alive,
                        meta: SimMeta::default(),
                        meta_version: 0,
                        from: None,
                        sig: Vec::new(),
                    })
                }));
            }
        }
        for id in 0..n {
            self.reschedule(id);
        }
    }

    /// Every member other than `via` joins through `via`, at random times within the next
    /// `spread_ms`.
    pub fn join_all(&mut self, via: u32, spread_ms: u64) {
        for id in 0..self.nodes.len() as u32 {
            if id == via {
                continue;
            }
            let at = self.now_us + self.rng.gen_range(0..spread_ms.max(1) * 1_000);
            let epoch = self.nodes[id as usize].epoch;
            self.push(
                at,
                Pending::Inject {
                    node: id,
                    epoch,
                    event: Event::Join { seeds: vec![via] },
                },
            );
        }
    }

    /// Stops member `id` dead (kill -9): it handles and sends nothing more.
    /// With `unreachable_hints`, every running member sees its connection to `id` close
    /// (`Event::Unreachable`) one latency later, as on a fully connected real cluster.
    pub fn crash(&mut self, id: u32) {
        let n = &mut self.nodes[id as usize];
        n.member = None;
        n.epoch += 1;
        n.wake_us = u64::MAX;
        if self.net.unreachable_hints {
            for other in 0..self.nodes.len() as u32 {
                if other != id && self.nodes[other as usize].member.is_some() {
                    let at = self.now_us + self.latency_us();
                    let epoch = self.nodes[other as usize].epoch;
                    self.push(
                        at,
                        Pending::Unreachable {
                            node: other,
                            about: id,
                            epoch,
                        },
                    );
                }
            }
        }
    }

    fn latency_us(&mut self) -> u64 {
        let (lo, hi) = (self.net.latency_min_us, self.net.latency_max_us);
        self.rng.gen_range(lo..=hi.max(lo))
    }

    /// Starts a fresh instance of member `id` (incarnation 0, same id) that joins through
    /// `seeds`.
    pub fn restart(&mut self, id: u32, seeds: Vec<u32>) {
        let now_ms = self.now_ms();
        let n = &mut self.nodes[id as usize];
        n.epoch += 1;
        n.wake_us = u64::MAX;
        let seed = node_seed(self.seed, id, n.epoch);
        n.member = Some(Membership::new(
            id,
            SimMeta::default(),
            self.config.clone(),
            seed,
            now_ms,
            Box::new(super::claims::ModelSigner),
        ));
        self.reschedule(id);
        self.inject(id, Event::Join { seeds });
    }

    /// Cuts the network into groups: members in different groups cannot talk. Members
    /// not listed form one more group together.
    pub fn partition(&mut self, groups: &[Vec<u32>]) {
        for n in &mut self.nodes {
            n.group = 0;
        }
        for (g, ids) in groups.iter().enumerate() {
            for &id in ids {
                self.nodes[id as usize].group = g as u32 + 1;
            }
        }
    }

    /// Removes all partitions.
    pub fn heal(&mut self) {
        self.partition(&[]);
    }

    /// Runs for `ms` of virtual time.
    pub fn run_for(&mut self, ms: u64) {
        let until = self.now_us + ms * 1_000;
        while self.queue.peek().is_some_and(|q| q.at_us <= until) {
            self.step();
        }
        self.now_us = until;
    }

    /// Runs until `pred` holds (checked every [`CHECK_INTERVAL_MS`]) or `limit_ms` of
    /// virtual time pass; returns the elapsed ms when it held.
    pub fn run_until(&mut self, limit_ms: u64, mut pred: impl FnMut(&Sim) -> bool) -> Option<u64> {
        let start = self.now_ms();
        loop {
            if pred(self) {
                return Some(self.now_ms() - start);
            }
            if self.now_ms() - start >= limit_ms {
                return None;
            }
            self.run_for(CHECK_INTERVAL_MS);
        }
    }

    /// Every running member sees every running member (itself included) alive, and
    /// nobody else alive.
    pub fn converged(&self) -> bool {
        let running = self.running().count();
        self.running().all(|m| m.alive_count() == running)
            && self.nodes.iter().enumerate().all(|(id, n)| {
                n.member.is_some()
                    || self.running().all(|m| {
                        m.member(&(id as u32))
                            .is_none_or(|x| x.state != State::Alive)
                    })
            })
    }

    /// Every running member other than `about` sees `about` in a state `ok` accepts
    /// (`None`: not known or forgotten).
    pub fn all_see(&self, about: u32, ok: impl Fn(Option<&Member<u32, SimMeta>>) -> bool) -> bool {
        self.running()
            .filter(|m| *m.local_id() != about)
            .all(|m| ok(m.member(&about)))
    }

    /// Checks every running member's internal invariants.
    pub fn check_invariants(&self) -> Result<(), String> {
        for m in self.running() {
            m.check_invariants()
                .map_err(|e| format!("member {}: {e}", m.local_id()))?;
        }
        Ok(())
    }

    fn push(&mut self, at_us: u64, what: Pending) {
        self.seq += 1;
        self.queue.push(Queued {
            at_us,
            seq: self.seq,
            what,
        });
    }

    /// Processes the next queued event; false when the queue is empty.
    pub fn step(&mut self) -> bool {
        let Some(q) = self.queue.pop() else {
            return false;
        };
        self.now_us = self.now_us.max(q.at_us);
        let (node, event) = match q.what {
            Pending::Wakeup { node, epoch } => {
                let n = &mut self.nodes[node as usize];
                if n.epoch != epoch || n.wake_us != q.at_us {
                    return true; // superseded
                }
                n.wake_us = u64::MAX;
                (node, Event::Tick)
            }
            Pending::Deliver { from, to, msg } => {
                if self.nodes[to as usize].member.is_none() {
                    self.dropped += 1;
                    return true;
                }
                self.delivered += 1;
                (to, Event::Message { from, msg })
            }
            Pending::Unreachable { node, about, epoch } => {
                if self.nodes[node as usize].epoch != epoch {
                    return true;
                }
                (node, Event::Unreachable { id: about })
            }
            Pending::Inject { node, epoch, event } => {
                if self.nodes[node as usize].epoch != epoch {
                    return true;
                }
                (node, event)
            }
        };
        let now_ms = self.now_ms();
        let is_tick = matches!(event, Event::Tick);
        let Some(member) = self.nodes[node as usize].member.as_mut() else {
            return true;
        };
        let actions = member.handle(now_ms, event);
        debug_assert!(
            !is_tick || member.next_wakeup_ms() > now_ms,
            "member {node} wants a wakeup at {} after a tick at {now_ms}",
            member.next_wakeup_ms()
        );
        for action in actions {
            match action {
                Action::Send { to, msg } => self.transmit(node, to, msg),
                Action::Changed { member, .. } => {
                    self.changes += 1;
                    if member.state == State::Dead {
                        self.deaths.push((node, member.id, now_ms));
                    }
                }
            }
        }
        self.reschedule(node);
        true
    }

    fn transmit(&mut self, from: u32, to: u32, msg: Message<u32, SimMeta>) {
        if self.measure_bytes {
            // Our own messages always encode; a failure would be a bug the tests catch.
            self.bytes_sent += crate::wire::encode(&msg).map_or(0, |b| b.len() as u64);
            self.updates_sent += msg.updates().len() as u64;
        }
        let Some(dest) = self.nodes.get(to as usize) else {
            self.dropped += 1;
            return;
        };
        let latency = self.rng.gen_range(
            self.net.latency_min_us..=self.net.latency_max_us.max(self.net.latency_min_us),
        );
        let at = self.now_us + latency + dest.delay_us + self.nodes[from as usize].delay_us;
        if dest.member.is_none() {
            self.dropped += 1;
            if self.net.unreachable_hints {
                let epoch = self.nodes[from as usize].epoch;
                self.push(
                    at,
                    Pending::Unreachable {
                        node: from,
                        about: to,
                        epoch,
                    },
                );
            }
            return;
        }
        if dest.group != self.nodes[from as usize].group
            || self.rng.gen_bool(self.net.loss.clamp(0.0, 1.0))
        {
            self.dropped += 1;
            return;
        }
        self.push(at, Pending::Deliver { from, to, msg });
    }

    fn reschedule(&mut self, id: u32) {
        let now_us = self.now_us;
        let n = &mut self.nodes[id as usize];
        let Some(m) = n.member.as_ref() else {
            return;
        };
        let at = m.next_wakeup_ms().saturating_mul(1_000).max(now_us);
        if at < n.wake_us {
            n.wake_us = at;
            let epoch = n.epoch;
            self.push(at, Pending::Wakeup { node: id, epoch });
        }
    }
}

fn node_seed(seed: u64, id: u32, epoch: u64) -> u64 {
    seed ^ (u64::from(id) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03)
}

/// Virtual-time limit of each benchmark phase (ms).
pub const BENCHMARK_LIMIT_MS: u64 = 300_000;

/// Kills one member other than 0, chosen by `seed`, and returns the seconds until every
/// live member marks it dead (infinite if they never do within [`BENCHMARK_LIMIT_MS`]).
fn kill_one(sim: &mut Sim, seed: u64) -> f64 {
    let victim = SmallRng::seed_from_u64(seed ^ 0x5EED).gen_range(1..sim.len() as u32);
    sim.crash(victim);
    sim.run_until(BENCHMARK_LIMIT_MS, |s| {
        s.all_see(victim, |m| m.is_none_or(|m| m.state == State::Dead))
    })
    .map_or(f64::INFINITY, |ms| ms as f64 / 1_000.0)
}

/// Forms a cluster of `members` (all joining through member 0 at once), waits until
/// everyone sees everyone alive, kills one random member other than 0, and waits until
/// every live member marks it dead. Deterministic for a given seed.
pub fn run_benchmark(members: usize, config: Config, loss: f64, seed: u64) -> SimFigures {
    let net = NetConfig {
        loss,
        ..NetConfig::default()
    };
    run_benchmark_on(members, config, net, seed)
}

/// [`run_benchmark`] over a network configured in full (e.g. with `unreachable_hints`, as
/// a real driver sees a killed peer's connection close).
pub fn run_benchmark_on(members: usize, config: Config, net: NetConfig, seed: u64) -> SimFigures {
    assert!(members >= 2, "benchmark needs at least 2 members");
    let probe_s = config.probe_interval_ms as f64 / 1_000.0;
    let mut sim = Sim::new(members, config, net, seed);
    sim.join_all(0, 1);
    let converge_s = sim
        .run_until(BENCHMARK_LIMIT_MS, Sim::converged)
        .map_or(f64::INFINITY, |ms| ms as f64 / 1_000.0);
    let detect_s = kill_one(&mut sim, seed);
    SimFigures {
        members,
        converge_rounds: converge_s / probe_s,
        converge_s,
        detect_s,
        detect_rounds: detect_s / probe_s,
    }
}

/// What [`run_scale_benchmark`] measured.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScaleFigures {
    /// Cluster size.
    pub members: usize,
    /// Message loss probability.
    pub loss: f64,
    /// From killing one member until every live member marks it dead (s; infinite if
    /// they never did).
    pub death_spread_s: f64,
    /// Suspicions raised by live members about live members, over the settled cluster's
    /// steady-state window (all false: nobody failed).
    pub false_suspicions: u64,
    /// Bytes each member sent per second in steady state, as the sim encodes them (4-byte
    /// ids and metadata, so a lower bound).
    pub bytes_per_member_s: f64,
    /// Member updates each member sent per second in steady state; at about 400 bytes
    /// a member on the real wire, `400 ·` this is the rest of a real member's traffic.
    pub updates_per_member_s: f64,
    /// State pieces each member sent per second in steady state.
    pub pieces_per_member_s: f64,
}

/// Steady-state window over which [`run_scale_benchmark`] counts bytes and suspicions
/// (virtual ms), after [`SCALE_WARMUP_MS`]; long enough for every member's first sync.
pub const SCALE_WINDOW_MS: u64 = 30_000;
/// Virtual time a settled cluster runs before the window opens (ms).
pub const SCALE_WARMUP_MS: u64 = 5_000;

/// The benchmark at sizes where forming the cluster by joins would take most of the
/// time: `members` start with converged views ([`Sim::assume_converged`]), run
/// [`SCALE_WARMUP_MS`] then [`SCALE_WINDOW_MS`] of steady state (bytes, pieces and false
/// suspicions counted), then one random member is killed and the time until every live
/// member marks it dead is measured. Deterministic for a given seed.
pub fn run_scale_benchmark(members: usize, config: Config, loss: f64, seed: u64) -> ScaleFigures {
    assert!(members >= 2, "benchmark needs at least 2 members");
    let net = NetConfig {
        loss,
        ..NetConfig::default()
    };
    let mut sim = Sim::new(members, config, net, seed);
    sim.assume_converged();
    sim.run_for(SCALE_WARMUP_MS);
    let suspicions = |s: &Sim| {
        s.running()
            .map(|m| m.stats().suspicions_raised)
            .sum::<u64>()
    };
    let pieces = |s: &Sim| s.running().map(|m| m.stats().pieces_sent).sum::<u64>();
    let (suspicions0, pieces0) = (suspicions(&sim), pieces(&sim));
    sim.measure_bytes = true;
    sim.run_for(SCALE_WINDOW_MS);
    sim.measure_bytes = false;
    let per_member_s = |x: u64| x as f64 / members as f64 / (SCALE_WINDOW_MS as f64 / 1_000.0);
    let false_suspicions = suspicions(&sim) - suspicions0;
    let bytes_per_member_s = per_member_s(sim.bytes_sent);
    let updates_per_member_s = per_member_s(sim.updates_sent);
    let pieces_per_member_s = per_member_s(pieces(&sim) - pieces0);
    let death_spread_s = kill_one(&mut sim, seed);
    ScaleFigures {
        members,
        loss,
        death_spread_s,
        false_suspicions,
        bytes_per_member_s,
        updates_per_member_s,
        pieces_per_member_s,
    }
}

#[cfg(test)]
mod tests;
