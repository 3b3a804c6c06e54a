//! `ringleader._native.Ring`: one rank of a `collective` group, for Python.
//!
//! A [`Ring`] owns a connected [`Communicator`] and the tokio runtime that drives it
//! (`threads` worker threads beside the caller's, default 1, so the links' read-ahead and
//! abort relays go on between calls; 0: a current-thread runtime, the links' tasks run only
//! inside calls).
//! An operation waiting for a shared-memory frame or slot sleeps on the segment's futex on
//! that thread (the collective's `Limits::blocking_waits`, sound here because every
//! operation runs inside `block_on` on the caller's thread): one wake-up per frame instead
//! of two, and no waker thread per link.
//! Each operation runs on the caller's thread with the GIL released for the whole transfer
//! (`py.detach`), on a buffer given as an address and a length in bytes: the caller (the
//! `ringleader.torch` backend, which passes `tensor.data_ptr()`) guarantees that the bytes
//! are writable, contiguous, alive and touched by nobody else until the call returns. One
//! operation runs at a time; concurrent callers queue on a lock, in no guaranteed order, so
//! a program that needs the same order on every rank (all of them) calls from one thread.
//!
//! Created either directly from a generation (rank, addresses, secret, generation), as a
//! node's `ringleader-generation` line gives it, or through a [`Listener`] bound first, so
//! that a rendezvous (torch's store) can publish the address before the group connects.
//!
//! Failures raise [`RingError`] or a subclass carrying the collective's typed reason in
//! `reason` (and the rank it names, if any, in `rank`): [`PeerLost`], [`Aborted`] (locally
//! or by a peer), [`RingTimeout`], [`HandshakeRefused`]; caller mistakes (an unknown dtype,
//! a misaligned buffer, the mean of integers) raise `ValueError`. After a collective error
//! the ring is poisoned: every later operation raises the same error at once, and the peers
//! fail too. Build the next generation's ring to go on.

use std::net::SocketAddr;
use std::sync::Mutex;

use collective::{
    AbortHandle, CollectiveError, Communicator, Element, GroupConfig, Limits, ReduceOp,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use ringleader_protocol::{Holding, NodeLine, Outcome};

// The base of the ring's errors, a `RingleaderError` and a `RuntimeError` (Python code in
// `ringleader/_base.py`, which imports nothing of the package, so it can be imported while
// this module is).
pyo3::import_exception!(ringleader._base, RingFailure);

pyo3::create_exception!(
    _native,
    RingError,
    RingFailure,
    "A collective operation or the ring's connection failed; `reason` names why."
);
pyo3::create_exception!(
    _native,
    PeerLost,
    RingError,
    "A peer's connection closed or went silent (its process or host died): `rank`."
);
pyo3::create_exception!(
    _native,
    Aborted,
    RingError,
    "The generation was aborted: here (`rank` None) or by the peer `rank`."
);
pyo3::create_exception!(
    _native,
    RingTimeout,
    RingError,
    "The operation did not finish within the ring's op_timeout_ms."
);
pyo3::create_exception!(
    _native,
    HandshakeRefused,
    RingError,
    "A data-plane connection was refused: another secret, group or generation."
);

/// Default deadline of each operation, ms (the collective's default).
const OP_TIMEOUT_MS_DEFAULT: u64 = 60_000;
/// Default deadline for the whole group to connect, ms (the collective's default).
const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Most runtime worker threads a ring may ask for.
const THREADS_MAX: usize = 64;

/// An element type named as Python names it (`torch.float32` → `"float32"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dtype {
    F32,
    F64,
    F16,
    Bf16,
    I32,
    I64,
    U8,
}

impl Dtype {
    fn parse(name: &str) -> PyResult<Dtype> {
        Ok(match name {
            "float32" => Dtype::F32,
            "float64" => Dtype::F64,
            "float16" => Dtype::F16,
            "bfloat16" => Dtype::Bf16,
            "int32" => Dtype::I32,
            "int64" => Dtype::I64,
            "uint8" => Dtype::U8,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "dtype {name:?}: want float32, float64, float16, bfloat16, int32, int64 \
                     or uint8"
                )))
            }
        })
    }

    fn size_bytes(self) -> usize {
        match self {
            Dtype::U8 => 1,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F64 | Dtype::I64 => 8,
        }
    }
}

