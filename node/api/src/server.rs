//! The API's HTTP server: its own accept loop in front of the axum router, so hostile or
//! broken clients cannot take the node's API (or its file descriptors) away.
//!
//! Per connection, in order:
//! 0. **TLS.** A connection that did not arrive on a loopback address does the TLS handshake
//!    first (within [`TLS_HANDSHAKE_TIMEOUT_MS`]), when the node has a key: a token is a
//!    shell on every node and never crosses a network in clear. The certificate's key is
//!    derived from the cluster key, so clients pin it by the fingerprint `api.token`
//!    carries ([`crate::security::tls`]). `--api-tls on|off|auto` (hidden) overrides.
//! 1. **Connection caps.** At most [`ApiLimits::api_connections_max`] connections in all and
//!    [`ApiLimits::api_connections_per_ip_max`] from one IP. A connection beyond a cap first
//!    evicts the longest-silent *idle* connection (no request being answered) of that IP, or
//!    of all; when every connection is busy it gets a `503` written without waiting and is
//!    closed. The listener thus keeps draining its backlog and the process never runs out of
//!    descriptors (the total cap is also held at half the soft `RLIMIT_NOFILE`, which the
//!    server first raises to the hard limit), and an idle-connection flood cannot keep
//!    `/healthz` out: each new connection pushes an idle one out.
//! 2. **Timeouts.** A request's head must arrive within
//!    [`ApiLimits::api_header_read_timeout_ms`] (slow-loris); a connection that moves no
//!    byte for [`ApiLimits::api_idle_timeout_ms`] while no request is being answered is
//!    closed; a request body must arrive within [`ApiLimits::api_body_read_timeout_ms`]. A
//!    response being computed or written is never cut.
//! 3. **Sizes.** A request head is at most [`ApiLimits::api_header_bytes_max`] (`431`
//!    beyond); bodies are capped by the router (`DefaultBodyLimit`, `SPEC_BYTES_MAX`).
//! 4. **Rate.** Each peer IP has a token bucket of [`ApiLimits::api_requests_burst`]
//!    requests refilled at [`ApiLimits::api_requests_per_s`]; an empty bucket answers `429`.
//!    Then the node's own budget ([`super::budget`]), whatever the addresses requests come
//!    from: [`ApiLimits::api_requests_total_per_s`] in all (`429`) and at most
//!    [`ApiLimits::api_requests_in_flight_max`] being answered at once (`503`).
//! 5. **Names.** `Host` and `Origin` must be the node's own ([`super::origin`]): `403`.
//! 6. The router: the token check ([`super::auth`]), then the handlers.
//!
//! HTTP/1.1 only (every client of ours, and browsers, speak it).
//!
//! The limits' defaults are far above what a 128-node local cluster, the CLI's polling
//! (`job --watch`, `logs --follow`: one request per 500 ms) and the benchmarks make, and
//! each has a hidden `ringleader node` flag so tests can set it low.

use std::{
    collections::HashMap,
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::{
    body::Body,
    http::{header, HeaderValue, Request, Response, StatusCode},
    Router,
};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::Notify,
};
use tracing::{debug, info, warn};

use super::budget::TokenBucket;
use super::origin::HostNames;
use crate::{
    cluster::identity::ClusterKey,
    security::tls::{ApiTls, ApiTlsMode, TlsError, TLS_HANDSHAKE_TIMEOUT_MS},
};

