//! The CLI's HTTP client for a node's API.
//!
//! Which scheme it speaks ([`Scheme::choose`]): plain http to a loopback address (the
//! traffic never leaves the host); https beyond loopback, trusting the node by the pinned
//! fingerprint of the cluster's API key alone ([`crate::security::tls`]); a token is never
//! sent in clear beyond loopback unless the peer is written `http://HOST:PORT`.

use std::{fmt, io::Read, io::Write, sync::Arc, time::Duration};

use anyhow::{anyhow, Result};
use serde::de::DeserializeOwned;
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, DefaultConnector, Either, LazyBuffers, NextTimeout,
    Transport, TransportAdapter,
};

use crate::security::tls::{self, Fingerprint};

/// How long the CLI waits for a node to answer, in milliseconds.
pub const REQUEST_TIMEOUT_MS: u64 = 10_000;

/// How the client reaches a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP: a loopback address, `http://` given, or no token to protect.
    Http,
    /// TLS, trusting the server whose key has this fingerprint.
    Https(Fingerprint),
    /// The API speaks TLS and no fingerprint is known: refused before anything is sent.
    NeedsPin,
}

impl Scheme {
    /// The scheme for `peer` (`host:port`, or with `http://` or `https://`) given the pin
    /// and whether a token would be sent; and `peer` without its scheme.
    pub fn choose(peer: &str, pin: Option<Fingerprint>, token: bool) -> (Scheme, &str) {
        if let Some(rest) = strip_scheme(peer, "http://") {
            return (Scheme::Http, rest);
        }
        if let Some(rest) = strip_scheme(peer, "https://") {
            return (pin.map_or(Scheme::NeedsPin, Scheme::Https), rest);
        }
        let host = host_of(peer);
        let loopback =
            host.eq_ignore_ascii_case("localhost") || host.parse().is_ok_and(tls::is_loopback);
        let scheme = match (loopback, pin) {
            (true, _) => Scheme::Http,
            (false, Some(pin)) => Scheme::Https(pin),
            (false, None) if token => Scheme::NeedsPin,
            (false, None) => Scheme::Http,
        };
        (scheme, peer)
    }
}

fn strip_scheme<'a>(peer: &'a str, scheme: &str) -> Option<&'a str> {
    peer.get(..scheme.len())
        .filter(|p| p.eq_ignore_ascii_case(scheme))
        .map(|_| peer[scheme.len()..].trim_end_matches('/'))
}

/// The host of `host:port` or `[v6]:port`, without brackets.
fn host_of(peer: &str) -> &str {
    if let Some(rest) = peer.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match peer.rsplit_once(':') {
        Some((host, _)) if !host.contains(':') => host,
        _ => peer,
    }
}

/// A client of one node's API (`host:port`).
#[derive(Clone, Debug)]
pub struct ApiClient {
    /// The address as given, without a scheme (for messages).
    peer: String,
    scheme: Scheme,
    /// The address as given, scheme and all (to choose again when a pin is added).
    given: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl ApiClient {
    /// A client for `peer` (`host:port`, or `http://…`/`https://…`), with an optional bearer
    /// token and no TLS pin (see [`ApiClient::with_tls_pin`]).
    pub fn new(peer: &str, token: Option<String>) -> Self {
        let (scheme, bare) = Scheme::choose(peer, None, token.is_some());
        ApiClient {
            peer: bare.to_string(),
            scheme,
            given: peer.to_string(),
            token,
            agent: agent(None),
        }
    }

    /// This client trusting the node's TLS key by `pin` (the fingerprint a node's
    /// `api.token` carries), spoken beyond loopback.
    pub fn with_tls_pin(self, pin: Option<Fingerprint>) -> Self {
        let (scheme, bare) = Scheme::choose(&self.given, pin, self.token.is_some());
        let peer = bare.to_string();
        let pinned = match scheme {
            Scheme::Https(pin) => Some(pin),
            _ => None,
        };
        ApiClient {
            peer,
            scheme,
            agent: agent(pinned),
            ..self
        }
    }

    /// How this client reaches the node.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// `GET path`, decoded as JSON; errors name the node's address or carry its message.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.call_without_body(self.agent.get(&self.url(path)?))
    }

