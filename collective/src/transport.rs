//! The transport under the algorithms: per peer, a frame [`Reader`] and a frame [`Writer`],
//! over TCP (the data plane) or over in-memory channels (tests and single-process groups).
//!
//! Ownership: the operation in progress writes frames itself, straight from the caller's
//! buffer (no copy). Reading is done by one task per TCP connection that owns the read half:
//! it reads frames ahead into a small pool of reusable buffers (`read_ahead_frames` + 1
//! of `chunk_bytes` each) and hands them to the operation, which reduces straight out of them.
//! So the kernel-to-user copy of incoming data runs in parallel with the sending and
//! reducing (on another core with a multi-threaded runtime), a closed connection is seen even
//! between operations, and every buffer on the path is bounded. The in-memory transport
//! delivers the same messages over channels. Every error on a link means that peer is lost.

use std::io::IoSlice;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::error::{CollectiveError, OpDesc};
use crate::frame::{Abort, Header, HEADER_BYTES};
use crate::shm::{self, LinkState};

/// Read-buffer size of a TCP link: holds a header and a small payload in one syscall;
/// larger payloads bypass it and land directly in a pool buffer.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Frames queued per direction of an in-memory link (the ring needs at least 4).
const MEM_QUEUE_FRAMES: usize = 4;
/// Zero bytes written per call when padding out a half-written frame before an abort.
const PAD_BYTES: usize = 64 * 1024;

/// Why an operation failed, and what to relay to the other ranks.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// Returned to the caller.
    pub error: CollectiveError,
    /// Sent to every peer in an abort frame.
    pub relay: Abort,
}

impl Failure {
    pub fn lost(rank: usize) -> Self {
        Failure {
            error: CollectiveError::PeerLost { rank },
            relay: Abort::PeerLost { rank },
        }
    }
    pub fn relayed(abort: Abort, ours: Option<OpDesc>) -> Self {
        Failure {
            error: abort.to_error(ours),
            relay: abort,
        }
    }
    pub fn protocol(rank: usize, detail: String) -> Self {
        Failure {
            error: CollectiveError::Protocol { rank, detail },
            relay: Abort::PeerLost { rank },
        }
    }
}

/// What a link delivers to the operation.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// A data frame; the payload is the first `bytes` bytes of `buf`.
    Data {
        desc: OpDesc,
        buf: Payload,
        bytes: usize,
    },
    /// The peer aborted the generation.
    Abort(Abort),
    /// A malformed header.
    Protocol(String),
}

/// Where a received payload lies. Both are 8-aligned, so they can be viewed as any element
/// type.
#[derive(Debug)]
pub(crate) enum Payload {
    /// A buffer of the TCP reading task's pool, or an in-memory message.
    Heap(Vec<u64>),
    /// Still in the peer's shared-memory slot: reduced from in place.
    Shm(shm::Slot),
}

impl Payload {
    /// The first `len` elements.
    pub fn elems<T: bytemuck::Pod>(&self, len: usize) -> &[T] {
        match self {
            Payload::Heap(b) => &bytemuck::cast_slice::<u64, T>(b)[..len],
            Payload::Shm(s) => bytemuck::cast_slice(s.bytes(len * std::mem::size_of::<T>())),
        }
    }
}

/// The receiving side of a shared-memory link: frames come from the ring, aborts and the
/// peer's death from the TCP connection (the channel).
struct ShmIn {
    ring: shm::Consumer,
    state: Arc<LinkState>,
    /// [`crate::Limits::blocking_waits`]: [`Reader::recv`] sleeps on the ring's futex itself.
    blocking: bool,
}

