//! Real-process tests of the API against hostile clients and browsers (issue 22): foreign
//! `Origin` and `Host` headers are refused before anything else, an idle-connection flood
//! against a node with 1,024 descriptors leaves `/healthz` answering, slow-loris clients are
//! cut at the header timeout, the per-IP rate limit answers 429, and a largest search spec
//! is refused quickly without stalling the node or its cluster's Raft.
//!
//! Raw HTTP goes through plain sockets so the tests choose every header. Every wait polls
//! with a deadline; nodes are stopped by PID when the cluster is dropped.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    time::{Duration, Instant},
};

mod common;

use common::{exe, formed_cluster, POLL};
use ringleader::cli::local::LocalCluster;

/// Bound on cluster formation (a debug build on two cores is slow).
const FORM_WAIT: Duration = Duration::from_secs(120);
/// Bound on one raw request's connect, write and read.
const IO_WAIT: Duration = Duration::from_secs(5);
/// How long `/healthz` may take under attack: generous, the point is that it answers.
const HEALTHZ_WAIT: Duration = Duration::from_secs(5);

/// The status code and body of a raw HTTP/1.1 request to `addr` (the request is sent as
/// given, with `Connection: close` added).
fn raw(addr: &str, head: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr.parse().unwrap(), IO_WAIT)?;
    s.set_read_timeout(Some(IO_WAIT))?;
    s.set_write_timeout(Some(IO_WAIT))?;
    let text = format!(
        "{head}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(text.as_bytes())?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let code = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line in {answer:?}")))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

/// `Authorization: …\r\n` for node `i`'s token, or nothing.
fn auth(c: &LocalCluster, i: usize) -> String {
    match &c.nodes[i].token {
        Some(t) => format!("\r\nAuthorization: Bearer {t}"),
        None => String::new(),
    }
}

/// Milliseconds `/healthz` took on `addr`, or the error.
fn healthz(addr: &str) -> Result<u128, String> {
    let started = Instant::now();
    match raw(addr, &format!("GET /healthz HTTP/1.1\r\nHost: {addr}"), "") {
        Ok((200, body)) if body.trim() == "ok" => Ok(started.elapsed().as_millis()),
        other => Err(format!("{other:?}")),
    }
}

/// Starts one node with `extra` flags and waits until its API answers.
fn one_node(root: &Path, name: &str, extra: &[&str]) -> LocalCluster {
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    formed_cluster(root, name, 1, &extra, FORM_WAIT)
}

const COMMAND_JOB: &str =
    "name = \"hello\"\nkind = \"command\"\nworkers = 1\ncommand = [\"true\"]\n";

#[test]
fn foreign_origins_and_hosts_are_refused_and_the_nodes_own_pages_work() {
    let dir = tempfile::tempdir().unwrap();
    let c = one_node(dir.path(), "origin", &[]);
    let addr = c.nodes[0].info.api_addr.clone();
    let a = auth(&c, 0);

    // Phase 1: a page of another site POSTs text/plain (no preflight) with the token even.
    let (code, body) = raw(
        &addr,
        &format!(
            "POST /v1/jobs HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://evil.example\r\nContent-Type: text/plain{a}"
        ),
        COMMAND_JOB,
    )
    .unwrap();
    assert_eq!(code, 403, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        v["error"].as_str().unwrap().contains("evil.example"),
        "{body}"
    );
    assert_eq!(v["reason"], "origin");
    let jobs: Vec<serde_json::Value> = c.nodes[0].client().get("/v1/jobs").unwrap();
    assert!(jobs.is_empty(), "no job may appear: {jobs:?}");

    // Phase 2: a rebound DNS name reaches every path, the open ones included.
    for path in ["/healthz", "/", "/v1/status"] {
        let (code, body) = raw(
            &addr,
            &format!("GET {path} HTTP/1.1\r\nHost: evil.example{a}"),
            "",
        )
        .unwrap();
        assert_eq!(code, 403, "{path}: {body}");
        assert!(body.contains("evil.example"), "{path}: {body}");
    }
    let (code, _) = raw(&addr, "GET /healthz HTTP/1.0", "").unwrap();
    assert_eq!(code, 403, "a request without Host is refused");

    // Phase 3: the dashboard and same-origin calls work, by IP and by `localhost`.
    let port = addr.rsplit_once(':').unwrap().1;
    for host in [addr.clone(), format!("localhost:{port}")] {
        let (code, body) = raw(&addr, &format!("GET / HTTP/1.1\r\nHost: {host}"), "").unwrap();
        assert_eq!(code, 200, "{host}");
        assert!(
            body.contains("<html") || body.contains("<!doctype"),
            "{host}"
        );
        let (code, body) = raw(
            &addr,
            &format!(
                "POST /v1/jobs HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\nContent-Type: text/plain{a}"
            ),
            COMMAND_JOB,
        )
        .unwrap();
        assert_eq!(code, 200, "same-origin submit via {host}: {body}");
    }
    assert!(c.nodes[0].client().status().is_ok());
}

