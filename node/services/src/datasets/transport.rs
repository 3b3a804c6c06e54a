//! The dataset transport: plain TCP connections between nodes, authenticated with the
//! cluster key, carrying manifests, chunk bitmaps and chunks.
//!
//! Raw TCP rather than libp2p streams: chunks are bulk data, the collective's measurements
//! here put libp2p's Noise+Yamux at 2–3 Gbit/s against 16 for raw TCP, and every chunk is
//! checked against its manifest anyway, so the transport needs authentication (who may
//! take data), not secrecy or integrity of its own.
//!
//! Handshake (mutual, challenge–response; `K` = the cluster key's derivation for
//! [`AUTH_CONTEXT`], or that of 32 zero bytes in an open cluster):
//!
//! ```text
//! client → server   MAGIC (8 bytes), client nonce (32)
//! server → client   server nonce (32), keyed_blake3(K, "server" ‖ nonces) (32)
//! client → server   keyed_blake3(K, "client" ‖ nonces) (32)
//! server → client   ACCEPTED (1 byte)
//! ```
//!
//! A server that gets a wrong proof closes the connection without another byte: a peer
//! without the key gets nothing. Then the client sends [`Request`]s and the server answers
//! each, in order, with a [`Reply`] header and, for data, that many raw bytes. Headers are
//! length-prefixed messages of the node's wire codec, at most [`HEADER_BYTES_MAX`] bytes; a
//! body's length is checked against what the receiver expects before it is read, and the
//! receiver's buffer grows as bytes arrive, not as announced.

use std::time::Duration;

use rand::RngCore;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::Root;
use crate::cluster::wire;

/// The first bytes a client sends: protocol and version.
pub const MAGIC: [u8; 8] = *b"RLDSET01";
/// The key-derivation context of the transport's key.
pub const AUTH_CONTEXT: &str = "ringleader 2026-11 dataset transport authentication";
/// Largest request or reply header, bytes.
pub const HEADER_BYTES_MAX: usize = 1024;
/// Longest reason in a [`Reply::NotHere`], bytes.
pub const REASON_BYTES_MAX: usize = 256;
/// The first allocation of a body being read, bytes; it doubles as bytes arrive, so a peer
/// announcing a chunk or manifest and sending nothing holds at most this much.
pub const BODY_START_BYTES: u64 = 1 << 20;
/// How long a handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

const ACCEPTED: u8 = 0xA5;

/// The transport's key: derived from the cluster key, the node's current one at each
/// handshake (and, during a key rotation's overlap, the previous one too: a server proves
/// with its current key and takes a client's proof under either; a client takes a server's
/// proof under either and answers under the one that matched).
#[derive(Clone)]
pub struct AuthKey(AuthKeys);

#[derive(Clone)]
enum AuthKeys {
    Fixed([u8; 32]),
    Ring(crate::cluster::key_ring::KeyRing),
}

impl AuthKey {
    /// The key of a cluster with `key`, or of an open cluster (`None`).
    pub fn new(key: Option<&crate::cluster::identity::ClusterKey>) -> Self {
        AuthKey(AuthKeys::Fixed(match key {
            Some(k) => k.derive(AUTH_CONTEXT),
            None => blake3::derive_key(AUTH_CONTEXT, &[0u8; 32]),
        }))
    }

    /// The key of a node with `ring` (`None`: an open cluster), following its switches.
    pub fn from_ring(ring: Option<crate::cluster::key_ring::KeyRing>) -> Self {
        match ring {
            Some(ring) => AuthKey(AuthKeys::Ring(ring)),
            None => Self::new(None),
        }
    }

    /// The keys a client's proof is taken under now, the one to prove with first.
    fn keys(&self) -> Vec<[u8; 32]> {
        self.derived(crate::cluster::key_ring::KeyRing::accepted)
    }

    /// The keys a server's proof is taken under now: those of [`AuthKey::keys`] and a
    /// rotation's pending key (a server that switched first proves with it).
    fn server_keys(&self) -> Vec<[u8; 32]> {
        self.derived(crate::cluster::key_ring::KeyRing::provable)
    }

    fn derived(
        &self,
        keys: impl Fn(&crate::cluster::key_ring::KeyRing) -> Vec<crate::cluster::identity::ClusterKey>,
    ) -> Vec<[u8; 32]> {
        match &self.0 {
            AuthKeys::Fixed(k) => vec![*k],
            AuthKeys::Ring(ring) => keys(ring).iter().map(|k| k.derive(AUTH_CONTEXT)).collect(),
        }
    }
}

fn proof(key: &[u8; 32], role: &[u8], client: &[u8; 32], server: &[u8; 32]) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(role);
    h.update(client);
    h.update(server);
    h.finalize()
}