/// Default [`ApiLimits::api_connections_max`]: half of the common 1,024-descriptor soft
/// limit, leaving the other half to libp2p, Raft's files, the data plane and job pipes. A
/// 128-node local cluster's tests and CLI hold a handful of connections per node.
pub const API_CONNECTIONS_MAX: u16 = 512;
/// Default [`ApiLimits::api_connections_per_ip_max`]: half the total, so one host cannot
/// hold every slot; a browser holds at most 6 per host, a poller 1.
pub const API_CONNECTIONS_PER_IP_MAX: u16 = 256;
/// Default [`ApiLimits::api_header_read_timeout_ms`]: a request head (at most
/// [`API_HEADER_BYTES_MAX`]) arrives in well under this on any working link.
pub const API_HEADER_READ_TIMEOUT_MS: u32 = 10_000;
/// Default [`ApiLimits::api_idle_timeout_ms`]: longer than the CLI's 500 ms polling period
/// (its kept-alive connection stays), short enough that silent connections free their slot.
pub const API_IDLE_TIMEOUT_MS: u32 = 30_000;
/// Default [`ApiLimits::api_body_read_timeout_ms`]: a largest spec (256 KiB) at 10 KB/s.
pub const API_BODY_READ_TIMEOUT_MS: u32 = 30_000;
/// Default [`ApiLimits::api_header_bytes_max`]: the request line and headers, bytes; a
/// browser's cookies for `localhost` (other local apps') fit, a header flood does not.
pub const API_HEADER_BYTES_MAX: u32 = 32 * 1024;
/// Default [`ApiLimits::api_requests_per_s`]: per peer IP; a 128-node local cluster polled
/// by tests every 50 ms makes 20 per node per poller, all from 127.0.0.1.
pub const API_REQUESTS_PER_S: u16 = 500;
/// Default [`ApiLimits::api_requests_burst`]: requests a peer IP may make at once after a
/// quiet spell (a dashboard's first load, a test polling every node).
pub const API_REQUESTS_BURST: u16 = 1_000;
/// Most peer IPs whose rate buckets are kept; beyond, full buckets (peers quiet long
/// enough) are forgotten first, then all (the connection caps still hold).
pub const RATE_IPS_MAX: usize = 4_096;
/// Pause after a failed `accept` (out of descriptors, say), in milliseconds, so the loop
/// does not spin while the cause lasts.
const ACCEPT_ERROR_PAUSE_MS: u64 = 100;
/// Smallest read buffer hyper accepts, bytes (its `max_buf_size` minimum).
const HYPER_BUF_BYTES_MIN: usize = 8_192;