/// Receiving half of a link to `peer`.
pub(crate) struct Reader {
    peer: usize,
    /// TCP or in-memory frames; on a shared-memory link only aborts and malformed frames
    /// from the TCP connection, whose end (EOF, reset) closes the channel.
    rx: mpsc::Receiver<Inbound>,
    shm: Option<ShmIn>,
    /// Where consumed TCP buffers go back to the reading task (none in memory).
    free: Option<mpsc::Sender<Vec<u64>>>,
    /// A message already taken by a watcher, delivered by the next [`Reader::next`].
    pending: Option<Inbound>,
    task: Option<JoinHandle<()>>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

enum WriteSide {
    Tcp(OwnedWriteHalf),
    Mem(mpsc::Sender<Inbound>),
    /// Frames into the shared ring; the TCP half carries only the abort frame.
    Shm {
        tcp: OwnedWriteHalf,
        ring: shm::Producer,
        state: Arc<LinkState>,
        /// [`crate::Limits::blocking_waits`]: wait for a free slot on the futex itself.
        blocking: bool,
    },
}

/// Sending half of a link to `peer`.
pub(crate) struct Writer {
    peer: usize,
    side: WriteSide,
    /// Bytes of the current frame not yet written: non-zero only when a write was cancelled
    /// half-way, in which case they are padded out before an abort frame.
    frame_left: usize,
}

/// Both halves of a link.
pub(crate) struct Link {
    pub reader: Reader,
    pub writer: Writer,
}

impl Link {
    /// A link over an established, authenticated TCP stream; spawns its reading task.
    pub fn tcp(
        peer: usize,
        stream: TcpStream,
        chunk_bytes: usize,
        read_ahead_frames: usize,
    ) -> Link {
        let (r, w) = stream.into_split();
        let ahead = read_ahead_frames.max(1);
        let (tx, rx) = mpsc::channel(ahead);
        let (free_tx, free_rx) = mpsc::channel(ahead + 1);
        let r = BufReader::with_capacity(READ_BUFFER_BYTES, r);
        let task = tokio::spawn(read_loop(r, tx, free_rx, chunk_bytes.div_ceil(8), ahead));
        Link {
            reader: Reader {
                peer,
                rx,
                shm: None,
                free: Some(free_tx),
                pending: None,
                task: Some(task),
            },
            writer: Writer {
                peer,
                side: WriteSide::Tcp(w),
                frame_left: 0,
            },
        }
    }

    /// A link over an authenticated TCP stream whose peer mapped the shared-memory segment
    /// `ch`: data frames go through the segment's rings; the TCP connection stays open for
    /// abort frames and to notice the peer's death (EOF or reset ends every wait on the
    /// rings at once). `blocking`: [`crate::Limits::blocking_waits`].
    pub fn shm(peer: usize, stream: TcpStream, ch: shm::Channel, blocking: bool) -> Link {
        let state = ch.state();
        let (producer, consumer) = ch.split();
        let (r, w) = stream.into_split();
        let (tx, rx) = mpsc::channel(1);
        let task = tokio::spawn(control_loop(r, tx, state.clone(), consumer.capacity()));
        Link {
            reader: Reader {
                peer,
                rx,
                shm: Some(ShmIn {
                    ring: consumer,
                    state: state.clone(),
                    blocking,
                }),
                free: None,
                pending: None,
                task: Some(task),
            },
            writer: Writer {
                peer,
                side: WriteSide::Shm {
                    tcp: w,
                    ring: producer,
                    state,
                    blocking,
                },
                frame_left: 0,
            },
        }
    }

    /// Whether data goes through shared memory.
    pub fn is_shm(&self) -> bool {
        self.reader.shm.is_some()
    }

    /// A pair of connected in-memory links: `(a's link to b, b's link to a)`.
    pub fn mem_pair(a: usize, b: usize) -> (Link, Link) {
        let (tx_ab, rx_ab) = mpsc::channel(MEM_QUEUE_FRAMES);
        let (tx_ba, rx_ba) = mpsc::channel(MEM_QUEUE_FRAMES);
        let mk = |peer, rx, tx| Link {
            reader: Reader {
                peer,
                rx,
                shm: None,
                free: None,
                pending: None,
                task: None,
            },
            writer: Writer {
                peer,
                side: WriteSide::Mem(tx),
                frame_left: 0,
            },
        };
        (mk(b, rx_ba, tx_ab), mk(a, rx_ab, tx_ba))
    }

