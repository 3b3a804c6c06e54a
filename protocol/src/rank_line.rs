//! Rank → node: the lines a rank prints on its stdout for its node ([`RankLine`]).
//!
//! The grammar of each line is in the crate doc; `Display` writes the canonical form and
//! `FromStr` reads it (and the tolerated variations listed there).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::error::LineError;
use crate::{LINE_BYTES_MAX, NAME_BYTES_MAX};

/// `ringleader-metric NAME VALUE [STEP]`.
pub const METRIC: &str = "ringleader-metric";
/// `ringleader-report RESOURCE NAME VALUE [NAME VALUE …]`.
pub const REPORT: &str = "ringleader-report";
/// `ringleader-rank-stats generation=G rank=R step=S compute_ms=X wait_ms=Y`.
pub const RANK_STATS: &str = "ringleader-rank-stats";
/// `ringleader-heartbeat computing_ms=X`.
pub const HEARTBEAT: &str = "ringleader-heartbeat";
/// `ringleader-elastic failed …` and `ringleader-elastic resumed …`.
pub const ELASTIC: &str = "ringleader-elastic";
/// `ringleader-ready`: a standby rank is set up and waits for its first generation.
pub const READY: &str = "ringleader-ready";

/// One line a rank prints for its node.
#[derive(Debug, Clone, PartialEq)]
pub enum RankLine {
    /// A job metric (and, for a command trial of a search, a report of the search's metric).
    Metric(Metric),
    /// A search trial's report at a resource (epochs done): one or more named values.
    Report(Report),
    /// An elastic train rank's mean compute and wait time per step since its last one.
    RankStats(RankStats),
    /// The rank's training thread has been inside one compute section for `computing_ms`.
    Heartbeat {
        /// Milliseconds inside the current compute section.
        computing_ms: u64,
    },
    /// The rank's collective failed in `generation`, naming the rank it lost if it knows.
    ElasticFailed(ElasticFailed),
    /// The rank resumed in a new generation.
    ElasticResumed(ElasticResumed),
    /// A standby rank (started ahead of joining, `RINGLEADER_STANDBY=1`) is set up (its
    /// framework imported, its model built) and waits for its first generation: the chief
    /// may now re-form the ring with it, and the survivors wait only for its connect.
    Ready,
}

/// `ringleader-metric NAME VALUE [STEP]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// 1..=[`NAME_BYTES_MAX`] bytes, no whitespace.
    pub name: String,
    /// Finite.
    pub value: f64,
    /// Any count that grows (training steps; epochs for a search's metric).
    pub step: Option<u64>,
}

/// `ringleader-report RESOURCE NAME VALUE [NAME VALUE …]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Epochs done (the search's resource unit).
    pub resource: u32,
    /// At least one (name, finite value), in the order printed.
    pub values: Vec<(String, f64)>,
}

impl Report {
    /// The value of `name` in this report, if it has one.
    pub fn value_of(&self, name: &str) -> Option<f64> {
        self.values.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}

/// `ringleader-rank-stats generation=G rank=R step=S compute_ms=X wait_ms=Y`.
#[derive(Debug, Clone, PartialEq)]
pub struct RankStats {
    /// The ring generation.
    pub generation: u32,
    /// The rank in it.
    pub rank: u32,
    /// Steps done.
    pub step: u64,
    /// Mean compute time per step, ms (finite, ≥ 0; printed with 3 decimals).
    pub compute_ms: f64,
    /// Mean wait for the collective per step, ms (finite, ≥ 0; printed with 3 decimals).
    pub wait_ms: f64,
}

/// `ringleader-elastic failed generation=G lost_rank=R|- error="…"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElasticFailed {
    /// The generation whose collective failed.
    pub generation: u32,
    /// The rank it lost (`-`: unknown).
    pub lost_rank: Option<u32>,
    /// The error, one line (newlines become spaces when printed).
    pub error: String,
}

/// `ringleader-elastic resumed generation=G world=N rank=R step=S restored_step=C
/// steps_lost=L source=…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElasticResumed {
    /// The generation it resumed in.
    pub generation: Option<u32>,
    /// Ranks in it.
    pub world: Option<u32>,
    /// Its rank in it.
    pub rank: Option<u32>,
    /// The step it goes on from.
    pub step: Option<u64>,
    /// The step of the state it restored.
    pub restored_step: u64,
    /// Steps the group had reached past the restored one.
    pub steps_lost: u64,
    /// Where its state came from (`memory`, `broadcast`, `checkpoint`, `fresh`).
    pub source: Option<String>,
}

