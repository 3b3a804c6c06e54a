//! `ringleader node`: start-up, the node's parts wired together, and graceful shutdown.
//!
//! [`run`] reads as a list: the blocking start-up (`prepare`: the data directory, the
//! secrets, the identity, GPU discovery), then each part started from a config of its own
//! (`node::parts`: the listeners, the cluster, the control plane, the chief's driver, the
//! records' writers, the dataset service, the supervisor, the key rotation's follower, the
//! API), then, at SIGINT or SIGTERM, their ordered shutdown.

mod parts;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use libp2p::Multiaddr;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{
    cluster::{identity, membership},
    control, jobs,
};

/// File in the data directory where a running node records how to reach it.
pub const NODE_INFO_FILE: &str = "node.json";

/// How long start-up waits for the swarm's listener, in milliseconds.
const LISTEN_WAIT_MS: u64 = 5_000;

/// Everything `ringleader node` is started with, validated.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Human name of the node.
    pub name: String,
    /// libp2p listen address.
    pub listen: Multiaddr,
    /// HTTP API bind address.
    pub api: std::net::SocketAddr,
    /// Collective data-plane bind address (port 0: the OS picks).
    pub data: std::net::SocketAddr,
    /// Dataset transfer bind address (port 0: the OS picks).
    pub datasets: std::net::SocketAddr,
    /// Serving cap for datasets, bytes per second (0: none).
    pub dataset_upload_bytes_per_s: u64,
    /// Serving cap for datasets while a job's ring runs on this node, bytes per second
    /// (0: none).
    pub dataset_busy_bytes_per_s: u64,
    /// Seeds to join through.
    pub join: Vec<Multiaddr>,
    /// Where identity, state and the default store live.
    pub data_dir: PathBuf,
    /// Cluster key file (swarm.key format); `None`: `<data-dir>/cluster.key`, made at
    /// the first start of a node that joins nobody (see [`crate::security::bootstrap`]).
    pub cluster_key: Option<PathBuf>,
    /// How long the previous cluster key is still accepted after a rotation's switch, ms
    /// (`--key-overlap-ms`; default [`crate::cluster::key_ring::KEY_OVERLAP_MS_DEFAULT`]).
    pub key_overlap_ms: u64,
    /// Run an open cluster and, without `--token-file`, an open API (`--insecure`).
    pub insecure: bool,
    /// The interpreter `Client.launch`'s trials run under when not told (`--python`).
    pub python: Option<String>,
    /// Storage URL for checkpoints and records (may carry keys: log it through
    /// [`crate::api::redact::redact_url`]).
    pub storage: String,
    /// File holding an API token accepted beside the cluster's admin token.
    pub token_file: Option<PathBuf>,
    /// Labels advertised to the cluster.
    pub labels: BTreeMap<String, String>,
    /// Cpus advertised for placement (`None`: the host's).
    pub cpus: Option<u32>,
    /// Which of the host's GPUs the node offers to jobs (`--gpus`).
    pub gpus: crate::gpus::Selection,
    /// Membership timers and limits.
    pub membership: membership::Config,
    /// Raft builds a snapshot every this many entries (`--raft-snapshot-every`).
    pub raft_snapshot_every: u64,
    /// Ended jobs leave the live state this long after they finished, seconds (0: never).
    pub job_retention_s: u64,
    /// How the chief places waiting jobs while this node is chief (`--scheduler`).
    pub scheduler: crate::chief::scheduler::Policy,
    /// The API server's caps, timeouts and extra names (`--api-host`).
    pub api_limits: crate::api::server::ApiLimits,
    /// The user ranks run as (`--run-as`, resolved and checked at start; `None`: the
    /// node's).
    pub run_as: Option<crate::security::run_as::RunAs>,
    /// Directories below which a made token's `dataset add` may read (`--dataset-source`).
    pub dataset_sources: Vec<PathBuf>,
    /// Directories below which a made token's `dataset get --to` may write
    /// (`--dataset-dest`).
    pub dataset_dests: Vec<PathBuf>,
    /// `--run-as-range`: each job's ranks under a uid of their own from it (checked at
    /// start; exclusive with `run_as`).
    pub run_as_range: Option<crate::security::uid_range::UidRange>,
    /// Cap on the bytes a rank adds to its log per second (0: none; default
    /// [`crate::jobs::log_rate::RANK_LOG_BYTES_PER_S_MAX`]).
    pub rank_log_bytes_per_s: u64,
    /// Each user's limits on pending jobs and spec bytes, checked at submit
    /// (`--user-pending-jobs-max`, `--user-spec-bytes-max`; see [`crate::api::quota`]).
    pub user_limits: crate::api::quota::UserLimits,
}

