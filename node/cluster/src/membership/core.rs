//! The membership state machine: SWIM probing, suspicion with Lifeguard timeouts,
//! incarnation-ordered dissemination, push-pull anti-entropy, local health awareness.

use super::broadcast::Broadcasts;
use super::claims::{check_incarnation, Claim, Refused, Signer};
use super::config::{Config, ConfigError};
use super::hash::IdHasher;
use super::hash::IdMap;
use super::member::{Member, Metadata, NodeId, State, Update};
use super::message::Message;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::hash::Hasher;

/// Most ping-reqs served at once as an intermediary; further ones are ignored and counted.
pub const RELAYS_MAX: usize = 1024;
/// Most seeds remembered from a `Join` (the rest are ignored).
pub const SEEDS_MAX: usize = 64;
/// How often tombstones past `tombstone_ms` are forgotten (ms).
pub const REAP_INTERVAL_MS: u64 = 1_000;
/// An intermediary sends its nack when the target has not acked within this share of its
/// probe timeout (percent; Lifeguard uses 80).
pub const NACK_TIMEOUT_PERCENT: u64 = 80;
/// A leaving node tells everyone directly when it knows at most this many live members,
/// and `2 · gossip_fanout` random ones otherwise.
pub const LEAVE_TELL_ALL_MAX: usize = 16;
/// Failed probes in a row with no answer from anyone (no ack, no nack from any
/// intermediary, the direct send not failed) that raise no suspicion: a node that hears
/// nothing back is more likely the slow or cut-off one (Lifeguard raises its health score
/// for each nack missed). A probe that gets a nack, or succeeds, starts the count again; past
/// the count, silence suspects as before, so a node cut off from all still gives up on the
/// others, a few probes later. At 128 nodes forming on two cores, 234 of 259 failed probes
/// were silent ones, each a false suspicion that the whole cluster then spread and the
/// suspect refuted.
pub const SILENT_PROBES_TOLERATED: u32 = 2;
/// A join's push-pull from a member that this node answered with its state, for a join,
/// less than this long ago gets no second answer (ms): the first is on its way. A joiner
/// asks again from one probe interval on while it hears from nobody, and a loaded seed answers
/// late: of 127 nodes joining one seed on two cores, 67 asked three or four times, and the
/// seed sent its whole view 270 times. An answer that was lost is sent at the joiner's first
/// retry after this.
pub const JOIN_ANSWER_REPEAT_MS: u64 = 1_000;

/// Input to [`Membership::handle`].
#[derive(Clone, Debug)]
pub enum Event<I, M> {
    /// Timers: the driver calls `handle(now, Tick)` at or after
    /// [`Membership::next_wakeup_ms`] (which names every timer, so an idle node sleeps until
    /// its next probe); extra ticks are harmless.
    Tick,
    /// A message from `from` (the id the transport authenticated).
    Message {
        /// Sender.
        from: I,
        /// The decoded message.
        msg: Message<I, M>,
    },
    /// The driver reached seed addresses and learned their ids: sync state with them
    /// (push-pull). While the node knows no other live member it retries the seeds after one
    /// probe interval, doubling up to `reconnect_interval_ms`.
    Join {
        /// Seed ids.
        seeds: Vec<I>,
    },
    /// The connection to `id` closed or a send to it failed. A hint to probe it now (a
    /// probe in its direct phase goes indirect at once); never a verdict by itself.
    Unreachable {
        /// The unreachable member.
        id: I,
    },
    /// Leave gracefully: announce `Left` at incarnation + 1 to several members directly.
    Leave,
    /// New local metadata: bump `meta_version` and gossip it.
    SetMeta(M),
}

/// Output of [`Membership::handle`].
#[derive(Clone, Debug)]
pub enum Action<I, M> {
    /// Send `msg` to `to`. On failure the driver reports `Event::Unreachable { id: to }`.
    Send {
        /// Receiver.
        to: I,
        /// Message to encode and send.
        msg: Message<I, M>,
    },
    /// A member joined (`previous: None`), changed state or changed metadata (`previous`
    /// equal to the current state). For logs and observers.
    Changed {
        /// The member as it is now.
        member: Member<I, M>,
        /// Its state before, `None` when it was not known.
        previous: Option<State>,
    },
}

/// Counters since start. Monotonic; for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Messages given to `handle`.
    pub messages_handled: u64,
    /// Messages ignored as nonsense: unknown seq, wrong target, from self, from a
    /// member not asked, relay table full.
    pub messages_ignored: u64,
    /// Messages sent (`Action::Send`).
    pub messages_sent: u64,
    /// Probes started (direct pings, in turn or on an `Unreachable` hint).
    pub probes_sent: u64,
    /// Ping-reqs sent for indirect probes.
    pub indirect_probes_sent: u64,
    /// Probes that got no ack at all.
    pub probes_failed: u64,
    /// Nacks received from intermediaries.
    pub nacks_received: u64,
    /// Nacks expected but not received (each raises the health score).
    pub nacks_missed: u64,
    /// Suspicions this node raised from its own failed probes.
    pub suspicions_raised: u64,
    /// Failed probes that raised no suspicion because nobody answered at all (see
    /// [`SILENT_PROBES_TOLERATED`]).
    pub silent_probes: u64,
    /// Independent confirmations counted towards suspicions.
    pub confirmations: u64,
    /// Times this node refuted a claim that it is suspect, dead or left.
    pub refutations: u64,
    /// Suspicions that timed out here, declaring the member dead.
    pub deaths_declared: u64,
    /// Updates that changed the local view.
    pub updates_applied: u64,
    /// Updates dropped: over `piggyback_max` / `members_max` in a message, or about unknown
    /// members when the table is full.
    pub updates_dropped: u64,
    /// Push-pull requests sent (join, periodic, reconnect).
    pub push_pulls_sent: u64,
    /// Push-pull requests received whose digest matched this node's view: nothing sent.
    pub push_pulls_in_step: u64,
    /// Joins' push-pulls not answered because this node answered the same member's join
    /// within [`JOIN_ANSWER_REPEAT_MS`].
    pub join_repeats_unanswered: u64,
    /// State pieces sent (a view of n members is `ceil(n / push_pull_piece_members)`).
    pub pieces_sent: u64,
    /// Messages refused whole for breaking the protocol's limits (`Message::check`).
    pub messages_refused: u64,
    /// Tombstones forgotten after `tombstone_ms`.
    pub tombstones_reaped: u64,
    /// Claims not believed: without their subject's signature, or at an incarnation past
    /// the bounds ([`super::claims`]).
    pub claims_refused: u64,
}

/// A member in the local table.
#[derive(Clone, Debug)]
struct Entry<I, M> {
    member: Member<I, M>,
    /// For a suspect: the suspector named when it is gossiped (the latest confirmation).
    suspect_from: Option<I>,
    /// The member's own signature of `Claim` (its incarnation, `Left` or else `Alive`, its
    /// metadata at its version), passed on with every claim about it.
    sig: Vec<u8>,
}

impl<I: NodeId, M: Metadata> Entry<I, M> {
    /// The claim about this member that gossip and state pieces carry, with its signature.
    fn update(&self) -> Update<I, M> {
        let mut u = self.member.to_update(self.suspect_from.clone());
        u.sig = self.sig.clone();
        u
    }
}

