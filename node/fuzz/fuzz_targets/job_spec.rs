//! Job specs as submitted (TOML text); invalid UTF-8 is turned lossy so every input counts.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ringleader::jobs::admit_text(&String::from_utf8_lossy(data));
});
