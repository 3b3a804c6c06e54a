//! Membership's datagrams: probes, acks, ping-reqs, nacks and gossip travel as UDP datagrams
//! on the p2p port's number, sealed with a key derived from the cluster key.
//!
//! Why not the streams: over libp2p every pair of members that probes or gossips needs a
//! connection, and every connection its handshakes (Noise's X25519). A forming cluster of 128
//! nodes on one 2-core host opened 8,770 connections (a full mesh) and spent about a third of
//! the host's CPU in X25519 for 7 s. With the same messages as datagrams (and no connection
//! dialed ahead of need) it opens about 800, converges in 0.8–1.7 s instead of 3.0–10.7, and
//! an idle node costs 0.29–0.44 % of a core instead of 0.41–0.58 (runs alternated, one
//! evening; `docs/book/src/design/scale-history.md`). Joins, state
//! syncs (push-pull, state pieces) and leaves stay on the streams: they are large, or must
//! arrive, or both.
//!
//! A datagram is `magic | nonce | ChaCha20-Poly1305(sender's peer id | seal time | frame)`, at
//! most [`DATAGRAM_BYTES_MAX`] bytes (an Ethernet frame's payload, so IP never fragments it),
//! with the key [`ClusterKey::derive`]d for [`DATAGRAM_KEY_CONTEXT`], a random 96-bit nonce per
//! datagram and the sender's wall clock in ms. Without a cluster key (`--insecure`) a datagram
//! is `plain magic | nonce | peer id | seal time | frame`: such a cluster is open to anyone who
//! reaches the port anyway. A message too large for one datagram is sent bare and its
//! piggybacked updates follow as gossip in as many datagrams as they fill
//! ([`datagram_frames`]); an update that fills more than one alone goes on the stream.
//!
//! A member is sent to where its fresh datagrams come from, and until one came at each
//! address it advertises ([`Datagrams`]).
//!
//! What a datagram proves is weaker than a stream's: that its sender holds the cluster key,
//! not that it is the member it names (a stream's Noise handshake proves the peer id). So a
//! datagram is trusted with nothing that only its named sender may say:
//!
//! - every claim it carries about a member is that member's own, signed with its identity
//!   key (`membership::claims`): a key holder can accuse a member only at an incarnation the
//!   member signed (it refutes), and can neither raise its incarnation, nor leave in its
//!   name, nor change its addresses;
//! - it is fresh ([`replay`]): sealed within ±30 s of this host's clock and not seen before in
//!   that window, so a captured datagram replays nowhere, with the key or without it, and
//!   only a fresh one, seen first, points a member's route at its source address;
//! - its sender is not a member an operator removed (`ringleader member remove`): those are
//!   dropped before anything else (until the key is rotated a removed host still holds it).
//!
//! What remains to a key holder is what SWIM gives every member: to suspect another (which
//! it refutes within a probe), and to send from an address of its choosing datagrams naming
//! another sender, which are believed only as far as the signatures inside them go.

use std::{io, net::SocketAddr};

use chacha20poly1305::{
    aead::{Aead, KeyInit, Payload},
    ChaCha20Poly1305, Key, Nonce,
};
use libp2p::{Multiaddr, PeerId};
use tokio::io::{unix::AsyncFd, Interest};

use self::replay::{ReplayWindow, Stale, NONCE_BYTES};
use crate::{
    addr::{multiaddr_to_socket, socket_to_multiaddr},
    identity::ClusterKey,
    key_ring::KeyRing,
    membership::{Message, Update},
    meta::NodeMeta,
    wire,
};

pub mod replay;

type Msg = Message<PeerId, NodeMeta>;

