//! Real-process test of the dashboard (`GET /`): a 3-node local cluster whose nodes want an
//! API token runs a command job that reports loss and accuracy curves and a grid search of
//! command trials; then alice, whose quota is 1 cpu and 1 borrowed, runs a job of two
//! ranks that reports curves too, and a second job of hers waits behind her quota. Headless
//! Chromium renders `http://API/#token=TOKEN` and the test checks that the page drew every
//! member, the jobs, the curves, the search's best trial, alice's bar with its numbers
//! (`2/1 cpus, 1 borrowed`) and the queue's row with the scheduler's reason; with a
//! `viewer` token the page draws the same users and queue (the curves of alice's job are
//! not the viewer's to read, and the page says so); without a token it says how to give
//! one.
//!
//! Without a Chromium binary the browser part says SKIPPED and returns. With
//! `RINGLEADER_SCREENSHOT=1` the screenshots go to `docs/book/src/images/` (the book's
//! monitoring page shows it), else to the test's temporary directory.
//!
//! At size: a test server serves the page and a synthetic status of 1,000 members and
//! 10,000 jobs (`api::listing::synthetic`, paged as a node pages it) with 500 of them
//! waiting; the browser must draw the summary and bounded, paged lists (the queue's first
//! 50 rows, the rest counted) within [`BROWSER_WAIT`].
//!
//! The two tests take turns ([`ONE_AT_A_TIME`]): the browser drawing 10,000 jobs takes both
//! cores of a CI host for seconds, long enough to hold the other test's nodes past their
//! commit timeout. Waits poll with deadlines; nodes are stopped by PID when the cluster is dropped,
//! and the browser's process group is killed if it outlives its time.

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

mod common;

use common::{exe, write_private};
use ringleader::{
    api::{client::ApiClient, status::JobDoc},
    cli::local::LocalCluster,
};

/// Bound on each wait (a debug build on two cores is slow).
const WAIT: Duration = Duration::from_secs(180);
/// Poll period.
const POLL: Duration = Duration::from_millis(100);
/// Bound on one browser run (it stops itself after its virtual time budget).
const BROWSER_WAIT: Duration = Duration::from_secs(90);
/// Virtual time the page gets to poll the API and draw, in milliseconds.
const VIRTUAL_TIME_BUDGET_MS: u64 = 8_000;
/// The token the nodes want.
const TOKEN: &str = "dash-b0ard_t0ken";
/// Members' names.
const NAMES: [&str; 3] = ["dash-alpha", "dash-beta", "dash-gamma"];

/// Held by each test for its whole run, so that they run one after the other.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A command job that reports a falling loss and a rising validation accuracy.
const CURVES_JOB: &str = r#"
name = "curves"
kind = "command"
workers = 1
command = ["awk", "BEGIN { for (i = 1; i <= 12; i++) { printf \"ringleader-metric loss %.4f %d\\n\", 2.2 * exp(-i / 4) + 0.1, i * 10; printf \"ringleader-metric val_accuracy %.4f %d\\n\", 0.95 - 0.8 * exp(-i / 3), i * 10; fflush(); system(\"sleep 0.6\") } }"]
"#;

/// alice's job: two one-cpu ranks (her quota's cpu and one borrowed) that report a loss
/// and an accuracy curve, then hold their cpus.
const HOG_JOB: &str = r#"
name = "alice-hog"
kind = "command"
workers = 2
command = ["sh", "-c", "awk 'BEGIN { for (i = 1; i <= 6; i++) { printf \"ringleader-metric loss %.4f %d\\n\", 2.0 * exp(-i / 3) + 0.1, i * 10; printf \"ringleader-metric val_accuracy %.4f %d\\n\", 0.9 - 0.7 * exp(-i / 2), i * 10; fflush(); system(\"sleep 0.6\") } }'; exec sleep 300"]
"#;

/// alice's second job: one more cpu than her quota lets her borrow, so it waits.
const WAITING_JOB: &str = r#"
name = "alice-next"
kind = "command"
workers = 1
command = ["sleep", "300"]
"#;

/// The reason the scheduler gives alice's second job.
const QUOTA_REASON: &str = "waiting for 1 cpu: alice's quota 2/2 cpus in use";