fn parse_op(name: &str) -> PyResult<ReduceOp> {
    Ok(match name {
        "sum" => ReduceOp::Sum,
        "avg" => ReduceOp::Avg,
        "min" => ReduceOp::Min,
        "max" => ReduceOp::Max,
        _ => {
            return Err(PyValueError::new_err(format!(
                "op {name:?}: want sum, avg, min or max"
            )))
        }
    })
}

/// A buffer handed over by address; [`Buffer::slice`] views it as elements.
#[derive(Clone, Copy)]
struct Buffer {
    addr: usize,
    bytes: usize,
}

impl Buffer {
    /// Checks length and alignment for `elem` bytes per element.
    fn new(addr: usize, bytes: usize, elem: usize) -> PyResult<Buffer> {
        if bytes > 0 && addr == 0 {
            return Err(PyValueError::new_err("null buffer address"));
        }
        if !bytes.is_multiple_of(elem) || !addr.is_multiple_of(elem) {
            return Err(PyValueError::new_err(format!(
                "buffer of {bytes} bytes at {addr:#x} is not whole, aligned {elem}-byte elements"
            )));
        }
        Ok(Buffer { addr, bytes })
    }

    /// A buffer of `dtype` elements (named as Python names them).
    fn typed(addr: usize, bytes: usize, dtype: &str) -> PyResult<(Buffer, Dtype)> {
        let dtype = Dtype::parse(dtype)?;
        Ok((Buffer::new(addr, bytes, dtype.size_bytes())?, dtype))
    }

    /// The buffer as `T`s.
    ///
    /// # Safety
    /// The Python caller's contract (module doc): `bytes` writable bytes at `addr`, alive
    /// and used by nobody else for the lifetime of the slice.
    unsafe fn slice<'a, T: Element>(self) -> &'a mut [T] {
        if self.bytes == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(self.addr as *mut T, self.bytes / size_of::<T>())
    }
}

/// Runs `$body` with `$buf` bound to the buffer viewed as the elements of `$dtype`.
macro_rules! typed {
    ($dtype:expr, $b:expr, |$buf:ident| $body:expr) => {
        // SAFETY: the module's buffer contract, checked for length and alignment by
        // `Buffer::new` with this dtype's size.
        match $dtype {
            Dtype::F32 => {
                let $buf = unsafe { $b.slice::<f32>() };
                $body
            }
            Dtype::F64 => {
                let $buf = unsafe { $b.slice::<f64>() };
                $body
            }
            Dtype::F16 => {
                let $buf = unsafe { $b.slice::<collective::f16>() };
                $body
            }
            Dtype::Bf16 => {
                let $buf = unsafe { $b.slice::<collective::bf16>() };
                $body
            }
            Dtype::I32 => {
                let $buf = unsafe { $b.slice::<i32>() };
                $body
            }
            Dtype::I64 => {
                let $buf = unsafe { $b.slice::<i64>() };
                $body
            }
            Dtype::U8 => {
                let $buf = unsafe { $b.slice::<u8>() };
                $body
            }
        }
    };
}

/// The Python exception for a collective error.
fn to_py(py: Python<'_>, e: CollectiveError) -> PyErr {
    let msg = e.to_string();
    let (err, reason, rank) = match &e {
        CollectiveError::PeerLost { rank } => (PeerLost::new_err(msg), "peer_lost", Some(*rank)),
        CollectiveError::Aborted => (Aborted::new_err(msg), "aborted", None),
        CollectiveError::PeerAborted { rank, .. } => {
            (Aborted::new_err(msg), "peer_aborted", Some(*rank))
        }
        CollectiveError::Timeout { .. } => (RingTimeout::new_err(msg), "timeout", None),
        CollectiveError::Handshake(_) => (HandshakeRefused::new_err(msg), "handshake", None),
        CollectiveError::Mismatch { rank, .. } => {
            (RingError::new_err(msg), "mismatch", Some(*rank))
        }
        CollectiveError::Protocol { rank, .. } => {
            (RingError::new_err(msg), "protocol", Some(*rank))
        }
        CollectiveError::Connect { rank, .. } => (RingError::new_err(msg), "connect", Some(*rank)),
        CollectiveError::Listen { .. } => (RingError::new_err(msg), "listen", None),
        CollectiveError::Invalid(_) | CollectiveError::Unsupported { .. } => {
            return PyValueError::new_err(msg)
        }
        CollectiveError::NotBuiltWithCuda | CollectiveError::Nccl(_) => {
            (RingError::new_err(msg), "nccl", None)
        }
    };
    let v = err.value(py);
    // Setting attributes on a fresh exception instance cannot fail but for memory.
    let _ = v.setattr("reason", reason);
    let _ = v.setattr("rank", rank);
    err
}