/// The key-derivation context of the datagram key (changing it partitions old nodes from
/// new ones).
pub const DATAGRAM_KEY_CONTEXT: &str = "ringleader 2026-11 membership datagrams v1";
/// Largest datagram sent, in bytes: an Ethernet frame's 1,500 less IP's and UDP's headers
/// with room to spare (memberlist's figure), so that no datagram is fragmented.
pub const DATAGRAM_BYTES_MAX: usize = 1_400;
/// Largest datagram read, in bytes (UDP's own limit; larger ones are never sent, and are
/// refused as any other that does not open).
const DATAGRAM_READ_BYTES_MAX: usize = 65_536;
/// What a sealed datagram starts with (`RLm3`: a nonce and the seal time in every datagram,
/// claims signed by their subject; `RLm1` before).
const SEALED_MAGIC: &[u8; 4] = b"RLm3";
/// What an unsealed (`--insecure`) datagram starts with.
const PLAIN_MAGIC: &[u8; 4] = b"RLm2";
/// Bytes of the seal time (ms since the Unix epoch, little-endian).
const TIME_BYTES: usize = 8;
/// Bytes of the Poly1305 tag.
const TAG_BYTES: usize = 16;
/// How many times a `--listen` on port 0 looks for a port free for both TCP and UDP.
const FREE_PORT_TRIES: usize = 32;
/// Most of a member's advertised addresses a datagram goes to while no datagram came from
/// it (a host listening on every interface advertises each, and some, such as a container
/// bridge's, lead nowhere or back to the sender).
pub const ADVERTISED_TRIED_MAX: usize = 4;
/// Most members whose datagrams' source address is remembered (the membership core's
/// largest view).
const ROUTES_MAX: usize = 16_384;

/// Why a datagram was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Shorter than any datagram a node sends.
    #[error("{len} bytes, too short for a membership datagram")]
    Short {
        /// Bytes received.
        len: usize,
    },
    /// It does not start with either magic: not a ringleader node's.
    #[error("not a ringleader membership datagram")]
    NotOurs,
    /// A sealed datagram at a node without a cluster key.
    #[error("a sealed datagram, but this node runs --insecure")]
    Sealed,
    /// An unsealed datagram at a node with a cluster key.
    #[error("an unsealed datagram (from a node run with --insecure?)")]
    Unsealed,
    /// The seal does not open: another key, or altered bytes.
    #[error("does not open with this cluster's key (a host with another --cluster-key?)")]
    Forged,
    /// The sender's peer id inside is malformed.
    #[error("the sender's peer id is malformed")]
    BadSender,
    /// Sealed too far from this host's time, or seen before ([`replay`]).
    #[error("{0}")]
    Stale(#[from] Stale),
    /// The sender named inside was removed from the cluster (`ringleader member remove`).
    #[error("from {0}, a member removed from the cluster")]
    Removed(PeerId),
}

/// The datagram ciphers of the node's key ring: seals with the current key's, opens with
/// the current key's or, on the slow path of a datagram that does not open with it, with a
/// key the ring still takes ([`KeyRing::provable`]: the previous key during a rotation's
/// overlap, the pending key a member that switched first seals with). The current cipher is
/// rebuilt when the ring switches (its generation), not per datagram.
pub struct Ciphers {
    ring: KeyRing,
    cache: std::sync::Mutex<(u64, ChaCha20Poly1305)>,
}

fn datagram_cipher(key: &ClusterKey) -> ChaCha20Poly1305 {
    ChaCha20Poly1305::new(Key::from_slice(&key.derive(DATAGRAM_KEY_CONTEXT)))
}

impl Ciphers {
    /// The ciphers of `ring`.
    pub fn new(ring: KeyRing) -> Ciphers {
        let cache = (ring.generation(), datagram_cipher(&ring.current()));
        Ciphers {
            ring,
            cache: std::sync::Mutex::new(cache),
        }
    }

    /// The current key's cipher.
    fn current(&self) -> ChaCha20Poly1305 {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let generation = self.ring.generation();
        if cache.0 != generation {
            *cache = (generation, datagram_cipher(&self.ring.current()));
        }
        cache.1.clone()
    }

    /// Seals with the current key.
    fn encrypt(
        &self,
        nonce: &Nonce,
        payload: Payload<'_, '_>,
    ) -> Result<Vec<u8>, chacha20poly1305::aead::Error> {
        self.current().encrypt(nonce, payload)
    }

    /// Opens with the current key, or with another key the ring still takes.
    fn decrypt(
        &self,
        nonce: &Nonce,
        payload: Payload<'_, '_>,
    ) -> Result<Vec<u8>, chacha20poly1305::aead::Error> {
        let Payload { msg, aad } = payload;
        let first = self.current().decrypt(nonce, Payload { msg, aad });
        if first.is_ok() {
            return first;
        }
        self.ring
            .provable()
            .iter()
            .skip(1)
            .find_map(|k| datagram_cipher(k).decrypt(nonce, Payload { msg, aad }).ok())
            .ok_or(chacha20poly1305::aead::Error)
    }
}

