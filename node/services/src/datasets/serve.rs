//! Serving: what this node holds ([`Holdings`]), the listener that gives it to peers, and
//! the [`Throttle`] that makes dataset traffic yield to a job's ring on this host.
//!
//! A node serves every chunk it has verified: whole copies, and the verified chunks of a
//! fetch still under way (so a dataset spreads from the first holders to the last fetchers
//! at once, not in waves). Chunks are read from disk as they are asked for and are not
//! re-hashed here: the receiver checks each against the manifest.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use super::store::{ChunkIndex, ChunkSet, Held, Store};
use super::transport::{self, AuthKey, Reply, Request, REASON_BYTES_MAX};
use super::{Manifest, Root};

/// Most peers served at once; more are refused until one ends.
pub const CONNECTIONS_MAX: usize = 64;
/// A connection with no request for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes written between two looks at the throttle.
const SLICE_BYTES: usize = 256 << 10;
/// How far behind the clock a throttle's schedule may fall and still be caught up (see
/// `Throttle::slot`): above the node's timer slack (`tasks::NODE_TIMER_SLACK_NS`, 20 ms).
const PACE_CREDIT: Duration = Duration::from_millis(50);

/// One dataset this node holds, whole or in part.
#[derive(Debug)]
pub struct Holding {
    /// Its manifest.
    pub manifest: Arc<Manifest>,
    /// The manifest's canonical encoding (what peers ask for).
    pub encoded: Arc<Vec<u8>>,
    /// Its chunk index.
    pub index: ChunkIndex,
    /// The verified chunks (all of them once whole).
    pub have: RwLock<ChunkSet>,
    /// Whether the copy is whole (its files are where readers look).
    pub complete: AtomicBool,
}

impl Holding {
    /// A holding of `manifest`'s dataset with the chunks in `have`.
    pub fn new(manifest: Manifest, have: ChunkSet) -> Self {
        let index = ChunkIndex::new(&manifest);
        let complete = have.is_full();
        Holding {
            encoded: Arc::new(manifest.encode()),
            manifest: Arc::new(manifest),
            index,
            have: RwLock::new(have),
            complete: AtomicBool::new(complete),
        }
    }

    /// The store entry it lives in.
    pub fn held(&self, root: Root) -> Held {
        Held {
            root,
            complete: self.complete.load(Ordering::Acquire),
        }
    }
}

/// What this node holds, by root; shared by the server, fetches and the service.
#[derive(Debug, Default)]
pub struct Holdings {
    map: Mutex<HashMap<Root, Arc<Holding>>>,
    /// Bumped on every change (the service re-advertises when it moves).
    pub version: AtomicU64,
    /// Woken on every change (a change while nobody waits is kept for the next wait).
    pub changes: tokio::sync::Notify,
}

impl Holdings {
    /// The holding of `root`.
    pub fn get(&self, root: &Root) -> Option<Arc<Holding>> {
        self.map.lock().expect("holdings lock").get(root).cloned()
    }

    /// Records (or replaces) the holding of `root`.
    pub fn insert(&self, root: Root, holding: Arc<Holding>) {
        self.map
            .lock()
            .expect("holdings lock")
            .insert(root, holding);
        self.changed();
    }

    /// Forgets `root`.
    pub fn remove(&self, root: &Root) -> Option<Arc<Holding>> {
        let h = self.map.lock().expect("holdings lock").remove(root);
        self.changed();
        h
    }

    /// Every holding.
    pub fn all(&self) -> Vec<(Root, Arc<Holding>)> {
        let map = self.map.lock().expect("holdings lock");
        map.iter().map(|(r, h)| (*r, h.clone())).collect()
    }

    /// Notes a change (a holding became whole).
    pub fn changed(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
        self.changes.notify_one();
    }
}

/// A shared rate cap on what this node serves: the operator's upload cap, if any, and a
/// lower one while a job's ring runs on this host (`busy`), so dataset uploads do not steal
/// the collective's bandwidth.
#[derive(Debug)]
pub struct Throttle {
    /// The cap in bytes per second at all times (0: none).
    upload_bytes_per_s: u64,
    /// The cap in bytes per second while busy (0: none).
    busy_bytes_per_s: u64,
    busy: AtomicBool,
    next: Mutex<Instant>,
    /// Bytes served in all (for /metrics).
    pub served_bytes: AtomicU64,
}

impl Throttle {
    /// A throttle capping at `upload_bytes_per_s` always and at `busy_bytes_per_s` while
    /// busy (0: no such cap).
    pub fn new(upload_bytes_per_s: u64, busy_bytes_per_s: u64) -> Self {
        Throttle {
            upload_bytes_per_s,
            busy_bytes_per_s,
            busy: AtomicBool::new(false),
            next: Mutex::new(Instant::now()),
            served_bytes: AtomicU64::new(0),
        }
    }

    /// Says whether a ring is active on this host.
    pub fn set_busy(&self, busy: bool) {
        self.busy.store(busy, Ordering::Release);
    }