    /// `GET path?k=v&…` (each pair with a value, percent-encoded), decoded as JSON.
    pub fn get_query<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, Option<String>)],
    ) -> Result<T> {
        let mut req = self.agent.get(&self.url(path)?);
        for (k, v) in query {
            if let Some(v) = v {
                req = req.query(*k, v);
            }
        }
        self.call_without_body(req)
    }

    fn url(&self, path: &str) -> Result<String> {
        match self.scheme {
            Scheme::Http => Ok(format!("http://{}{}", self.peer, path)),
            Scheme::Https(_) => Ok(format!("https://{}{}", self.peer, path)),
            Scheme::NeedsPin => Err(anyhow!(
                "the node's API at {} speaks TLS and its fingerprint is unknown: set \
                 RINGLEADER_TOKEN_FILE to a node's api.token, which carries it (or \
                 RINGLEADER_TLS_SHA256; --peer http://{} would send the token in clear)",
                self.peer,
                self.peer
            )),
        }
    }

    fn call_without_body<T: DeserializeOwned>(
        &self,
        mut req: ureq::RequestBuilder<ureq::typestate::WithoutBody>,
    ) -> Result<T> {
        if let Some(token) = &self.token {
            req = req.header("authorization", &format!("Bearer {token}"));
        }
        let resp = req.call().map_err(|e| self.unreachable(e))?;
        self.decode(resp)
    }

    /// `POST path` with a text body, decoded as JSON.
    pub fn post<T: DeserializeOwned>(&self, path: &str, body: &str) -> Result<T> {
        self.post_with(path, "text/plain", body)
    }

    /// `POST path` with a JSON body, decoded as JSON.
    pub fn post_json<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<T> {
        self.post_with(path, "application/json", &body.to_string())
    }

    fn post_with<T: DeserializeOwned>(
        &self,
        path: &str,
        content_type: &str,
        body: &str,
    ) -> Result<T> {
        let mut req = self
            .agent
            .post(&self.url(path)?)
            .header("content-type", content_type);
        if let Some(token) = &self.token {
            req = req.header("authorization", &format!("Bearer {token}"));
        }
        let resp = req.send(body).map_err(|e| self.unreachable(e))?;
        self.decode(resp)
    }

    /// `DELETE path`, decoded as JSON.
    pub fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.call_without_body(self.agent.delete(&self.url(path)?))
    }

    /// The error for a call that got no HTTP answer: a peer that speaks something else than
    /// HTTP (most often the cluster port) is named as such, not as a parse failure.
    fn unreachable(&self, e: ureq::Error) -> anyhow::Error {
        let not_http = match &e {
            ureq::Error::Protocol(p) => {
                let p = p.to_string();
                p.starts_with("http parse fail") || p.contains("version")
            }
            _ => false,
        };
        if not_http {
            anyhow!(
                "{} is not a ringleader API over plain HTTP (is it the cluster --listen port? \
                 the API is --api, default 127.0.0.1:7071; an API beyond loopback speaks TLS: \
                 drop the http:// and give the token file, which carries its fingerprint): {e}",
                self.peer
            )
        } else {
            anyhow!("cannot reach ringleader node at {}: {e}", self.peer)
        }
    }

    fn decode<T: DeserializeOwned>(&self, mut resp: ureq::http::Response<ureq::Body>) -> Result<T> {
        let status = resp.status();
        if !status.is_success() {
            let body = resp.body_mut().read_to_string().unwrap_or_default();
            let doc = serde_json::from_str::<serde_json::Value>(&body).ok();
            if status == ureq::http::StatusCode::UNAUTHORIZED {
                let missing = doc.as_ref().and_then(|v| v["reason"].as_str()) == Some("missing")
                    || self.token.is_none();
                return Err(anyhow!("{}", unauthorized_message(&self.peer, missing)));
            }
            let msg = doc
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or_else(|| {
                    format!("node at {} answered {status}: {}", self.peer, body.trim())
                });
            return Err(anyhow!("{msg}"));
        }
        resp.body_mut()
            .read_json::<T>()
            .map_err(|e| anyhow!("node at {} sent an unreadable answer: {e}", self.peer))
    }

    /// A job's metric histories.
    pub fn job_metrics(&self, id: &str) -> Result<crate::status::MetricsDoc> {
        self.get(&format!("/v1/jobs/{id}/metrics"))
    }

    /// The node's status document.
    pub fn status(&self) -> Result<crate::status::StatusDoc> {
        self.get("/v1/status")
    }

    /// `GET /v1/status` with filters and a page size (see [`crate::listing`]).
    pub fn status_page(
        &self,
        limit: Option<usize>,
        member_state: Option<&str>,
        job_state: Option<&str>,
    ) -> Result<crate::status::StatusDoc> {
        let q = [
            ("limit", limit.map(|n| n.to_string())),
            ("member_state", member_state.map(str::to_string)),
            ("job_state", job_state.map(str::to_string)),
        ];
        self.get_query("/v1/status", &q)
    }

    /// One page of `GET /v1/jobs`: the newest `limit` jobs in `state` older than `before`,
    /// oldest first.
    pub fn jobs_page(
        &self,
        state: Option<&str>,
        limit: Option<usize>,
        before: Option<&str>,
    ) -> Result<Vec<crate::status::JobSummary>> {
        let q = [
            ("state", state.map(str::to_string)),
            ("limit", limit.map(|n| n.to_string())),
            ("before", before.map(str::to_string)),
        ];
        self.get_query("/v1/jobs", &q)
    }

    /// Submits a job spec (TOML text); returns the job id.
    pub fn submit(&self, spec: &str) -> Result<String> {
        let v: serde_json::Value = self.post("/v1/jobs", spec)?;
        v["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("no job id in answer: {v}"))
    }

    /// Submits a job spec given as JSON text (an object with the TOML's keys); returns the
    /// job id.
    pub fn submit_json(&self, spec: &str) -> Result<String> {
        let v: serde_json::Value = self.post_with("/v1/jobs", "application/json", spec)?;
        v["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("no job id in answer: {v}"))
    }

    /// One job.
    pub fn job(&self, id: &str) -> Result<crate::status::JobDoc> {
        self.get(&format!("/v1/jobs/{id}"))
    }
}

/// What the CLI says when the node answers 401: a missing token (none sent, or the node
/// says so) or a refused one.
pub fn unauthorized_message(peer: &str, missing: bool) -> String {
    if missing {
        format!(
            "the node wants an API token: set RINGLEADER_TOKEN or pass --token-file \
             (a node's admin token is in its <data-dir>/api.token; node at {peer})"
        )
    } else {
        format!("the API token was refused by the node at {peer}")
    }
}

/// An agent with the CLI's timeouts; with a pin, https goes through [`PinnedTls`].
fn agent(pin: Option<Fingerprint>) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_millis(REQUEST_TIMEOUT_MS)))
        .http_status_as_error(false)
        .build();
    let Some(tls_config) = pin.and_then(|pin| tls::client_config(pin).ok()) else {
        return config.new_agent();
    };
    let connector = DefaultConnector::new().chain(PinnedTls { config: tls_config });
    ureq::Agent::with_parts(
        config,
        connector,
        ureq::unversioned::resolver::DefaultResolver::default(),
    )
}

