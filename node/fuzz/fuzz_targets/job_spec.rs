//! `cargo fuzz` target `job_spec`; its body, `../bodies/job_spec.rs`, also runs in CI as a proptest
//! (`*/tests/hostile_bytes.rs`).
#![no_main]

#[path = "../bodies/job_spec.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
