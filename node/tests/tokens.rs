//! Real-process tests of replicated API tokens and member removal (issue 22): a token made
//! on one node works on every node (status, a submit and a cancel forwarded through a
//! follower, a log read), `token ls` shows it without its hash, a token that is not the
//! admin's can neither make tokens nor remove members, and a revoked token gets 401 on every
//! node within a deadline. `member remove` takes a member out of the voters and learners and
//! out of placement.
//!
//! Every node offers one cpu (`--cpus 1`), so where jobs go says which members placement
//! counts. Waits poll with deadlines; nodes are stopped by PID when the cluster is dropped.

use std::time::{Duration, Instant};

mod common;

use common::{fails, formed_cluster, ok, wait_job, POLL};
use ringleader::{api::client::ApiClient, cli::local::LocalCluster};

/// Bound on cluster formation and job placement (a debug build on two cores is slow).
const WAIT: Duration = Duration::from_secs(120);
/// Bound on a token's creation or revocation reaching every node's replica: a heartbeat
/// (150 ms) on a healthy cluster; generous for a loaded test host.
const REPLICATE_WAIT: Duration = Duration::from_secs(10);

fn job(name: &str, workers: u32) -> String {
    format!(
        "name = \"{name}\"\nkind = \"command\"\nworkers = {workers}\n\
         command = [\"sh\", \"-c\", \"echo hello-from-rank; sleep 300\"]\n"
    )
}

/// Node `i`'s API with `token` instead of the admin's.
fn client_with(c: &LocalCluster, i: usize, token: &str) -> ApiClient {
    ApiClient::new(&c.nodes[i].info.api_addr, Some(token.to_owned()))
}

/// A node other than the chief (as node 0 sees it), preferring the last.
fn follower(c: &LocalCluster) -> usize {
    let chief = c.status(0).unwrap().chief.unwrap().name;
    (0..c.nodes.len())
        .rev()
        .find(|i| c.nodes[*i].name != chief)
        .unwrap()
}

/// Polls `f` until it returns `Some`, up to `wait`.
fn poll<T>(what: &str, wait: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + wait;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {wait:?}");
        std::thread::sleep(POLL);
    }
}

