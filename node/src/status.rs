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
            "NAME", "STATE", "CPUS", "MEM_MB", "GPUS", "API", "DATA", "ID",
        ];
        let rows: Vec<[String; 8]> = self
            .members
            .iter()
            .map(|m| {
                [
                    format!("{}{}", m.name, if m.is_self { "*" } else { "" }),
                    m.state.clone(),
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
