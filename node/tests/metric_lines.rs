//! The node↔rank line protocol from the node's side (`docs/book/src/reference/protocol.md`): the
//! golden lines read by the node's parser, and real-process searches of command trials whose script
//! prints only `ringleader-metric` lines (an ASHA search gets metrics, a leaderboard and
//! early stopping) or nothing (the search ends failed, naming the metric).
//!
//! The trials are `sh` and `awk` one-liners: no python needed. Waits poll with deadlines;
//! every node is stopped by PID when its cluster is dropped.

use std::{path::Path, time::Duration};

mod common;

use common::ended;
use ringleader::{api::status::JobDoc, cli::local::LocalCluster};
use ringleader_protocol::{golden_lines, NodeLine, RankLine, GOLDEN_LINES_PATH};

/// Bound on each wait (a debug build on two cores is slow).
const WAIT: Duration = Duration::from_secs(180);

/// One cluster test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("rl-metric-lines-")
        .tempdir()
        .unwrap()
}

fn cluster(root: &Path) -> LocalCluster {
    common::formed_cluster(root, "m", 3, &["--cpus".to_string(), "2".to_string()], WAIT)
}

fn events(doc: &JobDoc) -> Vec<String> {
    doc.events
        .iter()
        .filter_map(|e| e["reason"].as_str().map(str::to_owned))
        .collect()
}

/// The golden file, read by path as the protocol doc names it (not compiled in): every
/// line is what its tag says to the node's parser.
#[test]
fn golden_lines_read_by_the_node() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(GOLDEN_LINES_PATH);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut n = 0;
    for g in golden_lines(&text) {
        match g.tag {
            "rank-ok" => {
                let line: RankLine = g.line.parse().unwrap_or_else(|e| panic!("{g:?}: {e}"));
                assert_eq!(line.to_string(), g.line);
                assert!(matches!(
                    ringleader::jobs::process::read_line(g.line),
                    ringleader::jobs::process::Read::Line(_)
                ));
            }
            "rank-bad" => assert!(matches!(
                ringleader::jobs::process::read_line(g.line),
                ringleader::jobs::process::Read::Malformed(_)
            )),
            "node-ok" => {
                let line: NodeLine = g.line.parse().unwrap_or_else(|e| panic!("{g:?}: {e}"));
                assert_eq!(line.to_string(), g.line);
            }
            "node-bad" => assert!(g.line.parse::<NodeLine>().is_err(), "{g:?}"),
            other => panic!("unknown tag {other:?}"),
        }
        n += 1;
    }
    assert!(n > 20, "{n} golden lines");
}

/// A command trial printing `ringleader-metric val_accuracy V EPOCH` for 6 epochs, its
/// accuracy best at lr = 0.01 (what `examples/search/trial.py` computes, in awk).
const METRIC_SCRIPT: &str = r#"awk 'BEGIN { lr = ENVIRON["RINGLEADER_PARAM_LR"] + 0; c = 0.98 - 0.08 * (log(lr) / log(10) + 2) ^ 2; for (e = 1; e <= 6; e++) { system("sleep 0.1"); printf "ringleader-metric val_accuracy %.6f %d\n", c * (1 - exp(-e / 3)), e; printf "ringleader-metric loss %.6f %d\n", 1 - c, e * 10; fflush() } }'"#;

fn search(name: &str, algorithm: &str, trials: u32, script: &str, extra: &str) -> String {
    let script = script.replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        r#"
name = "{name}"
kind = "search"
command = ["sh", "-c", "{script}", "trial"]
[search]
trial = "command"
algorithm = "{algorithm}"
trials = {trials}
metric = "val_accuracy"
direction = "max"
seed = 3
{extra}
[[search.params]]
name = "lr"
type = "double"
min = 0.0001
max = 1.0
scale = "log"
"#
    )
}

#[test]
fn asha_search_of_a_script_printing_only_metric_lines() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch();
    let c = cluster(root.path());
    let spec = search(
        "asha-metric-lines",
        "asha",
        9,
        METRIC_SCRIPT,
        "max_parallel = 3\nmin_resource = 1\nmax_resource = 6\nreduction_factor = 3",
    );
    let id = c.nodes[0].client().submit(&spec).unwrap();
    let done = common::wait_job(&c, 1, &id, "search ended", WAIT, ended);
    assert_eq!(done.state, "succeeded", "{done:#?}");
    assert_eq!(done.trials.len(), 9, "{done:#?}");
    assert!(done.best.is_some(), "{done:#?}");
    // Every trial reported (its metric), and ASHA stopped some before the last rung.
    assert!(
        done.trials.iter().all(|t| t.metric.is_some()),
        "{:#?}",
        done.trials
    );
    let short = done.trials.iter().filter(|t| t.resource < 6).count();
    assert!(short > 0, "no trial stopped early: {:#?}", done.trials);
    assert!(
        done.trials.iter().any(|t| t.resource == 6),
        "{:#?}",
        done.trials
    );
    // A trial's job has the lines as job metrics.
    let job = &done.trials.iter().find(|t| t.resource == 6).unwrap().job;
    let trial = common::wait_job(&c, 0, job, "trial metrics", WAIT, |d| {
        d.metrics.contains_key("val_accuracy")
    });
    assert!(trial.metrics.contains_key("loss"), "{:#?}", trial.metrics);

    // The leaderboard, best first.
    let out = c.cli(0).args(["--json", "trials", &id]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let board: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = board["trials"].as_array().unwrap();
    assert_eq!(rows.len(), 9);
    assert_eq!(rows[0]["id"], board["best"]["id"]);
    let metrics: Vec<f64> = rows.iter().filter_map(|r| r["metric"].as_f64()).collect();
    assert!(metrics.windows(2).all(|w| w[0] >= w[1]), "{metrics:?}");
}

#[test]
fn a_search_whose_trials_print_nothing_fails_naming_the_metric() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch();
    let c = cluster(root.path());
    let spec = search(
        "silent",
        "random",
        2,
        "echo training; echo 'ringleader-metric val_accuracy soon'",
        "",
    );
    let id = c.nodes[0].client().submit(&spec).unwrap();
    let done = common::wait_job(&c, 1, &id, "search ended", WAIT, ended);
    assert_eq!(done.state, "failed", "{done:#?}");
    let events = events(&done);
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("no trial reported val_accuracy")),
        "{events:#?}"
    );
    for t in 0..2 {
        assert!(
            events
                .iter()
                .any(|e| e.contains(&format!("trial {t} never printed val_accuracy"))),
            "{events:#?}"
        );
    }
}
