//! `cargo fuzz` target `rpc`; its body, `../bodies/rpc.rs`, also runs in CI as a proptest
//! (`*/tests/hostile_bytes.rs`).
#![no_main]

#[path = "../bodies/rpc.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
