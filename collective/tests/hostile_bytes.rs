//! Any bytes from a peer, into the collective's decoders: an error, never a panic. The data
//! plane's frame header (`Header::decode`), the acceptor's side of the handshake (the
//! dialer's hello and data-path offer, through the decoders every accepted connection runs)
//! and the dialer's side (`testing::probe_handshake` against an acceptor that answers with
//! noise). The header and acceptor bodies of the `cargo fuzz` targets `collective_header`
//! and `collective_handshake` (`node/fuzz/bodies/`) run here too.

use std::collections::BTreeSet;
use std::time::Duration;

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use collective::testing::{
    decode_frame_header, decode_handshake_hello, decode_handshake_offer, FRAME_HEADER_BYTES,
    HANDSHAKE_HELLO_BYTES, HANDSHAKE_OFFER_BYTES,
};
use collective::HandshakeError;

#[path = "../../node/fuzz/bodies/collective_handshake.rs"]
mod collective_handshake;
#[path = "../../node/fuzz/bodies/collective_header.rs"]
mod collective_header;

/// What the fake acceptor reads before it answers: the dialer's first message.
const DIALER_HELLO_BYTES: usize = 48;
/// A handshake against noise must end well within this.
const HANDSHAKE_DEADLINE_MS: u64 = 5_000;

/// Dials a fake acceptor that reads the hello, answers `reply` and hangs up.
async fn handshake_against(reply: Vec<u8>) -> Result<(), collective::HandshakeError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut hello = [0u8; DIALER_HELLO_BYTES];
        let _ = s.read_exact(&mut hello).await;
        let _ = s.write_all(&reply).await;
        let _ = s.shutdown().await;
    });
    let out = tokio::time::timeout(
        Duration::from_millis(HANDSHAKE_DEADLINE_MS),
        collective::testing::probe_handshake(addr, b"secret", 7, 3, 0, 1),
    )
    .await
    .expect("handshake against noise hangs");
    acceptor.await.unwrap();
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn frame_headers(b in proptest::collection::vec(any::<u8>(), 0..2 * FRAME_HEADER_BYTES)) {
        collective_header::run(&b);
    }

    /// The acceptor's decoders on any bytes, as the fuzz target feeds them.
    #[test]
    fn acceptor_handshakes(b in proptest::collection::vec(any::<u8>(), 0..2 * (HANDSHAKE_HELLO_BYTES + HANDSHAKE_OFFER_BYTES))) {
        collective_handshake::run(&b);
    }

    /// Past the magic: the kind, operation and abort fields take any values.
    #[test]
    fn frame_headers_with_magic(kind in 0u8..4, mut b in any::<[u8; FRAME_HEADER_BYTES]>()) {
        b[0..2].copy_from_slice(b"RL");
        b[2] = kind;
        let _ = decode_frame_header(&b);
    }
}

/// The acceptor these tests play: rank 3 of group 7, generation 2, dialled by ranks 0 and 1.
const GROUP: u64 = 7;
const GENERATION: u64 = 2;
const ME: usize = 3;

fn expected() -> BTreeSet<usize> {
    BTreeSet::from([0, 1])
}