/// The tunables Python may set, over the collective's defaults.
fn limits(op_timeout_ms: u64, connect_timeout_ms: u64, shared_memory: bool) -> PyResult<Limits> {
    let l = Limits {
        op_timeout_ms,
        connect_timeout_ms,
        shared_memory,
        // Every operation runs inside `block_on` on the caller's thread (`Ring::run`).
        blocking_waits: true,
        ..Limits::default()
    };
    l.validate()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(l)
}

/// The ring's runtime: `threads` worker threads beside the caller's, or with 0, none (a
/// current-thread runtime: the links' tasks run only inside the ring's calls).
fn runtime(threads: usize) -> PyResult<tokio::runtime::Runtime> {
    if threads > THREADS_MAX {
        return Err(PyValueError::new_err(format!(
            "threads {threads}: want 0..={THREADS_MAX}"
        )));
    }
    let mut b = if threads == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    b.thread_name("ringleader-ring")
        .enable_all()
        .build()
        .map_err(|e| RingError::new_err(format!("starting the ring's runtime: {e}")))
}

/// The group of `rank` among `addrs` (one per rank).
fn group(
    rank: usize,
    addrs: Vec<SocketAddr>,
    secret: Vec<u8>,
    generation: u64,
    group_id: u64,
    limits: Limits,
) -> GroupConfig {
    GroupConfig {
        rank,
        world: addrs.len(),
        group_id,
        generation,
        addrs,
        secret,
        limits,
    }
}

fn parse_addrs(addrs: &[String]) -> PyResult<Vec<SocketAddr>> {
    addrs
        .iter()
        .map(|a| {
            a.parse()
                .map_err(|_| PyValueError::new_err(format!("address {a:?}: want ip:port")))
        })
        .collect()
}

/// A data-plane listener bound before the group connects: publish [`Listener::address`]
/// (through a store), then [`Listener::connect`] with everyone's addresses.
#[pyclass(module = "ringleader._native", frozen)]
pub struct Listener {
    inner: Mutex<Option<std::net::TcpListener>>,
    address: SocketAddr,
}

#[pymethods]
impl Listener {
    /// Binds `address` (`ip:port`; port 0: the OS picks one).
    #[new]
    #[pyo3(signature = (address = "127.0.0.1:0"))]
    fn new(address: &str) -> PyResult<Self> {
        let addr: SocketAddr = address
            .parse()
            .map_err(|_| PyValueError::new_err(format!("address {address:?}: want ip:port")))?;
        let l = std::net::TcpListener::bind(addr)
            .map_err(|e| RingError::new_err(format!("listen on {addr}: {e}")))?;
        l.set_nonblocking(true)
            .map_err(|e| RingError::new_err(format!("listen on {addr}: {e}")))?;
        let address = l
            .local_addr()
            .map_err(|e| RingError::new_err(format!("listen on {addr}: {e}")))?;
        Ok(Listener {
            inner: Mutex::new(Some(l)),
            address,
        })
    }

    /// The bound address, `ip:port`.
    #[getter]
    fn address(&self) -> String {
        self.address.to_string()
    }

    /// Connects the group, accepting on this listener (which stays bound, for the next
    /// generation, until `close()`); `addrs[rank]` should be [`Listener::address`].
    #[pyo3(signature = (rank, addrs, secret, generation = 0, group_id = 0, *,
        op_timeout_ms = OP_TIMEOUT_MS_DEFAULT, connect_timeout_ms = CONNECT_TIMEOUT_MS_DEFAULT,
        shared_memory = true, threads = 1))]
    #[allow(clippy::too_many_arguments)]
    fn connect(
        &self,
        py: Python<'_>,
        rank: usize,
        addrs: Vec<String>,
        secret: Secret,
        generation: u64,
        group_id: u64,
        op_timeout_ms: u64,
        connect_timeout_ms: u64,
        shared_memory: bool,
        threads: usize,
    ) -> PyResult<Ring> {
        let std_listener = {
            let g = self.inner.lock().map_err(|_| poisoned())?;
            let l = g
                .as_ref()
                .ok_or_else(|| RingError::new_err("listener closed"))?;
            l.try_clone()
                .map_err(|e| RingError::new_err(format!("listener: {e}")))?
        };
        let limits = limits(op_timeout_ms, connect_timeout_ms, shared_memory)?;
        let cfg = group(
            rank,
            parse_addrs(&addrs)?,
            secret.0,
            generation,
            group_id,
            limits,
        );
        Ring::start(py, cfg, threads, Some(std_listener))
    }

    /// Unbinds the address.
    fn close(&self) -> PyResult<()> {
        self.inner.lock().map_err(|_| poisoned())?.take();
        Ok(())
    }
}

