//! The status document: what `GET /v1/status` returns and `ringleader status` prints. Its
//! lists are bounded (at most `listing::STATUS_ROWS_DEFAULT` = 500 members and 500 jobs
//! without a `limit`) and paged, and its `summary` counts everything: see [`listing`].
//!
//! The field names are the user-facing contract (docs/book/src/reference/json.md); fields
//! may be added, never renamed.

pub mod listing;
pub mod progress;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    cluster::{meta::Gpu, net::ClusterView},
    domain::state::{EventKind, Job},
};

pub use crate::cluster::meta::NodeRef;
pub use crate::control::logs::LogChunk;
pub use crate::domain::search::leaderboard::{BestDoc, TrialDoc};

/// One member as this node sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemberDoc {
    pub id: String,
    pub name: String,
    /// alive | suspect | dead | left | removed (`ringleader member remove`)
    pub state: String,
    pub voter: bool,
    pub blacklisted: bool,
    /// Why, while `blacklisted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blacklist_reason: Option<String>,
    pub incarnation: u64,
    pub cpus: u32,
    pub memory_mb: u64,
    pub gpus: Vec<Gpu>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub p2p_addrs: Vec<String>,
    pub api_addr: String,
    pub data_addr: String,
    /// Dataset transfer address.
    #[serde(default)]
    pub datasets_addr: String,
    pub version: String,
    /// True for the node that answered.
    #[serde(rename = "self")]
    pub is_self: bool,
}

#[cfg(any(test, feature = "testing"))]
impl MemberDoc {
    /// A voter named `name` in `state` with 1 cpu, for tests (`self` when named `a`).
    pub fn for_test(name: &str, state: &str) -> MemberDoc {
        MemberDoc {
            id: format!("id-{name}"),
            name: name.into(),
            state: state.into(),
            voter: true,
            blacklisted: false,
            blacklist_reason: None,
            incarnation: 0,
            cpus: 1,
            memory_mb: 1,
            gpus: Vec::new(),
            labels: BTreeMap::new(),
            p2p_addrs: Vec::new(),
            api_addr: String::new(),
            data_addr: String::new(),
            datasets_addr: String::new(),
            version: String::new(),
            is_self: name == "a",
        }
    }
}

impl StatusDoc {
    /// The membership part of the document from this node's view; the control plane fills
    /// in `chief`, `term`, `voter` and `jobs`.
    pub fn from_view(view: &ClusterView) -> StatusDoc {
        let mut members: Vec<MemberDoc> = view
            .members
            .iter()
            .map(|m| MemberDoc {
                id: m.id.to_string(),
                name: m.meta.name.clone(),
                state: m.state.as_str().to_string(),
                voter: false,
                blacklisted: false,
                blacklist_reason: None,
                incarnation: m.incarnation,
                cpus: m.meta.cpus,
                memory_mb: m.meta.memory_mb,
                gpus: m.meta.gpus.clone(),
                labels: m.meta.labels.clone(),
                p2p_addrs: m.meta.p2p_addrs.clone(),
                api_addr: m.meta.api_addr.clone(),
                data_addr: m.meta.data_addr.clone(),
                datasets_addr: m.meta.datasets_addr.clone(),
                version: m.meta.version.clone(),
                is_self: m.id == view.local,
            })
            .collect();
        members.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
        let me = view
            .members
            .iter()
            .find(|m| m.id == view.local)
            .map(|m| m.meta.name.clone())
            .unwrap_or_default();
        StatusDoc {
            node: NodeRef {
                id: view.local.to_string(),
                name: me,
            },
            chief: None,
            term: None,
            members,
            jobs: Vec::new(),
            counters: view.counters.clone(),
            control_fault: None,
            insecure: false,
            api_tls: None,
            summary: None,
            users: Vec::new(),
            seeds_never_reached: view.seeds_never_reached.clone(),
            python: None,
        }
    }
}

