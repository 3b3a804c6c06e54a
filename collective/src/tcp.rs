//! The TCP data plane: connection set-up with an authenticating handshake.
//!
//! Each pair of ranks that the algorithms need ([`crate::schedule::peers`]) shares one TCP
//! connection, dialled by the lower rank. The handshake is a mutual challenge–response:
//!
//! ```text
//! dialer → acceptor  D1 = "RLHS" version group_id generation from to nonce_d      (48 B)
//! acceptor → dialer  A1 = status nonce_a mac_a                                    (49 B)
//! dialer → acceptor  D2 = mac_d                                                   (32 B)
//! acceptor → dialer  A2 = status                                                  (1 B)
//! mac_x = blake3_keyed(derive_key(secret), role_x ‖ D1 ‖ nonce_a)
//! ```
//!
//! The acceptor refuses another group or generation (status 1) or an unexpected rank
//! (status 2) before any MAC, and a bad MAC (status 3); the dialer refuses an acceptor whose
//! MAC does not verify. Nonces from both sides make a recorded handshake useless later.
//!
//! Then, on the authenticated connection, the data path is chosen (see [`crate::shm`]):
//!
//! ```text
//! dialer → acceptor  S1 = offer name      offer 1: segment created, name = its 32 hex chars;
//!                                          offer 0: none (shm off, or too large), name zeros (33 B)
//! acceptor → dialer  S2 = status token    status 1: mapped, token = the 32 bytes inside it;
//!                                          status 0: declined (another host, shm off), zeros (33 B)
//! ```
//!
//! With status 1 and the right token both ends move data frames to the segment and keep the
//! TCP connection for abort frames and liveness; otherwise the link is TCP, as before. Only
//! a peer that passed the MAC ever learns a segment's name.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use rand::RngCore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::{timeout_at, Instant};
use tracing::{debug, warn};

use crate::config::{GroupConfig, Limits};
use crate::error::{CollectiveError, HandshakeError};
use crate::hierarchy::Hierarchy;
use crate::schedule;
use crate::shm;

const MAGIC: [u8; 4] = *b"RLHS";
/// Version 2 added the data-path negotiation (S1/S2) after the handshake.
const VERSION: u32 = 2;
const KEY_CONTEXT: &str = "ringleader collective 2024 data-plane handshake v1";
/// Length of the dialer's first message (D1), bytes.
pub(crate) const D1_BYTES: usize = 48;
const STATUS_OK: u8 = 0;
const STATUS_WRONG_GROUP: u8 = 1;
const STATUS_UNEXPECTED_RANK: u8 = 2;
const STATUS_BAD_MAC: u8 = 3;
/// First pause between dial attempts, ms; doubles up to [`DIAL_BACKOFF_MAX_MS`].
const DIAL_BACKOFF_MIN_MS: u64 = 20;
/// Longest pause between dial attempts, ms.
const DIAL_BACKOFF_MAX_MS: u64 = 500;
/// Unanswered keepalive probes before a silent peer is declared lost.
const KEEPALIVE_PROBES: u64 = 3;

/// What both sides of a handshake know.
#[derive(Clone)]
pub(crate) struct HandshakeKeys {
    key: [u8; 32],
    group_id: u64,
    generation: u64,
}

impl HandshakeKeys {
    pub fn new(secret: &[u8], group_id: u64, generation: u64) -> Self {
        HandshakeKeys {
            key: blake3::derive_key(KEY_CONTEXT, secret),
            group_id,
            generation,
        }
    }

    fn mac(&self, role: &[u8], d1: &[u8; D1_BYTES], nonce_a: &[u8; 16]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(role);
        h.update(d1);
        h.update(nonce_a);
        h.finalize()
    }
}

fn malformed(addr: &str, detail: &str) -> HandshakeError {
    HandshakeError::Malformed {
        addr: addr.into(),
        detail: detail.into(),
    }
}

