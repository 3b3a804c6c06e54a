//! `cargo fuzz` target `checkpoint_meta`; its body, `../bodies/checkpoint_meta.rs`, also runs in CI as a proptest
//! (`*/tests/hostile_bytes.rs`).
#![no_main]

#[path = "../bodies/checkpoint_meta.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
