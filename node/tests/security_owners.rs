//! Real-process test of users and ownership (issue 49 point 1, issue 47 point 6's per-user
//! limits): on two nodes (requests through a follower are forwarded to the chief with their
//! principal), tokens of users alice and bob, a viewer carol, and a token made without a
//! user (a user of its own name, as every token made before users is).
//!
//! - alice's job records `owner = alice`; bob sees its summary (owner, state) but may not
//!   cancel it, read its logs or metrics, nor fetch its checkpoint: 403 naming alice, on
//!   either node; alice (any of her tokens) may;
//! - a viewer reads the job list and may not submit;
//! - the admin cancels anything;
//! - a user's pending jobs are held to `--user-pending-jobs-max` (429 naming the limit); the
//!   admin is not;
//! - alice's tokens revoked, her running job runs on, owned by alice.
//!
//! Waits poll with deadlines; nodes are stopped by PID when the cluster is dropped.

use std::time::Duration;

mod common;

use common::{formed_cluster, ok, poll_until, wait_job};
use ringleader::{api::client::ApiClient, cli::local::LocalCluster};

/// Bound on cluster formation and a job's start (a debug build on two cores is slow).
const WAIT: Duration = Duration::from_secs(120);
/// Bound on a token's creation or revocation reaching every replica.
const REPLICATE_WAIT: Duration = Duration::from_secs(10);

/// alice's first job: saves a checkpoint through its node, says so, and lives on.
const SAVER: &str = r#"
import os, time, urllib.request
url, token = os.environ["RINGLEADER_CHECKPOINT_URL"], os.environ["RINGLEADER_CHECKPOINT_TOKEN"]
req = urllib.request.Request(url + "/state", data=b"alice's state", method="PUT",
                             headers={"Authorization": "Bearer " + token})
urllib.request.urlopen(req)
print("saved", flush=True)
time.sleep(300)
"#;

/// `METHOD url` with a bearer token (and a JSON body for a `POST`): the status and body.
fn call(method: &str, url: &str, token: &str, body: Option<&str>) -> (u16, String) {
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build(),
    );
    let auth = format!("Bearer {token}");
    let mut resp = match method {
        "POST" => agent
            .post(url)
            .header("authorization", &auth)
            .header("content-type", "application/json")
            .send(body.unwrap_or("{}"))
            .unwrap(),
        _ => agent
            .get(url)
            .header("authorization", &auth)
            .call()
            .unwrap(),
    };
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().unwrap_or_default())
}

/// A one-rank command job that sleeps, as JSON.
fn sleeper(name: &str) -> String {
    serde_json::json!({
        "name": name, "kind": "command", "max_restarts": 0,
        "command": ["sleep", "300"],
    })
    .to_string()
}

/// Makes a token with the admin's CLI on node 0: `token create NAME ARGS…`.
fn token(c: &LocalCluster, name: &str, args: &[&str]) -> String {
    let out = ok(c
        .cli(0)
        .args(["token", "create", name])
        .args(args)
        .output()
        .unwrap());
    let t = out.trim().to_owned();
    assert_eq!(t.len(), 64, "{out}");
    t
}