/// Seals and opens one node's datagrams: its peer id goes inside each it sends.
/// A datagram opened: who sealed it, when, with which nonce, and its frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The sender the datagram names.
    pub from: PeerId,
    /// When it was sealed (ms since the Unix epoch, the sender's clock).
    pub sent_ms: u64,
    /// Its nonce, unique to it ([`replay`]).
    pub nonce: [u8; NONCE_BYTES],
    /// The membership frame.
    pub frame: Vec<u8>,
}

/// Seals and opens one node's datagrams: its peer id and the time go inside each it sends.
pub struct Seal {
    /// `None` without a cluster key (`--insecure`).
    cipher: Option<Ciphers>,
    /// This node.
    me: PeerId,
    /// `[len][peer id bytes]` of this node.
    prefix: Vec<u8>,
}

impl Seal {
    /// The seal of the node `me`, with the cluster's key or without one (`--insecure`).
    pub fn new(key: Option<&ClusterKey>, me: &PeerId) -> Seal {
        Seal::with_ring(key.map(|k| KeyRing::fixed(*k)), me)
    }

    /// The seal of the node `me` with its key ring (`None`: `--insecure`): what it seals and
    /// opens follows the ring's switches.
    pub fn with_ring(ring: Option<KeyRing>, me: &PeerId) -> Seal {
        let id = me.to_bytes();
        let mut prefix = Vec::with_capacity(1 + id.len());
        prefix.push(u8::try_from(id.len()).expect("a peer id is shorter than 256 bytes"));
        prefix.extend_from_slice(&id);
        Seal {
            cipher: ring.map(Ciphers::new),
            me: *me,
            prefix,
        }
    }

    /// Bytes a datagram adds around its frame.
    pub fn overhead(&self) -> usize {
        let tag = if self.cipher.is_some() { TAG_BYTES } else { 0 };
        SEALED_MAGIC.len() + NONCE_BYTES + tag + self.prefix.len() + TIME_BYTES
    }

    /// The largest frame one datagram carries.
    pub fn frame_budget(&self) -> usize {
        DATAGRAM_BYTES_MAX - self.overhead()
    }

    /// `frame` as a datagram from this node, sealed now (this host's clock).
    pub fn seal(&self, frame: &[u8]) -> Vec<u8> {
        self.seal_at(frame, wall_ms())
    }

    /// `frame` as a datagram from this node sealed at `sent_ms` (ms since the Unix epoch).
    pub fn seal_at(&self, frame: &[u8], sent_ms: u64) -> Vec<u8> {
        let nonce: [u8; NONCE_BYTES] = rand::random();
        let mut body = Vec::with_capacity(self.prefix.len() + TIME_BYTES + frame.len());
        body.extend_from_slice(&self.prefix);
        body.extend_from_slice(&sent_ms.to_le_bytes());
        body.extend_from_slice(frame);
        let mut out = Vec::with_capacity(self.overhead() + frame.len());
        match &self.cipher {
            None => {
                out.extend_from_slice(PLAIN_MAGIC);
                out.extend_from_slice(&nonce);
                out.extend_from_slice(&body);
            }
            Some(cipher) => {
                let sealed = cipher
                    .encrypt(
                        Nonce::from_slice(&nonce),
                        Payload {
                            msg: &body,
                            aad: SEALED_MAGIC,
                        },
                    )
                    .expect("ChaCha20-Poly1305 encrypts any datagram's length");
                out.extend_from_slice(SEALED_MAGIC);
                out.extend_from_slice(&nonce);
                out.extend_from_slice(&sealed);
            }
        }
        out
    }

