//! The shared-memory data path of a link whose two ends are on the same host.
//!
//! After the authenticated TCP handshake (see [`crate::tcp`]) the dialer creates a segment
//! in `/dev/shm` under a random, unguessable name (128 bits), owner-only (mode 0600), and
//! sends the name over the authenticated connection. An acceptor on the same host opens and
//! maps it, unlinks it, and returns the 32-byte random token it finds inside: that proves it
//! mapped the same segment. The dialer then unlinks it too (whichever comes first wins), so a
//! segment has a name in `/dev/shm` only for one round trip of the set-up; after that it
//! lives exactly as long as the two mappings. A peer on another host cannot open the name
//! and declines; the link stays on TCP.
//!
//! Layout (all offsets in bytes; every index word on its own cache line):
//!
//! ```text
//! 0     magic u64      8 slots u32   12 slot payload capacity u32   16 total bytes u64
//! 32    token [32]
//! 128   ring 0 head    192 ring 0 tail     256 ring 1 head   320 ring 1 tail   (u32 counters)
//! 384   side 0 doorbell  448 side 0 sleepers  512 side 1 doorbell  576 side 1 sleepers
//! 4096  ring 0 slots, then ring 1 slots; a slot = 64-byte area holding the 32-byte frame
//!       header, then the payload (capacity rounded up to 64)
//! ```
//!
//! Side 0 (the dialer) produces into ring 0 and consumes ring 1; side 1 the reverse. Each ring
//! is a single-producer/single-consumer queue of `slots` frames: `head` counts frames
//! published by the producer, `tail` frames released by the consumer (both wrapping `u32`);
//! invariant `0 ≤ head − tail ≤ slots`, and slot `i % slots` belongs to the producer exactly
//! when `i ≥ head`, to the consumer when `tail ≤ i < head`. A frame's bytes are written
//! before `head` is published and read before `tail` is released, so neither side touches a
//! slot the other owns.
//!
//! Waiting: an async waiter registers with its link's [`tokio::sync::Notify`], raises its
//! side's `sleepers` count, re-checks the ring and sleeps. A producer or consumer that moves
//! an index checks the other side's `sleepers` and, if non-zero, bumps that side's
//! `doorbell` and `FUTEX_WAKE`s it. One thread per link sleeps in `FUTEX_WAIT` on its own
//! doorbell and turns each ring into a `notify_waiters`. (Sequentially consistent store
//! then load on both sides: at least one of them sees the other, so no wake-up is lost.)
//!
//! Trust: the peer passed the handshake MAC, exactly like a TCP peer whose bytes we reduce.
//! Everything read from the segment is validated before use (layout once, copied into
//! [`Layout`]; each header is copied out, then checked like a TCP header; indices are
//! checked against `slots`), so a faulty peer can corrupt values or fail the link, never
//! make this side read or write outside its mapping.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rand::RngCore;
use tokio::sync::Notify;

use crate::frame::{Abort, HEADER_BYTES};

/// Where segments are created: tmpfs on Linux.
const SHM_DIR: &str = "/dev/shm";
/// Prefix of segment names, so an operator can tell what a stray one was.
const NAME_PREFIX: &str = "ringleader-collective-";
/// Random part of a segment name: 16 bytes, hex.
pub(crate) const NAME_HEX_BYTES: usize = 32;
/// Largest segment either side creates or maps, bytes. A link whose rings would not fit
/// (very large `chunk_bytes`) stays on TCP.
pub const SHM_SEGMENT_BYTES_MAX: usize = 256 * 1024 * 1024;
/// Frame slots per direction. Measured on the 2-core loopback box (N = 4, 64 MiB): see
/// BENCH.md.
pub const SHM_SLOTS: u32 = 8;
/// Fewest slots an acceptor accepts (else the link stays on TCP): the chunk-major ring needs a
/// link to hold this many frames (`RING_GROUP` in the communicator) not to deadlock.
pub(crate) const SHM_SLOTS_MIN: u32 = 4;
/// Most slots an acceptor accepts in a segment's layout.
const SHM_SLOTS_MAX: u32 = 64;
/// Times a waiter re-checks its ring (with a CPU pause between) before going to sleep.
/// Small: with more ranks than cores, spinning steals the core the peer needs.
pub(crate) const SPIN_CHECKS: u32 = 64;
/// Longest single futex sleep of an operation's own thread waiting on a ring
/// ([`crate::Limits::blocking_waits`]), ms: the most an abort, a timeout or a watched link
/// waits to be looked at while that thread sleeps.
pub const BLOCKING_WAIT_SLICE_MS: u64 = 2;
/// Longest single futex sleep of a link's waker thread, ms: the bound on how long that
/// thread outlives its link.
const WAKER_SLEEP_MS: u64 = 100;

