//! The command line: `ringleader node` runs a node; every other command is an API client.
//!
//! - [`demo`]: `ringleader demo`, a local cluster end to end.
//! - [`local`]: a cluster of real `ringleader node` processes on this host, for the demo, the
//!   benchmarks (the `ringleader-bench` binary, `node/bench/`) and the integration tests
//!   (public because the binary's demo needs it).
//! - [`closed_pipe`]: a command whose reader went away (`logs ID | head`) ends quietly.
//! - [`datasets`]: `ringleader dataset add | ls | get | rm`.
//! - [`tokens`]: `ringleader token create | ls | revoke`, `ringleader member remove`.
//! - [`keys`]: `ringleader key rotate`.
//! - [`train_worker`]: the hidden `train-worker` subcommand, one rank of a train job.
//!
//! May use: everything in the crate.

pub mod closed_pipe;
pub mod datasets;
pub mod demo;
pub mod job_list;
pub mod keys;
pub mod local;
pub mod preempt;
pub mod sharing;
pub mod tokens;
pub mod train_worker;

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::{anyhow, Context, Result};
use clap::{Args, Parser, Subcommand};

use crate::{
    api::client::ApiClient,
    cluster::{addr, membership},
    node::NodeConfig,
};

/// ringleader: a peer-to-peer cluster for distributed deep learning.
#[derive(Debug, Parser)]
#[command(name = "ringleader", version, about)]
pub struct Cli {
    /// API address of the node to talk to.
    #[arg(
        long,
        global = true,
        env = "RINGLEADER_PEER",
        default_value = "127.0.0.1:7071"
    )]
    pub peer: String,
    /// Print one JSON document instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// API token (prefer RINGLEADER_TOKEN or --token-file: a flag shows in `ps`).
    #[arg(long, global = true, env = "RINGLEADER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the API token (default: ringleader-data/api.token when it exists, the
    /// admin token of a node started here with the default --data-dir).
    #[arg(long, global = true, env = "RINGLEADER_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Fingerprint (`sha256:HEX`) of the API's TLS key, for a node beyond loopback (default:
    /// the one the token file carries).
    #[arg(long = "tls-sha256", global = true, env = "RINGLEADER_TLS_SHA256")]
    pub tls_sha256: Option<String>,
    #[command(subcommand)]
    pub command: Cmd,
}

/// The commands.
#[derive(Debug, Subcommand)]
// Parsed once per process: a boxed `NodeArgs` would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Cmd {
    /// Run a node.
    Node(NodeArgs),
    /// This node, the chief and term, members and jobs counted by state, then a bounded
    /// list of each.
    Status(StatusArgs),
    /// Submit a job spec (TOML, or JSON with the same keys); prints the job id.
    Submit {
        /// The spec file (`.json`: the spec as JSON).
        file: PathBuf,
    },
    /// List jobs: the newest page, oldest first (`--all`: every page).
    Jobs(JobsArgs),
    /// One job: state, generation, ring, step, metrics, events; `job preempt` and `job
    /// grow` (the admin token only) take capacity from a running job and give it back.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Job {
        /// Job id.
        #[arg(required = true)]
        id: Option<String>,
        /// Redraw a progress line until the job ends.
        #[arg(long)]
        watch: bool,
        /// `preempt`, `grow`.
        #[command(subcommand)]
        action: Option<preempt::JobCmd>,
    },
    /// A search's trials, best first (`--json`: `{id, state, metric, direction, trials, best}`).
    Trials {
        /// The search job's id.
        id: String,
    },
    /// Cancel a job.
    Cancel {
        /// Job id.
        id: String,
    },
    /// A job's logs (its current generation, every rank): what its ranks printed, without
    /// the lines of the rank protocol (`ringleader-…`) unless --protocol.
    Logs {
        /// Job id.
        id: String,
        /// Keep printing new lines until the job ends.
        #[arg(long, short)]
        follow: bool,
        /// Show the rank protocol's lines too (heartbeats, metrics, reports, rank stats).
        #[arg(long)]
        protocol: bool,
    },
    /// Datasets shared peer to peer: add, ls, get, rm.
    #[command(subcommand)]
    Dataset(datasets::DatasetCmd),
    /// API tokens: create, ls, revoke (creating and revoking need the admin token).
    #[command(subcommand)]
    Token(tokens::TokenCmd),
    /// Cluster members: remove (needs the admin token).
    #[command(subcommand)]
    Member(tokens::MemberCmd),
    /// The cluster key: rotate (needs the admin token).
    #[command(subcommand)]
    Key(keys::KeyCmd),
    /// Quotas: set (needs the admin token), ls.
    #[command(subcommand)]
    Quota(sharing::QuotaCmd),
    /// The waiting jobs in the order they will start, with owners and reasons.
    Queue,
    /// Start a local 3-node cluster, show it, and stop it.
    Demo,
    /// Write a new cluster key (swarm.key format) to FILE, or print it.
    Keygen {
        /// Where to write the key (mode 0600); printed when absent.
        file: Option<PathBuf>,
    },
    /// One worker of a train job (the supervisor runs this).
    #[command(hide = true)]
    TrainWorker(trainer::worker::WorkerArgs),
}

