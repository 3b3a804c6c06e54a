//! What a command job's ranks are given beside their command, with real node processes: a
//! spec submitted as JSON (`Content-Type: application/json`) runs as its TOML would; small
//! files riding in the spec (`[[files]]`) are written into every rank's working directory
//! before it starts, on every node; a shared dataset (`[data] dataset`) is fetched to each
//! rank's node first and named in `RINGLEADER_DATASET_DIR`; a bad JSON spec is refused
//! naming its field; a command trial gets its parameters as JSON (`RINGLEADER_PARAMS`) and
//! the resource its run is to reach (`RINGLEADER_TRIAL_RESOURCE`).

mod common;

use std::time::Duration;

use common::{formed_cluster, ok, post_json};

const FORM_WAIT: Duration = Duration::from_secs(60);
const RUN_WAIT: Duration = Duration::from_secs(120);

#[test]
fn a_json_spec_runs_a_script_it_carries_on_a_shared_dataset_on_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let c = formed_cluster(&dir.path().join("nodes"), "ci", 2, &[], FORM_WAIT);

    // Phase 1: a shared dataset, added on node 0 only.
    let data = dir.path().join("greeting");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("hello.txt"), "the dataset says hi\n").unwrap();
    ok(c.cli(0)
        .args(["dataset", "add", "greeting", data.to_str().unwrap()])
        .output()
        .unwrap());

    // Phase 2: a command job as JSON, its script and a binary file inside it, one rank on
    // each node (spread). The script fails (and with it the job) unless the files and the
    // dataset are where the contract says.
    let script = r#"set -e
test "$(cat lib/word.bin)" = "binary ok"
grep -q "the dataset says hi" "$RINGLEADER_DATASET_DIR/hello.txt"
test -f "$PWD/run.sh"
echo "rank $RANK ran in $PWD"
echo "ringleader-metric inputs_ok 1"
"#;
    let spec = serde_json::json!({
        "name": "inputs",
        "kind": "command",
        "workers": 2,
        "max_restarts": 0,
        "command": ["sh", "run.sh"],
        "data": {"dataset": "greeting"},
        "files": [
            {"path": "run.sh", "text": script},
            // "binary ok" in base64.
            {"path": "lib/word.bin", "base64": "YmluYXJ5IG9r"},
        ],
    });
    let (status, answer) = post_json(&c, 1, &spec.to_string());
    assert_eq!(status, 200, "{answer}");
    let id = answer["id"].as_str().unwrap().to_owned();
    let doc = common::wait_job(&c, 0, &id, "ended", RUN_WAIT, |d| {
        matches!(d.state.as_str(), "succeeded" | "failed" | "cancelled")
    });
    let logs = c.job_logs(&id);
    assert_eq!(doc.state, "succeeded", "{doc:#?}\n{logs:#?}");
    assert_eq!(doc.metrics.get("inputs_ok"), Some(&1.0), "{doc:#?}");
    assert_eq!(doc.ring.len(), 2, "{doc:#?}");
    assert_ne!(doc.ring[0], doc.ring[1], "one rank on each node: {doc:#?}");
    // Each node wrote the files into its rank's own directory, and the rank ran there.
    for node in &c.nodes {
        let generation = node.dir.join("jobs").join(&id).join("generation-1");
        let workers: Vec<_> = std::fs::read_dir(&generation)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        assert_eq!(workers.len(), 1, "{}: {workers:?}", node.dir.display());
        assert_eq!(
            std::fs::read_to_string(workers[0].join("run.sh")).unwrap(),
            script
        );
        assert_eq!(
            std::fs::read(workers[0].join("lib/word.bin")).unwrap(),
            b"binary ok"
        );
    }
    let ran: Vec<_> = logs
        .iter()
        .flat_map(|(_, text)| text.lines())
        .filter(|l| l.starts_with("rank "))
        .collect();
    assert_eq!(ran.len(), 2, "{logs:#?}");
    assert!(ran.iter().all(|l| l.contains("/worker-")), "{ran:?}");

    // Phase 3: bad JSON specs are refused naming their field (no line: the JSON's lines are
    // known only to its parser), or their line and column when the JSON itself is broken.
    let bad = serde_json::json!({
        "name": "bad", "kind": "command", "command": ["sh", "run.sh"],
        "files": [{"path": "../run.sh", "text": "true"}],
    });
    let (status, v) = post_json(&c, 0, &bad.to_string());
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["field"], "files[0].path", "{v}");
    assert_eq!(v["line"], serde_json::Value::Null, "{v}");
    assert!(v["error"].as_str().unwrap().contains("\"..\""), "{v}");
    let (status, v) = post_json(&c, 0, r#"{"name": "bad", "kind": "command", "wokers": 2}"#);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["field"], "wokers", "{v}");
    let (status, v) = post_json(&c, 0, "{\"name\": \"bad\",\n \"kind\": }");
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["line"], 2, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("invalid JSON at line 2 column"),
        "{v}"
    );

    // Phase 4: a grid search of command trials, its script in the spec: each trial prints
    // what it was given.
    let trial = "echo \"given $RINGLEADER_PARAMS to $RINGLEADER_TRIAL_RESOURCE\"\necho \"ringleader-metric acc 0.5 3\"\n";
    let search = serde_json::json!({
        "name": "given",
        "kind": "search",
        "command": ["sh", "trial.sh"],
        "files": [{"path": "trial.sh", "text": trial}],
        "search": {
            "trial": "command", "algorithm": "grid", "metric": "acc", "direction": "max",
            "max_resource": 3,
            "params": [
                {"name": "width", "type": "discrete", "values": [2, 4]},
                {"name": "opt", "type": "categorical", "values": ["adam"]},
            ],
        },
    });
    let (status, answer) = post_json(&c, 0, &search.to_string());
    assert_eq!(status, 200, "{answer}");
    let id = answer["id"].as_str().unwrap().to_owned();
    let doc = common::wait_job(&c, 0, &id, "ended", RUN_WAIT, |d| {
        matches!(d.state.as_str(), "succeeded" | "failed" | "cancelled")
    });
    assert_eq!(doc.state, "succeeded", "{doc:#?}");
    assert_eq!(doc.trials.len(), 2, "{doc:#?}");
    let mut given: Vec<String> = doc
        .trials
        .iter()
        .flat_map(|t| c.job_log_lines(&t.job, "given "))
        .collect();
    given.sort();
    assert_eq!(
        given,
        [
            r#"given {"opt":"adam","width":2} to 3"#,
            r#"given {"opt":"adam","width":4} to 3"#,
        ],
        "{doc:#?}"
    );
}