const MAGIC: u64 = u64::from_le_bytes(*b"RLSHM\0v1");
const LINE: usize = 64;
const CTRL_BYTES: usize = 4096;
const SLOT_HEADER_BYTES: usize = 64;
const TOKEN_BYTES: usize = 32;
const OFF_MAGIC: usize = 0;
const OFF_SLOTS: usize = 8;
const OFF_CAP: usize = 12;
const OFF_TOTAL: usize = 16;
const OFF_TOKEN: usize = 32;

fn off_head(ring: usize) -> usize {
    2 * LINE + ring * 2 * LINE
}
fn off_tail(ring: usize) -> usize {
    3 * LINE + ring * 2 * LINE
}
fn off_doorbell(side: usize) -> usize {
    6 * LINE + side * 2 * LINE
}
fn off_sleepers(side: usize) -> usize {
    7 * LINE + side * 2 * LINE
}

/// The geometry of a segment, validated once and never re-read from shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    slots: u32,
    /// Payload capacity of a slot, bytes (a multiple of 8).
    cap: usize,
    /// Distance between slots, bytes (a multiple of 64).
    stride: usize,
    total: usize,
}

impl Layout {
    /// The layout for `slots` slots of `cap` payload bytes, if it fits the size limit.
    fn new(slots: u32, cap: usize) -> Option<Layout> {
        if slots == 0 || slots > SHM_SLOTS_MAX || !cap.is_multiple_of(8) {
            return None;
        }
        let stride = SLOT_HEADER_BYTES.checked_add(cap.checked_next_multiple_of(LINE)?)?;
        let total = stride
            .checked_mul(2 * slots as usize)?
            .checked_add(CTRL_BYTES)?;
        (total <= SHM_SEGMENT_BYTES_MAX).then_some(Layout {
            slots,
            cap,
            stride,
            total,
        })
    }

    /// Offset of slot `i` (taken modulo `slots`) of `ring`.
    fn slot(&self, ring: usize, i: u32) -> usize {
        CTRL_BYTES + (ring * self.slots as usize + (i % self.slots) as usize) * self.stride
    }
}

/// A shared mapping of a whole segment.
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory shared with one peer process. Index words are only
// accessed as atomics; slot bytes only by the side that owns the slot under the ring
// protocol (module docs), so handing the pointer to other threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only gives out atomics and owner-checked slot access.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from a successful mmap and nothing borrows the mapping
        // any more (every borrower holds an `Arc<Mapping>`).
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

