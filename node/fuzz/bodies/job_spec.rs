//! Job specs as submitted (TOML text); invalid UTF-8 is turned lossy so every input counts.

pub fn run(data: &[u8]) {
    let _ = ringleader::jobs::admit_text(&String::from_utf8_lossy(data));
}