    /// Relays `abort` to the peer, closes our sending side and keeps draining the receiving
    /// side for up to `linger` so the peer reads the abort frame rather than a reset.
    pub async fn close_with(mut self, abort: Abort, linger: Duration) {
        let deadline = tokio::time::Instant::now() + linger;
        let _ = tokio::time::timeout_at(deadline, self.writer.write_abort(abort)).await;
        let drain = async {
            while let Some(m) = self.reader.rx.recv().await {
                self.reader.recycle(m);
            }
        };
        let _ = tokio::time::timeout_at(deadline, drain).await;
    }
}

/// The reading task of a TCP link: frames into pool buffers, until EOF, an abort, a
/// malformed header, or the communicator going away.
async fn read_loop(
    mut r: BufReader<OwnedReadHalf>,
    tx: mpsc::Sender<Inbound>,
    mut free: mpsc::Receiver<Vec<u64>>,
    frame_words: usize,
    read_ahead_frames: usize,
) {
    let mut allocated = 0;
    loop {
        let mut hdr = [0u8; HEADER_BYTES];
        if r.read_exact(&mut hdr).await.is_err() {
            return; // the channel closes: the peer is lost
        }
        let msg = match Header::decode(&hdr) {
            Err(d) => Inbound::Protocol(d),
            Ok(Header::Abort(a)) => Inbound::Abort(a),
            Ok(Header::Data {
                desc,
                payload_bytes,
            }) => {
                let bytes = payload_bytes as usize;
                if bytes > frame_words * 8 {
                    let _ = tx
                        .send(Inbound::Protocol(format!("frame of {bytes} bytes")))
                        .await;
                    return;
                }
                let mut buf = match free.try_recv() {
                    Ok(b) => b,
                    Err(_) if allocated < read_ahead_frames + 1 => {
                        allocated += 1;
                        vec![0u64; frame_words]
                    }
                    Err(_) => match free.recv().await {
                        Some(b) => b,
                        None => return,
                    },
                };
                let dst = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut buf)[..bytes];
                if r.read_exact(dst).await.is_err() {
                    return;
                }
                Inbound::Data {
                    desc,
                    buf: Payload::Heap(buf),
                    bytes,
                }
            }
        };
        let last = !matches!(msg, Inbound::Data { .. });
        if tx.send(msg).await.is_err() || last {
            return;
        }
    }
}

/// The TCP side of a shared-memory link: nothing but an abort frame may arrive. Ends the
/// link's state (waking every ring waiter) on that frame, EOF, reset or anything malformed.
async fn control_loop(
    mut r: OwnedReadHalf,
    tx: mpsc::Sender<Inbound>,
    state: Arc<LinkState>,
    slot_bytes: usize,
) {
    let mut hdr = [0u8; HEADER_BYTES];
    let msg = match r.read_exact(&mut hdr).await {
        Err(_) => None,
        Ok(_) => Some(match Header::decode(&hdr) {
            Ok(Header::Abort(a)) => Inbound::Abort(a),
            Ok(Header::Data { .. }) => Inbound::Protocol(format!(
                "data frame over tcp on a shared-memory link (slots of {slot_bytes} bytes)"
            )),
            Err(d) => Inbound::Protocol(d),
        }),
    };
    let abort = match &msg {
        Some(Inbound::Abort(a)) => Some(*a),
        _ => None,
    };
    if let Some(m) = msg {
        let _ = tx.send(m).await; // capacity 1, the only message: never waits
    }
    state.end(abort);
}

/// Decodes a frame taken from a shared-memory ring: only data frames that fit the slot.
fn shm_inbound(hdr: &[u8; HEADER_BYTES], slot: shm::Slot, slot_bytes: usize) -> Inbound {
    match Header::decode(hdr) {
        Err(d) => Inbound::Protocol(d),
        Ok(Header::Abort(_)) => Inbound::Protocol("abort frame in a shared-memory ring".into()),
        Ok(Header::Data {
            desc,
            payload_bytes,
        }) => {
            let bytes = payload_bytes as usize;
            if bytes > slot_bytes {
                return Inbound::Protocol(format!("frame of {bytes} bytes"));
            }
            Inbound::Data {
                desc,
                buf: Payload::Shm(slot),
                bytes,
            }
        }
    }
}

impl Reader {
    /// The peer's rank.
    pub fn peer(&self) -> usize {
        self.peer
    }

    /// The next message; a closed link is [`Failure::lost`]. Cancel-safe.
    pub async fn next(&mut self) -> Result<Inbound, Failure> {
        self.take(false).await
    }

    /// The next message for the operation in progress: [`Reader::next`], except that a
    /// shared-memory link with [`crate::Limits::blocking_waits`] waits on its ring's futex
    /// on this thread. Cancel-safe.
    pub async fn recv(&mut self) -> Result<Inbound, Failure> {
        self.take(true).await
    }

