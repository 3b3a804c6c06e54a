//! `cargo fuzz` target `collective_handshake`; its body, `../bodies/collective_handshake.rs`, also runs in CI as a proptest
//! (`*/tests/hostile_bytes.rs`).
#![no_main]

#[path = "../bodies/collective_handshake.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
