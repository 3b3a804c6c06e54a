//! The last lines of a rank's stderr, kept while it runs so that its exit can say why it
//! failed (`domain::state::failure`): at most the lines and bytes the domain keeps, each
//! line redacted as logs are ([`redact_line`]) before it leaves the node.
//!
//! May use: the domain's failure bounds and the trainer's redaction rules.

use std::collections::VecDeque;

use crate::domain::state::failure::{bounded_tail, STDERR_TAIL_BYTES_MAX, STDERR_TAIL_LINES_MAX};
use trainer::redact::{is_secret_key, redact_url, REDACTED};

/// Length of the hex secrets the node hands ranks (a ring secret): a word of exactly this
/// many hex digits is hidden.
const HEX_SECRET_LEN: usize = crate::domain::state::RING_SECRET_HEX_LEN;

/// A rank's latest stderr lines, newest last.
#[derive(Debug, Default)]
pub(crate) struct StderrTail {
    lines: VecDeque<String>,
}

impl StderrTail {
    /// Takes one stderr line: blank lines and the node's own notes (`ringleader: …`, a log
    /// cap's count) are skipped; the line is redacted and cut to the byte bound.
    pub(crate) fn push(&mut self, line: &str) {
        let line = line.trim_end();
        if line.trim().is_empty() || line.starts_with("ringleader: ") {
            return;
        }
        let mut kept = redact_line(line);
        crate::domain::state::truncate_at_char(&mut kept, STDERR_TAIL_BYTES_MAX);
        self.lines.push_back(kept);
        if self.lines.len() > STDERR_TAIL_LINES_MAX {
            self.lines.pop_front();
        }
    }

    /// The lines kept, within the domain's bounds.
    pub(crate) fn take(&mut self) -> Vec<String> {
        bounded_tail(std::mem::take(&mut self.lines).into())
    }
}

/// `line` as a log may show it: control characters dropped, URLs with their credentials
/// hidden (`trainer::redact::redact_url`), the value of a `NAME=VALUE` word whose name
/// looks secret (`…KEY…`, `…SECRET…`, `…TOKEN…`, `…PASSWORD…`) and a word of
/// [`HEX_SECRET_LEN`] hex digits replaced by `REDACTED`.
pub(crate) fn redact_line(line: &str) -> String {
    let clean: String = line
        .chars()
        .filter(|c| !c.is_control() || *c == '\t')
        .collect();
    clean
        .split(' ')
        .map(|word| {
            if word.contains("://") {
                return redact_url(word);
            }
            if let Some((name, _)) = word.split_once('=') {
                if is_secret_key(name) {
                    return format!("{name}={REDACTED}");
                }
            }
            let bare = word.trim_matches(|c: char| !c.is_ascii_alphanumeric());
            if bare.len() == HEX_SECRET_LEN && bare.chars().all(|c| c.is_ascii_hexdigit()) {
                return word.replace(bare, REDACTED);
            }
            word.to_owned()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_a_line_are_hidden_as_logs_hide_them() {
        assert_eq!(
            redact_line("saving to s3://b/c?secret_access_key=abc failed"),
            "saving to s3://b/c?secret_access_key=REDACTED failed"
        );
        assert_eq!(
            redact_line("env AWS_SECRET_ACCESS_KEY=xyz API_TOKEN=t PATH=/bin"),
            "env AWS_SECRET_ACCESS_KEY=REDACTED API_TOKEN=REDACTED PATH=/bin"
        );
        let secret = "ab".repeat(32);
        assert_eq!(
            redact_line(&format!("ring secret '{secret}' refused")),
            "ring secret 'REDACTED' refused"
        );
        assert_eq!(
            redact_line("\x1b[31merror\x1b[0m: boom"),
            "[31merror[0m: boom"
        );
        assert_eq!(
            redact_line("ModuleNotFoundError: No module named 'foo'"),
            "ModuleNotFoundError: No module named 'foo'"
        );
    }

    #[test]
    fn the_tail_keeps_the_newest_lines_within_the_domains_bounds() {
        let mut tail = StderrTail::default();
        for i in 0..20 {
            tail.push(&format!("line {i}"));
            tail.push("   ");
        }
        tail.push("ringleader: log rate cap (10 bytes/s): dropped 5 bytes in 1 lines");
        tail.push(&"x".repeat(1_000));
        let lines = tail.take();
        assert_eq!(lines.len(), STDERR_TAIL_LINES_MAX);
        assert_eq!(lines[0], "line 16");
        assert!(lines.iter().map(String::len).sum::<usize>() <= STDERR_TAIL_BYTES_MAX);
        assert!(tail.take().is_empty(), "taken");
    }
}