/// Where merged updates come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// Piggybacked on a probe or gossip message: at most `piggyback_max` honoured.
    Piggyback,
    /// A piece of another member's full view (checked against `PIECE_MEMBERS_MAX`; dead
    /// read as suspect).
    Piece,
}

/// For this many probe intervals after a member is seen alive again (or first), its claims
/// that others are dead are taken as suspicions (count). The far side of a healed partition
/// still carries the deaths it declared while apart, and sends them in its first messages:
/// taken as they are, they killed members alive on this side (a running ring lost them).
const RETURNED_CLAIMS_PROBES: u64 = 8;

/// A running suspicion timer (Lifeguard): the timeout shrinks from `max_ms` to `min_ms`
/// as independent confirmations arrive.
#[derive(Clone, Debug)]
struct Suspicion<I> {
    incarnation: u64,
    started_ms: u64,
    min_ms: u64,
    max_ms: u64,
    /// Confirmations expected (0 in tiny clusters: the timeout is then `min_ms`).
    k: u32,
    /// The first suspector; does not count as a confirmation.
    first: I,
    /// Distinct later suspectors, at most `k`.
    confirmers: Vec<I>,
}

impl<I> Suspicion<I> {
    fn deadline_ms(&self) -> u64 {
        self.started_ms
            + suspicion_timeout_ms(
                self.min_ms,
                self.max_ms,
                self.confirmers.len() as u32,
                self.k,
            )
    }
}

/// `max(min, max − (max − min) · log(c + 1) / log(k + 1))`, the Lifeguard suspicion
/// timeout after `c` of `k` expected confirmations.
pub fn suspicion_timeout_ms(min_ms: u64, max_ms: u64, c: u32, k: u32) -> u64 {
    if k == 0 || c >= k || max_ms <= min_ms {
        return min_ms;
    }
    let frac = ((c + 1) as f64).ln() / ((k + 1) as f64).ln();
    let t = max_ms as f64 - (max_ms - min_ms) as f64 * frac;
    (t.floor() as u64).max(min_ms)
}

/// One probe of one member in flight.
#[derive(Clone, Debug)]
struct Probe<I> {
    seq: u64,
    target: I,
    /// The target's incarnation when the probe started: a probe that outlives it (the
    /// member refuted, or died and came back, meanwhile) suspects nobody.
    incarnation: u64,
    /// Part of the round-robin schedule (rather than started by an `Unreachable` hint).
    in_turn: bool,
    direct_deadline_ms: u64,
    deadline_ms: u64,
    indirect: bool,
    /// A send of the direct ping failed (`Event::Unreachable`).
    direct_failed: bool,
    /// Intermediaries asked, and whether each has nacked.
    relays: Vec<(I, bool)>,
}

impl<I> Probe<I> {
    /// No ack can come any more: the direct send failed and every intermediary nacked
    /// (or none could be asked). The probe fails now instead of at its deadline.
    fn hopeless(&self) -> bool {
        self.indirect && self.direct_failed && self.relays.iter().all(|(_, nacked)| *nacked)
    }
}

/// A ping-req this node serves as intermediary.
#[derive(Clone, Debug)]
struct Relay<I> {
    /// Seq of our ping to the target.
    seq: u64,
    target: I,
    origin: I,
    origin_seq: u64,
    nack_at_ms: u64,
    expire_ms: u64,
    nacked: bool,
}

/// The SWIM/Lifeguard membership state machine of one node. Sans-IO: time and events
/// come in through [`Membership::handle`], messages to send go out as [`Action`]s.
///
/// Invariants (checked by `check_invariants` in tests): the local member is in the
/// table; `live` holds exactly the other members that are alive or suspect;
/// `tombstones` exactly the other dead or left ones; a suspicion runs for exactly each
/// suspect member.
#[derive(Debug)]
pub struct Membership<I, M> {
    id: I,
    config: Config,
    rng: SmallRng,
    now_ms: u64,
    members: IdMap<I, Entry<I, M>>,
    /// Other members alive or suspect, indexable for random choice.
    live: Vec<I>,
    live_index: IdMap<I, usize>,
    /// Other members dead or left, by (state_since_ms, id).
    tombstones: BTreeSet<(u64, I)>,
    suspicions: IdMap<I, Suspicion<I>>,
    /// Signs this node's claims, checks the others' ([`super::claims`]).
    signer: Box<dyn Signer<I, M>>,
    broadcasts: Broadcasts<I>,
    probes: Vec<Probe<I>>,
    relays: Vec<Relay<I>>,
    probe_order: Vec<I>,
    probe_pos: usize,
    next_seq: u64,
    next_probe_ms: u64,
    next_gossip_ms: u64,
    next_push_pull_ms: u64,
    next_reconnect_ms: u64,
    /// While alone after a join: the delay before the next retry of the seeds, from one
    /// probe interval doubling up to `reconnect_interval_ms`.
    join_retry_ms: u64,
    /// When this node last sent its state in answer to each member's join (pruned to
    /// [`JOIN_ANSWER_REPEAT_MS`] at each reap; at most `members_max` entries).
    join_answers: IdMap<I, u64>,
    next_reap_ms: u64,
    seeds: Vec<I>,
    health: u32,
    /// Probes in a row that failed with no answer from anyone (no ack, no nack).
    silent_probes: u32,
    stats: Stats,
    out: Vec<Action<I, M>>,
}

impl<I: NodeId, M: Metadata> Membership<I, M> {
    /// A node alone in its cluster at incarnation 0. `seed` seeds its random choices;
    /// `signer` signs its claims and checks the others' ([`super::claims`]).
    ///
    /// # Panics
    /// If `config.validate()` fails; use [`Membership::try_new`] to get the error.
    pub fn new(
        id: I,
        meta: M,
        config: Config,
        seed: u64,
        now_ms: u64,
        signer: Box<dyn Signer<I, M>>,
    ) -> Self {
        match Self::try_new(id, meta, config, seed, now_ms, signer) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`Membership::new`], returning the configuration error.
    pub fn try_new(
        id: I,
        meta: M,
        config: Config,
        seed: u64,
        now_ms: u64,
        signer: Box<dyn Signer<I, M>>,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let mut rng = SmallRng::seed_from_u64(seed);
        let me = Member {
            id: id.clone(),
            incarnation: 0,
            state: State::Alive,
            meta,
            meta_version: 0,
            state_since_ms: now_ms,
        };
        let sig = signer.sign(&Claim {
            id: &id,
            incarnation: 0,
            left: false,
            meta_version: 0,
            meta: &me.meta,
        });
        let mut members = IdMap::default();
        members.insert(
            id.clone(),
            Entry {
                member: me,
                suspect_from: None,
                sig,
            },
        );
        let next_probe_ms = now_ms + rng.gen_range(0..config.probe_interval_ms);
        let next_gossip_ms = now_ms + rng.gen_range(0..config.gossip_interval_ms);
        let next_push_pull_ms =
            now_ms + config.push_pull_interval_ms + rng.gen_range(0..config.push_pull_interval_ms);
        let next_reconnect_ms = now_ms + config.reconnect_interval_ms;
        let next_join_retry_ms = config.reconnect_interval_ms;
        Ok(Self {
            id,
            config,
            rng,
            now_ms,
            members,
            live: Vec::new(),
            live_index: IdMap::default(),
            tombstones: BTreeSet::new(),
            suspicions: IdMap::default(),
            signer,
            broadcasts: Broadcasts::new(),
            probes: Vec::new(),
            relays: Vec::new(),
            probe_order: Vec::new(),
            probe_pos: 0,
            next_seq: 1,
            next_probe_ms,
            next_gossip_ms,
            next_push_pull_ms,
            next_reconnect_ms,
            join_retry_ms: next_join_retry_ms,
            join_answers: IdMap::default(),
            next_reap_ms: now_ms + REAP_INTERVAL_MS,
            seeds: Vec::new(),
            health: 0,
            silent_probes: 0,
            stats: Stats::default(),
            out: Vec::new(),
        })
    }