/// Dialer side of the handshake on a connected stream.
pub(crate) async fn handshake_dial(
    stream: &mut TcpStream,
    keys: &HandshakeKeys,
    from: usize,
    to: usize,
) -> Result<(), HandshakeError> {
    let addr = peer_label(stream);
    let io = |e: std::io::Error| malformed(&addr, &format!("io: {e}"));
    let mut d1 = [0u8; D1_BYTES];
    d1[0..4].copy_from_slice(&MAGIC);
    d1[4..8].copy_from_slice(&VERSION.to_le_bytes());
    d1[8..16].copy_from_slice(&keys.group_id.to_le_bytes());
    d1[16..24].copy_from_slice(&keys.generation.to_le_bytes());
    d1[24..28].copy_from_slice(&(from as u32).to_le_bytes());
    d1[28..32].copy_from_slice(&(to as u32).to_le_bytes());
    rand::thread_rng().fill_bytes(&mut d1[32..48]);
    stream.write_all(&d1).await.map_err(io)?;
    let mut status = [0u8; 1];
    stream.read_exact(&mut status).await.map_err(io)?;
    match status[0] {
        STATUS_OK => {}
        STATUS_WRONG_GROUP | STATUS_UNEXPECTED_RANK | STATUS_BAD_MAC => {
            return Err(HandshakeError::Refused { rank: to })
        }
        s => return Err(malformed(&addr, &format!("status {s}"))),
    }
    let mut a1 = [0u8; 48];
    stream.read_exact(&mut a1).await.map_err(io)?;
    let nonce_a: [u8; 16] = a1[0..16].try_into().expect("16 bytes");
    let mac_a: [u8; 32] = a1[16..48].try_into().expect("32 bytes");
    if keys.mac(b"acceptor", &d1, &nonce_a) != blake3::Hash::from(mac_a) {
        return Err(HandshakeError::BadMac { addr });
    }
    let mac_d = keys.mac(b"dialer", &d1, &nonce_a);
    stream.write_all(mac_d.as_bytes()).await.map_err(io)?;
    stream.read_exact(&mut status).await.map_err(io)?;
    if status[0] != STATUS_OK {
        return Err(HandshakeError::Refused { rank: to });
    }
    Ok(())
}

/// Decodes and checks a dialer's first message (D1) as the acceptor of `keys`' group, rank
/// `me`, reads it: the dialer's rank if the magic, version, group, generation and ranks are
/// what this acceptor expects. `addr` names the peer in errors.
///
/// Pure (no I/O): [`handshake_accept`] runs every D1 through it, and the hostile-bytes tests
/// and the `collective_handshake` fuzz target feed it any bytes (through
/// [`crate::testing::decode_handshake_hello`]). A refusal the dialer is told about
/// ([`HandshakeError::WrongGroup`], [`HandshakeError::UnexpectedRank`]) maps to its status
/// byte with [`refusal_status`]; anything malformed gets no answer.
pub(crate) fn decode_hello(
    d1: &[u8],
    addr: &str,
    group_id: u64,
    generation: u64,
    me: usize,
    expected: &BTreeSet<usize>,
) -> Result<usize, HandshakeError> {
    let d1: &[u8; D1_BYTES] = d1.try_into().map_err(|_| {
        malformed(
            addr,
            &format!("hello of {} bytes, want {D1_BYTES}", d1.len()),
        )
    })?;
    if d1[0..4] != MAGIC || d1[4..8] != VERSION.to_le_bytes() {
        return Err(malformed(addr, "magic or version"));
    }
    let u64_at = |i: usize| u64::from_le_bytes(d1[i..i + 8].try_into().expect("8 bytes"));
    let u32_at = |i: usize| u32::from_le_bytes(d1[i..i + 4].try_into().expect("4 bytes"));
    let (theirs_group, theirs_generation, from, to) =
        (u64_at(8), u64_at(16), u32_at(24), u32_at(28));
    if theirs_group != group_id || theirs_generation != generation {
        return Err(HandshakeError::WrongGroup {
            addr: addr.into(),
            group_id: theirs_group,
            generation: theirs_generation,
        });
    }
    // `usize::try_from`: on a 32-bit target every u32 fits, so no rank wraps into another.
    let from_rank = usize::try_from(from).ok();
    if usize::try_from(to).ok() != Some(me) || !from_rank.is_some_and(|f| expected.contains(&f)) {
        return Err(HandshakeError::UnexpectedRank {
            addr: addr.into(),
            from,
            to,
        });
    }
    Ok(from as usize)
}