    /// The sender, seal time, nonce and frame of `datagram` (whether it is fresh is
    /// [`replay::ReplayWindow`]'s to say).
    pub fn open(&self, datagram: &[u8]) -> Result<Opened, OpenError> {
        let short = || OpenError::Short {
            len: datagram.len(),
        };
        if datagram.len() < PLAIN_MAGIC.len() + 1 {
            return Err(short());
        }
        let (magic, rest) = datagram.split_at(SEALED_MAGIC.len());
        let sealed = match (&self.cipher, magic) {
            (Some(_), m) if m == SEALED_MAGIC => true,
            (None, m) if m == PLAIN_MAGIC => false,
            (None, m) if m == SEALED_MAGIC => return Err(OpenError::Sealed),
            (Some(_), m) if m == PLAIN_MAGIC => return Err(OpenError::Unsealed),
            _ => return Err(OpenError::NotOurs),
        };
        let tag = if sealed { TAG_BYTES } else { 0 };
        if rest.len() < NONCE_BYTES + tag {
            return Err(short());
        }
        let (nonce, body) = rest.split_at(NONCE_BYTES);
        let body = match &self.cipher {
            Some(cipher) => cipher
                .decrypt(
                    Nonce::from_slice(nonce),
                    Payload {
                        msg: body,
                        aad: SEALED_MAGIC,
                    },
                )
                .map_err(|_| OpenError::Forged)?,
            None => body.to_vec(),
        };
        let (&len, rest) = body.split_first().ok_or(OpenError::BadSender)?;
        if rest.len() < usize::from(len) {
            return Err(OpenError::BadSender);
        }
        let (id, rest) = rest.split_at(usize::from(len));
        let from = PeerId::from_bytes(id).map_err(|_| OpenError::BadSender)?;
        if rest.len() < TIME_BYTES {
            return Err(short());
        }
        let (time, frame) = rest.split_at(TIME_BYTES);
        Ok(Opened {
            from,
            sent_ms: u64::from_le_bytes(time.try_into().expect("eight bytes")),
            nonce: nonce.try_into().expect("a nonce's bytes"),
            frame: frame.to_vec(),
        })
    }
}

/// This host's clock in ms since the Unix epoch (0 before it, which no datagram is near).
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Whether `msg` travels as datagrams: the probes and gossip, not joins, syncs or state.
pub fn by_datagram(msg: &Msg) -> bool {
    matches!(
        msg,
        Message::Ping { .. }
            | Message::Ack { .. }
            | Message::PingReq { .. }
            | Message::Nack { .. }
            | Message::Gossip { .. }
    )
}

/// `msg` as frames of at most `budget` bytes, one a datagram, and what fits no datagram.
///
/// A message that fits goes whole. One that does not goes bare (its piggybacked updates
/// taken off; nothing, for a gossip message) and its updates follow in gossip messages, as
/// many as they fill; an update larger than a datagram alone comes back in the gossip
/// message for the stream. The receiver merges piggybacked and gossiped updates alike.
pub fn datagram_frames(
    msg: &Msg,
    budget: usize,
) -> Result<(Vec<Vec<u8>>, Option<Msg>), wire::WireError> {
    let whole = wire::encode(msg)?;
    if whole.len() <= budget {
        return Ok((vec![whole], None));
    }
    let mut bare = msg.clone();
    let updates = bare.take_updates();
    let mut frames = Vec::new();
    if !matches!(bare, Message::Gossip { .. }) {
        frames.push(wire::encode(&bare)?);
    }
    // A gossip message is its variant, the updates' count (a varint, at most 9 bytes) and
    // the updates.
    let gossip_bytes = wire::encode(&Msg::Gossip {
        updates: Vec::new(),
    })?
    .len()
        + 9;
    let mut group: Vec<Update<PeerId, NodeMeta>> = Vec::new();
    let mut group_bytes = gossip_bytes;
    let mut too_large = Vec::new();
    for update in updates {
        let bytes = wire::encode(&update)?.len();
        if gossip_bytes + bytes > budget {
            too_large.push(update);
            continue;
        }
        if group_bytes + bytes > budget {
            frames.push(wire::encode(&Msg::Gossip {
                updates: std::mem::take(&mut group),
            })?);
            group_bytes = gossip_bytes;
        }
        group_bytes += bytes;
        group.push(update);
    }
    if !group.is_empty() {
        frames.push(wire::encode(&Msg::Gossip { updates: group })?);
    }
    let rest = (!too_large.is_empty()).then_some(Msg::Gossip { updates: too_large });
    Ok((frames, rest))
}

/// The UDP addresses a member advertises: the IP and port of each advertised TCP address
/// that is not loopback (a member listening everywhere advertises loopback too, which is
/// another host for anyone else), or its loopback ones when it has no other; at most
/// [`ADVERTISED_TRIED_MAX`].
pub fn advertised_addrs(p2p_addrs: &[String]) -> Vec<SocketAddr> {
    let addrs: Vec<SocketAddr> = p2p_addrs
        .iter()
        .filter_map(|a| a.parse::<Multiaddr>().ok())
        .filter_map(|a| multiaddr_to_socket(&a))
        .collect();
    let outside: Vec<SocketAddr> = addrs
        .iter()
        .copied()
        .filter(|a| !a.ip().is_loopback())
        .collect();
    let mut chosen = if outside.is_empty() { addrs } else { outside };
    chosen.truncate(ADVERTISED_TRIED_MAX);
    chosen
}

