//! `GET /metrics`: the node's view in the Prometheus text exposition format (0.0.4).
//!
//! Written by hand: a pure function from the status document and the jobs' latest metrics
//! to the text. Every name starts with `ringleader_`. Per-job series carry the labels
//! `job_id` and `job_name` (not `job`, which Prometheus reserves for the scrape job and
//! would rename to `exported_job`); only pending and running jobs have them, so the number
//! of series follows the live jobs, not every job the cluster ever ran.
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `ringleader_members` | gauge | `state` (alive, suspect, dead, left) |
//! | `ringleader_raft_term` | gauge | |
//! | `ringleader_is_chief` | gauge (0 or 1) | |
//! | `ringleader_control_stopped` | gauge (0 or 1) | |
//! | `ringleader_jobs` | gauge | `state`, `kind` |
//! | `ringleader_job_step`, `_epoch`, `_loss`, `_val_accuracy`, `_samples_per_second`, `_collective_sent_bytes`, `_allreduce_wait_milliseconds` | gauge | `job_id`, `job_name` |
//! | `ringleader_preemptions_total` | counter | `action` (shrink, requeue, pause) |
//! | `ringleader_gossip_*_total` | counter | |
//! | `ringleader_gossip_health_score` | gauge | |

use std::{collections::BTreeMap, fmt::Write};

use crate::status::StatusDoc;

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Member states, each always exported (0 when none).
const MEMBER_STATES: [&str; 4] = ["alive", "suspect", "dead", "left"];
/// Job states, each always exported per kind.
const JOB_STATES: [&str; 5] = ["pending", "running", "succeeded", "failed", "cancelled"];
/// Job states whose per-job series are no longer exported.
const TERMINAL_JOB_STATES: [&str; 3] = ["succeeded", "failed", "cancelled"];
/// Job kinds.
const JOB_KINDS: [&str; 3] = ["train", "search", "command"];
/// Preemption actions, each always exported.
const PREEMPT_ACTIONS: [&str; 3] = ["shrink", "requeue", "pause"];

/// `ringleader_preemptions_total{action}`: the replicated count of preemptions applied
/// (`ControlState::preemptions`), every action exported (0 when none).
pub fn render_preemptions(counts: &BTreeMap<String, u64>) -> String {
    let mut e = Exposition(String::new());
    e.family(
        "ringleader_preemptions_total",
        "counter",
        "Preemptions applied in the cluster, by action.",
    );
    for action in PREEMPT_ACTIONS {
        let n = counts.get(action).copied().unwrap_or(0);
        e.sample(
            "ringleader_preemptions_total",
            &[("action", action)],
            n as f64,
        );
    }
    e.0
}

/// What `/metrics` shows of one job.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobSample {
    /// Job id.
    pub id: String,
    /// The spec's name.
    pub name: String,
    /// `train`, `search` or `command`.
    pub kind: String,
    /// Lifecycle state.
    pub state: String,
    /// Latest step, if known.
    pub step: Option<u64>,
    /// Latest value of each metric.
    pub metrics: BTreeMap<String, f64>,
}

/// Per-job gauges: (metric name in the job, exported suffix, help).
const JOB_GAUGES: [(&str, &str, &str); 6] = [
    (
        "epoch",
        "epoch",
        "Epoch the job's training is in (1-based).",
    ),
    ("loss", "loss", "Latest training loss the job reported."),
    (
        "val_accuracy",
        "val_accuracy",
        "Latest validation accuracy the job reported.",
    ),
    (
        "samples_per_s",
        "samples_per_second",
        "Training throughput the job reported, samples per second.",
    ),
    (
        "collective_bytes",
        "collective_sent_bytes",
        "Bytes the job's rank 0 sent over the collective so far (by the ring's schedule).",
    ),
    (
        "allreduce_wait_ms",
        "allreduce_wait_milliseconds",
        "Mean wait per step for the gradients' allreduce, the part not overlapped (rank 0).",
    ),
];