/// What a running node writes to `<data-dir>/node.json`: how local tools reach it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: String,
    pub name: String,
    pub pid: u32,
    pub p2p_addrs: Vec<String>,
    pub api_addr: String,
    pub data_addr: String,
    #[serde(default)]
    pub datasets_addr: String,
}

impl NodeInfo {
    /// Reads `<dir>/node.json`.
    pub fn read(dir: &Path) -> Result<NodeInfo> {
        let text = std::fs::read_to_string(dir.join(NODE_INFO_FILE))?;
        Ok(serde_json::from_str(&text)?)
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// Replaces an unspecified IP (0.0.0.0) by a concrete one others can dial.
fn advertised(
    addr: std::net::SocketAddr,
    fallback: Option<std::net::IpAddr>,
) -> std::net::SocketAddr {
    if addr.ip().is_unspecified() {
        if let Some(ip) = fallback {
            return std::net::SocketAddr::new(ip, addr.port());
        }
    }
    addr
}

fn multiaddr_ip(m: &Multiaddr) -> Option<std::net::IpAddr> {
    m.iter().find_map(|p| match p {
        libp2p::multiaddr::Protocol::Ip4(ip) => Some(ip.into()),
        libp2p::multiaddr::Protocol::Ip6(ip) => Some(ip.into()),
        _ => None,
    })
}

/// The error for a port this node could not bind: says which flag, and that another process
/// (often another node) holds it.
fn bind_error(
    what: &str,
    flag: &str,
    addr: impl std::fmt::Display,
    e: std::io::Error,
) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::AddrInUse {
        anyhow::anyhow!(
            "{what} address {addr} is already in use (another ringleader node, or another \
             program, holds it): stop it or pick another {flag}"
        )
    } else {
        anyhow::Error::from(e).context(format!("binding the {what} on {addr} ({flag})"))
    }
}

/// What a node's start-up reads and writes on disk before it goes on the network.
struct Prepared {
    /// Held until the process ends: one node per data directory.
    _data_dir_lock: crate::data_dir::DataDirLock,
    gpu_source: crate::gpus::Source,
    discovered: crate::gpus::Discovery,
    secrets: crate::security::bootstrap::Secrets,
    key: libp2p::identity::Keypair,
    rank_libraries: crate::gpus::RankLibraries,
}

/// The start-up's blocking part (the data directory, its lock and modes, `--run-as`, GPU
/// discovery, the secrets and the identity), run off the runtime's threads.
fn prepare(config: &NodeConfig) -> Result<Prepared> {
    // Before anything is created: nothing this node or its ranks write is readable by other
    // local users (0700 directories, 0600 files).
    crate::security::modes::set_umask();
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating data dir {}", config.data_dir.display()))?;
    // One node per data directory, held until the process ends.
    let data_dir_lock = crate::data_dir::lock(&config.data_dir)?;
    // The CUDA libraries' link directory, which ranks given GPUs load through
    // (`gpus::libraries`).
    let cuda_libs_dir = config.data_dir.join(crate::gpus::libraries::CUDA_LIBS_DIR);
    // Under --run-as, ranks pass through the data directory to their own places: those
    // directories (and the link directory) stay traversable and the ranks' own entries are
    // theirs.
    let rank_uids = match (&config.run_as, &config.run_as_range) {
        (Some(user), _) => Some(user.uid..=user.uid),
        (None, Some(range)) => Some(range.low..=range.high),
        (None, None) => None,
    };
    let exempt = match rank_uids {
        Some(uids) => crate::security::modes::Exempt {
            traverse: [
                crate::security::run_as::RunAs::traverse_dirs(&config.data_dir, &config.storage),
                vec![cuda_libs_dir.clone()],
            ]
            .concat(),
            rank_uids: Some(uids),
        },
        None => crate::security::modes::Exempt::default(),
    };
    let tightened = crate::security::modes::tighten_tree_with(&config.data_dir, &exempt)
        .with_context(|| format!("fixing modes under {}", config.data_dir.display()))?;
    if let Some(user) = &config.run_as {
        user.prepare(&config.data_dir, &config.storage)?;
        info!(user = %user.name, uid = user.uid, gid = user.gid, "ranks run as another user (--run-as)");
    }
    if let Some(range) = &config.run_as_range {
        crate::security::run_as::RunAs::prepare_dirs(&config.data_dir, &config.storage)?;
        info!(%range, "each job's ranks run under a uid of their own (--run-as-range)");
    }
    if tightened.changed > 0 {
        info!(
            changed = tightened.changed,
            dir = %config.data_dir.display(),
            "data directory upgraded: group and other permissions removed"
        );
    }
    let gpu_source = crate::gpus::Source::from_env();
    let discovered = crate::gpus::discover(&gpu_source, &config.gpus)?;
    match &discovered.none_because {
        Some(why) => info!(reason = %why, "no GPUs"),
        None => info!(
            gpus = discovered.gpus.len(),
            test_source = matches!(gpu_source, crate::gpus::Source::Test(_)),
            "GPUs offered to jobs"
        ),
    }
    let ran_before = config.data_dir.join(identity::IDENTITY_FILE).exists();
    let secrets = crate::security::bootstrap::resolve(
        &config.data_dir,
        &crate::security::bootstrap::Asked {
            cluster_key: config.cluster_key.as_deref(),
            token_file: config.token_file.as_deref(),
            joining: !config.join.is_empty(),
            insecure: config.insecure,
            ran_before,
        },
    )?;
    for (what, path) in &secrets.created {
        // Said once, on the start that made the file; the secret itself is never printed.
        eprintln!(
            "ringleader: {what} written to {} (mode 0600)",
            path.display()
        );
        info!(file = %path.display(), "{what} created");
    }
    if let Some(file) = secrets
        .created
        .iter()
        .find(|(what, _)| *what == crate::security::bootstrap::CREATED_CLUSTER_KEY)
        .map(|(_, path)| path)
    {
        eprintln!(
            "{}",
            crate::security::bootstrap::join_hint(&config.listen, file)
        );
    }
    if secrets.insecure() {
        warn!("--insecure: the cluster is open, any host that can reach the listen port can join and run commands on every node");
    }
    if secrets.token.is_none() {
        warn!(api = %config.api, "--insecure without --token-file: the API is open, anyone who can reach its address can run commands on this node");
    }
    // The identity after the secrets: a start refused for want of a key leaves the data
    // directory new.
    let key = identity::load_or_create_identity(&config.data_dir)?;
    // Only a node that offers GPUs gives ranks devices, and only those ranks load the
    // libraries: the search and the links are for it alone.
    let rank_libraries = if discovered.gpus.is_empty() {
        crate::gpus::RankLibraries::default()
    } else {
        let libraries = crate::gpus::libraries::prepare(
            &config.data_dir,
            crate::gpus::driver_cuda_major(&gpu_source),
            gpu_source == crate::gpus::Source::Driver,
        );
        if config.run_as.is_some() && libraries.prefix.is_some() {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(
                &cuda_libs_dir,
                std::fs::Permissions::from_mode(crate::security::run_as::TRAVERSE_DIR_MODE),
            )
            .with_context(|| format!("opening {} to ranks", cuda_libs_dir.display()))?;
        }
        libraries
    };
    Ok(Prepared {
        _data_dir_lock: data_dir_lock,
        gpu_source,
        discovered,
        secrets,
        key,
        rank_libraries,
    })
}

/// Runs a node until SIGINT or SIGTERM, then leaves the cluster gracefully: the start-up's
/// blocking part (`prepare`), then each part started from its config (`node::parts`),
/// then their ordered shutdown (`Parts::stop`).
pub async fn run(config: NodeConfig) -> Result<()> {
    let Prepared {
        _data_dir_lock,
        gpu_source,
        discovered,
        secrets,
        key,
        rank_libraries,
    } = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || prepare(&config))
            .await
            .context("preparing the data directory")??
    };
    let peer_id = key.public().to_peer_id();
    let insecure = secrets.insecure();
    let psk = secrets.key;
    // The key as every part reads it from now on: a rotation swaps it (see `rotation`).
    let ring = psk
        .zip(secrets.key_file.as_deref())
        .map(|(k, file)| crate::cluster::key_ring::KeyRing::open(k, file, config.key_overlap_ms));
    let token = secrets.token.map(std::sync::Arc::new);
    let retention_ms = config.job_retention_s.saturating_mul(1000);

    let listeners = parts::start_listeners(parts::ListenConfig {
        api: config.api,
        data: config.data,
        datasets: config.datasets,
        listen: config.listen.clone(),
    })
    .await?;
    let api_bind = listeners.api.local_addr()?;
    let cluster = parts::start_cluster(parts::ClusterConfig {
        key,
        ring: ring.clone(),
        listen: config.listen.clone(),
        bound: listeners.cluster,
        api: api_bind,
        data: listeners.data.local_addr()?,
        datasets: listeners.datasets.local_addr()?,
        join: config.join.clone(),
        membership: config.membership.clone(),
        name: config.name.clone(),
        cpus: config.cpus,
        gpus: discovered.gpus,
        labels: config.labels.clone(),
    })
    .await?;
    let parts::Cluster {
        handle,
        rpc_rx,
        mut loop_task,
        meta,
        api_addr,
        data_addr,
    } = cluster;
    let control = control::start(
        control::handle::ControlConfig {
            me: peer_id,
            name: config.name.clone(),
            data_dir: &config.data_dir,
            bootstrap: config.join.is_empty(),
            snapshot_every: config.raft_snapshot_every,
            key_ring: ring.clone(),
            user_limits: config.user_limits,
        },
        handle.clone(),
        rpc_rx,
        crate::jobs::admit_forwarded,
    )
    .await?;
    let tasks = parts::PartTasks::new();
    parts::start_chief(
        &tasks.background,
        control.clone(),
        parts::ChiefConfig {
            retention_ms,
            scheduler: config.scheduler,
        },
    );
    // Under --run-as a job's record goes into a place its ranks own: written through a
    // rename, never through a link they left (see `security::run_as`).
    let node_storage = match config.run_as.is_some() || config.run_as_range.is_some() {
        true => crate::security::run_as::RunAs::node_storage(&config.storage),
        false => config.storage.clone(),
    };
    parts::start_records(
        &tasks.background,
        control.clone(),
        parts::RecordsConfig {
            node_storage: node_storage.clone(),
            storage: config.storage.clone(),
            retention_ms,
        },
    );
    let datasets = crate::datasets::Datasets::start(
        tasks.background.clone(),
        datasets_config(&config, &peer_id.to_string(), ring.clone())?,
        listeners.datasets,
        handle.clone(),
        control.clone(),
    )
    .await
    .context("starting the dataset service")?;
    let api_tls =
        crate::api::server::tls_for(psk.as_ref(), &config.api_limits, api_bind, api_addr)?;
    let checkpoints = checkpoint_access(api_bind, api_tls.as_ref(), &config.api_limits);
    jobs::supervisor::start(
        &tasks.jobs,
        control.clone(),
        datasets.clone(),
        jobs::supervisor::SupervisorConfig {
            me: peer_id.to_string(),
            jobs_dir: config.data_dir.join("jobs"),
            storage: config.storage.clone(),
            device_names: crate::gpus::inherited_visible_devices(&gpu_source),
            offers_gpus: !meta.gpus.is_empty(),
            socket_ifname: crate::jobs::interfaces::interface_of(
                &crate::jobs::interfaces::host_addresses(),
                data_addr.ip(),
            ),
            libraries: rank_libraries,
            keys: crate::jobs::supervisor::NodeKeys::of(ring.as_ref()),
            options: rank_options(&config),
            checkpoints: checkpoints.clone(),
        },
    );
    if let Some(ring) = &ring {
        tasks.background.spawn(crate::rotation::follow(
            control.clone(),
            crate::rotation::Follower {
                ring: ring.clone(),
                token: token.clone(),
                data_dir: config.data_dir.clone(),
                tls: psk
                    .as_ref()
                    .and_then(|k| crate::security::tls::fingerprint(k).ok()),
            },
        ));
    }
    parts::start_api(
        &tasks.api,
        parts::ApiConfig {
            listener: listeners.api,
            state: crate::api::AppState {
                api_tls: api_tls.as_ref().map(|t| t.fingerprint().to_string()),
                node: handle.clone(),
                control: control.clone(),
                datasets,
                storage: config.storage.clone(),
                token,
                insecure,
                secrets_key: ring.as_ref().map(|r| {
                    crate::cluster::key_ring::DerivedKey::of(
                        r,
                        crate::security::sealed::SECRETS_KEY_CONTEXT,
                    )
                }),
                checkpoint_key: checkpoints.key,
                node_storage,
                user_limits: config.user_limits,
                python: config.python.clone(),
            },
            limits: config.api_limits.clone(),
            advertised: api_addr,
            tls: api_tls,
        },
    );
    let info = NodeInfo {
        id: peer_id.to_string(),
        name: config.name.clone(),
        pid: std::process::id(),
        p2p_addrs: meta.p2p_addrs.clone(),
        api_addr: meta.api_addr.clone(),
        data_addr: meta.data_addr.clone(),
        datasets_addr: meta.datasets_addr.clone(),
    };
    write_atomically(
        &config.data_dir.join(NODE_INFO_FILE),
        &serde_json::to_vec_pretty(&info)?,
    )?;
    info!(peer = %peer_id, name = %config.name, p2p = ?info.p2p_addrs, api = %info.api_addr, data = %info.data_addr, storage = %crate::api::redact::redact_url(&config.storage), "node started");
    // The data-plane listener is held so its advertised port stays ours; the collective
    // takes it over when this node is given a place in a ring.
    let _data_listener = listeners.data;

    parts::until_signal(&mut loop_task).await?;
    let clean = parts::Parts {
        tasks,
        control,
        node: handle,
        loop_task,
    }
    .stop()
    .await;
    let _ = tokio::fs::remove_file(config.data_dir.join(NODE_INFO_FILE)).await;
    info!(clean, "stopped");
    Ok(())
}