/// `ringleader node` flags.
// The field docs are the `--help` text, where `<data-dir>` is a placeholder, not HTML.
#[allow(rustdoc::invalid_html_tags)]
#[derive(Clone, Debug, Args)]
pub struct NodeArgs {
    /// Node name shown to users (default: the host name).
    #[arg(long)]
    pub name: Option<String>,
    /// The cluster's address, host:port or a multiaddr: TCP and UDP on that port (loopback
    /// unless given: a cluster across hosts listens on an address the others reach, e.g.
    /// 0.0.0.0:7070).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// HTTP API address.
    #[arg(long, default_value = "127.0.0.1:7071")]
    pub api: String,
    /// Collective data-plane address (default: the --listen host, a port the OS picks).
    #[arg(long)]
    pub data: Option<String>,
    /// Dataset transfer address (default: the --listen host, a port the OS picks).
    #[arg(long)]
    pub datasets: Option<String>,
    /// While a job's ring runs on this node, serve datasets to peers at most this fast
    /// (MB/s, 10^6 bytes; 0: no cap), so the collective keeps the link.
    #[arg(long, default_value_t = 50)]
    pub dataset_busy_mbps: u64,
    /// Serve datasets to peers at most this fast at all times (MB/s; 0: no cap).
    #[arg(long, default_value_t = 0)]
    pub dataset_upload_mbps: u64,
    /// Raft builds a snapshot of the control state every this many log entries and purges
    /// the log before it; a node that joins later catches up from the snapshot.
    #[arg(long, default_value_t = crate::control::handle::SNAPSHOT_EVERY_DEFAULT,
          value_parser = clap::value_parser!(u64).range(10..))]
    pub raft_snapshot_every: u64,
    /// Ended jobs leave the cluster's live state this many seconds after they finished
    /// (0: never; the chief's setting applies); their records stay in the store
    /// (`jobs/<id>/record.json`) and `job ID` still answers from there.
    #[arg(long, default_value_t = 7 * 24 * 3600)]
    pub job_retention_s: u64,
    /// How this node, while chief, places waiting jobs: `fair` (priorities, quotas, fair
    /// share, gang admission, backfill; see docs/book/src/design/design.md) or `fifo` (first come,
    /// first served while there is room: the placement before the scheduler, for comparison).
    #[arg(long, default_value = "fair")]
    pub scheduler: crate::chief::scheduler::Policy,
    /// Cpus this node offers to jobs (default: the host's logical cpus); each worker takes
    /// `cpus_per_worker` of them. More than the host has over-commits it on purpose (many
    /// light trials), fewer keeps some for other work.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub cpus: Option<u32>,
    /// GPUs this node offers to jobs: device indices like `0,1` (each must exist), `none`,
    /// or `all` (default: every GPU the CUDA driver lists; none on a host without one). Each
    /// rank gets its own devices as CUDA_VISIBLE_DEVICES. Test-only: RINGLEADER_TEST_GPUS
    /// (`MODEL:MEMORY_MB,…`) replaces the driver with fake devices 0, 1, ….
    #[arg(long, default_value = "all")]
    pub gpus: crate::gpus::Selection,
    /// Seed node(s) to join, host:port or multiaddr; repeat or separate with commas.
    #[arg(long, value_delimiter = ',')]
    pub join: Vec<String>,
    /// Directory for the identity key, state and the default store.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Cluster key file (IPFS swarm.key format, mode 0600). Without it a node that joins
    /// nobody makes <data-dir>/cluster.key at its first start (and uses it from then on),
    /// and a node with --join is refused: copy the first node's key to the others.
    #[arg(long)]
    pub cluster_key: Option<PathBuf>,
    /// After `ringleader key rotate` switches the cluster key, the previous key is still
    /// accepted this many milliseconds (members switch a moment apart), then refused.
    #[arg(long, default_value_t = crate::cluster::key_ring::KEY_OVERLAP_MS_DEFAULT,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub key_overlap_ms: u64,
    /// Run an open cluster: no cluster key (any host that reaches --listen can join and run
    /// commands on every node) and, without --token-file, no API token. For throwaway
    /// clusters only; `status` and the dashboard say so.
    #[arg(long)]
    pub insecure: bool,
    /// Storage URL for checkpoints (default: file://<data-dir>/store). A URL with
    /// credentials (s3://KEY:SECRET@…, ?secret_access_key=…) is refused here, where `ps`
    /// shows it: put it in a file for --storage-file, or give S3 its keys in the
    /// environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
    #[arg(long, conflicts_with = "storage_file")]
    pub storage: Option<String>,
    /// File (mode 0600) holding the storage URL, credentials and all.
    #[arg(long)]
    pub storage_file: Option<PathBuf>,
    /// File holding an API token of your choosing (mode 0600; whitespace trimmed), accepted
    /// beside the cluster's admin token, which every node writes to <data-dir>/api.token.
    /// Every API request but /healthz and the dashboard page needs one of them as
    /// `Authorization: Bearer <token>` (the CLI's --token-file or RINGLEADER_TOKEN).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// A label advertised to the cluster, key=value; repeatable.
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Run every rank as this user (a name or a uid), with its primary group only, in a
    /// work directory it owns: ranks then cannot read the node's key, token or state.
    /// Recommended when the node runs as root (it needs root to switch users).
    #[arg(long, value_name = "USER")]
    pub run_as: Option<String>,
    /// A directory below which a made token's `dataset add` may read (repeatable; default:
    /// none, so a made token adds nothing). The admin token reads any path but the node's
    /// data directory, its store, /proc, /sys and /dev, which no token reaches.
    #[arg(long = "dataset-source", value_name = "DIR")]
    pub dataset_sources: Vec<PathBuf>,
    /// A directory below which a made token's `dataset get --to` may write (repeatable;
    /// default: none). The admin token writes anywhere but the refused paths.
    #[arg(long = "dataset-dest", value_name = "DIR")]
    pub dataset_dests: Vec<PathBuf>,
    /// Run each job's ranks under a uid (and gid) of their own from this range, e.g.
    /// 60000-60999, no account's: jobs are then isolated from each other too (one shared
    /// --run-as user is not: its jobs can read each other's environment and signal each
    /// other). A job over the range's size at once is refused on this node. Needs root.
    #[arg(long, value_name = "LOW-HIGH", conflicts_with = "run_as")]
    pub run_as_range: Option<crate::security::uid_range::UidRange>,
    /// Cap on the bytes a rank adds to its log per second (0: none); lines past it are
    /// dropped and counted, protocol lines never. For tests.
    #[arg(long, hide = true, default_value_t = crate::jobs::log_rate::RANK_LOG_BYTES_PER_S_MAX)]
    pub rank_log_bytes_per_s: u64,
    /// Most jobs one user (every token of it) may have that have not ended; a submit past
    /// it is refused (429). Admins are not limited; 0: no limit. Counted from the
    /// replicated state: give every node the same.
    #[arg(long, value_name = "N", default_value_t = crate::api::quota::PENDING_JOBS_PER_USER_MAX)]
    pub user_pending_jobs_max: usize,
    /// Most bytes of specs one user's jobs may hold in the cluster's state (until ended jobs
    /// leave it); a submit past it is refused (429). Admins are not limited; 0: no limit.
    #[arg(long, value_name = "BYTES", default_value_t = crate::api::quota::SPEC_BYTES_PER_USER_MAX)]
    pub user_spec_bytes_max: u64,
    /// An interpreter with the `ringleader` package (and cloudpickle) installed, e.g. a
    /// virtualenv's `bin/python`: what `Client.launch` runs its trials under when not told
    /// (shown as `python` in the status document). Give every node the same path.
    #[arg(long, env = "RINGLEADER_PYTHON", value_name = "PATH")]
    pub python: Option<String>,
    #[command(flatten)]
    pub api_limits: crate::api::server::ApiLimits,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("label {s:?} is not key=value"))
}

