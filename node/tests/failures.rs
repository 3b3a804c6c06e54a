//! A failed job says why (issue 51, point 7): the failing rank's exit status and the last
//! lines of its stderr in `job`, `job --json` and the API's document; a failure that
//! repeats identically on the retry stops the retries; a spec naming a dataset the cluster
//! has not is refused at submit, naming the field.

mod common;

use std::time::Duration;

use common::{formed_cluster, ok, post_json, wait_job};

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn a_failing_rank_says_why_and_the_same_failure_twice_is_not_retried_again() {
    let root = tempfile::tempdir().unwrap();
    let c = formed_cluster(root.path(), "f", 1, &[], WAIT);

    // Phase 1: a rank that fails the same way every time, five restarts allowed.
    let spec = "name = \"boom\"\nkind = \"command\"\nworkers = 1\nmax_restarts = 5\n\
                command = [\"sh\", \"-c\", \"echo starting >&2; echo boom >&2; exit 3\"]\n";
    let id = c.nodes[0].client().submit(spec).unwrap();
    let doc = wait_job(&c, 0, &id, "failed", WAIT, |d| d.state == "failed");

    // Phase 2: two runs (the first and its identical retry), not six.
    assert_eq!(doc.attempt, 2, "{doc:#?}");
    let failed = doc.events.last().unwrap()["reason"].as_str().unwrap();
    assert!(
        failed.ends_with("not retried: the same failure twice (exit 3: boom)"),
        "{failed}"
    );

    // Phase 3: `job --json` holds the exit status and the stderr tail.
    let out = c.cli(0).args(["job", &id, "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_str(&ok(out)).unwrap();
    let failure = &v["failure"];
    assert_eq!(failure["exit_code"], 3, "{v:#}");
    assert_eq!(failure["attempt"], 2, "{v:#}");
    assert_eq!(
        failure["stderr_tail"],
        serde_json::json!(["starting", "boom"]),
        "{v:#}"
    );
    let cause = failure["cause"].as_str().unwrap();
    assert!(
        cause.starts_with("rank 0 on f0") && cause.ends_with("exit 3: boom"),
        "{cause}"
    );

    // Phase 4: `job ID` prints the cause and the tail.
    let text = ok(c.cli(0).args(["job", &id]).output().unwrap());
    assert!(text.contains(&format!("failed     {cause}")), "{text}");
    assert!(text.contains("  starting\n  boom\n"), "{text}");

    // Phase 5: a spec naming a dataset the cluster has not is refused, naming the field.
    let bad = serde_json::json!({
        "name": "no-data", "kind": "command", "command": ["true"],
        "data": {"dataset": "nope"},
    });
    let (status, v) = post_json(&c, 0, &bad.to_string());
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["field"], "data.dataset", "{v}");
    let error = v["error"].as_str().unwrap();
    assert!(
        error.contains("no dataset \"nope\" in the cluster (datasets: none yet"),
        "{error}"
    );
}
