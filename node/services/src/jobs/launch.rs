//! How a rank is launched: its ports, its environment, its command line and the files it
//! needs. Pure: every node computes the same ring from the replicated job record, without a
//! round-trip.
//!
//! - Command jobs get the environment torchrun gives (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//!   `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, [`master_port`], `TORCHELASTIC_RESTART_COUNT`, …), so
//!   an unmodified PyTorch DDP script works, and [`ELASTIC_PROTOCOL_ENV`]. A command rank of
//!   `[elastic] protocol = "ringleader"` lives through re-forms, so those variables hold its
//!   first generation's values only: its generations ([`generation_line`], on stdin, the
//!   train ring's addresses and secret below) are the truth, which `ringleader.torch` reads.
//! - GPUs: a rank given devices (`Slot::gpus`) gets `CUDA_VISIBLE_DEVICES` naming exactly
//!   those ([`crate::gpus::visible_devices`]) and `CUDA_DEVICE_ORDER=PCI_BUS_ID`, the order
//!   the node numbers them in ([`gpus::DEVICE_ORDER`]), both set after the spec's `env` so
//!   they win; and `LD_LIBRARY_PATH` with the node's link directory of CUDA libraries and
//!   their directories first, then the spec's value or else the node's
//!   ([`gpus::RankLibraries`]). A rank given none has all three left as the node's (or the
//!   spec's). Train ranks also get `RINGLEADER_GPUS`, their device count (0: the CPU).
//! - Train jobs run this node's own binary as `ringleader train-worker` with a spec file
//!   (the trainer's sections, [`crate::domain::train_spec::spec_text`]) and the ring:
//!   - address of rank r: the host of the member's advertised `data_addr`, port
//!     [`data_port`]`(job, r)` = [`master_port`]`(job, generation, secret) + 1 + r`;
//!   - group id: from the job id (the trainer hashes it); generation: the generation;
//!   - secret: [`ring_secret`], from the generation's random [`Job::ring_secret`] (a nonce
//!     drawn by the chief and replicated with the placement) keyed by the cluster key, so the
//!     secret itself is never stored: the Raft log, its snapshots and every replica hold only
//!     the nonce, useless without the key (under `--insecure`, with no key, the nonce is the
//!     secret, as before). Handed over in the environment (`RINGLEADER_SECRET`), never shown
//!     by the API. A process without it (a stale worker of an earlier generation, another
//!     job's, anyone on the data network, a local user who read the node's files) fails the
//!     ring handshake.

use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
};

use ringleader_protocol::env as rank_env;

use crate::{
    control::logs::log_path,
    domain::{
        spec::JobKind,
        state::{Job, JobId, Slot},
        train_spec,
    },
    gpus,
};

/// First port of the range `MASTER_PORT` is drawn from. The range, plus the train ring's
/// ports just above it (one per rank), stays below Linux's ephemeral ports (32768 and up), so
/// an outgoing connection of this host never holds the port a rank must bind.
const MASTER_PORT_BASE: u16 = 20_000;
/// Size of that range.
const MASTER_PORT_SPAN: u16 = 11_000;

/// The rendezvous port of a generation: the same on every node, different across
/// generations, and across clusters that share a host (it hashes the generation's random
/// ring secret too).
pub fn master_port(id: JobId, generation: u32, secret: &str) -> u16 {
    let h = blake3::hash(format!("{id}/{generation}/{secret}").as_bytes());
    let x = u16::from_le_bytes([h.as_bytes()[0], h.as_bytes()[1]]);
    MASTER_PORT_BASE + x % MASTER_PORT_SPAN
}

/// The key-derivation context of [`LaunchContext::ring_key`] (changing it changes every
/// ring's secret).
pub const RING_KEY_CONTEXT: &str = "ringleader 2026-11 ring secret v1";

/// The ring secret of `job`'s current generation: the replicated nonce keyed by `ring_key`
/// (BLAKE3's keyed hash over the job id, the generation and the nonce), or the nonce itself
/// when the cluster has no key (`--insecure`). Every member computes the same value.
pub fn ring_secret(job: &Job, ring_key: Option<&[u8; 32]>) -> String {
    match ring_key {
        Some(key) => {
            let input = format!("{}/{}/{}", job.id, job.generation, job.ring_secret);
            blake3::keyed_hash(key, input.as_bytes())
                .to_hex()
                .to_string()
        }
        None => job.ring_secret.clone(),
    }
}