impl NodeArgs {
    /// Validates the flags into a node configuration; errors name the flag.
    pub fn into_config(self) -> Result<NodeConfig> {
        let listen = addr::parse_listen_addr(&self.listen).context("--listen")?;
        let api = addr::parse_bind_addr(&self.api).context("--api")?;
        let listen_host = listen
            .iter()
            .find_map(|p| match p {
                libp2p::multiaddr::Protocol::Ip4(ip) => Some(std::net::IpAddr::V4(ip)),
                libp2p::multiaddr::Protocol::Ip6(ip) => Some(std::net::IpAddr::V6(ip)),
                _ => None,
            })
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let data = match &self.data {
            Some(d) => addr::parse_bind_addr(d).context("--data")?,
            None => std::net::SocketAddr::new(listen_host, 0),
        };
        let datasets = match &self.datasets {
            Some(d) => addr::parse_bind_addr(d).context("--datasets")?,
            None => std::net::SocketAddr::new(listen_host, 0),
        };
        let join = self
            .join
            .iter()
            .filter(|s| !s.trim().is_empty())
            .map(|s| addr::parse_p2p_addr(s))
            .collect::<Result<Vec<_>, _>>()
            .context("--join")?;
        let name = match self.name {
            Some(n) if !n.trim().is_empty() => n,
            Some(_) => return Err(anyhow!("--name: must not be empty")),
            None => hostname(),
        };
        let data_dir = self.data_dir;
        let storage = match (self.storage, &self.storage_file) {
            (Some(url), _) if trainer::redact::redact_url(&url) != url => {
                return Err(anyhow!(
                    "--storage: the URL carries credentials, which every local user sees in \
                     `ps`: put it in a file (mode 0600) for --storage-file, or give S3 its keys \
                     in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                ))
            }
            (url, Some(file)) => {
                debug_assert!(url.is_none(), "clap keeps the two apart");
                read_storage_file(file)?
            }
            (url, None) => url,
        };
        let storage = storage.unwrap_or_else(|| {
            let abs = std::path::absolute(&data_dir).unwrap_or_else(|_| data_dir.clone());
            format!("file://{}", abs.join("store").display())
        });
        // A view travels in state pieces of `push_pull_piece_members` (256) members of
        // about 400 bytes each with our metadata (up to 300 more for a member advertising
        // the most datasets, about 70 per GPU: 560 for eight), so a piece stays far inside
        // the membership frame limit whatever the cluster size; 10 000 members is the size
        // the simulation measures (`ringleader-bench membership --sim 10000`).
        let membership = membership::Config {
            members_max: MEMBERS_MAX,
            ..membership::Config::default()
        };
        membership
            .validate()
            .map_err(|e| anyhow!("membership settings: {e}"))?;
        let run_as = self
            .run_as
            .as_deref()
            .map(crate::security::run_as::RunAs::resolve)
            .transpose()?;
        // Checked here for an early error naming the flag; the node resolves them again with
        // its data directory refused.
        crate::datasets::roots::HostRoots::new(&self.dataset_sources, &self.dataset_dests, &[])?;
        let run_as_range = match self.run_as_range {
            Some(range) => {
                let euid = nix::unistd::Uid::effective().as_raw();
                if euid != 0 {
                    return Err(anyhow!("--run-as-range {range}: the node must run as root to start ranks as other users (it runs as uid {euid})"));
                }
                let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
                range.check(&passwd)?;
                Some(range)
            }
            None => None,
        };
        if let Some(p) = self.python.as_deref() {
            if p.is_empty() || p.chars().any(char::is_control) {
                return Err(anyhow!("--python {p:?}: the path of an interpreter"));
            }
        }
        Ok(NodeConfig {
            python: self.python,
            run_as,
            run_as_range,
            dataset_sources: self.dataset_sources,
            dataset_dests: self.dataset_dests,
            rank_log_bytes_per_s: self.rank_log_bytes_per_s,
            user_limits: crate::api::quota::UserLimits {
                pending_jobs_max: self.user_pending_jobs_max,
                spec_bytes_max: self.user_spec_bytes_max,
            },
            name,
            listen,
            api,
            data,
            datasets,
            dataset_busy_bytes_per_s: self.dataset_busy_mbps.saturating_mul(1_000_000),
            dataset_upload_bytes_per_s: self.dataset_upload_mbps.saturating_mul(1_000_000),
            raft_snapshot_every: self.raft_snapshot_every,
            job_retention_s: self.job_retention_s,
            scheduler: self.scheduler,
            api_limits: self.api_limits,
            join,
            data_dir,
            cluster_key: self.cluster_key,
            key_overlap_ms: self.key_overlap_ms,
            insecure: self.insecure,
            storage,
            token_file: self.token_file,
            labels: self.labels.into_iter().collect::<BTreeMap<_, _>>(),
            cpus: self.cpus,
            gpus: self.gpus,
            membership,
        })
    }
}

/// Longest `--storage-file` read, in bytes.
const STORAGE_FILE_BYTES_MAX: u64 = 8_192;
/// Most members a node remembers, tombstones included (count).
pub const MEMBERS_MAX: usize = 10_000;

/// The URL in a `--storage-file`: private to its owner (it holds keys), one line.
fn read_storage_file(file: &std::path::Path) -> Result<Option<String>> {
    crate::security::modes::check_secret_file(file, "storage URL file")
        .context("--storage-file")?;
    let len = std::fs::metadata(file)?.len();
    if len > STORAGE_FILE_BYTES_MAX {
        return Err(anyhow!(
            "--storage-file {}: {len} bytes, more than a URL ({STORAGE_FILE_BYTES_MAX})",
            file.display()
        ));
    }
    let url = std::fs::read_to_string(file)
        .with_context(|| format!("--storage-file {}", file.display()))?;
    let url = url.trim();
    if url.is_empty() {
        return Err(anyhow!("--storage-file {} is empty", file.display()));
    }
    Ok(Some(url.to_string()))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "node".to_string())
}

/// The token the CLI sends: `--token`/`RINGLEADER_TOKEN`, else `--token-file`/
/// `RINGLEADER_TOKEN_FILE`, else the default data directory's `api.token` when there is one.
pub fn token(cli: &Cli) -> Result<Option<String>> {
    Ok(credentials(cli)?.0)
}

/// The CLI's API token ([`token`]) and the TLS pin of the node's API: `--tls-sha256` (or
/// `RINGLEADER_TLS_SHA256`), else the `tls` line of the token file.
pub fn credentials(
    cli: &Cli,
) -> Result<(Option<String>, Option<crate::security::tls::Fingerprint>)> {
    let flag_pin = cli
        .tls_sha256
        .as_deref()
        .filter(|p| !p.trim().is_empty())
        .map(str::parse)
        .transpose()
        .context("--tls-sha256 (RINGLEADER_TLS_SHA256)")?;
    if let Some(t) = &cli.token {
        return Ok((Some(given_token(t)?), flag_pin));
    }
    let (path, given) = match &cli.token_file {
        Some(p) => (p.clone(), true),
        None => (
            PathBuf::from(DEFAULT_DATA_DIR).join(crate::security::bootstrap::API_TOKEN_FILE),
            false,
        ),
    };
    if !given && !path.exists() {
        return Ok((None, flag_pin));
    }
    let meta =
        std::fs::metadata(&path).with_context(|| format!("--token-file {}", path.display()))?;
    if meta.len() > crate::api::auth::TOKEN_FILE_BYTES_MAX {
        return Err(anyhow!(
            "--token-file {}: larger than a token",
            path.display()
        ));
    }
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("--token-file {}", path.display()))?;
    if text.trim().is_empty() {
        return Ok((None, flag_pin));
    }
    let file: crate::api::auth::TokenFileText = text
        .parse()
        .with_context(|| format!("--token-file {}", path.display()))?;
    Ok((Some(file.token), flag_pin.or(file.tls)))
}

