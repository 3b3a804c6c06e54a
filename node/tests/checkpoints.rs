//! Command ranks' checkpoints, with a real node: a command job saves through its node's API
//! with the capability it was given (`RINGLEADER_CHECKPOINT_URL`/`_TOKEN`) and the bytes
//! land in its place in the store (`jobs/<id>/files/`); another (live) job's token, or none,
//! opens nothing there (403, 401); the admin's API token reads it and writes nothing (200,
//! 403); a job's own token stops working once
//! its generation ended (403, expired: issue 47's M3, a leaked capability); the cluster key
//! makes none (403: each node signs its ranks' with a key of its own); a capability is no
//! API token (401 elsewhere); names are checked; a missing object is 404.

mod common;

use std::time::Duration;

use common::formed_cluster;

const FORM_WAIT: Duration = Duration::from_secs(60);
const RUN_WAIT: Duration = Duration::from_secs(120);

/// The script a job runs: saves `saved by <job id>` as `state` (PUT), reads it back (GET)
/// and prints what it read, its URL and its token, and whether its environment holds the
/// storage URL or the S3 test's secret key.
const SAVE: &str = r#"
import os, urllib.request
url, token = os.environ["RINGLEADER_CHECKPOINT_URL"], os.environ["RINGLEADER_CHECKPOINT_TOKEN"]
auth = {"Authorization": "Bearer " + token}
body = ("saved by " + os.environ["RINGLEADER_JOB_ID"]).encode()
urllib.request.urlopen(urllib.request.Request(url + "/state", data=body, method="PUT", headers=auth))
got = urllib.request.urlopen(urllib.request.Request(url + "/state", headers=auth)).read().decode()
print("read", got)
print("place", url, token)
print("env", "RINGLEADER_STORAGE" in os.environ, any("rl-secret" in v for v in os.environ.values()))
"#;

/// `METHOD url` with an optional bearer token: the status and the body.
fn call(method: &str, url: &str, token: Option<&str>, body: &[u8]) -> (u16, String) {
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build(),
    );
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut resp = match method {
        "PUT" => {
            let mut req = agent.put(url);
            if let Some(a) = &auth {
                req = req.header("authorization", a);
            }
            req.send(body).unwrap()
        }
        _ => {
            let mut req = agent.get(url);
            if let Some(a) = &auth {
                req = req.header("authorization", a);
            }
            req.call().unwrap()
        }
    };
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().unwrap_or_default())
}

/// The script of a job that lives on: prints its place and token, then sleeps.
const HOLD: &str = r#"
import os, time
print("place", os.environ["RINGLEADER_CHECKPOINT_URL"], os.environ["RINGLEADER_CHECKPOINT_TOKEN"], flush=True)
time.sleep(120)
"#;

/// Submits a one-rank command job running `script` (a python file): its id.
fn submit_script(c: &ringleader::cli::local::LocalCluster, name: &str, script: &str) -> String {
    let spec = serde_json::json!({
        "name": name, "kind": "command", "max_restarts": 0,
        "command": ["python3", "job.py"],
        "files": [{"path": "job.py", "text": script}],
    });
    c.nodes[0].client().submit_json(&spec.to_string()).unwrap()
}

/// Starts the hold script as a command job: its id, place URL and token, while it runs.
fn start_holder(c: &ringleader::cli::local::LocalCluster) -> (String, String, String) {
    let id = submit_script(c, "holder", HOLD);
    let place = common::poll_until(
        RUN_WAIT,
        || c.job_log_lines(&id, "place "),
        |p| !p.is_empty(),
    )
    .unwrap_or_else(|_| panic!("the holder never ran: {:#?}", c.job_logs(&id)));
    let mut words = place[0].split_whitespace().skip(1);
    let url = words.next().unwrap().to_owned();
    let token = words.next().unwrap().to_owned();
    (id, url, token)
}

/// Runs the save script as a command job to its end: its id, place URL and token.
fn run_saver(c: &ringleader::cli::local::LocalCluster) -> (String, String, String) {
    let id = submit_script(c, "saver", SAVE);
    let doc = common::wait_job(c, 0, &id, "ended", RUN_WAIT, |d| {
        matches!(d.state.as_str(), "succeeded" | "failed" | "cancelled")
    });
    assert_eq!(doc.state, "succeeded", "{doc:#?}\n{:#?}", c.job_logs(&id));
    assert_eq!(
        c.job_log_lines(&id, "read "),
        [format!("read saved by {id}")],
        "{:#?}",
        c.job_logs(&id)
    );
    let place = c.job_log_lines(&id, "place ");
    let mut words = place[0].split_whitespace().skip(1);
    let url = words.next().unwrap().to_owned();
    let token = words.next().unwrap().to_owned();
    (id, url, token)
}