/// `job`'s `[secrets]`, opened for its ranks' environment. A value that does not open
/// (sealed under another cluster's key: never within one cluster) is left out and logged;
/// the rank then runs without it and says so itself.
fn open_secrets(ctx: &LaunchContext, job: &Job) -> Vec<(String, String)> {
    let mut out = Vec::with_capacity(job.spec.secrets.len());
    for (name, sealed) in &job.spec.secrets {
        let opened = match &ctx.secrets_key {
            Some(key) => crate::security::sealed::unseal_any(&key.with_retired(), name, sealed),
            None => Err(crate::security::sealed::SealError::Forged { name: name.clone() }),
        };
        match opened {
            Ok(value) => out.push((name.clone(), value)),
            Err(e) => tracing::error!(job = %job.id, "{e}: the rank starts without it"),
        }
    }
    out
}

/// The data-plane port of `rank` in `job`'s current generation: one above the generation's
/// rendezvous port, then one per rank (so several ranks fit on one host).
pub fn data_port(job: &Job, rank: u32) -> u16 {
    master_port(job.id, job.generation, &job.ring_secret)
        .saturating_add(1)
        .saturating_add(rank.min(u16::MAX as u32) as u16)
}

/// The data-plane address of every rank of `job`'s current generation, in rank order, or
/// `None` while a member's host is unknown. `host_of` gives a member's advertised host.
pub fn ring_addrs(job: &Job, host_of: &dyn Fn(&str) -> Option<String>) -> Option<Vec<SocketAddr>> {
    job.assignment
        .iter()
        .map(|slot| {
            let ip: IpAddr = host_of(&slot.member)?.parse().ok()?;
            Some(SocketAddr::new(ip, data_port(job, slot.rank)))
        })
        .collect()
}

/// The storage URL `ringleader node` uses by default: `file://<data-dir>/store`, the data
/// dir being the parent of `jobs_dir`.
pub fn default_storage(jobs_dir: &Path) -> String {
    let data_dir = jobs_dir.parent().unwrap_or(jobs_dir);
    let abs = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    format!("file://{}", abs.join("store").display())
}

/// The control line that moves a live elastic rank (a train rank, a command rank of the
/// ringleader protocol) to `job`'s current generation as `slot`'s rank, or `None` while a
/// ring member's address is unknown. A command rank of that protocol also starts with it.
pub fn generation_line(
    ctx: &LaunchContext,
    job: &Job,
    slot: &Slot,
    host_of: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    let generation = trainer::elastic::Generation {
        generation: u64::from(job.generation),
        rank: slot.rank as usize,
        addrs: ring_addrs(job, host_of)?,
        secret: ring_secret(job, ctx.ring_key.as_ref().map(|k| k.current()).as_ref()),
        batch_workers: job.batch_workers(),
    };
    Some(generation.to_line())
}

/// The rank environment's names this module writes, under the names the node's code knows
/// them by (each one's doc is in [`ringleader_protocol::env`]).
pub use ringleader_protocol::env::{
    ELASTIC_PROTOCOL as ELASTIC_PROTOCOL_ENV, STANDBY as STANDBY_ENV,
    TRIAL_RESOURCE as TRIAL_RESOURCE_ENV, TRIAL_RESUMABLE as TRIAL_RESUMABLE_ENV,
};

