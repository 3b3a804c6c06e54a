//! The CLI's HTTP client for a node's API.

use std::time::Duration;

use anyhow::{anyhow, Result};
use serde::de::DeserializeOwned;

/// How long the CLI waits for a node to answer, in milliseconds.
pub const REQUEST_TIMEOUT_MS: u64 = 5_000;

/// A client of one node's API (`host:port`).
#[derive(Clone, Debug)]
pub struct ApiClient {
    peer: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl ApiClient {
    /// A client for `peer` (`host:port`), with an optional bearer token.
    pub fn new(peer: &str, token: Option<String>) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_millis(REQUEST_TIMEOUT_MS)))
            .http_status_as_error(false)
            .build()
            .new_agent();
        ApiClient {
            peer: peer.to_string(),
            token,
            agent,
        }
    }

    /// `GET path`, decoded as JSON; errors name the node's address.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let url = format!("http://{}{}", self.peer, path);
        let mut req = self.agent.get(&url);
        if let Some(token) = &self.token {
            req = req.header("authorization", &format!("Bearer {token}"));
        }
        let mut resp = req
            .call()
            .map_err(|e| anyhow!("cannot reach ringleader node at {}: {e}", self.peer))?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.body_mut().read_to_string().unwrap_or_default();
            return Err(anyhow!(
                "node at {} answered {status}: {}",
                self.peer,
                body.trim()
            ));
        }
        resp.body_mut()
            .read_json::<T>()
            .map_err(|e| anyhow!("node at {} sent an unreadable answer: {e}", self.peer))
    }

    /// The node's status document.
    pub fn status(&self) -> Result<crate::status::StatusDoc> {
        self.get("/v1/status")
    }
}
