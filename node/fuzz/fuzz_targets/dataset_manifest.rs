//! `cargo fuzz` target `dataset_manifest`; its body, `../bodies/dataset_manifest.rs`, also runs in CI as a proptest
//! (`*/tests/hostile_bytes.rs`).
#![no_main]

#[path = "../bodies/dataset_manifest.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
