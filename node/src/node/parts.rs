//! The node's parts, each started by a `start_<part>(config)` from a config of its own and
//! answering the part (what the parts after it and the shutdown hold): the listeners, the
//! cluster (the swarm, the membership and its event loop), the chief's driver, the records'
//! writers, the API. The control plane, the dataset service, the supervisor and the key
//! rotation's follower are started by their own modules' `start` from their own configs.
//! [`super::run`] is the list of these starts, then [`Parts::stop`], the ordered shutdown.

use std::{net::SocketAddr, time::Duration};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use libp2p::{swarm::SwarmEvent, Multiaddr};
use tracing::{info, warn};

use crate::{
    cluster::{
        datagrams::{self, BindError, Datagrams, Seal},
        key_ring::KeyRing,
        membership::{self, Membership},
        meta::{self, NodeMeta},
        net::{self, InboundRpc, NodeHandle},
    },
    control::handle::ControlHandle,
    tasks::Tasks,
};

use super::{advertised, bind_error, multiaddr_ip, LEAVE_MS_MAX, LISTEN_WAIT_MS, SHUTDOWN_MS_MAX};

/// Where the node listens (`--api`, `--data`, `--datasets`, `--listen`).
pub(super) struct ListenConfig {
    pub api: SocketAddr,
    pub data: SocketAddr,
    pub datasets: SocketAddr,
    pub listen: Multiaddr,
}

/// The node's bound sockets, before anything serves them.
pub(super) struct Listeners {
    pub api: tokio::net::TcpListener,
    /// Held so its advertised port stays this node's; the collective takes it over when
    /// the node is given a place in a ring.
    pub data: std::net::TcpListener,
    pub datasets: tokio::net::TcpListener,
    /// The cluster's address as bound, and its membership datagrams' UDP socket.
    pub cluster: (Multiaddr, std::net::UdpSocket),
}

/// Binds every port the node serves, each refusal naming its flag.
pub(super) async fn start_listeners(config: ListenConfig) -> Result<Listeners> {
    let api = tokio::net::TcpListener::bind(config.api)
        .await
        .map_err(|e| bind_error("API", "--api", config.api, e))?;
    let data = std::net::TcpListener::bind(config.data)
        .map_err(|e| bind_error("data plane", "--data", config.data, e))?;
    let datasets = tokio::net::TcpListener::bind(config.datasets)
        .await
        .map_err(|e| bind_error("dataset", "--datasets", config.datasets, e))?;
    // The membership datagrams' UDP port, with the TCP port of the same number checked free
    // (libp2p binds TCP with SO_REUSEPORT, so a second node on the same --listen port would
    // share it silently): one port number for the cluster, which --listen names.
    let cluster = datagrams::bind(&config.listen).map_err(|e| match e {
        BindError::Tcp(e) => bind_error("cluster", "--listen", &config.listen, e),
        BindError::Udp(e) => bind_error("cluster (UDP)", "--listen", &config.listen, e),
        e => anyhow::Error::from(e),
    })?;
    Ok(Listeners {
        api,
        data,
        datasets,
        cluster,
    })
}

/// What the cluster part is started with.
pub(super) struct ClusterConfig {
    /// The node's identity (the swarm's key, and its membership claims' signer).
    pub key: libp2p::identity::Keypair,
    /// The cluster key ring (`None`: `--insecure`).
    pub ring: Option<KeyRing>,
    /// `--listen` as given, and as bound with the datagrams' socket.
    pub listen: Multiaddr,
    pub bound: (Multiaddr, std::net::UdpSocket),
    /// The other listeners' local addresses, advertised with the host's IP.
    pub api: SocketAddr,
    pub data: SocketAddr,
    pub datasets: SocketAddr,
    /// Seeds to join through.
    pub join: Vec<Multiaddr>,
    /// Membership timers and limits.
    pub membership: membership::Config,
    /// The metadata the node advertises besides its addresses.
    pub name: String,
    pub cpus: Option<u32>,
    pub gpus: Vec<meta::Gpu>,
    pub labels: std::collections::BTreeMap<String, String>,
}

