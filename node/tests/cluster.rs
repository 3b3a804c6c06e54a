//! Real-process tests: `ringleader node` processes on 127.0.0.1, each with its own ports and
//! data directory. Every wait is a poll with a deadline; every process is stopped by PID when
//! the test's cluster is dropped.

mod common;

use std::time::Duration;

use common::exe;
use ringleader::{api::status::StatusDoc, cli::local::LocalCluster};

const WAIT: Duration = Duration::from_secs(30);

fn cluster() -> (LocalCluster, tempfile::TempDir) {
    let root = tempfile::Builder::new()
        .prefix("rl-test-")
        .tempdir()
        .unwrap();
    (LocalCluster::new(exe(), root.path()), root)
}

fn state_of(s: &StatusDoc, name: &str) -> Option<String> {
    s.members
        .iter()
        .find(|m| m.name == name)
        .map(|m| m.state.clone())
}

#[test]
fn five_nodes_join_detect_death_and_rejoin_with_same_id() {
    let (mut c, _root) = cluster();
    c.start("n0", &[]).unwrap();
    for i in 1..5 {
        c.start_joining(&format!("n{i}"), &[]).unwrap();
    }
    c.wait_all(WAIT, "5 alive everywhere", |s| {
        s.names_in("alive").len() == 5
    })
    .unwrap();

    // Phase: kill -9 one node; every survivor marks it dead.
    let victim = 3;
    let id_before = c.nodes[victim].info.id.clone();
    c.kill9(victim).unwrap();
    c.wait_all(WAIT, "n3 dead everywhere", |s| {
        state_of(s, "n3").as_deref() == Some("dead")
    })
    .unwrap();

    // Phase: restart it with its data dir; it is alive everywhere again, with the same id.
    c.restart(victim).unwrap();
    assert_eq!(
        c.nodes[victim].info.id, id_before,
        "peer id must survive a restart"
    );
    c.wait_all(WAIT, "5 alive after restart", |s| {
        s.names_in("alive").len() == 5
            && s.members
                .iter()
                .any(|m| m.id == id_before && m.state == "alive")
    })
    .unwrap();
    let s = c.status(0).unwrap();
    let n3: Vec<_> = s.members.iter().filter(|m| m.name == "n3").collect();
    assert_eq!(n3.len(), 1, "one member entry per peer id: {n3:?}");
    assert!(
        n3[0].incarnation > 0,
        "a rejoin refutes with a higher incarnation"
    );
}

#[test]
fn graceful_leave_is_seen_as_left() {
    let (mut c, _root) = cluster();
    c.start("a", &[]).unwrap();
    c.start_joining("b", &[]).unwrap();
    // c joins by DNS name (`localhost:PORT`), which the transport resolves.
    let port = c.seed_of(0).rsplit('/').next().unwrap().to_string();
    c.start("c", &["--join".to_string(), format!("localhost:{port}")])
        .unwrap();
    c.wait_all(WAIT, "3 alive", |s| s.names_in("alive").len() == 3)
        .unwrap();
    let status = c.terminate(2).unwrap();
    assert!(status.success(), "SIGTERM exits cleanly: {status}");
    // `left` well before any failure-detection timeout could have said `dead`.
    c.wait_all(Duration::from_secs(3), "c left", |s| {
        state_of(s, "c").as_deref() == Some("left")
    })
    .unwrap();
}