/// The status byte an acceptor answers a refused D1 with; `None`: close without one.
fn refusal_status(e: &HandshakeError) -> Option<u8> {
    match e {
        HandshakeError::WrongGroup { .. } => Some(STATUS_WRONG_GROUP),
        HandshakeError::UnexpectedRank { .. } => Some(STATUS_UNEXPECTED_RANK),
        _ => None,
    }
}

/// Acceptor side: returns the dialer's rank once it is authenticated. `expected` are the
/// ranks allowed to dial us.
pub(crate) async fn handshake_accept(
    stream: &mut TcpStream,
    keys: &HandshakeKeys,
    me: usize,
    expected: &BTreeSet<usize>,
) -> Result<usize, HandshakeError> {
    let addr = peer_label(stream);
    let io = |e: std::io::Error| malformed(&addr, &format!("io: {e}"));
    let mut d1 = [0u8; D1_BYTES];
    stream.read_exact(&mut d1).await.map_err(io)?;
    let from = match decode_hello(&d1, &addr, keys.group_id, keys.generation, me, expected) {
        Ok(from) => from,
        Err(e) => {
            if let Some(status) = refusal_status(&e) {
                let _ = stream.write_all(&[status]).await;
            }
            return Err(e);
        }
    };
    let mut nonce_a = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut nonce_a);
    let mut a1 = [0u8; 49];
    a1[0] = STATUS_OK;
    a1[1..17].copy_from_slice(&nonce_a);
    a1[17..49].copy_from_slice(keys.mac(b"acceptor", &d1, &nonce_a).as_bytes());
    stream.write_all(&a1).await.map_err(io)?;
    let mut mac_d = [0u8; 32];
    stream.read_exact(&mut mac_d).await.map_err(io)?;
    if keys.mac(b"dialer", &d1, &nonce_a) != blake3::Hash::from(mac_d) {
        let _ = stream.write_all(&[STATUS_BAD_MAC]).await;
        return Err(HandshakeError::BadMac { addr });
    }
    stream.write_all(&[STATUS_OK]).await.map_err(io)?;
    Ok(from)
}

/// Decodes a dialer's data-path offer (S1) as the acceptor reads it: `Some(name)` (not yet
/// checked: [`shm::open`] checks it) for a segment offered, `None` for none. Pure, like
/// [`decode_hello`], and fed any bytes by the same tests and fuzz target.
pub(crate) fn decode_offer<'a>(
    s1: &'a [u8],
    addr: &str,
) -> Result<Option<&'a [u8]>, HandshakeError> {
    if s1.len() != PATH_MSG_BYTES {
        return Err(malformed(
            addr,
            &format!(
                "data-path offer of {} bytes, want {PATH_MSG_BYTES}",
                s1.len()
            ),
        ));
    }
    match s1[0] {
        0 => Ok(None),
        1 => Ok(Some(&s1[1..])),
        f => Err(malformed(addr, &format!("data-path offer {f}"))),
    }
}

/// S1 and S2: one flag byte, then a segment name or token.
pub(crate) const PATH_MSG_BYTES: usize = 1 + shm::NAME_HEX_BYTES;

/// The peer's address for error messages (empty if the socket no longer knows it).
fn peer_label(stream: &TcpStream) -> String {
    stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default()
}

/// Dialer side of the data-path choice: offers a shared-memory segment when `lim` allows
/// one, and returns its end if the acceptor proved it mapped it.
async fn negotiate_dial(
    stream: &mut TcpStream,
    lim: &Limits,
) -> Result<Option<shm::Channel>, HandshakeError> {
    let addr = peer_label(stream);
    let io = |e: std::io::Error| malformed(&addr, &format!("io: {e}"));
    let offer = if lim.shared_memory {
        shm::Offer::create(lim.chunk_bytes).unwrap_or_else(|e| {
            debug!(error = %e, "no shared-memory segment");
            None
        })
    } else {
        None
    };
    let mut s1 = [0u8; PATH_MSG_BYTES];
    if let Some(o) = &offer {
        s1[0] = 1;
        s1[1..].copy_from_slice(o.name().as_bytes());
    }
    stream.write_all(&s1).await.map_err(io)?;
    let mut s2 = [0u8; PATH_MSG_BYTES];
    stream.read_exact(&mut s2).await.map_err(io)?;
    match (s2[0], offer) {
        (0, _) => Ok(None),
        (1, Some(o)) if o.proves(&s2[1..]) => o
            .into_channel(lim.blocking_waits)
            .map(Some)
            .map_err(|e| malformed(&addr, &format!("shared-memory waker: {e}"))),
        (1, _) => Err(malformed(&addr, "wrong shared-memory token")),
        (s, _) => Err(malformed(&addr, &format!("data-path status {s}"))),
    }
}