/// What a client asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// The manifest of `root`.
    Manifest {
        /// The dataset.
        root: Root,
    },
    /// Which chunks of `root` the server holds.
    Have {
        /// The dataset.
        root: Root,
    },
    /// Chunk `index` (numbered across the dataset) of `root`.
    Chunk {
        /// The dataset.
        root: Root,
        /// The chunk.
        index: u64,
    },
}

/// A server's answer header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The manifest's canonical encoding follows: `len` bytes.
    Manifest {
        /// Its length.
        len: u64,
    },
    /// The bitmap of held chunks follows: `len` bytes.
    Have {
        /// Its length.
        len: u64,
    },
    /// Chunk `index` follows: `len` bytes.
    Chunk {
        /// The chunk asked for.
        index: u64,
        /// Its length.
        len: u32,
    },
    /// The server does not hold what was asked (any more).
    NotHere {
        /// Why, for logs.
        reason: String,
    },
}

/// Why a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The connection failed or closed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The peer closed during the handshake: it does not accept our key.
    #[error("the peer refused the connection (is it in this cluster, with the same cluster key?)")]
    Refused,
    /// The peer could not prove it holds the cluster key.
    #[error("the peer does not hold the cluster key")]
    NotAMember,
    /// The peer sent something that is not the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// No answer in time.
    #[error("timed out {0}")]
    Timeout(&'static str),
}

fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut n);
    n
}

fn eof_is_refusal(e: std::io::Error) -> TransportError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        TransportError::Refused
    } else {
        TransportError::Io(e)
    }
}

/// The client's side of the handshake.
pub async fn client_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    key: &AuthKey,
) -> Result<(), TransportError> {
    let run = async {
        let client = nonce();
        let mut hello = Vec::with_capacity(40);
        hello.extend_from_slice(&MAGIC);
        hello.extend_from_slice(&client);
        stream.write_all(&hello).await?;
        let mut answer = [0u8; 64];
        stream
            .read_exact(&mut answer)
            .await
            .map_err(eof_is_refusal)?;
        let server: [u8; 32] = answer[..32].try_into().expect("32 bytes");
        let given = blake3::Hash::from_bytes(answer[32..].try_into().expect("32 bytes"));
        // blake3::Hash compares in constant time.
        let Some(matched) = key
            .server_keys()
            .into_iter()
            .find(|k| given == proof(k, b"server", &client, &server))
        else {
            return Err(TransportError::NotAMember);
        };
        stream
            .write_all(proof(&matched, b"client", &client, &server).as_bytes())
            .await?;
        let mut ok = [0u8; 1];
        stream.read_exact(&mut ok).await.map_err(eof_is_refusal)?;
        if ok[0] != ACCEPTED {
            return Err(TransportError::Protocol("bad handshake answer".into()));
        }
        Ok(())
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, run)
        .await
        .unwrap_or(Err(TransportError::Timeout("in the handshake")))
}

/// The server's side of the handshake; on a wrong magic or proof the caller closes the
/// connection without answering.
pub async fn server_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    key: &AuthKey,
) -> Result<(), TransportError> {
    let run = async {
        let mut hello = [0u8; 40];
        stream.read_exact(&mut hello).await?;
        if hello[..8] != MAGIC {
            return Err(TransportError::Protocol("not the dataset protocol".into()));
        }
        let client: [u8; 32] = hello[8..].try_into().expect("32 bytes");
        let server = nonce();
        let mut answer = Vec::with_capacity(64);
        answer.extend_from_slice(&server);
        let keys = key.keys();
        answer.extend_from_slice(proof(&keys[0], b"server", &client, &server).as_bytes());
        stream.write_all(&answer).await?;
        let mut given = [0u8; 32];
        stream.read_exact(&mut given).await?;
        let given = blake3::Hash::from_bytes(given);
        if !keys.iter().fold(false, |any, k| {
            (given == proof(k, b"client", &client, &server)) | any
        }) {
            return Err(TransportError::NotAMember);
        }
        stream.write_all(&[ACCEPTED]).await?;
        Ok(())
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, run)
        .await
        .unwrap_or(Err(TransportError::Timeout("in the handshake")))
}

/// Writes one header.
pub async fn write_header<W: AsyncWrite + Unpin, T: Serialize>(
    w: &mut W,
    msg: &T,
) -> Result<(), TransportError> {
    let bytes = wire::encode(msg).map_err(|e| TransportError::Protocol(e.to_string()))?;
    if bytes.len() > HEADER_BYTES_MAX {
        return Err(TransportError::Protocol("header too large".into()));
    }
    let mut frame = Vec::with_capacity(4 + bytes.len());
    frame.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    frame.extend_from_slice(&bytes);
    w.write_all(&frame).await?;
    Ok(())
}