#[test]
fn a_token_works_everywhere_until_revoked_and_only_the_admin_makes_them() {
    let dir = tempfile::tempdir().unwrap();
    let extra = vec!["--cpus".to_string(), "1".to_string()];
    let c = formed_cluster(dir.path(), "tk", 3, &extra, WAIT);

    // Phase 1: the admin makes a token on node 0; it is printed once.
    let out = ok(c.cli(0).args(["token", "create", "ci"]).output().unwrap());
    let token = out.trim().to_owned();
    assert_eq!(token.len(), 64, "{out}");
    let hash = blake3::hash(token.as_bytes()).to_hex().to_string();

    // Phase 2: it works on every node, once each replica has it.
    for i in 0..3 {
        poll("the token accepted", REPLICATE_WAIT, || {
            client_with(&c, i, &token).status().ok()
        });
    }
    // A submit and a cancel through a follower: forwarded to the chief with the token's
    // principal.
    let f = follower(&c);
    let api = client_with(&c, f, &token);
    let id = api.submit(&job("one", 1)).unwrap();
    wait_job(&c, f, &id, "running", WAIT, |j| j.state == "running");
    let logs: serde_json::Value = poll("the rank's log", WAIT, || {
        let v: serde_json::Value = api.get(&format!("/v1/jobs/{id}/logs")).ok()?;
        v.to_string().contains("hello-from-rank").then_some(v)
    });
    assert!(logs.to_string().contains("hello-from-rank"), "{logs}");
    let v: serde_json::Value = api.post(&format!("/v1/jobs/{id}/cancel"), "").unwrap();
    assert_eq!(v["state"], "cancelled");
    wait_job(&c, 0, &id, "cancelled", WAIT, |j| j.state == "cancelled");

    // Phase 3: `token ls` names it, never with its whole hash or the token.
    let ls = ok(c.cli(1).args(["token", "ls", "--json"]).output().unwrap());
    let rows: serde_json::Value = serde_json::from_str(&ls).unwrap();
    assert_eq!(rows[0]["name"], "ci", "{ls}");
    assert!(rows[0]["created_by"].as_str().unwrap().starts_with("admin"));
    assert!(!ls.contains(&hash) && !ls.contains(&token), "{ls}");
    assert!(ls.contains(&hash[..8]), "{ls}");

    // Phase 4: the token cannot make or revoke tokens, nor remove members.
    for args in [
        vec!["token", "create", "mine"],
        vec!["token", "revoke", "ci"],
        vec!["member", "remove", "tk1"],
    ] {
        let err = fails(
            c.cli(f)
                .env("RINGLEADER_TOKEN", &token)
                .args(&args)
                .output()
                .unwrap(),
        );
        assert!(err.contains("only the admin token"), "{args:?}: {err}");
    }
    // A bad name is refused with its field.
    let err = fails(
        c.cli(0)
            .args(["token", "create", "no spaces"])
            .output()
            .unwrap(),
    );
    assert!(err.contains("name:"), "{err}");

    // Phase 5: revoked on node 1, refused on every node within the deadline.
    ok(c.cli(1).args(["token", "revoke", "ci"]).output().unwrap());
    let revoked = Instant::now();
    for i in 0..3 {
        poll("the token refused", REPLICATE_WAIT, || {
            let e = client_with(&c, i, &token).status().err()?;
            e.to_string().contains("refused").then_some(())
        });
    }
    eprintln!(
        "revoked token refused everywhere after {:?}",
        revoked.elapsed()
    );
    let ls = ok(c.cli(0).args(["token", "ls", "--json"]).output().unwrap());
    assert_eq!(ls.trim(), "[]");
}

#[test]
fn a_removed_member_leaves_the_voters_and_gets_no_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let extra = vec!["--cpus".to_string(), "1".to_string()];
    let c = formed_cluster(dir.path(), "rm", 3, &extra, WAIT);
    let gone = follower(&c);
    let gone_name = c.nodes[gone].name.clone();
    let stay: Vec<usize> = (0..3).filter(|i| *i != gone).collect();

    // Phase 1: the admin removes it; the chief's own removal is refused.
    let chief = c.status(0).unwrap().chief.unwrap().name;
    let err = fails(
        c.cli(gone)
            .args(["member", "remove", &chief])
            .output()
            .unwrap(),
    );
    assert!(err.contains("is the chief"), "{err}");
    ok(c.cli(stay[0])
        .args(["member", "remove", &gone_name])
        .output()
        .unwrap());

    // Phase 2: the others show it removed and not a voter.
    for i in &stay {
        poll("removed and not voting", WAIT, || {
            let s = c.status(*i).ok()?;
            let m = s.members.iter().find(|m| m.name == gone_name)?;
            (m.state == "removed" && !m.voter).then_some(())
        });
    }

    // Phase 3: two one-worker jobs go on the two others; a third waits, though the removed
    // member has a free cpu. The removed member's replica no longer learns the log.
    let api = c.nodes[stay[0]].client();
    let a = api.submit(&job("a", 1)).unwrap();
    let b = api.submit(&job("b", 1)).unwrap();
    for id in [&a, &b] {
        let doc = wait_job(&c, stay[0], id, "running", WAIT, |j| j.state == "running");
        assert!(
            !doc.ring.contains(&gone_name),
            "{id} placed on {:?}",
            doc.ring
        );
    }
    let third = api.submit(&job("c", 1)).unwrap();
    let doc = wait_job(&c, stay[0], &third, "unplaceable", WAIT, |j| {
        j.pending_reason.is_some()
    });
    assert_eq!(doc.state, "pending", "{doc:#?}");
    assert!(
        c.nodes[gone].client().job(&third).is_err(),
        "a learner no more: the removed member never hears of the new job"
    );
}
