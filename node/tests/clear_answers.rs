//! Clear answers where a user gets something wrong (issue 23, point 5): a rank whose program
//! is missing, a rank killed while its child holds the output pipe, `--peer` at the cluster
//! port, a bad spec's error as JSON, ports in use, and node logs without colour codes.

mod common;

use std::time::{Duration, Instant};

use common::{exe, fails, formed_cluster, wait_job, POLL};
use ringleader::cli::local::{process_alive, processes, LocalCluster};

const WAIT: Duration = Duration::from_secs(30);

/// `host:port` of a `/ip4/H/tcp/P` multiaddr.
fn host_port(multiaddr: &str) -> String {
    let parts: Vec<&str> = multiaddr.split('/').collect();
    assert!(parts.len() >= 5, "not an ip/tcp multiaddr: {multiaddr}");
    format!("{}:{}", parts[2], parts[4])
}

#[test]
fn a_missing_program_says_why_and_is_retried_on_another_node() {
    let root = tempfile::tempdir().unwrap();
    let c = formed_cluster(root.path(), "m", 2, &[], WAIT);

    // Phase 1: a command job whose program exists on no node, one restart allowed.
    let spec = "name = \"missing\"\nkind = \"command\"\nworkers = 1\nmax_restarts = 1\n\
                command = [\"/nonexistent/ringleader-no-such-program\", \"--flag\"]\n";
    let id = c.nodes[0].client().submit(spec).unwrap();
    let doc = wait_job(&c, 0, &id, "failed", WAIT, |d| d.state == "failed");

    // Phase 2: `job ID` says why, naming the program.
    let out = c.cli(0).args(["job", &id]).output().unwrap();
    let text = common::ok(out);
    assert!(
        text.contains("could not start") && text.contains("not found"),
        "`job {id}` does not say why: {text}"
    );

    // Phase 3: the rank's log says why too.
    let logs: String = c.job_logs(&id).into_iter().map(|(_, t)| t).collect();
    assert!(
        logs.contains("could not start") && logs.contains("ringleader-no-such-program"),
        "rank logs: {logs:?}"
    );

    // Phase 4: the retry went to the other node.
    let rings: Vec<&Vec<String>> = doc.history.iter().map(|g| &g.ring).collect();
    assert_eq!(rings.len(), 2, "two attempts: {:#?}", doc.history);
    assert_ne!(
        rings[0], rings[1],
        "the retry ran on the same node: {rings:?}"
    );

    // Node logs written to a file carry no colour codes.
    for node in &c.nodes {
        let log = node.log();
        assert!(!log.is_empty());
        assert!(!log.contains("\x1b["), "ANSI codes in {}", node.name);
    }
}

#[test]
fn a_killed_rank_whose_child_keeps_stdout_open_is_detected_promptly() {
    let root = tempfile::tempdir().unwrap();
    let c = formed_cluster(root.path(), "k", 1, &[], WAIT);
    // The rank (`sleep R`, exec'd by sh) leaves a child (`sleep R+1`) holding its stdout;
    // R is this run's own, so no process of another run is mistaken for them.
    let r = 100_000 + 2 * (std::process::id() % 100_000);
    let (rank_arg, child_arg) = (r.to_string(), (r + 1).to_string());
    let spec = format!(
        "name = \"holder\"\nkind = \"command\"\nworkers = 1\nmax_restarts = 0\n\
         command = [\"sh\", \"-c\", \"sleep {child_arg} & exec sleep {rank_arg}\"]\n"
    );
    let id = c.nodes[0].client().submit(&spec).unwrap();
    let find = |arg: &str| {
        processes()
            .into_iter()
            .find(|(_, a)| a.len() >= 2 && a[0] == "sleep" && a[1] == arg)
            .map(|(pid, _)| pid)
    };
    let deadline = Instant::now() + WAIT;
    let (rank, child) = loop {
        if let (Some(r), Some(c)) = (find(&rank_arg), find(&child_arg)) {
            break (r, c);
        }
        assert!(Instant::now() < deadline, "the rank never started");
        std::thread::sleep(POLL);
    };

    let killed = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rank as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let doc = wait_job(&c, 0, &id, "failed", Duration::from_secs(5), |d| {
        d.state == "failed"
    });
    assert_eq!(doc.exits.get(&0), Some(&137), "{doc:#?}");
    assert!(killed.elapsed() < Duration::from_secs(5));
    // The rank's group went with it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while process_alive(child) {
        assert!(
            Instant::now() < deadline,
            "the rank's child {child} outlived it"
        );
        std::thread::sleep(POLL);
    }
}