/// What a node launches its ranks with.
#[derive(Clone, Debug)]
pub struct LaunchContext {
    /// The member's peer id.
    pub me: String,
    /// `<data-dir>/jobs`: logs and spec files.
    pub jobs_dir: PathBuf,
    /// Checkpoint storage URL handed to train workers (as `RINGLEADER_STORAGE`).
    pub storage: String,
    /// This node's binary (train ranks run it as `train-worker`).
    pub exe: String,
    /// The node's own `CUDA_VISIBLE_DEVICES` entries when it was started with them
    /// ([`gpus::inherited_visible_devices`]): device `i` of a rank is entry `i`. `None`: the
    /// index itself.
    pub device_names: Option<Vec<String>>,
    /// Whether this node offers GPUs: a rank given none then gets an empty
    /// `CUDA_VISIBLE_DEVICES` (none), not the node's whole view.
    pub offers_gpus: bool,
    /// The interface holding this node's data-plane address ([`super::interfaces`]), given
    /// to ranks as [`SOCKET_IFNAME_ENV`]; `None`: not found, left to NCCL and gloo.
    pub socket_ifname: Option<String>,
    /// The CUDA libraries ranks given devices load ([`gpus::libraries::prepare`], at
    /// start); the default: none, their `LD_LIBRARY_PATH` is left alone.
    pub libraries: gpus::RankLibraries,
    /// The key rings' secrets are derived with (from the cluster key, see [`ring_secret`]);
    /// `None` under `--insecure`.
    pub ring_key: Option<crate::cluster::key_ring::DerivedKey>,
    /// The key jobs' `[secrets]` open with ([`crate::security::sealed`]; the retired key's
    /// too, for values sealed before a rotation); `None` under `--insecure` (whose API
    /// refuses `[secrets]`).
    pub secrets_key: Option<crate::cluster::key_ring::DerivedKey>,
    /// How command ranks reach their checkpoint place through this node's API
    /// ([`super::checkpoint`]); `None`: they get no place (the tests).
    pub checkpoints: Option<super::checkpoint::CheckpointAccess>,
}

#[cfg(test)]
impl LaunchContext {
    /// The context of member `me` in the tests: no key, `memory://` storage, no devices'
    /// names or libraries.
    #[cfg(test)]
    pub(crate) fn for_test(me: &str) -> LaunchContext {
        LaunchContext {
            me: me.into(),
            jobs_dir: PathBuf::from("/tmp/rl/jobs"),
            storage: "memory://".into(),
            exe: "/bin/ringleader".into(),
            device_names: None,
            offers_gpus: false,
            socket_ifname: None,
            libraries: Default::default(),
            ring_key: None,
            secrets_key: None,
            checkpoints: None,
        }
    }
}

/// One rank's process, ready to spawn.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// Program and arguments.
    pub command: Vec<String>,
    /// Files written before the process starts (path, contents): a train rank's spec file,
    /// a command rank's `[[files]]` (inside `work_dir`).
    pub files: Vec<(PathBuf, Vec<u8>)>,
    /// The directory the process runs in, made before it starts: a command rank with
    /// `[[files]]` runs in `<data-dir>/jobs/<id>/generation-<g>/worker-<w>/`, where they are
    /// written (`None`: the node's own working directory, or `--run-as`'s, the same place).
    pub work_dir: Option<PathBuf>,
    /// Environment added to the node's.
    pub env: Vec<(String, String)>,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
    /// A search trial's metric: rank 0's `ringleader-report` lines report it.
    pub trial_metric: Option<String>,
    /// Rank 0's `ringleader-metric <trial_metric> VALUE [STEP]` lines report it too, STEP in
    /// epochs (a command trial; a train trial's metric lines count steps).
    pub trial_metric_lines: bool,
    /// A shared dataset the process trains on: it is fetched to this node first if
    /// missing, and its directory goes to the process as `RINGLEADER_DATASET_DIR`.
    pub dataset: Option<String>,
    /// The rung a resumable command trial's run ends at: rank 0 still running a while
    /// after reporting it is stopped, and its reports beyond it are dropped.
    pub trial_rung: Option<u32>,
}

/// The shared dataset a train or command job names (`[data] dataset`), if it is not a
/// built-in (a command job's is always shared: the built-ins are the trainer's).
pub fn shared_dataset(job: &Job) -> Option<String> {
    let name = job.spec.tables().data.as_ref()?.get("dataset")?.as_str()?;
    match job.spec.kind {
        JobKind::Command => return Some(name.to_owned()),
        JobKind::Train => {}
        JobKind::Search => return None,
    }
    let name = job.spec.tables().data.as_ref()?.get("dataset")?.as_str()?;
    (!crate::domain::state::datasets::BUILTIN.contains(&name)).then(|| name.to_owned())
}

/// The variables NCCL and gloo pick their sockets' interface by: a rank gets the interface
/// of this node's data-plane address ([`LaunchContext::socket_ifname`]) unless its spec's
/// `env` sets them.
pub const SOCKET_IFNAME_ENV: [&str; 2] = ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"];

