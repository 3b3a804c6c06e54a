//! `ringleader job preempt JOB (--shrink-to N | --requeue | --pause-trials N) [--for JOB]
//! [--reason TEXT]` and `ringleader job grow JOB --to N`: the admin's hand on preemption
//! (as Slurm's `scontrol requeue`), the same mechanism the scheduler drives
//! (`domain::state::preempt`, `POST /v1/jobs/{id}/preempt` and `/grow`). Both need the
//! admin token.

use anyhow::{bail, Result};
use clap::Subcommand;

use super::{client, Cli};

/// `ringleader job …` actions.
#[derive(Debug, Subcommand)]
pub enum JobCmd {
    /// Take capacity from a running job: shrink an elastic ring at a step boundary (its
    /// survivors keep their state and, by default, the global batch), requeue a job after a
    /// checkpoint (no restart used), or pause a search's trials (each requeued from its
    /// checkpoint).
    Preempt {
        /// The job.
        id: String,
        /// Shrink the ring to this many workers (at least min_workers).
        #[arg(long, conflicts_with_all = ["requeue", "pause_trials"])]
        shrink_to: Option<u32>,
        /// Checkpoint, stop and requeue the job at its old place.
        #[arg(long, conflicts_with = "pause_trials")]
        requeue: bool,
        /// Pause this many of a search's running trials.
        #[arg(long)]
        pause_trials: Option<u32>,
        /// The job the capacity is for (named in the history; the preempted job is not
        /// placed ahead of it).
        #[arg(long = "for")]
        for_job: Option<String>,
        /// Why, for the job's history.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Let a shrunk elastic ring grow back, up to N workers (at most max_workers), at the
    /// next generation.
    Grow {
        /// The job.
        id: String,
        /// The ring's size to grow to.
        #[arg(long)]
        to: u32,
        /// Why, for the job's history (default: capacity returned).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// Runs a `job` action.
pub fn run(cli: &Cli, cmd: &JobCmd) -> Result<()> {
    let (path, body) = match cmd {
        JobCmd::Preempt {
            id,
            shrink_to,
            requeue,
            pause_trials,
            for_job,
            reason,
        } => {
            let action = match (shrink_to, requeue, pause_trials) {
                (Some(n), false, None) => serde_json::json!({ "shrink": { "to_workers": n } }),
                (None, true, None) => serde_json::json!("requeue"),
                (None, false, Some(n)) => serde_json::json!({ "pause_trials": { "count": n } }),
                _ => bail!("give one of --shrink-to N, --requeue, --pause-trials N"),
            };
            let body = serde_json::json!({ "action": action, "for": for_job, "reason": reason });
            (format!("/v1/jobs/{id}/preempt"), body)
        }
        JobCmd::Grow { id, to, reason } => {
            let body = serde_json::json!({ "to_workers": to, "reason": reason });
            (format!("/v1/jobs/{id}/grow"), body)
        }
    };
    let v: serde_json::Value = client(cli)?.post_json(&path, &body)?;
    if cli.json {
        println!("{v}");
    } else if let Some(done) = v.get("done").and_then(|d| d.as_str()) {
        println!("{done}");
    }
    Ok(())
}
