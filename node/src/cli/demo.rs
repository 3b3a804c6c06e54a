//! `ringleader demo`: a local cluster on this machine, end to end.
//!
//! Starts 3 nodes, submits the bundled `examples/jobs/digits-mlp.toml` (a `kind = "train"`
//! job on 3 workers), draws a live progress line from the job's metrics over the API, checks
//! the result (the job succeeded with validation accuracy ≥ [`ACCURACY_MIN`]), prints where
//! rank 0 wrote the checkpoint; then runs the bundled `examples/jobs/digits-asha.toml` (an
//! ASHA search over the MLP's learning rate and width, trials spread over the nodes) and
//! prints its leaderboard; and stops every node. Fails (non-zero exit) otherwise. The nodes'
//! data directories are kept so the checkpoint and the search's summary can be looked at.

use std::{
    io::Write,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{api::status::JobDoc, cli::local::LocalCluster};

/// Nodes the demo starts.
const DEMO_NODES: usize = 3;
/// How long the demo waits for the cluster to form, in seconds.
const FORM_WAIT_S: u64 = 30;
/// How long the training job may take, in seconds.
const TRAIN_WAIT_S: u64 = 600;
/// Gap between two polls of the job, in milliseconds.
const POLL_MS: u64 = 250;
/// Validation accuracy the demo's job must reach.
pub const ACCURACY_MIN: f64 = 0.97;
/// The job the demo runs (shipped with the binary).
const JOB_SPEC: &str = include_str!("../../../examples/jobs/digits-mlp.toml");
/// The search the demo runs after it (shipped with the binary).
const SEARCH_SPEC: &str = include_str!("../../../examples/jobs/digits-asha.toml");
/// How long the search may take, in seconds.
const SEARCH_WAIT_S: u64 = 600;
/// Validation accuracy the search's best trial must reach.
pub const SEARCH_BEST_MIN: f64 = 0.9;

/// Starts a local 3-node cluster, trains the digits MLP on it, and stops it.
pub fn run() -> Result<()> {
    let exe = std::env::current_exe().context("locating the ringleader binary")?;
    let root = tempfile::Builder::new()
        .prefix("ringleader-demo-")
        .tempdir()?
        .keep();
    let mut cluster = LocalCluster::new(exe, &root);
    let t0 = Instant::now();
    let result = train(&mut cluster, &root).and_then(|trained| {
        let searched = search(&cluster)?;
        Ok(format!("{trained}; {searched}"))
    });
    println!("stopping the cluster");
    cluster.stop_all();
    let outcome = result?;
    println!(
        "demo finished in {:.1} s: {outcome}",
        t0.elapsed().as_secs_f64()
    );
    println!("(the nodes' data is kept in {})", root.display());
    Ok(())
}

/// Forms the cluster, runs the job, and checks it; returns a one-line summary.
fn train(cluster: &mut LocalCluster, root: &std::path::Path) -> Result<String> {
    println!(
        "starting a local cluster of {DEMO_NODES} nodes in {}",
        root.display()
    );
    cluster.start("demo-1", &[])?;
    for i in 2..=DEMO_NODES {
        cluster.start_joining(&format!("demo-{i}"), &[])?;
    }
    let took = cluster.wait_all(
        Duration::from_secs(FORM_WAIT_S),
        "every node to see all alive with a chief",
        |s| s.names_in("alive").len() == DEMO_NODES && s.chief.is_some(),
    )?;
    println!(
        "cluster formed in {:.2} s; status from demo-1:\n",
        took.as_secs_f64()
    );
    print!("{}", cluster.status(0)?.to_table());

    let client = cluster.nodes[DEMO_NODES - 1].client();
    let id = client.submit(JOB_SPEC).context("submitting the demo job")?;
    println!("\nsubmitted examples/jobs/digits-mlp.toml to demo-{DEMO_NODES}: job {id}");
    let started = Instant::now();
    let doc = follow(&cluster.nodes[0].client(), &id, TRAIN_WAIT_S, progress)?;
    let secs = started.elapsed().as_secs_f64();
    if doc.state != "succeeded" {
        bail!(
            "job {id} {}: exits {:?}; see `ringleader logs {id}`",
            doc.state,
            doc.exits
        );
    }
    let acc = doc.metrics.get("val_accuracy").copied().unwrap_or(0.0);
    println!(
        "trained on {} workers ({}) in {secs:.1} s: step {}, validation accuracy {:.2}%",
        doc.ring.len(),
        doc.ring.join(", "),
        doc.step.unwrap_or(0),
        100.0 * acc
    );
    if acc < ACCURACY_MIN {
        bail!(
            "validation accuracy {:.2}% is below {:.0}%",
            100.0 * acc,
            100.0 * ACCURACY_MIN
        );
    }
    let rank0 = doc.ring.first().context("the job has no ring")?;
    let node = cluster
        .nodes
        .iter()
        .find(|n| &n.name == rank0)
        .context("rank 0's node")?;
    let ckpt_root = node.dir.join("store/jobs").join(&id).join("ckpt");
    let latest = std::fs::read_dir(&ckpt_root)
        .with_context(|| format!("reading {}", ckpt_root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join(trainer::COMMIT_FILE).is_file())
        .max()
        .with_context(|| format!("no committed checkpoint under {}", ckpt_root.display()))?;
    println!(
        "checkpoint (written by rank 0 on {rank0}): {}",
        latest.display()
    );
    Ok(format!(
        "job {id} reached {:.2}% validation accuracy",
        100.0 * acc
    ))
}

/// Runs the ASHA search on the formed cluster and prints its leaderboard; returns a
/// one-line summary.
fn search(cluster: &LocalCluster) -> Result<String> {
    let client = cluster.nodes[0].client();
    let id = client
        .submit(SEARCH_SPEC)
        .context("submitting the demo search")?;
    println!("\nsubmitted examples/jobs/digits-asha.toml (an ASHA search) to demo-1: job {id}");
    let started = Instant::now();
    let doc = follow(&client, &id, SEARCH_WAIT_S, |doc| {
        let count = |s: &str| doc.trials.iter().filter(|t| t.state == s).count();
        format!(
            "{id} [{}] {} trials: {} running, {} paused, {} stopped early, {} finished;",
            doc.state,
            doc.trials.len(),
            count("running"),
            count("paused"),
            count("stopped"),
            count("succeeded"),
        )
    })?;
    if doc.state != "succeeded" {
        bail!("search {id} {}; see `ringleader job {id}`", doc.state);
    }
    println!("leaderboard (`ringleader trials {id}`):");
    print!("{}", doc.leaderboard_table());
    let best = doc.best.as_ref().context("the search has no best trial")?;
    if best.metric < SEARCH_BEST_MIN {
        bail!(
            "the search's best validation accuracy {:.2}% is below {:.0}%",
            100.0 * best.metric,
            100.0 * SEARCH_BEST_MIN
        );
    }
    let epochs: u32 = doc.trials.iter().map(|t| t.resource).sum();
    Ok(format!(
        "search {id}: {} trials, {epochs} epochs in all, best {:.2}% in {:.1} s",
        doc.trials.len(),
        100.0 * best.metric,
        started.elapsed().as_secs_f64()
    ))
}

/// Polls job `id` and shows `line(doc)` and the time since the start until the job ends (its
/// last document) or `wait_s` pass (an error). On a terminal the line is redrawn in place;
/// elsewhere (a pipe, a log) a line is printed each time `line(doc)` changes.
fn follow(
    client: &crate::api::client::ApiClient,
    id: &str,
    wait_s: u64,
    line: impl Fn(&JobDoc) -> String,
) -> Result<JobDoc> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(wait_s);
    let redraw = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut shown = 0usize;
    let mut last = String::new();
    loop {
        if let Ok(doc) = client.job(id) {
            let text = line(&doc);
            let timed = format!("{text} {:.1} s", started.elapsed().as_secs_f64());
            if redraw {
                print!("\r{timed:<shown$}");
                shown = timed.len();
                let _ = std::io::stdout().flush();
            } else if text != last {
                println!("{timed}");
                last = text;
            }
            if matches!(doc.state.as_str(), "succeeded" | "failed" | "cancelled") {
                if redraw {
                    println!();
                }
                return Ok(doc);
            }
        }
        if Instant::now() > deadline {
            if redraw {
                println!();
            }
            bail!("job {id} did not finish in {wait_s} s");
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
}

/// The live progress line: state, step, epoch, loss, validation accuracy (the time is
/// added by [`follow`]).
fn progress(doc: &JobDoc) -> String {
    let mut s = format!("{} [{}]", doc.id, doc.state);
    if let Some(step) = doc.step {
        s.push_str(&format!(" step {step}"));
    }
    if let Some(epoch) = doc.epoch {
        s.push_str(&format!(" epoch {epoch}"));
    }
    if let Some(loss) = doc.metrics.get("loss") {
        s.push_str(&format!(" loss {loss:.4}"));
    }
    if let Some(acc) = doc.metrics.get("val_accuracy") {
        s.push_str(&format!(" val_accuracy {:.2}%", 100.0 * acc));
    }
    if let Some(r) = doc.metrics.get("samples_per_s") {
        s.push_str(&format!(" {r:.0} samples/s"));
    }
    s
}
