use super::*;
use crate::status::{Counters, MemberDoc, NodeRef};

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
        summary: None,
        users: Vec::new(),
        seeds_never_reached: Vec::new(),
        python: None,
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

#[test]
fn the_scheduler_figures_are_labelled_by_user_resource_kind_and_priority() {
    let sample = SharingSample {
        user_resources: vec![
            ("alice".into(), "cpus", "used", 3),
            ("alice".into(), "cpus", "quota", 4),
        ],
        queue_jobs: [("high".to_owned(), 2)].into_iter().collect(),
    };
    let text = render_sharing(&sample);
    assert!(
        text.contains("# TYPE ringleader_user_resources gauge\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "ringleader_user_resources{user=\"alice\",resource=\"cpus\",kind=\"used\"} 3\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("ringleader_queue_jobs{priority=\"high\"} 2\n"),
        "{text}"
    );
}

/// `ringleader_preemptions_total`: every action exported, 0 when none, from the replicated
/// counts.
#[test]
fn preemptions_are_counted_by_action() {
    let counts: BTreeMap<String, u64> = [("shrink".to_owned(), 2), ("pause".to_owned(), 1)]
        .into_iter()
        .collect();
    let text = render_preemptions(&counts);
    assert!(text.contains("# TYPE ringleader_preemptions_total counter"));
    for line in [
        "ringleader_preemptions_total{action=\"shrink\"} 2",
        "ringleader_preemptions_total{action=\"requeue\"} 0",
        "ringleader_preemptions_total{action=\"pause\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
}
