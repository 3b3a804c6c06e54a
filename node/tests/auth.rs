//! Real-process tests of what operators see and how the API is secured: one node started
//! with `--token-file`; the CLI without the token, with a wrong one and with the right one;
//! `/healthz` open; `/metrics` in the Prometheus format (parsed by python3's
//! `prometheus_client` when it is installed, else that part says SKIPPED); a command job's
//! metric history at `/v1/jobs/{id}/metrics`.
//!
//! Waits poll with deadlines; the node is stopped by PID when its cluster is dropped.

use std::{
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

mod common;

use common::{exe, write_private};
use ringleader::cli::local::LocalCluster;

/// Bound on each wait (a debug build on two cores is slow).
const WAIT: Duration = Duration::from_secs(120);
/// Poll period.
const POLL: Duration = Duration::from_millis(100);
/// The token the test node wants.
const TOKEN: &str = "t0k-3n_for-the-test";

/// Runs the CLI against `peer` with `args`, `RINGLEADER_TOKEN` set to `token` (or unset).
fn cli(peer: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(exe());
    cmd.arg("--peer")
        .arg(peer)
        .args(args)
        .env_remove("RINGLEADER_TOKEN")
        .env_remove("RINGLEADER_PEER")
        .stdin(Stdio::null());
    if let Some(t) = token {
        cmd.env("RINGLEADER_TOKEN", t);
    }
    cmd.output().unwrap()
}

/// A plain HTTP GET: (status, content type, body).
fn get(url: &str, token: Option<&str>) -> (u16, String, String) {
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .new_agent();
    let mut req = agent.get(url);
    if let Some(t) = token {
        req = req.header("authorization", &format!("Bearer {t}"));
    }
    let mut resp = req.call().unwrap();
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let status = resp.status().as_u16();
    (status, ctype, resp.body_mut().read_to_string().unwrap())
}

/// Whether python3 can import `prometheus_client`.
fn prometheus_client() -> bool {
    Command::new("python3")
        .args(["-c", "import prometheus_client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Parses `text` with `prometheus_client`; returns the family names it found.
fn parse_with_prometheus_client(text: &str) -> Vec<String> {
    let script = "import sys\n\
        from prometheus_client.parser import text_string_to_metric_families\n\
        for f in text_string_to_metric_families(sys.stdin.read()):\n\
        \x20   for s in f.samples:\n\
        \x20       assert s.name.startswith('ringleader_'), s\n\
        \x20   print(f.name, f.type, len(f.samples))\n";
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client refused the exposition: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn a_node_with_a_token_file_wants_the_token_and_shows_its_metrics() {
    let root = tempfile::tempdir().unwrap();
    let token_file = root.path().join("api.token");
    write_private(&token_file, &format!("  {TOKEN}\n"));

    // Phase 1: a node that wants a token; the cluster's own clients send it.
    let mut c = LocalCluster::new(exe(), root.path().join("nodes"));
    c.token = Some(TOKEN.to_string());
    c.start(
        "a",
        &["--token-file".into(), token_file.display().to_string()],
    )
    .unwrap();
    c.wait_all(WAIT, "a chief", |s| s.chief.is_some()).unwrap();
    let api = c.nodes[0].info.api_addr.clone();

    // Phase 2: the CLI without a token, with a wrong one, with the right one.
    let out = cli(&api, None, &["status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("the node wants an API token: set RINGLEADER_TOKEN or pass --token-file"),
        "{err}"
    );
    let out = cli(&api, Some("not-the-token"), &["jobs"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("the API token was refused"), "{err}");
    let out = cli(&api, Some(TOKEN), &["status"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("chief  a"));

    // Phase 3: plain HTTP: /healthz is open, the rest answers 401 with a JSON reason.
    let (code, _, body) = get(&format!("http://{api}/healthz"), None);
    assert_eq!((code, body.as_str()), (200, "ok"));
    for path in ["/v1/status", "/metrics", "/v1/jobs"] {
        let (code, _, body) = get(&format!("http://{api}{path}"), None);
        assert_eq!(code, 401, "{path}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["reason"], "missing", "{path}: {body}");
        let (code, _, _) = get(&format!("http://{api}{path}"), Some("wrong"));
        assert_eq!(code, 401, "{path}");
    }

    // Phase 4: a command job's metrics, as history and in /metrics.
    let spec = root.path().join("metrics.toml");
    std::fs::write(
        &spec,
        "name = \"metrics-probe\"\nkind = \"command\"\nworkers = 1\n\
         command = [\"sh\", \"-c\", \"echo ringleader-metric loss 0.5 1; sleep 1; \
         echo ringleader-metric loss 0.25 2; echo ringleader-metric step 2; sleep 120\"]\n",
    )
    .unwrap();
    let out = cli(&api, Some(TOKEN), &["submit", spec.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let client = c.nodes[0].client();
    let deadline = Instant::now() + WAIT;
    let history = loop {
        let doc = client.job_metrics(&id).unwrap();
        match doc.metrics.get("loss") {
            Some(points) if points.last() == Some(&(2, 0.25)) => break points.clone(),
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "no loss history for {id}: {:?}",
            doc.metrics
        );
        std::thread::sleep(POLL);
    };
    assert_eq!(history, vec![(1, 0.5), (2, 0.25)]);
    let (code, _, body) = get(&format!("http://{api}/v1/jobs/{id}/metrics"), Some(TOKEN));
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["id"], id.as_str());
    assert_eq!(
        v["metrics"]["loss"].as_array().unwrap().last().unwrap(),
        &serde_json::json!([2, 0.25])
    );

    // Phase 5: /metrics with the token, in the Prometheus text format, with the running
    // job's series.
    let (code, ctype, text) = get(&format!("http://{api}/metrics"), Some(TOKEN));
    assert_eq!(code, 200);
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    assert!(
        text.contains("ringleader_members{state=\"alive\"} 1\n"),
        "{text}"
    );
    assert!(text.contains("ringleader_is_chief 1\n"), "{text}");
    assert!(
        text.contains("ringleader_jobs{state=\"running\",kind=\"command\"} 1\n"),
        "{text}"
    );
    let labels = format!("{{job_id=\"{id}\",job_name=\"metrics-probe\"}}");
    assert!(
        text.contains(&format!("ringleader_job_loss{labels} 0.25\n")),
        "{labels} in {text}"
    );
    assert!(
        text.contains(&format!("ringleader_job_step{labels} 2\n")),
        "{text}"
    );
    if prometheus_client() {
        let families = parse_with_prometheus_client(&text);
        for f in [
            "ringleader_members",
            "ringleader_raft_term",
            "ringleader_jobs",
            "ringleader_gossip_messages_in",
            "ringleader_job_loss",
        ] {
            assert!(families.iter().any(|n| n == f), "{f} not in {families:?}");
        }
    } else {
        eprintln!("SKIPPED: prometheus_client not installed; /metrics not parsed by it");
    }

    let out = cli(&api, Some(TOKEN), &["cancel", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Phase 6: the token never reaches the node's log.
    c.stop_all();
    let log = c.nodes[0].log();
    assert!(!log.contains(TOKEN), "the token is in the node's log");
    assert!(!log.contains("the API is open"), "{log}");
}