/// Escapes a label value: `\` → `\\`, `"` → `\"`, newline → `\n`.
pub fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes `# HELP` text: `\` → `\\`, newline → `\n`.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A sample value as the format writes floats.
fn value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// Builds the text, one family at a time.
struct Exposition(String);

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape_label_value(val));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {}", value(v));
    }
}

/// The scheduler's figures: each user's resources and the queue by priority.
#[derive(Debug, Clone, Default)]
pub struct SharingSample {
    /// (user, resource `cpus`|`gpus`, kind `used`|`quota`|`borrowed`, value).
    pub user_resources: Vec<(String, &'static str, &'static str, u64)>,
    /// Waiting jobs per priority label (`low`, `normal`, `high` or the number).
    pub queue_jobs: std::collections::BTreeMap<String, u64>,
}

/// `ringleader_user_resources{user,resource,kind}` and `ringleader_queue_jobs{priority}`.
pub fn render_sharing(s: &SharingSample) -> String {
    let mut e = Exposition(String::new());
    e.family(
        "ringleader_user_resources",
        "gauge",
        "Each user's cpus and GPUs: used by running ranks, its quota, and borrowed above it.",
    );
    for (user, resource, kind, v) in &s.user_resources {
        e.sample(
            "ringleader_user_resources",
            &[("user", user), ("resource", resource), ("kind", kind)],
            *v as f64,
        );
    }
    e.family(
        "ringleader_queue_jobs",
        "gauge",
        "Jobs waiting for placement, by priority.",
    );
    for (priority, n) in &s.queue_jobs {
        e.sample(
            "ringleader_queue_jobs",
            &[("priority", priority)],
            *n as f64,
        );
    }
    e.0
}

/// This node's dataset figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct DatasetSample {
    /// Bytes served to peers since the node started.
    pub served_bytes: u64,
    /// Verified bytes fetched from peers since the node started.
    pub fetched_bytes: u64,
    /// Datasets in the registry.
    pub registered: usize,
}

/// The dataset families (appended to [`render`]'s text).
pub fn render_datasets(d: &DatasetSample) -> String {
    let mut e = Exposition(String::new());
    e.family(
        "ringleader_dataset_served_bytes_total",
        "counter",
        "Dataset bytes this node served to peers since it started.",
    );
    e.sample(
        "ringleader_dataset_served_bytes_total",
        &[],
        d.served_bytes as f64,
    );
    e.family(
        "ringleader_dataset_fetched_bytes_total",
        "counter",
        "Verified dataset bytes this node fetched from peers since it started.",
    );
    e.sample(
        "ringleader_dataset_fetched_bytes_total",
        &[],
        d.fetched_bytes as f64,
    );
    e.family(
        "ringleader_datasets",
        "gauge",
        "Datasets in the cluster's registry.",
    );
    e.sample("ringleader_datasets", &[], d.registered as f64);
    e.0
}

/// The exposition of `status` (this node's view of members, chief, term and counters) and
/// `jobs`.
pub fn render(status: &StatusDoc, jobs: &[JobSample]) -> String {
    let mut e = Exposition(String::new());

    e.family(
        "ringleader_members",
        "gauge",
        "Cluster members this node sees, by state.",
    );
    let mut by_state: BTreeMap<&str, u64> = MEMBER_STATES.iter().map(|s| (*s, 0)).collect();
    for m in &status.members {
        *by_state.entry(m.state.as_str()).or_default() += 1;
    }
    for (state, n) in &by_state {
        e.sample("ringleader_members", &[("state", state)], *n as f64);
    }

    e.family(
        "ringleader_raft_term",
        "gauge",
        "Raft term of the control plane as this node knows it.",
    );
    e.sample("ringleader_raft_term", &[], status.term.unwrap_or(0) as f64);
    e.family(
        "ringleader_is_chief",
        "gauge",
        "1 when this node is the chief (Raft leader), else 0.",
    );
    let chief = status
        .chief
        .as_ref()
        .is_some_and(|c| c.id == status.node.id);
    e.sample("ringleader_is_chief", &[], u8::from(chief).into());
    e.family(
        "ringleader_control_stopped",
        "gauge",
        "1 while this node's Raft is stopped because its disk took no write, else 0.",
    );
    e.sample(
        "ringleader_control_stopped",
        &[],
        u8::from(status.control_fault.is_some()).into(),
    );

    e.family("ringleader_jobs", "gauge", "Jobs by state and kind.");
    let mut grid: BTreeMap<(&str, &str), u64> = JOB_STATES
        .iter()
        .flat_map(|s| JOB_KINDS.iter().map(move |k| ((*s, *k), 0)))
        .collect();
    for j in jobs {
        *grid.entry((j.state.as_str(), j.kind.as_str())).or_default() += 1;
    }
    for ((state, kind), n) in &grid {
        e.sample(
            "ringleader_jobs",
            &[("state", state), ("kind", kind)],
            *n as f64,
        );
    }

    let live: Vec<&JobSample> = jobs
        .iter()
        .filter(|j| !TERMINAL_JOB_STATES.contains(&j.state.as_str()))
        .collect();
    e.family(
        "ringleader_job_step",
        "gauge",
        "Latest training step a job reported.",
    );
    for j in &live {
        if let Some(step) = j.step {
            e.sample(
                "ringleader_job_step",
                &[("job_id", &j.id), ("job_name", &j.name)],
                step as f64,
            );
        }
    }
    for (metric, suffix, help) in JOB_GAUGES {
        let name = format!("ringleader_job_{suffix}");
        e.family(&name, "gauge", help);
        for j in &live {
            if let Some(v) = j.metrics.get(metric) {
                e.sample(&name, &[("job_id", &j.id), ("job_name", &j.name)], *v);
            }
        }
    }

    let c = &status.counters;
    let counters: [(&str, u64, &str); 12] = [
        (
            "messages_in",
            c.messages_in,
            "Membership messages received.",
        ),
        ("messages_out", c.messages_out, "Membership messages sent."),
        (
            "bad_messages",
            c.bad_messages,
            "Membership messages dropped as garbled, truncated or oversized.",
        ),
        (
            "send_failures",
            c.send_failures,
            "Membership messages that could not be sent.",
        ),
        (
            "seed_dial_failures",
            c.seed_dial_failures,
            "Failed dials of seed nodes.",
        ),
        (
            "suspicions",
            c.suspicions,
            "Suspicions this node raised against other members.",
        ),
        (
            "refused_connections",
            c.refused_connections,
            "Incoming connections that failed their handshake (wrong or missing cluster key).",
        ),
        (
            "refused_datagrams",
            c.refused_datagrams,
            "Membership datagrams refused: did not open (wrong or missing cluster key), not fresh, or from a removed member.",
        ),
        (
            "replayed_datagrams",
            c.replayed_datagrams,
            "Membership datagrams seen before within the replay window.",
        ),
        (
            "skewed_datagrams",
            c.skewed_datagrams,
            "Membership datagrams sealed more than 30 s from this host's clock.",
        ),
        (
            "removed_datagrams",
            c.removed_datagrams,
            "Membership datagrams and frames from members removed from the cluster.",
        ),
        (
            "refused_claims",
            c.refused_claims,
            "Membership claims without their subject's signature or past the incarnation bounds.",
        ),
    ];
    for (what, n, help) in counters {
        let name = format!("ringleader_gossip_{what}_total");
        e.family(&name, "counter", help);
        e.sample(&name, &[], n as f64);
    }
    e.family(
        "ringleader_gossip_health_score",
        "gauge",
        "Lifeguard local health score (0 is healthy).",
    );
    e.sample("ringleader_gossip_health_score", &[], c.health_score.into());
    e.0
}

#[cfg(test)]
mod tests;