/// A shared secret given as `str` (its UTF-8 bytes, as a node's generation line and
/// `RINGLEADER_SECRET` carry it) or `bytes`.
struct Secret(Vec<u8>);

impl<'a, 'py> FromPyObject<'a, 'py> for Secret {
    type Error = PyErr;

    fn extract(ob: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(s) = ob.extract::<String>() {
            return Ok(Secret(s.into_bytes()));
        }
        ob.extract::<Vec<u8>>()
            .map(Secret)
            .map_err(|_| PyValueError::new_err("secret: want str or bytes"))
    }
}

fn poisoned() -> PyErr {
    RingError::new_err("a thread panicked inside the ring")
}

/// One rank of a connected group (see the module doc).
#[pyclass(module = "ringleader._native", frozen)]
pub struct Ring {
    // Declared before the runtime: a communicator's links are dropped inside it.
    comm: Mutex<Option<Communicator>>,
    abort: AbortHandle,
    runtime: tokio::runtime::Runtime,
    /// This rank.
    #[pyo3(get)]
    rank: usize,
    /// Number of ranks.
    #[pyo3(get)]
    world: usize,
    /// The generation it was connected for.
    #[pyo3(get)]
    generation: u64,
    /// The group id it was connected for.
    #[pyo3(get)]
    group_id: u64,
    /// Links whose data moves through shared memory (peers on this host).
    #[pyo3(get)]
    shared_memory_links: usize,
    /// Links whose data moves over TCP.
    #[pyo3(get)]
    network_links: usize,
}

impl Ring {
    /// Starts the runtime and connects `cfg`, on `listener` or on a fresh bind of
    /// `addrs[rank]`; the GIL is released while connecting.
    fn start(
        py: Python<'_>,
        cfg: GroupConfig,
        threads: usize,
        listener: Option<std::net::TcpListener>,
    ) -> PyResult<Ring> {
        cfg.validate()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let rt = runtime(threads)?;
        let (rank, world, generation, group_id) =
            (cfg.rank, cfg.world, cfg.generation, cfg.group_id);
        let connected = py.detach(|| {
            rt.block_on(async move {
                match listener {
                    Some(l) => {
                        let l = tokio::net::TcpListener::from_std(l).map_err(|e| {
                            CollectiveError::Listen {
                                addr: cfg.addrs[cfg.rank].to_string(),
                                detail: e.to_string(),
                            }
                        })?;
                        Communicator::connect_with_listener(cfg, &l).await
                    }
                    None => Communicator::connect(cfg).await,
                }
            })
        });
        let comm = connected.map_err(|e| to_py(py, e))?;
        Ok(Ring {
            abort: comm.abort_handle(),
            shared_memory_links: comm.shared_memory_links(),
            network_links: comm.network_links(),
            comm: Mutex::new(Some(comm)),
            runtime: rt,
            rank,
            world,
            generation,
            group_id,
        })
    }

    /// Allreduce, or with `scatter` reduce-scatter, of `b` (elements of `dtype`) with `op`.
    fn reduce(
        &self,
        py: Python<'_>,
        (b, dtype): (Buffer, Dtype),
        op: &str,
        scatter: bool,
    ) -> PyResult<()> {
        let op = parse_op(op)?;
        self.run(py, async move |c: &mut Communicator| {
            typed!(dtype, b, |buf| if scatter {
                c.reduce_scatter(buf, op).await
            } else {
                c.allreduce(buf, op).await
            })
        })
    }