impl Mapping {
    /// Maps the whole of `file` (`len` bytes) shared, read-write.
    fn map(file: &std::fs::File, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of an open file; no Rust reference aliases it yet.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Anonymous memory with the same layout, for the in-process ring tests.
    #[cfg(test)]
    fn anonymous(len: usize) -> Mapping {
        // SAFETY: a fresh anonymous mapping; no Rust reference aliases it yet.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "anonymous mmap");
        Mapping {
            ptr: ptr.cast(),
            len,
        }
    }

    /// The `u32` index word at `off`.
    fn word(&self, off: usize) -> &AtomicU32 {
        assert!(
            off.is_multiple_of(4) && off + 4 <= self.len,
            "index word in range"
        );
        // SAFETY: in range and 4-aligned (mmap is page-aligned); index words are only ever
        // accessed atomically, by both processes.
        unsafe { &*self.ptr.add(off).cast::<AtomicU32>() }
    }

    /// Copies `src` to `off`. The caller owns those bytes under the ring protocol.
    fn write(&self, off: usize, src: &[u8]) {
        assert!(off + src.len() <= self.len, "write in range");
        // SAFETY: in range; the destination is a slot this side owns (a producer's free slot
        // or the set-up fields before the peer knows the segment), so nothing reads it now.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(off), src.len()) }
    }

    /// Copies `dst.len()` bytes from `off`.
    fn read(&self, off: usize, dst: &mut [u8]) {
        assert!(off + dst.len() <= self.len, "read in range");
        // SAFETY: in range; the source is a slot this side owns (or set-up fields).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), dst.as_mut_ptr(), dst.len()) }
    }

    /// `len` bytes at `off` to write, borrowed while the caller owns the slot.
    ///
    /// # Safety
    /// The bytes are a slot this side owns under the ring protocol (a producer's free slot,
    /// not yet published), and no other borrow of them is alive.
    #[allow(clippy::mut_from_ref)] // the ring protocol, not `&self`, gives the ownership
    unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= self.len, "slot in range");
        // SAFETY: in range; the caller's contract: the slot is ours and unborrowed. A
        // faulty peer writing it anyway can only change the values we publish.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }

    /// `len` bytes at `off`, borrowed for as long as the caller owns the slot.
    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.len, "slot in range");
        // SAFETY: in range; the bytes are a slot the consumer owns until it releases it
        // (`tail`), and the producer writes no slot it does not own. A faulty peer writing
        // anyway can only change the values (every element type accepts any bits).
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }
}

fn layout_of(map: &Mapping) -> Result<Layout, String> {
    let mut b = [0u8; 24];
    map.read(0, &mut b);
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    if u64_at(OFF_MAGIC) != MAGIC {
        return Err("bad segment magic".into());
    }
    let (slots, cap, total) = (u32_at(OFF_SLOTS), u32_at(OFF_CAP), u64_at(OFF_TOTAL));
    let layout = Layout::new(slots, cap as usize).ok_or("bad segment geometry")?;
    if layout.total as u64 != total || layout.total != map.len {
        return Err(format!("segment of {} bytes, layout says {total}", map.len));
    }
    Ok(layout)
}

/// A segment the dialer created and offered; dropping it unlinks the name.
pub(crate) struct Offer {
    name: String,
    path: PathBuf,
    token: [u8; TOKEN_BYTES],
    map: Arc<Mapping>,
    layout: Layout,
}

impl Drop for Offer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path); // NotFound: the acceptor unlinked it first
    }
}

