//! Multi-source fetch: every chunk asked of the holders in parallel, more of them in flight
//! to the faster ones, each verified before it is written.
//!
//! One connection per holder. Each holder's task keeps a window of requests in flight,
//! sized from the rate measured on that connection so far (about [`WINDOW_SECONDS`] of
//! its traffic, [`WINDOW_MIN`] to [`WINDOW_MAX`] chunks): a faster holder has more
//! requests outstanding and, since a task asks for the next chunk as soon as one arrives,
//! serves more of the dataset. The [`Scheduler`] hands out chunks rarest first (by how
//! many live holders have each, which matters when holders have partial copies), and at
//! the end ("endgame") a holder with nothing left to do asks for a chunk still in flight
//! elsewhere, so one slow holder cannot hold up the last chunks; whichever copy arrives
//! first is used.
//!
//! Every chunk is checked against the manifest before it is written; a holder that sends
//! a bad one (or a malformed answer) is dropped for the rest of this fetch and its chunks
//! are asked of the others. A holder whose connection fails is tried again after
//! [`RETRY_AFTER`]. Chunks go into the store's `.part` copy, which this node serves while
//! it fills; the copy becomes whole (and visible) only once every chunk is in.
//!
//! With `get --to DIR` ([`FetchContext::to`]), each verified chunk is also written into
//! place under `DIR` as it arrives ([`Export`]), so the user's files are there when the
//! last chunk is, not a copy of the whole dataset later; they appear at their paths only
//! once every chunk is in. A dataset the store holds whole already is copied from there.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tracing::{info, warn};

use super::confined::ConfinedDir;
use super::export::{self, Export};
use super::serve::{Holding, Holdings};
use super::store::{ChunkIndex, ChunkSet, Partial, Store};
use super::transport::{self, AuthKey, Reply, Request, TransportError};
use super::{Manifest, Root, MANIFEST_BYTES_MAX};

/// Fewest chunk requests a holder's connection keeps in flight.
pub const WINDOW_MIN: usize = 2;
/// Most chunk requests a holder's connection keeps in flight.
pub const WINDOW_MAX: usize = 16;
/// In-flight data per holder, in seconds of its measured rate.
pub const WINDOW_SECONDS: f64 = 0.25;
/// A holder whose connection failed is tried again after this long.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);
/// A fetch with no holder to ask and no chunk arriving for this long fails.
pub const NO_HOLDER_TIMEOUT: Duration = Duration::from_secs(30);
/// An answer to a request must start arriving within this long.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long establishing a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the fetch looks for new holders.
const DISCOVER_EVERY: Duration = Duration::from_millis(500);

/// Which holder, within one fetch.
pub type HolderId = usize;

/// Which chunk to ask of which holder (pure; see the module documentation).
#[derive(Debug)]
pub struct Scheduler {
    done: ChunkSet,
    /// Chunks neither done nor in flight, by (live holders that have it, index).
    pending: BTreeSet<(u32, u64)>,
    /// Live holders that have each chunk.
    avail: Vec<u32>,
    /// Chunks in flight and the holders asked.
    in_flight: HashMap<u64, Vec<HolderId>>,
    holders: HashMap<HolderId, ChunkSet>,
}

impl Scheduler {
    /// A schedule for `done.len()` chunks of which `done` are in already.
    pub fn new(done: ChunkSet) -> Self {
        let pending = (0..done.len())
            .filter(|&g| !done.contains(g))
            .map(|g| (0, g))
            .collect();
        Scheduler {
            avail: vec![0; done.len() as usize],
            done,
            pending,
            in_flight: HashMap::new(),
            holders: HashMap::new(),
        }
    }

    fn adjust(&mut self, g: u64, up: bool) {
        let a = &mut self.avail[g as usize];
        let was = *a;
        *a = if up { was + 1 } else { was.saturating_sub(1) };
        if self.pending.remove(&(was, g)) {
            self.pending.insert((*a, g));
        }
    }

    /// A holder joins with the chunks in `have` (replacing what it had, if known).
    pub fn set_holder(&mut self, h: HolderId, have: ChunkSet) {
        if let Some(old) = self.holders.remove(&h) {
            for g in (0..old.len()).filter(|&g| old.contains(g)) {
                self.adjust(g, false);
            }
        }
        for g in (0..have.len()).filter(|&g| have.contains(g)) {
            self.adjust(g, true);
        }
        self.holders.insert(h, have);
    }