    /// Runs `op` on the communicator with the GIL released.
    fn run<F>(&self, py: Python<'_>, op: F) -> PyResult<()>
    where
        F: AsyncFnOnce(&mut Communicator) -> Result<(), CollectiveError> + Send,
    {
        let r = py.detach(|| {
            let mut g = self.comm.lock().map_err(|_| None)?;
            let comm = g.as_mut().ok_or(None)?;
            self.runtime.block_on(op(comm)).map_err(Some)
        });
        match r {
            Ok(()) => Ok(()),
            Err(Some(e)) => Err(to_py(py, e)),
            Err(None) => Err(RingError::new_err("ring closed")),
        }
    }
}

#[pymethods]
impl Ring {
    /// Binds `addrs[rank]` and connects the group of `len(addrs)` ranks (generation,
    /// secret and group id as every rank has them), with the GIL released. The address to
    /// bind may be a port the node picked for this rank.
    #[new]
    #[pyo3(signature = (rank, addrs, secret, generation = 0, group_id = 0, *,
        op_timeout_ms = OP_TIMEOUT_MS_DEFAULT, connect_timeout_ms = CONNECT_TIMEOUT_MS_DEFAULT,
        shared_memory = true, threads = 1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        rank: usize,
        addrs: Vec<String>,
        secret: Secret,
        generation: u64,
        group_id: u64,
        op_timeout_ms: u64,
        connect_timeout_ms: u64,
        shared_memory: bool,
        threads: usize,
    ) -> PyResult<Ring> {
        let limits = limits(op_timeout_ms, connect_timeout_ms, shared_memory)?;
        let cfg = group(
            rank,
            parse_addrs(&addrs)?,
            secret.0,
            generation,
            group_id,
            limits,
        );
        Ring::start(py, cfg, threads, None)
    }