/// A hello as a dialer of this version writes it.
fn hello(group: u64, generation: u64, from: u32, to: u32, nonce: [u8; 16]) -> Vec<u8> {
    let mut b = b"RLHS".to_vec();
    b.extend(2u32.to_le_bytes());
    b.extend(group.to_le_bytes());
    b.extend(generation.to_le_bytes());
    b.extend(from.to_le_bytes());
    b.extend(to.to_le_bytes());
    b.extend(nonce);
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any bytes as a dialer's hello: refused (never a panic), unless they are exactly a
    /// hello of this group and generation from an expected rank to this one.
    #[test]
    fn handshake_hellos(b in proptest::collection::vec(any::<u8>(), 0..2 * HANDSHAKE_HELLO_BYTES)) {
        if let Ok(from) = decode_handshake_hello(&b, GROUP, GENERATION, ME, &expected()) {
            prop_assert_eq!(&b[..], &hello(GROUP, GENERATION, from as u32, ME as u32, b[32..].try_into().unwrap())[..]);
        }
    }

    /// Past the magic and version: any group, generation and ranks.
    #[test]
    fn handshake_hellos_with_magic(group in prop_oneof![Just(GROUP), any::<u64>()],
                                   generation in prop_oneof![Just(GENERATION), any::<u64>()],
                                   from in prop_oneof![0u32..5, any::<u32>()],
                                   to in prop_oneof![0u32..5, any::<u32>()],
                                   nonce in any::<[u8; 16]>()) {
        let b = hello(group, generation, from, to, nonce);
        let ok = group == GROUP && generation == GENERATION && to as usize == ME
            && expected().contains(&(from as usize));
        match decode_handshake_hello(&b, GROUP, GENERATION, ME, &expected()) {
            Ok(rank) => prop_assert!(ok && rank == from as usize),
            Err(HandshakeError::WrongGroup { group_id, generation: g, .. }) => {
                prop_assert!(!ok && (group_id, g) == (group, generation));
            }
            Err(HandshakeError::UnexpectedRank { from: f, to: t, .. }) => {
                prop_assert!(!ok && (f, t) == (from, to));
            }
            Err(e) => prop_assert!(false, "{e}"),
        }
    }

    /// Any bytes as a data-path offer: refused, no segment, or a path inside /dev/shm.
    #[test]
    fn handshake_offers(b in proptest::collection::vec(any::<u8>(), 0..2 * HANDSHAKE_OFFER_BYTES)) {
        if let Ok(Some(path)) = decode_handshake_offer(&b) {
            prop_assert_eq!(path.parent(), Some(std::path::Path::new("/dev/shm")));
        }
    }

    /// Offers with a valid flag: the name decides.
    #[test]
    fn handshake_offers_with_flag(flag in 0u8..3, name in "[0-9a-fA-F/.]{32}") {
        let mut b = vec![flag];
        b.extend(name.as_bytes());
        let r = decode_handshake_offer(&b);
        match flag {
            0 => prop_assert_eq!(r, Ok(None)),
            1 => {
                let well_formed = name.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
                prop_assert_eq!(r.unwrap().is_some(), well_formed);
            }
            _ => { let malformed = matches!(r, Err(HandshakeError::Malformed { .. })); prop_assert!(malformed); }
        }
    }
}

/// The acceptor's decoders tell each refusal apart, and take what a dialer sends.
#[test]
fn handshake_hellos_are_read() {
    let ok = hello(GROUP, GENERATION, 1, ME as u32, [9; 16]);
    assert_eq!(
        decode_handshake_hello(&ok, GROUP, GENERATION, ME, &expected()),
        Ok(1)
    );
    assert!(matches!(
        decode_handshake_hello(
            &ok[..HANDSHAKE_HELLO_BYTES - 1],
            GROUP,
            GENERATION,
            ME,
            &expected()
        ),
        Err(HandshakeError::Malformed { .. })
    ));
    let mut old_version = ok.clone();
    old_version[4] = 1;
    assert!(matches!(
        decode_handshake_hello(&old_version, GROUP, GENERATION, ME, &expected()),
        Err(HandshakeError::Malformed { .. })
    ));
    assert!(matches!(
        decode_handshake_hello(&ok, GROUP, GENERATION + 1, ME, &expected()),
        Err(HandshakeError::WrongGroup { .. })
    ));
    let higher = hello(GROUP, GENERATION, 4, ME as u32, [9; 16]);
    assert!(matches!(
        decode_handshake_hello(&higher, GROUP, GENERATION, ME, &expected()),
        Err(HandshakeError::UnexpectedRank { from: 4, .. })
    ));
    let mut offer = vec![1u8];
    offer.extend(b"0123456789abcdef0123456789abcdef");
    assert!(decode_handshake_offer(&offer).unwrap().is_some());
    assert_eq!(
        decode_handshake_offer(&[0; HANDSHAKE_OFFER_BYTES]),
        Ok(None)
    );
}

proptest! {
    // One loopback TCP connection a case, a millisecond or so.
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Noise can't forge the acceptor's MAC: the dialer always refuses, and never hangs.
    #[test]
    fn handshake_replies(status in prop_oneof![Just(0u8), 0u8..8, any::<u8>()],
                         rest in proptest::collection::vec(any::<u8>(), 0..96)) {
        let mut reply = vec![status];
        reply.extend(rest);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        prop_assert!(rt.block_on(handshake_against(reply)).is_err());
    }
}

/// The noise above reaches the decoder: a refusal status is a refusal, an OK status with a
/// made-up MAC is a bad MAC, and a reply cut short is malformed.
#[test]
fn handshake_replies_are_read() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut forged = vec![0u8];
    forged.extend([0u8; 48]);
    assert!(matches!(
        rt.block_on(handshake_against(forged)),
        Err(collective::HandshakeError::BadMac { .. })
    ));
    assert!(matches!(
        rt.block_on(handshake_against(vec![1])),
        Err(collective::HandshakeError::Refused { rank: 1 })
    ));
    assert!(matches!(
        rt.block_on(handshake_against(vec![0, 1, 2])),
        Err(collective::HandshakeError::Malformed { .. })
    ));
}