    /// Whether a ring is active on this host.
    pub fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// The cap that applies now, bytes per second (0: none).
    pub fn cap(&self) -> u64 {
        let busy = if self.is_busy() {
            self.busy_bytes_per_s
        } else {
            0
        };
        match (self.upload_bytes_per_s, busy) {
            (0, b) => b,
            (u, 0) => u,
            (u, b) => u.min(b),
        }
    }

    /// Waits until `bytes` more may be sent under the cap; returns at once, without touching
    /// a timer, when their slot is due (always without a cap). A timer is never "due now" in
    /// tokio: it rounds every deadline up to the next millisecond and parks the thread until
    /// then, and the node's threads may wake up to their timer slack late
    /// (`tasks::NODE_TIMER_SLACK_NS`, 20 ms). An uncapped server that slept once a slice
    /// sent 256 KiB per wake-up: 0.64–0.77 of the link with the slack instead of 0.93–0.99.
    async fn pace(&self, bytes: usize) {
        let now = Instant::now();
        let start = self.slot(bytes, now);
        if start > now {
            tokio::time::sleep_until(start.into()).await;
        }
    }

    /// When `bytes` asked for at `now` may go, booking their time under the cap. The
    /// schedule may fall up to [`PACE_CREDIT`] behind `now` and catch up (a token bucket of
    /// that depth): a wake-up that came late (the node's timers have slack, and a busy host
    /// is late too) is made up by the slices after it instead of lowering the rate.
    fn slot(&self, bytes: usize, now: Instant) -> Instant {
        let cap = self.cap();
        if cap == 0 {
            return now;
        }
        let cost = Duration::from_secs_f64(bytes as f64 / cap as f64);
        let mut next = self.next.lock().expect("throttle lock");
        let start = (*next).max(now.checked_sub(PACE_CREDIT).unwrap_or(now));
        *next = start + cost;
        start
    }

