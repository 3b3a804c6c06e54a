//! The [`Communicator`]: one rank of a fixed group, running collectives over its links.

use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::warn;

use crate::config::AllreduceChoice;
use crate::config::{GroupConfig, Limits};
use crate::element::{as_bytes, as_bytes_mut, Element};
use crate::error::{AbortReason, Algorithm, CollKind, CollectiveError, DType, OpDesc, ReduceOp};
use crate::frame::{Abort, Header};
use crate::hierarchy::{Hierarchy, Step};
use crate::schedule::{self, RdStep, RecvMode, RingAction, RingKind};
use crate::tcp;
use crate::transport::{Failure, Inbound, Link, Reader, Writer};

/// Cancels the operations of a [`Communicator`] from another task.
#[derive(Clone, Debug)]
pub struct AbortHandle(Arc<AbortState>);

#[derive(Debug, Default)]
struct AbortState {
    aborted: AtomicBool,
    notify: Notify,
}

impl AbortHandle {
    /// Makes the in-flight operation (and every later one) fail with
    /// [`CollectiveError::Aborted`]; peers fail with [`CollectiveError::PeerAborted`].
    pub fn abort(&self) {
        self.0.aborted.store(true, Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }

    /// Whether [`AbortHandle::abort`] was called.
    pub fn is_aborted(&self) -> bool {
        self.0.aborted.load(Ordering::SeqCst)
    }

    /// Returns once [`AbortHandle::abort`] has been called.
    pub(crate) async fn wait(&self) {
        loop {
            let notified = self.0.notify.notified();
            if self.is_aborted() {
                return;
            }
            notified.await;
        }
    }
}

/// One rank of a fixed group (rank, world size, group id, generation).
///
/// Operations run one at a time (`&mut self`), in the same order on every rank, each with a
/// deadline (`op_timeout_ms`). Invariants:
/// - after a successful `allreduce` every rank holds the same bits, the reduction of all
///   ranks' inputs (each exactly once);
/// - after any error the communicator is poisoned: every later operation returns that error
///   at once, and the other ranks are told (abort frames), so their pending and next
///   operations fail too. Build a new generation to go on;
/// - every frame names its operation (sequence number, kind, algorithm, dtype, op, length),
///   and a frame that disagrees fails with [`CollectiveError::Mismatch`].
///
/// A rank that is not inside an operation notices a peer's failure at its next operation.
pub struct Communicator {
    rank: usize,
    world: usize,
    group_id: u64,
    generation: u64,
    limits: Limits,
    engine: Engine,
    seq: u64,
    poisoned: Option<CollectiveError>,
    abort: AbortHandle,
    /// The task relaying a failure to the peers (abort frames, then close).
    relaying: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("group_id", &self.group_id)
            .field("generation", &self.generation)
            .field("seq", &self.seq)
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

impl Communicator {
    /// Binds `addrs[rank]` and connects the group (see [`Communicator::connect_with_listener`]).
    pub async fn connect(cfg: GroupConfig) -> Result<Self, CollectiveError> {
        cfg.validate()?;
        let addr = cfg.addrs[cfg.rank];
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| CollectiveError::Listen {
                addr: addr.to_string(),
                detail: e.to_string(),
            })?;
        Self::connect_with_listener(cfg, &listener).await
    }

    /// Connects the group, accepting on `listener` (the caller keeps it across
    /// generations): dials the higher-ranked peers it needs, with retries, and accepts the
    /// lower ones, each authenticated by the handshake; stray, stale or unauthenticated
    /// connections are refused and logged. Fails with [`CollectiveError::Connect`] when the
    /// group is not complete by `connect_timeout_ms`.
    pub async fn connect_with_listener(
        cfg: GroupConfig,
        listener: &TcpListener,
    ) -> Result<Self, CollectiveError> {
        cfg.validate()?;
        let mut cfg = cfg;
        if let Some(choice) = AllreduceChoice::from_env()? {
            cfg.limits.allreduce = choice;
        }
        let hier = Hierarchy::for_group(&cfg.addrs, cfg.limits.allreduce);
        let mut streams = tcp::establish(&cfg, listener).await?;
        let mut links: Vec<Option<Link>> = (0..cfg.world).map(|_| None).collect();
        // A TCP link holds its read-ahead frames plus the one being read: at least
        // RING_GROUP, whatever the socket buffers, so that the ring cannot deadlock.
        let chunk = cfg.limits.chunk_bytes;
        let ahead = cfg.limits.read_ahead_frames.max(RING_GROUP - 1);
        for (peer, (s, ch)) in streams.drain() {
            links[peer] = Some(match ch {
                Some(ch) => Link::shm(peer, s, ch, cfg.limits.blocking_waits),
                None => Link::tcp(peer, s, chunk, ahead),
            });
        }
        let mut c = Self::from_links(
            cfg.rank,
            cfg.world,
            cfg.group_id,
            cfg.generation,
            cfg.limits,
            links,
        );
        c.engine.hier = hier;
        Ok(c)
    }