impl Offer {
    /// Creates a segment whose slots hold frames of up to `frame_bytes`; `Ok(None)` when
    /// it would exceed [`SHM_SEGMENT_BYTES_MAX`].
    pub fn create(frame_bytes: usize) -> io::Result<Option<Offer>> {
        let Some(layout) = u32::try_from(frame_bytes)
            .ok()
            .and_then(|_| Layout::new(SHM_SLOTS, frame_bytes))
        else {
            return Ok(None);
        };
        let mut rnd = [0u8; NAME_HEX_BYTES / 2];
        rand::thread_rng().fill_bytes(&mut rnd);
        let name: String = rnd.iter().map(|b| format!("{b:02x}")).collect();
        let path = PathBuf::from(SHM_DIR).join(format!("{NAME_PREFIX}{name}"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)?;
        let mut token = [0u8; TOKEN_BYTES];
        rand::thread_rng().fill_bytes(&mut token);
        let offer = |map| Offer {
            name,
            path: path.clone(),
            token,
            map: Arc::new(map),
            layout,
        };
        let mapped = file
            .set_len(layout.total as u64)
            .and_then(|()| Mapping::map(&file, layout.total));
        let map = match mapped {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        map.write(OFF_SLOTS, &layout.slots.to_le_bytes());
        map.write(OFF_CAP, &(layout.cap as u32).to_le_bytes());
        map.write(OFF_TOTAL, &(layout.total as u64).to_le_bytes());
        map.write(OFF_TOKEN, &token);
        map.write(OFF_MAGIC, &MAGIC.to_le_bytes());
        Ok(Some(offer(map)))
    }

    /// The random part of the name, sent to the acceptor.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether `token` is the one inside the segment (the acceptor mapped it).
    pub fn proves(&self, token: &[u8]) -> bool {
        token == self.token
    }

    /// The dialer's end (side 0), its waker thread started unless `blocking` (see
    /// [`Channel::start`]); unlinks the name.
    pub fn into_channel(self, blocking: bool) -> io::Result<Channel> {
        Channel::start(self.map.clone(), self.layout, 0, !blocking)
    }
}

/// Where the segment a dialer named lies, if `name` (from the peer) is well formed:
/// [`NAME_HEX_BYTES`] lowercase hex digits, so the path stays in [`SHM_DIR`].
pub(crate) fn segment_path(name: &[u8]) -> Result<PathBuf, String> {
    if name.len() != NAME_HEX_BYTES || !name.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err("malformed segment name".into());
    }
    let name = std::str::from_utf8(name).map_err(|e| e.to_string())?;
    Ok(PathBuf::from(SHM_DIR).join(format!("{NAME_PREFIX}{name}")))
}

/// Opens the segment the dialer named, maps and unlinks it, and returns the acceptor's end
/// (side 1) and the token to send back. Fails (and the link stays on TCP) when the name is
/// malformed, the segment is not on this host, or its layout is unusable or its slots are
/// smaller than `frame_bytes`. `blocking`: no waker thread (see [`Channel::start`]).
pub(crate) fn open(
    name: &[u8],
    frame_bytes: usize,
    blocking: bool,
) -> Result<(Channel, [u8; TOKEN_BYTES]), String> {
    let path = segment_path(name)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| format!("open: {e}"))?;
    let _ = std::fs::remove_file(&path);
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len < CTRL_BYTES as u64 || len > SHM_SEGMENT_BYTES_MAX as u64 {
        return Err(format!("segment of {len} bytes"));
    }
    let map = Mapping::map(&file, len as usize).map_err(|e| format!("mmap: {e}"))?;
    let layout = layout_of(&map)?;
    if layout.cap < frame_bytes {
        return Err(format!(
            "slots of {} bytes, frames of {frame_bytes}",
            layout.cap
        ));
    }
    if layout.slots < SHM_SLOTS_MIN {
        return Err(format!("{} slots, at least {SHM_SLOTS_MIN}", layout.slots));
    }
    let mut token = [0u8; TOKEN_BYTES];
    map.read(OFF_TOKEN, &mut token);
    let ch =
        Channel::start(Arc::new(map), layout, 1, !blocking).map_err(|e| format!("waker: {e}"))?;
    Ok((ch, token))
}

/// One end of a mapped segment, before it is split into its two rings.
pub(crate) struct Channel {
    map: Arc<Mapping>,
    layout: Layout,
    side: usize,
    state: Arc<LinkState>,
}

impl Channel {
    /// Our end (`side`) of a mapped segment, with (if `waker`) the thread that turns futex
    /// wake-ups on our doorbell into `state.notify.notify_waiters()`. The thread ends within
    /// [`WAKER_SLEEP_MS`] of the last strong reference to the state going away. Started
    /// during set-up, so that a failure to start it means staying on TCP.
    ///
    /// Without it (a link with [`crate::Limits::blocking_waits`], whose operation sleeps on
    /// the futex itself) nothing turns the peer's rings into notifications: the only async
    /// waiter left, the watcher of a link the operation sends on, is there for aborts and
    /// losses, which come through the TCP connection; a data frame it would have stashed
    /// stays in the ring for the next operation. Every ring would otherwise also wake this
    /// thread, a context switch per frame taken from ranks that share the cores.
    fn start(map: Arc<Mapping>, layout: Layout, side: usize, waker: bool) -> io::Result<Channel> {
        let state = Arc::new(LinkState::default());
        if waker {
            let waiters = Arc::downgrade(&state);
            let thread_map = map.clone();
            let off = off_doorbell(side);
            std::thread::Builder::new()
                .name("collective-shm".into())
                .spawn(move || waker_loop(&thread_map, off, &waiters))?;
        }
        Ok(Channel {
            map,
            layout,
            side,
            state,
        })
    }