/// The device indices `slot`'s rank sees, in the order it numbers them from 0.
///
/// - A command rank sees every device its job holds on its host, its host-mates' in local
///   rank order, as torchrun's ranks do: local rank `l`'s own are entries
///   `l * gpus_per_worker ..`, so `torch.cuda.set_device(LOCAL_RANK)` picks its own. Ranks of
///   other jobs hold none of them (placement is exclusive).
/// - A train rank sees only its own (the trainer computes on device 0).
/// - A rank given none sees none (empty).
///
/// Invariant: non-empty exactly when the slot holds devices, and then holds the slot's own.
pub fn rank_devices(job: &Job, slot: &Slot) -> Vec<u32> {
    if slot.gpus.is_empty() || job.spec.kind != JobKind::Command {
        return slot.gpus.clone();
    }
    // `slot` itself even when the assignment lacks it (a standby joiner's, started ahead
    // of the re-form that takes it in).
    let mut on_host: Vec<&Slot> = job
        .assignment
        .iter()
        .filter(|s| s.member == slot.member && s.worker != slot.worker)
        .chain([slot])
        .collect();
    on_host.sort_by_key(|s| (s.local_rank, s.rank));
    on_host
        .iter()
        .flat_map(|s| s.gpus.iter().copied())
        .collect()
}