/// A grid search of command trials: 4 learning rates over 3 decades × 2 batch sizes; the
/// metric peaks at lr = 0.03 and prefers the larger batch.
const SEARCH_JOB: &str = r#"
name = "grid"
kind = "search"
command = ["sh", "-c", "awk -v lr=\"$RINGLEADER_PARAM_LR\" -v b=\"$RINGLEADER_PARAM_BATCH\" 'BEGIN { l = log(lr) / log(10); printf \"ringleader-report 1 m %.4f\\n\", 0.9 - 0.08 * (l + 1.6) ^ 2 + b / 6400 }'"]
[search]
trial = "command"
algorithm = "grid"
metric = "m"
direction = "max"
[[search.params]]
name = "lr"
type = "discrete"
values = [0.0003, 0.003, 0.03, 0.3]
[[search.params]]
name = "batch"
type = "discrete"
values = [32, 64]
"#;

/// Polls node `i`'s view of job `id` until it ended.
fn wait_ended(c: &LocalCluster, i: usize, id: &str) -> JobDoc {
    let deadline = Instant::now() + WAIT;
    let mut last = None;
    loop {
        if let Ok(doc) = c.nodes[i].client().job(id) {
            if matches!(doc.state.as_str(), "succeeded" | "failed" | "cancelled") {
                return doc;
            }
            last = Some(doc);
        }
        assert!(
            Instant::now() < deadline,
            "job {id} not ended within {WAIT:?}; last seen: {last:#?}"
        );
        std::thread::sleep(POLL);
    }
}

/// Polls node `i`'s view of job `id` until `done` holds.
fn wait_job(c: &LocalCluster, i: usize, id: &str, what: &str, done: impl Fn(&JobDoc) -> bool) {
    let deadline = Instant::now() + WAIT;
    let mut last = None;
    loop {
        if let Ok(doc) = c.nodes[i].client().job(id) {
            if done(&doc) {
                return;
            }
            last = Some(doc);
        }
        assert!(
            Instant::now() < deadline,
            "job {id}: {what} not within {WAIT:?}; last seen: {last:#?}"
        );
        std::thread::sleep(POLL);
    }
}

/// Polls until job `id` reported at least 3 loss points.
fn wait_loss(client: &ApiClient, id: &str) {
    let deadline = Instant::now() + WAIT;
    while client
        .job_metrics(id)
        .unwrap()
        .metrics
        .get("loss")
        .map_or(0, Vec::len)
        < 3
    {
        assert!(Instant::now() < deadline, "no loss curve for {id}");
        std::thread::sleep(POLL);
    }
}

/// A new token for `name` with `role`, made through `client` (the admin's).
fn new_token(client: &ApiClient, name: &str, role: &str) -> String {
    let made: serde_json::Value = client
        .post_json(
            "/v1/tokens",
            &serde_json::json!({ "name": name, "role": role }),
        )
        .unwrap();
    made["token"].as_str().expect("the new token").to_owned()
}

/// Asserts that `dom` drew alice's bar with its numbers and her waiting job's queue row
/// with the scheduler's reason.
fn assert_users_and_queue(dom: &str, waiting: &str) {
    for text in [
        ">Users <",
        "<b class=\"first\">alice</b>",
        "2/1 cpus, 1 borrowed",
        "0/5 GPU-hours in 7 d",
        "class=\"borrowed\"",
        ">Queue <",
        "1 waiting, first to start first",
        "alice-next",
        QUOTA_REASON,
    ] {
        assert!(dom.contains(text), "{text:?} not on the page: {dom}");
    }
    // The queue's row: its position, the job, its owner, priority, ranks and reason.
    let row = dom
        .split("<tr")
        .find(|r| r.contains(waiting) && r.contains(QUOTA_REASON))
        .unwrap_or_else(|| panic!("no queue row for {waiting}: {dom}"));
    for cell in [">1<", ">alice<", ">normal<", ">1 × 1 cpu<"] {
        assert!(row.contains(cell), "the queue row lacks {cell:?}: {row}");
    }
}

/// A Chromium binary on `PATH`, if any.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|p| p.is_file())
}

