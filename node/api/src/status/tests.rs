use super::*;
use crate::domain::state::{ops, ControlCommand, ControlResponse, ControlState, Op};

fn train_job(train: &str) -> Job {
    let text = format!("name = \"t\"\nkind = \"train\"\nworkers = 1\n[train]\n{train}");
    let mut state = ControlState::default();
    let cmd = ControlCommand {
        op: Op::Submit(ops::Submit {
            spec: Box::new(crate::domain::spec::JobSpec::parse(&text).unwrap()),
            token: None,
            owner: crate::domain::state::users::admin_user(),
        }),
        at_ms: 1,
    };
    let ControlResponse::Submitted { id } = state.apply(1, &cmd) else {
        panic!("not submitted")
    };
    state.job(id).unwrap().clone()
}

fn validated_at(job: &mut Job, steps: &[u64]) {
    let h = job.metric_history.entry("val_loss".into()).or_default();
    for s in steps {
        h.record(Some(*s), 0.5);
    }
}

#[test]
fn total_steps_come_from_the_spec_and_validations() {
    let mut j = train_job("epochs = 4\n");
    assert_eq!(epochs_total(&j), Some(4));
    assert_eq!(total_steps(&j), None, "unknown before the first validation");
    validated_at(&mut j, &[25]);
    assert_eq!(total_steps(&j), Some(100));
    validated_at(&mut j, &[50, 75]);
    assert_eq!(total_steps(&j), Some(100));

    let mut j = train_job("epochs = 6\neval_every_epochs = 2\nmax_steps = 100\n");
    validated_at(&mut j, &[40]);
    assert_eq!(total_steps(&j), Some(100), "6 × 20 capped by max_steps");

    let j = train_job("epochs = 0\nmax_steps = 300\n");
    assert_eq!((epochs_total(&j), total_steps(&j)), (None, Some(300)));

    let mut j = train_job("epochs = 2\neval_every_epochs = 0\n");
    validated_at(&mut j, &[10]);
    assert_eq!(total_steps(&j), None, "validation only at the end: unknown");
}

#[test]
fn the_table_lists_each_members_gpus() {
    let gpu = |index| Gpu {
        index,
        model: "H100".into(),
        memory_mb: 81_559,
        uuid: format!("GPU-test-{index}"),
    };
    let member = |name: &str, gpus: Vec<Gpu>| MemberDoc {
        cpus: 4,
        gpus,
        is_self: false,
        ..MemberDoc::for_test(name, "alive")
    };
    let mut doc = StatusDoc {
        node: NodeRef {
            id: "id-a".into(),
            name: "a".into(),
        },
        chief: None,
        term: None,
        members: vec![member("a", vec![gpu(0), gpu(1)]), member("b", Vec::new())],
        jobs: Vec::new(),
        counters: Counters::default(),
        control_fault: None,
        insecure: false,
        api_tls: None,
        summary: None,
        users: Vec::new(),
        seeds_never_reached: Vec::new(),
        python: None,
    };
    let text = doc.to_table();
    assert!(
        text.contains(
            "gpus:\n  a  0  H100  81559 MiB  GPU-test-0\n  a  1  H100  81559 MiB  GPU-test-1\n"
        ),
        "{text}"
    );
    let v = serde_json::to_value(&doc.members[0]).unwrap();
    assert_eq!(
        v["gpus"][1],
        serde_json::json!({"index": 1, "model": "H100", "memory_mb": 81559, "uuid": "GPU-test-1"})
    );
    doc.members[0].gpus.clear();
    assert!(!doc.to_table().contains("gpus:"));
}

#[test]
fn metrics_doc_lists_each_history() {
    let mut j = train_job("epochs = 1\n");
    validated_at(&mut j, &[3, 6]);
    let doc = MetricsDoc::of(&j);
    assert_eq!(doc.metrics["val_loss"], vec![(3, 0.5), (6, 0.5)]);
    let v = serde_json::to_value(&doc).unwrap();
    assert_eq!(v["metrics"]["val_loss"][1], serde_json::json!([6, 0.5]));
}

#[test]
fn watch_follows_a_searchs_trials_by_state_change_and_new_best() {
    let mut doc = job_doc(&train_job("epochs = 1\n"), 0, true);
    doc.search_metric = Some("acc".into());
    let trial =
        |id: u32, state: &str, metric: Option<f64>| crate::domain::search::leaderboard::TrialDoc {
            id,
            job: format!("j-{id}"),
            owner: "admin".into(),
            params: [("lr".to_string(), toml::Value::Float(0.1))].into(),
            state: state.into(),
            metric,
            resource: 1,
            promotions: 0,
            bracket: 0,
            node: "a".into(),
            note: String::new(),
        };
    let mut seen = TrialsSeen::default();
    doc.trials = vec![trial(0, "running", None)];
    assert_eq!(
        doc.trial_changes(&mut seen),
        ["trial 0 running on a [lr=0.1] (job j-0)"]
    );
    assert!(
        doc.trial_changes(&mut seen).is_empty(),
        "no change, no line"
    );
    doc.trials = vec![trial(0, "succeeded", Some(0.9)), trial(1, "running", None)];
    doc.best = Some(crate::domain::search::leaderboard::BestDoc {
        id: 0,
        params: doc.trials[0].params.clone(),
        metric: 0.9,
    });
    assert_eq!(
        doc.trial_changes(&mut seen),
        [
            "trial 0 succeeded on a acc=0.9000 at 1 [lr=0.1] (job j-0)",
            "trial 1 running on a [lr=0.1] (job j-1)",
            "best so far: trial 0 acc=0.9000",
        ]
    );
    let text = doc.to_text();
    assert!(text.contains("attempt    none yet of "), "{text}");
}

/// A job's document never shows its ring secret (the domain's tests check that each attempt
/// gets its own).
#[test]
fn the_job_doc_never_shows_the_ring_secret() {
    let (state, id) = crate::domain::state::ops::testing::running(2, 2);
    let job = &state.jobs[&id];
    assert!(!job.ring_secret.is_empty());
    let json = serde_json::to_string(&job_doc(job, 1, true)).unwrap();
    assert!(!json.contains(&job.ring_secret), "{json}");
}
