//! `cargo fuzz` target `membership`; its body, `../bodies/membership.rs`, also runs in CI as a proptest
//! (`*/tests/hostile_bytes.rs`).
#![no_main]

#[path = "../bodies/membership.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