    async fn take(&mut self, may_block: bool) -> Result<Inbound, Failure> {
        if let Some(m) = self.pending.take() {
            return Ok(m);
        }
        let Reader { peer, rx, shm, .. } = self;
        let Some(ShmIn {
            ring,
            state,
            blocking,
        }) = shm
        else {
            return rx.recv().await.ok_or_else(|| Failure::lost(*peer));
        };
        // Ring first: frames the peer published before it died or aborted still count, and
        // the two paths are not ordered, so the ring is checked again after the TCP side
        // reports its end.
        let mut checks = 0;
        let mut closed = false;
        loop {
            match ring.try_take() {
                Ok(Some((hdr, slot))) => return Ok(shm_inbound(&hdr, slot, ring.capacity())),
                Ok(None) if closed => return Err(Failure::lost(*peer)),
                Ok(None) => {}
                Err(d) => return Ok(Inbound::Protocol(d)),
            }
            match rx.try_recv() {
                Ok(m) => return Ok(m),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    closed = true;
                    continue;
                }
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            if checks < shm::SPIN_CHECKS {
                checks += 1;
                std::hint::spin_loop();
                continue;
            }
            if may_block && *blocking {
                ring.block_for_frame();
                if !ring.has_frame() {
                    // A slice passed: let the runtime look at timeouts, aborts, watchers.
                    tokio::task::yield_now().await;
                }
                continue;
            }
            let notified = state.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let _sleeping = ring.sleeping();
            if ring.has_frame() {
                continue;
            }
            tokio::select! {
                _ = &mut notified => {}
                m = rx.recv() => match m {
                    Some(m) => return Ok(m),
                    None => closed = true,
                },
            }
        }
    }