    /// The state shared by the link's waiters, its TCP control task and its waker thread.
    pub fn state(&self) -> Arc<LinkState> {
        self.state.clone()
    }

    /// `(producer into our ring, consumer of the peer's ring)`.
    pub fn split(self) -> (Producer, Consumer) {
        let ends = |ring| End {
            map: self.map.clone(),
            layout: self.layout,
            ring,
            side: self.side,
        };
        (
            Producer {
                end: ends(self.side),
                written: 0,
            },
            Consumer {
                end: ends(1 - self.side),
                taken: 0,
                released: 0,
            },
        )
    }
}

fn waker_loop(map: &Mapping, doorbell: usize, waiters: &Weak<LinkState>) {
    let bell = map.word(doorbell);
    loop {
        let seen = bell.load(Ordering::SeqCst);
        match waiters.upgrade() {
            Some(w) => w.notify.notify_waiters(),
            None => return,
        }
        futex_wait(bell, seen, Duration::from_millis(WAKER_SLEEP_MS));
    }
}

/// What a link's waiters share with its TCP control task and its waker thread.
#[derive(Debug, Default)]
pub(crate) struct LinkState {
    /// Woken when the peer moves an index, or the link dies.
    pub notify: Notify,
    /// Set once the TCP connection ended (EOF, reset, abort frame, malformed frame).
    pub dead: AtomicBool,
    /// The abort frame that ended it, if one did.
    pub abort: Mutex<Option<Abort>>,
}

impl LinkState {
    /// Records the end of the TCP connection and wakes every waiter.
    pub fn end(&self, abort: Option<Abort>) {
        *self.abort.lock().expect("not poisoned") = abort;
        self.dead.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }
}

/// One side's view of one ring.
struct End {
    map: Arc<Mapping>,
    layout: Layout,
    ring: usize,
    /// Our side (whose doorbell the peer rings).
    side: usize,
}

impl End {
    fn head(&self) -> &AtomicU32 {
        self.map.word(off_head(self.ring))
    }
    fn tail(&self) -> &AtomicU32 {
        self.map.word(off_tail(self.ring))
    }
    /// Wakes the peer if it sleeps.
    fn ring_peer(&self) {
        let peer = 1 - self.side;
        if self.map.word(off_sleepers(peer)).load(Ordering::SeqCst) != 0 {
            let bell = self.map.word(off_doorbell(peer));
            bell.fetch_add(1, Ordering::SeqCst);
            futex_wake(bell);
        }
    }
    /// Counts us as sleeping until the guard drops.
    fn sleeping(&self) -> Sleeping<'_> {
        let w = self.map.word(off_sleepers(self.side));
        w.fetch_add(1, Ordering::SeqCst);
        Sleeping(w)
    }

    /// Sleeps on this side's doorbell, on the calling thread, until the peer rings it or
    /// [`BLOCKING_WAIT_SLICE_MS`] pass, unless `ready()` (checked after announcing the
    /// sleeper and reading the bell, so no ring in between is lost) says there is no need.
    fn block_until(&self, ready: impl Fn() -> bool) {
        let _sleeping = self.sleeping();
        let bell = self.map.word(off_doorbell(self.side));
        let seen = bell.load(Ordering::SeqCst);
        if ready() {
            return;
        }
        futex_wait(bell, seen, Duration::from_millis(BLOCKING_WAIT_SLICE_MS));
    }
}