/// A token given as itself (`--token`, `RINGLEADER_TOKEN`), trimmed: one line without
/// control characters, or an error that says what to do instead. The usual slip is
/// `RINGLEADER_TOKEN=$(cat api.token)`: a keyed node's token file has a second line, the
/// API's TLS pin (`tls sha256:…`), and no HTTP header carries a line break (the request
/// would fail with only "failed to parse header value").
pub fn given_token(text: &str) -> Result<String> {
    let token = text.trim();
    if token.contains(['\n', '\r']) {
        return Err(anyhow!(
            "RINGLEADER_TOKEN (or --token) holds more than one line (a token file's whole \
             text? its `tls sha256:…` line is the API's TLS pin, not part of the token): set \
             RINGLEADER_TOKEN_FILE to the file instead, which reads both, or take the token \
             alone: RINGLEADER_TOKEN=$(head -n1 FILE)"
        ));
    }
    if token.chars().any(char::is_control) {
        return Err(anyhow!(
            "RINGLEADER_TOKEN (or --token) holds control characters: a token is one line of \
             text (RINGLEADER_TOKEN_FILE names a file that holds it)"
        ));
    }
    Ok(token.to_owned())
}

/// `ringleader node`'s default `--data-dir`.
pub const DEFAULT_DATA_DIR: &str = "ringleader-data";

