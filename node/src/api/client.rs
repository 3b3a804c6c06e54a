//! The CLI's HTTP client for a node's API.

use std::time::Duration;

use anyhow::{anyhow, Result};
use serde::de::DeserializeOwned;

/// How long the CLI waits for a node to answer, in milliseconds.
pub const REQUEST_TIMEOUT_MS: u64 = 10_000;

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

    /// `GET path`, decoded as JSON; errors name the node's address or carry its message.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.call_without_body(self.agent.get(&self.url(path)))
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.peer, path)
    }

    fn call_without_body<T: DeserializeOwned>(
        &self,
        mut req: ureq::RequestBuilder<ureq::typestate::WithoutBody>,
    ) -> Result<T> {
        if let Some(token) = &self.token {
            req = req.header("authorization", &format!("Bearer {token}"));
        }
        let resp = req
            .call()
            .map_err(|e| anyhow!("cannot reach ringleader node at {}: {e}", self.peer))?;
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
            .post(&self.url(path))
            .header("content-type", content_type);
        if let Some(token) = &self.token {
            req = req.header("authorization", &format!("Bearer {token}"));
        }
        let resp = req
            .send(body)
            .map_err(|e| anyhow!("cannot reach ringleader node at {}: {e}", self.peer))?;
        self.decode(resp)
    }

    /// `DELETE path`, decoded as JSON.
    pub fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.call_without_body(self.agent.delete(&self.url(path)))
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
    pub fn job_metrics(&self, id: &str) -> Result<crate::api::status::MetricsDoc> {
        self.get(&format!("/v1/jobs/{id}/metrics"))
    }

    /// The node's status document.
    pub fn status(&self) -> Result<crate::api::status::StatusDoc> {
        self.get("/v1/status")
    }

    /// Submits a job spec (TOML text); returns the job id.
    pub fn submit(&self, spec: &str) -> Result<String> {
        let v: serde_json::Value = self.post("/v1/jobs", spec)?;
        v["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("no job id in answer: {v}"))
    }

    /// One job.
    pub fn job(&self, id: &str) -> Result<crate::api::status::JobDoc> {
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