#[test]
fn api_host_names_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let c = one_node(dir.path(), "apihost", &["--api-host", "ring.example"]);
    let addr = c.nodes[0].info.api_addr.clone();
    let (code, body) = raw(&addr, "GET /healthz HTTP/1.1\r\nHost: ring.example", "").unwrap();
    assert_eq!((code, body.trim()), (200, "ok"));
    let (code, _) = raw(&addr, "GET /healthz HTTP/1.1\r\nHost: other.example", "").unwrap();
    assert_eq!(code, 403);
}

#[test]
fn an_idle_connection_flood_leaves_healthz_answering_under_1024_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    // The node runs under `ulimit -n 1024` (soft and hard: it cannot raise it).
    let wrapper = dir.path().join("ringleader-1024fds");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nulimit -n 1024 || exit 97\nexec {} \"$@\"\n",
            exe()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut c = LocalCluster::new(&wrapper, dir.path());
    c.start("flood0", &[]).unwrap();
    common::wait_formed(&c, 1, FORM_WAIT);
    let pid = c.nodes[0].pid().unwrap();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .to_owned();
    assert!(nofile.split_whitespace().any(|w| w == "1024"), "{nofile}");
    let addr = c.nodes[0].info.api_addr.clone();
    let target: std::net::SocketAddr = addr.parse().unwrap();

    // Phase 1: 1,100 idle connections from 127.0.0.2-6, 220 each (under the per-IP cap,
    // over the total one); they send nothing and stay open.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let flood: Vec<tokio::net::TcpStream> = rt.block_on(async {
        let mut out = Vec::new();
        for k in 0..1_100u32 {
            let source = std::net::SocketAddr::from(([127, 0, 0, 2 + (k / 220) as u8], 0));
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(source).unwrap();
            if let Ok(Ok(s)) = tokio::time::timeout(IO_WAIT, socket.connect(target)).await {
                out.push(s);
            }
        }
        out
    });
    assert!(flood.len() >= 1_000, "only {} connected", flood.len());

    // Phase 2: /healthz answers within its bound, again and again, while the flood holds.
    let mut took = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let started = Instant::now();
        let ms = healthz(&addr).unwrap_or_else(|e| panic!("healthz under flood: {e}"));
        assert!(started.elapsed() < HEALTHZ_WAIT, "{ms} ms");
        took.push(ms);
        std::thread::sleep(POLL);
    }
    took.sort_unstable();
    eprintln!(
        "api healthz_under_flood_ms_p99={}",
        took[(took.len() * 99 / 100).min(took.len() - 1)]
    );
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(fds < 1_000, "the node holds {fds} descriptors");
    assert!(ringleader::cli::local::process_alive(pid));
    drop(flood);
    assert!(c.nodes[0].client().status().is_ok());
}