/// `ringleader status`'s flags.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Rows of the members and of the jobs list (1 to 10000; default 500, the API's
    /// `STATUS_ROWS_DEFAULT`); the counts cover every member and job.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Only members in this state (alive, suspect, dead, left, removed).
    #[arg(long)]
    pub member_state: Option<String>,
    /// Only jobs in this state (pending, running, succeeded, failed, cancelled).
    #[arg(long)]
    pub job_state: Option<String>,
}

/// `ringleader jobs`'s flags.
#[derive(Debug, clap::Args)]
pub struct JobsArgs {
    /// Only jobs in this state (pending, running, succeeded, failed, cancelled).
    #[arg(long)]
    pub state: Option<String>,
    /// Rows of a page (1 to 10000; default 500).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Only jobs older than this job id (the next page: the first id of the last).
    #[arg(long)]
    pub before: Option<String>,
    /// Every page, not only the newest.
    #[arg(long)]
    pub all: bool,
    /// List each trial of a search under it, not folded into one line.
    #[arg(long)]
    pub trials: bool,
}

/// `ringleader status`.
pub fn status(cli: &Cli, args: &StatusArgs) -> Result<()> {
    let client = client(cli)?;
    let doc = client.status_page(
        args.limit,
        args.member_state.as_deref(),
        args.job_state.as_deref(),
    )?;
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", doc.to_table());
    }
    Ok(())
}

/// `ringleader keygen [FILE]`.
pub fn keygen(file: Option<PathBuf>) -> Result<()> {
    let key = crate::cluster::identity::generate_cluster_key();
    match file {
        None => print!("{key}"),
        Some(path) => {
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            let mut f = opts
                .open(&path)
                .with_context(|| format!("creating {}", path.display()))?;
            std::io::Write::write_all(&mut f, key.as_bytes())?;
            eprintln!("wrote cluster key to {}", path.display());
        }
    }
    Ok(())
}

/// An API client for `--peer` with the CLI's [`token`].
pub fn client(cli: &Cli) -> Result<ApiClient> {
    let (token, pin) = credentials(cli)?;
    Ok(ApiClient::new(&cli.peer, token).with_tls_pin(pin))
}

/// How often `job --watch` and `logs --follow` poll, in milliseconds.
const POLL_MS: u64 = 500;

/// `ringleader submit FILE`.
pub fn submit(cli: &Cli, file: &std::path::Path) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    // A `.json` file is a spec as JSON (an object with the TOML's keys).
    let json = file
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let client = client(cli)?;
    let id = if json {
        client.submit_json(&text)
    } else {
        client.submit(&text)
    }
    .with_context(|| format!("{}", file.display()))?;
    if cli.json {
        println!("{}", serde_json::json!({ "id": id }));
    } else {
        println!("{id}");
    }
    Ok(())
}