    /// A holder leaves: what it had in flight goes back to pending unless asked elsewhere.
    pub fn remove_holder(&mut self, h: HolderId) {
        if let Some(old) = self.holders.remove(&h) {
            for g in (0..old.len()).filter(|&g| old.contains(g)) {
                self.adjust(g, false);
            }
        }
        let asked: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, hs)| hs.contains(&h))
            .map(|(g, _)| *g)
            .collect();
        for g in asked {
            self.release(h, g);
        }
    }

    /// `h` will not deliver `g` (it failed, or said it does not have it).
    pub fn release(&mut self, h: HolderId, g: u64) {
        if let Some(hs) = self.in_flight.get_mut(&g) {
            hs.retain(|&x| x != h);
            if hs.is_empty() {
                self.in_flight.remove(&g);
                if !self.done.contains(g) {
                    self.pending.insert((self.avail[g as usize], g));
                }
            }
        }
    }

    /// `h` said it does not have `g` after all.
    pub fn not_here(&mut self, h: HolderId, g: u64) {
        if let Some(have) = self.holders.get_mut(&h) {
            if have.contains(g) {
                have.remove(g);
                self.adjust(g, false);
            }
        }
        self.release(h, g);
    }

    /// The next chunk to ask of `h`: the rarest pending chunk it has, else (endgame) a
    /// chunk in flight at exactly one other holder.
    pub fn assign(&mut self, h: HolderId) -> Option<u64> {
        let have = self.holders.get(&h)?;
        let pick = if have.is_full() {
            self.pending.iter().next().copied()
        } else {
            self.pending
                .iter()
                .find(|(_, g)| have.contains(*g))
                .copied()
        };
        if let Some((a, g)) = pick {
            self.pending.remove(&(a, g));
            self.in_flight.insert(g, vec![h]);
            return Some(g);
        }
        let g = self
            .in_flight
            .iter()
            .filter(|(g, hs)| hs.len() == 1 && hs[0] != h && have.contains(**g))
            .map(|(g, _)| *g)
            .min()?;
        self.in_flight.get_mut(&g).expect("in flight").push(h);
        Some(g)
    }

    /// `g` arrived and was written; returns `false` if it was in already (a duplicate).
    pub fn complete(&mut self, g: u64) -> bool {
        if !self.done.insert(g) {
            return false;
        }
        self.in_flight.remove(&g);
        self.pending.remove(&(self.avail[g as usize], g));
        true
    }

    /// Whether `g` is in.
    pub fn is_done(&self, g: u64) -> bool {
        self.done.contains(g)
    }

    /// Whether every chunk is in.
    pub fn all_done(&self) -> bool {
        self.done.is_full()
    }
}

/// A member that holds the dataset, whole or in part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The member's name.
    pub name: String,
    /// Its dataset address.
    pub addr: SocketAddr,
    /// Whether it holds every chunk.
    pub complete: bool,
}

/// Where a fetch stands, as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct FetchStatus {
    /// The dataset's name.
    pub name: String,
    /// Its root.
    pub root: Root,
    /// `fetching`, `done` or `failed`.
    pub state: &'static str,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Chunks in all.
    pub chunks: u64,
    /// Chunks in (resumed ones included).
    pub chunks_done: u64,
    /// The dataset's size, bytes.
    pub size_bytes: u64,
    /// Bytes fetched by this run (verified chunks).
    pub bytes: u64,
    /// Chunks found already verified on disk when the run began (an interrupted fetch).
    pub resumed_chunks: u64,
    /// Milliseconds since the run began.
    pub elapsed_ms: u64,
    /// `bytes` over the time since the first request, in MB (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// Each holder asked, by name.
    pub sources: Vec<SourceStatus>,
    /// Where the files are on this node once done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// One holder's part in a fetch.
#[derive(Debug, Clone, Serialize)]
pub struct SourceStatus {
    /// The member's name.
    pub name: String,
    /// Verified bytes it sent.
    pub bytes: u64,
    /// Verified chunks it sent.
    pub chunks: u64,
    /// Its measured rate, MB (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// `active`, `idle`, `retrying: …` or `dropped: …`.
    pub state: String,
}

/// A fetch shared between its task and whoever watches it.
#[derive(Debug)]
pub struct Fetch {
    status: Mutex<FetchStatus>,
    sources: Mutex<BTreeMap<String, SourceStatus>>,
    /// Woken when the fetch ends.
    pub ended: Notify,
    started: Instant,
    transfer_started: Mutex<Option<Instant>>,
}

impl Fetch {
    /// A fetch of `name` (= `root`), not yet begun.
    pub fn new(name: &str, root: Root) -> Self {
        Fetch {
            status: Mutex::new(FetchStatus {
                name: name.to_owned(),
                root,
                state: "fetching",
                error: None,
                chunks: 0,
                chunks_done: 0,
                size_bytes: 0,
                bytes: 0,
                resumed_chunks: 0,
                elapsed_ms: 0,
                mb_per_s: 0.0,
                sources: Vec::new(),
                path: None,
            }),
            sources: Mutex::new(BTreeMap::new()),
            ended: Notify::new(),
            started: Instant::now(),
            transfer_started: Mutex::new(None),
        }
    }