#[test]
fn peer_at_the_cluster_port_and_a_bad_spec_get_clear_answers() {
    let root = tempfile::tempdir().unwrap();
    let c = formed_cluster(root.path(), "p", 1, &[], WAIT);

    // `--peer` at the p2p port names the mistake.
    let p2p = host_port(&c.nodes[0].info.p2p_addrs[0]);
    let out = std::process::Command::new(exe())
        .args(["--peer", &p2p, "status"])
        .env_remove("RINGLEADER_PEER")
        .output()
        .unwrap();
    let err = fails(out);
    assert!(
        err.contains("is not a ringleader API") && err.contains("--api"),
        "{err}"
    );

    // A bad spec's error carries its field and line as JSON.
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build(),
    );
    let mut resp = agent
        .post(format!("http://{}/v1/jobs", c.nodes[0].info.api_addr))
        .header(
            "authorization",
            format!("Bearer {}", c.nodes[0].token.as_deref().unwrap()),
        )
        .header("content-type", "text/plain")
        .send("name = \"x\"\nkind = \"command\"\nwokers = 1\ncommand = [\"true\"]\n")
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: serde_json::Value = resp.body_mut().read_json().unwrap();
    assert_eq!(v["field"], "wokers", "{v}");
    assert_eq!(v["line"], 3, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("did you mean \"workers\""),
        "{v}"
    );

    // A bad page or filter of the bounded lists names its parameter; a good one is paged
    // and counted.
    let get = |path: &str| {
        let mut resp = agent
            .get(format!("http://{}{path}", c.nodes[0].info.api_addr))
            .header(
                "authorization",
                format!("Bearer {}", c.nodes[0].token.as_deref().unwrap()),
            )
            .call()
            .unwrap();
        let status = resp.status().as_u16();
        let v: serde_json::Value = resp.body_mut().read_json().unwrap();
        (status, v)
    };
    for (path, field) in [
        ("/v1/status?limit=0", "limit"),
        ("/v1/status?member_state=zombie", "member_state"),
        ("/v1/status?jobs_before=7", "jobs_before"),
        ("/v1/jobs?state=done", "state"),
        ("/v1/jobs?limit=10001", "limit"),
    ] {
        let (status, v) = get(path);
        assert_eq!(status, 400, "{path}: {v}");
        let error = v["error"].as_str().unwrap_or_default();
        assert!(error.starts_with(&format!("{field}: ")), "{path}: {v}");
    }
    let (status, v) = get("/v1/status?limit=1&member_state=alive");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["members"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v["summary"]["members_by_state"]["alive"], 1, "{v}");
    assert!(v["summary"]["members_next"].is_null(), "{v}");
    let (_, v) = get("/v1/status?members_after=p0");
    assert_eq!(v["members"].as_array().map(Vec::len), Some(0), "{v}");
    assert_eq!(v["summary"]["members_total"], 1, "{v}");
}

#[test]
fn a_port_in_use_stops_the_node_with_a_clear_error() {
    let root = tempfile::tempdir().unwrap();
    let mut c = LocalCluster::new(exe(), root.path());
    c.start("u0", &[]).unwrap();
    let listen = host_port(&c.nodes[0].info.p2p_addrs[0]);
    let api = c.nodes[0].info.api_addr.clone();
    for (name, flag, addr) in [("u1", "--listen", &listen), ("u2", "--api", &api)] {
        let err = c
            .start(name, &[flag.to_string(), addr.clone()])
            .expect_err("a second node on a port in use must not start");
        let err = format!("{err:#}");
        assert!(
            err.contains("already in use") && err.contains(flag),
            "{flag} {addr}: {err}"
        );
    }
    // The first node is unharmed.
    assert!(c.status(0).is_ok());
}