/// A job in the summary list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSummary {
    pub id: String,
    pub name: String,
    /// The user it belongs to (see `domain::state::users`).
    #[serde(default = "crate::domain::state::users::admin_user")]
    pub owner: String,
    pub kind: String,
    /// pending | running | succeeded | failed | cancelled, or `stopped` for a trial's job
    /// its search stopped (`domain::state::Job::state_text`).
    pub state: String,
    /// A trial's job: its search's id (`jobs` folds it under that row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<String>,
    /// Steps done, of `total_steps`, and when it should reach them
    /// ([`progress::Progress`]); absent for a job that reports no steps, and for a job
    /// the reader may not read the metrics of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// See [`progress::Progress::total_steps`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_steps: Option<u64>,
    /// See [`progress::Progress::eta_at_ms`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_at_ms: Option<u64>,
}

impl JobSummary {
    /// The row of job `j`.
    pub fn of(j: &Job) -> JobSummary {
        let p = progress::progress(j);
        JobSummary {
            id: j.id.to_string(),
            name: j.spec.name.clone(),
            owner: j.owner.clone(),
            kind: j.spec.kind.to_string(),
            state: j.state_text().to_owned(),
            search: j.trial_of.as_ref().map(|t| t.search.to_string()),
            step: p.step,
            total_steps: p.total_steps,
            eta_at_ms: p.eta_at_ms,
        }
    }

    /// Leaves the summary only: what a reader who may not read the job's metrics sees (as
    /// [`JobDoc::summary_only`]).
    pub fn summary_only(&mut self) {
        self.step = None;
        self.total_steps = None;
        self.eta_at_ms = None;
    }

    /// Its progress.
    pub fn progress(&self) -> progress::Progress {
        progress::Progress {
            step: self.step,
            total_steps: self.total_steps,
            eta_at_ms: self.eta_at_ms,
        }
    }
}

pub use crate::cluster::net::Counters;

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
    /// Why this node's Raft is stopped (its disk took no write), while it is; absent
    /// otherwise. It restarts by itself once the disk takes writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_fault: Option<String>,
    /// Whether this node runs an open cluster (`ringleader node --insecure`): any host that
    /// reaches its listen port can join, and without `--token-file` anyone who reaches its
    /// API can run commands.
    #[serde(default)]
    pub insecure: bool,
    /// The fingerprint (`sha256:HEX`) of the API's TLS key when the API speaks TLS beyond
    /// loopback; null when it does not (a loopback API, `--insecure`, `--api-tls off`).
    #[serde(default)]
    pub api_tls: Option<String>,
    /// Every member and job counted by state, and where the next page of `members` and
    /// `jobs` starts ([`listing`]); absent from nodes older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<listing::Summary>,
    /// The `--join` addresses this node has never connected to since it started; absent
    /// when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seeds_never_reached: Vec<String>,
    /// Each user's use against its quota (`quota ls`'s rows): users with a quota or running
    /// ranks; absent when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<QuotaRow>,
    /// The answering node's `--python`: an interpreter with the package, which
    /// `Client.launch` runs its trials under when not told; absent when not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
}

/// A row of `GET /v1/quotas`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuotaRow {
    /// The user (or `@GROUP`).
    pub user: String,
    /// Its quota record (empty: none).
    pub quota: crate::domain::state::quotas::Quota,
    /// What its running jobs hold now.
    pub used: UsageDoc,
    /// The part of `used` above its quota.
    pub borrowed: UsageDoc,
    /// GPU-hours used in the last 7 days (only for a user with a GPU-hours budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_hours_used: Option<f64>,
}

/// Cpus and GPUs, as the API shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageDoc {
    /// Cpus.
    pub cpus: u64,
    /// GPUs.
    pub gpus: u64,
}

impl From<crate::domain::queue::Usage> for UsageDoc {
    fn from(u: crate::domain::queue::Usage) -> UsageDoc {
        UsageDoc {
            cpus: u.cpus,
            gpus: u.gpus,
        }
    }
}