    /// Waits for the next message and keeps it for [`Reader::next`]; returns a failure if
    /// it is an abort, a malformed frame or a loss. Cancel-safe.
    pub async fn watch(&mut self, ours: &OpDesc) -> Failure {
        loop {
            let m = match self.next().await {
                Ok(m) => m,
                Err(f) => return f,
            };
            match m {
                Inbound::Abort(a) => return Failure::relayed(a, Some(*ours)),
                Inbound::Protocol(d) => return Failure::protocol(self.peer, d),
                Inbound::Data { .. } => {
                    self.pending = Some(m);
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// A message whose abort or loss arrived while idle, without waiting.
    pub fn poll_failure(&mut self, ours: &OpDesc) -> Option<Failure> {
        if self.pending.is_none() {
            if self.shm.as_ref().is_some_and(|s| s.ring.has_frame()) {
                return None; // data first, as over TCP; a failure behind it shows up later
            }
            match self.rx.try_recv() {
                Ok(m) => self.pending = Some(m),
                Err(mpsc::error::TryRecvError::Empty) => return None,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    if self.shm.as_ref().is_some_and(|s| s.ring.has_frame()) {
                        return None; // published just before the end: next() delivers it
                    }
                    return Some(Failure::lost(self.peer));
                }
            }
        }
        match &self.pending {
            Some(Inbound::Abort(a)) => Some(Failure::relayed(*a, Some(*ours))),
            Some(Inbound::Protocol(d)) => Some(Failure::protocol(self.peer, d.clone())),
            _ => None,
        }
    }

    /// Returns a consumed buffer to the reading task's pool, or its slot to the peer.
    /// Messages are recycled in the order they were received.
    pub fn recycle(&mut self, m: Inbound) {
        match m {
            Inbound::Data {
                buf: Payload::Heap(buf),
                ..
            } => {
                if let Some(free) = &self.free {
                    let _ = free.try_send(buf);
                }
            }
            Inbound::Data {
                buf: Payload::Shm(slot),
                ..
            } => {
                if let Some(s) = &mut self.shm {
                    s.ring.release(slot);
                }
            }
            _ => {}
        }
    }
}

impl Writer {
    /// Writes one frame: `header` then `payload`.
    pub async fn write_frame(&mut self, header: &Header, payload: &[u8]) -> Result<(), Failure> {
        let peer = self.peer;
        match &mut self.side {
            WriteSide::Tcp(w) => {
                let hdr = header.encode();
                let total = HEADER_BYTES + payload.len();
                let mut done = 0;
                while done < total {
                    let n = if done < HEADER_BYTES {
                        let bufs = [IoSlice::new(&hdr[done..]), IoSlice::new(payload)];
                        w.write_vectored(&bufs).await
                    } else {
                        w.write(&payload[done - HEADER_BYTES..]).await
                    };
                    match n {
                        Ok(0) | Err(_) => return Err(Failure::lost(peer)),
                        Ok(n) => {
                            done += n;
                            self.frame_left = total - done;
                        }
                    }
                }
            }
            WriteSide::Mem(tx) => {
                let Header::Data { desc, .. } = *header else {
                    unreachable!("aborts go through write_abort")
                };
                let mut buf = vec![0u64; payload.len().div_ceil(8)];
                bytemuck::cast_slice_mut::<u64, u8>(&mut buf)[..payload.len()]
                    .copy_from_slice(payload);
                let m = Inbound::Data {
                    desc,
                    buf: Payload::Heap(buf),
                    bytes: payload.len(),
                };
                tx.send(m).await.map_err(|_| Failure::lost(peer))?;
            }
            WriteSide::Shm {
                ring,
                state,
                blocking,
                ..
            } => {
                let Header::Data { desc, .. } = *header else {
                    unreachable!("aborts go through write_abort")
                };
                let hdr = header.encode();
                let mut checks = 0;
                loop {
                    if state.dead.load(Ordering::SeqCst) {
                        // Like a write to a closed socket, but naming the abort if one came.
                        return Err(match *state.abort.lock().expect("not poisoned") {
                            Some(a) => Failure::relayed(a, Some(desc)),
                            None => Failure::lost(peer),
                        });
                    }
                    match ring.try_put(&hdr, payload) {
                        Ok(true) => return Ok(()),
                        Ok(false) => {}
                        Err(d) => return Err(Failure::protocol(peer, d)),
                    }
                    if checks < shm::SPIN_CHECKS {
                        checks += 1;
                        std::hint::spin_loop();
                        continue;
                    }
                    if *blocking {
                        ring.block_for_room();
                        if !ring.has_room() {
                            tokio::task::yield_now().await;
                        }
                        continue;
                    }
                    let notified = state.notify.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    let _sleeping = ring.sleeping();
                    if ring.has_room() || state.dead.load(Ordering::SeqCst) {
                        continue;
                    }
                    notified.await;
                }
            }
        }
        Ok(())
    }

    /// Writes one frame of `len` payload bytes whose payload `fill` writes straight into
    /// the link's shared memory, if this is a shared-memory link with a slot free now:
    /// `Ok(true)`. Otherwise `Ok(false)`, nothing is written and `fill` is not called (send
    /// with [`Writer::write_frame`]); never waits.
    pub fn try_write_frame_with(
        &mut self,
        header: &Header,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, Failure> {
        let WriteSide::Shm { ring, state, .. } = &mut self.side else {
            return Ok(false);
        };
        if state.dead.load(Ordering::SeqCst) {
            return Ok(false); // write_frame names the failure
        }
        ring.try_put_with(&header.encode(), len, fill)
            .map_err(|d| Failure::protocol(self.peer, d))
    }

    /// Finishes any half-written frame with zeros, writes an abort frame and closes the
    /// sending direction.
    async fn write_abort(&mut self, abort: Abort) {
        match &mut self.side {
            WriteSide::Tcp(w) => {
                let zeros = [0u8; PAD_BYTES];
                while self.frame_left > 0 {
                    let n = self.frame_left.min(PAD_BYTES);
                    if w.write_all(&zeros[..n]).await.is_err() {
                        return;
                    }
                    self.frame_left -= n;
                }
                let _ = w.write_all(&Header::Abort(abort).encode()).await;
                let _ = w.shutdown().await;
            }
            WriteSide::Mem(tx) => {
                let _ = tx.send(Inbound::Abort(abort)).await;
            }
            WriteSide::Shm { tcp, .. } => {
                // Ring frames are published whole: nothing to pad.
                let _ = tcp.write_all(&Header::Abort(abort).encode()).await;
                let _ = tcp.shutdown().await;
            }
        }
    }
}