/// `ringleader jobs`.
pub fn jobs(cli: &Cli, args: &JobsArgs) -> Result<()> {
    let client = client(cli)?;
    let rows = crate::api::listing::rows(args.limit).map_err(|e| anyhow::anyhow!("--{e}"))?;
    // One row more than shown tells whether older jobs remain (but at the API's bound).
    let ask = (rows + 1).min(crate::api::listing::LIST_ROWS_MAX);
    let page =
        |before: Option<&str>| -> Result<(Vec<crate::api::status::JobSummary>, Option<String>)> {
            let mut jobs = client.jobs_page(args.state.as_deref(), Some(ask), before)?;
            let more = jobs.len() > rows || (jobs.len() == rows && ask == rows);
            if jobs.len() > rows {
                jobs.remove(0);
            }
            let older = more.then(|| jobs[0].id.clone());
            Ok((jobs, older))
        };
    let (mut jobs, mut older) = page(args.before.as_deref())?;
    while let Some(before) = older.as_deref().filter(|_| args.all) {
        let (mut more, next) = page(Some(before))?;
        older = next;
        more.append(&mut jobs);
        jobs = more;
    }
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&jobs)?);
        return Ok(());
    }
    print!("{}", job_list::table(&jobs, args.trials, wall_ms()));
    if let Some(before) = older {
        let state = args
            .state
            .as_ref()
            .map(|s| format!(" --state {s}"))
            .unwrap_or_default();
        println!("... older jobs: ringleader jobs{state} --before {before} (or --all)");
    }
    Ok(())
}

fn is_terminal(state: &str) -> bool {
    matches!(state, "succeeded" | "failed" | "cancelled" | "stopped")
}

/// This machine's clock, ms since the Unix epoch (the ETAs' reference).
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `ringleader job ID [--watch]`.
pub fn job(cli: &Cli, id: &str, watch: bool) -> Result<()> {
    let c = client(cli)?;
    if !watch {
        let doc = c.job(id)?;
        if cli.json {
            println!("{}", serde_json::to_string_pretty(&doc)?);
        } else {
            print!("{}", doc.to_text());
        }
        return Ok(());
    }
    let search = c.job(id)?.kind == "search";
    if !cli.json && !search && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        return watch_bar(&c, id);
    }
    // Not a terminal (a log, a pipe), or a search: one line per change (a search's trials
    // followed, each state change and each new best), or one JSON document per poll.
    let mut last = String::new();
    let mut seen = crate::api::status::TrialsSeen::default();
    loop {
        let doc = c.job(id)?;
        if cli.json {
            println!("{}", serde_json::to_string(&doc)?);
        } else {
            let line = doc.progress_line();
            if line != last {
                println!("{line}");
                last = line;
            }
            for line in doc.trial_changes(&mut seen) {
                println!("  {line}");
            }
        }
        if is_terminal(&doc.state) {
            if !cli.json {
                doc.failure_lines().iter().for_each(|l| println!("{l}"));
            }
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(POLL_MS));
    }
}

/// The bar's template once the total steps are known: steps done of total, then the ETA
/// (the node's, from the job's step rate: indicatif's counted the steps done before the
/// watch began as done in its first moment) and [`bar_message`] on a second line so a
/// narrow terminal cuts neither.
const BAR_TEMPLATE: &str = "{spinner} {prefix} [{bar:30}] {pos}/{len} steps\n  {wide_msg}";
/// The template while they are not: a spinner and the step count.
const SPINNER_TEMPLATE: &str = "{spinner} {prefix} step {pos}\n  {wide_msg}";

/// `job --watch` on a terminal: a progress bar (a spinner until the total steps are known)
/// redrawn at each poll, then the final progress line.
fn watch_bar(c: &ApiClient, id: &str) -> Result<()> {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    let style = |template: &str| {
        ProgressStyle::with_template(template)
            .map(|s| s.progress_chars("=> "))
            .map_err(|e| anyhow!("progress bar template: {e}"))
    };
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stdout());
    bar.set_style(style(SPINNER_TEMPLATE)?);
    bar.enable_steady_tick(std::time::Duration::from_millis(POLL_MS / 4));
    let mut has_total = false;
    loop {
        let doc = match c.job(id) {
            Ok(doc) => doc,
            Err(e) => {
                bar.abandon();
                return Err(e);
            }
        };
        bar.set_prefix(format!("{} {}", doc.id, doc.name));
        // The total may change (an estimate refined, a trial promoted to a later rung).
        if let Some(total) = doc.total_steps {
            if !has_total {
                bar.set_style(style(BAR_TEMPLATE)?);
                has_total = true;
            }
            bar.set_length(total);
        }
        if let Some(step) = doc.step {
            bar.set_position(step);
        }
        let eta = doc.eta_at_ms.map_or(String::new(), |at| {
            let left = at.saturating_sub(wall_ms());
            format!("ETA {} ", crate::api::status::progress::duration_text(left))
        });
        bar.set_message(format!("{eta}{}", bar_message(&doc)));
        if is_terminal(&doc.state) {
            bar.finish_and_clear();
            println!("{}", doc.progress_line());
            doc.failure_lines().iter().for_each(|l| println!("{l}"));
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(POLL_MS));
    }
}