impl RankLine {
    /// Whether `line` claims to be a protocol line (starts with `ringleader-` followed by
    /// a kind): such a line that does not parse is an error worth logging, any other line
    /// is the rank's own output.
    pub fn is_protocol(line: &str) -> bool {
        line.starts_with(crate::PREFIX)
    }
}

fn check_name(name: &str) -> Result<(), LineError> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX || name.contains(char::is_whitespace) {
        return Err(LineError::Name(name.chars().take(40).collect()));
    }
    Ok(())
}

fn finite(field: &'static str, text: &str) -> Result<f64, LineError> {
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| LineError::Field {
            field,
            text: text.chars().take(40).collect(),
        })
}

fn int<T: FromStr>(field: &'static str, text: &str) -> Result<T, LineError> {
    text.parse::<T>().map_err(|_| LineError::Field {
        field,
        text: text.chars().take(40).collect(),
    })
}

/// `key=value` fields, whitespace-separated; a quoted `error="…"` runs to the end of the
/// line. Unknown keys are kept (and ignored by the callers): fields may be added.
struct Fields<'a> {
    kv: BTreeMap<&'a str, &'a str>,
    error: Option<String>,
}

impl<'a> Fields<'a> {
    fn parse(rest: &'a str) -> Fields<'a> {
        let (fields, error) = match rest
            .strip_prefix("error=")
            .map(|e| ("", e))
            .or_else(|| rest.split_once(" error="))
        {
            Some((f, e)) => (f, Some(unquote(e))),
            None => (rest, None),
        };
        let kv = fields
            .split_whitespace()
            .filter_map(|p| p.split_once('='))
            .collect();
        Fields { kv, error }
    }

    fn get(&self, field: &'static str) -> Result<&'a str, LineError> {
        self.kv.get(field).copied().ok_or(LineError::Missing(field))
    }

    fn int<T: FromStr>(&self, field: &'static str) -> Result<T, LineError> {
        int(field, self.get(field)?)
    }

    fn opt_int<T: FromStr>(&self, field: &'static str) -> Result<Option<T>, LineError> {
        self.kv.get(field).map(|v| int(field, v)).transpose()
    }

    fn ms(&self, field: &'static str) -> Result<f64, LineError> {
        let v = finite(field, self.get(field)?)?;
        if v < 0.0 {
            return Err(LineError::Field {
                field,
                text: v.to_string(),
            });
        }
        Ok(v)
    }
}

/// `"…"` with `\"` and `\\` escapes, as [`quote`] writes it.
fn unquote(field: &str) -> String {
    let inner = field.strip_prefix('"').unwrap_or(field);
    let inner = inner.strip_suffix('"').unwrap_or(inner);
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            out.extend(chars.next());
        } else {
            out.push(c);
        }
    }
    out
}