impl StatusDoc {
    /// The cpus and GPUs of the alive members listed: what the scheduler shares out.
    pub fn alive_capacity(&self) -> crate::domain::queue::Usage {
        self.members
            .iter()
            .filter(|m| m.state == "alive")
            .fold(Default::default(), |t, m| crate::domain::queue::Usage {
                cpus: t.cpus + u64::from(m.cpus),
                gpus: t.gpus + m.gpus.len() as u64,
            })
    }

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
        if let Some(fault) = &self.control_fault {
            let _ = writeln!(out, "STOPPED {fault}");
        }
        if self.insecure {
            let _ = writeln!(
                out,
                "INSECURE open cluster (--insecure): any host that reaches it can join"
            );
        }
        if !self.seeds_never_reached.is_empty() {
            let _ = writeln!(
                out,
                "seeds never reached: {} (down, a wrong address, or another cluster key: see the node's log)",
                self.seeds_never_reached.join(", ")
            );
        }
        match &self.summary {
            Some(sum) => {
                let _ = writeln!(
                    out,
                    "members: {} ({})",
                    sum.members_total,
                    listing::counts_text(&sum.members_by_state, &listing::MEMBER_STATES)
                );
                let _ = writeln!(
                    out,
                    "jobs: {} ({})\n",
                    sum.jobs_total,
                    listing::counts_text(&sum.jobs_by_state, &listing::JOB_STATES)
                );
            }
            None => {
                let alive = self.members.iter().filter(|m| m.state == "alive").count();
                let _ = writeln!(out, "members: {} ({alive} alive)\n", self.members.len());
            }
        }
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
        if let Some(after) = self.summary.as_ref().and_then(|s| s.members_next.as_ref()) {
            let _ = writeln!(
                out,
                "... more members after {after} (--limit N, --member-state STATE)"
            );
        }
        if self.members.iter().any(|m| !m.gpus.is_empty()) {
            let _ = writeln!(out, "\ngpus:");
            for m in &self.members {
                for g in &m.gpus {
                    let _ = writeln!(
                        out,
                        "  {}  {}  {}  {} MiB  {}",
                        m.name, g.index, g.model, g.memory_mb, g.uuid
                    );
                }
            }
        }
        if !self.users.is_empty() {
            let _ = writeln!(out, "\nusers (used/quota, borrowed):");
            let quota = |q: Option<u32>| q.map_or("-".to_owned(), |n| n.to_string());
            for u in &self.users {
                let _ = writeln!(
                    out,
                    "  {}  cpus {}/{} ({} borrowed)  gpus {}/{} ({} borrowed)",
                    u.user,
                    u.used.cpus,
                    quota(u.quota.cpus),
                    u.borrowed.cpus,
                    u.used.gpus,
                    quota(u.quota.gpus),
                    u.borrowed.gpus
                );
            }
        }
        if self.jobs.is_empty() {
            let _ = writeln!(out, "\njobs: none");
        } else {
            let _ = writeln!(out, "\njobs:");
            for j in &self.jobs {
                let _ = writeln!(out, "  {}  {}  {}  {}", j.id, j.name, j.kind, j.state);
            }
            if let Some(before) = self.summary.as_ref().and_then(|s| s.jobs_next.as_ref()) {
                let _ = writeln!(
                    out,
                    "  ... older jobs before {before} (ringleader jobs --before {before})"
                );
            }
        }
        out
    }
}

/// One generation (generation) of a job and why it formed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerationDoc {
    pub generation: u32,
    /// start | retry | peer-lost | hung | straggler | joined, then the details.
    pub reason: String,
    /// Member names in rank order.
    #[serde(default)]
    pub ring: Vec<String>,
    pub at_ms: u64,
}

/// How fresh a replica's answer is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FreshnessDoc {
    /// Raft log index applied by the replica that answered.
    pub applied_index: u64,
    /// `chief` when the chief answered (as fresh as committed state gets), `replica`
    /// (possibly a little behind), or `archive` for a job compacted out of the live state
    /// (its record in the store).
    pub served_by: String,
}