/// The cluster part: the membership event loop's handle and task, and the addresses the
/// node advertised.
pub(super) struct Cluster {
    pub handle: NodeHandle,
    /// Calls from other nodes, for the control plane to serve.
    pub rpc_rx: tokio::sync::mpsc::Receiver<InboundRpc>,
    pub loop_task: tokio::task::JoinHandle<()>,
    /// What the node advertised ([`NodeMeta`]'s addresses, whether it offers GPUs).
    pub meta: NodeMeta,
    /// The API's and the data plane's addresses as advertised (the host's IP for an
    /// unspecified one).
    pub api_addr: SocketAddr,
    pub data_addr: SocketAddr,
}

/// Starts the swarm on the cluster's address, waits for its listen addresses, and starts
/// the membership with this node's metadata.
pub(super) async fn start_cluster(config: ClusterConfig) -> Result<Cluster> {
    let peer_id = config.key.public().to_peer_id();
    let (listen, udp) = config.bound;
    let datagrams = Datagrams::new(udp, Seal::with_ring(config.ring.clone(), &peer_id))
        .context("the cluster's datagram socket")?;
    // The identity signs this node's membership claims as well (`cluster::claim_keys`).
    let claim_key = config.key.clone();
    let mut swarm = net::build_swarm(config.key, config.ring)?;
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
    let api_addr = advertised(config.api, host_ip);
    let data_addr = advertised(config.data, host_ip);
    let meta = NodeMeta {
        name: config.name,
        p2p_addrs: listen_addrs.iter().map(|a| a.to_string()).collect(),
        api_addr: api_addr.to_string(),
        data_addr: data_addr.to_string(),
        datasets_addr: advertised(config.datasets, host_ip).to_string(),
        datasets: Vec::new(),
        cpus: config.cpus.unwrap_or_else(meta::host_cpus),
        memory_mb: meta::host_memory_mb(),
        gpus: config.gpus,
        labels: config.labels,
        version: env!("CARGO_PKG_VERSION").to_string(),
    };
    meta.check()
        .map_err(|e| anyhow::anyhow!("this node's metadata: {e} (see --name and --label)"))?;
    let signer = Box::new(crate::cluster::claim_keys::IdentitySigner::new(claim_key));
    let core = Membership::new(
        peer_id,
        meta.clone(),
        config.membership,
        rand::random(),
        0,
        signer,
    );
    let (mut event_loop, handle) = net::EventLoop::new(
        swarm,
        datagrams,
        core,
        std::time::Instant::now(),
        config.join,
    );
    let rpc_rx = event_loop.rpc_inbound();
    let loop_task = tokio::spawn(event_loop.run());
    Ok(Cluster {
        handle,
        rpc_rx,
        loop_task,
        meta,
        api_addr,
        data_addr,
    })
}

/// The node's parts' tasks, stopped in this order at SIGTERM ([`Parts::stop`]).
pub(super) struct PartTasks {
    /// The API server and its connections.
    pub api: Tasks,
    /// The supervisor and its ranks.
    pub jobs: Tasks,
    /// The chief's driver, the records' writers, the dataset service, the key rotation's
    /// follower.
    pub background: Tasks,
}

impl PartTasks {
    pub fn new() -> PartTasks {
        PartTasks {
            api: Tasks::new("api"),
            jobs: Tasks::new("jobs"),
            background: Tasks::new("background"),
        }
    }
}

/// What the chief's driver is started with (it decides only while this node is chief).
pub(super) struct ChiefConfig {
    /// Ended jobs leave the live state this long after they finished, ms (0: never).
    pub retention_ms: u64,
    /// How the chief places waiting jobs (`--scheduler`).
    pub scheduler: crate::chief::scheduler::Policy,
}

/// Starts the chief's driver in `tasks`.
pub(super) fn start_chief(tasks: &Tasks, control: ControlHandle, config: ChiefConfig) {
    tasks.spawn(crate::chief::driver::run(
        control,
        config.retention_ms,
        config.scheduler,
    ));
}

