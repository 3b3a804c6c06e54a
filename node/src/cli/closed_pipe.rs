//! A command whose reader goes away ends quietly: `ringleader logs ID | head`, `jobs | head`,
//! `logs -f | grep -m1 …`.
//!
//! Rust ignores `SIGPIPE`, so a write to a closed pipe fails with `EPIPE`, and `println!`
//! turns that failure into a panic with a backtrace hint. Every command but `node` prints
//! with `println!`, so this is handled once, here: [`end_quietly`] installs a panic hook that
//! ends the process with status 0 when the panic is a failed print to stdout on a closed pipe
//! (the reader has what it wanted), and leaves every other panic to the hook before it; and
//! [`is_closed_pipe`] tells `main` that an error is one, for commands that write with
//! `write!` and return the error.

/// What `std` says when `print!`/`println!` fails, before the I/O error.
const PRINT_FAILED: &str = "failed printing to stdout";

/// Installs the panic hook (see the module doc). Call once, before any output.
pub fn end_quietly() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if is_closed_pipe_message(message) {
            std::process::exit(0);
        }
        previous(info);
    }));
}

/// Whether a panic message is a failed print to stdout on a closed pipe.
fn is_closed_pipe_message(message: &str) -> bool {
    message.starts_with(PRINT_FAILED) && message.contains(&broken_pipe_text())
}

/// How `std` writes the `EPIPE` error (`Broken pipe (os error 32)`).
fn broken_pipe_text() -> String {
    std::io::Error::from_raw_os_error(libc::EPIPE).to_string()
}

/// Whether `e` (or an error it wraps) is a write to a closed pipe.
pub fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_print_on_a_closed_pipe_is_quiet() {
        assert!(is_closed_pipe_message(
            "failed printing to stdout: Broken pipe (os error 32)"
        ));
        assert!(!is_closed_pipe_message(
            "failed printing to stdout: No space left on device (os error 28)"
        ));
        assert!(!is_closed_pipe_message("index out of bounds"));
        let pipe = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("printing");
        assert!(is_closed_pipe(&pipe));
        assert!(!is_closed_pipe(&anyhow::anyhow!("no chief")));
    }
}