#[test]
fn a_users_jobs_are_its_own_and_others_see_their_summary_only() {
    let dir = tempfile::tempdir().unwrap();
    let extra: Vec<String> = ["--cpus", "8", "--user-pending-jobs-max", "3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let c = formed_cluster(dir.path(), "ow", 2, &extra, WAIT);
    let api = |i: usize| c.nodes[i].info.api_addr.clone();

    // Phase 1: the admin makes tokens: two users, a second token of alice's, a viewer, and
    // one without a user (a user of its own name, as tokens made before users are).
    let alice = token(&c, "alice", &[]);
    let alice_ci = token(&c, "alice.ci", &["--user", "alice"]);
    let bob = token(&c, "bob", &["--role", "user"]);
    let carol = token(&c, "carol", &["--role", "viewer"]);
    let plain = token(&c, "ci", &[]);
    let ls = ok(c.cli(0).args(["token", "ls", "--json"]).output().unwrap());
    let rows: serde_json::Value = serde_json::from_str(&ls).unwrap();
    let row = |name: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} not in {ls}"))
    };
    assert_eq!(
        (
            row("alice.ci")["user"].as_str(),
            row("alice.ci")["role"].as_str()
        ),
        (Some("alice"), Some("user"))
    );
    assert_eq!(row("carol")["role"], "viewer");
    assert_eq!(row("ci")["user"], "ci");
    // A bad role is refused by the CLI naming it; a user "admin" without role admin by the
    // node, naming the field.
    let out = c
        .cli(0)
        .args(["token", "create", "x", "--role", "root"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = common::fails(
        c.cli(0)
            .args(["token", "create", "x", "--user", "admin"])
            .output()
            .unwrap(),
    );
    assert!(err.contains("user:"), "{err}");
    for t in [&alice, &alice_ci, &bob, &carol, &plain] {
        for i in 0..2 {
            poll_until(
                REPLICATE_WAIT,
                || ApiClient::new(&api(i), Some(t.clone())).status().is_ok(),
                |ok| *ok,
            )
            .expect("the token accepted on every node");
        }
    }

    // Phase 2: alice submits through node 1 (a follower or the chief: either way the owner
    // is her token's user); the job records it and saves a checkpoint.
    let spec = serde_json::json!({
        "name": "alices", "kind": "command", "max_restarts": 0,
        "command": ["python3", "job.py"],
        "files": [{"path": "job.py", "text": SAVER}],
    });
    let as_alice = ApiClient::new(&api(1), Some(alice.clone()));
    let j1 = as_alice.submit_json(&spec.to_string()).unwrap();
    let doc = wait_job(&c, 0, &j1, "running", WAIT, |d| d.state == "running");
    assert_eq!(doc.owner, "alice");
    poll_until(WAIT, || c.job_log_lines(&j1, "saved"), |l| !l.is_empty())
        .unwrap_or_else(|l| panic!("alice's job never saved: {l:?} {:#?}", c.job_logs(&j1)));
    // Her other token is the same user: it reads the logs.
    let (code, body) = call(
        "GET",
        &format!("http://{}/v1/jobs/{j1}/logs", api(0)),
        &alice_ci,
        None,
    );
    assert_eq!(code, 200, "{body}");
    // She fetches her checkpoint with her API token.
    let ckpt = format!("http://{}/v1/checkpoints/job/{j1}/state", api(0));
    assert_eq!(
        call("GET", &ckpt, &alice, None),
        (200, "alice's state".to_owned())
    );

    // Phase 3: bob sees alice's job's summary, owner included, on both nodes; not its
    // metrics, and he may not act on it.
    for i in 0..2 {
        let (code, body) = call(
            "GET",
            &format!("http://{}/v1/jobs/{j1}", api(i)),
            &bob,
            None,
        );
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (v["owner"].as_str(), v["state"].as_str()),
            (Some("alice"), Some("running"))
        );
        assert_eq!(v["metrics"], serde_json::json!({}), "{body}");
        let (code, body) = call("GET", &format!("http://{}/v1/jobs", api(i)), &bob, None);
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("\"owner\":\"alice\""), "{body}");
        let refusals = [
            ("POST", "v1/jobs", "cancel", "cancel it"),
            ("GET", "v1/jobs", "logs", "read its logs"),
            ("GET", "v1/jobs", "metrics", "read its metrics"),
            (
                "GET",
                "v1/checkpoints/job",
                "state",
                "fetch its checkpoints",
            ),
        ]
        .map(|(method, under, tail, what)| {
            (
                method,
                format!("http://{}/{under}/{j1}/{tail}", api(i)),
                what,
            )
        });
        for (method, url, what) in refusals {
            let (code, body) = call(method, &url, &bob, None);
            assert_eq!(code, 403, "{method} {url}: {body}");
            assert!(
                body.contains(&format!("{j1} belongs to alice; bob may not {what}")),
                "{method} {url}: {body}"
            );
        }
    }
    // The CLI shows the owner, to bob as to anyone.
    let jobs = ok(c
        .cli(0)
        .env("RINGLEADER_TOKEN", &bob)
        .args(["jobs"])
        .output()
        .unwrap());
    assert!(jobs.contains("OWNER") && jobs.contains("alice"), "{jobs}");
    let job = ok(c
        .cli(1)
        .env("RINGLEADER_TOKEN", &bob)
        .args(["job", &j1])
        .output()
        .unwrap());
    assert!(job.contains("owner      alice"), "{job}");

    // Phase 4: the viewer reads summaries and may not submit or cancel.
    let (code, body) = call("GET", &format!("http://{}/v1/jobs", api(0)), &carol, None);
    assert_eq!(code, 200, "{body}");
    let viewer = ApiClient::new(&api(0), Some(carol.clone()));
    let e = viewer
        .submit_json(&sleeper("nope"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("carol has role viewer, which may not submit jobs"),
        "{e}"
    );
    let (code, body) = call(
        "POST",
        &format!("http://{}/v1/jobs/{j1}/cancel", api(1)),
        &carol,
        None,
    );
    assert_eq!(code, 403, "{body}");

    // Phase 5: a token made without a user submits and cancels its own job (a user of its
    // own name); bob is held to 3 jobs not ended, the admin is not.
    let as_plain = ApiClient::new(&api(1), Some(plain.clone()));
    let own = as_plain.submit_json(&sleeper("mine")).unwrap();
    assert_eq!(wait_job(&c, 0, &own, "known", WAIT, |_| true).owner, "ci");
    let v: serde_json::Value = as_plain
        .post(&format!("/v1/jobs/{own}/cancel"), "")
        .unwrap();
    assert_eq!(v["state"], "cancelled");
    let as_bob = ApiClient::new(&api(0), Some(bob.clone()));
    let bobs: Vec<String> = (0..3)
        .map(|i| as_bob.submit_json(&sleeper(&format!("b{i}"))).unwrap())
        .collect();
    let (code, body) = call(
        "POST",
        &format!("http://{}/v1/jobs", api(1)),
        &bob,
        Some(&sleeper("b3")),
    );
    assert_eq!(code, 429, "{body}");
    assert!(
        body.contains("bob has 3 jobs") && body.contains("at most 3 per user"),
        "{body}"
    );
    // bob cancels his own; that frees a place.
    let v: serde_json::Value = as_bob
        .post(&format!("/v1/jobs/{}/cancel", bobs[0]), "")
        .unwrap();
    assert_eq!(v["state"], "cancelled");
    poll_until(
        REPLICATE_WAIT,
        || as_bob.submit_json(&sleeper("b4")).is_ok(),
        |ok| *ok,
    )
    .expect("a place freed by the cancel");
    let admin = c.nodes[0].client();
    for i in 0..4 {
        admin.submit_json(&sleeper(&format!("a{i}"))).unwrap();
    }

    // Phase 6: the admin cancels anything (alice's saver).
    let v: serde_json::Value = admin.post(&format!("/v1/jobs/{j1}/cancel"), "").unwrap();
    assert_eq!(v["state"], "cancelled");

    // Phase 7: alice removed (her tokens revoked): her running job runs on, owned by her.
    let j2 = as_alice.submit_json(&sleeper("alices-second")).unwrap();
    wait_job(&c, 0, &j2, "running", WAIT, |d| d.state == "running");
    for name in ["alice", "alice.ci"] {
        ok(c.cli(0).args(["token", "revoke", name]).output().unwrap());
    }
    for i in 0..2 {
        poll_until(
            REPLICATE_WAIT,
            || call("GET", &format!("http://{}/v1/jobs", api(i)), &alice, None).0,
            |code| *code == 401,
        )
        .expect("alice's token refused on every node");
    }
    let doc = c.nodes[1].client().job(&j2).unwrap();
    assert_eq!(
        (doc.state.as_str(), doc.owner.as_str()),
        ("running", "alice")
    );
}