/// The launch of `slot` of `job`'s current generation, or `None` while a train ring member's
/// address is unknown. `host_of` gives a member's advertised host.
pub fn launch(
    ctx: &LaunchContext,
    job: &Job,
    slot: &Slot,
    host_of: &dyn Fn(&str) -> Option<String>,
) -> Option<Launch> {
    let rank0 = &job.assignment[0];
    let master_addr = host_of(&rank0.member).unwrap_or_else(|| "127.0.0.1".to_string());
    let local_world = job
        .assignment
        .iter()
        .filter(|s| s.member == slot.member)
        .count();
    let mut env: Vec<(String, String)> = vec![
        ("RANK".into(), slot.rank.to_string()),
        ("WORLD_SIZE".into(), job.assignment.len().to_string()),
        ("LOCAL_RANK".into(), slot.local_rank.to_string()),
        ("LOCAL_WORLD_SIZE".into(), local_world.to_string()),
        ("GROUP_RANK".into(), "0".into()),
        ("MASTER_ADDR".into(), master_addr),
        (
            "MASTER_PORT".into(),
            master_port(job.id, job.generation, &job.ring_secret).to_string(),
        ),
        (
            "TORCHELASTIC_RESTART_COUNT".into(),
            (job.generation - 1).to_string(),
        ),
        (
            "TORCHELASTIC_MAX_RESTARTS".into(),
            job.max_restarts.to_string(),
        ),
        (rank_env::JOB_ID.into(), job.id.to_string()),
        (rank_env::ATTEMPT.into(), job.attempt.to_string()),
        (rank_env::GENERATION.into(), job.generation.to_string()),
        (
            rank_env::PROTOCOL_VERSION.into(),
            ringleader_protocol::PROTOCOL_VERSION.to_string(),
        ),
    ];
    if let Some(of) = &job.trial_of {
        env.push((rank_env::SEARCH_ID.into(), of.search.to_string()));
        env.push((rank_env::TRIAL_ID.into(), of.trial.to_string()));
        env.push((rank_env::TRIAL_COPY.into(), u8::from(of.copy).to_string()));
        if of.target > 0 {
            // The rung this run must reach, in the search's resource unit (epochs).
            env.push((TRIAL_RESOURCE_ENV.into(), of.target.to_string()));
        }
        if of.resumable {
            env.push((TRIAL_RESUMABLE_ENV.into(), "1".into()));
        }
    }
    env.extend(job.spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend(open_secrets(ctx, job));
    let devices = rank_devices(job, slot);
    if !devices.is_empty() {
        let visible = gpus::visible_devices(&devices, ctx.device_names.as_deref());
        env.push(("CUDA_VISIBLE_DEVICES".into(), visible));
        env.push((gpus::DEVICE_ORDER_ENV.into(), gpus::DEVICE_ORDER.into()));
        let theirs = env
            .iter()
            .rev()
            .find(|(k, _)| k == gpus::libraries::LIBRARY_PATH_ENV)
            .map(|(_, v)| v.as_str());
        let path = match job.spec.kind {
            // A PyTorch script loads its wheel's own CUDA libraries: a toolkit's or another
            // virtualenv's first on its path break `import torch` when their minor differs.
            JobKind::Command => ctx.libraries.link_dir_path(theirs),
            JobKind::Train | JobKind::Search => ctx.libraries.library_path(theirs),
        };
        if let Some(path) = path {
            env.push((gpus::libraries::LIBRARY_PATH_ENV.into(), path));
        }
    } else if ctx.offers_gpus {
        // None of this host's devices: without this the rank would see them all, those
        // other jobs hold exclusively included.
        env.push(("CUDA_VISIBLE_DEVICES".into(), String::new()));
    }
    env.push((rank_env::GPUS.into(), slot.gpus.len().to_string()));
    if let Some(ifname) = &ctx.socket_ifname {
        for key in SOCKET_IFNAME_ENV {
            if !job.spec.env.contains_key(key) {
                env.push((key.into(), ifname.clone()));
            }
        }
    }
    let trial_metric = job.trial_of.as_ref().map(|t| t.metric.clone());
    let log = log_path(&ctx.jobs_dir, job.id, job.process_generation(), slot.worker);
    if job.spec.kind != JobKind::Train {
        let work_dir = (!job.spec.files.is_empty()).then(|| log.with_extension(""));
        let files = match &work_dir {
            Some(dir) => job
                .spec
                .files
                .iter()
                .map(|f| (dir.join(&f.path), f.bytes().unwrap_or_default()))
                .collect(),
            None => Vec::new(),
        };
        if let Some(access) = &ctx.checkpoints {
            env.extend(super::checkpoint::rank_env(access, job));
        }
        env.push((
            ELASTIC_PROTOCOL_ENV.into(),
            job.spec.elastic.protocol.as_str().into(),
        ));
        return Some(Launch {
            command: job.spec.command.clone(),
            files,
            work_dir,
            env,
            log,
            trial_metric_lines: trial_metric.is_some(),
            trial_metric,
            dataset: shared_dataset(job),
            trial_rung: job
                .trial_of
                .as_ref()
                .filter(|of| of.resumable && of.target > 0)
                .map(|of| of.target),
        });
    }
    let addrs = ring_addrs(job, host_of)?;
    // The rank's own file: ranks of one generation on one node start at once, and a shared
    // file one replaces while another writes it fails one of them.
    let spec_file = log.with_extension("spec.toml");
    env.push((
        rank_env::SECRET.into(),
        ring_secret(job, ctx.ring_key.as_ref().map(|k| k.current()).as_ref()),
    ));
    // In the environment, not the argv: a storage URL may carry keys, and a command line
    // is readable by every user of the host (/proc/PID/cmdline, ps).
    env.push((rank_env::STORAGE.into(), ctx.storage.clone()));
    let data_dir = ctx.jobs_dir.parent().unwrap_or(&ctx.jobs_dir);
    let addrs: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    let mut command = vec![
        ctx.exe.clone(),
        "train-worker".into(),
        "--spec".into(),
        spec_file.display().to_string(),
        "--rank".into(),
        slot.rank.to_string(),
        "--addrs".into(),
        addrs.join(","),
        "--job-id".into(),
        job.id.to_string(),
        "--generation".into(),
        job.generation.to_string(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--metric-lines".into(),
    ];
    if job.is_elastic() {
        command.push("--elastic".into());
    }
    if let Some(b) = job.batch_workers() {
        // A preempted ring's kept global batch (a joiner started while it is shrunk).
        command.push("--batch-workers".into());
        command.push(b.to_string());
    }
    if let Some(target) = job.trial_of.as_ref().map(|t| t.target).filter(|t| *t > 0) {
        // A search trial trained to its rung; the schedule stays the whole run's.
        command.push("--stop-at-epoch".into());
        command.push(target.to_string());
    }
    Some(Launch {
        command,
        files: vec![(spec_file, train_spec::spec_text(&job.spec).into_bytes())],
        work_dir: None,
        env,
        log,
        trial_metric,
        trial_metric_lines: false,
        dataset: shared_dataset(job),
        trial_rung: None,
    })
}

#[cfg(test)]
mod tests;
