//! Dataset manifests as a peer or a store hands them over.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringleader::datasets::Manifest;

fuzz_target!(|data: &[u8]| {
    let _ = Manifest::decode(data);
});