/// The API server's limits and extra names (`ringleader node` flags; the limits are hidden,
/// for tests and unusual deployments). Counts are `u16` and times `u32` to keep `NodeArgs`
/// small (clap refuses values out of range).
#[derive(clap::Args, Clone, Debug)]
pub struct ApiLimits {
    /// Another name clients reach the API by (a DNS name, a reverse proxy's `name` or
    /// `name:port`); repeatable. Requests whose Host or Origin is not one of the node's
    /// names (localhost, its IPs, its host name, these) are refused.
    #[arg(long = "api-host", value_name = "NAME")]
    pub api_hosts: Vec<String>,
    /// Most API connections open at once (held at half the descriptor limit).
    #[arg(long, hide = true, default_value_t = API_CONNECTIONS_MAX)]
    pub api_connections_max: u16,
    /// Most API connections open at once from one IP.
    #[arg(long, hide = true, default_value_t = API_CONNECTIONS_PER_IP_MAX)]
    pub api_connections_per_ip_max: u16,
    /// A request head must arrive within this, milliseconds.
    #[arg(long, hide = true, default_value_t = API_HEADER_READ_TIMEOUT_MS)]
    pub api_header_read_timeout_ms: u32,
    /// A connection silent this long while no request is answered is closed, milliseconds.
    #[arg(long, hide = true, default_value_t = API_IDLE_TIMEOUT_MS)]
    pub api_idle_timeout_ms: u32,
    /// A request body must arrive within this of its head, milliseconds.
    #[arg(long, hide = true, default_value_t = API_BODY_READ_TIMEOUT_MS)]
    pub api_body_read_timeout_ms: u32,
    /// Largest request head (request line and headers), bytes.
    #[arg(long, hide = true, default_value_t = API_HEADER_BYTES_MAX)]
    pub api_header_bytes_max: u32,
    /// Requests per second one IP may make, sustained (0: no limit).
    #[arg(long, hide = true, default_value_t = API_REQUESTS_PER_S)]
    pub api_requests_per_s: u16,
    /// Requests one IP may make at once.
    #[arg(long, hide = true, default_value_t = API_REQUESTS_BURST)]
    pub api_requests_burst: u16,
    /// Requests per second the node answers from all peers together (0: no limit).
    #[arg(long, hide = true, default_value_t = super::budget::API_REQUESTS_TOTAL_PER_S)]
    pub api_requests_total_per_s: u16,
    /// Requests the node answers at once from all peers together after a quiet spell.
    #[arg(long, hide = true, default_value_t = super::budget::API_REQUESTS_TOTAL_BURST)]
    pub api_requests_total_burst: u16,
    /// Most requests being answered at once (0: no limit).
    #[arg(long, hide = true, default_value_t = super::budget::API_REQUESTS_IN_FLIGHT_MAX)]
    pub api_requests_in_flight_max: u16,
    /// When the API speaks TLS: auto (every connection not on a loopback address, when the
    /// node has a cluster key), on (loopback too), off (never).
    #[arg(long, hide = true, value_enum, default_value_t = ApiTlsMode::Auto)]
    pub api_tls: ApiTlsMode,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            api_hosts: Vec::new(),
            api_connections_max: API_CONNECTIONS_MAX,
            api_connections_per_ip_max: API_CONNECTIONS_PER_IP_MAX,
            api_header_read_timeout_ms: API_HEADER_READ_TIMEOUT_MS,
            api_idle_timeout_ms: API_IDLE_TIMEOUT_MS,
            api_body_read_timeout_ms: API_BODY_READ_TIMEOUT_MS,
            api_header_bytes_max: API_HEADER_BYTES_MAX,
            api_requests_per_s: API_REQUESTS_PER_S,
            api_requests_burst: API_REQUESTS_BURST,
            api_requests_total_per_s: super::budget::API_REQUESTS_TOTAL_PER_S,
            api_requests_total_burst: super::budget::API_REQUESTS_TOTAL_BURST,
            api_requests_in_flight_max: super::budget::API_REQUESTS_IN_FLIGHT_MAX,
            api_tls: ApiTlsMode::Auto,
        }
    }
}

/// Token buckets per peer IP, at most [`RATE_IPS_MAX`] of them.
#[derive(Debug)]
pub struct RateLimiter {
    rate_per_s: u32,
    burst: u32,
    buckets: HashMap<IpAddr, TokenBucket>,
}

impl RateLimiter {
    /// `rate_per_s` requests per second and `burst` at once per IP; `rate_per_s` 0: none.
    pub fn new(rate_per_s: u32, burst: u32) -> Self {
        RateLimiter {
            rate_per_s,
            burst: burst.max(1),
            buckets: HashMap::new(),
        }
    }

    /// Whether `ip` may make a request at `now_ms` (and takes its token).
    pub fn allow(&mut self, ip: IpAddr, now_ms: u64) -> bool {
        if self.rate_per_s == 0 {
            return true;
        }
        let (rate, burst) = (self.rate_per_s, self.burst);
        if !self.buckets.contains_key(&ip) && self.buckets.len() >= RATE_IPS_MAX {
            self.buckets.retain(|_, b| !b.is_full(now_ms, rate, burst));
            if self.buckets.len() >= RATE_IPS_MAX {
                self.buckets.clear();
            }
        }
        self.buckets
            .entry(ip)
            .or_insert_with(|| TokenBucket::full(burst, now_ms))
            .take(now_ms, rate, burst)
    }
}

/// What the server knows of one open connection.
#[derive(Debug)]
struct ConnState {
    id: u64,
    ip: IpAddr,
    /// When a byte last moved either way, ms since the server started.
    last_io_ms: AtomicU64,
    /// Requests received and not yet answered to the last byte.
    in_flight: AtomicUsize,
    /// Of those, the ones whose body is still arriving (they count as idle: the client,
    /// not the node, is the one to act).
    receiving: AtomicUsize,
    /// Told when the connection is evicted.
    evict: Notify,
}

