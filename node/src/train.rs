//! `kind = "train"` jobs: what the node adds around the trainer.
//!
//! A train job runs through the same supervisor path as a command job (see
//! [`crate::worker`]): each assigned rank is a process, here the node's own binary run as
//! `ringleader train-worker …` (the hidden subcommand, [`run_worker`]), which calls
//! [`trainer::worker::run`]. Rank 0 prints `ringleader-metric` lines that become job
//! metrics; rank 0 writes checkpoints under `jobs/<job-id>/ckpt/<step>/` in the node's store.
//!
//! Data plane, derived so that every node computes the same ring without a round-trip:
//! - address of rank r: the host of the member's advertised `data_addr`, port
//!   [`data_port`]`(job, attempt, r)` = [`crate::worker::master_port`]`(job, attempt) + 1 + r`;
//! - group id: from the job id (the trainer hashes it); generation: the attempt;
//! - secret: [`ring_secret`], 32 random bytes the chief drew for this attempt, replicated
//!   with the placement (only between members: the swarm is keyed when the cluster has a key)
//!   and handed to the workers in their environment; the API never shows it. A process
//!   without it (a stale worker of an earlier attempt, another job's, anyone on the data
//!   network without the cluster's state) fails the ring handshake.

use std::net::{IpAddr, SocketAddr};

use anyhow::Context;
use trainer::TrainSpec;

use crate::{
    control::state::{Job, JobId},
    jobs::spec::JobSpec,
    worker::master_port,
};

/// Sections of a job spec the trainer reads.
const SECTIONS: [&str; 4] = ["model", "data", "train", "checkpoint"];

/// The trainer's view of a job spec: its `[model]`, `[data]`, `[train]` and `[checkpoint]`
/// tables as TOML text (what the worker's spec file holds).
pub fn spec_text(spec: &JobSpec) -> String {
    let mut t = toml::Table::new();
    for (name, section) in
        SECTIONS
            .iter()
            .zip([&spec.model, &spec.data, &spec.train, &spec.checkpoint])
    {
        if let Some(s) = section {
            t.insert((*name).to_string(), toml::Value::Table(s.clone()));
        }
    }
    toml::to_string(&t).unwrap_or_default()
}

/// Checks a train job's trainer sections: unknown keys and bad values are refused, the
/// message naming the field (`train.lr: …`).
pub fn validate(spec: &JobSpec) -> Result<TrainSpec, String> {
    let known = known_keys();
    for (name, section) in
        SECTIONS
            .iter()
            .zip([&spec.model, &spec.data, &spec.train, &spec.checkpoint])
    {
        let Some(section) = section else { continue };
        let allowed = known
            .get(*name)
            .and_then(|v| v.as_table())
            .cloned()
            .unwrap_or_default();
        for key in section.keys() {
            if !allowed.contains_key(key) {
                let mut names: Vec<&str> = allowed.keys().map(String::as_str).collect();
                names.sort_unstable();
                return Err(format!(
                    "{name}.{key}: unknown field (known: {})",
                    names.join(", ")
                ));
            }
        }
    }
    TrainSpec::from_toml(&spec_text(spec)).map_err(|e| match e {
        trainer::TrainError::Spec(m) => m,
        other => other.to_string(),
    })
}

/// Every key the trainer's tables accept, from the serialized defaults (plus the optional
/// ones a default leaves out).
fn known_keys() -> toml::Table {
    let mut t: toml::Table = toml::to_string(&TrainSpec::default())
        .ok()
        .and_then(|s| toml::from_str(&s).ok())
        .unwrap_or_default();
    if let Some(toml::Value::Table(train)) = t.get_mut("train") {
        train.insert("max_steps".into(), toml::Value::Integer(0));
    }
    t
}

/// The data-plane port of `rank` in `attempt` of job `id`: one above the attempt's
/// rendezvous port, then one per rank (so several ranks fit on one host).
pub fn data_port(id: JobId, attempt: u32, rank: u32) -> u16 {
    master_port(id, attempt)
        .saturating_add(1)
        .saturating_add(rank.min(u16::MAX as u32) as u16)
}

/// The data-plane address of every rank of `job`'s current attempt, in rank order, or
/// `None` while a member's host is unknown. `host_of` gives a member's advertised host.
pub fn ring_addrs(job: &Job, host_of: &dyn Fn(&str) -> Option<String>) -> Option<Vec<SocketAddr>> {
    job.assignment
        .iter()
        .map(|slot| {
            let ip: IpAddr = host_of(&slot.member)?.parse().ok()?;
            Some(SocketAddr::new(
                ip,
                data_port(job.id, job.attempt, slot.rank),
            ))
        })
        .collect()
}

/// The shared secret of `job`'s data-plane connections: the current attempt's random
/// [`Job::ring_secret`], drawn by the chief when it placed the attempt.
pub fn ring_secret(job: &Job) -> &str {
    &job.ring_secret
}

/// The hidden `ringleader train-worker` subcommand: one worker process.
pub fn run_worker(args: trainer::worker::WorkerArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the worker runtime")?
        .block_on(trainer::worker::run(args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> JobSpec {
        JobSpec::parse(text).unwrap()
    }

    #[test]
    fn example_spec_validates() {
        let text = include_str!("../../examples/jobs/digits-mlp.toml");
        let spec = validate(&parse(text)).unwrap();
        assert_eq!(spec.model.arch, trainer::Arch::Mlp);
    }

    #[test]
    fn bad_fields_are_named() {
        let base = "name = \"a\"\nkind = \"train\"\n";
        let e = validate(&parse(&format!("{base}[train]\nlrr = 0.1\n"))).unwrap_err();
        assert!(e.starts_with("train.lrr: unknown field"), "{e}");
        let e = validate(&parse(&format!("{base}[train]\noptimizer = \"sgdd\"\n"))).unwrap_err();
        assert!(e.contains("optimizer"), "{e}");
        let e = validate(&parse(&format!("{base}[model]\nhidden = [0]\n"))).unwrap_err();
        assert!(e.contains("model.hidden"), "{e}");
        assert!(validate(&parse(&format!("{base}[train]\nmax_steps = 5\n"))).is_ok());
    }

    #[test]
    fn data_ports_follow_the_rendezvous_port() {
        let id = JobId::from_log_index(7);
        assert_eq!(data_port(id, 2, 0), master_port(id, 2) + 1);
        assert_eq!(data_port(id, 2, 3), master_port(id, 2) + 4);
    }
}