/// Wraps https connections in rustls with the pinned verifier (ureq's own TLS would trust
/// CAs and check host names; the API's certificate is trusted by its key alone).
#[derive(Debug)]
struct PinnedTls {
    config: Arc<rustls::ClientConfig>,
}

impl<In: Transport> Connector<In> for PinnedTls {
    type Out = Either<In, PinnedTlsTransport>;

    fn connect(
        &self,
        details: &ConnectionDetails<'_>,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        let Some(transport) = chained else {
            return Ok(None);
        };
        if !details.needs_tls() || transport.is_tls() {
            return Ok(Some(Either::A(transport)));
        }
        let host = details.uri.host().unwrap_or_default();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|_| ureq::Error::Tls("the node's address is not a TLS server name"))?;
        let mut conn = rustls::ClientConnection::new(self.config.clone(), name)
            .map_err(|e| ureq::Error::Io(std::io::Error::other(e)))?;
        let mut sock = TransportAdapter::new(transport.boxed(), details.current_time.clone());
        sock.set_timeout(details.timeout);
        conn.complete_io(&mut sock)?;
        Ok(Some(Either::B(PinnedTlsTransport {
            buffers: LazyBuffers::new(
                details.config.input_buffer_size(),
                details.config.output_buffer_size(),
            ),
            stream: rustls::StreamOwned::new(conn, sock),
        })))
    }
}

/// An https connection to a pinned node.
struct PinnedTlsTransport {
    buffers: LazyBuffers,
    stream: rustls::StreamOwned<rustls::ClientConnection, TransportAdapter>,
}

impl fmt::Debug for PinnedTlsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedTlsTransport").finish_non_exhaustive()
    }
}

impl Transport for PinnedTlsTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let output = &self.buffers.output()[..amount];
        self.stream.write_all(output)?;
        Ok(())
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let input = self.buffers.input_append_buf();
        let amount = self.stream.read(input)?;
        self.buffers.input_appended(amount);
        Ok(amount > 0)
    }

    fn is_open(&mut self) -> bool {
        self.stream.get_mut().get_mut().is_open()
    }

    fn is_tls(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_plain_and_the_network_is_pinned() {
        let pin: Fingerprint = format!("sha256:{}", "cd".repeat(32)).parse().unwrap();
        for peer in [
            "127.0.0.1:7071",
            "localhost:7071",
            "[::1]:7071",
            "127.0.0.2:1",
        ] {
            assert_eq!(
                Scheme::choose(peer, Some(pin), true).0,
                Scheme::Http,
                "{peer}"
            );
        }
        assert_eq!(
            Scheme::choose("10.77.0.1:7071", Some(pin), true),
            (Scheme::Https(pin), "10.77.0.1:7071")
        );
        assert_eq!(
            Scheme::choose("gpu-a:7071", None, true).0,
            Scheme::NeedsPin,
            "a token is never sent in clear beyond loopback by default"
        );
        assert_eq!(Scheme::choose("gpu-a:7071", None, false).0, Scheme::Http);
        assert_eq!(
            Scheme::choose("http://gpu-a:7071/", None, true),
            (Scheme::Http, "gpu-a:7071")
        );
        assert_eq!(
            Scheme::choose("https://127.0.0.1:7071", Some(pin), true),
            (Scheme::Https(pin), "127.0.0.1:7071")
        );
        assert_eq!(
            Scheme::choose("HTTPS://127.0.0.1:7071", None, true).0,
            Scheme::NeedsPin
        );
        let err = ApiClient::new("10.0.0.1:7071", Some("t".into()))
            .status()
            .unwrap_err();
        assert!(err.to_string().contains("RINGLEADER_TOKEN_FILE"), "{err}");
    }
}