/// Acceptor side of the data-path choice: maps the offered segment if `lim` allows and it
/// is on this host.
async fn negotiate_accept(
    stream: &mut TcpStream,
    lim: &Limits,
) -> Result<Option<shm::Channel>, HandshakeError> {
    let addr = peer_label(stream);
    let io = |e: std::io::Error| malformed(&addr, &format!("io: {e}"));
    let mut s1 = [0u8; PATH_MSG_BYTES];
    stream.read_exact(&mut s1).await.map_err(io)?;
    let mut s2 = [0u8; PATH_MSG_BYTES];
    let ch = match decode_offer(&s1, &addr)? {
        None => None,
        Some(name) if lim.shared_memory => {
            match shm::open(name, lim.chunk_bytes, lim.blocking_waits) {
                Ok((ch, token)) => {
                    s2[0] = 1;
                    s2[1..].copy_from_slice(&token);
                    Some(ch)
                }
                Err(e) => {
                    debug!(peer = %addr, error = %e, "shared memory declined");
                    None
                }
            }
        }
        Some(_) => None,
    };
    stream.write_all(&s2).await.map_err(io)?;
    Ok(ch)
}

/// An authenticated connection and, when the peer is on this host, its shared segment.
pub(crate) type Connection = (TcpStream, Option<shm::Channel>);

/// Data-plane socket options: no Nagle delay, optional buffer sizes, and a bound on how long
/// a silent peer (host down, cable cut: no FIN or RST ever comes) goes unnoticed — keepalive
/// probes when idle and `TCP_USER_TIMEOUT` for unacknowledged data, both about
/// `peer_silence_ms`.
fn tune(stream: &TcpStream, lim: &Limits) {
    let _ = stream.set_nodelay(true);
    let s = socket2::SockRef::from(stream);
    if let Some(n) = lim.socket_buffer_bytes {
        let _ = s.set_send_buffer_size(n);
        let _ = s.set_recv_buffer_size(n);
    }
    let probe = Duration::from_millis((lim.peer_silence_ms / (KEEPALIVE_PROBES + 1)).max(1));
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(probe)
        .with_interval(probe);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let keepalive = keepalive.with_retries(KEEPALIVE_PROBES as u32);
    let _ = s.set_tcp_keepalive(&keepalive);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = s.set_tcp_user_timeout(Some(Duration::from_millis(lim.peer_silence_ms)));
}

/// Dials `to` until the deadline, retrying refused connections and failed handshakes.
async fn dial(
    addr: SocketAddr,
    keys: HandshakeKeys,
    from: usize,
    to: usize,
    deadline: Instant,
    handshake: Duration,
    lim: Limits,
) -> Result<(usize, Connection), CollectiveError> {
    let mut backoff = Duration::from_millis(DIAL_BACKOFF_MIN_MS);
    let mut last: CollectiveError = CollectiveError::Connect {
        rank: to,
        detail: "deadline passed before the first attempt".into(),
    };
    loop {
        let attempt = async {
            let mut s = TcpStream::connect(addr)
                .await
                .map_err(|e| CollectiveError::Connect {
                    rank: to,
                    detail: e.to_string(),
                })?;
            tune(&s, &lim);
            let both = async {
                handshake_dial(&mut s, &keys, from, to).await?;
                negotiate_dial(&mut s, &lim).await
            };
            match tokio::time::timeout(handshake, both).await {
                Ok(Ok(ch)) => Ok((s, ch)),
                Ok(Err(e)) => Err(CollectiveError::Handshake(e)),
                Err(_) => Err(CollectiveError::Connect {
                    rank: to,
                    detail: "handshake timed out".into(),
                }),
            }
        };
        match timeout_at(deadline, attempt).await {
            Ok(Ok(s)) => return Ok((to, s)),
            Ok(Err(e)) => {
                debug!(rank = to, error = %e, "dial attempt failed");
                last = e;
            }
            Err(_) => return Err(last),
        }
        if Instant::now() + backoff >= deadline {
            return Err(last);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(DIAL_BACKOFF_MAX_MS));
    }
}