    /// The ring of a node's `ringleader-generation {json}` line
    /// (docs/book/src/reference/protocol.md): `ValueError` if the line is not one.
    #[staticmethod]
    #[pyo3(signature = (line, group_id = 0, *,
        op_timeout_ms = OP_TIMEOUT_MS_DEFAULT, connect_timeout_ms = CONNECT_TIMEOUT_MS_DEFAULT,
        shared_memory = true, threads = 1))]
    fn from_generation_line(
        py: Python<'_>,
        line: &str,
        group_id: u64,
        op_timeout_ms: u64,
        connect_timeout_ms: u64,
        shared_memory: bool,
        threads: usize,
    ) -> PyResult<Ring> {
        let g = match line.parse::<NodeLine>() {
            Ok(NodeLine::Generation(g)) => g,
            Ok(NodeLine::Stop) => {
                return Err(PyValueError::new_err("a stop line, not a generation line"))
            }
            Err(e) => return Err(PyValueError::new_err(e.to_string())),
        };
        let limits = limits(op_timeout_ms, connect_timeout_ms, shared_memory)?;
        let secret = g.secret.clone().into_bytes();
        let cfg = group(
            g.rank,
            g.addrs.clone(),
            secret,
            g.generation,
            group_id,
            limits,
        );
        Ring::start(py, cfg, threads, None)
    }

    /// `(start, end)` of the part of an `n`-element buffer that `rank` owns after
    /// `reduce_scatter` and contributes to `allgather` (the first `n % world` ranks hold one
    /// element more).
    fn segment(&self, n: usize, rank: usize) -> PyResult<(usize, usize)> {
        if rank >= self.world {
            return Err(PyValueError::new_err(format!(
                "rank {rank} of world {}",
                self.world
            )));
        }
        let r = collective::schedule::segment(n, self.world, rank);
        Ok((r.start, r.end))
    }

    /// Reduces the `nbytes` at `addr` (elements of `dtype`) with `op` (`sum`, `avg`, `min`,
    /// `max`; `avg` of integers is refused) across all ranks, in place.
    fn allreduce(
        &self,
        py: Python<'_>,
        addr: usize,
        nbytes: usize,
        dtype: &str,
        op: &str,
    ) -> PyResult<()> {
        self.reduce(py, Buffer::typed(addr, nbytes, dtype)?, op, false)
    }

    /// Reduce-scatter in place: afterwards the elements `segment(n, rank)` hold the
    /// reduction of that part over all ranks; the rest of the buffer is scratch.
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        addr: usize,
        nbytes: usize,
        dtype: &str,
        op: &str,
    ) -> PyResult<()> {
        self.reduce(py, Buffer::typed(addr, nbytes, dtype)?, op, true)
    }

    /// Allgather of bytes in place: this rank contributes the bytes `segment(nbytes, rank)`
    /// (give `world` equal parts), and afterwards holds everyone's.
    fn allgather(&self, py: Python<'_>, addr: usize, nbytes: usize) -> PyResult<()> {
        let b = Buffer::new(addr, nbytes, 1)?;
        self.run(py, async move |c: &mut Communicator| {
            // SAFETY: the module's buffer contract.
            c.allgather(unsafe { b.slice::<u8>() }).await
        })
    }

    /// Copies `root`'s `nbytes` at `addr` into every rank's buffer.
    fn broadcast(&self, py: Python<'_>, addr: usize, nbytes: usize, root: usize) -> PyResult<()> {
        let b = Buffer::new(addr, nbytes, 1)?;
        self.run(py, async move |c: &mut Communicator| {
            // SAFETY: the module's buffer contract.
            c.broadcast(unsafe { b.slice::<u8>() }, root).await
        })
    }

    /// Runs the elastic agreement (`ringleader_protocol::Agree`,
    /// docs/book/src/reference/protocol.md *The elastic agreement*) over this ring with the GIL
    /// released: this rank last restored or started in `last_generation` (None for a joiner), had
    /// reached `step_reached` steps and holds commits at `commits` (ascending). Returns the same on
    /// every rank: `("fresh", group_step)` when no rank holds a commit, else
    /// `("restore", step, root, everyone_holds, group_step, holds)`, `holds` saying whether
    /// this rank holds the agreed commit as a holder (its own copy is the group's).
    #[pyo3(signature = (last_generation, step_reached, commits))]
    fn agree<'py>(
        &self,
        py: Python<'py>,
        last_generation: Option<u64>,
        step_reached: u64,
        commits: Vec<u64>,
    ) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        let holding = Holding {
            last_generation,
            step_reached,
            commits,
        };
        let mut outcome = None;
        let slot = &mut outcome;
        self.run(py, async move |c: &mut Communicator| {
            *slot = Some(c.agree(holding).await?);
            Ok(())
        })?;
        let (outcome, holds) = outcome.expect("the agreement ran to its outcome");
        match outcome {
            Outcome::Fresh { group_step } => ("fresh", group_step).into_pyobject(py),
            Outcome::Restore {
                step,
                root,
                everyone_holds,
                group_step,
            } => ("restore", step, root, everyone_holds, group_step, holds).into_pyobject(py),
        }
    }

    /// Returns once every rank has entered the barrier.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, async move |c: &mut Communicator| c.barrier().await)
    }

    /// Aborts the generation from any thread, even while an operation runs: it raises
    /// `Aborted` here, and the peers' operations raise `Aborted` (by this rank) too; an idle
    /// ring tells its peers at once.
    fn abort(&self, py: Python<'_>) {
        self.abort.abort();
        py.detach(|| {
            // Busy: the running operation sees the flag and relays the abort itself.
            if let Ok(mut g) = self.comm.try_lock() {
                if let Some(c) = g.as_mut() {
                    self.runtime.block_on(c.abort());
                }
            }
        });
    }

    /// Whether the ring failed or was aborted (every operation would raise).
    #[getter]
    fn failed(&self) -> bool {
        if self.abort.is_aborted() {
            return true;
        }
        match self.comm.try_lock() {
            Ok(g) => g.as_ref().is_none_or(|c| c.error().is_some()),
            // An operation is running: it has not failed yet.
            Err(_) => false,
        }
    }

    /// Closes the connections (after a failure, first relaying it to the peers, at most
    /// about a second). Waits for an operation in progress; `abort()` first to cut it.
    /// Idempotent; later operations raise `RingError("ring closed")`.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let comm = self.comm.lock().map_err(|_| ())?.take();
            if let Some(c) = comm {
                self.runtime.block_on(c.shutdown());
            }
            Ok::<(), ()>(())
        })
        .map_err(|()| poisoned())
    }

    fn __repr__(&self) -> String {
        format!(
            "Ring(rank={}, world={}, generation={}, shared_memory_links={}, network_links={})",
            self.rank, self.world, self.generation, self.shared_memory_links, self.network_links
        )
    }
}
