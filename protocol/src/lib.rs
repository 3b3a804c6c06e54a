//! The line protocol between a ringleader node and the ranks it runs, and the elastic
//! agreement's pure logic, shared by the node (`node/services/src/jobs/process.rs` parses,
//! `launch` writes), the trainer (`trainer/src/worker.rs` prints, `trainer::elastic` reads
//! and agrees) and, later, the Python package. No candle, no tokio: serde and thiserror only.
//! The public contract, for a script in any language, is `docs/book/src/reference/protocol.md`;
//! this doc is the same spec, next to the code.
//!
//! # Version
//! [`PROTOCOL_VERSION`] (1). The node gives it to every rank as
//! `RINGLEADER_PROTOCOL_VERSION`. Within a version changes are additive only: a new line
//! kind, a new optional `key=value` field (parsers ignore keys they do not know). Removing
//! or renaming a line or field, or changing a field's meaning or unit, is a new version.
//!
//! # Environment ([`mod@env`])
//! The `RINGLEADER_*` variables a node sets for a rank (its job, attempt, generation, a
//! trial's parameters, the ring's secret, …), one constant per name, written by the node and
//! read by the trainer and, through `ringleader._native`, by the Python package.
//!
//! # Rank → node ([`RankLine`])
//! Lines on the rank's **stdout** (stderr is only logged), UTF-8, one per line, at most
//! [`LINE_BYTES_MAX`] bytes, starting with [`PREFIX`] at the first byte. Words are separated
//! by single spaces (any whitespace is accepted). Numbers: integers in decimal, values as
//! any float text Rust and Python read (`0.91`, `1e-3`), finite. Names (metrics):
//! 1..=[`NAME_BYTES_MAX`] bytes without whitespace.
//! - `ringleader-metric NAME VALUE [STEP]`: a job metric (STEP: a count that grows;
//!   training steps for train ranks). For a command trial of a search, a line naming the
//!   search's metric is also a report, STEP counted in epochs (without STEP: the number of
//!   such lines so far).
//! - `ringleader-report RESOURCE NAME VALUE [NAME VALUE …]`: a search trial's values at
//!   RESOURCE epochs done; each pair is also a job metric.
//! - `ringleader-rank-stats generation=G rank=R step=S compute_ms=X wait_ms=Y`: mean compute
//!   and collective wait per step (ms, 3 decimals) since the last such line (straggler
//!   detection).
//! - `ringleader-heartbeat computing_ms=X`: the rank is inside one compute section for X ms
//!   (hang detection).
//! - `ringleader-elastic failed generation=G lost_rank=R|- error="…"`: the rank's collective
//!   failed, losing rank R (`-`: unknown); `error` is last, quoted, `"` and `\` escaped.
//! - `ringleader-elastic resumed [generation=G] [world=N] [rank=R] [step=S] restored_step=C
//!   steps_lost=L [source=memory|broadcast|checkpoint|fresh]`.
//! - `ringleader-ready`: a standby rank (started with `RINGLEADER_STANDBY=1`, ahead of
//!   joining a running ring) is set up and waits for its first generation on stdin.
//!
//! A line starting with [`PREFIX`] that does not parse is logged by the node (warn, with the
//! line, rate-limited) and otherwise ignored; every other line is the rank's own output.
//!
//! # Node → rank ([`NodeLine`])
//! Lines on an elastic train rank's **stdin**, at most [`NODE_LINE_BYTES_MAX`] bytes:
//! - `ringleader-generation {"generation":G,"rank":R,"addrs":["host:port",…],"secret":"…"}`:
//!   join that generation (JSON, unknown keys refused);
//! - `ringleader-stop`: end after the current step (so does the end of stdin).
//!
//! # Golden lines
//! [`GOLDEN_LINES_PATH`] (`protocol/golden/lines.txt`, from the workspace root)
//! holds example lines, each after a tag: `rank-ok`, `rank-bad`, `node-ok`, `node-bad`.
//! An `-ok` line parses and prints back identically; a `-bad` line is refused. This crate's
//! tests, the node's and the Python package's read it.

mod agreement;
pub mod env;
mod error;
mod node_line;
mod rank_line;

pub use agreement::{
    agree_directly, Agree, Holding, Outcome, Progress, Reduce, ReduceOp, AGREE_ROUNDS_MAX,
};
pub use error::{LineError, NodeLineError};
pub use node_line::{Generation, NodeLine, GENERATION_LINE_PREFIX, STOP_LINE};
pub use rank_line::{
    ElasticFailed, ElasticResumed, Metric, RankLine, RankStats, Report, ELASTIC, HEARTBEAT, METRIC,
    RANK_STATS, REPORT,
};

/// The protocol's version (see the crate doc for what changes it).
pub const PROTOCOL_VERSION: u32 = 1;
/// The environment variable that gives a rank [`PROTOCOL_VERSION`] ([`env::PROTOCOL_VERSION`]).
pub use env::PROTOCOL_VERSION as PROTOCOL_VERSION_ENV;
/// What every protocol line starts with.
pub const PREFIX: &str = "ringleader-";
/// Longest rank line, bytes (without the newline).
pub const LINE_BYTES_MAX: usize = 64 * 1024;
/// Longest metric name, bytes.
pub const NAME_BYTES_MAX: usize = 128;
/// Longest node line, bytes (without the newline).
pub const NODE_LINE_BYTES_MAX: usize = 64 << 10;
/// Most ranks a generation may name.
pub const GENERATION_WORLD_MAX: usize = 4096;
/// The golden lines, relative to the workspace root.
pub const GOLDEN_LINES_PATH: &str = "protocol/golden/lines.txt";
/// The golden lines themselves (for tests anywhere).
pub const GOLDEN_LINES: &str = include_str!("../golden/lines.txt");