#[test]
fn a_command_job_saves_to_its_own_place_and_no_other_token_opens_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = formed_cluster(&dir.path().join("nodes"), "ck", 1, &[], FORM_WAIT);
    let api = &c.nodes[0].info.api_addr;

    // Phase 1: two jobs save through their node, each in its own place.
    let (a, url_a, token_a) = run_saver(&c);
    let (_b, _, token_b) = run_saver(&c);
    assert_eq!(url_a, format!("http://{api}/v1/checkpoints/job/{a}"));
    assert_ne!(token_a, token_b);
    let stored = c.nodes[0]
        .dir
        .join("store/jobs")
        .join(&a)
        .join("files/state");
    assert_eq!(
        std::fs::read_to_string(&stored).unwrap(),
        format!("saved by {a}")
    );

    // Phase 2: its own token expired with its generation; a live job's token opens another
    // job's place neither for reading nor for writing; nor does the API token, or none.
    let state_a = format!("{url_a}/state");
    let (code, body) = call("GET", &state_a, Some(&token_a), b"");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("expired"), "{body}");
    assert_eq!(call("PUT", &state_a, Some(&token_a), b"late").0, 403);
    assert_eq!(call("GET", &state_a, Some(&token_b), b"").0, 403);
    let (_h, url_h, token_h) = start_holder(&c);
    let (code, body) = call("GET", &state_a, Some(&token_h), b"");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("does not open"), "{body}");
    assert_eq!(call("PUT", &state_a, Some(&token_h), b"evil").0, 403);
    assert_eq!(call("GET", &state_a, None, b"").0, 401);
    // The API's admin token reads any job's checkpoints (a user's token its own jobs':
    // `security_owners.rs`), and writes none.
    let admin = c.nodes[0].token.clone().expect("a keyed node has a token");
    let (code, body) = call("GET", &state_a, Some(&admin), b"");
    assert_eq!(
        (code, body.as_str()),
        (200, format!("saved by {a}").as_str())
    );
    assert_eq!(call("PUT", &state_a, Some(&admin), b"evil").0, 403);
    assert_eq!(
        std::fs::read_to_string(&stored).unwrap(),
        format!("saved by {a}"),
        "nothing refused changed the place"
    );

    // Phase 2b: the cluster key makes no capability (a removed host keeps its old key): the
    // live holder's, made with a key derived from the cluster key as before, opens nothing.
    let key_file = dir
        .path()
        .join("nodes")
        .join(ringleader::security::bootstrap::CLUSTER_KEY_FILE);
    let key = ringleader::cluster::identity::load_cluster_key(&key_file).unwrap();
    let mut parts = token_h.splitn(3, '.');
    let job: ringleader::domain::state::JobId = parts.next().unwrap().parse().unwrap();
    let generation: u32 = parts.next().unwrap().parse().unwrap();
    let minted = ringleader::jobs::checkpoint::capability(
        &key.derive("ringleader 2026-11 checkpoint capability v1"),
        ringleader::jobs::checkpoint::Grant { job, generation },
        &ringleader::jobs::checkpoint::Place::Job(job),
    );
    assert_ne!(minted, token_h, "the node's capability key is its own");
    let (code, body) = call("GET", &format!("{url_h}/state"), Some(&minted), b"");
    assert_eq!(code, 403, "{body}");

    // Phase 3: a capability is no API token.
    let status = format!("http://{api}/v1/status");
    assert_eq!(call("GET", &status, Some(&token_h), b"").0, 401);
    assert_eq!(call("GET", &status, Some(&admin), b"").0, 200);

    // Phase 4 (the live holder's place): names are checked; a missing object is 404; an
    // overwrite replaces.
    let (code, body) = call("GET", &format!("{url_h}/other"), Some(&token_h), b"");
    assert_eq!(code, 404, "{body}");
    for bad in ["a%2Fb", "..", "a%20b", &"x".repeat(65)] {
        let (code, body) = call("PUT", &format!("{url_h}/{bad}"), Some(&token_h), b"x");
        assert!((400..500).contains(&code), "{bad}: {code} {body}");
    }
    for v in ["v1", "v2"] {
        assert_eq!(
            call(
                "PUT",
                &format!("{url_h}/state"),
                Some(&token_h),
                v.as_bytes()
            )
            .0,
            204
        );
    }
    assert_eq!(
        call("GET", &format!("{url_h}/state"), Some(&token_h), b""),
        (200, "v2".into())
    );
}

