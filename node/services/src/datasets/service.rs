//! The node's dataset service: adds, fetches, lists and removes datasets, serves peers,
//! advertises what it holds in gossip, and deletes what no name refers to any more.
//!
//! The registry (name → root) is in the control state; who holds what is in member
//! metadata ([`HeldDataset`]), refreshed whenever this node's holdings change, so a dead
//! member stops being a holder when membership declares it dead. At most one fetch of a
//! dataset runs on a node: a second `get` (or a train worker needing it) joins it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::net::TcpListener;
use tracing::{info, warn};

use super::confined::ConfinedDir;
use super::fetch::{self, Discover, Fetch, FetchContext, FetchStatus, Source};
use super::fs_user::FsUser;
use super::roots::{Access, HostAccess, HostRoots};
use super::serve::{self, Holding, Holdings, Server, Throttle};
use super::store::{ChunkSet, Store};
use super::transport::AuthKey;
use super::{check_name, DatasetError, Root};
use crate::cluster::membership::State;
use crate::cluster::meta::{HeldDataset, HELD_DATASETS_MAX};
use crate::cluster::net::NodeHandle;
use crate::control::handle::{wall_ms, ControlHandle};
use crate::control::protocol::ProposeError;
use crate::domain::spec::JobKind;
use crate::domain::state::{DatasetRecord, JobState};
use crate::domain::{ops, ControlCommand, ControlResponse, Op};

/// How long a root just added is kept though no name refers to it yet (the name's commit
/// may reach this replica later than the files).
const PIN_AFTER_ADD: Duration = Duration::from_secs(60);
/// How long a lookup waits for this replica to apply a name it does not know yet.
pub const REGISTRY_LAG: Duration = Duration::from_secs(3);
/// Shortest gap between two upkeeps (advertise, delete unnamed content, note a busy ring).
const UPKEEP_GAP: Duration = Duration::from_millis(500);
/// Longest: the upkeep runs when the holdings or the replicated state change, and at least
/// this often (pins expire and fetches end without either).
const UPKEEP_QUIET: Duration = Duration::from_secs(5);

/// The service's settings.
#[derive(Clone)]
pub struct DatasetsConfig {
    /// The store's directory (`<data-dir>/datasets`).
    pub dir: PathBuf,
    /// The transport key.
    pub key: AuthKey,
    /// Serving cap at all times, bytes per second (0: none).
    pub upload_bytes_per_s: u64,
    /// Serving cap while a job's ring runs on this host, bytes per second (0: none).
    pub busy_bytes_per_s: u64,
    /// This node's peer id.
    pub me: String,
    /// This node's name.
    pub name: String,
    /// What an add may read and a `get --to` write on this host, by token
    /// (`--dataset-source`, `--dataset-dest`, the refused paths: [`super::roots`]).
    pub roots: Arc<HostRoots>,
    /// The user whose file access those reads and writes take (`--run-as`; `None`: the
    /// node's).
    pub run_as: Option<FsUser>,
}

/// Why a dataset call failed; the API maps each to a status.
#[derive(Debug, thiserror::Error)]
pub enum DatasetsError {
    /// No such name.
    #[error("no dataset {0:?} (see `ringleader dataset ls`)")]
    NotFound(String),
    /// The name exists.
    #[error("dataset {0:?} exists; remove it first or choose another name")]
    Exists(String),
    /// The caller's input is wrong (a name, a path, a file).
    #[error("{0}")]
    BadInput(String),
    /// The path is outside what the caller may read or write on this host
    /// ([`super::roots`]).
    #[error("{0}")]
    Refused(String),
    /// The control plane did not take the change.
    #[error(transparent)]
    Propose(#[from] ProposeError),
    /// Something on this node failed.
    #[error("{0}")]
    Internal(String),
}

/// A dataset as `dataset ls` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct DatasetDoc {
    /// Its name.
    pub name: String,
    /// Total bytes.
    pub size_bytes: u64,
    /// Files.
    pub files: u64,
    /// Chunks.
    pub chunks: u64,
    /// Its manifest's root, hex.
    pub root: Root,
    /// Live members holding all of it, by name.
    pub holders: Vec<String>,
    /// Live members fetching it (serving the chunks they have), by name.
    pub fetching: Vec<String>,
    /// When it was added, ms since the Unix epoch.
    pub added_at: u64,
    /// The member it was added on.
    pub added_on: String,
    /// The user who added it.
    #[serde(default = "crate::domain::state::users::admin_user")]
    pub owner: String,
}

