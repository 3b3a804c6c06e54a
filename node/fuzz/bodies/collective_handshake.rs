//! The collective acceptor's side of the data-plane handshake: the dialer's hello (D1) and
//! data-path offer (S1), through the decoders every accepted connection runs.
//!
//! Through `collective::testing` (the handshake codec is private). The acceptor is rank 1 of
//! group 7, generation 3, dialled by rank 0; the fuzzer finds the magic, the version and
//! these values by comparison tracing.

use std::collections::BTreeSet;

use collective::testing::{decode_handshake_hello, decode_handshake_offer, HANDSHAKE_HELLO_BYTES};

pub fn run(data: &[u8]) {
    let expected = BTreeSet::from([0]);
    let _ = decode_handshake_hello(data, 7, 3, 1, &expected);
    // The offer follows the hello on the stream; any length, as if cut anywhere.
    let _ = decode_handshake_offer(data.get(HANDSHAKE_HELLO_BYTES..).unwrap_or(data));
    let _ = decode_handshake_offer(data);
}