/// The text quoted for `error="…"`: `"` and `\` escaped, line breaks as spaces.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl fmt::Display for RankLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RankLine::Metric(m) => {
                write!(f, "{METRIC} {} {}", m.name, m.value)?;
                match m.step {
                    Some(s) => write!(f, " {s}"),
                    None => Ok(()),
                }
            }
            RankLine::Report(r) => {
                write!(f, "{REPORT} {}", r.resource)?;
                for (name, value) in &r.values {
                    write!(f, " {name} {value}")?;
                }
                Ok(())
            }
            RankLine::RankStats(s) => write!(
                f,
                "{RANK_STATS} generation={} rank={} step={} compute_ms={:.3} wait_ms={:.3}",
                s.generation, s.rank, s.step, s.compute_ms, s.wait_ms
            ),
            RankLine::Heartbeat { computing_ms } => {
                write!(f, "{HEARTBEAT} computing_ms={computing_ms}")
            }
            RankLine::Ready => f.write_str(READY),
            RankLine::ElasticFailed(e) => {
                write!(f, "{ELASTIC} failed generation={} lost_rank=", e.generation)?;
                match e.lost_rank {
                    Some(r) => write!(f, "{r}")?,
                    None => f.write_str("-")?,
                }
                write!(f, " error={}", quote(&e.error))
            }
            RankLine::ElasticResumed(r) => {
                write!(f, "{ELASTIC} resumed")?;
                if let Some(g) = r.generation {
                    write!(f, " generation={g}")?;
                }
                if let Some(w) = r.world {
                    write!(f, " world={w}")?;
                }
                if let Some(k) = r.rank {
                    write!(f, " rank={k}")?;
                }
                if let Some(s) = r.step {
                    write!(f, " step={s}")?;
                }
                write!(
                    f,
                    " restored_step={} steps_lost={}",
                    r.restored_step, r.steps_lost
                )?;
                if let Some(s) = &r.source {
                    write!(f, " source={s}")?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for RankLine {
    type Err = LineError;

    /// Parses one line (without its newline; surrounding whitespace is ignored).
    fn from_str(line: &str) -> Result<RankLine, LineError> {
        if line.len() > LINE_BYTES_MAX {
            return Err(LineError::TooLong {
                bytes: line.len(),
                max: LINE_BYTES_MAX,
            });
        }
        let line = line.trim();
        let (kind, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let rest = rest.trim_start();
        match kind {
            METRIC => {
                let parts: Vec<&str> = rest.split_whitespace().collect();
                let (name, value, step) = match parts.as_slice() {
                    [n, v] => (*n, *v, None),
                    [n, v, s] => (*n, *v, Some(int("step", s)?)),
                    _ => return Err(LineError::Shape("NAME VALUE [STEP]")),
                };
                check_name(name)?;
                Ok(RankLine::Metric(Metric {
                    name: name.to_string(),
                    value: finite("value", value)?,
                    step,
                }))
            }
            REPORT => {
                let mut parts = rest.split_whitespace();
                let resource = int("resource", parts.next().unwrap_or(""))?;
                let rest: Vec<&str> = parts.collect();
                if rest.is_empty() || !rest.len().is_multiple_of(2) {
                    return Err(LineError::Shape("RESOURCE NAME VALUE [NAME VALUE …]"));
                }
                let mut values = Vec::with_capacity(rest.len() / 2);
                for kv in rest.chunks_exact(2) {
                    check_name(kv[0])?;
                    values.push((kv[0].to_string(), finite("value", kv[1])?));
                }
                Ok(RankLine::Report(Report { resource, values }))
            }
            RANK_STATS => {
                let f = Fields::parse(rest);
                Ok(RankLine::RankStats(RankStats {
                    generation: f.int("generation")?,
                    rank: f.int("rank")?,
                    step: f.int("step")?,
                    compute_ms: f.ms("compute_ms")?,
                    wait_ms: f.ms("wait_ms")?,
                }))
            }
            READY if rest.is_empty() => Ok(RankLine::Ready),
            READY => Err(LineError::Shape("ringleader-ready (nothing after it)")),
            HEARTBEAT => {
                let f = Fields::parse(rest);
                Ok(RankLine::Heartbeat {
                    computing_ms: f.int("computing_ms")?,
                })
            }
            ELASTIC => {
                let (what, rest) = rest.split_once(' ').unwrap_or((rest, ""));
                let f = Fields::parse(rest);
                match what {
                    "failed" => Ok(RankLine::ElasticFailed(ElasticFailed {
                        generation: f.int("generation")?,
                        lost_rank: match f.get("lost_rank")? {
                            "-" => None,
                            r => Some(int("lost_rank", r)?),
                        },
                        error: f.error.clone().unwrap_or_default(),
                    })),
                    "resumed" => Ok(RankLine::ElasticResumed(ElasticResumed {
                        generation: f.opt_int("generation")?,
                        world: f.opt_int("world")?,
                        rank: f.opt_int("rank")?,
                        step: f.opt_int("step")?,
                        restored_step: f.int("restored_step")?,
                        steps_lost: f.int("steps_lost")?,
                        source: f.kv.get("source").map(|s| s.to_string()),
                    })),
                    other => Err(LineError::Kind(format!(
                        "{ELASTIC} {}",
                        other.chars().take(40).collect::<String>()
                    ))),
                }
            }
            other => Err(LineError::Kind(other.chars().take(40).collect())),
        }
    }
}