    /// A group of `world` ranks in this process, connected by in-memory channels (tests,
    /// single-process use). Dropping a communicator is seen by the others as a lost peer.
    pub fn in_memory(world: usize, limits: Limits) -> Result<Vec<Self>, CollectiveError> {
        limits.validate()?;
        if world == 0 {
            return Err(CollectiveError::Invalid("world 0".into()));
        }
        let mut links: Vec<Vec<Option<Link>>> = (0..world)
            .map(|_| (0..world).map(|_| None).collect())
            .collect();
        let pairs: Vec<(usize, usize)> = (0..world)
            .flat_map(|a| schedule::peers(a, world).into_iter().map(move |b| (a, b)))
            .filter(|(a, b)| a < b)
            .collect();
        for (a, b) in pairs {
            let (la, lb) = Link::mem_pair(a, b);
            links[a][b] = Some(la);
            links[b][a] = Some(lb);
        }
        Ok(links
            .into_iter()
            .enumerate()
            .map(|(r, l)| Self::from_links(r, world, 0, 0, limits.clone(), l))
            .collect())
    }

    fn from_links(
        rank: usize,
        world: usize,
        group_id: u64,
        generation: u64,
        limits: Limits,
        links: Vec<Option<Link>>,
    ) -> Self {
        let scratch_words = limits.small_bytes_max.div_ceil(8);
        Communicator {
            rank,
            world,
            group_id,
            generation,
            engine: Engine {
                rank,
                world,
                links,
                scratch: vec![0u64; scratch_words],
                chunk_bytes: limits.chunk_bytes,
                hier: None,
            },
            limits,
            seq: 0,
            poisoned: None,
            abort: AbortHandle(Arc::default()),
            relaying: None,
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }
    /// Group id.
    pub fn group_id(&self) -> u64 {
        self.group_id
    }
    /// Generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }
    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }
    /// How many of this rank's links carry data through shared memory (peers on the same
    /// host, with [`Limits::shared_memory`]); the others use TCP.
    pub fn shared_memory_links(&self) -> usize {
        self.engine
            .links
            .iter()
            .flatten()
            .filter(|l| l.is_shm())
            .count()
    }
    /// How many of this rank's links carry data over the network (TCP, or the in-memory
    /// transport of tests), not through shared memory.
    pub fn network_links(&self) -> usize {
        self.engine
            .links
            .iter()
            .flatten()
            .filter(|l| !l.is_shm())
            .count()
    }
    /// Whether allreduces above `small_bytes_max` run hierarchically (ranks grouped by the
    /// IPs of their data-plane addresses; see [`Limits::allreduce`]).
    pub fn hierarchical(&self) -> bool {
        self.engine.hier.is_some()
    }
    /// The error that poisoned this communicator, if any.
    pub fn error(&self) -> Option<&CollectiveError> {
        self.poisoned.as_ref()
    }

    /// The part of a `len`-element buffer that `rank` owns in [`Communicator::reduce_scatter`]
    /// and contributes in [`Communicator::allgather`].
    pub fn segment(&self, len: usize, rank: usize) -> Range<usize> {
        schedule::segment(len, self.world, rank)
    }

    /// A handle that cancels this communicator's operations from elsewhere.
    pub fn abort_handle(&self) -> AbortHandle {
        self.abort.clone()
    }

    /// Cancels the generation: poisons this communicator with [`CollectiveError::Aborted`] and
    /// tells the peers, whose operations fail with [`CollectiveError::PeerAborted`].
    pub async fn abort(&mut self) {
        self.abort.abort();
        if self.poisoned.is_none() {
            let f = Failure {
                error: CollectiveError::Aborted,
                relay: Abort::Peer {
                    rank: self.rank,
                    reason: AbortReason::Aborted,
                },
            };
            self.fail(f);
        }
    }