impl ConnState {
    /// No request is being computed or written: the connection may be closed.
    fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) <= self.receiving.load(Ordering::Acquire)
    }
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Full {
    /// [`ApiLimits::api_connections_per_ip_max`] busy connections from this IP.
    PerIp,
    /// [`ApiLimits::api_connections_max`] busy connections in all.
    Total,
}

/// The open connections, counted in all and per IP.
#[derive(Debug, Default)]
struct ConnTable {
    next_id: u64,
    conns: HashMap<u64, Arc<ConnState>>,
    per_ip: HashMap<IpAddr, usize>,
}

impl ConnTable {
    /// Admits a connection from `ip` at `now_ms`, evicting the longest-silent idle one (of
    /// `ip`, then of all) where a cap is reached.
    fn admit(
        &mut self,
        ip: IpAddr,
        now_ms: u64,
        total_max: usize,
        per_ip_max: usize,
    ) -> Result<Arc<ConnState>, Full> {
        if self.per_ip.get(&ip).copied().unwrap_or(0) >= per_ip_max && !self.evict_one(Some(ip)) {
            return Err(Full::PerIp);
        }
        if self.conns.len() >= total_max && !self.evict_one(None) {
            return Err(Full::Total);
        }
        self.next_id += 1;
        let state = Arc::new(ConnState {
            id: self.next_id,
            ip,
            last_io_ms: AtomicU64::new(now_ms),
            in_flight: AtomicUsize::new(0),
            receiving: AtomicUsize::new(0),
            evict: Notify::new(),
        });
        self.conns.insert(state.id, state.clone());
        *self.per_ip.entry(ip).or_default() += 1;
        Ok(state)
    }

    /// Evicts the longest-silent idle connection (of `ip`, or of all); whether there was one.
    fn evict_one(&mut self, ip: Option<IpAddr>) -> bool {
        let victim = self
            .conns
            .values()
            .filter(|c| ip.is_none_or(|ip| c.ip == ip) && c.idle())
            .min_by_key(|c| c.last_io_ms.load(Ordering::Relaxed))
            .map(|c| c.id);
        match victim.and_then(|id| self.remove(id)) {
            Some(c) => {
                c.evict.notify_one();
                true
            }
            None => false,
        }
    }

    /// Forgets connection `id` (closed, or evicted).
    fn remove(&mut self, id: u64) -> Option<Arc<ConnState>> {
        let c = self.conns.remove(&id)?;
        if let Some(n) = self.per_ip.get_mut(&c.ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&c.ip);
            }
        }
        Some(c)
    }
}

