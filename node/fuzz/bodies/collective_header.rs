//! The collective data plane's 32-byte frame header.
//!
//! Through `collective::testing::decode_frame_header` (the header codec is private).

use collective::testing::{decode_frame_header, FRAME_HEADER_BYTES};

pub fn run(data: &[u8]) {
    if let Some(b) = data.get(..FRAME_HEADER_BYTES) {
        let _ = decode_frame_header(b.try_into().expect("32 bytes"));
    }
}
