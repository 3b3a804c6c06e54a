//! The libp2p swarm and the one event loop that owns it and drives the membership core.
//!
//! Membership's probes and gossip travel as sealed UDP datagrams on the p2p port's number
//! ([`super::datagrams`]); its joins, state syncs and leaves as length-prefixed frames on one
//! long-lived stream per peer and direction ([`super::streams`]) of the swarm (TCP,
//! optionally a pre-shared-key layer, Noise, Yamux), which also carries the RPCs between
//! nodes (Raft, forwarded writes, logs) as calls on one long-lived stream per peer
//! ([`super::calls`]). Connections are dialed when a stream or a call needs one, and kept up
//! to the peers the control plane names ([`NodeHandle::keep_connected`]: the Raft voters,
//! so that an election finds them connected). Everything protocol-like happens in
//! [`crate::membership::Membership`]: this loop turns datagrams and swarm events into
//! core events and the core's actions into sends. Other tasks reach the loop through a
//! [`NodeHandle`].

use std::{
    num::NonZeroUsize,
    time::{Duration, Instant},
};

use futures::{future::Either, StreamExt};
use libp2p::{
    core::{muxing::StreamMuxerBox, transport::Boxed, upgrade::Version},
    dns, noise,
    peer_store::{self, memory_store::MemoryStore},
    pnet::{PnetConfig, PreSharedKey},
    swarm::{
        dial_opts::{DialOpts, PeerCondition},
        ConnectionId, NetworkBehaviour, SwarmEvent,
    },
    tcp, yamux, Multiaddr, PeerId, StreamProtocol, Swarm, Transport,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use crate::{
    datagrams::{self, replay::Stale, Datagrams, OpenError, Received},
    membership::{self, Action, Event, Membership, State},
    meta::NodeMeta,
    wire,
};

/// The membership core as the node uses it: peers named by libp2p peer id.
pub type Core = Membership<PeerId, NodeMeta>;
type Msg = membership::Message<PeerId, NodeMeta>;

/// The membership protocol name on the swarm (4: every claim signed by its subject; 3: probes and gossip go as datagrams, only
/// joins, syncs and leaves on the streams; 2: every message on one long-lived stream per
/// peer and direction, a view in bounded state pieces after a digest; 1: each message as a
/// request and a view whole). Nodes of 2 and 3 do not talk: a 2 would never answer a 3's
/// probes.
pub const MEMBERSHIP_PROTOCOL: &str = "/ringleader/membership/4";
/// Largest membership frame sent or accepted, in bytes: a state piece of
/// `membership::message::PIECE_MEMBERS_MAX` members of about 1.3 KB at most fits, and so
/// does every other message (at most `piggyback_max` updates).
pub const MEMBERSHIP_FRAME_BYTES_MAX: usize = 2 << 20;

/// Depth of the command queue into the event loop.
const COMMAND_QUEUE_DEPTH: usize = 64;
/// Longest the loop sleeps between core ticks, in milliseconds.
const TICK_MAX_MS: u64 = 1_000;
/// First retry delay for a seed that could not be reached, in milliseconds.
const SEED_BACKOFF_MIN_MS: u64 = 250;
/// Ceiling of the seed retry delay, in milliseconds.
const SEED_BACKOFF_MAX_MS: u64 = 8_000;
/// Shortest gap between two warnings about malformed messages, in milliseconds.
const BAD_MESSAGE_WARN_INTERVAL_MS: u64 = 5_000;
/// How long a graceful leave waits for its announcements to be delivered, in milliseconds.
const LEAVE_FLUSH_MS: u64 = 1_500;
/// How long an idle connection is kept open, in seconds.
const IDLE_CONNECTION_S: u64 = 300;
/// How often a peer to keep connected ([`NodeHandle::keep_connected`]) is redialed while it
/// is not, in milliseconds.
const KEEP_REDIAL_MS: u64 = 1_000;

use super::calls::{BadCall, PeerCalls, CALL_TIMEOUT_MS};
pub use super::calls::{InboundRpc, RpcError, RPC_PROTOCOL};
pub use super::streams::Frame;
use super::streams::{Out, PeerStreams, StreamEvent};

/// `msg` encoded in frames of at most [`MEMBERSHIP_FRAME_BYTES_MAX`]: one, unless it is a
/// state piece of members whose metadata is unusually large, which is halved until each
/// half fits. The halves keep the piece's index (pieces merge on their own, so the index
/// only tells the receiver when to answer) and only the first keeps `answer`.
pub fn membership_frames(msg: &Msg) -> Result<Vec<Vec<u8>>, wire::WireError> {
    let too_large = |len| wire::WireError::TooLarge {
        len,
        limit: MEMBERSHIP_FRAME_BYTES_MAX,
    };
    let error = match wire::encode(msg) {
        Ok(bytes) if bytes.len() <= MEMBERSHIP_FRAME_BYTES_MAX => return Ok(vec![bytes]),
        Ok(bytes) => too_large(bytes.len()),
        Err(e) => e,
    };
    let membership::Message::StatePiece {
        answer,
        piece,
        pieces,
        members,
    } = msg
    else {
        return Err(error);
    };
    if members.len() < 2 {
        return Err(error);
    }
    let (first, second) = members.split_at(members.len() / 2);
    let half = |answer: bool, members: &[membership::Update<PeerId, NodeMeta>]| {
        membership_frames(&membership::Message::StatePiece {
            answer,
            piece: *piece,
            pieces: *pieces,
            members: members.to_vec(),
        })
    };
    let mut frames = half(*answer, first)?;
    frames.extend(half(false, second)?);
    Ok(frames)
}

/// Peers whose addresses the swarm remembers (the least recently used are forgotten first;
/// a member's are offered again before each send while it is not connected).
const ADDRESS_BOOK_PEERS_MAX: usize = 10_000;
/// Depth of the queue of inbound RPCs waiting for their handler.
const RPC_INBOUND_QUEUE_DEPTH: usize = 256;

/// The node's libp2p behaviours.
#[derive(NetworkBehaviour)]
pub struct Behaviour {
    /// Long-lived streams: membership messages ([`super::streams`]) and calls
    /// ([`super::calls`]).
    streams: libp2p_stream::Behaviour,
    /// The peers' addresses libp2p dials ([`EventLoop`]'s `offer_addresses` fills it from the
    /// members' metadata); libp2p-stream keeps none of its own.
    addresses: peer_store::Behaviour<MemoryStore>,
}

/// TCP (+ DNS), then the pre-shared-key layer when a cluster key is set, then Noise and Yamux.
/// A peer without the same key fails the pnet handshake and never gets a connection. Public
/// so that tests can build a member of their own (one that misbehaves).
///
/// Noise and Yamux are negotiated with multistream-select's `V1Lazy` (as the swarm's streams
/// are, [`build_swarm`]): the dialer proposes its one protocol and goes on at once, with the
/// proposal and its first message in one write, instead of waiting a round trip for the
/// listener's confirmation. Every node speaks the same protocols, so a refusal (which then
/// shows up on the first read rather than at the open) means a peer that is not a member.
pub fn build_transport(
    key: &libp2p::identity::Keypair,
    psk: Option<PreSharedKey>,
) -> anyhow::Result<Boxed<(PeerId, StreamMuxerBox)>> {
    build_keyed_transport(key, psk.map(KeySource::Fixed))
}

/// Where the transport finds the pre-shared key of each new connection.
#[derive(Clone)]
pub enum KeySource {
    /// One key for the transport's life (tests, tools).
    Fixed(PreSharedKey),
    /// The node's key ring: each new connection, dialed or accepted, is keyed with the key
    /// current at its handshake, so a rotation's switch applies to every connection made
    /// after it (a connection keeps the key of its handshake; see `key_ring`).
    Ring(super::key_ring::KeyRing),
}

/// [`build_transport`] with the pre-shared key read from `source` at each handshake.
pub fn build_keyed_transport(
    key: &libp2p::identity::Keypair,
    source: Option<KeySource>,
) -> anyhow::Result<Boxed<(PeerId, StreamMuxerBox)>> {
    let tcp = tcp::tokio::Transport::new(tcp::Config::default().nodelay(true));
    let tcp = dns::tokio::Transport::system(tcp)?;
    let private = tcp.and_then(move |socket, _| {
        let psk = source.as_ref().map(|s| match s {
            KeySource::Fixed(psk) => *psk,
            KeySource::Ring(ring) => ring.current().psk,
        });
        async move {
            match psk {
                Some(psk) => PnetConfig::new(psk)
                    .handshake(socket)
                    .await
                    .map(Either::Left),
                None => Ok(Either::Right(socket)),
            }
        }
    });
    Ok(private
        .upgrade(Version::V1Lazy)
        .authenticate(noise::Config::new(key)?)
        .multiplex(yamux::Config::default())
        .timeout(Duration::from_secs(20))
        .boxed())
}

/// Builds the swarm for `key`, with the cluster key's ring if one is given.
pub fn build_swarm(
    key: libp2p::identity::Keypair,
    ring: Option<super::key_ring::KeyRing>,
) -> anyhow::Result<Swarm<Behaviour>> {
    let transport = build_keyed_transport(&key, ring.map(KeySource::Ring))?;
    let swarm = libp2p::SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_other_transport(|_| transport)?
        .with_behaviour(|_| Behaviour {
            streams: libp2p_stream::Behaviour::new(),
            addresses: peer_store::Behaviour::new(MemoryStore::new(
                peer_store::memory_store::Config::default().set_peer_capacity(
                    NonZeroUsize::new(ADDRESS_BOOK_PEERS_MAX).expect("a positive capacity"),
                ),
            )),
        })?
        .with_swarm_config(|c| {
            // A new stream costs no round trip of negotiation either (see above).
            c.with_idle_connection_timeout(Duration::from_secs(IDLE_CONNECTION_S))
                .with_substream_upgrade_protocol_override(Version::V1Lazy)
        })
        .build();
    Ok(swarm)
}

/// Requests into the event loop.
pub enum Command {
    /// A snapshot of membership for the API.
    View(oneshot::Sender<ClusterView>),
    /// Leave the cluster gracefully; replies once the announcement went out (or timed out).
    Leave(oneshot::Sender<()>),
    /// The membership view: every member (tombstones included) and the core's clock.
    Members(oneshot::Sender<(u64, Vec<MemberView>)>),
    /// Send an RPC to a peer and reply with its answer.
    Rpc {
        to: PeerId,
        payload: Vec<u8>,
        reply: oneshot::Sender<Result<Vec<u8>, RpcError>>,
    },
    /// Change this node's metadata (it is gossiped with a higher version) when `f` changes it.
    UpdateMeta(MetaUpdate),
    /// Keep connections to these peers up (in place of the previous set).
    KeepConnected(Vec<PeerId>),
    /// Close every connection to these peers (members removed, at a key rotation's switch:
    /// a connection keeps the key of its handshake, and their redials need the new key).
    Disconnect(Vec<PeerId>),
    /// The members removed from the cluster (in place of the previous set): their
    /// membership datagrams and frames are dropped.
    SetRemoved(Vec<PeerId>),
}

/// A change to this node's metadata, run on the event loop.
pub type MetaUpdate = Box<dyn FnOnce(&mut NodeMeta) + Send>;

/// A member as the membership core holds it.
pub type MemberView = membership::Member<PeerId, NodeMeta>;

/// A snapshot of this node's view of the cluster (the API turns it into the status document).
#[derive(Clone, Debug)]
pub struct ClusterView {
    /// This node's peer id.
    pub local: PeerId,
    /// Every member the core knows, this node and tombstones included.
    pub members: Vec<MemberView>,
    /// The networking counters, with the core's health score and suspicions filled in.
    pub counters: Counters,
    /// The `--join` addresses this node has never connected to since it started (a typo, a
    /// seed that is down, or one with another cluster key).
    pub seeds_never_reached: Vec<String>,
}

/// Counters of the node's networking, for operators and tests.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Counters {
    pub messages_in: u64,
    pub messages_out: u64,
    /// Membership messages dropped as garbled, truncated or oversized.
    pub bad_messages: u64,
    pub send_failures: u64,
    pub seed_dial_failures: u64,
    /// Suspicions this node raised against other members.
    pub suspicions: u64,
    /// Incoming connections that failed their handshake (wrong or missing cluster key, …).
    pub refused_connections: u64,
    /// Datagrams on the p2p port that did not open (another cluster key, `--insecure`
    /// against a keyed cluster, or not ringleader's), were not fresh, or came from a
    /// removed member: the three below included.
    pub refused_datagrams: u64,
    /// Datagrams seen before within the replay window (`datagrams::replay`).
    pub replayed_datagrams: u64,
    /// Datagrams sealed outside the replay window around this host's clock.
    pub skewed_datagrams: u64,
    /// Datagrams and membership frames from members removed from the cluster.
    pub removed_datagrams: u64,
    /// Membership claims not believed: without their subject's signature, or past the
    /// incarnation bounds (`membership::claims`).
    pub refused_claims: u64,
    /// Lifeguard local health score (0 is healthy).
    pub health_score: u32,
}

