//! `ringleader node`: start-up, the node's parts wired together, and graceful shutdown.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use libp2p::{swarm::SwarmEvent, Multiaddr};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{
    cluster::{
        datagrams::{self, BindError, Datagrams, Seal},
        identity,
        membership::{self, Membership},
        meta::{self, NodeMeta},
        net,
    },
    control, jobs,
    tasks::Tasks,
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

/// Runs a node until SIGINT or SIGTERM, then leaves the cluster gracefully.
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

    let api_listener = tokio::net::TcpListener::bind(config.api)
        .await
        .map_err(|e| bind_error("API", "--api", config.api, e))?;
    let data_listener = std::net::TcpListener::bind(config.data)
        .map_err(|e| bind_error("data plane", "--data", config.data, e))?;

    let datasets_listener = tokio::net::TcpListener::bind(config.datasets)
        .await
        .map_err(|e| bind_error("dataset", "--datasets", config.datasets, e))?;
    // The membership datagrams' UDP port, with the TCP port of the same number checked free
    // (libp2p binds TCP with SO_REUSEPORT, so a second node on the same --listen port would
    // share it silently): one port number for the cluster, which --listen names.
    let (listen, udp) = datagrams::bind(&config.listen).map_err(|e| match e {
        BindError::Tcp(e) => bind_error("cluster", "--listen", &config.listen, e),
        BindError::Udp(e) => bind_error("cluster (UDP)", "--listen", &config.listen, e),
        e => anyhow::Error::from(e),
    })?;
    let datagrams = Datagrams::new(udp, Seal::with_ring(ring.clone(), &peer_id))
        .context("the cluster's datagram socket")?;

    // The identity signs this node's membership claims as well (`cluster::claim_keys`).
    let claim_key = key.clone();
    let mut swarm = net::build_swarm(key, ring.clone())?;
    swarm
        .listen_on(listen.clone())
        .with_context(|| format!("listening on {listen}"))?;
    let mut listen_addrs: Vec<Multiaddr> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(LISTEN_WAIT_MS);
    // A listen address with a fixed IP gives exactly one address; an unspecified one
    // (0.0.0.0, ::) one per interface, taken until 100 ms pass without another.
    let one_address = multiaddr_ip(&config.listen).is_some_and(|ip| !ip.is_unspecified());
    loop {
        if one_address && !listen_addrs.is_empty() {
            break;
        }
        let wait = if listen_addrs.is_empty() {
            deadline
        } else {
            tokio::time::Instant::now() + Duration::from_millis(100)
        };
        match tokio::time::timeout_at(wait, swarm.select_next_some()).await {
            Ok(SwarmEvent::NewListenAddr { address, .. }) => listen_addrs.push(address),
            Ok(SwarmEvent::ListenerError { error, .. })
            | Ok(SwarmEvent::ListenerClosed {
                reason: Err(error), ..
            }) => {
                bail!("listening on {}: {error}", config.listen)
            }
            Ok(_) => {}
            Err(_) if listen_addrs.is_empty() => bail!(
                "listening on {}: no address after {LISTEN_WAIT_MS} ms",
                config.listen
            ),
            Err(_) => break,
        }
    }
    let host_ip = listen_addrs
        .iter()
        .filter_map(multiaddr_ip)
        .find(|ip| !ip.is_unspecified());
    let api_addr = advertised(api_listener.local_addr()?, host_ip);
    let data_addr = advertised(data_listener.local_addr()?, host_ip);
    let datasets_addr = advertised(datasets_listener.local_addr()?, host_ip);

    let meta = NodeMeta {
        name: config.name.clone(),
        p2p_addrs: listen_addrs.iter().map(|a| a.to_string()).collect(),
        api_addr: api_addr.to_string(),
        data_addr: data_addr.to_string(),
        datasets_addr: datasets_addr.to_string(),
        datasets: Vec::new(),
        cpus: config.cpus.unwrap_or_else(meta::host_cpus),
        memory_mb: meta::host_memory_mb(),
        gpus: discovered.gpus,
        labels: config.labels.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
    };
    meta.check()
        .map_err(|e| anyhow::anyhow!("this node's metadata: {e} (see --name and --label)"))?;
    let offers_gpus = !meta.gpus.is_empty();
    let socket_ifname = crate::jobs::interfaces::interface_of(
        &crate::jobs::interfaces::host_addresses(),
        data_addr.ip(),
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
    let epoch = Instant::now();
    let signer = Box::new(crate::cluster::claim_keys::IdentitySigner::new(claim_key));
    let core = Membership::new(
        peer_id,
        meta,
        config.membership.clone(),
        rand::random(),
        0,
        signer,
    );
    let (mut event_loop, handle) =
        net::EventLoop::new(swarm, datagrams, core, epoch, config.join.clone());
    let rpc_rx = event_loop.rpc_inbound();
    let mut loop_task = tokio::spawn(event_loop.run());
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
    // The node's parts' tasks, stopped in this order at SIGTERM (see [`stop`]).
    let api_tasks = Tasks::new("api");
    let job_tasks = Tasks::new("jobs");
    let background = Tasks::new("background");
    background.spawn(crate::chief::driver::run(
        control.clone(),
        config.job_retention_s.saturating_mul(1000),
        config.scheduler,
    ));
    // Under --run-as a job's record goes into a place its ranks own: written through a
    // rename, never through a link they left (see `security::run_as`).
    let node_storage = match config.run_as.is_some() || config.run_as_range.is_some() {
        true => crate::security::run_as::RunAs::node_storage(&config.storage),
        false => config.storage.clone(),
    };
    background.spawn_owned(crate::jobs::archive::write_ended(
        background.stopping(),
        control.clone(),
        node_storage.clone(),
        crate::jobs::archive::Timing::Deferred {
            retention_ms: config.job_retention_s.saturating_mul(1000),
        },
        "job record",
        crate::jobs::archive::record,
    ));
    background.spawn_owned(crate::search::writer::run(
        background.stopping(),
        control.clone(),
        config.storage.clone(),
    ));
    let datasets = crate::datasets::Datasets::start(
        background.clone(),
        crate::datasets::DatasetsConfig {
            dir: config.data_dir.join(crate::security::run_as::DATASETS_DIR),
            key: crate::datasets::transport::AuthKey::from_ring(ring.clone()),
            upload_bytes_per_s: config.dataset_upload_bytes_per_s,
            busy_bytes_per_s: config.dataset_busy_bytes_per_s,
            me: peer_id.to_string(),
            name: config.name.clone(),
            roots: std::sync::Arc::new(dataset_roots(&config)?),
            run_as: config
                .run_as
                .as_ref()
                .map(|user| crate::datasets::fs_user::FsUser {
                    uid: user.uid,
                    gid: user.gid,
                }),
        },
        datasets_listener,
        handle.clone(),
        control.clone(),
    )
    .await
    .context("starting the dataset service")?;
    let api_tls = crate::api::server::tls_for(
        psk.as_ref(),
        &config.api_limits,
        api_listener.local_addr()?,
        api_addr,
    )?;
    // Command ranks reach their checkpoint place through this node's API, on loopback when
    // it listens there (or everywhere); the capability key is this node's own, drawn at
    // start, so a token opens its place on this node only and no key holder can make one.
    let checkpoints = {
        let rank_api = crate::jobs::checkpoint::api_addr_for_ranks(api_listener.local_addr()?);
        let https = api_tls.is_some() && config.api_limits.api_tls.applies_to(rank_api.ip());
        crate::jobs::checkpoint::CheckpointAccess {
            api_url: format!("{}://{rank_api}", if https { "https" } else { "http" }),
            tls_sha256: api_tls
                .as_ref()
                .filter(|_| https)
                .map(|t| t.fingerprint().to_string()),
            key: rand::random(),
        }
    };
    jobs::supervisor::start(
        &job_tasks,
        control.clone(),
        datasets.clone(),
        peer_id.to_string(),
        config.data_dir.join("jobs"),
        config.storage.clone(),
        crate::gpus::inherited_visible_devices(&gpu_source),
        offers_gpus,
        socket_ifname,
        rank_libraries,
        crate::jobs::supervisor::NodeKeys::of(ring.as_ref()),
        crate::jobs::process::RankOptions {
            run_as: config.run_as.clone().map(std::sync::Arc::new),
            log_bytes_per_s: config.rank_log_bytes_per_s,
            job_users: config.run_as_range.map(|range| {
                std::sync::Arc::new(std::sync::Mutex::new(
                    crate::security::uid_range::JobUsers::new(range),
                ))
            }),
        },
        checkpoints.clone(),
    );

    if let Some(ring) = &ring {
        background.spawn(crate::rotation::follow(
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
    let app = crate::api::router(crate::api::AppState {
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
        node_storage: node_storage.clone(),
        user_limits: config.user_limits,
        python: config.python.clone(),
    });
    let api = crate::api::server::serve(
        api_tasks.clone(),
        api_listener,
        app,
        config.api_limits.clone(),
        api_addr,
        api_tls,
    );
    api_tasks.spawn(async move {
        if let Err(e) = api.await {
            warn!("API server stopped: {e}");
        }
    });
    write_atomically(
        &config.data_dir.join(NODE_INFO_FILE),
        &serde_json::to_vec_pretty(&info)?,
    )?;
    info!(peer = %peer_id, name = %config.name, p2p = ?info.p2p_addrs, api = %info.api_addr, data = %info.data_addr, storage = %crate::api::redact::redact_url(&config.storage), "node started");
    // The data-plane listener is held so its advertised port stays ours; the collective
    // takes it over when this node is given a place in a ring.
    let _data_listener = data_listener;

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => info!("interrupted"),
        _ = term.recv() => info!("terminated"),
        res = &mut loop_task => bail!("node event loop stopped unexpectedly: {res:?}"),
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(SHUTDOWN_MS_MAX);
    let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
    // No new requests; then no ranks (killed and reaped, their exits not reported: they end
    // with this member, which leaves next); then no writer or dataset transfer (a writer
    // ends between two writes); then the control plane, and the cluster is told.
    let mut clean = true;
    for part in [&api_tasks, &job_tasks, &background] {
        clean &= part.stop(left()).await;
    }
    if tokio::time::timeout(left(), control.shutdown())
        .await
        .is_err()
    {
        warn!("control plane not shut down within the bound");
        clean = false;
    }
    match tokio::time::timeout(
        left().min(Duration::from_millis(LEAVE_MS_MAX)),
        handle.leave(),
    )
    .await
    {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!("graceful leave failed: {e}"),
        Err(_) => warn!("graceful leave not done within {LEAVE_MS_MAX} ms"),
    }
    if tokio::time::timeout(left(), loop_task).await.is_err() {
        warn!("node event loop not stopped within the bound");
        clean = false;
    }
    let _ = tokio::fs::remove_file(config.data_dir.join(NODE_INFO_FILE)).await;
    info!(clean, "stopped");
    Ok(())
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
