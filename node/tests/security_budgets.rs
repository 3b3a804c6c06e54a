//! The review's attacks on the API's budgets (issue 47, M1 and point 6's API half) as
//! real-process tests:
//!
//! - M1: 24 tokenless connections each sending a 60 MiB checkpoint upload at once. Before,
//!   each body was read into memory before its token was looked at (41 MB → 1,485 MB);
//!   now each is answered 401 on its headers and the node's peak resident memory grows by
//!   far less than the bytes sent.
//!
//! - Point 6: the per-IP rate is bypassed with several loopback source addresses; the node's
//!   own budget caps all of them together (429, "all peers together").
//!
//! - Point 6: no quota on spec bytes (100 submits put 23 MB in every node's log): a user's
//!   submits (a made token's) stop at 8 MiB of specs in the state with 429 naming the limit;
//!   the admin's go on (the per-user pending-jobs limit: `security_owners.rs`).
//!
//! Waits are bounded by socket timeouts and deadlines.

mod common;

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

const WAIT: Duration = Duration::from_secs(60);
/// Uploads at once, and each one's size (the review's).
const UPLOADS: usize = 24;
const UPLOAD_BYTES: usize = 60 << 20;
/// Most the node's peak resident memory may grow by while they run.
const GROWTH_MAX_BYTES: u64 = 64 << 20;
/// Longest one socket read or write may block.
const IO_TIMEOUT: Duration = Duration::from_secs(15);

/// A field of `/proc/PID/status` in bytes (`VmRSS`, `VmHWM`).
fn vm_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// One upload: the head, then (whatever the answer) the whole body, as an attacker sends
/// it. Returns the answer's status line and the body bytes the node let through before it
/// closed the connection.
fn upload(api: &str, auth: Option<&str>) -> (String, usize) {
    let mut s = TcpStream::connect(api).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    let auth = auth.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let head = format!(
        "PUT /v1/checkpoints/job/j-1/state HTTP/1.1\r\nhost: {api}\r\n{auth}content-length: {UPLOAD_BYTES}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    // The answer comes on the head alone.
    let mut answer = [0u8; 512];
    let n = s.read(&mut answer).unwrap_or(0);
    let status = String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    let chunk = vec![0u8; 1 << 20];
    let mut sent = 0;
    while sent < UPLOAD_BYTES {
        match s.write(&chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => sent += n,
        }
    }
    (status, sent)
}

#[test]
fn tokenless_uploads_are_refused_on_their_headers_without_the_node_growing() {
    let dir = tempfile::tempdir().unwrap();
    let c = common::formed_cluster(&dir.path().join("nodes"), "bu", 1, &[], WAIT);
    let pid = c.nodes[0].pid().expect("the node runs");
    let api = c.nodes[0].info.api_addr.clone();
    let (rss_before, hwm_before) = (vm_bytes(pid, "VmRSS:"), vm_bytes(pid, "VmHWM:"));

    // Phase 1: 24 uploads of 60 MiB at once, no token, or a made-up one.
    let answers: Vec<(String, usize)> = std::thread::scope(|s| {
        let uploads: Vec<_> = (0..UPLOADS)
            .map(|i| {
                let api = api.as_str();
                let token = (i % 2 == 1).then_some("j-1.1.".to_string() + &"ab".repeat(32));
                s.spawn(move || upload(api, token.as_deref()))
            })
            .collect();
        uploads.into_iter().map(|u| u.join().unwrap()).collect()
    });

    // Phase 2: each was refused on its head; the node's peak memory grew by a buffer per
    // upload at most, not by what was sent.
    for (i, (status, _)) in answers.iter().enumerate() {
        let want = if i % 2 == 1 { "403" } else { "401" };
        assert!(
            status.starts_with("HTTP/1.1 ") && status.contains(want),
            "upload {i}: {status:?}"
        );
    }
    let sent: usize = answers.iter().map(|a| a.1).sum();
    let (rss_after, hwm_after) = (vm_bytes(pid, "VmRSS:"), vm_bytes(pid, "VmHWM:"));
    eprintln!(
        "{UPLOADS} uploads: {} MiB written by the clients; node RSS {} -> {} MiB, peak {} -> {} MiB",
        sent >> 20,
        rss_before >> 20,
        rss_after >> 20,
        hwm_before >> 20,
        hwm_after >> 20
    );
    assert!(
        hwm_after < hwm_before + GROWTH_MAX_BYTES,
        "the node's peak memory grew from {hwm_before} to {hwm_after} bytes"
    );
    // The node still answers.
    assert!(c.nodes[0].client().status().is_ok());
}

/// One `GET /healthz` from source address `from`: the status line.
fn get_from(rt: &tokio::runtime::Runtime, from: &str, api: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
        let mut s = socket.connect(api.parse().unwrap()).await.unwrap();
        let req = format!("GET /healthz HTTP/1.1\r\nhost: {api}\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(IO_TIMEOUT, s.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer).into_owned()
    })
}

