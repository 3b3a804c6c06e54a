//! A multi-source fetch across emulated hosts (network namespaces, `scripts/netns.sh`): two
//! holders whose uploads are capped at 200 Mbit/s each both serve a large share of the
//! chunks, and the receiver's copy is byte-identical. Needs root and `ip netns`; otherwise
//! it prints SKIPPED. Everything it starts is torn down by PID, even on failure.

mod common;

use std::time::{Duration, Instant};

use common::netns::{netns, usable, Hosts};
use serde_json::{json, Value};

const MIB: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(120);

/// Fetches `name` to host `i` and waits for the end; returns the final status.
fn fetch(hosts: &Hosts, i: usize, name: &str) -> Value {
    let c = hosts.client(i);
    let mut s: Value = c
        .post_json(&format!("/v1/datasets/{name}/get"), &json!({}))
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while s["state"] == "fetching" {
        assert!(Instant::now() < deadline, "fetch on n{i} too slow: {s:#}");
        std::thread::sleep(Duration::from_millis(100));
        s = c.get(&format!("/v1/datasets/{name}/get")).unwrap();
    }
    assert_eq!(s["state"], "done", "{s:#}\n{}", hosts.logs());
    s
}

#[test]
fn two_capped_holders_both_serve_a_fetch() {
    if !usable() {
        println!("SKIPPED: needs root and ip netns");
        return;
    }
    let hosts = Hosts::up(3, "datasets", |_| Vec::new());
    let all = [1, 2, 3];
    hosts.wait(&all, "formed", |s| {
        s.names_in("alive").len() == 3 && s.chief.is_some()
    });
    let src = hosts.dir.path().join("data.bin");
    let bytes: Vec<u8> = (0..40 * MIB)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &bytes).unwrap();
    let added: Value = hosts
        .client(1)
        .post_json(
            "/v1/datasets",
            &json!({ "name": "spread", "path": src.display().to_string() }),
        )
        .unwrap();
    let root = added["root"].as_str().unwrap().to_owned();
    fetch(&hosts, 2, "spread");
    // n3 must see both holders before it starts.
    let deadline = Instant::now() + WAIT;
    loop {
        let rows: Value = hosts.client(3).get("/v1/datasets").unwrap();
        if rows[0]["holders"] == json!(["n1", "n2"]) {
            break;
        }
        assert!(Instant::now() < deadline, "holders never seen: {rows:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
    for i in ["1", "2"] {
        netns(&["rate", i, "200mbit", "--egress"]);
    }
    let s = fetch(&hosts, 3, "spread");
    let got = std::fs::read(
        hosts
            .data_dir(3)
            .join("datasets")
            .join(&root)
            .join("files/data.bin"),
    )
    .unwrap();
    assert!(got == bytes, "the fetched copy differs");
    let sources = s["sources"].as_array().unwrap();
    let total = s["bytes"].as_u64().unwrap();
    assert_eq!(total, bytes.len() as u64);
    for name in ["n1", "n2"] {
        let part = sources
            .iter()
            .find(|x| x["name"] == name)
            .and_then(|x| x["bytes"].as_u64())
            .unwrap_or(0);
        assert!(
            part * 4 >= total,
            "{name} served {part} of {total} bytes: both capped holders should share the fetch\n{s:#}"
        );
    }
}