    /// Closes the connections. After an error, first waits (at most `abort_linger_ms`) until
    /// the failure has been relayed to the peers, so that they learn its cause (say,
    /// `PeerLost { rank: 2 }`) rather than seeing this rank vanish: call it before exiting
    /// the process. Without an error, the peers see this rank as lost at their next
    /// operation.
    pub async fn shutdown(mut self) {
        if let Some(t) = self.relaying.take() {
            let _ = t.await;
        }
    }

    /// Sums (or averages, min, max) `buf` across all ranks, in place. Small messages
    /// (≤ `small_bytes_max`) use recursive doubling, larger ones the pipelined ring, or the
    /// hierarchical allreduce ([`crate::hierarchy`]) where the group's placement calls for
    /// it ([`Limits::allreduce`], [`Communicator::hierarchical`]).
    /// [`ReduceOp::Avg`] of integers is refused with [`CollectiveError::Unsupported`] (the
    /// communicator stays usable).
    pub async fn allreduce<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        supported::<T>(op)?;
        let algo = self.pick(buf.len(), T::DTYPE);
        let desc = self.begin(CollKind::Allreduce, algo, T::DTYPE, Some(op), buf.len(), 0)?;
        if self.world == 1 {
            return Ok(());
        }
        let Communicator { engine, abort, .. } = self;
        let fut = async {
            match algo {
                Algorithm::RecursiveDoubling => engine.recursive_doubling(buf, op, &desc).await,
                Algorithm::Hierarchical => engine.hierarchical(buf, op, &desc).await,
                _ => engine.ring(buf, op, RingKind::Allreduce, &desc).await,
            }
        };
        let r = guarded(fut, abort, self.limits.op_timeout_ms, &desc, self.rank).await;
        self.finish(r)
    }

