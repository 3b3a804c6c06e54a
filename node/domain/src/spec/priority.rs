//! A job's priority: the spec key `priority`, a named class or an integer.
//!
//! `"low"` = `LOW`, `"normal"` = `NORMAL` (the default), `"high"` = `HIGH`, or an
//! integer `0..=PRIORITY_MAX`. Stored as the integer. The scheduler
//! (`chief::scheduler`) orders waiting jobs by it (raised by their wait, see there); an
//! admin may set a ceiling per user (`ringleader quota set USER --max-priority P`), above
//! which a submit is refused naming the field `priority`.

/// The class `low`.
pub const LOW: u32 = 100;
/// The class `normal`: a spec without `priority`.
pub const NORMAL: u32 = 500;
/// The class `high`.
pub const HIGH: u32 = 900;
/// The largest priority.
pub const PRIORITY_MAX: u32 = 1000;

/// The default priority (serde's, for specs in logs written before the key existed).
pub fn default_priority() -> u32 {
    NORMAL
}

/// Whether `p` is the default (left out of the stored spec, so old bytes stay).
pub fn is_default_priority(p: &u32) -> bool {
    *p == NORMAL
}

/// A class name or an integer in range, as the spec or a flag gives it.
pub fn parse(text: &str) -> Result<u32, String> {
    match text.trim() {
        "low" => Ok(LOW),
        "normal" => Ok(NORMAL),
        "high" => Ok(HIGH),
        t => match t.parse::<u32>() {
            Ok(n) if n <= PRIORITY_MAX => Ok(n),
            _ => Err(format!(
                "expected \"low\", \"normal\", \"high\" or an integer 0 to {PRIORITY_MAX}, got {t:?}"
            )),
        },
    }
}

/// How humans read `p`: its class's name when it is one, else the number.
pub fn label(p: u32) -> String {
    match p {
        LOW => "low".into(),
        NORMAL => "normal".into(),
        HIGH => "high".into(),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_integers_parse_and_others_are_named() {
        assert_eq!(parse("low"), Ok(100));
        assert_eq!(parse("normal"), Ok(500));
        assert_eq!(parse("high"), Ok(900));
        assert_eq!(parse("0"), Ok(0));
        assert_eq!(parse("1000"), Ok(1000));
        assert!(parse("1001").unwrap_err().contains("0 to 1000"));
        assert!(parse("urgent").unwrap_err().contains("\"urgent\""));
        assert_eq!(label(900), "high");
        assert_eq!(label(42), "42");
    }
}