    /// This node's id.
    pub fn local_id(&self) -> &I {
        &self.id
    }

    /// This node's own entry.
    pub fn local(&self) -> &Member<I, M> {
        &self.members[&self.id].member
    }

    /// The configuration in use.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// One member as seen locally, tombstones included.
    pub fn member(&self, id: &I) -> Option<&Member<I, M>> {
        self.members.get(id).map(|e| &e.member)
    }

    /// All members, this node and tombstones included, in no particular order.
    pub fn members(&self) -> impl Iterator<Item = &Member<I, M>> {
        self.members.values().map(|e| &e.member)
    }

    /// Members in state alive, this node included while it is alive.
    pub fn alive_count(&self) -> usize {
        let me = usize::from(self.local().state == State::Alive);
        self.live.len() - self.suspicions.len() + me
    }

    /// Members alive or suspect, this node included: the cluster size `n` the timeouts use.
    pub fn live_count(&self) -> usize {
        self.live.len() + 1
    }

    /// Lifeguard local health score, `0..=awareness_max`; probe interval and timeout are
    /// scaled by `score + 1`.
    pub fn health_score(&self) -> u32 {
        self.health
    }

    /// Counters since start.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The time (ms) by which the driver must call `handle(_, Tick)`.
    pub fn next_wakeup_ms(&self) -> u64 {
        // Gossip rounds wake the loop only while there is something to gossip: an idle
        // node's next round is due when an update is queued, at once if its time passed.
        let mut t = u64::MAX;
        if self.broadcasts.len() > 0 {
            t = t.min(self.next_gossip_ms);
        }
        // The chores (reaping tombstones, syncing with a random member or a dead one) need
        // no precision: while this node probes others, each waits for the first probe tick
        // at or after its time instead of waking the loop on its own a few ms off the probe
        // cadence (an idle node's wake-ups are most of its CPU).
        let mut chores = self.next_reap_ms;
        if self.local().state != State::Left {
            chores = chores
                .min(self.next_push_pull_ms)
                .min(self.next_reconnect_ms);
            if !self.probes.iter().any(|p| p.in_turn) {
                t = t.min(self.next_probe_ms);
                if !self.live.is_empty() {
                    chores = chores.max(self.next_probe_ms);
                }
            }
        }
        t = t.min(chores);
        for p in &self.probes {
            t = t.min(if p.indirect {
                p.deadline_ms
            } else {
                p.direct_deadline_ms
            });
        }
        for r in &self.relays {
            t = t.min(if r.nacked { r.expire_ms } else { r.nack_at_ms });
        }
        for s in self.suspicions.values() {
            t = t.min(s.deadline_ms());
        }
        t
    }

    /// Feeds one event at time `now_ms` (driver's monotonic clock) and returns what to do.
    pub fn handle(&mut self, now_ms: u64, event: Event<I, M>) -> Vec<Action<I, M>> {
        self.now_ms = self.now_ms.max(now_ms);
        match event {
            Event::Tick => self.on_tick(),
            Event::Message { from, msg } => self.on_message(from, msg),
            Event::Join { seeds } => self.on_join(seeds),
            Event::Unreachable { id } => self.on_unreachable(id),
            Event::Leave => self.on_leave(),
            Event::SetMeta(meta) => self.on_set_meta(meta),
        }
        let out = std::mem::take(&mut self.out);
        self.stats.messages_sent += out
            .iter()
            .filter(|a| matches!(a, Action::Send { .. }))
            .count() as u64;
        out
    }

    // ----- timers -----

    fn on_tick(&mut self) {
        let now = self.now_ms;
        self.run_probe_timers();
        self.run_relay_timers();
        self.run_suspicion_timers();
        let leaving = self.local().state == State::Left;
        if !leaving && now >= self.next_probe_ms && !self.probes.iter().any(|p| p.in_turn) {
            if let Some(target) = self.next_probe_target() {
                self.start_probe(target, true);
            }
            self.next_probe_ms = now + self.config.probe_interval_ms * self.scale();
        }
        if now >= self.next_gossip_ms {
            self.gossip_round();
            self.next_gossip_ms = now + self.config.gossip_interval_ms;
        }
        if !leaving && now >= self.next_push_pull_ms {
            if let Some(peer) = self.random_live(true) {
                self.send_push_pull(peer, false);
            }
            self.next_push_pull_ms = now + self.push_pull_interval_ms();
        }
        if !leaving && now >= self.next_reconnect_ms {
            self.reconnect();
            let alone = self.live.is_empty() && !self.seeds.is_empty();
            let delay = if alone {
                // A seed that accepted the connection before its membership ran drops the
                // first join: retry soon, then back off (every joiner of a cluster booting
                // at once waited a whole reconnect interval, 2 s, for its first member).
                self.next_join_retry()
            } else {
                self.config.reconnect_interval_ms
            };
            self.next_reconnect_ms = now + delay;
        }
        if now >= self.next_reap_ms {
            self.reap();
            self.next_reap_ms = now + REAP_INTERVAL_MS.min(self.config.tombstone_ms);
        }
    }

    fn scale(&self) -> u64 {
        u64::from(self.health) + 1
    }

    /// memberlist's push-pull scaling: above 32 members the interval grows with log2(n).
    fn push_pull_interval_ms(&self) -> u64 {
        let n = self.live_count() as f64;
        let mult = if n > 32.0 {
            (n.log2() - 32f64.log2()).ceil() + 1.0
        } else {
            1.0
        };
        (self.config.push_pull_interval_ms as f64 * mult) as u64
    }

    fn run_probe_timers(&mut self) {
        let now = self.now_ms;
        let mut i = 0;
        while i < self.probes.len() {
            if !self.probes[i].indirect && now >= self.probes[i].direct_deadline_ms {
                self.go_indirect(i, true);
            }
            if now >= self.probes[i].deadline_ms || self.probes[i].hopeless() {
                let probe = self.probes.swap_remove(i);
                self.probe_failed(probe);
            } else {
                i += 1;
            }
        }
    }

    fn run_relay_timers(&mut self) {
        let now = self.now_ms;
        let mut nacks = Vec::new();
        self.relays.retain_mut(|r| {
            if !r.nacked && now >= r.nack_at_ms {
                r.nacked = true;
                nacks.push((r.origin.clone(), r.origin_seq));
            }
            now < r.expire_ms
        });
        for (origin, seq) in nacks {
            let updates = self.piggyback(&origin);
            self.send(origin, Message::Nack { seq, updates });
        }
    }