/// What every connection task shares.
struct Shared {
    epoch: Instant,
    limits: ApiLimits,
    /// The total cap in force: the configured one, held at half the descriptor limit.
    connections_max: usize,
    names: HostNames,
    table: Mutex<ConnTable>,
    rate: Mutex<RateLimiter>,
    /// The node's own budget, beside each IP's.
    budget: super::budget::ApiBudget,
    app: Router,
    /// The API's TLS, when some connections speak it ([`tls_for`]).
    tls: Option<Arc<ApiTls>>,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

/// A socket that records when a byte last moved.
struct ActivityIo {
    inner: TcpStream,
    conn: Arc<ConnState>,
    epoch: Instant,
}

impl ActivityIo {
    fn touch(&self) {
        self.conn
            .last_io_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl AsyncRead for ActivityIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl AsyncWrite for ActivityIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Counts a request in flight from its head until its response's last byte (or until the
/// response is dropped), so an answer being written is never cut as idle.
struct InFlight(Arc<ConnState>);

impl InFlight {
    fn new(conn: Arc<ConnState>) -> Self {
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(conn)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts a request body as arriving until its end (or until it is dropped).
struct Receiving(Arc<ConnState>);

impl Drop for Receiving {
    fn drop(&mut self) {
        self.0.receiving.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request body that must arrive by a deadline, and that marks its end.
struct RequestBody {
    inner: Incoming,
    receiving: Option<Receiving>,
    deadline: Instant,
}

/// A request body arrived too slowly.
#[derive(Debug, thiserror::Error)]
#[error("request body not received within {0} ms")]
struct BodyTimeout(u64);

impl hyper::body::Body for RequestBody {
    type Data = hyper::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if Instant::now() > self.deadline {
            self.receiving = None;
            let ms = self.deadline.elapsed().as_millis() as u64;
            return Poll::Ready(Some(Err(Box::new(BodyTimeout(ms)))));
        }
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(r, Poll::Ready(None | Some(Err(_)))) || self.inner.is_end_stream() {
            self.receiving = None;
        }
        r.map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps its request counted in flight until it is sent or dropped.
struct ResponseBody {
    inner: Body,
    _in_flight: InFlight,
    /// The request's place in the node's budget, until its answer is written.
    _budget: Option<super::budget::InFlight>,
}

impl hyper::body::Body for ResponseBody {
    type Data = hyper::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The IP a request came from, in its extensions (the caps per peer of the bodied routes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIp(pub IpAddr);

/// A JSON error answer `{"error": …, "reason": …}` that closes nothing.
fn refusal(code: StatusCode, error: &str, reason: &str) -> Response<Body> {
    let body = serde_json::json!({ "error": error, "reason": reason }).to_string();
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Answers one request: rate, names, then the router.
async fn handle(
    shared: Arc<Shared>,
    conn: Arc<ConnState>,
    local: IpAddr,
    req: Request<Incoming>,
) -> Response<ResponseBody> {
    let in_flight = InFlight::new(conn.clone());
    conn.receiving.fetch_add(1, Ordering::AcqRel);
    let receiving = Receiving(conn.clone());
    let allowed = shared
        .rate
        .lock()
        .expect("rate limiter lock")
        .allow(conn.ip, shared.now_ms());
    let budget = if allowed {
        Some(shared.budget.admit(shared.now_ms()))
    } else {
        None
    };
    let mut held = None;
    let resp = if let Some(Err(over)) = budget {
        debug!(peer = %conn.ip, "request refused: {over}");
        let code = match over {
            super::budget::OverBudget::Rate { .. } => StatusCode::TOO_MANY_REQUESTS,
            super::budget::OverBudget::Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
        };
        let mut resp = refusal(code, &over.to_string(), "budget");
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        resp
    } else if !allowed {
        let l = &shared.limits;
        let mut resp = refusal(
            StatusCode::TOO_MANY_REQUESTS,
            &format!(
                "too many requests from {}: at most {} per second (bursts of {})",
                conn.ip, l.api_requests_per_s, l.api_requests_burst
            ),
            "rate",
        );
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        resp
    } else {
        let text = |name: header::HeaderName| {
            req.headers()
                .get(name)
                .map(|v| v.to_str().unwrap_or("\u{fffd}").to_owned())
        };
        let (host, origin) = (text(header::HOST), text(header::ORIGIN));
        let authority = req.uri().authority().map(|a| a.as_str().to_owned());
        match shared.names.check(
            host.as_deref(),
            authority.as_deref(),
            origin.as_deref(),
            Some(local),
        ) {
            Err(refused) => {
                debug!(peer = %conn.ip, reason = refused.reason(), "request refused: {refused}");
                refusal(
                    StatusCode::FORBIDDEN,
                    &refused.to_string(),
                    refused.reason(),
                )
            }
            Ok(()) => {
                held = budget.and_then(Result::ok);
                let deadline = Instant::now()
                    + Duration::from_millis(u64::from(shared.limits.api_body_read_timeout_ms));
                let mut req = req.map(|inner| {
                    Body::new(RequestBody {
                        inner,
                        receiving: Some(receiving),
                        deadline,
                    })
                });
                req.extensions_mut().insert(PeerIp(conn.ip));
                match tower::ServiceExt::oneshot(shared.app.clone(), req).await {
                    Ok(resp) => resp,
                    Err(never) => match never {},
                }
            }
        }
    };
    resp.map(|inner| ResponseBody {
        inner,
        _in_flight: in_flight,
        _budget: held,
    })
}

/// What is written, without waiting, to a connection refused at a cap before closing it.
const FULL_ANSWER: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 39\r\nretry-after: 1\r\nconnection: close\r\n\r\n{\"error\":\"too many connections, retry\"}";

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (cheap, and what a server with many
/// peers wants); returns the soft limit in force after.
pub fn raise_fd_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    Some(lim.rlim_cur)
}

/// The API's TLS for a node with cluster key `key` whose API is bound on `bind` and
/// advertised as `advertised`: `None` when no connection would speak it (no key, `--api-tls
/// off`, or `auto` on a loopback address). The certificate names localhost, the loopback
/// addresses, `bind`'s and `advertised`'s IPs, the host name and `--api-host`s.
pub fn tls_for(
    key: Option<&ClusterKey>,
    limits: &ApiLimits,
    bind: SocketAddr,
    advertised: SocketAddr,
) -> Result<Option<Arc<ApiTls>>, TlsError> {
    let Some(key) = key else { return Ok(None) };
    let speaks = match limits.api_tls {
        ApiTlsMode::Off => false,
        ApiTlsMode::On => true,
        // An unspecified address (0.0.0.0) takes connections from beyond loopback too.
        ApiTlsMode::Auto => !crate::security::tls::is_loopback(bind.ip()),
    };
    if !speaks {
        return Ok(None);
    }
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    for ip in [bind.ip(), advertised.ip()] {
        if !ip.is_unspecified() {
            names.push(ip.to_string());
        }
    }
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    names.push(hostname.trim().to_string());
    names.extend(limits.api_hosts.iter().map(|h| {
        // `name:port` names a proxy's port; the certificate names hosts.
        match h.rsplit_once(':') {
            Some((host, port)) if port.parse::<u16>().is_ok() && !host.contains(':') => {
                host.to_string()
            }
            _ => h.clone(),
        }
    }));
    // Names a certificate cannot carry (not DNS syntax) are left out: our clients check the
    // key, not the names.
    names.retain(|n| {
        !n.is_empty()
            && (n.parse::<IpAddr>().is_ok()
                || n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'))
    });
    let tls = ApiTls::new(key, &names)?;
    info!(fingerprint = %tls.fingerprint(), mode = ?limits.api_tls, "API speaks TLS beyond loopback");
    Ok(Some(Arc::new(tls)))
}

/// Serves `app` on `listener` until the task is dropped. `advertised`: the address the node
/// tells others (one of its names). `tls`: the API's TLS ([`tls_for`]), spoken on the
/// connections [`ApiLimits::api_tls`] says. Each connection runs in `tasks` (the node stops
/// them with the API).
pub async fn serve(
    tasks: crate::tasks::Tasks,
    listener: TcpListener,
    app: Router,
    limits: ApiLimits,
    advertised: SocketAddr,
    tls: Option<Arc<ApiTls>>,
) -> std::io::Result<()> {
    let bind = listener.local_addr()?;
    let fd_limit = raise_fd_limit();
    let connections_max = match fd_limit {
        Some(n) => (limits.api_connections_max as usize)
            .min(usize::try_from(n / 2).unwrap_or(usize::MAX))
            .max(1),
        None => (limits.api_connections_max as usize).max(1),
    };
    let hostname = tokio::fs::read_to_string("/proc/sys/kernel/hostname")
        .await
        .unwrap_or_default();
    info!(
        api = %bind,
        connections_max,
        fd_limit = fd_limit.unwrap_or(0),
        names = ?limits.api_hosts,
        "API server started"
    );
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(Duration::from_millis(u64::from(
            limits.api_header_read_timeout_ms.max(1),
        )))
        .max_header_size(limits.api_header_bytes_max as usize)
        .max_buf_size(
            (limits.api_header_bytes_max as usize)
                .max(HYPER_BUF_BYTES_MIN)
                .max(64 * 1024),
        );
    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        names: HostNames::new(bind, advertised, &hostname, &limits.api_hosts),
        rate: Mutex::new(RateLimiter::new(
            u32::from(limits.api_requests_per_s),
            u32::from(limits.api_requests_burst),
        )),
        table: Mutex::new(ConnTable::default()),
        budget: super::budget::ApiBudget::new(
            u32::from(limits.api_requests_total_per_s),
            u32::from(limits.api_requests_total_burst),
            usize::from(limits.api_requests_in_flight_max),
            0,
        ),
        connections_max,
        limits,
        app,
        tls,
    });
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                warn!("API accept failed: {e}; pausing {ACCEPT_ERROR_PAUSE_MS} ms");
                tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
                continue;
            }
        };
        let admitted = shared.table.lock().expect("connection table lock").admit(
            peer.ip(),
            shared.now_ms(),
            shared.connections_max,
            (shared.limits.api_connections_per_ip_max as usize).max(1),
        );
        let conn = match admitted {
            Ok(conn) => conn,
            Err(full) => {
                debug!(peer = %peer, ?full, "API connection refused: at the cap");
                // A TLS client would read the plain answer as a broken handshake: it only
                // sees the connection close.
                let local = stream.local_addr().map(|a| a.ip()).unwrap_or(bind.ip());
                if shared.tls.is_none() || !shared.limits.api_tls.applies_to(local) {
                    let _ = stream.try_write(FULL_ANSWER);
                }
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr().map(|a| a.ip()).unwrap_or(bind.ip());
        tasks.spawn(run_connection(
            shared.clone(),
            builder.clone(),
            stream,
            conn,
            local,
        ));
    }
}

/// Runs one connection: the TLS handshake where it applies, then [`drive`]; forgets the
/// connection when it ends.
async fn run_connection(
    shared: Arc<Shared>,
    builder: hyper::server::conn::http1::Builder,
    stream: TcpStream,
    conn: Arc<ConnState>,
    local: IpAddr,
) {
    let io = ActivityIo {
        inner: stream,
        conn: conn.clone(),
        epoch: shared.epoch,
    };
    let tls = shared
        .tls
        .as_ref()
        .filter(|_| shared.limits.api_tls.applies_to(local));
    match tls {
        None => drive(&shared, builder, io, &conn, local).await,
        Some(tls) => {
            // The handshake counts as idle: a new connection beyond a cap may evict it.
            let handshake = tokio::time::timeout(
                Duration::from_millis(TLS_HANDSHAKE_TIMEOUT_MS),
                tls.acceptor().accept(io),
            );
            tokio::select! {
                res = handshake => match res {
                    Ok(Ok(stream)) => drive(&shared, builder, stream, &conn, local).await,
                    Ok(Err(e)) => debug!(peer = %conn.ip, "API TLS handshake failed: {e}"),
                    Err(_) => debug!(
                        peer = %conn.ip,
                        timeout_ms = TLS_HANDSHAKE_TIMEOUT_MS,
                        "API TLS handshake timed out"
                    ),
                },
                _ = conn.evict.notified() => {
                    debug!(peer = %conn.ip, "API connection evicted during its TLS handshake");
                }
            }
        }
    }
    shared
        .table
        .lock()
        .expect("connection table lock")
        .remove(conn.id);
}

/// Serves HTTP on one connection (plain or TLS) until it ends, is evicted, or stays idle
/// too long.
async fn drive<I>(
    shared: &Arc<Shared>,
    builder: hyper::server::conn::http1::Builder,
    io: I,
    conn: &Arc<ConnState>,
    local: IpAddr,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = {
        let (shared, conn) = (shared.clone(), conn.clone());
        hyper::service::service_fn(move |req| {
            let (shared, conn) = (shared.clone(), conn.clone());
            async move { Ok::<_, Infallible>(handle(shared, conn, local, req).await) }
        })
    };
    let served = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(served);
    let idle_ms = u64::from(shared.limits.api_idle_timeout_ms.max(1));
    loop {
        let silent_ms = shared
            .now_ms()
            .saturating_sub(conn.last_io_ms.load(Ordering::Relaxed));
        if conn.idle() && silent_ms >= idle_ms {
            debug!(peer = %conn.ip, silent_ms, "API connection idle: closed");
            break;
        }
        // Next look: when it would be idle long enough, or a quarter period on while busy.
        let wait_ms = idle_ms.saturating_sub(silent_ms).max(idle_ms / 4).max(1);
        tokio::select! {
            res = served.as_mut() => {
                if let Err(e) = res {
                    debug!(peer = %conn.ip, "API connection ended: {e}");
                }
                break;
            }
            _ = conn.evict.notified() => {
                if conn.idle() {
                    debug!(peer = %conn.ip, "API connection evicted for a new one");
                    break;
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let mut b = TokenBucket::full(3, 0);
        assert!((0..3).all(|_| b.take(0, 10, 3)));
        assert!(!b.take(0, 10, 3), "the burst is spent");
        assert!(!b.take(50, 10, 3), "half a token after 50 ms at 10/s");
        assert!(b.take(100, 10, 3), "one token after 100 ms");
        assert!(!b.take(100, 10, 3));
        // A long quiet spell refills to the burst, never beyond.
        assert!((0..3).all(|_| b.take(60_000, 10, 3)));
        assert!(!b.take(60_000, 10, 3));
        // A clock that goes back takes nothing away.
        assert!(!b.take(10, 10, 3));
    }

    #[test]
    fn the_limiter_keeps_peers_apart_and_its_table_bounded() {
        let mut r = RateLimiter::new(1, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert!(r.allow(a, 0) && r.allow(a, 0));
        assert!(!r.allow(a, 0));
        assert!(r.allow(b, 0), "another peer has its own bucket");
        assert!(r.allow(a, 1_000));
        for i in 0..(RATE_IPS_MAX as u32 * 2) {
            r.allow(IpAddr::from(i.to_be_bytes()), 5_000);
        }
        assert!(r.buckets.len() <= RATE_IPS_MAX);
        assert!(RateLimiter::new(0, 1).allow(a, 0), "rate 0: no limit");
    }

    #[test]
    fn caps_evict_the_longest_silent_idle_connection_or_refuse() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let mut t = ConnTable::default();
        let c1 = t.admit(ip, 10, 3, 2).unwrap();
        let c2 = t.admit(ip, 20, 3, 2).unwrap();
        c2.in_flight.fetch_add(1, Ordering::AcqRel);
        // Per-IP cap: c1 (idle) makes way, c2 (busy) stays.
        let c3 = t.admit(ip, 30, 3, 2).unwrap();
        assert!(!t.conns.contains_key(&c1.id) && t.conns.contains_key(&c2.id));
        c3.in_flight.fetch_add(1, Ordering::AcqRel);
        assert_eq!(t.admit(ip, 40, 3, 2).unwrap_err(), Full::PerIp);
        // Total cap: the other IP's idle connection is evicted for a new one.
        let o1 = t.admit(other, 50, 3, 2).unwrap();
        let o2 = t.admit(other, 60, 3, 2).unwrap();
        assert!(!t.conns.contains_key(&o1.id) && t.conns.contains_key(&o2.id));
        o2.in_flight.fetch_add(1, Ordering::AcqRel);
        assert_eq!(t.admit(other, 70, 3, 2).unwrap_err(), Full::Total);
        assert_eq!(t.conns.len(), 3);
        assert_eq!(t.per_ip.values().sum::<usize>(), 3);
        for c in [c2.id, c3.id, o2.id] {
            t.remove(c);
        }
        assert!(t.per_ip.is_empty(), "{:?}", t.per_ip);
    }

    #[test]
    fn a_request_whose_body_still_arrives_counts_as_idle() {
        let mut t = ConnTable::default();
        let c = t.admit("10.0.0.1".parse().unwrap(), 0, 1, 1).unwrap();
        c.in_flight.fetch_add(1, Ordering::AcqRel);
        c.receiving.fetch_add(1, Ordering::AcqRel);
        assert!(c.idle());
        c.receiving.fetch_sub(1, Ordering::AcqRel);
        assert!(!c.idle());
    }
}