/// The service (cheap to clone).
#[derive(Clone)]
pub struct Datasets {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: DatasetsConfig,
    store: Store,
    holdings: Arc<Holdings>,
    throttle: Arc<Throttle>,
    fetches: Mutex<HashMap<Root, Arc<Fetch>>>,
    pins: Mutex<HashMap<Root, Instant>>,
    node: NodeHandle,
    control: ControlHandle,
    addr: SocketAddr,
    /// The service's tasks (its server, upkeep and fetches), stopped with the node.
    tasks: crate::tasks::Tasks,
}

fn prefix(root: &Root) -> u64 {
    u64::from_be_bytes(root.0[..8].try_into().expect("8 bytes"))
}

impl Datasets {
    /// Opens the store, loads the whole copies in it, and starts serving on `listener`
    /// and the upkeep, in `tasks` (fetches run there too; a fetch stopped with them leaves
    /// its `.part`, which the next fetch of the dataset resumes).
    pub async fn start(
        tasks: crate::tasks::Tasks,
        cfg: DatasetsConfig,
        listener: TcpListener,
        node: NodeHandle,
        control: ControlHandle,
    ) -> anyhow::Result<Datasets> {
        let dir = cfg.dir.clone();
        let (store, loaded) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let store = Store::open(&dir)?;
            let mut loaded = Vec::new();
            for held in store.scan()?.into_iter().filter(|h| h.complete) {
                match store.manifest(&held) {
                    Ok(m) => loaded.push((held.root, m)),
                    Err(e) => warn!(root = %held.root, "dataset copy unreadable, ignored: {e}"),
                }
            }
            Ok((store, loaded))
        })
        .await??;
        let holdings = Arc::new(Holdings::default());
        for (root, manifest) in loaded {
            let have = ChunkSet::full(super::store::ChunkIndex::new(&manifest).len());
            holdings.insert(root, Arc::new(Holding::new(manifest, have)));
        }
        let throttle = Arc::new(Throttle::new(cfg.upload_bytes_per_s, cfg.busy_bytes_per_s));
        let addr = listener.local_addr()?;
        tasks.spawn(serve::run(
            tasks.clone(),
            Server {
                store: store.clone(),
                holdings: holdings.clone(),
                key: cfg.key.clone(),
                throttle: throttle.clone(),
            },
            listener,
        ));
        let service = Datasets {
            inner: Arc::new(Inner {
                cfg,
                store,
                holdings,
                throttle,
                fetches: Mutex::new(HashMap::new()),
                pins: Mutex::new(HashMap::new()),
                node,
                control,
                addr,
                tasks: tasks.clone(),
            }),
        };
        tasks.spawn(service.clone().upkeep());
        Ok(service)
    }

    /// The address peers fetch from.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Bytes this node has served to peers.
    pub fn served_bytes(&self) -> u64 {
        self.inner.throttle.served_bytes.load(Ordering::Relaxed)
    }

    /// Bytes this node has fetched (verified) in this process's fetches.
    pub fn fetched_bytes(&self) -> u64 {
        let fetches = self.inner.fetches.lock().expect("fetches lock");
        fetches.values().map(|f| f.status().bytes).sum()
    }

    /// Adds the file or directory at `path` (on this node) as `name`, cut into chunks of
    /// `chunk_bytes` (default: [`super::manifest::chunk_bytes_for`] its size): copies it into
    /// the store, then registers the name. The files are this node's to serve from then on.
    /// `path` is read within what the caller (the admin: `admin`, or a made token) may read
    /// ([`super::roots`]), with the `--run-as` user's file access. The dataset is
    /// `owner`'s (the caller's user).
    pub async fn add(
        &self,
        name: &str,
        path: &Path,
        chunk_bytes: Option<u32>,
        (admin, owner): (bool, &str),
    ) -> Result<DatasetDoc, DatasetsError> {
        check_name(name).map_err(DatasetsError::BadInput)?;
        if self.registered(name).is_some() {
            return Err(DatasetsError::Exists(name.to_owned()));
        }
        if !path.is_absolute() {
            return Err(DatasetsError::BadInput(format!(
                "{}: give an absolute path (it is read on the node)",
                path.display()
            )));
        }
        let store = self.inner.store.clone();
        let src = path.to_path_buf();
        let access = self.access(admin);
        let manifest = tokio::task::spawn_blocking(move || {
            access.precheck(Access::Read, &src)?;
            let chunk_bytes = match chunk_bytes {
                Some(c) => c,
                None => {
                    super::manifest::chunk_bytes_for(super::manifest::source_bytes(&src, &access)?)
                }
            };
            store.import_as(&src, chunk_bytes, &access)
        })
        .await
        .map_err(|e| DatasetsError::Internal(e.to_string()))?
        .map_err(|e| match e {
            e if e.is_disk_full() => DatasetsError::Internal(format!("disk full: {e}")),
            DatasetError::Refused(e) => DatasetsError::Refused(e.to_string()),
            e => DatasetsError::BadInput(e.to_string()),
        })?;
        let root = manifest.root();
        self.pin(root);
        if self.inner.holdings.get(&root).is_none() {
            let have = ChunkSet::full(super::store::ChunkIndex::new(&manifest).len());
            self.inner
                .holdings
                .insert(root, Arc::new(Holding::new(manifest.clone(), have)));
        }
        let record = DatasetRecord {
            root,
            size_bytes: manifest.total_bytes(),
            files: manifest.files().len() as u64,
            chunks: manifest.chunk_count() as u64,
            added_at_ms: wall_ms(),
            added_on: self.inner.cfg.name.clone(),
            owner: owner.to_owned(),
        };
        let cmd = ControlCommand {
            op: Op::DatasetAdd(ops::DatasetAdd {
                name: name.to_owned(),
                record: record.clone(),
            }),
            at_ms: record.added_at_ms,
        };
        match self.inner.control.propose(cmd).await? {
            ControlResponse::Applied => {
                info!(%name, %root, bytes = record.size_bytes, "dataset added");
                self.advertise().await;
                Ok(self.doc(name, &record).await)
            }
            ControlResponse::Rejected { reason } if reason.contains("exists") => {
                Err(DatasetsError::Exists(name.to_owned()))
            }
            other => Err(DatasetsError::BadInput(format!("not added: {other:?}"))),
        }
    }

    /// Removes the name `name`; holders delete the content once no name refers to it.
    pub async fn remove(&self, name: &str) -> Result<(), DatasetsError> {
        if self.lookup(name).await.is_none() {
            return Err(DatasetsError::NotFound(name.to_owned()));
        }
        let cmd = ControlCommand {
            op: Op::DatasetRemove(ops::DatasetRemove {
                name: name.to_owned(),
            }),
            at_ms: wall_ms(),
        };
        match self.inner.control.propose(cmd).await? {
            ControlResponse::Applied => Ok(()),
            ControlResponse::Rejected { .. } => Err(DatasetsError::NotFound(name.to_owned())),
            other => Err(DatasetsError::Internal(format!("not removed: {other:?}"))),
        }
    }

    /// Every registered dataset, with its live holders.
    pub async fn list(&self) -> Vec<DatasetDoc> {
        let records = self.inner.control.read(|s| s.datasets.clone());
        let holders = self.holders().await;
        records
            .iter()
            .map(|(name, r)| doc_of(name, r, &holders))
            .collect()
    }

    async fn doc(&self, name: &str, record: &DatasetRecord) -> DatasetDoc {
        doc_of(name, record, &self.holders().await)
    }

    /// Live members' holdings by root prefix: (complete holders, partial holders).
    async fn holders(&self) -> HashMap<u64, (Vec<String>, Vec<String>)> {
        let mut by_prefix: HashMap<u64, (Vec<String>, Vec<String>)> = HashMap::new();
        let Ok((_, members)) = self.inner.node.members().await else {
            return by_prefix;
        };
        for m in members
            .iter()
            .filter(|m| matches!(m.state, State::Alive | State::Suspect))
        {
            for held in &m.meta.datasets {
                let e = by_prefix.entry(held.root_prefix).or_default();
                if held.complete {
                    e.0.push(m.meta.name.clone());
                } else {
                    e.1.push(m.meta.name.clone());
                }
            }
        }
        for (c, p) in by_prefix.values_mut() {
            c.sort();
            p.sort();
        }
        by_prefix
    }

    fn registered(&self, name: &str) -> Option<DatasetRecord> {
        self.inner.control.read(|s| s.datasets.get(name).cloned())
    }

    /// The registry's record of `name`, waiting up to [`REGISTRY_LAG`] for this replica to
    /// apply it: a name added on another node a moment ago may not have reached this one.
    pub async fn lookup(&self, name: &str) -> Option<DatasetRecord> {
        let deadline = Instant::now() + REGISTRY_LAG;
        loop {
            if let Some(r) = self.registered(name) {
                return Some(r);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// This node's reach into the host for a request by the admin (`admin`) or a made token.
    fn access(&self, admin: bool) -> HostAccess {
        HostAccess::request(self.inner.cfg.roots.clone(), admin, self.inner.cfg.run_as)
    }

    /// Starts fetching `name` to this node (or joins the fetch under way) and returns it;
    /// with `to`, the files are also written under that directory, in place as the chunks
    /// arrive (see [`super::export`]); the fetch ends once they are there. `to` is checked
    /// and opened here, within what the caller (the admin: `admin`, or a made token) may
    /// write ([`super::roots`]), and written with the `--run-as` user's file access.
    pub async fn get(
        &self,
        name: &str,
        to: Option<PathBuf>,
        admin: bool,
    ) -> Result<Arc<Fetch>, DatasetsError> {
        let record = self
            .lookup(name)
            .await
            .ok_or_else(|| DatasetsError::NotFound(name.to_owned()))?;
        let to = match to {
            Some(to) => Some(Arc::new(self.open_to(to, admin).await?)),
            None => None,
        };
        let root = record.root;
        let mut fetches = self.inner.fetches.lock().expect("fetches lock");
        let running = fetches.get(&root).filter(|f| !f.has_ended()).cloned();
        if let (Some(f), None) = (&running, &to) {
            return Ok(f.clone());
        }
        let fetch = Arc::new(Fetch::new(name, root));
        fetches.insert(root, fetch.clone());
        drop(fetches);
        let ctx = FetchContext {
            store: self.inner.store.clone(),
            holdings: self.inner.holdings.clone(),
            key: self.inner.cfg.key.clone(),
            root,
            discover: self.discover(),
            to,
        };
        let service = self.clone();
        let f = fetch.clone();
        self.inner.tasks.spawn(async move {
            // One fetch of a root at a time: a `get --to` during a fetch waits for it, then
            // finds the whole copy.
            if let Some(prev) = running {
                loop {
                    let ended = prev.ended.notified();
                    if prev.has_ended() {
                        break;
                    }
                    ended.await;
                }
            }
            let result = fetch::run(ctx, f.clone()).await;
            service.advertise().await;
            if let Err(e) = &result {
                warn!(dataset = %f.status().name, "fetch failed: {e}");
            }
            f.end(&result);
        });
        Ok(fetch)
    }

    /// Checks and opens a `get --to` directory for a request (see [`Datasets::get`]).
    async fn open_to(&self, to: PathBuf, admin: bool) -> Result<ConfinedDir, DatasetsError> {
        if !to.is_absolute() {
            return Err(DatasetsError::BadInput(format!(
                "--to {}: give an absolute path (it is written on the node)",
                to.display()
            )));
        }
        let access = self.access(admin);
        tokio::task::spawn_blocking(move || -> Result<ConfinedDir, DatasetError> {
            access.precheck(Access::Write, &to)?;
            let dir = ConfinedDir::open_or_create_as(&to, access.user)?;
            access.check_open(Access::Write, std::os::fd::AsFd::as_fd(&dir), &to)?;
            Ok(dir)
        })
        .await
        .map_err(|e| DatasetsError::Internal(e.to_string()))?
        .map_err(|e| match e {
            DatasetError::Refused(e) => DatasetsError::Refused(format!("--to {e}")),
            e => DatasetsError::BadInput(e.to_string()),
        })
    }

    /// The latest fetch of `name` on this node.
    pub fn fetch_status(&self, name: &str) -> Option<FetchStatus> {
        let root = self.registered(name)?.root;
        let fetches = self.inner.fetches.lock().expect("fetches lock");
        fetches.get(&root).map(|f| f.status())
    }

    /// The latest fetch of `name` on this node, once it has ended or `wait` has passed,
    /// whichever comes first: a caller waiting for the end learns of it at once instead of
    /// at its next poll.
    pub async fn fetch_status_after(&self, name: &str, wait: Duration) -> Option<FetchStatus> {
        let root = self.registered(name)?.root;
        let fetch = {
            let fetches = self.inner.fetches.lock().expect("fetches lock");
            fetches.get(&root).cloned()?
        };
        // Registered before the check, so an end in between still wakes it.
        let ended = fetch.ended.notified();
        if !fetch.has_ended() {
            let _ = tokio::time::timeout(wait, ended).await;
        }
        Some(fetch.status())
    }

    /// The local directory of `name`'s files, fetching them first if this node lacks them;
    /// `progress` is called now and then while a fetch runs.
    pub async fn ensure_local(
        &self,
        name: &str,
        mut progress: impl FnMut(&FetchStatus),
    ) -> Result<PathBuf, DatasetsError> {
        let record = self
            .lookup(name)
            .await
            .ok_or_else(|| DatasetsError::NotFound(name.to_owned()))?;
        if let Some(dir) = self.inner.store.files_dir(&record.root) {
            return Ok(dir);
        }
        let fetch = self.get(name, None, false).await?;
        loop {
            let ended = fetch.ended.notified();
            if fetch.has_ended() {
                break;
            }
            progress(&fetch.status());
            let _ = tokio::time::timeout(Duration::from_secs(2), ended).await;
        }
        let status = fetch.status();
        match (status.state, status.path) {
            ("done", Some(path)) => Ok(PathBuf::from(path)),
            _ => Err(DatasetsError::Internal(format!(
                "fetching dataset {name:?}: {}",
                status.error.unwrap_or_default()
            ))),
        }
    }

    fn discover(&self) -> Discover {
        let node = self.inner.node.clone();
        let me = self.inner.cfg.me.clone();
        Arc::new(move |root: Root| {
            let node = node.clone();
            let me = me.clone();
            Box::pin(async move {
                let Ok((_, members)) = node.members().await else {
                    return Vec::new();
                };
                let want = prefix(&root);
                members
                    .into_iter()
                    .filter(|m| matches!(m.state, State::Alive | State::Suspect))
                    .filter(|m| m.id.to_string() != me)
                    .filter_map(|m| {
                        let held = m.meta.datasets.iter().find(|h| h.root_prefix == want)?;
                        let addr = m.meta.datasets_addr.parse().ok()?;
                        Some(Source {
                            name: m.meta.name.clone(),
                            addr,
                            complete: held.complete,
                        })
                    })
                    .collect()
            })
        })
    }

    fn pin(&self, root: Root) {
        let mut pins = self.inner.pins.lock().expect("pins lock");
        pins.retain(|_, t| t.elapsed() < PIN_AFTER_ADD);
        pins.insert(root, Instant::now());
    }

    /// Tells the cluster what this node holds: whole copies first, then fetches.
    async fn advertise(&self) {
        let mut held: Vec<HeldDataset> = self
            .inner
            .holdings
            .all()
            .iter()
            .map(|(root, h)| HeldDataset {
                root_prefix: prefix(root),
                complete: h.complete.load(Ordering::Acquire),
            })
            .collect();
        held.sort_by_key(|h| (!h.complete, h.root_prefix));
        held.truncate(HELD_DATASETS_MAX);
        self.inner
            .node
            .update_meta(move |meta| meta.datasets = held)
            .await;
    }

    /// Runs forever: re-advertises on change, deletes content no name refers to, and caps
    /// serving while a job's ring runs here. Wakes on a change of the holdings or of the
    /// replicated state (at most every [`UPKEEP_GAP`]), or after [`UPKEEP_QUIET`]: an idle
    /// node's timers are its CPU, and the state is read whole (every job) each time.
    async fn upkeep(self) {
        let mut advertised = u64::MAX;
        let mut applied = Some(self.inner.control.subscribe_applied());
        loop {
            let version = self.inner.holdings.version.load(Ordering::Acquire);
            if version != advertised {
                self.advertise().await;
                advertised = version;
            }
            let me = self.inner.cfg.me.clone();
            let (named, busy, caught_up) = self.inner.control.read(|s| {
                let named: Vec<Root> = s.datasets.values().map(|r| r.root).collect();
                let busy = s.jobs.values().any(|j| {
                    j.state == JobState::Running
                        && j.spec.kind == JobKind::Train
                        && j.assignment.iter().any(|slot| slot.member == me)
                });
                (named, busy, s.applied_index > 0)
            });
            self.inner.throttle.set_busy(busy);
            if caught_up {
                self.collect_garbage(&named).await;
            }
            tokio::time::sleep(UPKEEP_GAP).await;
            tokio::select! {
                _ = self.inner.holdings.changes.notified() => {}
                r = async {
                    match applied.as_mut() {
                        Some(a) => a.changed().await,
                        None => std::future::pending().await,
                    }
                } => if r.is_err() {
                    // The state machine is gone (the node stops): the timer alone.
                    applied = None;
                },
                _ = tokio::time::sleep(UPKEEP_QUIET) => {}
            }
        }
    }

    async fn collect_garbage(&self, named: &[Root]) {
        let pinned: Vec<Root> = {
            let mut pins = self.inner.pins.lock().expect("pins lock");
            // A pin holds until this replica sees the name (or it expires).
            pins.retain(|root, t| t.elapsed() < PIN_AFTER_ADD && !named.contains(root));
            pins.keys().copied().collect()
        };
        let fetching: Vec<Root> = {
            let fetches = self.inner.fetches.lock().expect("fetches lock");
            fetches
                .iter()
                .filter(|(_, f)| !f.has_ended())
                .map(|(r, _)| *r)
                .collect()
        };
        for (root, _) in self.inner.holdings.all() {
            if named.contains(&root) || pinned.contains(&root) || fetching.contains(&root) {
                continue;
            }
            self.inner.holdings.remove(&root);
            let store = self.inner.store.clone();
            match tokio::task::spawn_blocking(move || store.remove(&root)).await {
                Ok(Ok(())) => info!(%root, "dataset deleted: no name refers to it"),
                Ok(Err(e)) => warn!(%root, "deleting an unnamed dataset: {e}"),
                Err(e) => warn!(%root, "deleting an unnamed dataset: {e}"),
            }
        }
    }
}

fn doc_of(
    name: &str,
    r: &DatasetRecord,
    holders: &HashMap<u64, (Vec<String>, Vec<String>)>,
) -> DatasetDoc {
    let (complete, partial) = holders.get(&prefix(&r.root)).cloned().unwrap_or_default();
    DatasetDoc {
        name: name.to_owned(),
        size_bytes: r.size_bytes,
        files: r.files,
        chunks: r.chunks,
        root: r.root,
        holders: complete,
        fetching: partial,
        added_at: r.added_at_ms,
        added_on: r.added_on.clone(),
        owner: r.owner.clone(),
    }
}