    /// Reduce-scatter in place: afterwards `buf[self.segment(buf.len(), rank)]` holds the
    /// reduction of that segment over all ranks; the rest of `buf` is scratch. Integers:
    /// as [`Communicator::allreduce`].
    pub async fn reduce_scatter<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        supported::<T>(op)?;
        let desc = self.begin(
            CollKind::ReduceScatter,
            Algorithm::Ring,
            T::DTYPE,
            Some(op),
            buf.len(),
            0,
        )?;
        if self.world == 1 {
            return Ok(());
        }
        let Communicator { engine, abort, .. } = self;
        let fut = engine.ring(buf, op, RingKind::ReduceScatter, &desc);
        let r = guarded(fut, abort, self.limits.op_timeout_ms, &desc, self.rank).await;
        self.finish(r)
    }

    /// Allgather in place: each rank contributes `buf[self.segment(buf.len(), rank)]`;
    /// afterwards every rank holds every segment. `allgather::<u8>` gathers any element
    /// type as bytes (segments are then counted in bytes: give a buffer of `world` equal
    /// parts to gather whole elements).
    pub async fn allgather<T: Element>(&mut self, buf: &mut [T]) -> Result<(), CollectiveError> {
        let desc = self.begin(
            CollKind::Allgather,
            Algorithm::Ring,
            T::DTYPE,
            None,
            buf.len(),
            0,
        )?;
        if self.world == 1 {
            return Ok(());
        }
        let Communicator { engine, abort, .. } = self;
        // The op is not used: allgather only copies.
        let fut = engine.ring(buf, ReduceOp::Sum, RingKind::Allgather, &desc);
        let r = guarded(fut, abort, self.limits.op_timeout_ms, &desc, self.rank).await;
        self.finish(r)
    }

    /// Copies `root`'s `buf` into every rank's `buf` (a pipelined chain along the ring).
    /// `broadcast::<u8>` moves any element type as bytes.
    pub async fn broadcast<T: Element>(
        &mut self,
        buf: &mut [T],
        root: usize,
    ) -> Result<(), CollectiveError> {
        self.broadcast_raw(as_bytes_mut(buf), T::DTYPE, root).await
    }

    pub(crate) async fn broadcast_raw(
        &mut self,
        buf: &mut [u8],
        dtype: DType,
        root: usize,
    ) -> Result<(), CollectiveError> {
        if root >= self.world {
            return Err(CollectiveError::Invalid(format!("root {root}")));
        }
        let len = buf.len() / dtype.size_bytes().max(1);
        let desc = self.begin(
            CollKind::Broadcast,
            Algorithm::Chain,
            dtype,
            None,
            len,
            root,
        )?;
        if self.world == 1 {
            return Ok(());
        }
        let Communicator { engine, abort, .. } = self;
        let fut = engine.chain_broadcast(buf, root, &desc);
        let r = guarded(fut, abort, self.limits.op_timeout_ms, &desc, self.rank).await;
        self.finish(r)
    }

    /// Returns once every rank has entered the barrier (recursive doubling, header-only).
    pub async fn barrier(&mut self) -> Result<(), CollectiveError> {
        let desc = self.begin(
            CollKind::Barrier,
            Algorithm::RecursiveDoubling,
            DType::None,
            None,
            0,
            0,
        )?;
        if self.world == 1 {
            return Ok(());
        }
        let Communicator { engine, abort, .. } = self;
        let fut = engine.recursive_doubling::<f32>(&mut [], ReduceOp::Sum, &desc);
        let r = guarded(fut, abort, self.limits.op_timeout_ms, &desc, self.rank).await;
        self.finish(r)
    }

    fn pick(&self, len: usize, dtype: DType) -> Algorithm {
        if len * dtype.size_bytes() <= self.limits.small_bytes_max {
            Algorithm::RecursiveDoubling
        } else if self.engine.hier.is_some() {
            Algorithm::Hierarchical
        } else {
            Algorithm::Ring
        }
    }

    /// Checks the communicator is usable and numbers the next operation.
    fn begin(
        &mut self,
        kind: CollKind,
        algo: Algorithm,
        dtype: DType,
        op: Option<ReduceOp>,
        len: usize,
        root: usize,
    ) -> Result<OpDesc, CollectiveError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        if self.abort.is_aborted() {
            self.fail(Failure {
                error: CollectiveError::Aborted,
                relay: Abort::Peer {
                    rank: self.rank,
                    reason: AbortReason::Aborted,
                },
            });
            return Err(CollectiveError::Aborted);
        }
        let desc = OpDesc {
            seq: self.seq,
            kind,
            algo,
            dtype,
            op,
            len: len as u64,
            root: root as u32,
        };
        self.seq += 1;
        // An abort or loss that arrived while we were idle fails this operation at once.
        let idle_failure = self
            .engine
            .links
            .iter_mut()
            .flatten()
            .find_map(|l| l.reader.poll_failure(&desc));
        if let Some(f) = idle_failure {
            let e = f.error.clone();
            self.fail(f);
            return Err(e);
        }
        Ok(desc)
    }

    fn finish(&mut self, r: Result<(), Failure>) -> Result<(), CollectiveError> {
        match r {
            Ok(()) => Ok(()),
            Err(f) => {
                let e = f.error.clone();
                self.fail(f);
                Err(e)
            }
        }
    }

    /// Poisons the communicator and relays the failure to every peer in the background
    /// (abort frame, then close after draining for `abort_linger_ms`).
    fn fail(&mut self, f: Failure) {
        if self.poisoned.is_some() {
            return;
        }
        warn!(rank = self.rank, generation = self.generation, error = %f.error, "collective failed, generation poisoned");
        self.poisoned = Some(f.error);
        let links: Vec<Link> = self
            .engine
            .links
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        let linger = Duration::from_millis(self.limits.abort_linger_ms);
        let relay = f.relay;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            self.relaying = Some(rt.spawn(async move {
                let closes = links.into_iter().map(|l| l.close_with(relay, linger));
                futures_join_all(closes).await;
            }));
        }
    }
}

/// Refuses reductions without an exact meaning for `T` (the mean of integers), on every
/// rank alike and before the operation is numbered, so the group stays in step.
fn supported<T: Element>(op: ReduceOp) -> Result<(), CollectiveError> {
    if op == ReduceOp::Avg && T::DTYPE.is_integer() {
        return Err(CollectiveError::Unsupported {
            op,
            dtype: T::DTYPE,
        });
    }
    Ok(())
}

