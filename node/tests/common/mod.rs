//! Helpers shared by the real-process tests: a formed local cluster, and polling a job.

#![allow(dead_code)]

pub mod netns;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use ringleader::{api::status::JobDoc, cli::local::LocalCluster};

/// Poll period.
pub const POLL: Duration = Duration::from_millis(100);

/// The `ringleader` binary under test.
pub fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_ringleader")
}

/// Whether a job reached a final state.
pub fn ended(doc: &JobDoc) -> bool {
    matches!(doc.state.as_str(), "succeeded" | "failed" | "cancelled")
}

/// Sends `sig` to process `pid` (which must exist).
pub fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).unwrap();
}

/// The permission bits of `p` (the link's own, for a symlink).
pub fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

/// The stdout of a CLI run that must succeed (its stderr in the failure message).
pub fn ok(out: std::process::Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "CLI failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The stderr of a CLI run that must fail.
pub fn fails(out: std::process::Output) -> String {
    assert!(
        !out.status.success(),
        "CLI should fail: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every path under `root` (symlinks not followed).
pub fn walk(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
        }
        out.push(p);
    }
    out
}

/// Writes `text` to `path` with mode 0600 (a token file).
pub fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
}

/// Starts `n` nodes named `{prefix}0`, `{prefix}1`, … with `extra` arguments (the first
/// alone, the others joining it) and waits until they are formed ([`wait_formed`]).
pub fn formed_cluster(
    root: &Path,
    prefix: &str,
    n: usize,
    extra: &[String],
    wait: Duration,
) -> LocalCluster {
    let mut c = LocalCluster::new(exe(), root);
    c.start(&format!("{prefix}0"), extra).unwrap();
    for i in 1..n {
        c.start_joining(&format!("{prefix}{i}"), extra).unwrap();
    }
    wait_formed(&c, n, wait);
    c
}

/// Waits, up to `wait`, until every node sees `n` members alive, a chief, and the voters
/// the autopilot keeps: one below three members, else three (voters grow 1 → 3 → 5, never
/// through an even count).
pub fn wait_formed(c: &LocalCluster, n: usize, wait: Duration) {
    let voters = if n >= 3 { 3 } else { 1 };
    c.wait_all(wait, "formed: all alive, a chief, the voters", |s| {
        s.names_in("alive").len() == n
            && s.chief.is_some()
            && s.members.iter().filter(|m| m.voter).count() == voters
    })
    .unwrap();
}

/// Polls node `i`'s view of job `id` until `cond` holds, up to `wait`.
pub fn wait_job(
    c: &LocalCluster,
    i: usize,
    id: &str,
    what: &str,
    wait: Duration,
    cond: impl Fn(&JobDoc) -> bool,
) -> JobDoc {
    let deadline = Instant::now() + wait;
    let mut last = None;
    loop {
        if let Ok(doc) = c.nodes[i].client().job(id) {
            if cond(&doc) {
                return doc;
            }
            last = Some(doc);
        }
        assert!(
            Instant::now() < deadline,
            "job {id}: {what} not within {wait:?}; last seen: {last:#?}"
        );
        std::thread::sleep(POLL);
    }
}

/// Waits, up to `wait`, until every node's log holds `line`.
pub fn wait_logged(c: &LocalCluster, line: &str, wait: Duration) {
    poll_until(
        wait,
        || c.nodes.iter().all(|n| n.log().contains(line)),
        |&all| all,
    )
    .unwrap_or_else(|_| panic!("not every node logged {line:?}"));
}

/// Takes `probe()` every [`POLL`] until `done` holds for what it gave (`Ok` of that) or
/// `wait` passed (`Err` of the last one, for the caller's failure message).
pub fn poll_until<T>(
    wait: Duration,
    mut probe: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> Result<T, T> {
    let deadline = Instant::now() + wait;
    loop {
        let got = probe();
        if done(&got) {
            return Ok(got);
        }
        if Instant::now() >= deadline {
            return Err(got);
        }
        std::thread::sleep(POLL);
    }
}

/// Three nodes on one shared store (`args` name it, and any other flags), formed, each
/// having found the other two by their markers in it. Each record's write leaves a debug
/// line in its node's log ("job record written"), so a test can count them.
pub fn sharing_cluster(root: &Path, args: &[String], wait: Duration) -> LocalCluster {
    let mut c = LocalCluster::new(exe(), root);
    c.env = vec![(
        "RUST_LOG".into(),
        "info,openraft=warn,openraft::replication=off,libp2p=warn,ringleader_services::jobs::archive=debug"
            .into(),
    )];
    c.start("sh0", args).unwrap();
    for i in 1..3 {
        c.start_joining(&format!("sh{i}"), args).unwrap();
    }
    wait_formed(&c, 3, wait);
    wait_logged(
        &c,
        "job records: this node's store is shared with 2 other members",
        wait,
    );
    c
}

/// Per node, per job of `ids`: the lines of its log that say `what` of the job's record.
pub fn logged(c: &LocalCluster, ids: &[String], what: &str) -> Vec<Vec<usize>> {
    c.nodes
        .iter()
        .map(|n| {
            let log = n.log();
            ids.iter()
                .map(|id| {
                    let job = format!("job={id} ");
                    log.lines()
                        .filter(|l| l.contains(what) && l.contains(&job))
                        .count()
                })
                .collect()
        })
        .collect()
}

/// The metadata of a member named `name` whose every address is `at` (`ip:port`), for the
/// membership claims a test forges or makes.
pub fn member_meta(name: &str, at: &str) -> ringleader::cluster::meta::NodeMeta {
    let (ip, port) = at.rsplit_once(':').expect("ip:port");
    ringleader::cluster::meta::NodeMeta {
        name: name.into(),
        p2p_addrs: vec![format!("/ip4/{ip}/tcp/{port}")],
        api_addr: at.into(),
        data_addr: at.into(),
        datasets_addr: at.into(),
        datasets: Vec::new(),
        cpus: 1,
        memory_mb: 1024,
        gpus: Vec::new(),
        labels: Default::default(),
        version: "test".into(),
    }
}

/// The metadata of a member that does not exist (`name`), for forged membership messages:
/// every address points at port 9 of loopback.
pub fn ghost_meta(name: &str) -> ringleader::cluster::meta::NodeMeta {
    member_meta(name, "127.0.0.1:9")
}

/// `POST /v1/jobs` with a JSON body to node `i`: the status and the answer.
pub fn post_json(c: &LocalCluster, i: usize, body: &str) -> (u16, serde_json::Value) {
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build(),
    );
    let mut req = agent
        .post(format!("http://{}/v1/jobs", c.nodes[i].info.api_addr))
        .header("content-type", "application/json; charset=utf-8");
    if let Some(token) = c.nodes[i].token.as_deref() {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let mut resp = req.send(body).unwrap();
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_json().unwrap())
}