#[test]
fn slow_loris_and_silent_connections_are_closed_at_their_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let c = one_node(
        dir.path(),
        "loris",
        &[
            "--api-header-read-timeout-ms",
            "1000",
            "--api-idle-timeout-ms",
            "1000",
        ],
    );
    let addr = c.nodes[0].info.api_addr.clone();
    // A client that dribbles header lines forever, and one that sends nothing.
    let mut loris = TcpStream::connect(&addr).unwrap();
    let mut silent = TcpStream::connect(&addr).unwrap();
    loris
        .write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n").as_bytes())
        .unwrap();
    let started = Instant::now();
    let bound = Duration::from_secs(4);
    let mut closed = false;
    while started.elapsed() < bound {
        if loris.write_all(b"X-Slow: 1\r\n").is_err() {
            closed = true;
            break;
        }
        loris.set_read_timeout(Some(POLL * 2)).unwrap();
        let mut buf = [0u8; 512];
        match loris.read(&mut buf) {
            Ok(_) => {
                closed = true;
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
    }
    assert!(closed, "the slow-loris connection stayed open {bound:?}");
    assert!(started.elapsed() >= Duration::from_millis(800));
    silent.set_read_timeout(Some(bound)).unwrap();
    let mut buf = [0u8; 16];
    let n = silent.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the silent connection is closed, not answered");
    assert!(started.elapsed() < bound + Duration::from_secs(1));
    assert!(healthz(&addr).is_ok());
}

#[test]
fn the_rate_limit_answers_429() {
    let dir = tempfile::tempdir().unwrap();
    let c = one_node(
        dir.path(),
        "rate",
        &["--api-requests-per-s", "2", "--api-requests-burst", "20"],
    );
    let addr = c.nodes[0].info.api_addr.clone();
    let mut codes = Vec::new();
    for _ in 0..100 {
        codes.push(raw(&addr, &format!("GET /healthz HTTP/1.1\r\nHost: {addr}"), "").unwrap());
    }
    let limited = codes.iter().filter(|(c, _)| *c == 429).count();
    assert!(limited >= 40, "{limited} of 100 limited");
    let (_, body) = codes.iter().find(|(c, _)| *c == 429).unwrap();
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert!(
        v["error"].as_str().unwrap().contains("too many requests"),
        "{body}"
    );
}

/// A search of `params` discrete parameters of `values` integers each, command trials.
fn wide_search(params: usize, values: usize) -> String {
    let list: Vec<String> = (0..values).map(|v| v.to_string()).collect();
    let list = list.join(",");
    let mut text = String::from(
        "name=\"wide\"\nkind=\"search\"\ncommand=[\"true\"]\n[search]\ntrial=\"command\"\nalgorithm=\"random\"\ntrials=1\nmetric=\"m\"\ndirection=\"max\"\n",
    );
    for p in 0..params {
        text.push_str(&format!(
            "[[search.params]]\nname=\"p{p}\"\ntype=\"discrete\"\nvalues=[{list}]\n"
        ));
    }
    text
}

#[test]
fn largest_search_specs_are_refused_quickly_without_stalling_the_cluster() {
    let spec = wide_search(64, 1_000);
    assert!(
        spec.len() < ringleader::domain::spec::SPEC_BYTES_MAX,
        "{} bytes",
        spec.len()
    );
    let dir = tempfile::tempdir().unwrap();
    let c = formed_cluster(dir.path(), "wide", 3, &[], FORM_WAIT);
    let follower = c
        .status(0)
        .ok()
        .and_then(|s| {
            let chief = s.chief?.name;
            (0..3).find(|&i| c.nodes[i].name != chief)
        })
        .unwrap();
    let term_before = c.status(0).unwrap().term;
    let addr = c.nodes[follower].info.api_addr.clone();

    // Four largest specs at once to a follower, /healthz polled meanwhile.
    let submits: Vec<_> = (0..4)
        .map(|_| {
            let client = c.nodes[follower].client();
            let spec = spec.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                (client.submit(&spec), started.elapsed())
            })
        })
        .collect();
    while !submits.iter().all(|t| t.is_finished()) {
        let started = Instant::now();
        healthz(&addr).unwrap_or_else(|e| panic!("healthz during submits: {e}"));
        assert!(started.elapsed() < HEALTHZ_WAIT);
        std::thread::sleep(POLL);
    }
    for t in submits {
        let (answer, took) = t.join().unwrap();
        let err = answer
            .expect_err("a 64 × 1,000 search is refused")
            .to_string();
        assert!(err.contains("search.params[10].values"), "{err}");
        assert!(took < Duration::from_secs(10), "refused after {took:?}");
    }

    // Under the cap (10 × 1,000 values), admitted in bounded time.
    let started = Instant::now();
    let id = c.nodes[follower]
        .client()
        .submit(&wide_search(10, 1_000))
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let _ = c.nodes[follower]
        .client()
        .post::<serde_json::Value>(&format!("/v1/jobs/{id}/cancel"), "");

    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        for i in 0..3 {
            assert_eq!(
                c.status(i).unwrap().term,
                term_before,
                "node {i}'s term moved"
            );
        }
        std::thread::sleep(POLL);
    }
}