    fn run_suspicion_timers(&mut self) {
        let now = self.now_ms;
        let expired: Vec<(I, u64)> = self
            .suspicions
            .iter()
            .filter(|(_, s)| now >= s.deadline_ms())
            .map(|(id, s)| (id.clone(), s.incarnation))
            .collect();
        for (id, incarnation) in expired {
            self.stats.deaths_declared += 1;
            tracing::debug!(member = %id, incarnation, "suspicion timed out: dead");
            self.transition(&id, incarnation, State::Dead, None);
        }
    }

    // ----- probing -----

    /// Next member in the shuffled round-robin order that is live and not being probed.
    fn next_probe_target(&mut self) -> Option<I> {
        let mut rebuilt = false;
        loop {
            if self.probe_pos >= self.probe_order.len() {
                if rebuilt || self.live.is_empty() {
                    return None;
                }
                self.probe_order = self.live.clone();
                self.probe_order.shuffle(&mut self.rng);
                self.probe_pos = 0;
                rebuilt = true;
            }
            let id = self.probe_order[self.probe_pos].clone();
            self.probe_pos += 1;
            if self.live_index.contains_key(&id) && !self.probes.iter().any(|p| p.target == id) {
                return Some(id);
            }
        }
    }

    fn start_probe(&mut self, target: I, in_turn: bool) {
        let now = self.now_ms;
        let seq = self.take_seq();
        let timeout = self.config.probe_timeout_ms * self.scale();
        let interval = self.config.probe_interval_ms * self.scale();
        let incarnation = self
            .members
            .get(&target)
            .map_or(0, |e| e.member.incarnation);
        self.probes.push(Probe {
            seq,
            target: target.clone(),
            incarnation,
            in_turn,
            direct_deadline_ms: now + timeout,
            deadline_ms: now + interval.max(2 * timeout),
            indirect: false,
            direct_failed: false,
            relays: Vec::new(),
        });
        self.stats.probes_sent += 1;
        let updates = self.piggyback(&target);
        self.send(
            target.clone(),
            Message::Ping {
                seq,
                target,
                updates,
            },
        );
    }

    /// Moves probe `i` to its indirect phase: ping-req through up to `indirect_probes`
    /// alive members; `resend` also retries the direct ping (not after a failed send).
    fn go_indirect(&mut self, i: usize, resend: bool) {
        let (seq, target) = {
            let p = &mut self.probes[i];
            p.indirect = true;
            (p.seq, p.target.clone())
        };
        let relays = self.sample_live(self.config.indirect_probes, Some(&target), true);
        for relay in &relays {
            self.stats.indirect_probes_sent += 1;
            let updates = self.piggyback(relay);
            self.send(
                relay.clone(),
                Message::PingReq {
                    seq,
                    target: target.clone(),
                    updates,
                },
            );
        }
        self.probes[i].relays = relays.into_iter().map(|r| (r, false)).collect();
        if resend {
            let updates = self.piggyback(&target);
            self.send(
                target.clone(),
                Message::Ping {
                    seq,
                    target,
                    updates,
                },
            );
        }
    }

    fn probe_failed(&mut self, probe: Probe<I>) {
        self.stats.probes_failed += 1;
        // No ack, no nack from any intermediary, and the direct send did not fail: nobody
        // answered this node at all, so the silence says more about this node (too slow to
        // read its answers in time, or cut off) than about the target.
        let silent = !probe.direct_failed
            && !probe.relays.is_empty()
            && probe.relays.iter().all(|(_, nacked)| !nacked);
        self.silent_probes = if silent { self.silent_probes + 1 } else { 0 };
        // Lifeguard: nacks prove our own links work; missing ones mean we are the problem.
        let delta = if probe.relays.is_empty() {
            1
        } else {
            let missed = probe.relays.iter().filter(|(_, nacked)| !nacked).count() as u32;
            self.stats.nacks_missed += u64::from(missed);
            missed
        };
        self.adjust_health(delta as i64);
        let Some(entry) = self.members.get(&probe.target) else {
            return;
        };
        let (state, incarnation) = (entry.member.state, entry.member.incarnation);
        if incarnation != probe.incarnation {
            // Probed a former incarnation (say one that died and restarted while the probe
            // ran): its silence says nothing about the current one.
            return;
        }
        if silent && self.silent_probes <= SILENT_PROBES_TOLERATED && state == State::Alive {
            self.stats.silent_probes += 1;
            return;
        }
        let me = self.id.clone();
        match state {
            State::Alive => {
                self.stats.suspicions_raised += 1;
                tracing::debug!(
                    member = %probe.target,
                    incarnation,
                    in_turn = probe.in_turn,
                    direct_failed = probe.direct_failed,
                    relays = probe.relays.len(),
                    nacked = probe.relays.iter().filter(|(_, n)| *n).count(),
                    health = self.health,
                    "probe failed: suspect"
                );
                self.start_suspicion(&probe.target, incarnation, me, false);
                // Buddy system: tell the suspect directly so it can refute at once.
                let updates = self.piggyback(&probe.target);
                self.send(probe.target, Message::Gossip { updates });
            }
            State::Suspect => {
                self.confirm_suspicion(&probe.target, incarnation, me);
            }
            State::Dead | State::Left => {}
        }
    }

    fn probe_succeeded(&mut self, i: usize) {
        self.probes.swap_remove(i);
        self.silent_probes = 0;
        self.adjust_health(-1);
    }

    fn adjust_health(&mut self, delta: i64) {
        let h = (i64::from(self.health) + delta).clamp(0, i64::from(self.config.awareness_max));
        self.health = h as u32;
    }

    fn take_seq(&mut self) -> u64 {
        let s = self.next_seq;
        self.next_seq += 1;
        s
    }

    // ----- events -----

    fn on_join(&mut self, seeds: Vec<I>) {
        if self.local().state == State::Left {
            // Rejoining after a leave: a new incarnation.
            let me = self
                .members
                .get(&self.id)
                .map(|e| e.member.incarnation)
                .unwrap_or(0);
            let id = self.id.clone();
            self.transition(&id, me + 1, State::Alive, None);
        }
        self.seeds = seeds
            .into_iter()
            .filter(|s| *s != self.id)
            .take(SEEDS_MAX)
            .collect();
        self.seeds.dedup();
        for seed in self.seeds.clone() {
            self.send_push_pull(seed, true);
        }
        self.join_retry_ms = self
            .config
            .probe_interval_ms
            .min(self.config.reconnect_interval_ms);
        self.next_reconnect_ms = self.now_ms + self.next_join_retry();
        // The seeds knew only who had joined before us: sync once more with a random
        // member soon, which shortens the tail of a mass join.
        let jitter = self.rng.gen_range(0..self.config.reconnect_interval_ms);
        let soon = self.now_ms + self.config.reconnect_interval_ms + jitter;
        self.next_push_pull_ms = self.next_push_pull_ms.min(soon);
    }

