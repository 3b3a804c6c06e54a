//! The status document: what `GET /v1/status` returns and `ringleader status` prints.
//!
//! The field names are the user-facing contract in DESIGN.md; fields may be added, never
//! renamed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::meta::Gpu;

/// A node named by peer id and human name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeRef {
    pub id: String,
    pub name: String,
}

/// One member as this node sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemberDoc {
    pub id: String,
    pub name: String,
    /// alive | suspect | dead | left
    pub state: String,
    pub voter: bool,
    pub blacklisted: bool,
    pub incarnation: u64,
    pub cpus: u32,
    pub memory_mb: u64,
    pub gpus: Vec<Gpu>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub p2p_addrs: Vec<String>,
    pub api_addr: String,
    pub data_addr: String,
    pub version: String,
    /// True for the node that answered.
    #[serde(rename = "self")]
    pub is_self: bool,
}

/// A job in the summary list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSummary {
    pub id: String,
    pub name: String,
    pub kind: String,
    pub state: String,
}

/// Counters of the node's networking, for operators and tests.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    pub messages_in: u64,
    pub messages_out: u64,
    /// Membership messages dropped as garbled, truncated or oversized.
    pub bad_messages: u64,
    pub send_failures: u64,
    pub seed_dial_failures: u64,
    /// Suspicions this node raised against other members.
    pub suspicions: u64,
    /// Incoming connections that failed their handshake (wrong or missing cluster key, …).
    pub refused_connections: u64,
    /// Lifeguard local health score (0 is healthy).
    pub health_score: u32,
}

/// `GET /v1/status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusDoc {
    pub node: NodeRef,
    /// The chief (Raft leader); null until the control plane knows one.
    pub chief: Option<NodeRef>,
    pub term: Option<u64>,
    pub members: Vec<MemberDoc>,
    pub jobs: Vec<JobSummary>,
    #[serde(default)]
    pub counters: Counters,
}

impl StatusDoc {
    /// Names of the members in `state`, sorted.
    pub fn names_in(&self, state: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.state == state)
            .map(|m| m.name.clone())
            .collect();
        v.sort();
        v
    }

    /// A readable table for terminals.
    pub fn to_table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let chief = match (&self.chief, self.term) {
            (Some(c), Some(t)) => format!("{} (term {t})", c.name),
            _ => "none yet".to_string(),
        };
        let _ = writeln!(out, "node   {} ({})", self.node.name, self.node.id);
        let _ = writeln!(out, "chief  {chief}");
        let alive = self.members.iter().filter(|m| m.state == "alive").count();
        let _ = writeln!(out, "members: {} ({alive} alive)\n", self.members.len());
        let header = [
            "NAME", "STATE", "VOTER", "CPUS", "MEM_MB", "GPUS", "API", "DATA", "ID",
        ];
        let rows: Vec<[String; 9]> = self
            .members
            .iter()
            .map(|m| {
                [
                    format!("{}{}", m.name, if m.is_self { "*" } else { "" }),
                    m.state.clone(),
                    if m.voter { "yes" } else { "-" }.to_string(),
                    m.cpus.to_string(),
                    m.memory_mb.to_string(),
                    m.gpus.len().to_string(),
                    m.api_addr.clone(),
                    m.data_addr.clone(),
                    m.id.clone(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let line = |cells: &[&str]| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    s.push_str(c);
                } else {
                    let _ = write!(s, "{:<w$}  ", c, w = widths[i]);
                }
            }
            s
        };
        let _ = writeln!(out, "{}", line(&header));
        for row in &rows {
            let cells: Vec<&str> = row.iter().map(String::as_str).collect();
            let _ = writeln!(out, "{}", line(&cells));
        }
        if self.jobs.is_empty() {
            let _ = writeln!(out, "\njobs: none");
        } else {
            let _ = writeln!(out, "\njobs:");
            for j in &self.jobs {
                let _ = writeln!(out, "  {}  {}  {}  {}", j.id, j.name, j.kind, j.state);
            }
        }
        out
    }
}

/// One generation (attempt) of a job and why it formed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerationDoc {
    pub generation: u32,
    /// start | retry | peer-lost | …, then the details.
    pub reason: String,
    pub at_ms: u64,
}

/// How fresh a replica's answer is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FreshnessDoc {
    /// Raft log index applied by the replica that answered.
    pub applied_index: u64,
    /// `chief` when the chief answered (as fresh as committed state gets), else `replica`
    /// (possibly a little behind).
    pub served_by: String,
}

/// `GET /v1/jobs/{id}`: one job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobDoc {
    pub id: String,
    pub name: String,
    pub kind: String,
    pub state: String,
    /// The current attempt; a generation of the ring.
    pub generation: u32,
    pub max_restarts: u32,
    pub workers: u32,
    /// Member names in rank order.
    pub ring: Vec<String>,
    pub pending_reason: Option<String>,
    pub step: Option<u64>,
    pub epoch: Option<u64>,
    /// Latest value of each metric.
    pub metrics: BTreeMap<String, f64>,
    pub history: Vec<GenerationDoc>,
    pub events: Vec<serde_json::Value>,
    /// Exit codes of the current generation's ranks that have exited.
    pub exits: BTreeMap<u32, i32>,
    pub submitted_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub finished_at_ms: Option<u64>,
    pub freshness: FreshnessDoc,
}

impl JobDoc {
    /// A one-line progress summary for `job --watch`.
    pub fn progress_line(&self) -> String {
        let mut s = format!(
            "{} {} [{}] generation {}",
            self.id, self.name, self.state, self.generation
        );
        if let Some(step) = self.step {
            s.push_str(&format!(" step {step}"));
        }
        if let Some(epoch) = self.epoch {
            s.push_str(&format!(" epoch {epoch}"));
        }
        for (k, v) in self
            .metrics
            .iter()
            .filter(|(k, _)| *k != "step" && *k != "epoch")
            .take(6)
        {
            s.push_str(&format!(" {k}={v:.4}"));
        }
        if let Some(r) = &self.pending_reason {
            s.push_str(&format!(" (pending: {r})"));
        }
        s
    }

    /// A readable description for terminals.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "job        {} ({})", self.id, self.name);
        let _ = writeln!(out, "kind       {}", self.kind);
        let _ = writeln!(out, "state      {}", self.state);
        let _ = writeln!(
            out,
            "generation {} (max restarts {})",
            self.generation, self.max_restarts
        );
        let _ = writeln!(
            out,
            "ring       {}",
            if self.ring.is_empty() {
                "-".to_string()
            } else {
                self.ring.join(" → ")
            }
        );
        if let Some(r) = &self.pending_reason {
            let _ = writeln!(out, "pending    {r}");
        }
        if !self.metrics.is_empty() {
            let _ = writeln!(out, "metrics");
            for (k, v) in &self.metrics {
                let _ = writeln!(out, "  {k:<20} {v}");
            }
        }
        let _ = writeln!(out, "events");
        for e in &self.events {
            let what = e["what"].as_str().unwrap_or("?");
            let reason = e["reason"].as_str().unwrap_or("");
            let _ = writeln!(out, "  {:<14} {reason}", what);
        }
        out
    }
}

/// A piece of one rank's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogChunk {
    pub rank: u32,
    pub generation: u32,
    /// Byte offset of `text` in the rank's log.
    pub offset: u64,
    pub text: String,
    /// Where the next read starts.
    pub next_offset: u64,
    /// Why this rank's log could not be read, if it could not.
    pub error: Option<String>,
}

/// `GET /v1/jobs/{id}/logs`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogsDoc {
    pub id: String,
    pub state: String,
    pub chunks: Vec<LogChunk>,
}