/// The page without its `<script>` elements: what it drew, not the code that drew it.
fn drawn(dom: &str) -> String {
    let mut out = String::new();
    let mut rest = dom;
    while let Some(start) = rest.find("<script") {
        out.push_str(&rest[..start]);
        rest = rest[start..]
            .find("</script>")
            .map_or("", |end| &rest[start + end + "</script>".len()..]);
    }
    out.push_str(rest);
    out
}

/// Runs headless `browser` on `url` with `args`, in its own process group under `dir`;
/// returns its stdout. Kills the group if it outlives [`BROWSER_WAIT`].
fn headless(browser: &Path, dir: &Path, url: &str, args: &[String]) -> String {
    let profile = tempfile::tempdir_in(dir).unwrap();
    let out_path = profile.path().join("stdout");
    let err_path = profile.path().join("stderr");
    let mut child = Command::new(browser)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}"))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = child.id();
    let deadline = Instant::now() + BROWSER_WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
            panic!(
                "the browser ran past {BROWSER_WAIT:?}: {}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(POLL);
    };
    // Its helpers (renderer, zygote) share its group; none may outlive the test.
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert!(
        status.success(),
        "the browser failed ({status}): {}",
        std::fs::read_to_string(&err_path).unwrap_or_default()
    );
    std::fs::read_to_string(&out_path).unwrap()
}

/// What headless `browser` drew of `url` (see [`drawn`]), run under `dir`.
fn dump(browser: &Path, dir: &Path, url: &str) -> String {
    drawn(&headless(browser, dir, url, &["--dump-dom".to_string()]))
}