    /// Where it stands now.
    pub fn status(&self) -> FetchStatus {
        let mut s = self.status.lock().expect("fetch lock").clone();
        s.sources = self
            .sources
            .lock()
            .expect("fetch lock")
            .values()
            .cloned()
            .collect();
        if s.state == "fetching" {
            s.elapsed_ms = self.started.elapsed().as_millis() as u64;
            let transfer = self.transfer_started.lock().expect("fetch lock");
            if let Some(t) = *transfer {
                s.mb_per_s = mb_per_s(s.bytes, t.elapsed());
            }
        }
        s
    }

    /// Whether it has ended (done or failed).
    pub fn has_ended(&self) -> bool {
        self.status.lock().expect("fetch lock").state != "fetching"
    }

    fn source(&self, name: &str, f: impl FnOnce(&mut SourceStatus)) {
        let mut sources = self.sources.lock().expect("fetch lock");
        let s = sources
            .entry(name.to_owned())
            .or_insert_with(|| SourceStatus {
                name: name.to_owned(),
                bytes: 0,
                chunks: 0,
                mb_per_s: 0.0,
                state: "active".into(),
            });
        f(s);
    }

    /// Ends the fetch: done with the files at `path`, or failed.
    pub fn end(&self, result: &Result<PathBuf, String>) {
        {
            let mut s = self.status.lock().expect("fetch lock");
            s.elapsed_ms = self.started.elapsed().as_millis() as u64;
            if let Some(t) = *self.transfer_started.lock().expect("fetch lock") {
                s.mb_per_s = mb_per_s(s.bytes, t.elapsed());
            }
            match result {
                Ok(path) => {
                    s.state = "done";
                    s.path = Some(path.display().to_string());
                }
                Err(e) => {
                    s.state = "failed";
                    s.error = Some(e.clone());
                }
            }
        }
        self.ended.notify_waiters();
    }
}

fn mb_per_s(bytes: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        0.0
    } else {
        (bytes as f64 / 1e6 / secs * 10.0).round() / 10.0
    }
}

/// Finds the live members holding a dataset (the service's view of gossip).
pub type Discover =
    Arc<dyn Fn(Root) -> Pin<Box<dyn Future<Output = Vec<Source>> + Send>> + Send + Sync>;

/// What a fetch needs.
#[derive(Clone)]
pub struct FetchContext {
    /// Where the copy goes.
    pub store: Store,
    /// Where the copy is served from while it fills.
    pub holdings: Arc<Holdings>,
    /// The transport key.
    pub key: AuthKey,
    /// The dataset.
    pub root: Root,
    /// Who holds it.
    pub discover: Discover,
    /// Where `get --to` writes the files as well, if anywhere: the directory opened and
    /// checked for the request ([`super::roots`]), with its file access.
    pub to: Option<Arc<ConfinedDir>>,
}

/// How a holder's task ended.
enum HolderEnd {
    /// Nothing left to fetch.
    Done,
    /// The connection failed: try again later.
    Failed(String),
    /// It sent bad data: never again in this fetch.
    Bad(String),
    /// Writing to this node's disk failed: the whole fetch stops.
    Write(String),
}

/// The state holder tasks share.
struct Shared {
    ctx: FetchContext,
    manifest: Arc<Manifest>,
    holding: Arc<Holding>,
    sched: Mutex<Scheduler>,
    /// What the chunks are written to; taken out (the write lock, which waits for every
    /// chunk being written) when every chunk is in.
    sink: RwLock<Option<Sink>>,
    fetch: Arc<Fetch>,
    /// Woken when a chunk completes or a holder leaves (an idle holder may find work).
    progress: Notify,
    last_progress: Mutex<Instant>,
}

/// Where verified chunks go: the store's `.part`, and the `--to` files if asked for.
///
/// A chunk's bytes are written to the `.part` under a shared borrow of it, by every holder's
/// writes at once, and to the `--to` file after that; only recording it in the `have` list
/// takes the `.part` alone (appended in order), after its bytes are written. One lock held
/// for the whole write made the holders' writes wait for each other.
struct Sink {
    partial: RwLock<Partial>,
    export: Option<Export>,
}

