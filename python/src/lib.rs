//! `ringleader._native`: the native part of the Python package `ringleader` (`python/`).
//!
//! Its place: a rank written in Python prints the protocol's lines
//! (docs/book/src/reference/protocol.md) with `ringleader.metric` and `ringleader.report`; those
//! lines are made here, by the `ringleader-protocol` crate's
//! [`RankLine`](ringleader_protocol::RankLine) that the node parses them with, so Python and Rust
//! cannot drift apart. Everything else in the package (the HTTP client, params, the distributions)
//! is pure Python with the standard library only (`ringleader.torch`, the PyTorch backend, also
//! imports torch).
//!
//! The names of a rank's environment come from the same crate (`ringleader_protocol::env`,
//! here `JOB_ID_ENV`, `PARAMS_ENV`, …), so the package reads what the node writes.
//!
//! It also carries the data plane for Python: `Ring`, one rank of a `collective` group
//! (allreduce, reduce-scatter, allgather, broadcast, barrier on buffers given by address,
//! the GIL released for each transfer), which `ringleader.torch` builds its
//! `torch.distributed` backend on; `Listener` binds first for a store-based rendezvous; the
//! exceptions `RingError` and its subclasses carry the collective's typed reasons. Their
//! contract is the module doc of `python/src/ring.rs`.
//!
//! Contract of every formatter: the line it returns parses back, with the protocol crate's
//! `FromStr`, to the values given (a name with whitespace, an empty or too long name, or a
//! value that is not finite raises `ValueError` with the protocol's message instead).
//!
//! Built by maturin for wheels (`python/pyproject.toml`) and by `cargo build -p
//! ringleader-python` for the tests (`scripts/test.sh` copies the library next to the
//! package as `ringleader/_native.abi3.so`).

use pyo3::prelude::*;

mod ring;

#[pymodule]
mod _native {
    use pyo3::exceptions::PyValueError;
    use pyo3::prelude::*;
    use ringleader_protocol::{ElasticFailed, ElasticResumed, Metric, RankLine, RankStats, Report};

    #[pymodule_export]
    use crate::ring::{
        Aborted, HandshakeRefused, Listener, PeerLost, Ring, RingError, RingTimeout,
    };

    /// The package's version: the workspace's, the node binary's too.
    #[pymodule_export]
    const VERSION: &str = env!("CARGO_PKG_VERSION");
    /// The rank protocol's version this package speaks.
    #[pymodule_export]
    const PROTOCOL_VERSION: u32 = ringleader_protocol::PROTOCOL_VERSION;
    /// The protocol's golden lines (`protocol/golden/lines.txt`), for tests.
    #[pymodule_export]
    const GOLDEN_LINES: &str = ringleader_protocol::GOLDEN_LINES;

    /// The rank environment's names (`ringleader_protocol::env`), each as `<NAME>_ENV`
    /// (`JOB_ID_ENV == "RINGLEADER_JOB_ID"`, `PROTOCOL_VERSION_ENV`, …): the package reads
    /// a rank's environment with these, never with its own spelling.
    #[pymodule_init]
    fn init(module: &Bound<'_, PyModule>) -> PyResult<()> {
        for (constant, name) in ringleader_protocol::env::ALL {
            module.add(format!("{constant}_ENV"), *name)?;
        }
        Ok(())
    }

    /// `line` if it parses back to the same line, else `ValueError` with why.
    fn checked(line: RankLine) -> PyResult<String> {
        let text = line.to_string();
        match text.parse::<RankLine>() {
            Ok(back) if back == line => Ok(text),
            Ok(_) => Err(PyValueError::new_err(format!(
                "{text:?} does not read back as the values given"
            ))),
            Err(e) => Err(PyValueError::new_err(e.to_string())),
        }
    }

    /// `ringleader-metric NAME VALUE [STEP]`, without the newline.
    #[pyfunction]
    #[pyo3(signature = (name, value, step=None))]
    fn metric_line(name: String, value: f64, step: Option<u64>) -> PyResult<String> {
        checked(RankLine::Metric(Metric { name, value, step }))
    }

    /// `ringleader-report RESOURCE NAME VALUE [NAME VALUE …]`, without the newline.
    #[pyfunction]
    fn report_line(resource: u32, values: Vec<(String, f64)>) -> PyResult<String> {
        if values.is_empty() {
            return Err(PyValueError::new_err(
                "a report needs at least one NAME VALUE pair",
            ));
        }
        checked(RankLine::Report(Report { resource, values }))
    }

    /// `ringleader-rank-stats generation=G rank=R step=S compute_ms=X wait_ms=Y`.
    #[pyfunction]
    fn rank_stats_line(
        generation: u32,
        rank: u32,
        step: u64,
        compute_ms: f64,
        wait_ms: f64,
    ) -> PyResult<String> {
        // The protocol prints 3 decimals: round first, so the line reads back as given.
        let ms = |v: f64| (v * 1000.0).round() / 1000.0;
        checked(RankLine::RankStats(RankStats {
            generation,
            rank,
            step,
            compute_ms: ms(compute_ms),
            wait_ms: ms(wait_ms),
        }))
    }

    /// `ringleader-heartbeat computing_ms=X`.
    #[pyfunction]
    fn heartbeat_line(computing_ms: u64) -> PyResult<String> {
        checked(RankLine::Heartbeat { computing_ms })
    }

    /// `ringleader-ready` (a standby rank waits for its first generation).
    #[pyfunction]
    fn ready_line() -> PyResult<String> {
        checked(RankLine::Ready)
    }

    /// `ringleader-elastic failed generation=G lost_rank=R error="…"`.
    #[pyfunction]
    #[pyo3(signature = (generation, lost_rank, error))]
    fn elastic_failed_line(
        generation: u32,
        lost_rank: Option<u32>,
        error: String,
    ) -> PyResult<String> {
        checked(RankLine::ElasticFailed(ElasticFailed {
            generation,
            lost_rank,
            error,
        }))
    }

    /// `ringleader-elastic resumed generation=G world=N rank=R step=S restored_step=C
    /// steps_lost=L source=…`.
    #[pyfunction]
    #[allow(clippy::too_many_arguments)]
    fn elastic_resumed_line(
        generation: u32,
        world: u32,
        rank: u32,
        step: u64,
        restored_step: u64,
        steps_lost: u64,
        source: String,
    ) -> PyResult<String> {
        checked(RankLine::ElasticResumed(ElasticResumed {
            generation: Some(generation),
            world: Some(world),
            rank: Some(rank),
            step: Some(step),
            restored_step,
            steps_lost,
            source: Some(source),
        }))
    }

    /// The canonical form of a rank line (`ValueError` if it is not one): what the node
    /// reads from `line`.
    #[pyfunction]
    fn parse_rank_line(line: &str) -> PyResult<String> {
        line.parse::<RankLine>()
            .map(|l| l.to_string())
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}
