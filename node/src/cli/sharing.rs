//! `ringleader quota set | ls` and `ringleader queue`: the cluster's quotas and its waiting
//! jobs (see `api::sharing`). Setting a quota needs the admin token.

use anyhow::Result;
use clap::{Args, Subcommand};

use super::{client, Cli};
use crate::api::{sharing::QueueDoc, status::QuotaRow};

/// `ringleader quota …`.
#[derive(Debug, Subcommand)]
pub enum QuotaCmd {
    /// Set fields of USER's quota (USER may be `@GROUP`); fields not given keep their
    /// value. Needs the admin token.
    Set(SetArgs),
    /// Each user's usage now against its quota: used, quota, borrowed, GPU-hours used in
    /// the last 7 days (`--json`: [{user, quota, used, borrowed, gpu_hours_used}]).
    Ls,
}

/// `ringleader quota set` flags.
#[derive(Debug, Args)]
pub struct SetArgs {
    /// The user (a token's user), or `@GROUP` for a group's quota.
    pub user: String,
    /// Cpus the user's running ranks may hold as its own.
    #[arg(long)]
    pub cpus: Option<u32>,
    /// GPUs the user's running ranks may hold as its own.
    #[arg(long)]
    pub gpus: Option<u32>,
    /// Most cpus borrowed above `--cpus` from idle capacity (unset: any; 0: none).
    #[arg(long)]
    pub borrow_cpus: Option<u32>,
    /// Most GPUs borrowed above `--gpus` from idle capacity (unset: any; 0: none).
    #[arg(long)]
    pub borrow_gpus: Option<u32>,
    /// GPU-hours the user may use in any 7 days; once spent, its new GPU jobs wait.
    #[arg(long)]
    pub gpu_hours: Option<f64>,
    /// The user's weight in fair share (default 1).
    #[arg(long)]
    pub weight: Option<u32>,
    /// The highest priority the user may submit with (low, normal, high, or 0 to 1000).
    #[arg(long, value_parser = parse_priority)]
    pub max_priority: Option<u32>,
    /// The group whose quota (`quota set @GROUP …`) the user's ranks count against too.
    #[arg(long)]
    pub group: Option<String>,
    /// Whether the user may submit `preemptible = false` (unset: no; admins always may).
    #[arg(long)]
    pub may_refuse_preemption: Option<bool>,
}

fn parse_priority(text: &str) -> Result<u32, String> {
    crate::domain::spec::priority::parse(text)
}

/// Runs a quota command.
pub fn run_quota(cli: &Cli, cmd: &QuotaCmd) -> Result<()> {
    let c = client(cli)?;
    match cmd {
        QuotaCmd::Set(a) => {
            let body = serde_json::json!({
                "user": a.user,
                "cpus": a.cpus,
                "gpus": a.gpus,
                "borrow_cpus": a.borrow_cpus,
                "borrow_gpus": a.borrow_gpus,
                "gpu_hours": a.gpu_hours,
                "weight": a.weight,
                "max_priority": a.max_priority,
                "group": a.group,
                "may_refuse_preemption": a.may_refuse_preemption,
            });
            let v: serde_json::Value = c.post_json("/v1/quotas", &body)?;
            if cli.json {
                println!("{v}");
            } else {
                println!("quota of {} set: {}", a.user, v["quota"]);
            }
        }
        QuotaCmd::Ls => {
            let v: serde_json::Value = c.get("/v1/quotas")?;
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let rows: Vec<QuotaRow> = serde_json::from_value(v)?;
            println!(
                "{:<16} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>12}",
                "USER",
                "CPUS",
                "QUOTA",
                "BORROWED",
                "GPUS",
                "QUOTA",
                "BORROWED",
                "WEIGHT",
                "GPU-HOURS"
            );
            let opt = |v: Option<u32>| v.map_or("-".to_owned(), |n| n.to_string());
            for r in rows {
                let hours = match (r.gpu_hours_used, r.quota.gpu_hours) {
                    (Some(used), Some(budget)) => format!("{used:.1}/{budget:.1}"),
                    _ => "-".into(),
                };
                println!(
                    "{:<16} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>12}",
                    r.user,
                    r.used.cpus,
                    opt(r.quota.cpus),
                    r.borrowed.cpus,
                    r.used.gpus,
                    opt(r.quota.gpus),
                    r.borrowed.gpus,
                    r.quota.weight(),
                    hours
                );
            }
        }
    }
    Ok(())
}

/// `ringleader queue`: the waiting jobs (and searches whose trials wait, named `(trials)`)
/// in the order they will start, with owners and reasons (`--json`: {jobs: [{position, id, name, owner, priority, …, pending_reason}]}).
pub fn run_queue(cli: &Cli) -> Result<()> {
    let c = client(cli)?;
    let v: serde_json::Value = c.get("/v1/queue")?;
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let doc: QueueDoc = serde_json::from_value(v)?;
    if doc.jobs.is_empty() {
        println!("no job waits");
        return Ok(());
    }
    println!(
        "{:>4} {:<10} {:<20} {:<12} {:<9} {:>7}  REASON",
        "#", "ID", "NAME", "OWNER", "PRIORITY", "RANKS"
    );
    for j in doc.jobs {
        let name = if j.trials {
            format!("{} (trials)", j.name)
        } else {
            j.name
        };
        println!(
            "{:>4} {:<10} {:<20} {:<12} {:<9} {:>7}  {}",
            j.position,
            j.id,
            name,
            j.owner,
            j.priority_label,
            j.workers,
            j.pending_reason.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}