/// One golden line: its tag and text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Golden<'a> {
    /// `rank-ok`, `rank-bad`, `node-ok` or `node-bad`.
    pub tag: &'a str,
    /// The line.
    pub line: &'a str,
}

/// The golden lines, comments (`#`) and blank lines skipped.
pub fn golden_lines(text: &str) -> impl Iterator<Item = Golden<'_>> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (tag, line) = l.split_once(' ').unwrap_or((l, ""));
            Golden { tag, line }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::SocketAddr;

    #[test]
    fn golden_lines_parse_and_print_back() {
        let mut seen = [0; 4];
        for g in golden_lines(GOLDEN_LINES) {
            match g.tag {
                "rank-ok" => {
                    let parsed: RankLine = g.line.parse().unwrap_or_else(|e| panic!("{g:?}: {e}"));
                    assert_eq!(parsed.to_string(), g.line);
                    seen[0] += 1;
                }
                "rank-bad" => {
                    assert!(g.line.parse::<RankLine>().is_err(), "{g:?} parsed");
                    seen[1] += 1;
                }
                "node-ok" => {
                    let parsed: NodeLine = g.line.parse().unwrap_or_else(|e| panic!("{g:?}: {e}"));
                    assert_eq!(parsed.to_string(), g.line);
                    seen[2] += 1;
                }
                "node-bad" => {
                    assert!(g.line.parse::<NodeLine>().is_err(), "{g:?} parsed");
                    seen[3] += 1;
                }
                other => panic!("unknown tag {other:?}"),
            }
        }
        assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
    }

    fn name() -> impl Strategy<Value = String> {
        "[a-z_][a-z0-9_./-]{0,30}"
    }

    fn value() -> impl Strategy<Value = f64> {
        any::<f64>().prop_filter("finite", |v| v.is_finite())
    }

    fn ms() -> impl Strategy<Value = f64> {
        (0u64..10_000_000).prop_map(|m| m as f64 / 1000.0)
    }

    fn rank_line() -> impl Strategy<Value = RankLine> {
        prop_oneof![
            (name(), value(), proptest::option::of(any::<u64>()))
                .prop_map(|(name, value, step)| RankLine::Metric(Metric { name, value, step })),
            (
                any::<u32>(),
                proptest::collection::vec((name(), value()), 1..5)
            )
                .prop_map(|(resource, values)| RankLine::Report(Report { resource, values })),
            (any::<u32>(), any::<u32>(), any::<u64>(), ms(), ms()).prop_map(
                |(generation, rank, step, compute_ms, wait_ms)| RankLine::RankStats(RankStats {
                    generation,
                    rank,
                    step,
                    compute_ms,
                    wait_ms
                })
            ),
            any::<u64>().prop_map(|computing_ms| RankLine::Heartbeat { computing_ms }),
            (
                any::<u32>(),
                proptest::option::of(any::<u32>()),
                "[^\n\r]{0,60}"
            )
                .prop_map(|(generation, lost_rank, error)| RankLine::ElasticFailed(
                    ElasticFailed {
                        generation,
                        lost_rank,
                        error
                    }
                )),
            (
                proptest::option::of(any::<u32>()),
                proptest::option::of(any::<u32>()),
                proptest::option::of(any::<u32>()),
                proptest::option::of(any::<u64>()),
                any::<u64>(),
                any::<u64>(),
                proptest::option::of("memory|broadcast|checkpoint|fresh"),
            )
                .prop_map(
                    |(generation, world, rank, step, restored_step, steps_lost, source)| {
                        RankLine::ElasticResumed(ElasticResumed {
                            generation,
                            world,
                            rank,
                            step,
                            restored_step,
                            steps_lost,
                            source,
                        })
                    }
                ),
        ]
    }

    proptest! {
        #[test]
        fn rank_lines_round_trip(line in rank_line()) {
            let text = line.to_string();
            prop_assert!(!text.contains('\n'));
            prop_assert!(text.starts_with(PREFIX));
            prop_assert_eq!(text.parse::<RankLine>(), Ok(line));
        }

        #[test]
        fn node_lines_round_trip(
            generation in any::<u64>(),
            ports in proptest::collection::vec(1u16.., 1..8),
            pick in any::<usize>(),
            secret in ".*",
            stop in any::<bool>(),
        ) {
            let line = if stop {
                NodeLine::Stop
            } else {
                NodeLine::Generation(Generation {
                    generation,
                    rank: pick % ports.len(),
                    addrs: ports.iter().map(|&p| SocketAddr::from(([10, 0, 0, 1], p))).collect(),
                    secret,
                    batch_workers: None,
                })
            };
            let text = line.to_string();
            prop_assert!(!text.contains('\n'));
            prop_assert_eq!(text.parse::<NodeLine>(), Ok(line));
        }

        #[test]
        fn arbitrary_text_never_panics(text in ".{0,200}") {
            let _ = text.parse::<RankLine>();
            let _ = format!("ringleader-{text}").parse::<RankLine>();
            let _ = text.parse::<NodeLine>();
        }
    }
}