#[test]
fn the_dashboard_shows_members_jobs_curves_and_a_search() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::Builder::new()
        .prefix("rl-dashboard-")
        .tempdir()
        .unwrap();
    let token_file = root.path().join("api.token");
    write_private(&token_file, &format!("{TOKEN}\n"));
    let token_args = ["--token-file".to_string(), token_file.display().to_string()];

    // Phase 1: three nodes that want the token.
    let mut c = LocalCluster::new(exe(), root.path().join("nodes"));
    c.token = Some(TOKEN.to_string());
    c.start(NAMES[0], &token_args).unwrap();
    for name in &NAMES[1..] {
        c.start_joining(name, &token_args).unwrap();
    }
    c.wait_all(WAIT, "formed with a chief", |s| {
        s.names_in("alive").len() == 3 && s.chief.is_some()
    })
    .unwrap();
    let api = c.nodes[0].info.api_addr.clone();

    // Phase 2: the page is open and carries its policy; the data is not.
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .new_agent();
    let mut resp = agent.get(&format!("http://{api}/")).call().unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(header("content-type"), "text/html; charset=utf-8");
    let csp = header("content-security-policy");
    assert!(csp.starts_with("default-src 'self'"), "{csp}");
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    let page = resp.body_mut().read_to_string().unwrap();
    assert!(page.contains("<title>ringleader</title>"));
    let resp = agent
        .get(&format!("http://{api}/v1/status"))
        .call()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);

    // Phase 3: a dataset, and a job with curves and a search, both run to their end.
    let client = c.nodes[0].client();
    let data = root.path().join("dash-data.bin");
    std::fs::write(&data, vec![7u8; 9 * 1024]).unwrap();
    let _: serde_json::Value = client
        .post_json(
            "/v1/datasets",
            &serde_json::json!({ "name": "dash-data", "path": data.display().to_string() }),
        )
        .unwrap();
    let job = client.submit(CURVES_JOB).unwrap();
    let search = client.submit(SEARCH_JOB).unwrap();
    let job_doc = wait_ended(&c, 1, &job);
    assert_eq!(job_doc.state, "succeeded", "{job_doc:#?}");
    let search_doc = wait_ended(&c, 2, &search);
    assert_eq!(search_doc.state, "succeeded", "{search_doc:#?}");
    assert_eq!(search_doc.trials.len(), 8, "{search_doc:#?}");
    let best = search_doc.best.clone().expect("a best trial");
    assert_eq!(best.params["lr"].as_float(), Some(0.03), "{best:?}");
    wait_loss(&client, &job);

    // Phase 3b: alice's quota is 1 cpu, 1 more borrowed, and a GPU-hours budget; her job of
    // two ranks runs on both, and her next one waits behind the quota, saying so.
    let _: serde_json::Value = client
        .post_json(
            "/v1/quotas",
            &serde_json::json!({ "user": "alice", "cpus": 1, "borrow_cpus": 1, "gpu_hours": 5.0 }),
        )
        .unwrap();
    let alice = ApiClient::new(&api, Some(new_token(&client, "alice", "user")));
    let hog = alice.submit(HOG_JOB).unwrap();
    wait_job(&c, 0, &hog, "running", |j| j.state == "running");
    let waiting = alice.submit(WAITING_JOB).unwrap();
    wait_job(&c, 0, &waiting, "the quota's reason", |j| {
        j.pending_reason.as_deref() == Some(QUOTA_REASON)
    });
    wait_loss(&client, &hog);
    let viewer = new_token(&client, "watcher", "viewer");

    // Phase 4: the browser.
    let Some(browser) = chromium() else {
        eprintln!("SKIPPED: no chromium (apt-get install chromium)");
        return;
    };
    let url = format!("http://{api}/#token={TOKEN}");
    let dom = dump(&browser, root.path(), &url);
    assert!(
        !dom.contains("wants an API token") && !dom.contains("did not answer"),
        "the page could not read the API: {dom}"
    );
    for name in NAMES {
        assert!(dom.contains(name), "member {name} not on the page: {dom}");
    }
    for id in [&job, &search, &hog, &waiting] {
        assert!(dom.contains(id.as_str()), "job {id} not on the page: {dom}");
    }
    let best_job = &search_doc
        .trials
        .iter()
        .find(|t| t.id == best.id)
        .expect("the best trial among the trials")
        .job;
    assert!(
        dom.contains(&format!("best: trial {} with", best.id)) && dom.contains(best_job.as_str()),
        "the best trial {} ({best_job}) not on the page: {dom}",
        best.id
    );
    assert!(dom.contains("<polyline"), "no curve drawn: {dom}");
    assert!(dom.contains("val_accuracy"), "no accuracy curve: {dom}");
    assert!(
        dom.contains("lr (log)"),
        "the scatter's lr axis is not log: {dom}"
    );
    // Every job's owner (the admin's jobs here), in the list and the job's panel; the
    // dataset's, who added it.
    assert!(dom.contains(">owner<"), "no owner column: {dom}");
    for text in ["dash-data", "9.0 KiB", "on dash-alpha by admin"] {
        assert!(
            dom.contains(text),
            "the datasets panel lacks {text:?}: {dom}"
        );
    }
    assert!(!dom.contains(TOKEN), "the token is on the page");
    assert_users_and_queue(&dom, &waiting);

    // A viewer reads the same users and queue; alice's curves are not its to read.
    let seen = dump(
        &browser,
        root.path(),
        &format!("http://{api}/#token={viewer}"),
    );
    assert!(
        !seen.contains("did not answer") && !seen.contains("failed to draw"),
        "the page could not read the API with a viewer token: {seen}"
    );
    assert_users_and_queue(&seen, &waiting);
    assert!(
        seen.contains("its curves are not this token's to read"),
        "the viewer's page does not say why it shows no curves: {seen}"
    );
    assert!(!seen.contains(&viewer), "the viewer's token is on the page");

    // Without the token the page says how to give it.
    let bare = dump(&browser, root.path(), &format!("http://{api}/"));
    assert!(
        bare.contains("this node wants an API token: open") && bare.contains("#token=YOUR_TOKEN"),
        "{bare}"
    );

    // Phase 5: a screenshot, for the book when asked.
    let png = if std::env::var_os("RINGLEADER_SCREENSHOT").is_some_and(|v| v == "1") {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/book/src/images/dashboard.png")
    } else {
        root.path().join("dashboard.png")
    };
    let _ = std::fs::remove_file(&png);
    headless(
        &browser,
        root.path(),
        &url,
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1400,1000".to_string(),
        ],
    );
    let bytes = std::fs::read(&png).unwrap();
    assert!(
        bytes.len() > 1_000 && bytes.starts_with(b"\x89PNG"),
        "{} is not a PNG",
        png.display()
    );
    eprintln!("screenshot: {} ({} bytes)", png.display(), bytes.len());
}