/// `GET /v1/jobs/{id}`: one job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobDoc {
    pub id: String,
    pub name: String,
    /// The user it belongs to: the submitting token's (a trial's job, its search's owner;
    /// see `domain::state::users`).
    #[serde(default = "crate::domain::state::users::admin_user")]
    pub owner: String,
    pub kind: String,
    pub state: String,
    /// The current generation; a generation of the ring.
    pub generation: u32,
    /// The current attempt (a start or a retry from durable state), 1-based; `attempt - 1`
    /// of `max_restarts` are used. Re-forms of an elastic ring use none.
    #[serde(default)]
    pub attempt: u32,
    pub max_restarts: u32,
    pub workers: u32,
    /// Member names in rank order.
    pub ring: Vec<String>,
    pub pending_reason: Option<String>,
    pub step: Option<u64>,
    pub epoch: Option<u64>,
    /// Latest value of each metric.
    pub metrics: BTreeMap<String, f64>,
    /// A train job's planned epochs (the spec's `[train] epochs`, or a trial's rung).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs_total: Option<u64>,
    /// A train job's total steps when known: `[train] max_steps` alone, a `total_steps`
    /// metric, or estimated once an epoch has been validated (see [`total_steps`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_steps: Option<u64>,
    /// When a running job should reach `total_steps` at its current step rate (ms since
    /// the Unix epoch; see [`progress`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_at_ms: Option<u64>,
    pub history: Vec<GenerationDoc>,
    pub events: Vec<serde_json::Value>,
    /// Exit codes of the current generation's ranks that have exited.
    pub exits: BTreeMap<u32, i32>,
    pub submitted_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub finished_at_ms: Option<u64>,
    pub freshness: FreshnessDoc,
    /// A search's trials, in id order (empty for other jobs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trials: Vec<TrialDoc>,
    /// A search's best trial so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<BestDoc>,
    /// A trial's job: its search and trial id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trial_of: Option<TrialOfDoc>,
    /// A search's metric and direction (`max` or `min`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search_metric: Option<String>,
    /// A search's direction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search_direction: Option<String>,
    /// A joiner started ahead of the re-form that takes it in (an elastic command job of
    /// the ringleader protocol; see `domain::state::standby`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<StandbyDoc>,
    /// Why its latest failed attempt failed (a failed job's cause; see
    /// `domain::state::failure`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureDoc>,
}

/// [`JobDoc::failure`]: the cause in one line, then its parts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailureDoc {
    /// `rank 0 on m1: exit 1: ModuleNotFoundError: No module named 'foo'` (where, the exit
    /// status or signal, the last stderr line), `rank 0 on m1: could not start: …`, or the
    /// chief's reason (a member lost).
    pub cause: String,
    /// The attempt, the rank, its member, its exit code or signal, why it could not start,
    /// the chief's reason, the last lines of its stderr (at most 5, 2 KiB, redacted).
    #[serde(flatten)]
    pub detail: crate::domain::state::failure::Failure,
}

/// [`JobDoc::standby`]: where the standby runs and whether it said it is ready.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StandbyDoc {
    /// Its member's name.
    pub member: String,
    /// Its worker id in the attempt.
    pub worker: u32,
    /// It printed `ringleader-ready`: the ring re-forms with it next.
    pub ready: bool,
}

/// What `job --watch` has shown of a search's trials (see [`JobDoc::trial_changes`]).
#[derive(Debug, Default)]
pub struct TrialsSeen {
    states: BTreeMap<u32, String>,
    best: Option<(u32, f64)>,
}

/// On a trial's job: which search and trial it runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrialOfDoc {
    /// The search job's id.
    pub search: String,
    /// The trial's id in it.
    pub trial: u32,
    /// A speculative copy of the trial's run.
    pub copy: bool,
}

impl JobDoc {
    /// Leaves the summary only (name, owner, kind, state, resources, ring, history): what a
    /// user sees of another user's job, and a viewer of any. Its metrics, step and the
    /// values its search's trials reported are taken out.
    pub fn summary_only(&mut self) {
        self.metrics.clear();
        self.step = None;
        self.epoch = None;
        self.total_steps = None;
        self.eta_at_ms = None;
        self.best = None;
        for t in &mut self.trials {
            t.metric = None;
        }
    }

