//! `collective-bench`: allreduce bandwidth and latency, one process per rank.
//!
//! ```text
//! collective-bench --world N --rank R --peers HOST:PORT,HOST:PORT,... [--sizes 4K,1M,64M] [--iters K] [--no-shm]
//! ```
//!
//! Each rank listens on its own entry of `--peers`. Rank 0 prints one line per size, in
//! nccl-tests conventions: `allreduce world=N size=BYTES time_ms=MEDIAN algbw_GBps=X
//! busbw_GBps=Y` with algbw = bytes / time and busbw = algbw · 2(N−1)/N (the flat ring's
//! factor, also for `--algo hierarchical`, so that the figures compare).
//!
//! With `--nccl [--device D]` (a build with feature `cuda`), the same group bootstraps NCCL
//! and the figures are those of an out-of-place NCCL allreduce of f32 on GPU D (default:
//! the rank): `gpu allreduce ranks=N size=BYTES time_ms=… algbw_GBps=… busbw_GBps=…`. With
//! one rank there are no peers: busbw is then reported equal to algbw, the rate at which the
//! GPU's memory moves the buffer through NCCL (a local figure, not a network one).

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Instant;

use clap::Parser;
use collective::{AllreduceChoice, Communicator, GroupConfig, Limits, NcclConfig, ReduceOp};

#[derive(Parser, Debug)]
#[command(about = "allreduce benchmark over the collective TCP data plane")]
struct Args {
    /// Number of ranks.
    #[arg(long)]
    world: usize,
    /// This process's rank.
    #[arg(long)]
    rank: usize,
    /// Data-plane address of every rank, comma separated (index = rank).
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Message sizes in bytes (suffixes K, M, G = KiB, MiB, GiB).
    #[arg(long, value_delimiter = ',', default_value = "4K,64K,1M,16M,64M")]
    sizes: Vec<String>,
    /// Timed iterations per size (the median is printed).
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed iterations per size before timing.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Algorithm: auto (by size and placement), ring (the flat ring at every size), rd
    /// (recursive doubling), or hierarchical (at every size; ranks grouped by the IPs of
    /// `--peers`).
    #[arg(long, default_value = "auto")]
    algo: String,
    /// Ring pipelining granularity, bytes (default: the library's).
    #[arg(long)]
    chunk_bytes: Option<usize>,
    /// Frames read ahead per link (default: the library's).
    #[arg(long)]
    read_ahead_frames: Option<usize>,
    /// Socket buffer size, bytes (default: kernel autotuning).
    #[arg(long)]
    socket_buffer_bytes: Option<usize>,
    /// Runtime worker threads (1 = a current-thread runtime). With 2 or more, each link's
    /// reading task runs beside the operation that sends and reduces.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Keep every link's data on TCP, even between ranks on this host (default: shared
    /// memory between same-host ranks).
    #[arg(long)]
    no_shm: bool,
    /// Benchmark NCCL on the GPU instead of the TCP data plane (needs feature `cuda`).
    #[arg(long)]
    nccl: bool,
    /// GPU of this rank with `--nccl` (default: the rank).
    #[arg(long)]
    device: Option<usize>,
    /// Shared secret of the group.
    #[arg(long, default_value = "collective-bench")]
    secret: String,
}

fn parse_size(s: &str) -> anyhow_free::Result<usize> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let mul = match s[i..].to_ascii_uppercase().as_str() {
                "K" | "KB" | "KIB" => 1 << 10,
                "M" | "MB" | "MIB" => 1 << 20,
                "G" | "GB" | "GIB" => 1 << 30,
                "B" => 1,
                other => return Err(format!("unknown size suffix {other:?}")),
            };
            (&s[..i], mul)
        }
        None => (s, 1),
    };
    let n: usize = num.parse().map_err(|e| format!("size {s:?}: {e}"))?;
    Ok(n * mul)
}

mod anyhow_free {
    pub type Result<T> = std::result::Result<T, String>;
}