/// Our side is counted in `sleepers` while this lives (dropped on wake-up or cancel).
pub(crate) struct Sleeping<'a>(&'a AtomicU32);

impl Drop for Sleeping<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The producing end of a ring.
pub(crate) struct Producer {
    end: End,
    /// Frames published; the shared `head` mirrors it (we never trust the shared copy).
    written: u32,
}

impl Producer {
    /// Publishes one frame if a slot is free: `Ok(false)` when the ring is full.
    pub fn try_put(&mut self, header: &[u8; HEADER_BYTES], payload: &[u8]) -> Result<bool, String> {
        self.try_put_with(header, payload.len(), |slot| slot.copy_from_slice(payload))
    }

    /// Publishes one frame of `len` payload bytes if a slot is free, its payload written by
    /// `fill` straight into the slot (which it must fill whole): `Ok(false)` when the ring is
    /// full, and then `fill` is not called.
    pub fn try_put_with(
        &mut self,
        header: &[u8; HEADER_BYTES],
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, String> {
        let e = &self.end;
        if len > e.layout.cap {
            return Err(format!("frame of {len} bytes, slots of {}", e.layout.cap));
        }
        let used = self.written.wrapping_sub(e.tail().load(Ordering::Acquire));
        if used > e.layout.slots {
            return Err("shared-memory ring: consumer ahead of producer".into());
        }
        if used == e.layout.slots {
            return Ok(false);
        }
        let off = e.layout.slot(e.ring, self.written);
        e.map.write(off, header);
        // SAFETY: slot `written` is free (`used < slots`), so it is ours until `head` is
        // published below, and nothing else borrows it.
        fill(unsafe { e.map.bytes_mut(off + SLOT_HEADER_BYTES, len) });
        self.written = self.written.wrapping_add(1);
        e.head().store(self.written, Ordering::SeqCst);
        e.ring_peer();
        Ok(true)
    }

    /// Whether a slot is free (or the indices are corrupt, which `try_put` reports).
    pub fn has_room(&self) -> bool {
        self.written
            .wrapping_sub(self.end.tail().load(Ordering::SeqCst))
            != self.end.layout.slots
    }

    /// Blocks the calling thread until a slot may be free (or one slice passed).
    pub fn block_for_room(&self) {
        self.end.block_until(|| self.has_room());
    }

    /// Counts us as sleeping until the guard drops; re-check [`Producer::has_room`] after.
    pub fn sleeping(&self) -> Sleeping<'_> {
        self.end.sleeping()
    }
}

/// A received frame still in its slot; hand it back with [`Consumer::release`].
#[derive(Debug)]
pub(crate) struct Slot {
    map: Arc<Mapping>,
    off: usize,
    cap: usize,
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mapping({} bytes)", self.len)
    }
}

impl Slot {
    /// The first `len` payload bytes (8-aligned: slots are 64-byte aligned).
    pub fn bytes(&self, len: usize) -> &[u8] {
        assert!(
            len <= self.cap,
            "checked against the slot capacity on receipt"
        );
        self.map.bytes(self.off, len)
    }
}

/// The consuming end of a ring.
pub(crate) struct Consumer {
    end: End,
    /// Frames handed out (`taken`) and given back (`released`); `released ≤ taken ≤ head`.
    taken: u32,
    released: u32,
}

impl Consumer {
    /// The next frame's header and slot, if one is published. Frames are taken in order
    /// and must be released in the same order.
    pub fn try_take(&mut self) -> Result<Option<([u8; HEADER_BYTES], Slot)>, String> {
        let e = &self.end;
        let head = e.head().load(Ordering::Acquire);
        let ready = head.wrapping_sub(self.taken);
        if ready == 0 {
            return Ok(None);
        }
        if head.wrapping_sub(self.released) > e.layout.slots {
            return Err("shared-memory ring: producer overran the consumer".into());
        }
        let off = e.layout.slot(e.ring, self.taken);
        let mut hdr = [0u8; HEADER_BYTES];
        e.map.read(off, &mut hdr);
        self.taken = self.taken.wrapping_add(1);
        let slot = Slot {
            map: e.map.clone(),
            off: off + SLOT_HEADER_BYTES,
            cap: e.layout.cap,
        };
        Ok(Some((hdr, slot)))
    }