/// An S3-compatible server (s3s-fs, file-backed) on a free port, killed on drop; `None`
/// without the binary (`PATH` or `~/.cargo/bin`; scripts/test.sh installs it).
struct S3Server {
    child: std::process::Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl S3Server {
    fn start() -> Option<S3Server> {
        let bin = std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("s3s-fs"))
                    .collect::<Vec<_>>()
            })
            .chain(
                std::env::var_os("HOME")
                    .map(|h| std::path::Path::new(&h).join(".cargo/bin/s3s-fs")),
            )
            .find(|p| p.is_file())?;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ckpt")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", "rl", "--secret-key", "rl-secret"])
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting s3s-fs");
        let server = S3Server { child, port, dir };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", server.port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "s3s-fs did not listen in 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(server)
    }
}

impl S3Server {
    /// Writes the URL of its bucket `ckpt` (prefix `runs`), keys included, to a 0600 file in
    /// `dir`, as the book's security model says (never on the command line), and returns its path.
    fn storage_file(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let storage = dir.join("storage.url");
        common::write_private(
            &storage,
            &format!(
                "s3://ckpt/runs?endpoint=http://127.0.0.1:{}&access_key_id=rl&secret_access_key=rl-secret\n",
                self.port
            ),
        );
        storage
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_s3_store_holds_a_jobs_checkpoints_and_the_rank_never_sees_its_keys() {
    let Some(s3) = S3Server::start() else {
        eprintln!("SKIPPED: no s3s-fs binary for the S3 checkpoint test");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let storage = s3.storage_file(dir.path());
    let extra = ["--storage-file".to_string(), storage.display().to_string()];
    let c = formed_cluster(&dir.path().join("nodes"), "s3", 1, &extra, FORM_WAIT);
    let (a, url_a, token_a) = run_saver(&c);
    // s3s-fs keeps an object as a file under <root>/<bucket>/<key>.
    let object = s3
        .dir
        .path()
        .join("ckpt/runs/jobs")
        .join(&a)
        .join("files/state");
    assert_eq!(
        std::fs::read_to_string(&object).unwrap(),
        format!("saved by {a}")
    );
    assert_eq!(
        c.job_log_lines(&a, "env "),
        ["env False False"],
        "a command rank gets neither the storage URL nor its keys"
    );
    let (_, _, token_b) = run_saver(&c);
    assert_eq!(
        call("GET", &format!("{url_a}/state"), Some(&token_b), b"").0,
        403
    );
    assert_eq!(
        call("GET", &format!("{url_a}/state"), Some(&token_a), b"").0,
        403,
        "its generation is over"
    );
}

/// Members on one bucket find each other by their markers in it (listed through S3) and the
/// record of a job that ended is written there once, by one of them.
#[test]
fn members_on_one_bucket_write_a_jobs_record_once() {
    let Some(s3) = S3Server::start() else {
        eprintln!("SKIPPED: no s3s-fs binary for the shared-bucket record test");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let storage = s3.storage_file(dir.path());
    let args = ["--storage-file".to_string(), storage.display().to_string()];
    let c = common::sharing_cluster(&dir.path().join("nodes"), &args, FORM_WAIT);
    let id = c.nodes[0]
        .client()
        .submit("name = \"once\"\nkind = \"command\"\ncommand = [\"true\"]\n")
        .unwrap();
    let ids = [id.clone()];
    let writes = || -> Vec<usize> {
        common::logged(&c, &ids, "job record written")
            .iter()
            .map(|w| w[0])
            .collect()
    };
    let written = common::poll_until(RUN_WAIT, writes, |w| w.iter().sum::<usize>() > 0)
        .unwrap_or_else(|_| panic!("no node wrote the record of {id}"));
    assert_eq!(
        written.iter().sum::<usize>(),
        1,
        "record writes per node: {written:?}"
    );
    // s3s-fs keeps an object as a file under <root>/<bucket>/<key>.
    let record = s3
        .dir
        .path()
        .join("ckpt/runs/jobs")
        .join(&id)
        .join("record.json");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    assert_eq!(doc["state"], "succeeded", "{doc}");
}