/// Reads one header; `Ok(None)` if the peer closed cleanly before it.
pub async fn read_header<R: AsyncRead + Unpin, T: DeserializeOwned>(
    r: &mut R,
) -> Result<Option<T>, TransportError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > HEADER_BYTES_MAX {
        return Err(TransportError::Protocol(format!(
            "header of {len} bytes, more than {HEADER_BYTES_MAX}"
        )));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).await?;
    wire::decode(&buf)
        .map(Some)
        .map_err(|e| TransportError::Protocol(e.to_string()))
}

/// Reads a body of exactly `len` bytes, refusing one over `max` before reading; the buffer
/// grows as bytes arrive.
pub async fn read_body<R: AsyncRead + Unpin>(
    r: &mut R,
    len: u64,
    max: u64,
) -> Result<Vec<u8>, TransportError> {
    if len > max {
        return Err(TransportError::Protocol(format!(
            "body of {len} bytes, more than the {max} expected"
        )));
    }
    let mut buf = Vec::with_capacity(len.min(BODY_START_BYTES) as usize);
    let got = r.take(len).read_to_end(&mut buf).await?;
    if got as u64 != len {
        return Err(TransportError::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("body cut short at {got} of {len} bytes"),
        )));
    }
    Ok(buf)
}

/// Reads a chunk's body of exactly `len` bytes into `buf` (emptied first, then `len` long),
/// refusing one over `max` before reading. For a body whose length the reader knows from its
/// own manifest (`max`, a chunk's, at most 4 MiB): the whole of it is reserved at once, and
/// the bytes go straight into it, neither zeroed first nor copied again as it grows;
/// through a [`tokio::io::BufReader`] smaller than the body, most of them skip its buffer
/// too. A `buf` kept from an earlier chunk is reused without a new allocation.
pub async fn read_body_into<R: AsyncRead + Unpin>(
    r: &mut R,
    len: u64,
    max: u64,
    buf: &mut Vec<u8>,
) -> Result<(), TransportError> {
    if len > max {
        return Err(TransportError::Protocol(format!(
            "body of {len} bytes, more than the {max} expected"
        )));
    }
    let want =
        usize::try_from(len).map_err(|_| TransportError::Protocol("body too long".into()))?;
    buf.clear();
    buf.reserve_exact(want);
    let mut body = r.take(len);
    while buf.len() < want {
        if body.read_buf(buf).await? == 0 {
            return Err(TransportError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("body cut short at {} of {len} bytes", buf.len()),
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::identity::{generate_cluster_key, parse_cluster_key, ClusterKey};
    use crate::cluster::key_ring::KeyRing;

    fn key(byte: u8) -> AuthKey {
        AuthKey(AuthKeys::Fixed([byte; 32]))
    }

    #[tokio::test]
    async fn both_sides_with_the_key_connect() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let k = key(1);
        let (c, s) = tokio::join!(client_handshake(&mut a, &k), server_handshake(&mut b, &k));
        c.unwrap();
        s.unwrap();
        write_header(
            &mut a,
            &Request::Have {
                root: Root([3; 32]),
            },
        )
        .await
        .unwrap();
        let got: Option<Request> = read_header(&mut b).await.unwrap();
        assert_eq!(
            got,
            Some(Request::Have {
                root: Root([3; 32])
            })
        );
    }

    #[tokio::test]
    async fn a_client_without_the_key_gets_nothing() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let server = tokio::spawn(async move {
            let r = server_handshake(&mut b, &key(1)).await;
            drop(b); // the node closes the connection
            r
        });
        // The server's proof fails on the client side first: it stops.
        let c = client_handshake(&mut a, &key(2)).await;
        assert!(matches!(c, Err(TransportError::NotAMember)), "{c:?}");
        drop(a);
        assert!(server.await.unwrap().is_err());
    }

    #[tokio::test]
    async fn a_server_refuses_a_client_that_fakes_its_proof() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let server = tokio::spawn(async move { server_handshake(&mut b, &key(1)).await });
        let mut hello = MAGIC.to_vec();
        hello.extend_from_slice(&[7u8; 32]);
        a.write_all(&hello).await.unwrap();
        let mut answer = [0u8; 64];
        a.read_exact(&mut answer).await.unwrap();
        a.write_all(&[0u8; 32]).await.unwrap();
        assert!(matches!(
            server.await.unwrap(),
            Err(TransportError::NotAMember)
        ));
    }

    #[tokio::test]
    async fn oversized_headers_and_bodies_are_refused_before_allocation() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
        let r: Result<Option<Reply>, _> = read_header(&mut b).await;
        assert!(matches!(r, Err(TransportError::Protocol(_))));
        assert!(matches!(
            read_body(&mut b, 5 << 20, 4 << 20).await,
            Err(TransportError::Protocol(_))
        ));
        let mut buf = Vec::new();
        assert!(matches!(
            read_body_into(&mut b, 5 << 20, 4 << 20, &mut buf).await,
            Err(TransportError::Protocol(_))
        ));
        assert_eq!(buf.capacity(), 0, "nothing reserved for a refused body");
        // A short body is an error, not a short chunk.
        a.write_all(b"abc").await.unwrap();
        drop(a);
        assert!(read_body(&mut b, 10, 10).await.is_err());
    }

    fn cluster_key() -> ClusterKey {
        parse_cluster_key(&generate_cluster_key()).unwrap()
    }

    /// A ring switched from `a` to `b`, keeping `a` for `overlap_ms`.
    fn switched(a: ClusterKey, b: ClusterKey, overlap_ms: u64) -> KeyRing {
        let dir = tempfile::tempdir().unwrap();
        let ring = KeyRing::open(a, &dir.path().join("cluster.key"), overlap_ms);
        ring.offer(1, &b.to_swarm_key_text()).unwrap();
        ring.switch_to(&b.fingerprint()).unwrap().unwrap();
        ring
    }

    /// The dataset transport's handshake across a switch: members on either side of it
    /// connect during the overlap (one not yet switched takes a proof under its pending key),
    /// a host holding only the old key (a removed one) is refused as a client at once and as a
    /// server after the overlap.
    #[tokio::test]
    async fn dataset_handshakes_across_a_switch() {
        let (a, b) = (cluster_key(), cluster_key());
        let handshake = |server: AuthKey, client: AuthKey| async move {
            let (mut x, mut y) = tokio::io::duplex(1024);
            // Each side closes its end when it is done, as the real ones do.
            let (c, s) = tokio::join!(
                async move { client_handshake(&mut x, &client).await },
                async move { server_handshake(&mut y, &server).await }
            );
            c.is_ok() && s.is_ok()
        };
        let waiting = {
            let ring = KeyRing::fixed(a);
            ring.offer(1, &b.to_swarm_key_text()).unwrap();
            AuthKey::from_ring(Some(ring))
        };
        let during = AuthKey::from_ring(Some(switched(a, b, 60_000)));
        let after = AuthKey::from_ring(Some(switched(a, b, 0)));
        let (outsider, new) = (AuthKey::new(Some(&a)), AuthKey::new(Some(&b)));
        assert!(
            handshake(during.clone(), waiting.clone()).await,
            "not yet switched client"
        );
        assert!(
            handshake(waiting.clone(), during.clone()).await,
            "not yet switched server"
        );
        assert!(
            !handshake(during.clone(), outsider.clone()).await,
            "old-key client"
        );
        assert!(
            !handshake(after.clone(), outsider.clone()).await,
            "old-key client, after"
        );
        assert!(
            !handshake(outsider, after.clone()).await,
            "old-key server, after"
        );
        assert!(handshake(after, new).await);
    }

    #[tokio::test]
    async fn a_chunk_body_is_read_whole_into_a_reused_buffer_and_a_short_one_fails() {
        let (mut a, b) = tokio::io::duplex(64 << 10);
        // Smaller than a body, as the fetch's reader is: most bytes skip its buffer.
        let mut r = tokio::io::BufReader::with_capacity(4 << 10, b);
        let first: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let second: Vec<u8> = (0..70_000u32).map(|i| (i * 7) as u8).collect();
        let sent = [first.clone(), second.clone(), b"short".to_vec()];
        // Dropping `a` at its end closes the stream after the short body.
        let writer = tokio::spawn(async move {
            for body in sent {
                a.write_all(&body).await.unwrap();
            }
        });
        let mut buf = Vec::new();
        read_body_into(&mut r, 100_000, 1 << 20, &mut buf)
            .await
            .unwrap();
        assert_eq!(buf, first);
        let at = buf.as_ptr();
        read_body_into(&mut r, 70_000, 1 << 20, &mut buf)
            .await
            .unwrap();
        assert_eq!(buf, second);
        assert_eq!(
            buf.as_ptr(),
            at,
            "the second body reuses the first's buffer"
        );
        writer.await.unwrap();
        let short = read_body_into(&mut r, 10, 10, &mut buf).await;
        assert!(matches!(short, Err(TransportError::Io(_))), "{short:?}");
    }
}