/// Runs a fetch until every chunk is in (and, with [`FetchContext::to`], the files are in
/// place there); returns the whole copy's files directory. The caller ends the [`Fetch`].
pub async fn run(ctx: FetchContext, fetch: Arc<Fetch>) -> Result<PathBuf, String> {
    let root = ctx.root;
    let manifest = match ctx.holdings.get(&root) {
        Some(h) if h.complete.load(Ordering::Acquire) => {
            let path = ctx
                .store
                .files_dir(&root)
                .ok_or("the whole copy vanished from the store")?;
            fill_totals(&fetch, &h.manifest, h.index.len(), 0);
            if let Some(to) = ctx.to.clone() {
                let (files, m) = (path.clone(), h.manifest.clone());
                tokio::task::spawn_blocking(move || {
                    export::export_whole_in(&files, &m, to.try_clone()?)
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| to_error(&e))?;
            }
            return Ok(path);
        }
        Some(h) => (*h.manifest).clone(),
        None => fetch_manifest(&ctx).await?,
    };
    let (store, m, to) = (ctx.store.clone(), manifest.clone(), ctx.to.clone());
    let sink = tokio::task::spawn_blocking(move || begin(&store, &m, to.as_deref()))
        .await
        .map_err(|e| e.to_string())??;
    let have = sink.partial.read().expect("partial lock").have().clone();
    let resumed = have.count();
    fill_totals(&fetch, &manifest, have.len(), resumed);
    let holding = match ctx.holdings.get(&root) {
        Some(h) => h,
        None => {
            let h = Arc::new(Holding::new(manifest.clone(), have.clone()));
            ctx.holdings.insert(root, h.clone());
            h
        }
    };
    *fetch.transfer_started.lock().expect("fetch lock") = Some(Instant::now());
    let shared = Arc::new(Shared {
        manifest: holding.manifest.clone(),
        holding: holding.clone(),
        sched: Mutex::new(Scheduler::new(have)),
        sink: RwLock::new(Some(sink)),
        fetch: fetch.clone(),
        progress: Notify::new(),
        last_progress: Mutex::new(Instant::now()),
        ctx,
    });
    let driven = drive(&shared).await;
    // A chunk write still running on the blocking pool (a holder task aborted mid-chunk)
    // holds the lock until it is done; later ones find the sink gone and drop their chunk.
    let sink = shared.sink.write().expect("sink lock").take();
    if let Err(e) = driven {
        // Dropped here, not whenever the last holder task lets go: the `--to` temporaries
        // go now (the store's `.part` keeps the verified chunks).
        drop(sink);
        return Err(e);
    }
    let Sink { partial, export } = sink.ok_or("the copy was finished twice")?;
    let partial = partial.into_inner().expect("partial lock");
    let ctx = shared.ctx.clone();
    let store = ctx.store.clone();
    let path = tokio::task::spawn_blocking(move || store.finish(partial))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("finishing the copy: {e}"))?;
    holding.complete.store(true, Ordering::Release);
    ctx.holdings.changed();
    if let Some(export) = export {
        tokio::task::spawn_blocking(move || export.finish())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| to_error(&e))?;
    }
    Ok(path)
}

/// Prepares a fetch's sink: the `--to` files' places checked first (so a clash is reported
/// before anything is fetched), then the store's `.part` begun or resumed, and the chunks it
/// resumes with (verified again by [`Store::begin`]) copied to the `--to` files.
fn begin(store: &Store, manifest: &Manifest, to: Option<&ConfinedDir>) -> Result<Sink, String> {
    let export = to
        .map(|to| Export::begin_in(manifest, to.try_clone()?))
        .transpose()
        .map_err(|e| to_error(&e))?;
    let partial = store
        .begin(manifest)
        .map_err(|e| format!("preparing the copy: {e}"))?;
    if let Some(export) = &export {
        let index = ChunkIndex::new(manifest);
        let mut buf = vec![0u8; manifest.chunk_bytes() as usize];
        let have = partial.have();
        for g in (0..index.len()).filter(|&g| have.contains(g)) {
            let place = index.place(manifest, g).expect("chunks of the index");
            if !export.writes(place.file) {
                continue;
            }
            let piece = &mut buf[..place.len as usize];
            partial
                .read_chunk(manifest, place, piece)
                .map_err(|e| disk_error(e, "reading the copy"))?;
            export
                .write_chunk(place, piece)
                .map_err(|e| disk_error(e, "writing --to"))?;
        }
    }
    Ok(Sink {
        partial: RwLock::new(partial),
        export,
    })
}

fn fill_totals(fetch: &Fetch, manifest: &Manifest, chunks: u64, resumed: u64) {
    let mut s = fetch.status.lock().expect("fetch lock");
    s.chunks = chunks;
    s.chunks_done = resumed;
    s.resumed_chunks = resumed;
    s.size_bytes = manifest.total_bytes();
}

