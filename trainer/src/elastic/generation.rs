//! Generations from the node: the [`Generation`] a worker is told to join, the
//! [`GenerationSource`] trait it waits on, an in-memory [`GenerationChannel`], and the
//! control-line format the worker reads on stdin.
//!
//! Control lines ([`ringleader_protocol::NodeLine`], see `docs/book/src/reference/protocol.md`),
//! one per line (UTF-8, at most [`GENERATION_LINE_BYTES_MAX`] bytes):
//! - `ringleader-generation
//! {"generation":1,"rank":0,"addrs":["127.0.0.1:20001","127.0.0.1:20002"],"secret":"<hex>"}`:
//!   join that generation (newer ones supersede older ones not yet joined);
//! - `ringleader-stop`: end after the current step (so does the end of input).

use std::future::Future;
use std::io::BufRead;

use tokio::sync::mpsc;
use tracing::warn;

use crate::elastic::error::ElasticError;

/// The node's control lines are defined once, in the protocol crate; the names the trainer
/// has always used stay.
pub use ringleader_protocol::{
    Generation, NodeLine as Control, NodeLineError as ControlLineError, GENERATION_LINE_PREFIX,
    GENERATION_WORLD_MAX, NODE_LINE_BYTES_MAX as GENERATION_LINE_BYTES_MAX, STOP_LINE,
};

/// Control messages queued between the reader and the training loop.
pub const CONTROL_QUEUE_DEPTH: usize = 16;

/// Parses one control line (surrounding whitespace ignored): [`Control`]'s `FromStr`.
pub fn parse_control_line(line: &str) -> Result<Control, ControlLineError> {
    line.parse()
}

/// Reads one line of at most `max` bytes (newline excluded). `Ok(None)` at the end of input;
/// a longer line is consumed to its newline and refused without being kept in memory.
pub fn read_bounded_line(
    reader: &mut impl BufRead,
    max: usize,
) -> std::io::Result<Option<Result<String, ControlLineError>>> {
    let mut line = Vec::new();
    let mut len = 0usize;
    let mut any = false;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            if !any {
                return Ok(None);
            }
            break;
        }
        any = true;
        let (end, used) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, i + 1),
            None => (buf.len(), buf.len()),
        };
        len += end;
        // Past the limit nothing more is kept: the rest is only counted and skipped.
        if len <= max {
            line.extend_from_slice(&buf[..end]);
        }
        let newline = end < used;
        reader.consume(used);
        if newline {
            break;
        }
    }
    if len > max {
        return Ok(Some(Err(ControlLineError::TooLong { bytes: len, max })));
    }
    Ok(Some(
        String::from_utf8(line).map_err(|_| ControlLineError::NotUtf8),
    ))
}

/// Reads control lines from `reader` until the end of input or a stop line, sending each
/// into `tx`; unusable lines are logged and skipped. Blocking: run it on its own thread
/// (a blocking read of stdin cannot be cancelled, so it must not hold up a runtime).
pub fn forward_control_lines(mut reader: impl BufRead, tx: mpsc::Sender<Control>) {
    loop {
        let line = match read_bounded_line(&mut reader, GENERATION_LINE_BYTES_MAX) {
            Ok(Some(l)) => l,
            Ok(None) => break,
            Err(e) => {
                warn!(error = %e, "reading control lines failed: treated as the end");
                break;
            }
        };
        let control = match line.and_then(|l| parse_control_line(&l)) {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "control line refused");
                continue;
            }
        };
        let stop = control == Control::Stop;
        if tx.blocking_send(control).is_err() || stop {
            break;
        }
    }
    let _ = tx.blocking_send(Control::Stop);
}

/// Where a worker learns the generations it is to join (from the node: stdin lines, or a
/// channel in tests).
pub trait GenerationSource: Send {
    /// Waits for the next generation newer than `after_generation`; `None`: the job is over
    /// for this rank (stop, or the source closed).
    fn next(
        &mut self,
        after_generation: u64,
    ) -> impl Future<Output = Result<Option<Generation>, ElasticError>> + Send;

    /// A control message already waiting, without waiting: the newest generation newer
    /// than `after_generation` (older ones are dropped), or a stop, which wins.
    fn pending(&mut self, after_generation: u64) -> Option<Control>;

    /// Waits until [`GenerationSource::pending`]`(after_generation)` would return something
    /// (a generation newer than `after_generation`, or a stop), without taking it: the
    /// message stays in the source for `pending` or `next`. Never resolves while nothing
    /// newer arrives. Cancel-safe: dropping the future loses nothing. The elastic loop
    /// runs it next to a training step, to abort the step's collective when the node has
    /// moved on ([`crate::elastic::ElasticRun`]).
    fn arrived(&mut self, after_generation: u64) -> impl Future<Output = ()> + Send;
}

/// A [`GenerationSource`] fed through a bounded channel (by [`forward_control_lines`] or by
/// a test acting as the node). A closed channel means stop.
#[derive(Debug)]
pub struct GenerationChannel {
    rx: mpsc::Receiver<Control>,
    stopped: bool,
    /// A generation taken off the channel by [`GenerationSource::arrived`], not yet handed
    /// out (the first one received newer than the generation asked about).
    held: Option<Generation>,
}

/// A channel of [`CONTROL_QUEUE_DEPTH`] control messages and its receiving source.
pub fn generation_channel() -> (mpsc::Sender<Control>, GenerationChannel) {
    let (tx, rx) = mpsc::channel(CONTROL_QUEUE_DEPTH);
    (
        tx,
        GenerationChannel {
            rx,
            stopped: false,
            held: None,
        },
    )
}