/// A cheap handle to the event loop.
#[derive(Clone)]
pub struct NodeHandle {
    tx: mpsc::Sender<Command>,
    /// Counts the changes of the view (see [`NodeHandle::member_changes`]).
    changes: watch::Receiver<u64>,
}

impl NodeHandle {
    /// This node's view of the cluster: its members and the networking counters.
    pub async fn view(&self) -> anyhow::Result<ClusterView> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::View(tx))
            .await
            .map_err(|_| anyhow::anyhow!("node is shutting down"))?;
        Ok(rx.await?)
    }

    /// Announces a graceful leave and waits until it has been sent.
    pub async fn leave(&self) -> anyhow::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Leave(tx))
            .await
            .map_err(|_| anyhow::anyhow!("node is shutting down"))?;
        Ok(rx.await?)
    }

    /// Every member the core knows (tombstones included), with the core's clock in ms.
    pub async fn members(&self) -> anyhow::Result<(u64, Vec<MemberView>)> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Members(tx))
            .await
            .map_err(|_| anyhow::anyhow!("node is shutting down"))?;
        Ok(rx.await?)
    }

    /// Follows the changes of this node's view: its value grows by one whenever a member
    /// joins or changes state or metadata (the core's `Changed` actions; a restart that
    /// changes neither is not one, and members forgotten after their death leave without
    /// one). A
    /// task that derives something from [`NodeHandle::members`] asks again only after a
    /// change (`has_changed`), instead of copying the whole view on a timer: in an idle
    /// cluster the view does not change. Fails (`has_changed` errs) once the loop is gone.
    pub fn member_changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// Calls `to` with `payload` ([`super::calls`]) and waits for the answer, at most
    /// [`CALL_TIMEOUT_MS`].
    pub async fn rpc(&self, to: PeerId, payload: Vec<u8>) -> Result<Vec<u8>, RpcError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Rpc { to, payload, reply })
            .await
            .map_err(|_| RpcError::ShuttingDown)?;
        match tokio::time::timeout(Duration::from_millis(CALL_TIMEOUT_MS), rx).await {
            Ok(answer) => answer.map_err(|_| RpcError::ShuttingDown)?,
            Err(_) => Err(RpcError::Unreachable {
                peer: to,
                reason: format!("no answer in {CALL_TIMEOUT_MS} ms"),
            }),
        }
    }

    /// Changes this node's own metadata with `f`; the new metadata is gossiped (as a new
    /// version) only if `f` changed it.
    pub async fn update_meta(&self, f: impl FnOnce(&mut NodeMeta) + Send + 'static) {
        let _ = self.tx.send(Command::UpdateMeta(Box::new(f))).await;
    }

    /// Closes every connection to `peers` now (they may dial again; see
    /// [`Command::Disconnect`]).
    pub async fn disconnect(&self, peers: Vec<PeerId>) {
        let _ = self.tx.send(Command::Disconnect(peers)).await;
    }

    /// Drops the membership datagrams and frames of `removed` from now on (in place of the
    /// members given before).
    pub async fn set_removed(&self, removed: Vec<PeerId>) {
        let _ = self.tx.send(Command::SetRemoved(removed)).await;
    }

    /// Keeps connections to `peers` up from now on (redialed every second while
    /// down), in place of the peers given before. Other connections come and go with need.
    pub async fn keep_connected(&self, peers: Vec<PeerId>) {
        let _ = self.tx.send(Command::KeepConnected(peers)).await;
    }
}

