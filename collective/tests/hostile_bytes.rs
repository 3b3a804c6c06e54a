//! Any bytes from a peer, into the collective's decoders: an error, never a panic. The data
//! plane's frame header (`Header::decode`) and the dialer's side of the handshake
//! (`testing::probe_handshake` against an acceptor that answers with noise). The same
//! header body is a `cargo fuzz` target in `node/fuzz/`.

use std::time::Duration;

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use collective::testing::{decode_frame_header, FRAME_HEADER_BYTES};

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
    fn frame_headers(b in any::<[u8; FRAME_HEADER_BYTES]>()) {
        let _ = decode_frame_header(&b);
    }

    /// Past the magic: the kind, operation and abort fields take any values.
    #[test]
    fn frame_headers_with_magic(kind in 0u8..4, mut b in any::<[u8; FRAME_HEADER_BYTES]>()) {
        b[0..2].copy_from_slice(b"RL");
        b[2] = kind;
        let _ = decode_frame_header(&b);
    }
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