/// Opens and authenticates every connection `cfg.rank` needs: dials the higher peers and
/// accepts the lower ones on `listener` until all are there or the connect deadline passes.
pub(crate) async fn establish(
    cfg: &GroupConfig,
    listener: &TcpListener,
) -> Result<HashMap<usize, Connection>, CollectiveError> {
    let me = cfg.rank;
    let lim = &cfg.limits;
    let keys = HandshakeKeys::new(&cfg.secret, cfg.group_id, cfg.generation);
    let deadline = Instant::now() + Duration::from_millis(lim.connect_timeout_ms);
    let hs_timeout = Duration::from_millis(lim.handshake_timeout_ms);
    let mut needed = schedule::peers(me, cfg.world);
    if let Some(h) = Hierarchy::for_group(&cfg.addrs, cfg.limits.allreduce) {
        needed.extend(h.peers(me));
    }
    let to_accept: BTreeSet<usize> = needed.iter().copied().filter(|&p| p < me).collect();
    let mut streams = HashMap::new();

    let mut dials = JoinSet::new();
    for &p in needed.iter().filter(|&&p| p > me) {
        dials.spawn(dial(
            cfg.addrs[p],
            keys.clone(),
            me,
            p,
            deadline,
            hs_timeout,
            lim.clone(),
        ));
    }
    let mut handshakes: JoinSet<Result<(usize, Connection), HandshakeError>> = JoinSet::new();
    let mut accepted = 0;
    loop {
        let accepting = accepted < to_accept.len();
        if !accepting && dials.is_empty() {
            return Ok(streams);
        }
        tokio::select! {
            r = listener.accept(), if accepting => match r {
                Ok((mut s, _)) => {
                    tune(&s, lim);
                    let keys = keys.clone();
                    let expected = to_accept.clone();
                    let lim = lim.clone();
                    handshakes.spawn(async move {
                        let both = async {
                            let from = handshake_accept(&mut s, &keys, me, &expected).await?;
                            Ok::<_, HandshakeError>((from, negotiate_accept(&mut s, &lim).await?))
                        };
                        let (from, ch) = tokio::time::timeout(hs_timeout, both)
                            .await
                            .map_err(|_| malformed("", "handshake timed out"))??;
                        Ok((from, (s, ch)))
                    });
                }
                Err(e) => warn!(error = %e, "accept failed"),
            },
            Some(r) = handshakes.join_next(), if !handshakes.is_empty() => match r {
                Ok(Ok((from, s))) => {
                    if streams.insert(from, s).is_none() {
                        accepted += 1;
                    }
                }
                Ok(Err(e)) => warn!(rank = me, error = %e, "refused data-plane connection"),
                Err(e) => warn!(error = %e, "handshake task failed"),
            },
            Some(r) = dials.join_next(), if !dials.is_empty() => match r {
                Ok(Ok((to, s))) => { streams.insert(to, s); }
                Ok(Err(e)) => return Err(e),
                Err(e) => return Err(CollectiveError::Connect { rank: me, detail: e.to_string() }),
            },
            _ = tokio::time::sleep_until(deadline) => {
                let missing = to_accept.iter().find(|p| !streams.contains_key(p)).copied().unwrap_or(me);
                return Err(CollectiveError::Connect { rank: missing, detail: "no authenticated connection before the deadline".into() });
            }
        }
    }
}

/// Dials `addr` once as rank `from` of (`group_id`, `generation`) keyed by `secret` and runs
/// the dialer side of the handshake to `to`. For tests of the refusal paths.
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub async fn probe_handshake(
    addr: SocketAddr,
    secret: &[u8],
    group_id: u64,
    generation: u64,
    from: usize,
    to: usize,
) -> Result<(), HandshakeError> {
    let keys = HandshakeKeys::new(secret, group_id, generation);
    let mut s = TcpStream::connect(addr)
        .await
        .map_err(|e| malformed(&addr.to_string(), &e.to_string()))?;
    handshake_dial(&mut s, &keys, from, to).await
}