/// Runs `futs` concurrently to completion.
async fn futures_join_all<F: Future<Output = ()>>(futs: impl Iterator<Item = F>) {
    let mut set = Vec::new();
    for f in futs {
        set.push(Box::pin(f));
    }
    // A tiny join-all: poll every unfinished future each time any is woken.
    std::future::poll_fn(|cx| {
        set.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if set.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}

/// Runs one operation under its deadline and the abort handle.
async fn guarded(
    fut: impl Future<Output = Result<(), Failure>>,
    abort: &AbortHandle,
    op_timeout_ms: u64,
    desc: &OpDesc,
    rank: usize,
) -> Result<(), Failure> {
    let deadline = Instant::now() + Duration::from_millis(op_timeout_ms);
    tokio::select! {
        r = fut => r,
        _ = abort.wait() => Err(Failure {
            error: CollectiveError::Aborted,
            relay: Abort::Peer { rank, reason: AbortReason::Aborted },
        }),
        _ = tokio::time::sleep_until(deadline) => Err(Failure {
            error: CollectiveError::Timeout { op: *desc, after_ms: op_timeout_ms },
            relay: Abort::Peer { rank, reason: AbortReason::Timeout },
        }),
    }
}

/// Chunks a ring plan takes at a time ([`schedule::ring_plan`]): how many frames a rank may
/// run ahead of its left neighbour, and the most frames a ring link must hold for the ring
/// not to deadlock. Shared-memory links hold `SHM_SLOTS` (8; at least `SHM_SLOTS_MIN` = 4
/// accepted), in-memory ones 4, TCP links their read-ahead frames (raised to at least
/// `RING_GROUP − 1`) plus the one being read, plus the socket buffers.
const RING_GROUP: usize = 4;
const _: () = assert!(RING_GROUP <= crate::shm::SHM_SLOTS_MIN as usize);

/// The data path: links, a reusable scratch buffer, and the algorithms.
struct Engine {
    rank: usize,
    world: usize,
    links: Vec<Option<Link>>,
    /// Reused across calls: one whole small message for recursive doubling (u64 words so
    /// it can be viewed as any element type). The ring reduces straight out of the links'
    /// receive buffers and needs none.
    scratch: Vec<u64>,
    chunk_bytes: usize,
    /// The placement large allreduces run hierarchically on, if they do.
    hier: Option<Hierarchy>,
}

/// A ring's shape for one rank: its position and neighbours (global ranks).
#[derive(Clone, Copy)]
struct RingPos {
    rank: usize,
    world: usize,
    left: usize,
    right: usize,
}

/// Element ranges of the frames of one transfer of `n` elements: sub-chunks of
/// `chunk_elems`, and one empty frame for an empty transfer (so that even empty transfers
/// synchronise and are checked).
fn frames(start: usize, n: usize, chunk_elems: usize) -> impl Iterator<Item = Range<usize>> {
    let empty = (n == 0).then_some(start..start);
    empty
        .into_iter()
        .chain(schedule::subchunks(start..start + n, chunk_elems))
}

/// Borrows `(reader of from, writer of to, reader of to if distinct)`.
fn pair(
    links: &mut [Option<Link>],
    from: usize,
    to: usize,
) -> (&mut Reader, &mut Writer, Option<&mut Reader>) {
    const MISSING: &str = "links exist for every schedule peer until poisoned";
    if from == to {
        let l = links[from].as_mut().expect(MISSING);
        (&mut l.reader, &mut l.writer, None)
    } else {
        let [a, b] = links
            .get_disjoint_mut([from, to])
            .expect("distinct in-range peers");
        let a = a.as_mut().expect(MISSING);
        let b = b.as_mut().expect(MISSING);
        (&mut a.reader, &mut b.writer, Some(&mut b.reader))
    }
}

/// Takes the next data frame of `desc`, which must carry exactly `bytes` payload bytes.
/// Hand the message back with [`Reader::recycle`] once used.
async fn recv_frame(
    reader: &mut Reader,
    me: usize,
    desc: &OpDesc,
    bytes: usize,
) -> Result<Inbound, Failure> {
    let m = reader.recv().await?;
    match &m {
        Inbound::Abort(a) => Err(Failure::relayed(*a, Some(*desc))),
        Inbound::Protocol(d) => Err(Failure::protocol(reader.peer(), d.clone())),
        Inbound::Data {
            desc: theirs,
            bytes: got,
            ..
        } => {
            if theirs != desc {
                return Err(Failure {
                    error: CollectiveError::Mismatch {
                        rank: reader.peer(),
                        ours: *desc,
                        theirs: *theirs,
                    },
                    relay: Abort::Mismatch {
                        rank: me,
                        theirs: *desc,
                    },
                });
            }
            if *got != bytes {
                return Err(Failure {
                    error: CollectiveError::Protocol {
                        rank: reader.peer(),
                        detail: format!(
                            "frame of {got} bytes, expected {bytes} (chunk_bytes differ?)"
                        ),
                    },
                    relay: Abort::Peer {
                        rank: me,
                        reason: AbortReason::Protocol,
                    },
                });
            }
            Ok(m)
        }
    }
}

/// The payload of a data message as elements.
fn payload<T: bytemuck::Pod>(m: &Inbound, len: usize) -> &[T] {
    match m {
        Inbound::Data { buf, .. } => buf.elems(len),
        _ => unreachable!("recv_frame returns data messages only"),
    }
}

/// Receives one frame and copies its payload into `dst`.
async fn recv_into(
    reader: &mut Reader,
    me: usize,
    desc: &OpDesc,
    dst: &mut [u8],
) -> Result<(), Failure> {
    let m = recv_frame(reader, me, desc, dst.len()).await?;
    dst.copy_from_slice(payload::<u8>(&m, dst.len()));
    reader.recycle(m);
    Ok(())
}

/// Sends `data` as frames of `chunk_elems`.
async fn send_all<T: Element>(
    writer: &mut Writer,
    desc: &OpDesc,
    data: &[T],
    chunk_elems: usize,
) -> Result<(), Failure> {
    for c in frames(0, data.len(), chunk_elems) {
        let bytes = as_bytes(&data[c]);
        let h = Header::Data {
            desc: *desc,
            payload_bytes: bytes.len() as u32,
        };
        writer.write_frame(&h, bytes).await?;
    }
    Ok(())
}

/// Receives frames into `dst`, reducing with `op` straight out of the received buffers or,
/// without `op`, overwriting `dst`.
async fn recv_all<T: Element>(
    reader: &mut Reader,
    me: usize,
    desc: &OpDesc,
    dst: &mut [T],
    reduce: Option<(ReduceOp, bool)>,
    chunk_elems: usize,
) -> Result<(), Failure> {
    for c in frames(0, dst.len(), chunk_elems) {
        let d = &mut dst[c];
        let m = recv_frame(reader, me, desc, std::mem::size_of_val(d)).await?;
        let src = payload::<T>(&m, d.len());
        match reduce {
            None => d.copy_from_slice(src),
            Some((op, theirs_first)) => T::reduce(d, src, op, theirs_first),
        }
        reader.recycle(m);
    }
    Ok(())
}

/// Waits for an abort or loss on a link we only send on (its reverse direction); a data
/// frame that arrives early (the peer is already in the next operation) is kept for it.
async fn watch(reader: Option<&mut Reader>, desc: &OpDesc) -> Failure {
    match reader {
        Some(r) => r.watch(desc).await,
        None => std::future::pending().await,
    }
}

/// Runs `actions` of a ring plan on `buf` in order: send a range right, or receive a frame
/// from the left into a range (reducing with `op`, or copying). A received frame is released
/// before the next action.
///
/// A partial-sum receive ([`RecvMode::Reduce`]) that the next action sends straight on (the
/// plan's order, [`schedule::ring_plan`]) does both at once when the right link is shared
/// memory with a slot free now: the received frame and `buf` are reduced straight into that
/// slot (bit for bit the same values), which saves writing the partial sum into `buf` and
/// copying it out again; `buf[range]` is then left as it was, which the ring allows
/// (allgather overwrites it, reduce-scatter leaves it as scratch). It never waits for the
/// slot while holding the received one, so the ring's bound on frames in flight holds.
#[allow(clippy::too_many_arguments)]
async fn ring_actions<T: Element>(
    reader: &mut Reader,
    writer: &mut Writer,
    me: usize,
    desc: &OpDesc,
    buf: &mut [T],
    actions: &[RingAction],
    op: ReduceOp,
    world: usize,
) -> Result<(), Failure> {
    let mut i = 0;
    while let Some(action) = actions.get(i) {
        i += 1;
        let (x, mode) = match action {
            RingAction::Send(x) => {
                send_bytes(writer, desc, as_bytes(&buf[x.clone()])).await?;
                continue;
            }
            RingAction::Recv(x, mode) => (x, *mode),
        };
        let d = &mut buf[x.clone()];
        let bytes = std::mem::size_of_val(d);
        let m = recv_frame(reader, me, desc, bytes).await?;
        let src = payload::<T>(&m, d.len());
        let forwards = mode == RecvMode::Reduce
            && matches!(actions.get(i), Some(RingAction::Send(y)) if y == x);
        let h = Header::Data {
            desc: *desc,
            payload_bytes: bytes as u32,
        };
        let fused = forwards
            && writer.try_write_frame_with(&h, bytes, |out| {
                T::reduce_into(bytemuck::cast_slice_mut(out), d, src, op)
            })?;
        if fused {
            i += 1; // the send is done
        } else {
            match mode {
                RecvMode::Copy => d.copy_from_slice(src),
                RecvMode::Reduce | RecvMode::ReduceOwned => T::reduce(d, src, op, false),
            }
        }
        reader.recycle(m);
        if mode == RecvMode::ReduceOwned && op == ReduceOp::Avg {
            T::divide(d, world);
        }
    }
    Ok(())
}

fn scratch_as<T: Element>(scratch: &mut [u64]) -> &mut [T] {
    bytemuck::cast_slice_mut(scratch)
}

impl Engine {
    fn chunk_elems<T: Element>(&self) -> usize {
        self.chunk_bytes / std::mem::size_of::<T>()
    }

    /// Runs this rank's [`schedule::ring_plan`] of `kind`: frames to the right, frames from
    /// the left, one at a time in the plan's (chunk-major) order. A received frame is reduced
    /// or copied into `buf` (or, forwarded at once, into the right link's free slot:
    /// [`ring_actions`]) straight out of the link's buffer and released before anything that
    /// may wait, so a link never holds more than [`RING_GROUP`] frames. With `Avg`, each
    /// chunk of the owned segment is divided as it completes.
    async fn ring<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        kind: RingKind,
        desc: &OpDesc,
    ) -> Result<(), Failure> {
        let (me, w) = (self.rank, self.world);
        let pos = RingPos {
            rank: me,
            world: w,
            left: schedule::left(me, w),
            right: schedule::right(me, w),
        };
        self.ring_on(buf, op, kind, desc, pos, w).await
    }

    /// The ring of [`Engine::ring`] at position `pos` (a ring of all ranks, or of the host
    /// leaders); with `Avg`, owned chunks are divided by `avg_world`.
    async fn ring_on<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        kind: RingKind,
        desc: &OpDesc,
        pos: RingPos,
        avg_world: usize,
    ) -> Result<(), Failure> {
        let ce = self.chunk_elems::<T>();
        let me = self.rank;
        let plan = schedule::ring_plan(pos.rank, pos.world, buf.len(), ce, RING_GROUP, kind);
        let last_send = plan
            .iter()
            .rposition(|a| matches!(a, RingAction::Send(_)))
            .map_or(0, |i| i + 1);
        let (sending, draining) = plan.split_at(last_send);
        let w = avg_world;
        let (reader, writer, watched) = pair(&mut self.links, pos.left, pos.right);
        // The link to the right is watched (for its abort or loss) only while we still send
        // on it: once our frames are out, the right peer may finish the operation and close
        // before our last frames from the left are in, which is no failure of ours. A
        // failure it relays after that reaches us around the ring, through the left.
        let run = ring_actions(reader, writer, me, desc, buf, sending, op, w);
        tokio::select! {
            r = run => r?,
            f = watch(watched, desc) => return Err(f),
        }
        ring_actions(reader, writer, me, desc, buf, draining, op, w).await
    }

    /// This rank's part of the hierarchical allreduce ([`Hierarchy::plan`]): a rank hands
    /// its buffer to its host's leader and takes the result back; a leader reduces its
    /// host's buffers into its own in rank order, runs the ring among the leaders (dividing
    /// by the whole world for `Avg`) and sends the result to its host's ranks. Every rank
    /// ends with the leader's bits.
    async fn hierarchical<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        desc: &OpDesc,
    ) -> Result<(), Failure> {
        let ce = self.chunk_elems::<T>();
        let (me, world) = (self.rank, self.world);
        let plan = self
            .hier
            .as_ref()
            .expect("hierarchical is picked only with a hierarchy")
            .plan(me);
        for step in plan {
            match step {
                Step::SendToLeader(leader) => {
                    let (reader, writer, _) = pair(&mut self.links, leader, leader);
                    tokio::select! {
                        r = send_all(writer, desc, buf, ce) => r?,
                        f = reader.watch(desc) => return Err(f),
                    }
                }
                Step::ReceiveFromLeader(leader) | Step::ReduceFrom(leader) => {
                    let reduce = matches!(step, Step::ReduceFrom(_)).then_some((op, false));
                    let (reader, _, _) = pair(&mut self.links, leader, leader);
                    recv_all(reader, me, desc, buf, reduce, ce).await?;
                }
                Step::LeaderRing {
                    rank,
                    world: leaders,
                    left,
                    right,
                } => {
                    if leaders > 1 {
                        let pos = RingPos {
                            rank,
                            world: leaders,
                            left,
                            right,
                        };
                        self.ring_on(buf, op, RingKind::Allreduce, desc, pos, world)
                            .await?;
                    } else if op == ReduceOp::Avg {
                        T::divide(buf, world);
                    }
                }
                Step::BroadcastTo(r) => {
                    let (_, writer, _) = pair(&mut self.links, r, r);
                    send_all(writer, desc, buf, ce).await?;
                }
            }
        }
        Ok(())
    }

    /// Recursive-doubling allreduce of a small `buf` (fits the scratch buffer).
    async fn recursive_doubling<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        desc: &OpDesc,
    ) -> Result<(), Failure> {
        let ce = self.chunk_elems::<T>();
        let me = self.rank;
        let Engine { links, scratch, .. } = self;
        let scratch = &mut scratch_as::<T>(scratch)[..buf.len()];
        for step in schedule::recursive_doubling(me, self.world) {
            match step {
                RdStep::Send { to } | RdStep::SendResult { to } => {
                    let (_, w, _) = pair(links, to, to);
                    send_all(w, desc, buf, ce).await?;
                }
                RdStep::RecvResult { from } => {
                    let (r, _, _) = pair(links, from, from);
                    recv_all(r, me, desc, buf, None, ce).await?;
                }
                RdStep::RecvReduce { from, theirs_first } => {
                    let (r, _, _) = pair(links, from, from);
                    recv_all(r, me, desc, buf, Some((op, theirs_first)), ce).await?;
                }
                RdStep::Exchange { peer, theirs_first } => {
                    let (r, w, _) = pair(links, peer, peer);
                    tokio::try_join!(
                        send_all(w, desc, buf, ce),
                        recv_all(r, me, desc, &mut scratch[..], None, ce),
                    )?;
                    T::reduce(buf, scratch, op, theirs_first);
                }
            }
        }
        if op == ReduceOp::Avg {
            T::divide(buf, self.world);
        }
        Ok(())
    }

    /// Pipelined chain broadcast from `root` along the ring: each rank receives sub-chunk
    /// `i + 1` while forwarding sub-chunk `i`.
    async fn chain_broadcast(
        &mut self,
        buf: &mut [u8],
        root: usize,
        desc: &OpDesc,
    ) -> Result<(), Failure> {
        let ce = self.chunk_bytes;
        let (me, w) = (self.rank, self.world);
        let pos = (me + w - root) % w;
        let (l, r) = (schedule::left(me, w), schedule::right(me, w));
        let forward = pos + 1 < w;
        let (reader, writer, watched) = pair(&mut self.links, l, r);
        if pos == 0 {
            let f = send_bytes_all(writer, desc, buf, ce);
            return tokio::select! {
                r = f => r,
                f = watch(Some(reader), desc) => Err(f),
                f = watch(watched, desc) => Err(f),
            };
        }
        let ranges: Vec<Range<usize>> = frames(0, buf.len(), ce).collect();
        let body = async {
            recv_into(reader, me, desc, &mut buf[ranges[0].clone()]).await?;
            for i in 1..ranges.len() {
                let (done, rest) = buf.split_at_mut(ranges[i].start);
                let prev = &done[ranges[i - 1].clone()];
                let next = &mut rest[..ranges[i].len()];
                if forward {
                    tokio::try_join!(
                        send_bytes(writer, desc, prev),
                        recv_into(reader, me, desc, next)
                    )?;
                } else {
                    recv_into(reader, me, desc, next).await?;
                }
            }
            if forward {
                let last = ranges.last().expect("at least one frame").clone();
                send_bytes(writer, desc, &buf[last]).await?;
            }
            Ok(())
        };
        tokio::select! {
            r = body => r,
            f = watch(watched, desc) => Err(f),
        }
    }
}

async fn send_bytes(writer: &mut Writer, desc: &OpDesc, data: &[u8]) -> Result<(), Failure> {
    let h = Header::Data {
        desc: *desc,
        payload_bytes: data.len() as u32,
    };
    writer.write_frame(&h, data).await
}

async fn send_bytes_all(
    writer: &mut Writer,
    desc: &OpDesc,
    data: &[u8],
    chunk_bytes: usize,
) -> Result<(), Failure> {
    for c in frames(0, data.len(), chunk_bytes) {
        send_bytes(writer, desc, &data[c]).await?;
    }
    Ok(())
}
