//! Real-process tests of the API's TLS (issue 22): a node whose API speaks TLS (forced on
//! 127.0.0.1 with the hidden `--api-tls on`, as it is by default beyond loopback) answers
//! nothing in clear, serves the CLI that pins it by the fingerprint its `api.token`
//! carries, refuses a client that pins another key before any token is sent, and the token
//! crosses the wire encrypted only.
//!
//! Every wait polls with a deadline; the node is stopped by PID when the cluster is
//! dropped.

use std::{
    io::{Read, Write},
    net::{Shutdown, TcpListener, TcpStream},
    process::Command,
    sync::{Arc, Mutex},
    time::Duration,
};

mod common;

use common::{exe, fails, formed_cluster, ok};
use ringleader::{api::client::ApiClient, cluster::identity, security::tls};

/// Bound on cluster formation (a debug build on two cores is slow).
const FORM_WAIT: Duration = Duration::from_secs(120);
/// Bound on one raw connection's connect, write and read.
const IO_WAIT: Duration = Duration::from_secs(5);

/// A fingerprint of another cluster's key.
fn foreign_pin() -> tls::Fingerprint {
    let key = identity::parse_cluster_key(&identity::generate_cluster_key()).unwrap();
    tls::fingerprint(&key).unwrap()
}

/// A CLI command with only the environment given (none of the caller's `RINGLEADER_*`).
fn cli(env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(exe());
    for var in [
        "RINGLEADER_PEER",
        "RINGLEADER_TOKEN",
        "RINGLEADER_TOKEN_FILE",
        "RINGLEADER_TLS_SHA256",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd
}

/// Relays one connection from a port of its own to `target`, recording what the client
/// sends; returns the relay's address and the record (complete once the connection ends).
fn recording_relay(target: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let record = sent.clone();
    std::thread::spawn(move || {
        let Ok((mut client, _)) = listener.accept() else {
            return;
        };
        let Ok(mut server) = TcpStream::connect(&target) else {
            return;
        };
        let (mut client_r, mut server_w) =
            (client.try_clone().unwrap(), server.try_clone().unwrap());
        let up = std::thread::spawn(move || {
            let mut buf = [0u8; 16 * 1024];
            while let Ok(n @ 1..) = client_r.read(&mut buf) {
                record.lock().unwrap().extend_from_slice(&buf[..n]);
                if server_w.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = server_w.shutdown(Shutdown::Write);
        });
        let _ = std::io::copy(&mut server, &mut client);
        let _ = client.shutdown(Shutdown::Both);
        let _ = up.join();
    });
    (addr, sent)
}

#[test]
fn the_api_speaks_tls_pinned_by_the_token_file() {
    let root = tempfile::tempdir().unwrap();
    // Formation is polled through `LocalNode::client`, https with the node's pin: the
    // pinned client works.
    let c = formed_cluster(
        root.path(),
        "tls",
        1,
        &["--api-tls".to_string(), "on".to_string()],
        FORM_WAIT,
    );
    let node = &c.nodes[0];
    let addr = node.info.api_addr.clone();
    let token = node.token.clone().expect("a keyed node has a token");
    let token_file = node.dir.join("api.token");
    let pin = node
        .tls_pin
        .expect("every keyed node's api.token carries the fingerprint");
    assert_eq!(
        pin,
        tls::fingerprint(&identity::load_cluster_key(c.key_file()).unwrap()).unwrap(),
        "the fingerprint is derived from the cluster key"
    );

    // Phase 1: the CLI with the token file alone (it carries the pin) reads the status.
    let out = cli(&[
        ("RINGLEADER_PEER", format!("https://{addr}")),
        ("RINGLEADER_TOKEN_FILE", token_file.display().to_string()),
    ])
    .args(["status", "--json"])
    .output()
    .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&ok(out)).unwrap();
    assert_eq!(doc["api_tls"], pin.to_string(), "{doc}");

    // Phase 2: nothing is answered in clear: a plain request gets no HTTP answer.
    let mut s = TcpStream::connect_timeout(&addr.parse().unwrap(), IO_WAIT).unwrap();
    s.set_read_timeout(Some(IO_WAIT)).unwrap();
    s.write_all(
        format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert!(
        !answer.starts_with(b"HTTP/"),
        "a plain request was answered in clear: {:?}",
        String::from_utf8_lossy(&answer)
    );
    let err = fails(
        cli(&[
            ("RINGLEADER_PEER", format!("http://{addr}")),
            ("RINGLEADER_TOKEN_FILE", token_file.display().to_string()),
        ])
        .arg("status")
        .output()
        .unwrap(),
    );
    assert!(
        err.contains("cannot reach") || err.contains("speaks TLS"),
        "{err}"
    );

    // Phase 3: a client pinning another key is refused in the handshake.
    let wrong = foreign_pin();
    let err = ApiClient::new(&format!("https://{addr}"), Some(token.clone()))
        .with_tls_pin(Some(wrong))
        .status()
        .unwrap_err();
    assert!(format!("{err:#}").contains("not the pinned"), "{err:#}");
    let err = fails(
        cli(&[
            ("RINGLEADER_PEER", format!("https://{addr}")),
            ("RINGLEADER_TOKEN_FILE", token_file.display().to_string()),
            ("RINGLEADER_TLS_SHA256", wrong.to_string()),
        ])
        .arg("status")
        .output()
        .unwrap(),
    );
    assert!(err.contains("not the pinned"), "{err}");
    // And https without any pin is refused before connecting.
    let err = fails(
        cli(&[
            ("RINGLEADER_PEER", format!("https://{addr}")),
            ("RINGLEADER_TOKEN", token.clone()),
        ])
        .arg("status")
        .output()
        .unwrap(),
    );
    assert!(err.contains("RINGLEADER_TOKEN_FILE"), "{err}");

    // Phase 4: on the wire, the token is never in clear.
    let (relay, sent) = recording_relay(addr.clone());
    // The relay's port is not the API's, so the node may refuse the Host (403): the
    // request, token and all, was sent either way.
    let res = ApiClient::new(&format!("https://{relay}"), Some(token.clone()))
        .with_tls_pin(Some(pin))
        .status();
    if let Err(e) = &res {
        assert!(format!("{e:#}").contains("Host"), "not sent: {e:#}");
    }
    let sent = sent.lock().unwrap().clone();
    assert!(
        sent.first() == Some(&0x16),
        "the client's first byte opens a TLS handshake record"
    );
    assert!(
        !sent.windows(token.len()).any(|w| w == token.as_bytes()),
        "the token crossed the wire in clear"
    );
}
