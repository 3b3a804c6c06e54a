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
//! | `ringleader_gossip_*_total` | counter | |
//! | `ringleader_gossip_health_score` | gauge | |

use std::{collections::BTreeMap, fmt::Write};

use crate::api::status::StatusDoc;

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
    let counters: [(&str, u64, &str); 7] = [
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
mod tests {
    use super::*;
    use crate::api::status::{Counters, MemberDoc, NodeRef};

    fn member(name: &str, state: &str) -> MemberDoc {
        MemberDoc::for_test(name, state)
    }

    fn status() -> StatusDoc {
        StatusDoc {
            node: NodeRef {
                id: "id-a".into(),
                name: "a".into(),
            },
            chief: Some(NodeRef {
                id: "id-a".into(),
                name: "a".into(),
            }),
            term: Some(3),
            members: vec![
                member("a", "alive"),
                member("b", "alive"),
                member("c", "dead"),
            ],
            jobs: Vec::new(),
            counters: Counters {
                messages_in: 10,
                suspicions: 2,
                ..Counters::default()
            },
            control_fault: None,
            insecure: false,
            api_tls: None,
        }
    }

    /// A label value as read back: the inverse of [`escape_label_value`].
    fn unescape(v: &str) -> String {
        let mut out = String::new();
        let mut chars = v.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                match chars.next() {
                    Some('n') => out.push('\n'),
                    Some(c) => out.push(c),
                    None => panic!("dangling backslash in {v:?}"),
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    fn is_name(s: &str) -> bool {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    /// One sample as read back: name, labels, value.
    type Sample = (String, Vec<(String, String)>, f64);

    /// A strict reader of the format: (family types, samples).
    fn parse(text: &str) -> (BTreeMap<String, String>, Vec<Sample>) {
        let mut types = BTreeMap::new();
        let mut samples = Vec::new();
        assert!(text.ends_with('\n'));
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, _) = rest.split_once(' ').unwrap();
                assert!(is_name(name), "{line}");
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(is_name(name) && ["gauge", "counter"].contains(&kind));
                assert!(
                    types.insert(name.to_string(), kind.to_string()).is_none(),
                    "{name} typed twice"
                );
                continue;
            }
            assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
            let name_end = line.find(['{', ' ']).unwrap();
            let name = &line[..name_end];
            assert!(is_name(name), "{line}");
            assert!(types.contains_key(name), "{name} sampled before its TYPE");
            let mut rest = &line[name_end..];
            let mut labels = Vec::new();
            if let Some(inner) = rest.strip_prefix('{') {
                // label="value" pairs; values may hold escaped quotes.
                let mut s = inner;
                loop {
                    let (k, after) = s.split_once("=\"").unwrap();
                    assert!(is_name(k), "{line}");
                    let mut end = None;
                    let mut escaped = false;
                    for (i, c) in after.char_indices() {
                        match (escaped, c) {
                            (true, _) => escaped = false,
                            (false, '\\') => escaped = true,
                            (false, '"') => {
                                end = Some(i);
                                break;
                            }
                            _ => {}
                        }
                    }
                    let end = end.unwrap();
                    labels.push((k.to_string(), unescape(&after[..end])));
                    s = &after[end + 1..];
                    if let Some(r) = s.strip_prefix(',') {
                        s = r;
                    } else {
                        rest = s.strip_prefix('}').unwrap();
                        break;
                    }
                }
            }
            let v: f64 = rest.strip_prefix(' ').unwrap().parse().unwrap();
            samples.push((name.to_string(), labels, v));
        }
        (types, samples)
    }

    fn find<'a>(samples: &'a [Sample], name: &str, label: (&str, &str)) -> Option<&'a Sample> {
        samples.iter().find(|(n, l, _)| {
            n == name && (label.0.is_empty() || l.iter().any(|(k, v)| k == label.0 && v == label.1))
        })
    }

    #[test]
    fn exposition_is_well_formed_and_complete() {
        let jobs = vec![
            JobSample {
                id: "j-1".into(),
                name: "mnist".into(),
                kind: "train".into(),
                state: "running".into(),
                step: Some(120),
                metrics: [("loss".to_string(), 0.25), ("samples_per_s".into(), 900.0)]
                    .into_iter()
                    .collect(),
            },
            JobSample {
                id: "j-2".into(),
                name: "sweep".into(),
                kind: "search".into(),
                state: "succeeded".into(),
                ..JobSample::default()
            },
        ];
        let text = render(&status(), &jobs);
        let (types, samples) = parse(&text);
        assert!(types.keys().all(|n| n.starts_with("ringleader_")));
        assert_eq!(types["ringleader_gossip_messages_in_total"], "counter");
        let v = |name, label| find(&samples, name, label).map(|s| s.2);
        assert_eq!(v("ringleader_members", ("state", "alive")), Some(2.0));
        assert_eq!(v("ringleader_members", ("state", "dead")), Some(1.0));
        assert_eq!(v("ringleader_members", ("state", "suspect")), Some(0.0));
        assert_eq!(v("ringleader_raft_term", ("", "")), Some(3.0));
        assert_eq!(v("ringleader_is_chief", ("", "")), Some(1.0));
        let running_train = samples.iter().find(|(n, l, _)| {
            n == "ringleader_jobs"
                && l.contains(&("state".into(), "running".into()))
                && l.contains(&("kind".into(), "train".into()))
        });
        assert_eq!(running_train.unwrap().2, 1.0);
        assert_eq!(v("ringleader_job_step", ("job_id", "j-1")), Some(120.0));
        assert_eq!(v("ringleader_job_loss", ("job_name", "mnist")), Some(0.25));
        assert_eq!(
            v("ringleader_job_samples_per_second", ("job_id", "j-1")),
            Some(900.0)
        );
        assert_eq!(v("ringleader_job_val_accuracy", ("job_id", "j-1")), None);
        assert_eq!(v("ringleader_job_step", ("job_id", "j-2")), None);
        assert_eq!(v("ringleader_gossip_suspicions_total", ("", "")), Some(2.0));
    }

    #[test]
    fn label_values_are_escaped() {
        let nasty = "a \"quoted\" back\\slash\nnew line }{,=";
        let jobs = vec![JobSample {
            id: "j-3".into(),
            name: nasty.into(),
            kind: "train".into(),
            state: "running".into(),
            step: Some(1),
            metrics: BTreeMap::new(),
        }];
        let text = render(&status(), &jobs);
        assert!(text.contains(r#"job_name="a \"quoted\" back\\slash\nnew line }{,=""#));
        let (_, samples) = parse(&text);
        let s = find(&samples, "ringleader_job_step", ("job_id", "j-3")).unwrap();
        assert!(s.1.contains(&("job_name".to_string(), nasty.to_string())));
        assert_eq!(escape_label_value("\\\"\n"), "\\\\\\\"\\n");
    }

    #[test]
    fn values_use_the_format_spelling() {
        assert_eq!(value(f64::NAN), "NaN");
        assert_eq!(value(f64::INFINITY), "+Inf");
        assert_eq!(value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(value(0.5), "0.5");
        assert_eq!(value(3.0), "3");
        let mut no_chief = status();
        no_chief.chief = None;
        no_chief.term = None;
        let text = render(&no_chief, &[]);
        assert!(text.contains("\nringleader_is_chief 0\n"));
        assert!(text.contains("\nringleader_control_stopped 0\n"));
        assert!(text.contains("\nringleader_raft_term 0\n"));
    }
}