#[test]
fn a_node_with_another_cluster_key_is_never_admitted() {
    let (mut c, root) = cluster();
    let key_a = root.path().join("a.key");
    let key_b = root.path().join("b.key");
    for k in [&key_a, &key_b] {
        let text = ringleader::cluster::identity::generate_cluster_key();
        ringleader::security::modes::write_private(k, text.as_bytes()).unwrap();
    }
    let with = |k: &std::path::Path| vec!["--cluster-key".to_string(), k.display().to_string()];
    c.start("k0", &with(&key_a)).unwrap();
    c.start_joining("k1", &with(&key_a)).unwrap();
    c.wait_all(WAIT, "keyed pair formed", |s| {
        s.names_in("alive").len() == 2
    })
    .unwrap();

    let stranger = c.start_joining("stranger", &with(&key_b)).unwrap();
    let open = c
        .start_joining("open", &["--insecure".to_string()])
        .unwrap();
    // Wait until both outsiders have demonstrably tried (and failed) to reach the seed, and
    // the seed has refused handshakes, then check nobody admitted anybody.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let s = c.status(stranger).unwrap();
        let o = c.status(open).unwrap();
        let seed = c.status(0).unwrap();
        if s.counters.seed_dial_failures >= 2
            && o.counters.seed_dial_failures >= 2
            && seed.counters.refused_connections >= 2
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "outsiders never tried: {s:?} {o:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for i in [0, 1] {
        let s = c.status(i).unwrap();
        assert_eq!(
            s.names_in("alive"),
            vec!["k0", "k1"],
            "keyed node {i} admitted an outsider: {s:?}"
        );
    }
    assert_eq!(c.status(stranger).unwrap().members.len(), 1);
    assert_eq!(c.status(open).unwrap().members.len(), 1);
    let log = c.nodes[open].log();
    assert!(
        log.contains("the cluster is open"),
        "a node without a key warns: {log}"
    );
    // Both sides of a refused handshake say so at the default level (warn), not only in a
    // counter: the seed that refused, and the outsider whose dial failed.
    let read = |i: usize| c.nodes[i].log();
    let seed_log = read(0);
    assert!(
        seed_log.contains("WARN") && seed_log.contains("incoming connection refused"),
        "the seed does not warn: {seed_log}"
    );
    for i in [stranger, open] {
        let log = read(i);
        assert!(
            log.contains("WARN") && log.contains("seed unreachable"),
            "node {i} does not warn: {log}"
        );
    }
}

/// Membership's datagrams on a keyed cluster's port: one sealed with another key, one
/// unsealed (as an `--insecure` node sends), random bytes and an oversized datagram are each
/// refused, counted and warned about, and admit nobody; the same gossip sealed with the
/// cluster's key is heard (so the refusals are the key's doing).
#[test]
fn datagrams_without_the_cluster_key_are_refused_and_admit_nobody() {
    use ringleader::cluster::{
        claim_keys,
        datagrams::{advertised_addrs, Seal},
        identity::{generate_cluster_key, parse_cluster_key},
        membership::{Claim, Message, State, Update},
        meta::NodeMeta,
        wire,
    };
    let (mut c, root) = cluster();
    c.start("k0", &[]).unwrap();
    c.start_joining("k1", &[]).unwrap();
    c.wait_all(WAIT, "pair formed", |s| s.names_in("alive").len() == 2)
        .unwrap();
    let to = advertised_addrs(&c.nodes[0].info.p2p_addrs)[0];

    // Gossip that a member "ghost" is alive, from "ghost" itself, signed with its identity.
    let ghost_key = libp2p::identity::Keypair::generate_ed25519();
    let ghost = ghost_key.public().to_peer_id();
    let meta = common::member_meta("ghost", "127.0.0.1:9");
    let mut alive = Update {
        id: ghost,
        incarnation: 1,
        state: State::Alive,
        meta,
        meta_version: 1,
        from: None,
        sig: Vec::new(),
    };
    alive.sig = claim_keys::sign(&ghost_key, &Claim::of(&alive));
    let gossip: Message<libp2p::PeerId, NodeMeta> = Message::Gossip {
        updates: vec![alive],
    };
    let frame = wire::encode(&gossip).unwrap();
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let foreign = parse_cluster_key(&generate_cluster_key()).unwrap();
    let mut hostile = vec![
        Seal::new(Some(&foreign), &ghost).seal(&frame),
        Seal::new(None, &ghost).seal(&frame),
        vec![0u8; 60_000],
    ];
    hostile.extend((0..20u8).map(|i| vec![i.wrapping_mul(37); usize::from(i) * 13]));
    for d in &hostile {
        socket.send_to(d, to).unwrap();
    }
    let refused = common::poll_until(
        WAIT,
        || c.status(0).unwrap().counters.refused_datagrams,
        |&n| n >= hostile.len() as u64,
    );
    if let Err(n) = refused {
        panic!("{n} of {} refused", hostile.len());
    }
    for i in [0, 1] {
        let s = c.status(i).unwrap();
        assert_eq!(s.names_in("alive"), vec!["k0", "k1"], "node {i}: {s:?}");
        assert!(
            s.members.iter().all(|m| m.name != "ghost"),
            "node {i} heard the ghost"
        );
    }
    let log = c.nodes[0].log();
    assert!(
        log.contains("WARN") && log.contains("membership datagram refused"),
        "k0 does not warn: {log}"
    );

    // The same gossip sealed with the cluster's key is heard.
    let key_file = root
        .path()
        .join(ringleader::security::bootstrap::CLUSTER_KEY_FILE);
    let key = parse_cluster_key(&std::fs::read_to_string(key_file).unwrap()).unwrap();
    socket
        .send_to(&Seal::new(Some(&key), &ghost).seal(&frame), to)
        .unwrap();
    c.wait_all(WAIT, "the ghost heard", |s| {
        s.members.iter().any(|m| m.name == "ghost")
    })
    .unwrap();
}