/// Members and jobs of the synthetic cluster (issue 27).
const MEMBERS_AT_SIZE: usize = 1_000;
const JOBS_AT_SIZE: usize = 10_000;
/// Table rows the page may draw at size: the members listed (100), a page of jobs (50), the
/// first 50 of the 500 waiting jobs and the tables' header rows.
const ROWS_AT_SIZE_MAX: usize = 100 + 50 + 50 + 10;

/// Serves the dashboard, `GET /v1/status` and `GET /v1/queue` of a synthetic cluster on
/// 127.0.0.1; job documents answer 404 (the page copes: a job compacted meanwhile).
/// Returns the address.
fn serve_synthetic(members: usize, jobs: usize) -> String {
    use axum::{extract::Query, routing::get, Json, Router};
    use ringleader::api::listing::{page_status, synthetic, StatusQuery};
    use std::sync::Arc;
    let (doc, state) = synthetic(members, jobs);
    let queue = ringleader::api::sharing::queue_doc(&state, doc.alive_capacity(), 1);
    let queue = Arc::new(serde_json::to_value(queue).unwrap());
    let fake = Arc::new((doc, state));
    let app = Router::new()
        .route("/", get(ringleader::api::dashboard::page))
        .route(
            "/v1/status",
            get(move |Query(q): Query<StatusQuery>| {
                let fake = fake.clone();
                async move {
                    let mut doc = fake.0.clone();
                    page_status(&mut doc, &fake.1, &q).expect("a good query");
                    Json(doc)
                }
            }),
        )
        .route(
            "/v1/queue",
            get(move || {
                let queue = queue.clone();
                async move { Json((*queue).clone()) }
            }),
        )
        .route(
            "/v1/datasets",
            get(|| async { Json(serde_json::json!([])) }),
        )
        .fallback(|| async {
            (
                axum::http::StatusCode::NOT_FOUND,
                Json(serde_json::json!({ "error": "no such job" })),
            )
        });
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    addr
}

#[test]
fn the_dashboard_stays_readable_with_1000_members_and_10000_jobs() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(browser) = chromium() else {
        eprintln!("SKIPPED: no chromium (apt-get install chromium)");
        return;
    };
    let api = serve_synthetic(MEMBERS_AT_SIZE, JOBS_AT_SIZE);
    let root = tempfile::Builder::new()
        .prefix("rl-dashboard-size-")
        .tempdir()
        .unwrap();
    let start = Instant::now();
    let dom = dump(&browser, root.path(), &format!("http://{api}/"));
    let took = start.elapsed();
    assert!(
        !dom.contains("did not answer") && !dom.contains("failed to draw"),
        "the page could not read the fake API: {dom}"
    );
    for text in [
        "members 1000",
        "alive 980 · suspect 10 · dead 10",
        "jobs 10000",
        "succeeded 8000",
        "running 500",
        "900 more members not listed",
        "newest 1–50 of 10000",
        "sweep-9999",
        "500 waiting, first to start first",
        "450 more waiting jobs (ringleader queue)",
    ] {
        assert!(dom.contains(text), "{text:?} not on the page: {dom}");
    }
    assert!(
        !dom.contains("sweep-9949<"),
        "more than a page of jobs drawn"
    );
    let rows = dom.matches("<tr").count();
    assert!(
        rows <= ROWS_AT_SIZE_MAX,
        "{rows} table rows drawn, more than {ROWS_AT_SIZE_MAX}"
    );
    eprintln!(
        "dashboard members={MEMBERS_AT_SIZE} jobs={JOBS_AT_SIZE} browser_s={:.1} rows={rows} dom_bytes={}",
        took.as_secs_f64(),
        dom.len()
    );

    // A screenshot, for the book when asked.
    let png = if std::env::var_os("RINGLEADER_SCREENSHOT").is_some_and(|v| v == "1") {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/book/src/images/dashboard-at-size.png")
    } else {
        root.path().join("dashboard-at-size.png")
    };
    let _ = std::fs::remove_file(&png);
    headless(
        &browser,
        root.path(),
        &format!("http://{api}/"),
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1400,1000".to_string(),
        ],
    );
    let bytes = std::fs::read(&png).unwrap();
    assert!(
        bytes.starts_with(b"\x89PNG"),
        "{} is not a PNG",
        png.display()
    );
    eprintln!("screenshot: {} ({} bytes)", png.display(), bytes.len());
}