/// A seed address and its retry state.
struct Seed {
    addr: Multiaddr,
    /// Whether a dial of it has ever connected.
    reached: bool,
    backoff_ms: u64,
    next_dial: Instant,
    dialing: Option<ConnectionId>,
}

/// When the event loop next wakes without a message: at the core's next timer
/// (`core_wake`), or earlier when a seed is due for a redial, but seeds count only while
/// the node dials them at all (`dials_seeds`): a seed whose redial time passed while the
/// node is in a cluster would otherwise wake the loop at once, every time round (the loop
/// spun at the timer's 1 ms resolution on every node that joined by a seed).
fn loop_wake(core_wake: Instant, seeds: &[Seed], dials_seeds: bool, now: Instant) -> Instant {
    let seed_wake = seeds
        .iter()
        .filter(|s| dials_seeds && s.dialing.is_none())
        .map(|s| s.next_dial)
        .min();
    seed_wake.map_or(core_wake, |s| s.min(core_wake).max(now))
}

/// Warns at most once per interval, counting what it held back.
struct RateLimitedWarn {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimitedWarn {
    fn new() -> Self {
        RateLimitedWarn {
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(suppressed)` when a warning is due (the count held back since the last one),
    /// `None` when this one is held back.
    fn due(&mut self, now: Instant) -> Option<u64> {
        let due = self.last.is_none_or(|t| {
            now.duration_since(t) >= Duration::from_millis(BAD_MESSAGE_WARN_INTERVAL_MS)
        });
        if due {
            self.last = Some(now);
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }

    fn warn(&mut self, now: Instant, peer: &PeerId, what: &str) {
        if let Some(suppressed) = self.due(now) {
            warn!(%peer, suppressed, "dropped malformed membership message: {what}");
        }
    }
}

/// The event loop: owns the swarm and the membership core.
pub struct EventLoop {
    swarm: Swarm<Behaviour>,
    core: Core,
    epoch: Instant,
    commands: mpsc::Receiver<Command>,
    seeds: Vec<Seed>,
    counters: Counters,
    bad_warn: RateLimitedWarn,
    /// Rate limits the warning for an inbound handshake that failed (wrong or missing key).
    refused_warn: RateLimitedWarn,
    /// Rate limits the warning for an outbound dial that failed (seed down, key mismatch).
    dial_warn: RateLimitedWarn,
    /// A leave under way: whom to tell when it is done, its deadline, and whether every
    /// announcement was written.
    leaving: Option<(oneshot::Sender<()>, Instant, bool)>,
    /// Answered by each writer once the leave's announcement to it is written (see
    /// [`Out::Close`]).
    leave_written: Option<Vec<oneshot::Receiver<()>>>,
    /// Peers sent to since this was set (the leave's announcements), when set.
    sent_to: Option<Vec<PeerId>>,
    /// The membership streams and what they read and report.
    streams: PeerStreams,
    stream_events: mpsc::Receiver<StreamEvent>,
    /// The calls to and from peers, and the bad frames they read.
    calls: PeerCalls,
    bad_calls: mpsc::Receiver<BadCall>,
    /// Membership's datagrams: the socket and the seal.
    datagrams: Datagrams,
    /// Rate limits the warning for datagrams that do not open.
    datagram_warn: RateLimitedWarn,
    /// Rate limits the warning for datagrams sealed outside the replay window (a clock off).
    skew_warn: RateLimitedWarn,
    /// Peers whose connections are kept up, and when they were last dialed.
    keep: Vec<PeerId>,
    keep_dialed: Option<Instant>,
    /// Counts the view's changes, for [`NodeHandle::member_changes`].
    changes: watch::Sender<u64>,
}

impl EventLoop {
    /// Wraps a listening swarm, the datagram socket on its port, and a core; returns the
    /// loop and its handle.
    pub fn new(
        swarm: Swarm<Behaviour>,
        datagrams: Datagrams,
        core: Core,
        epoch: Instant,
        seeds: Vec<Multiaddr>,
    ) -> (Self, NodeHandle) {
        let (tx, commands) = mpsc::channel(COMMAND_QUEUE_DEPTH);
        let (changes, changes_rx) = watch::channel(0);
        let (calls, bad_calls) = PeerCalls::new(swarm.behaviour().streams.new_control());
        let (streams, stream_events) = PeerStreams::new(
            swarm.behaviour().streams.new_control(),
            StreamProtocol::new(MEMBERSHIP_PROTOCOL),
            MEMBERSHIP_FRAME_BYTES_MAX,
        )
        .expect("a new swarm accepts the membership protocol once, here");
        let now = Instant::now();
        let seeds = seeds
            .into_iter()
            .map(|addr| Seed {
                addr,
                reached: false,
                backoff_ms: SEED_BACKOFF_MIN_MS,
                next_dial: now,
                dialing: None,
            })
            .collect();
        let lp = EventLoop {
            swarm,
            core,
            epoch,
            commands,
            seeds,
            counters: Counters::default(),
            bad_warn: RateLimitedWarn::new(),
            refused_warn: RateLimitedWarn::new(),
            dial_warn: RateLimitedWarn::new(),
            leaving: None,
            leave_written: None,
            sent_to: None,
            streams,
            stream_events,
            calls,
            bad_calls,
            datagrams,
            datagram_warn: RateLimitedWarn::new(),
            skew_warn: RateLimitedWarn::new(),
            keep: Vec::new(),
            keep_dialed: None,
            changes,
        };
        let handle = NodeHandle {
            tx,
            changes: changes_rx,
        };
        (lp, handle)
    }

    /// Routes inbound RPCs to a handler; returns its queue. Without one, no call stream is
    /// accepted (a caller's open fails: the peer is unreachable).
    pub fn rpc_inbound(&mut self) -> mpsc::Receiver<InboundRpc> {
        let (tx, rx) = mpsc::channel(RPC_INBOUND_QUEUE_DEPTH);
        self.calls
            .serve(tx)
            .expect("calls are served once, when the control plane starts");
        rx
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Runs until every handle is dropped, or a leave has been flushed.
    pub async fn run(mut self) {
        loop {
            self.dial_due_seeds();
            self.keep_connections();
            let core_wake = self.epoch
                + Duration::from_millis(
                    self.core.next_wakeup_ms().min(self.now_ms() + TICK_MAX_MS),
                );
            let wake = loop_wake(core_wake, &self.seeds, self.dials_seeds(), Instant::now());
            tokio::select! {
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                cmd = self.commands.recv() => match cmd {
                    Some(cmd) => self.on_command(cmd),
                    None => return,
                },
                Some(ev) = self.stream_events.recv() => self.on_stream_event(ev),
                received = self.datagrams.recv() => self.on_datagram(received),
                Some(BadCall { peer, reason }) = self.bad_calls.recv() => {
                    self.counters.bad_messages += 1;
                    self.bad_warn.warn(Instant::now(), &peer, &reason);
                }
                _ = async {
                    match self.leave_written.as_mut() {
                        // One at a time, each dropped as it answers: this future is
                        // dropped whenever another branch wins, and a oneshot must not be
                        // polled again once it answered.
                        Some(flushed) => {
                            while let Some(rx) = flushed.last_mut() {
                                let _ = rx.await;
                                flushed.pop();
                            }
                        }
                        None => std::future::pending().await,
                    }
                } => {
                    self.leave_written = None;
                    if let Some((_, _, written)) = &mut self.leaving {
                        *written = true;
                    }
                }
                _ = tokio::time::sleep_until(wake.into()) => self.drive(Event::Tick),
            }
            if self.leave_flushed() {
                return;
            }
        }
    }

    /// True once a requested leave has gone out (every announcement answered or failed) or
    /// its flush deadline passed; the leave's caller is told then.
    fn leave_flushed(&mut self) -> bool {
        let done = match &self.leaving {
            Some((_, deadline, written)) => *written || Instant::now() >= *deadline,
            None => false,
        };
        if done {
            if let Some((reply, _, _)) = self.leaving.take() {
                let _ = reply.send(());
            }
        }
        done
    }

    /// Seeds are dialled while this node knows no other live member (at start, and again if
    /// it is ever left alone), each retried with capped exponential backoff.
    /// Whether seeds are dialed now: only by a node alone in its view (joining, or cut off),
    /// never while it leaves.
    fn dials_seeds(&self) -> bool {
        self.leaving.is_none() && self.core.alive_count() <= 1
    }

    fn dial_due_seeds(&mut self) {
        if !self.dials_seeds() {
            return;
        }
        let now = Instant::now();
        for seed in &mut self.seeds {
            if seed.dialing.is_some() || seed.next_dial > now {
                continue;
            }
            let opts = DialOpts::unknown_peer_id()
                .address(seed.addr.clone())
                .build();
            let id = opts.connection_id();
            match self.swarm.dial(opts) {
                Ok(()) => seed.dialing = Some(id),
                Err(e) => {
                    debug!(addr = %seed.addr, "seed dial refused: {e}");
                    seed.next_dial = now + Duration::from_millis(seed.backoff_ms);
                    seed.backoff_ms = (seed.backoff_ms * 2).min(SEED_BACKOFF_MAX_MS);
                }
            }
        }
    }

    /// Dials the peers to keep connected that are not, at most every [`KEEP_REDIAL_MS`].
    fn keep_connections(&mut self) {
        let now = Instant::now();
        let due = self
            .keep_dialed
            .is_none_or(|t| now.duration_since(t) >= Duration::from_millis(KEEP_REDIAL_MS));
        if self.keep.is_empty() || self.leaving.is_some() || !due {
            return;
        }
        self.keep_dialed = Some(now);
        let me = *self.swarm.local_peer_id();
        for id in self.keep.clone() {
            if id == me || self.swarm.is_connected(&id) {
                continue;
            }
            self.offer_addresses(id);
            let opts = DialOpts::peer_id(id)
                .condition(PeerCondition::DisconnectedAndNotDialing)
                .build();
            if let Err(e) = self.swarm.dial(opts) {
                debug!(peer = %id, "dial to keep connected refused: {e}");
            }
        }
    }

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::View(reply) => {
                let _ = reply.send(self.view());
            }
            Command::Members(reply) => {
                let members = self.core.members().cloned().collect();
                let _ = reply.send((self.now_ms(), members));
            }
            Command::KeepConnected(peers) => {
                self.keep = peers;
                self.keep_dialed = None;
            }
            Command::Disconnect(peers) => {
                for peer in peers {
                    if self.swarm.disconnect_peer_id(peer).is_ok() {
                        info!(%peer, "connections closed (a removed member, at a key switch)");
                    }
                }
            }
            Command::SetRemoved(removed) => self.datagrams.set_removed(removed),
            Command::UpdateMeta(f) => {
                let mut meta = self.core.local().meta.clone();
                f(&mut meta);
                if meta != self.core.local().meta {
                    self.drive(Event::SetMeta(meta));
                }
            }
            Command::Rpc { to, payload, reply } => {
                self.offer_addresses(to);
                self.calls.call(to, payload, reply);
            }
            Command::Leave(reply) => {
                self.sent_to = Some(Vec::new());
                self.drive(Event::Leave);
                let peers = self.sent_to.take().unwrap_or_default();
                // Each writer answers its close once the peer read the announcement
                // ahead of it; the leave is done when all have (or at its deadline).
                let flushed: Vec<oneshot::Receiver<()>> = peers
                    .into_iter()
                    .filter_map(|peer| {
                        let (tx, rx) = oneshot::channel();
                        self.streams.send(peer, Out::Close(tx)).ok().map(|()| rx)
                    })
                    .collect();
                let deadline = Instant::now() + Duration::from_millis(LEAVE_FLUSH_MS);
                info!("leaving the cluster");
                self.leaving = Some((reply, deadline, false));
                self.leave_written = Some(flushed);
            }
        }
    }

    /// Feeds one event to the core and carries out its actions.
    fn drive(&mut self, event: Event<PeerId, NodeMeta>) {
        let now = self.now_ms();
        let actions = self.core.handle(now, event);
        for action in actions {
            match action {
                Action::Send { to, msg } => self.send(to, &msg),
                Action::Changed { member, previous } => {
                    self.changes.send_modify(|n| *n = n.wrapping_add(1));
                    // Restarted, moved or gone: heard from again before its datagrams'
                    // source is trusted over what it advertises.
                    self.datagrams.forget(&member.id);
                    let name = &member.meta.name;
                    match (previous, member.state) {
                        (prev, state) if prev == Some(state) => {
                            debug!(peer = %member.id, name, "member metadata changed")
                        }
                        (_, State::Alive) => {
                            info!(peer = %member.id, name, incarnation = member.incarnation, "member alive")
                        }
                        (_, State::Suspect) => info!(peer = %member.id, name, "member suspect"),
                        (_, State::Dead) => warn!(peer = %member.id, name, "member dead"),
                        (_, State::Left) => info!(peer = %member.id, name, "member left"),
                    }
                }
            }
        }
    }

    /// Sends `msg` to `to`: as datagrams when it is a probe or gossip (what fits no
    /// datagram on the stream), on the stream otherwise and while leaving (a leave waits
    /// until its announcements were written).
    fn send(&mut self, to: PeerId, msg: &Msg) {
        let at = match self.core.member(&to) {
            Some(m) if datagrams::by_datagram(msg) && self.sent_to.is_none() => {
                self.datagrams.destinations(&to, &m.meta.p2p_addrs)
            }
            _ => Vec::new(),
        };
        if !at.is_empty() {
            match datagrams::datagram_frames(msg, self.datagrams.frame_budget()) {
                Ok((frames, rest)) => {
                    for frame in frames {
                        match self.datagrams.send(&at, &frame) {
                            Ok(()) => self.counters.messages_out += 1,
                            Err(e) => {
                                self.counters.send_failures += 1;
                                debug!(peer = %to, ?at, "membership datagram dropped: {e}");
                            }
                        }
                    }
                    if let Some(rest) = rest {
                        self.send_on_stream(to, &rest);
                    }
                }
                Err(e) => warn!(peer = %to, kind = msg.kind(), "membership message not sent: {e}"),
            }
            return;
        }
        self.send_on_stream(to, msg);
    }

    fn send_on_stream(&mut self, to: PeerId, msg: &Msg) {
        let frames = match membership_frames(msg) {
            Ok(frames) => frames,
            Err(e) => {
                warn!(peer = %to, kind = msg.kind(), "membership message not sent: {e}");
                return;
            }
        };
        self.offer_addresses(to);
        if let Some(sent_to) = &mut self.sent_to {
            if !sent_to.contains(&to) {
                sent_to.push(to);
            }
        }
        for bytes in frames {
            match self.streams.send(to, Out::Frame(bytes)) {
                Ok(()) => self.counters.messages_out += 1,
                Err(e) => {
                    self.counters.send_failures += 1;
                    debug!(peer = %to, "membership message dropped: {e:?}");
                }
            }
        }
    }

    fn on_stream_event(&mut self, ev: StreamEvent) {
        match ev {
            StreamEvent::Frame { from, frame } => self.on_membership_frame(from, frame),
            StreamEvent::Failed { peer, error, .. } => {
                self.counters.send_failures += 1;
                debug!(%peer, "membership stream failed: {error}");
                if self.leaving.is_none() && self.core.member(&peer).is_some() {
                    self.drive(Event::Unreachable { id: peer });
                }
            }
            StreamEvent::Ended { peer, writer } => {
                self.streams.ended(&peer, writer);
                self.streams.reap();
            }
        }
    }

    /// Before a send to a peer we are not connected to, offers libp2p the member's
    /// advertised addresses (a failed dial drops them from libp2p's cache, so they are
    /// offered again on each attempt).
    fn offer_addresses(&mut self, to: PeerId) {
        if self.swarm.is_connected(&to) {
            return;
        }
        let addrs: Vec<Multiaddr> = self
            .core
            .member(&to)
            .map(|m| {
                m.meta
                    .p2p_addrs
                    .iter()
                    .filter_map(|a| a.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        for addr in addrs {
            self.swarm.add_peer_address(to, addr);
        }
    }

    fn on_swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        match event {
            SwarmEvent::Behaviour(BehaviourEvent::Streams(())) => {}
            SwarmEvent::Behaviour(BehaviourEvent::Addresses(_)) => {}
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                ..
            } => {
                if let Some(seed) = self
                    .seeds
                    .iter_mut()
                    .find(|s| s.dialing == Some(connection_id))
                {
                    info!(addr = %seed.addr, peer = %peer_id, "connected to seed");
                    seed.reached = true;
                    seed.dialing = None;
                    seed.backoff_ms = SEED_BACKOFF_MIN_MS;
                    seed.next_dial = Instant::now() + Duration::from_millis(SEED_BACKOFF_MAX_MS);
                    if peer_id != *self.swarm.local_peer_id() {
                        self.drive(Event::Join {
                            seeds: vec![peer_id],
                        });
                    }
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established: 0,
                cause,
                ..
            } if self.core.member(&peer_id).is_some() => {
                debug!(peer = %peer_id, ?cause, "connection closed");
                self.drive(Event::Unreachable { id: peer_id });
            }
            SwarmEvent::OutgoingConnectionError {
                connection_id,
                peer_id,
                error,
            } => {
                if let Some(seed) = self
                    .seeds
                    .iter_mut()
                    .find(|s| s.dialing == Some(connection_id))
                {
                    self.counters.seed_dial_failures += 1;
                    // A seed that is down, or one that refuses this node's cluster key: the
                    // operator needs to know within seconds, not only at debug.
                    if let Some(suppressed) = self.dial_warn.due(Instant::now()) {
                        warn!(
                            addr = %seed.addr,
                            retry_ms = seed.backoff_ms,
                            suppressed,
                            "seed unreachable (down, or a different --cluster-key: if the cluster's key was rotated while this node was away, copy cluster.key from a member and restart with --cluster-key FILE): {error}"
                        );
                    }
                    seed.dialing = None;
                    seed.next_dial = Instant::now() + Duration::from_millis(seed.backoff_ms);
                    seed.backoff_ms = (seed.backoff_ms * 2).min(SEED_BACKOFF_MAX_MS);
                } else if let Some(peer) = peer_id {
                    debug!(%peer, "dial failed: {error}");
                }
            }
            SwarmEvent::IncomingConnectionError {
                send_back_addr,
                error,
                ..
            } => {
                self.counters.refused_connections += 1;
                if let Some(suppressed) = self.refused_warn.due(Instant::now()) {
                    warn!(
                        from = %send_back_addr,
                        suppressed,
                        "incoming connection refused (a node with a different or missing --cluster-key?): {error}"
                    );
                }
            }
            SwarmEvent::NewListenAddr { address, .. } => debug!(%address, "listening"),
            _ => {}
        }
    }

    fn on_datagram(&mut self, received: Received) {
        match received {
            Received::Frame { from, frame } => self.on_membership_frame(from, Frame::Bytes(frame)),
            Received::Refused { from, error } => {
                self.counters.refused_datagrams += 1;
                match &error {
                    OpenError::Stale(Stale::Replayed) => self.counters.replayed_datagrams += 1,
                    OpenError::Removed(_) => self.counters.removed_datagrams += 1,
                    OpenError::Stale(Stale::Skewed { skew_ms }) => {
                        self.counters.skewed_datagrams += 1;
                        // A clock off: say by how much, apart from the other refusals.
                        if let Some(suppressed) = self.skew_warn.due(Instant::now()) {
                            warn!(
                                %from,
                                skew_ms,
                                suppressed,
                                "membership datagram refused: its sender's clock is {} s {} this host's, outside the replay window of ±{} s; check NTP on both hosts",
                                skew_ms.unsigned_abs() / 1_000,
                                if *skew_ms > 0 { "ahead of" } else { "behind" },
                                datagrams::replay::REPLAY_WINDOW_MS / 1_000,
                            );
                        }
                        return;
                    }
                    _ => {}
                }
                if let Some(suppressed) = self.datagram_warn.due(Instant::now()) {
                    warn!(%from, suppressed, "membership datagram refused: {error}");
                }
            }
            Received::Failed(e) => {
                self.counters.bad_messages += 1;
                debug!("membership datagram not read: {e}");
            }
        }
    }

    fn on_membership_frame(&mut self, peer: PeerId, frame: Frame) {
        if self.datagrams.is_removed(&peer) {
            // Its datagrams never get here; its streams carry nothing believed either.
            self.counters.removed_datagrams += 1;
            return;
        }
        self.counters.messages_in += 1;
        let decoded = match frame {
            Frame::Bytes(bytes) => wire::decode::<Msg>(&bytes)
                .map_err(|e| e.to_string())
                .and_then(|msg| msg.check().map(|()| msg).map_err(|e| e.to_string()))
                .and_then(|msg| {
                    // Metadata over its limits is not believed: the whole message goes, as
                    // a malformed one would.
                    msg.updates()
                        .iter()
                        .try_for_each(|u| u.meta.check())
                        .map(|()| msg)
                        .map_err(|e| format!("member metadata: {e}"))
                }),
            Frame::Bad(reason) => Err(reason),
        };
        match decoded {
            Ok(msg) => self.drive(Event::Message { from: peer, msg }),
            Err(e) => {
                self.counters.bad_messages += 1;
                self.bad_warn.warn(Instant::now(), &peer, &e);
            }
        }
    }

    fn view(&self) -> ClusterView {
        let mut counters = self.counters.clone();
        counters.health_score = self.core.health_score();
        counters.suspicions = self.core.stats().suspicions_raised;
        counters.refused_claims = self.core.stats().claims_refused;
        ClusterView {
            local: *self.core.local_id(),
            members: self.core.members().cloned().collect(),
            counters,
            seeds_never_reached: self
                .seeds
                .iter()
                .filter(|s| !s.reached)
                .map(|s| s.addr.to_string())
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_piece_too_large_for_a_frame_is_halved_until_it_fits() {
        // 300 members with 32 labels of 256 + 256 bytes: about 5 MB in one piece.
        let member = |i: usize| {
            let mut meta = NodeMeta::for_test(&format!("m{i}"), 1, "127.0.0.1");
            meta.labels = (0..32)
                .map(|l| (format!("{l:0>256}"), "v".repeat(256)))
                .collect();
            membership::Update {
                id: PeerId::random(),
                incarnation: 0,
                state: State::Alive,
                meta,
                meta_version: 0,
                from: None,
                sig: vec![7; 64],
            }
        };
        let members: Vec<_> = (0..300).map(member).collect();
        let msg = Msg::StatePiece {
            answer: true,
            piece: 0,
            pieces: 1,
            members: members.clone(),
        };
        let frames = membership_frames(&msg).unwrap();
        assert!(frames.len() >= 3, "{} frames", frames.len());
        let mut back = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            assert!(f.len() <= MEMBERSHIP_FRAME_BYTES_MAX);
            let Msg::StatePiece {
                answer,
                piece,
                pieces,
                members,
            } = wire::decode::<Msg>(f).unwrap()
            else {
                panic!("not a piece")
            };
            assert_eq!((answer, piece, pieces), (i == 0, 0, 1));
            back.extend(members);
        }
        assert_eq!(back, members, "every member once, in order");
        // Small messages go as they are.
        let ping = Msg::Gossip { updates: vec![] };
        assert_eq!(membership_frames(&ping).unwrap().len(), 1);
    }

    fn seed(next_dial: Instant) -> Seed {
        Seed {
            addr: "/ip4/127.0.0.1/tcp/7070".parse().expect("multiaddr"),
            reached: false,
            backoff_ms: SEED_BACKOFF_MIN_MS,
            next_dial,
            dialing: None,
        }
    }

    #[test]
    fn a_due_seed_wakes_the_loop_only_while_seeds_are_dialed() {
        let now = Instant::now();
        let core = now + Duration::from_millis(250);
        let due = [seed(now - Duration::from_secs(5))];
        // Alone (joining): the overdue seed is dialed at once.
        assert_eq!(loop_wake(core, &due, true, now), now);
        // In a cluster: the seed is not dialed, so it must not wake the loop at all.
        assert_eq!(loop_wake(core, &due, false, now), core);
        // A later seed redial, or one being dialed, waits for its turn or not at all.
        let later = [seed(now + Duration::from_millis(100))];
        assert_eq!(
            loop_wake(core, &later, true, now),
            now + Duration::from_millis(100)
        );
        let mut dialing = seed(now - Duration::from_secs(1));
        dialing.dialing = Some(ConnectionId::new_unchecked(1));
        assert_eq!(loop_wake(core, &[dialing], true, now), core);
        assert_eq!(loop_wake(core, &[], true, now), core);
    }
}