    /// Payload capacity of a slot, bytes.
    pub fn capacity(&self) -> usize {
        self.end.layout.cap
    }

    /// Gives the oldest taken frame's slot back to the producer.
    pub fn release(&mut self, slot: Slot) {
        debug_assert_ne!(self.released, self.taken, "release follows take");
        debug_assert_eq!(
            slot.off,
            self.end.layout.slot(self.end.ring, self.released) + SLOT_HEADER_BYTES,
            "slots are released in order"
        );
        drop(slot);
        self.released = self.released.wrapping_add(1);
        self.end.tail().store(self.released, Ordering::SeqCst);
        self.end.ring_peer();
    }

    /// Whether a frame is published and not yet taken.
    pub fn has_frame(&self) -> bool {
        self.end.head().load(Ordering::SeqCst) != self.taken
    }

    /// Blocks the calling thread until a frame may be there (or one slice passed).
    pub fn block_for_frame(&self) {
        self.end.block_until(|| self.has_frame());
    }

    /// Counts us as sleeping until the guard drops; re-check [`Consumer::has_frame`] after.
    pub fn sleeping(&self) -> Sleeping<'_> {
        self.end.sleeping()
    }
}

#[cfg(target_os = "linux")]
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned u32 in a shared mapping; FUTEX_WAIT only reads it
    // and returns at once if it no longer holds `expected`. Errors (EAGAIN, EINTR,
    // ETIMEDOUT) all mean "look again", which the caller does.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(target_os = "linux")]
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32 in a shared mapping; FUTEX_WAKE does not
    // access it beyond finding its waiters.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Without futexes the waker thread polls its doorbell every millisecond.
#[cfg(not(target_os = "linux"))]
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let _ = (word, expected);
    std::thread::sleep(timeout.min(Duration::from_millis(1)));
}