    fn on_unreachable(&mut self, id: I) {
        if id == self.id || self.local().state == State::Left {
            return;
        }
        // Serving a ping-req for that target: nack now rather than at the timer.
        let mut nacks = Vec::new();
        for r in self
            .relays
            .iter_mut()
            .filter(|r| r.target == id && !r.nacked)
        {
            r.nacked = true;
            nacks.push((r.origin.clone(), r.origin_seq));
        }
        for (origin, seq) in nacks {
            let updates = self.piggyback(&origin);
            self.send(origin, Message::Nack { seq, updates });
        }
        // An intermediary we cannot reach will not nack: do not count that against us.
        for p in self.probes.iter_mut() {
            p.relays.retain(|(r, nacked)| *r != id || *nacked);
        }
        if let Some(i) = self.probes.iter().position(|p| p.target == id) {
            self.probes[i].direct_failed = true;
            if !self.probes[i].indirect {
                self.go_indirect(i, false);
            }
        } else if self.live_index.contains_key(&id) {
            self.start_probe(id, false);
        }
        self.fail_hopeless_probes();
    }

    fn fail_hopeless_probes(&mut self) {
        while let Some(i) = self.probes.iter().position(|p| p.hopeless()) {
            let probe = self.probes.swap_remove(i);
            self.probe_failed(probe);
        }
    }

    fn on_leave(&mut self) {
        let me = self.local().clone();
        if me.state == State::Left {
            return;
        }
        let id = self.id.clone();
        self.transition(&id, me.incarnation + 1, State::Left, None);
        self.probes.clear();
        let targets = if self.live.len() <= LEAVE_TELL_ALL_MAX {
            self.live.clone()
        } else {
            self.sample_live(2 * self.config.gossip_fanout, None, false)
        };
        let left = self.members[&self.id].update();
        for to in targets {
            let updates = self.piggyback_with(Some(left.clone()));
            self.send(to, Message::Gossip { updates });
        }
    }

    fn on_set_meta(&mut self, meta: M) {
        let id = self.id.clone();
        let (incarnation, state, version) = {
            let me = self.local();
            (me.incarnation, me.state, me.meta_version)
        };
        self.transition(
            &id,
            incarnation,
            state,
            Some((meta, version + 1, Vec::new())),
        );
    }

    fn on_message(&mut self, from: I, msg: Message<I, M>) {
        self.stats.messages_handled += 1;
        if from == self.id {
            self.stats.messages_ignored += 1;
            return;
        }
        if let Err(e) = msg.check() {
            self.stats.messages_refused += 1;
            tracing::warn!(peer = %from, kind = msg.kind(), "refused membership message: {e}");
            return;
        }
        match msg {
            Message::Ping {
                seq,
                target,
                updates,
            } => {
                self.apply_updates(&from, updates, Source::Piggyback);
                if target != self.id {
                    self.stats.messages_ignored += 1;
                    return;
                }
                let updates = self.piggyback(&from);
                self.send(from, Message::Ack { seq, updates });
            }
            Message::Ack { seq, updates } => {
                self.apply_updates(&from, updates, Source::Piggyback);
                self.on_ack(from, seq);
            }
            Message::PingReq {
                seq,
                target,
                updates,
            } => {
                self.apply_updates(&from, updates, Source::Piggyback);
                self.on_ping_req(from, seq, target);
            }
            Message::Nack { seq, updates } => {
                self.apply_updates(&from, updates, Source::Piggyback);
                let relay = self.probes.iter_mut().find(|p| p.seq == seq).and_then(|p| {
                    p.relays
                        .iter_mut()
                        .find(|(r, nacked)| *r == from && !nacked)
                });
                match relay {
                    Some(r) => {
                        r.1 = true;
                        self.stats.nacks_received += 1;
                        self.fail_hopeless_probes();
                    }
                    None => self.stats.messages_ignored += 1,
                }
            }
            Message::Gossip { updates } => self.apply_updates(&from, updates, Source::Piggyback),
            Message::PushPull { join, digest } => {
                if digest == self.digest() {
                    self.stats.push_pulls_in_step += 1;
                } else if self.local().state != State::Left {
                    if join && self.answered_join_lately(&from) {
                        self.stats.join_repeats_unanswered += 1;
                        return;
                    }
                    if join && self.join_answers.len() < self.config.members_max {
                        self.join_answers.insert(from.clone(), self.now_ms);
                    }
                    self.send_state(from, true);
                }
            }
            Message::StatePiece {
                answer,
                piece,
                members,
                ..
            } => {
                self.apply_updates(&from, members, Source::Piece);
                if answer && piece == 0 && self.local().state != State::Left {
                    self.send_state(from, false);
                }
            }
        }
    }

    fn on_ack(&mut self, from: I, seq: u64) {
        if let Some(i) = self.probes.iter().position(|p| p.seq == seq) {
            let p = &self.probes[i];
            if p.target == from || p.relays.iter().any(|(r, _)| *r == from) {
                self.probe_succeeded(i);
            } else {
                self.stats.messages_ignored += 1;
            }
            return;
        }
        if let Some(i) = self
            .relays
            .iter()
            .position(|r| r.seq == seq && r.target == from)
        {
            let r = self.relays.swap_remove(i);
            let updates = self.piggyback(&r.origin);
            self.send(
                r.origin,
                Message::Ack {
                    seq: r.origin_seq,
                    updates,
                },
            );
            return;
        }
        self.stats.messages_ignored += 1;
    }

    fn on_ping_req(&mut self, from: I, origin_seq: u64, target: I) {
        if target == self.id {
            let updates = self.piggyback(&from);
            self.send(
                from,
                Message::Ack {
                    seq: origin_seq,
                    updates,
                },
            );
            return;
        }
        if target == from || self.relays.len() >= RELAYS_MAX || self.local().state == State::Left {
            self.stats.messages_ignored += 1;
            return;
        }
        let seq = self.take_seq();
        let now = self.now_ms;
        let timeout = self.config.probe_timeout_ms;
        self.relays.push(Relay {
            seq,
            target: target.clone(),
            origin: from,
            origin_seq,
            nack_at_ms: now + (timeout * NACK_TIMEOUT_PERCENT / 100).max(1),
            expire_ms: now + 2 * timeout * self.scale(),
            nacked: false,
        });
        let updates = self.piggyback(&target);
        self.send(
            target.clone(),
            Message::Ping {
                seq,
                target,
                updates,
            },
        );
    }

    // ----- dissemination -----

    fn gossip_round(&mut self) {
        if self.broadcasts.len() == 0 {
            return;
        }
        let now = self.now_ms;
        let horizon = now.saturating_sub(self.config.gossip_to_dead_ms);
        let recent_dead: Vec<I> = self
            .tombstones
            .iter()
            .rev()
            .take_while(|(since, _)| *since >= horizon)
            .filter(|(_, id)| {
                self.members
                    .get(id)
                    .is_some_and(|e| e.member.state == State::Dead)
            })
            .map(|(_, id)| id.clone())
            .collect();
        let total = self.live.len() + recent_dead.len();
        let want = self.config.gossip_fanout.min(total);
        let mut targets: Vec<I> = Vec::with_capacity(want);
        let mut attempts = 0;
        while targets.len() < want && attempts < 8 * want + 16 {
            attempts += 1;
            let r = self.rng.gen_range(0..total);
            let id = if r < self.live.len() {
                &self.live[r]
            } else {
                &recent_dead[r - self.live.len()]
            };
            if !targets.contains(id) {
                targets.push(id.clone());
            }
        }
        for to in targets {
            let updates = self.piggyback(&to);
            if updates.is_empty() {
                break;
            }
            self.send(to, Message::Gossip { updates });
        }
    }