    /// A search's trials, best first (by its metric and direction; trials without a metric
    /// last; ties: more resource, then lower id).
    pub fn leaderboard(&self) -> Vec<TrialDoc> {
        let direction = if self.search_direction.as_deref() == Some("min") {
            trainer::search::Direction::Min
        } else {
            trainer::search::Direction::Max
        };
        let mut rows = self.trials.clone();
        crate::domain::search::leaderboard::sort_best_first(&mut rows, direction);
        rows
    }

    /// A search's leaderboard, best first, as a table.
    pub fn leaderboard_table(&self) -> String {
        use std::fmt::Write;
        let rows = self.leaderboard();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:>5}  {:<10} {:>10} {:>8} {:>5}  {:<8} {:<8} params",
            "trial", "state", "metric", "resource", "promo", "node", "job"
        );
        for t in &rows {
            let metric = t.metric.map_or("-".to_string(), |m| format!("{m:.4}"));
            let params = t.params_text();
            let _ = writeln!(
                out,
                "{:>5}  {:<10} {:>10} {:>8} {:>5}  {:<8} {:<8} {params}",
                t.id, t.state, metric, t.resource, t.promotions, t.node, t.job
            );
        }
        if let Some(b) = &self.best {
            let _ = writeln!(out, "best: trial {} with {}", b.id, b.metric);
        }
        out
    }

    /// A search's trials as `job --watch` follows them: a line per trial whose state
    /// changed since `seen`, and one when the best trial changes. `seen` is updated.
    pub fn trial_changes(&self, seen: &mut TrialsSeen) -> Vec<String> {
        let metric = self.search_metric.as_deref().unwrap_or("metric");
        let mut out = Vec::new();
        for t in &self.trials {
            if seen.states.get(&t.id) == Some(&t.state) {
                continue;
            }
            seen.states.insert(t.id, t.state.clone());
            let params = t.params_text();
            let mut line = format!("trial {} {}", t.id, t.state);
            if !t.node.is_empty() {
                line.push_str(&format!(" on {}", t.node));
            }
            if let Some(m) = t.metric {
                line.push_str(&format!(" {metric}={m:.4} at {}", t.resource));
            }
            line.push_str(&format!(" [{params}] (job {})", t.job));
            if !t.note.is_empty() {
                line.push_str(&format!(": {}", t.note));
            }
            out.push(line);
        }
        let best = self.best.as_ref().map(|b| (b.id, b.metric));
        if best.is_some() && best != seen.best {
            if let Some(b) = &self.best {
                out.push(format!(
                    "best so far: trial {} {metric}={:.4}",
                    b.id, b.metric
                ));
            }
            seen.best = best;
        }
        out
    }

    /// Its failure for terminals: `failed     <cause>` for a failed job (`last failure` while
    /// it retries, nothing once it succeeded), then the stderr tail, indented.
    pub fn failure_lines(&self) -> Vec<String> {
        let Some(f) = &self.failure else {
            return Vec::new();
        };
        let label = match self.state.as_str() {
            "failed" => "failed    ",
            "succeeded" => return Vec::new(),
            _ => "last failure",
        };
        let mut lines = vec![format!("{label} {}", f.cause)];
        if !f.detail.stderr_tail.is_empty() {
            lines.push("stderr (last lines)".to_owned());
            lines.extend(f.detail.stderr_tail.iter().map(|l| format!("  {l}")));
        }
        lines
    }

    /// A one-line progress summary for `job --watch`.
    pub fn progress_line(&self) -> String {
        let mut s = format!(
            "{} {} [{}] generation {}",
            self.id, self.name, self.state, self.generation
        );
        match (self.step, self.total_steps) {
            (Some(step), Some(total)) => s.push_str(&format!(" step {step} / {total}")),
            (Some(step), None) => s.push_str(&format!(" step {step}")),
            _ => {}
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

    /// Its progress (steps of the total, when it should end).
    pub fn progress(&self) -> progress::Progress {
        progress::Progress {
            step: self.step,
            total_steps: self.total_steps,
            eta_at_ms: self.eta_at_ms,
        }
    }

    /// A readable description for terminals ([`JobDoc::to_text_at`] without an ETA).
    pub fn to_text(&self) -> String {
        self.to_text_at(0)
    }

    /// A readable description for terminals; `now_ms`: the reader's clock, for the ETA of
    /// a running job (0: none shown).
    pub fn to_text_at(&self, now_ms: u64) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "job        {} ({})", self.id, self.name);
        let _ = writeln!(out, "owner      {}", self.owner);
        let _ = writeln!(out, "kind       {}", self.kind);
        let _ = writeln!(out, "state      {}", self.state);
        if self.step.is_some() {
            let mut p = self.progress();
            if now_ms == 0 {
                p.eta_at_ms = None;
            }
            let _ = writeln!(out, "steps      {}", progress::progress_text(&p, now_ms));
        }
        // Attempts, not restarts: `attempt 1 of 4` reads as three retries left, where
        // `generation 3 (max restarts 3)` read as if they had run out (re-forms of an elastic
        // ring make generations, not attempts).
        let attempts = self.max_restarts.saturating_add(1);
        let _ = match self.attempt {
            0 => writeln!(
                out,
                "attempt    none yet of {attempts}, generation {}",
                self.generation
            ),
            n => writeln!(
                out,
                "attempt    {n} of {attempts}, generation {}",
                self.generation
            ),
        };
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
        for line in self.failure_lines() {
            let _ = writeln!(out, "{line}");
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

/// `GET /v1/jobs/{id}/metrics`: each metric's history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricsDoc {
    /// The job.
    pub id: String,
    /// Per metric, `[x, value]` points oldest first; `x` is the step the value was reported
    /// at, or the report's sequence number when it came without a step. Bounded by
    /// `domain::state::METRIC_HISTORY_POINTS_MAX` (older stretches thinned evenly).
    pub metrics: BTreeMap<String, Vec<(u64, f64)>>,
}

impl MetricsDoc {
    /// The document of job `j`.
    pub fn of(j: &Job) -> MetricsDoc {
        MetricsDoc {
            id: j.id.to_string(),
            metrics: j
                .metric_history
                .iter()
                .map(|(k, h)| (k.clone(), h.points.clone()))
                .collect(),
        }
    }
}

/// A train job's `[train]` table as the trainer reads it (its defaults filled in).
fn train_params(j: &Job) -> Option<&trainer::TrainParams> {
    j.spec.trainer().map(|t| &t.train)
}

/// A train job's planned epochs: the spec's, or fewer for a trial trained to a rung.
pub fn epochs_total(j: &Job) -> Option<u64> {
    let epochs = train_params(j)?.epochs;
    match j.trial_of.as_ref().map(|t| u64::from(t.target)) {
        Some(target) if target > 0 && (epochs == 0 || target < epochs) => Some(target),
        _ => (epochs > 0).then_some(epochs),
    }
}

/// A train job's total steps, if it can be told: a `total_steps` metric if the worker
/// reports one; `[train] max_steps` when `epochs = 0`; else epochs × steps per epoch
/// (capped by `max_steps`), where steps per epoch is estimated from the steps at which
/// validations were reported (`val_loss`, every `eval_every_epochs` epochs): the smallest
/// gap between two of them, or the first one's step if there is one only (exact for a run
/// that started at epoch 0). `None` until then: a spinner, not a bar.
pub fn total_steps(j: &Job) -> Option<u64> {
    if let Some(m) = j.metrics.get("total_steps") {
        return Some(m.value.max(0.0) as u64);
    }
    let train = train_params(j)?;
    let max_steps = train.max_steps;
    let epochs = epochs_total(j);
    let Some(epochs) = epochs else {
        return max_steps;
    };
    let every = train.eval_every_epochs;
    let val = j
        .metric_history
        .get("val_loss")
        .or_else(|| j.metric_history.get("val_accuracy"))?;
    // Only points reported with a step carry one; in a full history the stride thins
    // them, so gaps are a multiple of the epoch: the smallest one is used.
    let steps: Vec<u64> = val.points.iter().map(|p| p.0).filter(|s| *s > 0).collect();
    if every == 0 || steps.is_empty() {
        return None;
    }
    let gap = steps
        .windows(2)
        .filter_map(|w| w[1].checked_sub(w[0]).filter(|g| *g > 0))
        .min()
        .unwrap_or(steps[0]);
    let per_epoch = (gap / every).max(1);
    let total = epochs.saturating_mul(per_epoch);
    Some(max_steps.map_or(total, |m| total.min(m)))
}

/// `GET /v1/jobs/{id}/logs`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogsDoc {
    pub id: String,
    pub state: String,
    /// The generation each of the job's runs was placed in, oldest first (a search trial's
    /// first run, then each promotion and re-run; a job's attempts): `?generation=G` reads
    /// a past one.
    #[serde(default)]
    pub runs: Vec<u32>,
    pub chunks: Vec<LogChunk>,
}