/// What the records' writers are started with.
pub(super) struct RecordsConfig {
    /// Where ended jobs' records go: the storage URL the node itself writes with (under
    /// `--run-as`, through renames, see `security::run_as::RunAs::node_storage`).
    pub node_storage: String,
    /// The storage URL searches' summaries go to.
    pub storage: String,
    /// A job's record is written when it leaves the live state, this long after it ended.
    pub retention_ms: u64,
}

/// Starts the writers of ended jobs' records (`jobs::archive`) and of searches' summaries
/// (`search::writer`) in `tasks`; each ends between two writes when `tasks` stop.
pub(super) fn start_records(tasks: &Tasks, control: ControlHandle, config: RecordsConfig) {
    tasks.spawn_owned(crate::jobs::archive::write_ended(
        tasks.stopping(),
        control.clone(),
        config.node_storage,
        crate::jobs::archive::Timing::Deferred {
            retention_ms: config.retention_ms,
        },
        "job record",
        crate::jobs::archive::record,
    ));
    tasks.spawn_owned(crate::search::writer::run(
        tasks.stopping(),
        control,
        config.storage,
    ));
}

/// What the API part is started with.
pub(super) struct ApiConfig {
    pub listener: tokio::net::TcpListener,
    /// What the handlers share.
    pub state: crate::api::AppState,
    /// The server's caps and timeouts.
    pub limits: crate::api::server::ApiLimits,
    /// The API's advertised address.
    pub advertised: SocketAddr,
    /// Its TLS, when it speaks TLS beyond loopback.
    pub tls: Option<std::sync::Arc<crate::security::tls::ApiTls>>,
}

/// Starts the API server in `tasks`.
pub(super) fn start_api(tasks: &Tasks, config: ApiConfig) {
    let api = crate::api::server::serve(
        tasks.clone(),
        config.listener,
        crate::api::router(config.state),
        config.limits,
        config.advertised,
        config.tls,
    );
    tasks.spawn(async move {
        if let Err(e) = api.await {
            warn!("API server stopped: {e}");
        }
    });
}

/// What the shutdown stops, in order.
pub(super) struct Parts {
    pub tasks: PartTasks,
    pub control: ControlHandle,
    pub node: NodeHandle,
    pub loop_task: tokio::task::JoinHandle<()>,
}

impl Parts {
    /// Stops the node within [`SHUTDOWN_MS_MAX`]: no new requests; then no ranks (killed
    /// and reaped, their exits not reported: they end with this member, which leaves
    /// next); then no writer or dataset transfer (a writer ends between two writes); then
    /// the control plane, and the cluster is told. Whether every part stopped in time.
    pub async fn stop(self) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(SHUTDOWN_MS_MAX);
        let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
        let mut clean = true;
        for part in [&self.tasks.api, &self.tasks.jobs, &self.tasks.background] {
            clean &= part.stop(left()).await;
        }
        if tokio::time::timeout(left(), self.control.shutdown())
            .await
            .is_err()
        {
            warn!("control plane not shut down within the bound");
            clean = false;
        }
        match tokio::time::timeout(
            left().min(Duration::from_millis(LEAVE_MS_MAX)),
            self.node.leave(),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!("graceful leave failed: {e}"),
            Err(_) => warn!("graceful leave not done within {LEAVE_MS_MAX} ms"),
        }
        if tokio::time::timeout(left(), self.loop_task).await.is_err() {
            warn!("node event loop not stopped within the bound");
            clean = false;
        }
        clean
    }
}

/// Waits for SIGINT or SIGTERM; an error if the membership event loop ends first.
pub(super) async fn until_signal(loop_task: &mut tokio::task::JoinHandle<()>) -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => info!("interrupted"),
        _ = term.recv() => info!("terminated"),
        res = loop_task => bail!("node event loop stopped unexpectedly: {res:?}"),
    }
    Ok(())
}