impl GenerationSource for GenerationChannel {
    async fn next(&mut self, after_generation: u64) -> Result<Option<Generation>, ElasticError> {
        if let Some(g) = self.take_held(after_generation) {
            return Ok(Some(g));
        }
        while !self.stopped {
            match self.rx.recv().await {
                Some(Control::Generation(g)) if g.generation > after_generation => {
                    return Ok(Some(g))
                }
                Some(Control::Generation(g)) => {
                    warn!(
                        generation = g.generation,
                        after_generation, "stale generation ignored"
                    );
                }
                Some(Control::Stop) | None => self.stopped = true,
            }
        }
        Ok(None)
    }

    fn pending(&mut self, after_generation: u64) -> Option<Control> {
        if self.stopped {
            return Some(Control::Stop);
        }
        let mut newest = self.take_held(after_generation);
        loop {
            match self.rx.try_recv() {
                Ok(Control::Generation(g)) => {
                    if g.generation > after_generation
                        && newest.as_ref().is_none_or(|n| g.generation > n.generation)
                    {
                        newest = Some(g);
                    }
                }
                Ok(Control::Stop) | Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.stopped = true;
                    return Some(Control::Stop);
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
            }
        }
        newest.map(Control::Generation)
    }

    async fn arrived(&mut self, after_generation: u64) {
        if self
            .held
            .as_ref()
            .is_some_and(|g| g.generation > after_generation)
        {
            return;
        }
        while !self.stopped {
            // `recv` is cancel-safe, and what it returns is kept before the next await.
            match self.rx.recv().await {
                Some(Control::Generation(g)) if g.generation > after_generation => {
                    self.held = Some(g);
                    return;
                }
                Some(Control::Generation(g)) => {
                    warn!(
                        generation = g.generation,
                        after_generation, "stale generation ignored"
                    );
                }
                Some(Control::Stop) | None => self.stopped = true,
            }
        }
    }
}

impl GenerationChannel {
    /// The held generation, when it is newer than `after_generation` (an older one is
    /// dropped).
    fn take_held(&mut self, after_generation: u64) -> Option<Generation> {
        self.held.take().filter(|g| g.generation > after_generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::SocketAddr;
    use std::time::Duration;

    proptest! {
        #[test]
        fn generation_lines_round_trip(
            generation in any::<u64>(),
            ports in proptest::collection::vec(1u16.., 1..8),
            pick in any::<usize>(),
            secret in ".*",
        ) {
            let g = Generation {
                generation,
                rank: pick % ports.len(),
                addrs: ports.iter().map(|&p| SocketAddr::from(([10, 0, 0, 1], p))).collect(),
                secret,
                batch_workers: None,
            };
            let line = g.to_line();
            prop_assert!(!line.contains('\n'));
            prop_assert_eq!(parse_control_line(&line), Ok(Control::Generation(g)));
        }

        #[test]
        fn bounded_lines_match_a_plain_split(
            lines in proptest::collection::vec("[a-z]{0,20}", 0..6),
            max in 0usize..24,
            capacity in 1usize..8,
        ) {
            let text = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
            let mut r = std::io::BufReader::with_capacity(capacity, text.as_bytes());
            let mut got = Vec::new();
            while let Some(l) = read_bounded_line(&mut r, max).unwrap() {
                got.push(l);
            }
            let want: Vec<_> = lines
                .iter()
                .map(|l| if l.len() <= max {
                    Ok(l.clone())
                } else {
                    Err(ControlLineError::TooLong { bytes: l.len(), max })
                })
                .collect();
            prop_assert_eq!(got, want);
        }
    }

    fn gen(generation: u64) -> Generation {
        Generation {
            generation,
            rank: 0,
            addrs: vec![SocketAddr::from(([127, 0, 0, 1], 1))],
            secret: String::new(),
            batch_workers: None,
        }
    }

    /// `arrived` waits for something `pending` would return, and leaves it there: stale
    /// generations do not wake it, the held one is coalesced with newer ones by `pending`
    /// and handed out first by `next`, and a stop wakes it and wins.
    #[tokio::test]
    async fn arrived_waits_for_a_newer_control_and_keeps_it() {
        let (tx, mut src) = generation_channel();
        tx.send(Control::Generation(gen(3))).await.unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(20), src.arrived(3)).await;
        assert!(waited.is_err(), "a stale generation woke it");
        tx.send(Control::Generation(gen(4))).await.unwrap();
        src.arrived(3).await;
        src.arrived(3).await;
        tx.send(Control::Generation(gen(5))).await.unwrap();
        assert_eq!(src.pending(3), Some(Control::Generation(gen(5))));
        assert_eq!(src.pending(3), None);

        tx.send(Control::Generation(gen(6))).await.unwrap();
        src.arrived(5).await;
        tx.send(Control::Generation(gen(7))).await.unwrap();
        assert_eq!(src.next(5).await.unwrap(), Some(gen(6)));
        assert_eq!(src.next(6).await.unwrap(), Some(gen(7)));

        tx.send(Control::Generation(gen(8))).await.unwrap();
        src.arrived(7).await;
        tx.send(Control::Stop).await.unwrap();
        assert_eq!(src.pending(7), Some(Control::Stop));
        src.arrived(100).await;
        assert_eq!(src.next(100).await.unwrap(), None);
    }

    #[test]
    fn bounded_lines_refuse_long_ones_and_keep_going() {
        let long = "x".repeat(30);
        let text = format!("short\n{long}\nlast");
        let mut r = std::io::BufReader::with_capacity(4, text.as_bytes());
        let mut got = Vec::new();
        while let Some(l) = read_bounded_line(&mut r, 10).unwrap() {
            got.push(l);
        }
        assert_eq!(
            got,
            vec![
                Ok("short".to_string()),
                Err(ControlLineError::TooLong { bytes: 30, max: 10 }),
                Ok("last".to_string()),
            ]
        );
    }
}