    /// Writes `bytes` to `w` in slices, each paced.
    async fn write<W: AsyncWrite + Unpin>(&self, w: &mut W, bytes: &[u8]) -> std::io::Result<()> {
        for slice in bytes.chunks(SLICE_BYTES) {
            self.pace(slice.len()).await;
            w.write_all(slice).await?;
            self.served_bytes
                .fetch_add(slice.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// What the server needs.
#[derive(Clone)]
pub struct Server {
    /// The store chunks are read from.
    pub store: Store,
    /// What this node holds.
    pub holdings: Arc<Holdings>,
    /// The transport key.
    pub key: AuthKey,
    /// The cap while busy.
    pub throttle: Arc<Throttle>,
}

/// Accepts peers on `listener` and serves each on a task of its own, at most
/// [`CONNECTIONS_MAX`] at once, until the listener fails.
pub async fn run(tasks: crate::tasks::Tasks, server: Server, listener: TcpListener) {
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                warn!("dataset listener: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            debug!(%peer, "dataset server busy: connection refused");
            continue;
        };
        let server = server.clone();
        tasks.spawn(async move {
            if let Err(e) = serve(&server, stream).await {
                debug!(%peer, "dataset connection ended: {e}");
            }
            drop(permit);
        });
    }
}

async fn serve(server: &Server, mut stream: TcpStream) -> Result<(), transport::TransportError> {
    let _ = stream.set_nodelay(true);
    transport::server_handshake(&mut stream, &server.key).await?;
    let (r, w) = stream.split();
    let mut r = BufReader::new(r);
    let mut w = BufWriter::with_capacity(SLICE_BYTES, w);
    // The next answer is read from disk while the current one is sent, so the link never
    // waits for the disk between two chunks.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Answer>(READ_AHEAD);
    let reader = async move {
        loop {
            let request =
                match tokio::time::timeout(IDLE_TIMEOUT, transport::read_header(&mut r)).await {
                    Ok(Ok(Some(request))) => request,
                    Ok(Ok(None)) | Err(_) => return Ok(()),
                    Ok(Err(e)) => return Err(e),
                };
            let answer = prepare(server, request).await?;
            if tx.send(answer).await.is_err() {
                return Ok(()); // the writer stopped
            }
        }
    };
    let writer = async {
        while let Some(answer) = rx.recv().await {
            transport::write_header(&mut w, &answer.reply).await?;
            match &answer.body {
                Body::None => {}
                Body::Shared(bytes) => w.write_all(bytes).await?,
                Body::Owned(bytes) => w.write_all(bytes).await?,
                Body::Paced(bytes) => server.throttle.write(&mut w, bytes).await?,
            }
            w.flush().await?;
        }
        Ok::<(), transport::TransportError>(())
    };
    let (read, written) = tokio::join!(reader, writer);
    written.and(read)
}

/// Answers prepared ahead of the one being sent, per connection.
const READ_AHEAD: usize = 1;

/// An answer ready to send.
struct Answer {
    reply: Reply,
    body: Body,
}

/// What follows an answer's header.
enum Body {
    None,
    /// The manifest's encoding.
    Shared(Arc<Vec<u8>>),
    /// A bitmap.
    Owned(Vec<u8>),
    /// A chunk: sent under the throttle.
    Paced(Vec<u8>),
}

async fn prepare(server: &Server, request: Request) -> Result<Answer, transport::TransportError> {
    let not_here = |reason: String| {
        let mut reason = reason;
        reason.truncate(REASON_BYTES_MAX);
        Answer {
            reply: Reply::NotHere { reason },
            body: Body::None,
        }
    };
    let root = match &request {
        Request::Manifest { root } | Request::Have { root } | Request::Chunk { root, .. } => *root,
    };
    let Some(holding) = server.holdings.get(&root) else {
        return Ok(not_here("not held".into()));
    };
    Ok(match request {
        Request::Manifest { .. } => Answer {
            reply: Reply::Manifest {
                len: holding.encoded.len() as u64,
            },
            body: Body::Shared(holding.encoded.clone()),
        },
        Request::Have { .. } => {
            let bitmap = holding.have.read().expect("have lock").bitmap().to_vec();
            Answer {
                reply: Reply::Have {
                    len: bitmap.len() as u64,
                },
                body: Body::Owned(bitmap),
            }
        }
        Request::Chunk { index, .. } => {
            if !holding.have.read().expect("have lock").contains(index) {
                return Ok(not_here(format!("no chunk {index}")));
            }
            let store = server.store.clone();
            let held = holding.held(root);
            let h = holding.clone();
            let read = tokio::task::spawn_blocking(move || {
                store.read_chunk(&held, &h.manifest, &h.index, index)
            })
            .await
            .map_err(|e| transport::TransportError::Protocol(e.to_string()))?;
            match read {
                Ok(bytes) => Answer {
                    reply: Reply::Chunk {
                        index,
                        len: bytes.len() as u32,
                    },
                    body: Body::Paced(bytes),
                },
                // The copy was removed or became whole (renamed) meanwhile: the asker tries
                // again or elsewhere.
                Err(e) => not_here(e.to_string()),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes a throttle of `cap` lets through in `span` of simulated time when every wait
    /// wakes `late` after its slot.
    fn served(cap: u64, late: Duration, span: Duration) -> u64 {
        let throttle = Throttle::new(cap, 0);
        let t0 = Instant::now();
        let (mut now, mut sent) = (t0, 0u64);
        while now < t0 + span {
            let start = throttle.slot(SLICE_BYTES, now);
            if start > now {
                now = start + late;
            }
            sent += SLICE_BYTES as u64;
        }
        sent
    }

    #[test]
    fn late_wake_ups_do_not_lower_the_paced_rate() {
        let cap = 100_000_000;
        let span = Duration::from_secs(2);
        let bound =
            cap * 2 + (cap as f64 * PACE_CREDIT.as_secs_f64()) as u64 + 2 * SLICE_BYTES as u64;
        for late in [
            Duration::ZERO,
            Duration::from_millis(5),
            Duration::from_millis(20),
        ] {
            let sent = served(cap, late, span);
            // Within a tenth of the cap over the span, and never above it by more than the
            // credit (and a slice or two of rounding).
            assert!(
                sent >= cap * 2 * 9 / 10,
                "{late:?} late: {sent} bytes in 2 s"
            );
            assert!(sent <= bound, "{late:?} late: {sent} bytes in 2 s");
        }
        // No cap: every slot is now.
        let now = Instant::now();
        assert_eq!(Throttle::new(0, 0).slot(SLICE_BYTES, now), now);
    }

    /// A slot that is due costs no timer: in a runtime without a time driver any sleep, even
    /// until "now", panics (tokio rounds a deadline up to the next millisecond and parks on
    /// it); a paced write that slept once a slice lost a third of the link to the node's
    /// timer slack.
    #[test]
    fn a_due_slot_is_not_slept_on() {
        let no_timers = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let body = vec![7u8; 8 * SLICE_BYTES];
        // Capped at 10 GB/s with its schedule behind the clock: every slice is within the
        // credit.
        let behind = Throttle::new(10_000_000_000, 0);
        *behind.next.lock().expect("throttle lock") = Instant::now() - Duration::from_secs(1);
        for throttle in [Throttle::new(0, 0), behind] {
            let mut out = Vec::new();
            no_timers
                .block_on(throttle.write(&mut out, &body))
                .expect("write");
            assert_eq!(out, body, "cap {}", throttle.cap());
        }
    }

    /// A slot in the future is still waited for.
    #[tokio::test]
    async fn a_later_slot_is_waited_for() {
        let throttle = Throttle::new(SLICE_BYTES as u64 * 20, 0); // 50 ms a slice
        let t0 = Instant::now();
        let mut out = Vec::new();
        let body = vec![7u8; 4 * SLICE_BYTES];
        throttle.write(&mut out, &body).await.expect("write");
        assert_eq!(out, body);
        // The first slice goes at once, the next three 50 ms apart.
        assert!(
            t0.elapsed() >= Duration::from_millis(140),
            "{:?}",
            t0.elapsed()
        );
    }
}