#[test]
fn many_loopback_addresses_share_the_nodes_own_budget() {
    let dir = tempfile::tempdir().unwrap();
    // Each IP may make 1,000 at once; the node 40 in all.
    let extra: Vec<String> = [
        "--api-requests-total-per-s",
        "1",
        "--api-requests-total-burst",
        "40",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let c = common::formed_cluster(&dir.path().join("nodes"), "bb", 1, &extra, WAIT);
    let api = c.nodes[0].info.api_addr.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // 8 addresses x 20 requests: each far under its own budget, twice the node's together
    // (less what the cluster's own polling took).
    let mut answers = Vec::new();
    for _ in 0..20 {
        for ip in 2..10 {
            answers.push(get_from(&rt, &format!("127.0.0.{ip}"), &api));
        }
    }
    let ok = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 200"))
        .count();
    let refused: Vec<&String> = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 429"))
        .collect();
    eprintln!(
        "{} requests from 8 addresses: {ok} answered, {} refused",
        answers.len(),
        refused.len()
    );
    assert!(
        ok <= 41,
        "the node answered {ok} of its budget of 40 (one refill)"
    );
    assert!(refused.len() >= answers.len() - 41, "{answers:#?}");
    assert!(
        refused.iter().all(|a| a.contains("all peers together")),
        "{refused:#?}"
    );
}

#[test]
fn a_made_tokens_spec_bytes_are_capped_and_the_refusal_names_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let c = common::formed_cluster(&dir.path().join("nodes"), "bq", 1, &[], WAIT);
    let token = common::ok(
        c.cli(0)
            .args(["token", "create", "quota"])
            .output()
            .unwrap(),
    )
    .trim()
    .to_owned();
    let user = ringleader::api::client::ApiClient::new(&c.nodes[0].info.api_addr, Some(token));
    // Specs of about 250 KB each as the log holds them (an environment variable pads them;
    // a comment would not: the log holds the parsed spec): 8 MiB holds 33 of them.
    let pad = "x".repeat(250_000);
    let spec = |i: usize| {
        format!(
            "name = \"q{i}\"\nkind = \"command\"\ncommand = [\"true\"]\n[env]\nPAD = \"{pad}\"\n"
        )
    };
    // Bounded: at most 41 submits.
    let (mut n, mut refusal) = (0, String::new());
    while n <= 40 {
        match user.submit(&spec(n)) {
            Ok(_) => n += 1,
            Err(e) => {
                refusal = e.to_string();
                break;
            }
        }
    }
    eprintln!("{n} specs accepted, then: {refusal}");
    assert!(
        (30..=34).contains(&n),
        "{n} specs of 250 KB accepted: {refusal}"
    );
    assert!(
        refusal.contains("429") || refusal.contains("bytes of specs"),
        "{refusal}"
    );
    assert!(refusal.contains("at most 8388608"), "{refusal}");
    // The admin token is the operator's: not limited.
    assert!(c.nodes[0].client().submit(&spec(99)).is_ok());
}