/// The API's view of a job record.
pub fn job_doc(j: &Job, applied_index: u64, chief: bool) -> JobDoc {
    let search = j
        .search
        .as_ref()
        .and_then(|_| crate::domain::search::spec::search_spec(&j.spec).ok());
    let metric = |name: &str| j.metrics.get(name).map(|m| m.value.max(0.0) as u64);
    let progress = progress::progress(j);
    let history = j
        .events
        .iter()
        .filter(|e| matches!(e.what, EventKind::Placed | EventKind::Reformed))
        .map(|e| GenerationDoc {
            generation: e.generation,
            reason: e.reason.clone(),
            ring: e.ring.clone(),
            at_ms: e.at_ms,
        })
        .collect();
    JobDoc {
        id: j.id.to_string(),
        name: j.spec.name.clone(),
        owner: j.owner.clone(),
        kind: j.spec.kind.to_string(),
        state: j.state_text().to_owned(),
        generation: j.generation,
        attempt: j.attempt,
        max_restarts: j.max_restarts,
        workers: j.spec.workers,
        ring: j.assignment.iter().map(|s| s.name.clone()).collect(),
        pending_reason: j.pending_reason.clone(),
        step: progress.step,
        epoch: metric("epoch"),
        metrics: j
            .metrics
            .iter()
            .map(|(k, m)| (k.clone(), m.value))
            .collect(),
        epochs_total: epochs_total(j),
        total_steps: progress.total_steps,
        eta_at_ms: progress.eta_at_ms,
        history,
        events: j
            .events
            .iter()
            .filter_map(|e| serde_json::to_value(e).ok())
            .collect(),
        exits: j.exits.clone(),
        submitted_at_ms: j.submitted_at_ms,
        started_at_ms: j.started_at_ms,
        finished_at_ms: j.finished_at_ms,
        freshness: FreshnessDoc {
            applied_index,
            served_by: if chief { "chief" } else { "replica" }.into(),
        },
        trials: j
            .search
            .as_ref()
            .map(|r| crate::domain::search::leaderboard::trials(r, &j.owner))
            .unwrap_or_default(),
        best: match (&j.search, &search) {
            (Some(r), Some(s)) => crate::domain::search::leaderboard::best(r, s.direction),
            _ => None,
        },
        trial_of: j.trial_of.as_ref().map(|t| TrialOfDoc {
            search: t.search.to_string(),
            trial: t.trial,
            copy: t.copy,
        }),
        search_metric: search.as_ref().map(|s| s.metric.clone()),
        search_direction: search.as_ref().map(|s| match s.direction {
            trainer::search::Direction::Max => "max".to_owned(),
            trainer::search::Direction::Min => "min".to_owned(),
        }),
        standby: j.standby.as_ref().map(|s| StandbyDoc {
            member: s.slot.name.clone(),
            worker: s.slot.worker,
            ready: s.ready,
        }),
        failure: j.failure().map(|f| FailureDoc {
            cause: f.headline(),
            detail: f.clone(),
        }),
    }
}

#[cfg(test)]
mod tests;