/// The bar's text after the steps: state, epoch of epochs, loss, validation accuracy, and
/// why the job waits.
pub fn bar_message(doc: &crate::api::status::JobDoc) -> String {
    let mut s = format!("[{}]", doc.state);
    match (doc.epoch, doc.epochs_total) {
        (Some(e), Some(total)) => s.push_str(&format!(" epoch {e}/{total}")),
        (Some(e), None) => s.push_str(&format!(" epoch {e}")),
        _ => {}
    }
    for key in ["loss", "val_accuracy"] {
        if let Some(v) = doc.metrics.get(key) {
            s.push_str(&format!(" {key}={v:.4}"));
        }
    }
    if let Some(r) = &doc.pending_reason {
        s.push_str(&format!(" (pending: {r})"));
    }
    s
}

/// `ringleader trials ID`: a search's leaderboard.
pub fn trials(cli: &Cli, id: &str) -> Result<()> {
    let doc = client(cli)?.job(id)?;
    if doc.kind != "search" {
        return Err(anyhow!("{id} is a {} job, not a search", doc.kind));
    }
    if cli.json {
        let board = doc.leaderboard();
        let v = serde_json::json!({
            "id": doc.id,
            "owner": doc.owner,
            "state": doc.state,
            "metric": doc.search_metric,
            "direction": doc.search_direction,
            "trials": board,
            "best": doc.best,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{} {} of {} [{}] metric {} ({})",
            doc.id,
            doc.name,
            doc.owner,
            doc.state,
            doc.search_metric.as_deref().unwrap_or("?"),
            doc.search_direction.as_deref().unwrap_or("?")
        );
        print!("{}", doc.leaderboard_table());
    }
    Ok(())
}

/// `ringleader cancel ID`.
pub fn cancel(cli: &Cli, id: &str) -> Result<()> {
    let v: serde_json::Value = client(cli)?.post(&format!("/v1/jobs/{id}/cancel"), "")?;
    if cli.json {
        println!("{v}");
    } else {
        println!("{id} cancelled");
    }
    Ok(())
}

/// `ringleader logs ID [--follow] [--protocol]`: every run of the job, oldest first (a search
/// trial's first run, then each promotion and re-run; a job's retries), each headed `== run
/// N (generation G)`, and in `--json` each line carrying its `run` and `generation`; with
/// `--follow`, the current run until the job ends. The rank protocol's lines
/// ([`shown_line`]) only with `protocol`.
pub fn logs(cli: &Cli, id: &str, follow: bool, protocol: bool) -> Result<()> {
    use crate::api::status::LogsDoc;
    let c = client(cli)?;
    let first: LogsDoc = c.get(&format!("/v1/jobs/{id}/logs"))?;
    let past = first.runs.len().saturating_sub(1);
    let mut header = None;
    for &generation in &first.runs[..past] {
        let mut offsets: BTreeMap<u32, u64> = BTreeMap::new();
        loop {
            let doc: LogsDoc = c.get(&format!(
                "/v1/jobs/{id}/logs?generation={generation}&offsets={}",
                offsets_query(&offsets)
            ))?;
            print_chunks(cli, &doc, protocol, &mut header, &mut offsets);
            if doc.chunks.iter().all(|c| c.text.is_empty()) {
                break;
            }
        }
    }
    // The first answer is the current run's first read (a log only grows).
    let mut offsets: BTreeMap<u32, u64> = BTreeMap::new();
    let mut generation = None;
    let mut next = Some(first);
    loop {
        let doc: LogsDoc = match next.take() {
            Some(doc) => doc,
            None => c.get(&format!(
                "/v1/jobs/{id}/logs?offsets={}",
                offsets_query(&offsets)
            ))?,
        };
        if let Some(g) = doc.chunks.first().map(|c| c.generation) {
            if generation.replace(g) != Some(g) && !offsets.is_empty() {
                // Read at the last generation's offsets: read the new one from its start.
                offsets.clear();
                continue;
            }
        }
        print_chunks(cli, &doc, protocol, &mut header, &mut offsets);
        let drained = doc.chunks.iter().all(|c| c.text.is_empty());
        if !follow || (is_terminal(&doc.state) && drained) {
            return Ok(());
        }
        if drained {
            std::thread::sleep(std::time::Duration::from_millis(POLL_MS));
        }
    }
}

/// `worker:offset` pairs for the logs query.
fn offsets_query(offsets: &BTreeMap<u32, u64>) -> String {
    let q: Vec<String> = offsets.iter().map(|(w, o)| format!("{w}:{o}")).collect();
    q.join(",")
}

/// The run (1-based) a generation belongs to: the runs placed at or before it.
fn run_of(runs: &[u32], generation: u32) -> usize {
    runs.iter().filter(|g| **g <= generation).count().max(1)
}

/// Prints a logs answer's lines, a header at each new (run, generation), and moves
/// `offsets` past them.
/// Whether `logs` prints `line`: a user's own output always; the rank protocol's lines
/// (`ringleader-heartbeat`, `ringleader-metric`, …: most of a training job's log) only with
/// `--protocol`.
pub fn shown_line(line: &str, protocol: bool) -> bool {
    protocol || !line.starts_with(ringleader_protocol::PREFIX)
}

fn print_chunks(
    cli: &Cli,
    doc: &crate::api::status::LogsDoc,
    protocol: bool,
    header: &mut Option<(usize, u32)>,
    offsets: &mut BTreeMap<u32, u64>,
) {
    for chunk in &doc.chunks {
        let run = run_of(&doc.runs, chunk.generation);
        if header.replace((run, chunk.generation)) != Some((run, chunk.generation)) && !cli.json {
            println!("== run {run} (generation {})", chunk.generation);
        }
        if let Some(e) = &chunk.error {
            eprintln!("rank {}: log unavailable: {e}", chunk.rank);
        }
        for line in chunk.text.lines().filter(|l| shown_line(l, protocol)) {
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "run": run,
                        "generation": chunk.generation,
                        "rank": chunk.rank,
                        "line": line,
                    })
                );
            } else {
                println!("[rank {}] {line}", chunk.rank);
            }
        }
        offsets.insert(chunk.worker, chunk.next_offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_config(args: &[&str]) -> Result<NodeConfig> {
        let cli = Cli::try_parse_from(["ringleader", "node"].iter().chain(args))?;
        match cli.command {
            Cmd::Node(n) => n.into_config(),
            _ => unreachable!("a node command"),
        }
    }

    #[test]
    fn logs_hide_the_rank_protocol_unless_asked() {
        assert!(shown_line("epoch 3 loss 0.2", false));
        assert!(shown_line(
            "  ringleader-metric in the middle is the user's",
            false
        ));
        assert!(!shown_line("ringleader-heartbeat 12", false));
        assert!(!shown_line("ringleader-metric loss 0.5", false));
        assert!(shown_line("ringleader-heartbeat 12", true));
    }

    #[test]
    fn storage_credentials_never_come_from_the_command_line() {
        for url in [
            "s3://b/p?endpoint=http://x&access_key_id=AK&secret_access_key=SK",
            "s3://AK:SK@b/p",
        ] {
            let err = node_config(&["--storage", url]).err().unwrap();
            assert!(err.to_string().contains("--storage-file"), "{err}");
        }
        let ok = node_config(&["--storage", "s3://b/p?endpoint=http://x&region=r"]).unwrap();
        assert_eq!(ok.storage, "s3://b/p?endpoint=http://x&region=r");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("storage");
        crate::security::modes::write_private(&file, b"s3://AK:SK@b/p\n").unwrap();
        let f = file.to_str().unwrap();
        assert_eq!(
            node_config(&["--storage-file", f]).unwrap().storage,
            "s3://AK:SK@b/p"
        );
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let err = node_config(&["--storage-file", f]).err().unwrap();
        assert!(format!("{err:#}").contains("chmod 600"), "{err:#}");
        assert!(node_config(&["--storage", "file:///x", "--storage-file", f]).is_err());
    }

    #[test]
    fn a_token_of_more_than_one_line_is_refused_with_what_to_use_instead() {
        // `RINGLEADER_TOKEN=$(cat api.token)` of a keyed node: the token and its TLS pin.
        let file = format!("{}\ntls sha256:{}", "ab".repeat(32), "0".repeat(64));
        let cli = Cli::try_parse_from(["ringleader", "--token", &file, "status"]).unwrap();
        let err = credentials(&cli).unwrap_err().to_string();
        assert!(err.contains("more than one line"), "{err}");
        assert!(err.contains("RINGLEADER_TOKEN_FILE"), "{err}");
        assert!(err.contains("head -n1"), "{err}");
        assert!(given_token("a\r\nb").is_err());
        let err = given_token("a\u{1b}b").unwrap_err().to_string();
        assert!(err.contains("control characters"), "{err}");
        // One line, with the blanks a shell or an editor leaves around it: the token.
        assert_eq!(given_token(" tok \n").unwrap(), "tok");
        let cli = Cli::try_parse_from(["ringleader", "--token", "tok", "status"]).unwrap();
        assert_eq!(credentials(&cli).unwrap().0.as_deref(), Some("tok"));
    }

    #[test]
    fn bar_message_shows_epoch_of_total_loss_and_accuracy() {
        let doc: crate::api::status::JobDoc = serde_json::from_value(serde_json::json!({
            "id": "j-1", "name": "mnist", "kind": "train", "state": "running",
            "generation": 1, "max_restarts": 0, "workers": 2, "ring": [],
            "pending_reason": null, "step": 40, "epoch": 3, "epochs_total": 5,
            "metrics": {"loss": 0.123456, "val_accuracy": 0.9, "lr": 0.1},
            "history": [], "events": [], "exits": {}, "submitted_at_ms": 0,
            "freshness": {"applied_index": 1, "served_by": "chief"},
        }))
        .unwrap();
        assert_eq!(
            bar_message(&doc),
            "[running] epoch 3/5 loss=0.1235 val_accuracy=0.9000"
        );
    }
}