/// The dataset service's config: its directory under the data directory, its serving caps,
/// the host roots the API may read and write, and `--run-as`'s user for the files it
/// writes.
fn datasets_config(
    config: &NodeConfig,
    me: &str,
    ring: Option<crate::cluster::key_ring::KeyRing>,
) -> Result<crate::datasets::DatasetsConfig> {
    Ok(crate::datasets::DatasetsConfig {
        dir: config.data_dir.join(crate::security::run_as::DATASETS_DIR),
        key: crate::datasets::transport::AuthKey::from_ring(ring),
        upload_bytes_per_s: config.dataset_upload_bytes_per_s,
        busy_bytes_per_s: config.dataset_busy_bytes_per_s,
        me: me.to_owned(),
        name: config.name.clone(),
        roots: std::sync::Arc::new(dataset_roots(config)?),
        run_as: config
            .run_as
            .as_ref()
            .map(|user| crate::datasets::fs_user::FsUser {
                uid: user.uid,
                gid: user.gid,
            }),
    })
}

/// How ranks run: `--run-as`, `--run-as-range` (a uid per job) and the log cap.
fn rank_options(config: &NodeConfig) -> crate::jobs::process::RankOptions {
    crate::jobs::process::RankOptions {
        run_as: config.run_as.clone().map(std::sync::Arc::new),
        log_bytes_per_s: config.rank_log_bytes_per_s,
        job_users: config.run_as_range.map(|range| {
            std::sync::Arc::new(std::sync::Mutex::new(
                crate::security::uid_range::JobUsers::new(range),
            ))
        }),
    }
}

