//! The collective data plane's 32-byte frame header.
//!
//! Through `collective::testing::decode_frame_header` (the header codec is private).
#![no_main]

use libfuzzer_sys::fuzz_target;

use collective::testing::{decode_frame_header, FRAME_HEADER_BYTES};

fuzz_target!(|data: &[u8]| {
    if let Some(b) = data.get(..FRAME_HEADER_BYTES) {
        let _ = decode_frame_header(b.try_into().expect("32 bytes"));
    }
});