#[cfg(not(target_os = "linux"))]
fn futex_wake(_word: &AtomicU32) {}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel_pair(slots: u32, cap: usize) -> (Channel, Channel) {
        let layout = Layout::new(slots, cap).unwrap();
        let map = Arc::new(Mapping::anonymous(layout.total));
        let mk = |side| Channel::start(map.clone(), layout, side, true).unwrap();
        (mk(0), mk(1))
    }

    /// Deterministic payload of frame `i`: its length and bytes.
    fn frame(i: u32, cap: usize) -> Vec<u8> {
        let len = (i as usize * 7919) % (cap + 1);
        (0..len)
            .map(|k| (k as u32 ^ i.wrapping_mul(31)) as u8)
            .collect()
    }

    #[test]
    fn concurrent_producer_and_consumer_deliver_every_frame_once_in_order_intact() {
        const FRAMES: u32 = 20_000;
        const CAP: usize = 1000;
        let (a, b) = channel_pair(4, CAP);
        let (mut tx, _) = a.split();
        let (_, mut rx) = b.split();
        let producer = std::thread::spawn(move || {
            for i in 0..FRAMES {
                let mut hdr = [0u8; HEADER_BYTES];
                hdr[..4].copy_from_slice(&i.to_le_bytes());
                let p = frame(i, CAP);
                hdr[4..8].copy_from_slice(&(p.len() as u32).to_le_bytes());
                while !tx.try_put(&hdr, &p).unwrap() {
                    std::thread::yield_now();
                }
            }
        });
        for i in 0..FRAMES {
            let (hdr, slot) = loop {
                match rx.try_take().unwrap() {
                    Some(x) => break x,
                    None => std::thread::yield_now(),
                }
            };
            assert_eq!(
                u32::from_le_bytes(hdr[..4].try_into().unwrap()),
                i,
                "in order"
            );
            let len = u32::from_le_bytes(hdr[4..8].try_into().unwrap()) as usize;
            assert_eq!(slot.bytes(len), &frame(i, CAP)[..], "frame {i} intact");
            rx.release(slot);
        }
        producer.join().unwrap();
        assert_eq!(
            rx.try_take().unwrap().map(|(h, _)| h),
            None,
            "nothing extra"
        );
    }

    #[test]
    fn full_ring_refuses_until_released_and_wakes_a_sleeping_peer() {
        let (a, b) = channel_pair(2, 64);
        let (mut tx, _) = a.split();
        let (_, mut rx) = b.split();
        let hdr = [7u8; HEADER_BYTES];
        assert!(tx.try_put(&hdr, &[1; 64]).unwrap());
        assert!(tx.try_put(&hdr, &[2; 64]).unwrap());
        assert!(!tx.try_put(&hdr, &[3; 64]).unwrap(), "full");
        assert!(!tx.has_room());
        assert!(tx.try_put(&hdr, &[0; 65]).is_err(), "larger than a slot");
        // The producer sleeps; releasing a slot rings its doorbell.
        let bell = tx.end.map.word(off_doorbell(0));
        let before = bell.load(Ordering::SeqCst);
        let guard = tx.sleeping();
        let (_, s) = rx.try_take().unwrap().unwrap();
        assert_eq!(s.bytes(64), &[1; 64][..]);
        rx.release(s);
        assert_ne!(bell.load(Ordering::SeqCst), before, "doorbell rung");
        drop(guard);
        assert!(tx.has_room());
    }

    #[test]
    fn threads_blocked_on_the_futex_deliver_every_frame_in_order() {
        // Both ends without a waker thread, as with `Limits::blocking_waits`: the producer
        // sleeps on the futex when the 4 slots are full, the consumer when they are empty,
        // each woken by the other's ring (or, at worst, a slice later).
        const FRAMES: u32 = 2_000;
        let layout = Layout::new(4, 64).unwrap();
        let map = Arc::new(Mapping::anonymous(layout.total));
        let mk = |side| Channel::start(map.clone(), layout, side, false).unwrap();
        let (mut tx, _) = mk(0).split();
        let (_, mut rx) = mk(1).split();
        let producer = std::thread::spawn(move || {
            for i in 0..FRAMES {
                let mut hdr = [0u8; HEADER_BYTES];
                hdr[..4].copy_from_slice(&i.to_le_bytes());
                while !tx.try_put(&hdr, &i.to_le_bytes()).unwrap() {
                    tx.block_for_room();
                }
            }
        });
        for i in 0..FRAMES {
            let (hdr, slot) = loop {
                match rx.try_take().unwrap() {
                    Some(x) => break x,
                    None => rx.block_for_frame(),
                }
            };
            assert_eq!(u32::from_le_bytes(hdr[..4].try_into().unwrap()), i);
            assert_eq!(slot.bytes(4), &i.to_le_bytes()[..], "frame {i} intact");
            rx.release(slot);
        }
        producer.join().unwrap();
    }

    #[test]
    fn segment_is_unlinked_once_opened_and_refuses_bad_names() {
        let offer = Offer::create(4096).unwrap().unwrap();
        let path = offer.path.clone();
        assert!(path.exists());
        let (_ch, token) = open(offer.name().as_bytes(), 4096, false).unwrap();
        assert!(offer.proves(&token));
        assert!(!path.exists(), "unlinked by the acceptor");
        drop(offer);
        assert!(open(b"../../etc/passwd", 64, false).is_err());
        assert!(
            open(&[b'0'; NAME_HEX_BYTES], 64, false).is_err(),
            "no such segment"
        );
        let small = Offer::create(64).unwrap().unwrap();
        assert!(
            open(small.name().as_bytes(), 4096, false).is_err(),
            "slots too small"
        );
        drop(small);
        assert!(
            Offer::create(SHM_SEGMENT_BYTES_MAX).unwrap().is_none(),
            "too large"
        );
    }
}