    fn retransmit_limit(&self) -> u32 {
        let n = self.live_count() as f64;
        self.config.retransmit_mult * ((n + 1.0).log10().ceil().max(1.0) as u32)
    }

    /// Updates to piggyback on a message to `to`: its own suspicion first (Lifeguard's
    /// buddy system), then the queue, at most `piggyback_max` in all.
    fn piggyback(&mut self, to: &I) -> Vec<Update<I, M>> {
        let first = self
            .members
            .get(to)
            .filter(|e| e.member.state == State::Suspect)
            .map(|e| e.update());
        self.piggyback_with(first)
    }

    /// Piggybacked updates with `first` (an update that must get through) ahead of the
    /// queue.
    fn piggyback_with(&mut self, first: Option<Update<I, M>>) -> Vec<Update<I, M>> {
        let max = self.config.piggyback_max;
        let skip = first.as_ref().map(|u| u.id.clone());
        let mut out: Vec<Update<I, M>> = first.into_iter().collect();
        let limit = self.retransmit_limit();
        let ids = self.broadcasts.take(max - out.len(), limit, skip.as_ref());
        out.extend(
            ids.iter()
                .filter_map(|id| self.members.get(id))
                .map(|e| e.update()),
        );
        out
    }

    /// This node's full view (tombstones included) cut into pieces of at most
    /// `push_pull_piece_members` members; never empty (the view holds self).
    pub fn state_pieces(&self, answer: bool) -> Vec<Message<I, M>> {
        let members: Vec<Update<I, M>> = self.members.values().map(|e| e.update()).collect();
        let chunks: Vec<&[Update<I, M>]> = members
            .chunks(self.config.push_pull_piece_members)
            .collect();
        let pieces = chunks.len() as u32;
        chunks
            .into_iter()
            .enumerate()
            .map(|(i, chunk)| Message::StatePiece {
                answer,
                piece: i as u32,
                pieces,
                members: chunk.to_vec(),
            })
            .collect()
    }

    /// An order-independent digest of the view: the wrapping sum of a hash of each
    /// member's (id, incarnation, state, meta version). Two members with the same view
    /// have the same digest, so a sync between them costs one small message.
    pub fn digest(&self) -> u64 {
        self.members.values().fold(0u64, |sum, e| {
            let m = &e.member;
            let mut h = IdHasher::default();
            m.id.hash(&mut h);
            h.write_u64(m.incarnation);
            h.write_u8(m.state as u8);
            h.write_u64(m.meta_version);
            sum.wrapping_add(h.finish())
        })
    }

    fn send_state(&mut self, to: I, answer: bool) {
        for msg in self.state_pieces(answer) {
            self.stats.pieces_sent += 1;
            self.send(to.clone(), msg);
        }
    }

    fn send_push_pull(&mut self, to: I, join: bool) {
        self.stats.push_pulls_sent += 1;
        let digest = self.digest();
        self.send(to, Message::PushPull { join, digest });
    }

    /// Starts from a view that is already converged, as the simulation's large runs do
    /// (forming 10 000 members by joins would take most of their time): `updates` about
    /// unknown members are inserted alive, nothing is queued for gossip or reported.
    pub(super) fn assume_view(&mut self, updates: impl ExactSizeIterator<Item = Update<I, M>>) {
        // Tables sized once: 10 000 simulated members hold 10^8 entries between them.
        let n = updates.len().min(self.config.members_max);
        self.members.reserve(n);
        self.live_index.reserve(n);
        self.live.reserve(n);
        self.probe_order.reserve(n);
        for u in updates {
            if u.id != self.id
                && !self.members.contains_key(&u.id)
                && self.members.len() < self.config.members_max
            {
                let member = Member {
                    id: u.id.clone(),
                    incarnation: u.incarnation,
                    state: State::Alive,
                    meta: u.meta,
                    meta_version: u.meta_version,
                    state_since_ms: self.now_ms,
                };
                self.members.insert(
                    u.id.clone(),
                    Entry {
                        member,
                        suspect_from: None,
                        sig: u.sig,
                    },
                );
                self.add_live(&u.id);
            }
        }
    }

    /// The delay before the next retry of the seeds while alone; doubles the one after.
    fn next_join_retry(&mut self) -> u64 {
        let delay = self.join_retry_ms;
        self.join_retry_ms = (delay * 2).min(self.config.reconnect_interval_ms);
        delay
    }

    fn reconnect(&mut self) {
        if self.live.is_empty() && !self.seeds.is_empty() {
            for seed in self.seeds.clone() {
                self.send_push_pull(seed, true);
            }
            return;
        }
        let dead: Vec<I> = self
            .tombstones
            .iter()
            .filter(|(_, id)| {
                self.members
                    .get(id)
                    .is_some_and(|e| e.member.state == State::Dead)
            })
            .map(|(_, id)| id.clone())
            .collect();
        if let Some(id) = dead.choose(&mut self.rng).cloned() {
            self.send_push_pull(id, false);
        }
    }

    /// Whether this node answered `from`'s join with its state within
    /// [`JOIN_ANSWER_REPEAT_MS`].
    fn answered_join_lately(&self, from: &I) -> bool {
        self.join_answers
            .get(from)
            .is_some_and(|&at| self.now_ms < at + JOIN_ANSWER_REPEAT_MS)
    }

    fn reap(&mut self) {
        let now = self.now_ms;
        self.join_answers
            .retain(|_, at| now < *at + JOIN_ANSWER_REPEAT_MS);
        let horizon = now.saturating_sub(self.config.tombstone_ms);
        while let Some((since, id)) = self.tombstones.first().cloned() {
            if since > horizon {
                break;
            }
            self.tombstones.pop_first();
            self.members.remove(&id);
            self.broadcasts.remove(&id);
            self.stats.tombstones_reaped += 1;
        }
    }

    fn send(&mut self, to: I, msg: Message<I, M>) {
        self.out.push(Action::Send { to, msg });
    }

    // ----- merging claims -----

    /// Merges the updates of one message.
    fn apply_updates(&mut self, from: &I, updates: Vec<Update<I, M>>, source: Source) {
        let push_pull = source == Source::Piece;
        let max = if push_pull {
            super::message::PIECE_MEMBERS_MAX
        } else {
            self.config.piggyback_max
        };
        if updates.len() > max {
            self.stats.updates_dropped += (updates.len() - max) as u64;
        }
        let mut refuted = false;
        for u in updates.into_iter().take(max) {
            refuted |= self.apply_update(from, u, push_pull);
        }
        // Tell whoever claimed we are down straight away.
        if refuted && self.local().state != State::Left {
            let updates = self.piggyback(from);
            self.send(from.clone(), Message::Gossip { updates });
        }
    }