#[test]
fn a_seed_that_is_down_is_retried_until_it_comes_up() {
    let (mut c, _root) = cluster();
    c.start("early", &[]).unwrap();
    let seed_addr = c.seed_of(0);
    c.kill9(0).unwrap();
    // The joiner starts while its seed is down and keeps running.
    let j = c
        .start("joiner", &["--join".to_string(), seed_addr.clone()])
        .unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while c.status(j).unwrap().counters.seed_dial_failures < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "joiner never retried its seed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its status names the seed it never reached, in the document and the table.
    let down = c.status(j).unwrap();
    assert_eq!(down.seeds_never_reached, [seed_addr], "{down:?}");
    assert!(
        down.to_table().contains("seeds never reached: "),
        "{}",
        down.to_table()
    );
    // The seed comes back on the same address (same data dir, same port) and the two meet.
    let port = c.nodes[0].info.p2p_addrs[0]
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();
    c.nodes[0]
        .args
        .extend(["--listen".to_string(), format!("127.0.0.1:{port}")]);
    c.restart(0).unwrap();
    c.wait_all(WAIT, "joined after seed came up", |s| {
        s.names_in("alive").len() == 2
    })
    .unwrap();
    let joined = c.status(j).unwrap();
    assert!(joined.seeds_never_reached.is_empty(), "{joined:?}");
}

#[test]
fn bad_flags_and_unreachable_nodes_are_clear_errors() {
    let run = |args: &[&str]| {
        std::process::Command::new(exe())
            .args(args)
            .output()
            .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = run(&["node", "--data-dir", d, "--join", "not-an-address"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--join") && err.contains("not-an-address"),
        "{err}"
    );

    let out = run(&["node", "--data-dir", d, "--listen", "999.1.1.1:7070"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--listen"));

    // Nothing listens on port 1: one line naming the address, non-zero exit.
    let out = run(&["status", "--peer", "127.0.0.1:1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("127.0.0.1:1"), "{err}");
}

#[test]
fn status_json_has_the_contract_fields() {
    let (mut c, _root) = cluster();
    c.start("solo", &[]).unwrap();
    let out = c.cli(0).args(["status", "--json"]).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["node"]["name"], "solo");
    assert!(v["node"]["id"].as_str().unwrap().starts_with("12D3Koo"));
    assert!(v.get("chief").is_some() && v.get("term").is_some());
    let m = &v["members"][0];
    for field in [
        "id",
        "name",
        "state",
        "voter",
        "blacklisted",
        "cpus",
        "gpus",
    ] {
        assert!(m.get(field).is_some(), "member lacks {field}: {m}");
    }
    assert_eq!(m["state"], "alive");
    assert!(v["jobs"].is_array());
    let table = c.cli(0).args(["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("NAME") && text.contains("solo") && text.contains("alive"),
        "{text}"
    );
}

#[test]
fn a_second_node_on_a_data_dir_in_use_stops_naming_the_holder() {
    let (mut c, _root) = cluster();
    c.start("holder", &[]).unwrap();
    let pid = c.nodes[0].pid().unwrap();
    let out = std::process::Command::new(exe())
        .args(["node", "--name", "second", "--data-dir"])
        .arg(&c.nodes[0].dir)
        .args(["--listen", "127.0.0.1:0", "--api", "127.0.0.1:0"])
        .arg("--cluster-key")
        .arg(c.key_file())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("in use by another node") && err.contains(&format!("pid {pid}")),
        "{err}"
    );
    // The holder is untouched.
    c.status(0).unwrap();
}