/// Asks the holders for the manifest, one after another, until one sends the right one.
async fn fetch_manifest(ctx: &FetchContext) -> Result<Manifest, String> {
    let deadline = Instant::now() + NO_HOLDER_TIMEOUT;
    let mut errors = Vec::new();
    loop {
        for source in (ctx.discover)(ctx.root).await {
            match manifest_from(ctx, &source).await {
                Ok(m) => return Ok(m),
                Err(e) => {
                    warn!(holder = %source.name, "manifest of {}: {e}", ctx.root);
                    errors.push(format!("{}: {e}", source.name));
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(if errors.is_empty() {
                format!(
                    "no live member holds the dataset (waited {} s)",
                    NO_HOLDER_TIMEOUT.as_secs()
                )
            } else {
                format!("no holder sent its manifest: {}", errors.join("; "))
            });
        }
        tokio::time::sleep(DISCOVER_EVERY).await;
    }
}

async fn connect(ctx: &FetchContext, source: &Source) -> Result<TcpStream, TransportError> {
    let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(source.addr))
        .await
        .map_err(|_| TransportError::Timeout("connecting"))??;
    let _ = stream.set_nodelay(true);
    transport::client_handshake(&mut stream, &ctx.key).await?;
    Ok(stream)
}

async fn manifest_from(ctx: &FetchContext, source: &Source) -> Result<Manifest, String> {
    let mut stream = connect(ctx, source).await.map_err(|e| e.to_string())?;
    transport::write_header(&mut stream, &Request::Manifest { root: ctx.root })
        .await
        .map_err(|e| e.to_string())?;
    let reply: Reply = tokio::time::timeout(REPLY_TIMEOUT, transport::read_header(&mut stream))
        .await
        .map_err(|_| "no answer".to_string())?
        .map_err(|e| e.to_string())?
        .ok_or("closed")?;
    match reply {
        Reply::Manifest { len } => {
            let bytes = transport::read_body(&mut stream, len, MANIFEST_BYTES_MAX as u64)
                .await
                .map_err(|e| e.to_string())?;
            let manifest = Manifest::decode(&bytes).map_err(|e| e.to_string())?;
            if manifest.root() != ctx.root {
                return Err("sent a manifest of other content".into());
            }
            Ok(manifest)
        }
        Reply::NotHere { reason } => Err(format!("does not hold it: {reason}")),
        other => Err(format!("answered {other:?}")),
    }
}

/// Starts holder tasks as holders appear and ends when every chunk is in, or fails.
async fn drive(shared: &Arc<Shared>) -> Result<(), String> {
    let mut tasks: JoinSet<(String, HolderId, HolderEnd)> = JoinSet::new();
    let mut active: HashMap<String, HolderId> = HashMap::new();
    let mut banned: HashMap<String, String> = HashMap::new();
    let mut retry_at: HashMap<String, Instant> = HashMap::new();
    let mut next_id: HolderId = 0;
    let result = loop {
        if shared.sched.lock().expect("sched lock").all_done() {
            break Ok(());
        }
        for source in (shared.ctx.discover)(shared.ctx.root).await {
            let waiting = retry_at
                .get(&source.name)
                .is_some_and(|t| *t > Instant::now());
            if active.contains_key(&source.name) || banned.contains_key(&source.name) || waiting {
                continue;
            }
            let id = next_id;
            next_id += 1;
            active.insert(source.name.clone(), id);
            shared
                .fetch
                .source(&source.name, |s| s.state = "active".into());
            let sh = shared.clone();
            tasks.spawn(async move {
                let end = holder(&sh, &source, id).await;
                (source.name, id, end)
            });
        }
        let idle_for = shared
            .last_progress
            .lock()
            .expect("progress lock")
            .elapsed();
        if active.is_empty() && idle_for > NO_HOLDER_TIMEOUT {
            let why = if banned.is_empty() {
                "no live member holds the missing chunks".to_string()
            } else {
                let list: Vec<String> = banned.iter().map(|(n, r)| format!("{n}: {r}")).collect();
                format!("no usable holder left ({})", list.join("; "))
            };
            break Err(format!(
                "{why}; the verified chunks are kept, get it again to resume"
            ));
        }
        let ended = tokio::select! {
            ended = tasks.join_next(), if !tasks.is_empty() => ended,
            _ = tokio::time::sleep(DISCOVER_EVERY) => None,
            _ = shared.progress.notified() => None,
        };
        let Some(ended) = ended else { continue };
        let (name, id, end) = match ended {
            Ok(e) => e,
            Err(e) => break Err(format!("a holder task failed: {e}")),
        };
        active.remove(&name);
        shared.sched.lock().expect("sched lock").remove_holder(id);
        shared.progress.notify_waiters();
        match end {
            HolderEnd::Done => shared.fetch.source(&name, |s| s.state = "done".into()),
            HolderEnd::Failed(why) => {
                info!(holder = %name, "dataset {}: {why}; trying it again", shared.ctx.root);
                retry_at.insert(name.clone(), Instant::now() + RETRY_AFTER);
                shared
                    .fetch
                    .source(&name, |s| s.state = format!("retrying: {why}"));
            }
            HolderEnd::Bad(why) => {
                warn!(holder = %name, "dataset {}: {why}; holder dropped for this fetch", shared.ctx.root);
                shared
                    .fetch
                    .source(&name, |s| s.state = format!("dropped: {why}"));
                banned.insert(name, why);
            }
            HolderEnd::Write(why) => break Err(why),
        }
    };
    tasks.shutdown().await;
    result
}

/// Fetches from one holder until nothing is left or it fails.
async fn holder(shared: &Arc<Shared>, source: &Source, id: HolderId) -> HolderEnd {
    let stream = match connect(&shared.ctx, source).await {
        Ok(s) => s,
        Err(e @ TransportError::NotAMember) => return HolderEnd::Bad(e.to_string()),
        Err(e) => return HolderEnd::Failed(e.to_string()),
    };
    let (r, w) = stream.into_split();
    let mut r = BufReader::with_capacity(READ_BUFFER_BYTES, r);
    let mut w = BufWriter::new(w);
    let root = shared.ctx.root;
    let total = shared.holding.index.len();
    let chunk_bytes = f64::from(shared.manifest.chunk_bytes());
    let mut have_known = false;
    let mut in_flight = std::collections::VecDeque::new();
    let mut rate = 0.0f64; // bytes per second, smoothed
    let mut last_arrival = Instant::now();
    let mut writes: JoinSet<Stored> = JoinSet::new();
    // Chunk buffers back from their writes, for the next chunks to arrive.
    let mut spare: Vec<Vec<u8>> = Vec::new();
    loop {
        if !have_known {
            let have = if source.complete {
                ChunkSet::full(total)
            } else {
                match ask_have(&mut r, &mut w, root, total).await {
                    Ok(h) => h,
                    Err(e) => return e,
                }
            };
            shared
                .sched
                .lock()
                .expect("sched lock")
                .set_holder(id, have);
            have_known = true;
        }
        let window = if rate > 0.0 {
            ((rate * WINDOW_SECONDS / chunk_bytes).ceil() as usize + 1)
                .clamp(WINDOW_MIN, WINDOW_MAX)
        } else {
            WINDOW_MIN
        };
        while in_flight.len() < window {
            let Some(g) = shared.sched.lock().expect("sched lock").assign(id) else {
                break;
            };
            if let Err(e) =
                transport::write_header(&mut w, &Request::Chunk { root, index: g }).await
            {
                return HolderEnd::Failed(e.to_string());
            }
            in_flight.push_back(g);
        }
        if in_flight.is_empty() {
            while let Some(done) = writes.join_next().await {
                if let Some(end) = settle(shared, id, done, &mut spare) {
                    return end;
                }
            }
            if shared.sched.lock().expect("sched lock").all_done() {
                return HolderEnd::Done;
            }
            shared
                .fetch
                .source(&source.name, |s| s.state = "idle".into());
            // Nothing for this holder now: wait for a change, and re-read a partial
            // holder's bitmap (it may have fetched more meanwhile).
            tokio::select! {
                _ = shared.progress.notified() => {}
                _ = tokio::time::sleep(DISCOVER_EVERY) => {}
            }
            have_known = source.complete;
            continue;
        }
        if let Err(e) = w.flush().await {
            return HolderEnd::Failed(e.to_string());
        }
        let g = *in_flight.front().expect("in flight");
        let reply = match tokio::time::timeout(REPLY_TIMEOUT, transport::read_header(&mut r)).await
        {
            Err(_) => return HolderEnd::Failed("no answer in time".into()),
            Ok(Err(TransportError::Protocol(e))) => return HolderEnd::Bad(e),
            Ok(Err(e)) => return HolderEnd::Failed(e.to_string()),
            Ok(Ok(None)) => return HolderEnd::Failed("closed the connection".into()),
            Ok(Ok(Some(reply))) => reply,
        };
        in_flight.pop_front();
        let len = match reply {
            Reply::Chunk { index, len } if index == g => len,
            Reply::NotHere { reason } => {
                shared.sched.lock().expect("sched lock").not_here(id, g);
                if source.complete {
                    return HolderEnd::Failed(format!("chunk {g}: {reason}"));
                }
                continue;
            }
            other => {
                return HolderEnd::Bad(format!("answered {other:?} to a request for chunk {g}"))
            }
        };
        let place = shared
            .holding
            .index
            .place(&shared.manifest, g)
            .expect("assigned chunks exist");
        let mut bytes = spare.pop().unwrap_or_default();
        match transport::read_body_into(&mut r, u64::from(len), u64::from(place.len), &mut bytes)
            .await
        {
            Ok(()) => {}
            Err(TransportError::Protocol(e)) => return HolderEnd::Bad(e),
            Err(e) => return HolderEnd::Failed(e.to_string()),
        }
        let now = Instant::now();
        let secs = now.duration_since(last_arrival).as_secs_f64().max(1e-4);
        last_arrival = now;
        let sample = bytes.len() as f64 / secs;
        rate = if rate == 0.0 {
            sample
        } else {
            0.7 * rate + 0.3 * sample
        };
        // Verify and write on the blocking pool while this task reads the next chunk: a
        // reader that stops for that would let the sender's window close, and a link
        // shaped with a small burst never gets that time back.
        let sh = shared.clone();
        let name = source.name.clone();
        writes.spawn_blocking(move || {
            let result = store_chunk(&sh, place, g, &bytes);
            if let Ok(true) = result {
                // Counted here, not when the task looks at the result: the fetch may end
                // (and this task be dropped) the moment the last chunk is in.
                record(&sh, &name, len, rate);
            }
            Stored {
                g,
                result,
                buffer: bytes,
            }
        });
        while let Some(done) = writes.try_join_next() {
            if let Some(end) = settle(shared, id, done, &mut spare) {
                return end;
            }
        }
        if writes.len() >= WRITES_IN_FLIGHT_MAX {
            if let Some(done) = writes.join_next().await {
                if let Some(end) = settle(shared, id, done, &mut spare) {
                    return end;
                }
            }
        }
    }
}

/// The buffer of a holder's connection, in bytes: for the answers' headers. Smaller than a
/// chunk (1 to 4 MiB), so a chunk's body is read mostly straight into its own buffer
/// ([`transport::read_body_into`]) rather than through this one, a second copy of every byte.
const READ_BUFFER_BYTES: usize = 64 << 10;

/// A chunk's write, done: its index, whether it was new (or why the holder stops), and its
/// buffer, for the next chunk.
struct Stored {
    g: u64,
    result: Result<bool, HolderEnd>,
    buffer: Vec<u8>,
}

/// Chunks one holder's task may have being verified and written at once.
/// Eight, not four: with `--to` each chunk is written twice, and a disk busy with other
/// work can take a few chunks' time on one; a reader that stopped for that would let the
/// holder's window close (1 to 4 MiB a chunk: at most 32 MiB per holder in memory).
const WRITES_IN_FLIGHT_MAX: usize = 8;

/// Verifies chunk `g` and writes it to the copy; `Ok(false)` if it was in already (the
/// other copy of an endgame chunk) or the fetch is over.
fn store_chunk(
    sh: &Shared,
    place: super::store::ChunkPlace,
    g: u64,
    bytes: &[u8],
) -> Result<bool, HolderEnd> {
    sh.manifest
        .verify_chunk(place.file, place.chunk, bytes)
        .map_err(|e| HolderEnd::Bad(e.to_string()))?;
    if sh.sched.lock().expect("sched lock").is_done(g) {
        return Ok(false);
    }
    let sink = sh.sink.read().expect("sink lock");
    let Some(sink) = sink.as_ref() else {
        return Ok(false);
    };
    sink.partial
        .read()
        .expect("partial lock")
        .write_data(&sh.manifest, g, bytes)
        .map_err(|e| HolderEnd::Write(disk_error(e, "writing the copy")))?;
    if let Some(export) = &sink.export {
        // Verified above: nothing else ever reaches the user's files.
        export
            .write_chunk(place, bytes)
            .map_err(|e| HolderEnd::Write(disk_error(e, "writing --to")))?;
    }
    sink.partial
        .write()
        .expect("partial lock")
        .record(g)
        .map_err(|e| HolderEnd::Write(disk_error(e, "writing the copy")))?;
    let new = sh.sched.lock().expect("sched lock").complete(g);
    if new {
        // Served to others from now on.
        sh.holding.have.write().expect("have lock").insert(g);
    }
    Ok(new)
}

/// Records a stored chunk: progress, the holder's figures; wakes idle holders.
fn record(shared: &Shared, name: &str, len: u32, rate: f64) {
    *shared.last_progress.lock().expect("progress lock") = Instant::now();
    {
        let mut s = shared.fetch.status.lock().expect("fetch lock");
        s.chunks_done += 1;
        s.bytes += u64::from(len);
    }
    shared.fetch.source(name, |s| {
        s.bytes += u64::from(len);
        s.chunks += 1;
        s.mb_per_s = (rate / 1e5).round() / 10.0;
        s.state = "active".into();
    });
    shared.progress.notify_waiters();
}

/// Looks at a stored chunk's result, keeping its buffer in `spare` (at most
/// [`WRITES_IN_FLIGHT_MAX`] of them); returns how the holder's task ends if the chunk was
/// bad or could not be written.
fn settle(
    shared: &Shared,
    id: HolderId,
    done: Result<Stored, tokio::task::JoinError>,
    spare: &mut Vec<Vec<u8>>,
) -> Option<HolderEnd> {
    let stored = match done {
        Ok(stored) => stored,
        Err(e) => return Some(HolderEnd::Write(e.to_string())),
    };
    if spare.len() < WRITES_IN_FLIGHT_MAX {
        spare.push(stored.buffer);
    }
    match stored.result {
        Ok(_) => None,
        Err(end) => {
            shared
                .sched
                .lock()
                .expect("sched lock")
                .release(id, stored.g);
            Some(end)
        }
    }
}

async fn ask_have(
    r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    w: &mut BufWriter<tokio::net::tcp::OwnedWriteHalf>,
    root: Root,
    total: u64,
) -> Result<ChunkSet, HolderEnd> {
    let failed = |e: TransportError| HolderEnd::Failed(e.to_string());
    transport::write_header(w, &Request::Have { root })
        .await
        .map_err(failed)?;
    w.flush()
        .await
        .map_err(|e| HolderEnd::Failed(e.to_string()))?;
    let reply = tokio::time::timeout(REPLY_TIMEOUT, transport::read_header(r))
        .await
        .map_err(|_| HolderEnd::Failed("no answer in time".into()))?
        .map_err(failed)?
        .ok_or_else(|| HolderEnd::Failed("closed the connection".into()))?;
    match reply {
        Reply::Have { len } => {
            let bits = transport::read_body(r, len, total.div_ceil(8))
                .await
                .map_err(|e| HolderEnd::Bad(e.to_string()))?;
            ChunkSet::from_bitmap(total, bits)
                .ok_or_else(|| HolderEnd::Bad("sent a malformed chunk bitmap".into()))
        }
        Reply::NotHere { reason } => Err(HolderEnd::Failed(format!("does not hold it: {reason}"))),
        other => Err(HolderEnd::Bad(format!(
            "answered {other:?} to a bitmap request"
        ))),
    }
}

/// Says a write error in the operator's words, `what` failing: a full disk by name.
fn disk_error(e: super::DatasetError, what: &str) -> String {
    if e.is_disk_full() {
        format!(
            "disk full: {what}: {e}; the verified chunks are kept, free space and get it again to resume"
        )
    } else {
        format!("{what}: {e}; the verified chunks are kept, get it again to resume")
    }
}

/// Says why the `--to` files could not be written (a clash, a link in the way, a full disk).
fn to_error(e: &super::DatasetError) -> String {
    if e.is_disk_full() {
        format!("disk full: writing --to: {e}")
    } else {
        format!("writing --to: {e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ENOSPC (errno 28) is said as a full disk, and nothing else is.
    #[test]
    fn a_full_disk_is_named() {
        let io = |errno| super::super::DatasetError::Io {
            path: "x".into(),
            source: std::io::Error::from_raw_os_error(errno),
        };
        assert!(disk_error(io(28), "writing the copy").starts_with("disk full: writing the copy"));
        assert!(to_error(&io(28)).starts_with("disk full: writing --to"));
        assert!(!disk_error(io(13), "writing the copy").contains("disk full"));
        assert!(!to_error(&io(5)).contains("disk full"));
    }

    #[test]
    fn rarest_chunks_go_first_and_each_chunk_to_one_holder() {
        let mut s = Scheduler::new(ChunkSet::empty(4));
        let mut partial = ChunkSet::empty(4);
        partial.insert(1);
        partial.insert(2);
        s.set_holder(0, ChunkSet::full(4));
        s.set_holder(1, partial);
        // chunks 0 and 3 have one holder: holder 0 takes them first.
        assert_eq!(s.assign(0), Some(0));
        assert_eq!(s.assign(0), Some(3));
        assert_eq!(s.assign(1), Some(1));
        assert_eq!(s.assign(0), Some(2));
        // endgame: holder 1 doubles up on a chunk it has that is in flight once.
        assert_eq!(s.assign(1), Some(2));
        assert_eq!(s.assign(1), None);
        assert!(s.complete(2));
        assert!(!s.complete(2), "the second copy is a duplicate");
        for g in [0, 1, 3] {
            assert!(s.complete(g));
        }
        assert!(s.all_done());
    }

    #[test]
    fn a_lost_holder_gives_its_chunks_back() {
        let mut s = Scheduler::new(ChunkSet::empty(3));
        s.set_holder(0, ChunkSet::full(3));
        s.set_holder(1, ChunkSet::full(3));
        assert_eq!(s.assign(0), Some(0));
        assert_eq!(s.assign(0), Some(1));
        s.remove_holder(0);
        assert_eq!(s.assign(1), Some(0));
        assert_eq!(s.assign(1), Some(1));
        assert_eq!(s.assign(1), Some(2));
    }

    #[test]
    fn a_chunk_a_holder_lacks_goes_elsewhere() {
        let mut s = Scheduler::new(ChunkSet::empty(2));
        s.set_holder(0, ChunkSet::full(2));
        assert_eq!(s.assign(0), Some(0));
        s.not_here(0, 0);
        assert_eq!(s.assign(0), Some(1), "it no longer counts as having 0");
        s.set_holder(1, ChunkSet::full(2));
        assert_eq!(s.assign(1), Some(0));
    }

    #[test]
    fn resumed_chunks_are_not_asked_for() {
        let mut done = ChunkSet::empty(3);
        done.insert(0);
        done.insert(2);
        let mut s = Scheduler::new(done);
        s.set_holder(0, ChunkSet::full(3));
        assert_eq!(s.assign(0), Some(1));
        assert_eq!(s.assign(0), None);
    }
}