    /// Merges one claim by SWIM/memberlist precedence, once its subject's signature and
    /// the incarnation bounds hold ([`super::claims`]). Returns whether it made this node
    /// refute a claim about itself.
    fn apply_update(&mut self, sender: &I, mut u: Update<I, M>, push_pull: bool) -> bool {
        // A full state says dead, or a member we took for down (or only just saw again)
        // does: hearsay, taken as a suspicion, so that the two sides of a healed partition do
        // not kill each other outright with the verdicts each side reached while apart
        // (memberlist does the same for full states). A member that is really dead stays
        // silent and dies by this node's own suspicion timer; a live one refutes.
        let hearsay = u.state == State::Dead && (push_pull || self.just_returned(sender));
        if hearsay {
            u.state = State::Suspect;
            u.from = Some(sender.clone());
        }
        if let Err(why) = self.believe(&u, push_pull) {
            self.stats.claims_refused += 1;
            tracing::debug!(peer = %sender, member = %u.id, claim = %u.state, incarnation = u.incarnation, "membership claim refused: {why}");
            return false;
        }
        if u.id == self.id {
            return self.apply_about_self(u);
        }
        let Some(entry) = self.members.get(&u.id) else {
            if u.state != State::Alive {
                return false; // never resurrect forgotten or unknown members as tombstones
            }
            if self.members.len() >= self.config.members_max {
                self.stats.updates_dropped += 1;
                return false;
            }
            self.insert(u);
            return false;
        };
        let cur = entry.member.state;
        let inc = entry.member.incarnation;
        // What the member signed travels with the claim: a newer incarnation, a newer
        // version of its metadata at this one, or its leave replaces what is kept, the
        // signature with the metadata it covers.
        let signed = (u.incarnation > inc
            || (u.incarnation == inc && u.meta_version > entry.member.meta_version)
            || (u.incarnation == inc && u.state == State::Left && cur != State::Left))
            .then(|| (u.meta.clone(), u.meta_version, u.sig.clone()));
        let suspector = u.from.clone().unwrap_or_else(|| sender.clone());
        match u.state {
            State::Alive if u.incarnation > inc => {
                self.transition(&u.id, u.incarnation, State::Alive, signed);
            }
            State::Suspect
                if (cur == State::Alive && u.incarnation >= inc) || u.incarnation > inc =>
            {
                if signed.is_some() {
                    self.transition(&u.id, u.incarnation, cur, signed);
                }
                self.start_suspicion(&u.id, u.incarnation, suspector, hearsay);
            }
            State::Suspect if cur == State::Suspect && u.incarnation == inc => {
                if signed.is_some() {
                    self.transition(&u.id, inc, cur, signed);
                }
                if !hearsay {
                    self.confirm_suspicion(&u.id, inc, suspector);
                }
            }
            State::Dead | State::Left
                if u.incarnation > inc
                    || (u.incarnation == inc
                        && (cur.is_live() || (cur == State::Dead && u.state == State::Left))) =>
            {
                self.transition(&u.id, u.incarnation, u.state, signed);
            }
            _ => {
                if signed.is_some() && u.incarnation == inc && u.state != State::Left {
                    self.transition(&u.id, inc, cur, signed);
                }
            }
        }
        false
    }

    /// Whether `u` may be believed: its incarnation within the bounds, and its subject's
    /// signature of the claim it rests on. A claim older than what is known changes nothing
    /// and is not checked; one resting on the signature kept for the member was checked when
    /// it came.
    fn believe(&self, u: &Update<I, M>, push_pull: bool) -> Result<(), Refused> {
        let entry = self.members.get(&u.id);
        let known = entry.map(|e| e.member.incarnation);
        check_incarnation(u.incarnation, known, !push_pull)?;
        let Some(e) = entry else {
            return self.verify(u);
        };
        if u.incarnation < e.member.incarnation {
            return Ok(());
        }
        let kept = e.member.incarnation == u.incarnation
            && e.member.meta_version == u.meta_version
            && (e.member.state == State::Left) == (u.state == State::Left)
            && e.sig == u.sig;
        if kept {
            Ok(())
        } else {
            self.verify(u)
        }
    }

    fn verify(&self, u: &Update<I, M>) -> Result<(), Refused> {
        if self.signer.verify(&Claim::of(u), &u.sig) {
            Ok(())
        } else {
            Err(Refused::Unsigned)
        }
    }

    /// Whether `sender` is unknown here, not alive, or alive for less than
    /// [`RETURNED_CLAIMS_PROBES`] probe intervals: its verdicts of death may be stale ones
    /// from the far side of a partition.
    fn just_returned(&self, sender: &I) -> bool {
        let window_ms = RETURNED_CLAIMS_PROBES * self.config.probe_interval_ms;
        self.members.get(sender).is_none_or(|e| {
            e.member.state != State::Alive
                || self.now_ms.saturating_sub(e.member.state_since_ms) < window_ms
        })
    }

    /// A claim about this node, believed (signed by this node, an older instance of it when
    /// above its incarnation): refutes a down claim at or above its incarnation by going one
    /// above it (never past `INCARNATION_MAX + 1`: the claim is within the bounds).
    fn apply_about_self(&mut self, u: Update<I, M>) -> bool {
        let me = self.local().clone();
        if me.state == State::Left {
            return false; // leaving: let the claim stand
        }
        let mut refuted = false;
        let mut incarnation = me.incarnation;
        let claim_down = u.state != State::Alive && u.incarnation >= me.incarnation;
        if claim_down || (u.state == State::Alive && u.incarnation > me.incarnation) {
            incarnation = u.incarnation + 1;
            if claim_down {
                self.stats.refutations += 1;
                self.adjust_health(1);
                refuted = true;
                tracing::debug!(claim = %u.state, incarnation, "refuting");
            }
        }
        // An older instance of us advertised other metadata at this version or above.
        let meta_version = if u.meta_version >= me.meta_version && u.meta != me.meta {
            u.meta_version.saturating_add(1)
        } else {
            me.meta_version
        };
        if incarnation != me.incarnation || meta_version != me.meta_version {
            let e = self
                .members
                .get_mut(&self.id)
                .expect("self is in the table");
            e.member.incarnation = incarnation;
            e.member.meta_version = meta_version;
            self.sign_self();
            let id = self.id.clone();
            self.broadcasts.push(&id);
        }
        refuted
    }

    /// Signs this node's entry as it is now (after every change to it).
    fn sign_self(&mut self) {
        let e = &self.members[&self.id];
        let sig = self.signer.sign(&Claim {
            id: &self.id,
            incarnation: e.member.incarnation,
            left: e.member.state == State::Left,
            meta_version: e.member.meta_version,
            meta: &e.member.meta,
        });
        if let Some(e) = self.members.get_mut(&self.id) {
            e.sig = sig;
        }
    }

    fn insert(&mut self, u: Update<I, M>) {
        let member = Member {
            id: u.id.clone(),
            incarnation: u.incarnation,
            state: State::Alive,
            meta: u.meta,
            meta_version: u.meta_version,
            state_since_ms: self.now_ms,
        };
        tracing::debug!(member = %u.id, incarnation = u.incarnation, "member joined");
        self.members.insert(
            u.id.clone(),
            Entry {
                member: member.clone(),
                suspect_from: None,
                sig: u.sig,
            },
        );
        self.add_live(&u.id);
        self.broadcasts.push(&u.id);
        self.stats.updates_applied += 1;
        self.out.push(Action::Changed {
            member,
            previous: None,
        });
    }