/// How command ranks reach their checkpoint place: through this node's API (`api_bind`), on
/// loopback when it listens there (or everywhere), over TLS when the API speaks it there.
/// The capability key is this node's own, drawn at start, so a token opens its place on
/// this node only and no key holder can make one.
fn checkpoint_access(
    api_bind: std::net::SocketAddr,
    api_tls: Option<&std::sync::Arc<crate::security::tls::ApiTls>>,
    limits: &crate::api::server::ApiLimits,
) -> crate::jobs::checkpoint::CheckpointAccess {
    let rank_api = crate::jobs::checkpoint::api_addr_for_ranks(api_bind);
    let https = api_tls.is_some() && limits.api_tls.applies_to(rank_api.ip());
    crate::jobs::checkpoint::CheckpointAccess {
        api_url: format!("{}://{rank_api}", if https { "https" } else { "http" }),
        tls_sha256: api_tls
            .filter(|_| https)
            .map(|t| t.fingerprint().to_string()),
        key: rand::random(),
    }
}

/// Longest shutdown at SIGTERM, in milliseconds: the API, the ranks, the background tasks
/// and the control plane each stop within what is left of it (a part that has not ended
/// by then is named in a warning and ends with the process).
pub const SHUTDOWN_MS_MAX: u64 = 10_000;
/// Longest wait for the cluster to take this node's leave, in milliseconds.
pub const LEAVE_MS_MAX: u64 = 2_000;

/// What the API may read and write on this host ([`crate::datasets::roots`]): the
/// `--dataset-source` and `--dataset-dest` roots, and the data directory and a `file://`
/// store refused beside `/proc`, `/sys` and `/dev`.
fn dataset_roots(config: &NodeConfig) -> Result<crate::datasets::roots::HostRoots> {
    let mut refused = vec![config.data_dir.clone()];
    refused.extend(crate::security::run_as::file_store_root(&config.storage));
    Ok(crate::datasets::roots::HostRoots::new(
        &config.dataset_sources,
        &config.dataset_dests,
        &refused,
    )?)
}