/// Why the cluster's ports could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// `--listen` names no IP address (a DNS name, say).
    #[error("--listen {0} names no IP address to listen on")]
    NoIp(Multiaddr),
    /// The TCP port is taken.
    #[error("TCP: {0}")]
    Tcp(io::Error),
    /// The UDP port of the same number is taken.
    #[error("UDP: {0}")]
    Udp(io::Error),
}

/// Binds the membership datagrams' UDP socket on `listen`'s IP and TCP port, after checking
/// that the TCP port is free too (libp2p binds it with `SO_REUSEPORT`, which would share a
/// port in use silently). A `listen` on port 0 gets a port free for both; `listen` comes
/// back with its port filled in.
pub fn bind(listen: &Multiaddr) -> Result<(Multiaddr, std::net::UdpSocket), BindError> {
    let at = multiaddr_to_socket(listen).ok_or_else(|| BindError::NoIp(listen.clone()))?;
    let both = |at: SocketAddr| -> Result<std::net::UdpSocket, BindError> {
        drop(std::net::TcpListener::bind(at).map_err(BindError::Tcp)?);
        std::net::UdpSocket::bind(at).map_err(BindError::Udp)
    };
    if at.port() != 0 {
        return Ok((listen.clone(), both(at)?));
    }
    let mut last = None;
    for _ in 0..FREE_PORT_TRIES {
        // The OS picks a free UDP port; the same number is taken for TCP when free too.
        let udp = std::net::UdpSocket::bind(at).map_err(BindError::Udp)?;
        let port = udp.local_addr().map_err(BindError::Udp)?.port();
        match std::net::TcpListener::bind(SocketAddr::new(at.ip(), port)) {
            Ok(tcp) => {
                drop(tcp);
                return Ok((socket_to_multiaddr(SocketAddr::new(at.ip(), port)), udp));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(BindError::Tcp(last.expect("at least one try")))
}

/// What [`Datagrams::recv`] got.
pub enum Received {
    /// A frame from another member (or from anyone with the key, see the module doc).
    Frame {
        /// The sender the datagram names.
        from: PeerId,
        /// The membership frame.
        frame: Vec<u8>,
    },
    /// A datagram that did not open.
    Refused {
        /// Where it came from.
        from: SocketAddr,
        /// Why it was refused.
        error: OpenError,
    },
    /// The socket failed to read.
    Failed(io::Error),
}

/// The node's datagram socket and seal, owned by the event loop, and where each member's
/// datagrams came from.
///
/// A member is sent to at the address its datagrams come from once one came (the address
/// its host routes from towards this one), and until then at each address it advertises
/// ([`advertised_addrs`]): a host listening on every interface advertises addresses that
/// lead nowhere from here, or back here (a container bridge has the same address on every
/// host), where this node drops what it sent itself.
pub struct Datagrams {
    /// Registered for reading only: sends go out on the non-blocking socket directly (a
    /// datagram that finds the send buffer full is dropped), so a send never wakes the
    /// runtime again with the socket's writability.
    socket: AsyncFd<std::net::UdpSocket>,
    seal: Seal,
    me: PeerId,
    buf: Vec<u8>,
    /// The source address of the last datagram from each member, until [`Self::forget`]:
    /// only fresh datagrams, first seen, move it.
    routes: std::collections::HashMap<PeerId, SocketAddr>,
    /// The nonces of the datagrams taken within the replay window.
    replays: ReplayWindow,
    /// Members removed from the cluster, whose datagrams are dropped.
    removed: std::collections::HashSet<PeerId>,
}

impl Datagrams {
    /// Takes the socket [`bind`] made; must be called inside the Tokio runtime.
    pub fn new(socket: std::net::UdpSocket, seal: Seal) -> io::Result<Datagrams> {
        socket.set_nonblocking(true)?;
        let me = seal.me;
        Ok(Datagrams {
            // SAFETY: the AsyncFd owns the socket for as long as it is registered, and a
            // `std::net::UdpSocket`'s descriptor is open and the same for its whole life.
            socket: unsafe { AsyncFd::register_with_interest(socket, Interest::READABLE) }
                .map_err(|e| e.into_parts().1)?,
            seal,
            me,
            buf: vec![0; DATAGRAM_READ_BYTES_MAX],
            routes: std::collections::HashMap::new(),
            replays: ReplayWindow::new(),
            removed: std::collections::HashSet::new(),
        })
    }

    /// Where datagrams to `to` go: the address its datagrams come from, or the addresses
    /// it advertises (`p2p_addrs`). Empty when it has no usable one.
    pub fn destinations(&self, to: &PeerId, p2p_addrs: &[String]) -> Vec<SocketAddr> {
        match self.routes.get(to) {
            Some(at) => vec![*at],
            None => advertised_addrs(p2p_addrs),
        }
    }

    /// Forgets where `peer`'s datagrams came from (it changed: restarted, moved, died).
    pub fn forget(&mut self, peer: &PeerId) {
        self.routes.remove(peer);
    }

    /// The members removed from the cluster from now on (in place of those given before):
    /// their datagrams are dropped and no route of theirs is kept.
    pub fn set_removed(&mut self, removed: impl IntoIterator<Item = PeerId>) {
        self.removed = removed.into_iter().collect();
        let removed = &self.removed;
        self.routes.retain(|peer, _| !removed.contains(peer));
    }

    /// Whether `peer` was removed from the cluster.
    pub fn is_removed(&self, peer: &PeerId) -> bool {
        self.removed.contains(peer)
    }

    /// The largest frame one datagram carries.
    pub fn frame_budget(&self) -> usize {
        self.seal.frame_budget()
    }

    /// Sends `frame` (at most [`Self::frame_budget`] bytes) to each of `to`, without
    /// waiting: a full send buffer drops it, as the network may. Fails when no send did.
    /// Each address gets a datagram sealed for it (a nonce of its own): two advertised
    /// addresses may lead to the same member, which would take the second copy of one
    /// datagram for a replay.
    pub fn send(&self, to: &[SocketAddr], frame: &[u8]) -> io::Result<()> {
        debug_assert!(frame.len() <= self.frame_budget());
        let mut result = Err(io::Error::from(io::ErrorKind::AddrNotAvailable));
        for at in to {
            let datagram = self.seal.seal(frame);
            match self.socket.get_ref().send_to(&datagram, *at) {
                Ok(_) => result = Ok(()),
                Err(e) if result.is_err() => result = Err(e),
                Err(_) => {}
            }
        }
        result
    }

    /// The next datagram from another node (this node's own, sent to an address of its own
    /// that another member advertised, are dropped); remembers where it came from.
    pub async fn recv(&mut self) -> Received {
        loop {
            let (n, at) = match read(&self.socket, &mut self.buf).await {
                Ok(received) => received,
                Err(e) => return Received::Failed(e),
            };
            let opened = self.seal.open(&self.buf[..n]);
            if matches!(&opened, Ok(o) if o.from == self.me) {
                continue;
            }
            return match opened.and_then(|o| self.take(wall_ms(), at, o)) {
                Ok((from, frame)) => Received::Frame { from, frame },
                Err(error) => Received::Refused { from: at, error },
            };
        }
    }

    /// Takes an opened datagram that came from `at` at `now_ms` (wall clock), when it is
    /// fresh and its sender not removed: only then may its source become the sender's route.
    fn take(
        &mut self,
        now_ms: u64,
        at: SocketAddr,
        opened: Opened,
    ) -> Result<(PeerId, Vec<u8>), OpenError> {
        let peer = opened.from;
        if self.removed.contains(&peer) {
            return Err(OpenError::Removed(peer));
        }
        self.replays.admit(now_ms, opened.sent_ms, opened.nonce)?;
        if self.routes.len() < ROUTES_MAX || self.routes.contains_key(&peer) {
            self.routes.insert(peer, at);
        }
        Ok((peer, opened.frame))
    }
}

/// One datagram from `socket` into `buf`, once the socket is readable.
async fn read(
    socket: &AsyncFd<std::net::UdpSocket>,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr)> {
    loop {
        let mut ready = socket.readable().await?;
        if let Ok(read) = ready.try_io(|s| s.get_ref().recv_from(buf)) {
            return read;
        }
    }
}

#[cfg(test)]
mod tests;