    fn add_live(&mut self, id: &I) {
        if self.live_index.contains_key(id) {
            return;
        }
        self.live_index.insert(id.clone(), self.live.len());
        self.live.push(id.clone());
        // A random place in the rest of this pass of the probe order.
        self.probe_order.push(id.clone());
        let last = self.probe_order.len() - 1;
        let pos = self.probe_pos.min(last);
        let j = self.rng.gen_range(pos..=last);
        self.probe_order.swap(j, last);
    }

    fn remove_live(&mut self, id: &I) {
        if let Some(i) = self.live_index.remove(id) {
            self.live.swap_remove(i);
            if let Some(moved) = self.live.get(i) {
                self.live_index.insert(moved.clone(), i);
            }
        }
    }

    /// Sets a known member's incarnation, state and (optionally) metadata with the
    /// signature that covers them (this node's own is signed here), keeping the indexes,
    /// suspicion timers and queue in step, and reports the change.
    fn transition(
        &mut self,
        id: &I,
        incarnation: u64,
        state: State,
        meta: Option<(M, u64, Vec<u8>)>,
    ) {
        let now = self.now_ms;
        let is_self = *id == self.id;
        let Some(e) = self.members.get_mut(id) else {
            return;
        };
        let previous = e.member.state;
        let since = e.member.state_since_ms;
        e.member.incarnation = incarnation;
        let meta_changed = match meta {
            Some((m, v, sig)) => {
                let changed = m != e.member.meta;
                e.member.meta = m;
                e.member.meta_version = v;
                e.sig = sig;
                changed
            }
            None => false,
        };
        if previous != state {
            e.member.state = state;
            e.member.state_since_ms = now;
            if state != State::Suspect {
                e.suspect_from = None;
            }
        }
        let member = e.member.clone();
        if is_self {
            self.sign_self();
        }
        if previous != State::Suspect || state != State::Suspect {
            self.suspicions.remove(id);
        }
        if previous != state && !is_self {
            if previous.is_gone() {
                self.tombstones.remove(&(since, id.clone()));
            }
            match (previous.is_live(), state.is_live()) {
                (true, false) => {
                    self.remove_live(id);
                    self.tombstones.insert((now, id.clone()));
                }
                (false, true) => self.add_live(id),
                (false, false) => {
                    self.tombstones.insert((now, id.clone()));
                }
                (true, true) => {}
            }
        }
        self.broadcasts.push(id);
        self.stats.updates_applied += 1;
        if previous != state || meta_changed {
            if previous != state {
                tracing::debug!(member = %id, incarnation, from = %previous, to = %state, "member state changed");
            }
            self.out.push(Action::Changed {
                member,
                previous: Some(previous),
            });
        }
    }

    /// Starts (or restarts at a higher incarnation) a suspicion of `id`, first suspected
    /// by `from`. `hearsay` (a verdict of death from a full state or a member just back):
    /// the whole upper bound, which no confirmation shortens, for the accused to refute.
    fn start_suspicion(&mut self, id: &I, incarnation: u64, from: I, hearsay: bool) {
        let n = self.live_count() as f64;
        let min_ms = (f64::from(self.config.suspicion_mult)
            * n.log10().max(1.0)
            * self.config.probe_interval_ms as f64) as u64;
        let max_ms = min_ms * u64::from(self.config.suspicion_max_mult);
        let min_ms = if hearsay { max_ms } else { min_ms };
        let k = if hearsay
            || self.live_count().saturating_sub(2) < self.config.suspicion_confirmations as usize
        {
            0
        } else {
            self.config.suspicion_confirmations
        };
        self.transition(id, incarnation, State::Suspect, None);
        if let Some(e) = self.members.get_mut(id) {
            e.suspect_from = Some(from.clone());
        }
        self.suspicions.insert(
            id.clone(),
            Suspicion {
                incarnation,
                started_ms: self.now_ms,
                min_ms,
                max_ms,
                k,
                first: from,
                confirmers: Vec::new(),
            },
        );
    }

    /// Counts `from` as an independent confirmation of the suspicion of `id`; a new one
    /// shortens the timeout and is gossiped on.
    fn confirm_suspicion(&mut self, id: &I, incarnation: u64, from: I) {
        let Some(s) = self.suspicions.get_mut(id) else {
            return;
        };
        if s.incarnation != incarnation
            || s.first == from
            || s.confirmers.contains(&from)
            || s.confirmers.len() >= s.k as usize
        {
            return;
        }
        s.confirmers.push(from.clone());
        self.stats.confirmations += 1;
        // The gossiped suspicion names one suspector. Keep naming ourselves once we
        // suspect too: every suspector then spreads its own name, so each independent
        // confirmation reaches everyone (relaying others' names would overwrite ours
        // before it got out).
        let me = self.id.clone();
        if let Some(e) = self.members.get_mut(id) {
            if e.suspect_from.as_ref() != Some(&me) {
                e.suspect_from = Some(from);
                self.broadcasts.push(id);
            }
        }
    }

    // ----- random choice -----

    /// Up to `k` distinct random live members other than `exclude` (alive ones only when
    /// `alive_only`).
    fn sample_live(&mut self, k: usize, exclude: Option<&I>, alive_only: bool) -> Vec<I> {
        let members = &self.members;
        let ok = |id: &I| {
            Some(id) != exclude
                && (!alive_only
                    || members
                        .get(id)
                        .is_some_and(|e| e.member.state == State::Alive))
        };
        let n = self.live.len();
        if n <= 4 * k + 8 {
            let mut all: Vec<I> = self.live.iter().filter(|id| ok(id)).cloned().collect();
            all.shuffle(&mut self.rng);
            all.truncate(k);
            return all;
        }
        let mut out: Vec<I> = Vec::with_capacity(k);
        let mut attempts = 0;
        while out.len() < k && attempts < 8 * k + 16 {
            attempts += 1;
            let id = &self.live[self.rng.gen_range(0..n)];
            if ok(id) && !out.contains(id) {
                out.push(id.clone());
            }
        }
        out
    }

    fn random_live(&mut self, alive_only: bool) -> Option<I> {
        self.sample_live(1, None, alive_only).pop()
    }

    /// Checks the internal invariants (tests and simulations).
    pub fn check_invariants(&self) -> Result<(), String> {
        if !self.members.contains_key(&self.id) {
            return Err("self missing".into());
        }
        let mut live = 0;
        let mut gone = 0;
        for (id, e) in &self.members {
            if *id == self.id {
                continue;
            }
            let in_live = self
                .live_index
                .get(id)
                .is_some_and(|&i| self.live[i] == *id);
            let in_tomb = self
                .tombstones
                .contains(&(e.member.state_since_ms, id.clone()));
            if e.member.state.is_live() {
                live += 1;
                if !in_live || in_tomb {
                    return Err(format!("{id} live but not indexed as live"));
                }
            } else {
                gone += 1;
                if in_live || !in_tomb {
                    return Err(format!("{id} gone but not indexed as tombstone"));
                }
            }
            if (e.member.state == State::Suspect) != self.suspicions.contains_key(id) {
                return Err(format!("{id} suspicion timer out of step"));
            }
        }
        if live != self.live.len()
            || gone != self.tombstones.len()
            || self.live.len() != self.live_index.len()
        {
            return Err("index sizes out of step".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