fn resolve(s: &str) -> anyhow_free::Result<SocketAddr> {
    s.to_socket_addrs()
        .map_err(|e| format!("address {s:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("address {s:?} does not resolve"))
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("collective-bench: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> anyhow_free::Result<()> {
    let addrs = args
        .peers
        .iter()
        .map(|p| resolve(p))
        .collect::<anyhow_free::Result<Vec<_>>>()?;
    let sizes = args
        .sizes
        .iter()
        .map(|s| parse_size(s))
        .collect::<anyhow_free::Result<Vec<_>>>()?;
    let mut limits = Limits {
        connect_timeout_ms: 60_000,
        op_timeout_ms: 300_000,
        socket_buffer_bytes: args.socket_buffer_bytes,
        shared_memory: !args.no_shm,
        ..Limits::default()
    };
    if let Some(r) = args.read_ahead_frames {
        limits.read_ahead_frames = r;
    }
    if let Some(c) = args.chunk_bytes {
        limits.chunk_bytes = c;
        limits.frame_bytes_max = limits.frame_bytes_max.max(c);
    }
    match args.algo.as_str() {
        "auto" => {}
        "ring" => {
            limits.small_bytes_max = 0;
            limits.allreduce = AllreduceChoice::Ring;
        }
        "hierarchical" => {
            limits.small_bytes_max = 0;
            limits.allreduce = AllreduceChoice::Hierarchical;
        }
        "rd" => limits.small_bytes_max = sizes.iter().copied().max().unwrap_or(0),
        other => return Err(format!("unknown --algo {other:?}")),
    }
    let cfg = GroupConfig {
        rank: args.rank,
        world: args.world,
        group_id: 0xbe_9c,
        generation: 0,
        addrs,
        secret: args.secret.clone().into_bytes(),
        limits,
    };
    let rt = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    }
    .map_err(|e| e.to_string())?;
    if args.nccl {
        let device = args.device.unwrap_or(args.rank);
        // The runtime keeps running the watchdog while this thread drives the GPU.
        let comm = rt
            .block_on(async {
                let group = Communicator::connect(cfg).await?;
                group.nccl(device, NcclConfig::default()).await
            })
            .map_err(|e| e.to_string())?;
        return gpu::bench(&comm, &args, &sizes);
    }
    rt.block_on(async move {
        let mut comm = Communicator::connect(cfg)
            .await
            .map_err(|e| e.to_string())?;
        let r = bench(&mut comm, &args, &sizes).await;
        if r.is_err() {
            // Let the peers learn the cause before this process exits.
            comm.shutdown().await;
        }
        r
    })
}

async fn bench(comm: &mut Communicator, args: &Args, sizes: &[usize]) -> anyhow_free::Result<()> {
    let max = sizes.iter().copied().max().unwrap_or(0);
    let mut buf = vec![1.0f32; max / 4];
    for &size in sizes {
        let n = size / 4;
        let b = &mut buf[..n];
        comm.barrier().await.map_err(|e| e.to_string())?;
        for _ in 0..args.warmup {
            comm.allreduce(b, ReduceOp::Sum)
                .await
                .map_err(|e| e.to_string())?;
            b.fill(1.0);
        }
        let mut times = Vec::with_capacity(args.iters);
        for _ in 0..args.iters.max(1) {
            let t0 = Instant::now();
            comm.allreduce(b, ReduceOp::Sum)
                .await
                .map_err(|e| e.to_string())?;
            times.push(t0.elapsed().as_secs_f64());
        }
        // Every element went through the same reductions: they must all be equal.
        if !b.iter().all(|x| *x == b[0]) {
            return Err("allreduce results differ within the buffer".into());
        }
        b.fill(1.0);
        times.sort_by(|a, b| a.total_cmp(b));
        let med = times[times.len() / 2];
        let bytes = (n * 4) as f64;
        let algbw = bytes / med / 1e9;
        let w = args.world as f64;
        let busbw = algbw * 2.0 * (w - 1.0) / w;
        if args.rank == 0 {
            println!(
                "allreduce world={} size={} time_ms={:.4} algbw_GBps={:.4} busbw_GBps={:.4} shm_links={}",
                args.world,
                n * 4,
                med * 1e3,
                algbw,
                busbw,
                comm.shared_memory_links()
            );
        }
    }
    comm.barrier().await.map_err(|e| e.to_string())
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::time::Instant;

    use collective::{NcclCommunicator, ReduceOp};

    use crate::{anyhow_free, Args};

    /// Out-of-place f32 sum of every size; rank 0 prints one `gpu allreduce` line per size.
    pub fn bench(comm: &NcclCommunicator, args: &Args, sizes: &[usize]) -> anyhow_free::Result<()> {
        let s = comm.stream();
        let cuda = |e: cudarc::driver::DriverError| format!("cuda: {e:?}");
        let w = comm.world();
        for &size in sizes {
            let n = (size / 4).max(1);
            let send = s.clone_htod(&vec![1.0f32; n]).map_err(cuda)?;
            let mut recv = s.alloc_zeros::<f32>(n).map_err(cuda)?;
            for _ in 0..args.warmup {
                comm.allreduce_into(&send, &mut recv, ReduceOp::Sum)
                    .map_err(|e| e.to_string())?;
            }
            let mut times = Vec::with_capacity(args.iters);
            for _ in 0..args.iters.max(1) {
                let t0 = Instant::now();
                comm.allreduce_into(&send, &mut recv, ReduceOp::Sum)
                    .map_err(|e| e.to_string())?;
                times.push(t0.elapsed().as_secs_f64());
            }
            let got = s.clone_dtoh(&recv).map_err(cuda)?;
            if got.iter().any(|x| *x != w as f32) {
                return Err(format!("allreduce of ones over {w} ranks is not {w}"));
            }
            times.sort_by(|a, b| a.total_cmp(b));
            let med = times[times.len() / 2];
            let bytes = (n * 4) as f64;
            let algbw = bytes / med / 1e9;
            // One rank: no peers, so the local rate stands in for the bus rate.
            let busbw = if w == 1 {
                algbw
            } else {
                algbw * 2.0 * (w as f64 - 1.0) / w as f64
            };
            if comm.rank() == 0 {
                println!(
                    "gpu allreduce ranks={w} size={} time_ms={:.4} algbw_GBps={:.4} busbw_GBps={:.4}",
                    n * 4,
                    med * 1e3,
                    algbw,
                    busbw
                );
            }
        }
        Ok(())
    }
}

#[cfg(not(feature = "cuda"))]
mod gpu {
    use collective::NcclCommunicator;

    use crate::{anyhow_free, Args};

    pub fn bench(_: &NcclCommunicator, _: &Args, _: &[usize]) -> anyhow_free::Result<()> {
        // Not reached: Communicator::nccl returns NotBuiltWithCuda first.
        Err("built without the cuda feature".into())
    }
}
