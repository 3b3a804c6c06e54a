//! Checkpoints in storage (any opendal service chosen by URL).
//!
//! Layout under the storage root: `jobs/<job-id>/ckpt/<step, 12 digits>/` holding
//! `model.safetensors` (parameters), `optimizer.safetensors` (optimizer state), `meta.json`
//! ([`StateMeta`]) and, written last, `COMMIT`: JSON with every file's length and blake3
//! hash. A directory without a valid `COMMIT`, or whose files do not match it, is never
//! loaded: [`CheckpointStore::load_latest`] warns and falls back to the previous one.

use std::collections::BTreeMap;

use opendal::{ErrorKind, Operator};
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::error::TrainError;
use crate::state::{StateMeta, TrainState, STATE_FORMAT};

/// Files of one checkpoint, in writing order (the commit marker comes after them).
const FILES: [&str; 3] = ["model.safetensors", "optimizer.safetensors", "meta.json"];
/// Name of the commit marker.
pub const COMMIT_FILE: &str = "COMMIT";
/// Largest checkpoint file accepted, bytes (a larger length in a marker is corruption).
pub const CHECKPOINT_FILE_BYTES_MAX: u64 = 64 << 30;
/// Largest commit marker read, bytes (three file names, lengths and hashes take ~300).
pub const COMMIT_BYTES_MAX: u64 = 64 << 10;
/// Largest `meta.json` accepted, bytes (scalars and a few metrics take ~1 KiB).
pub const META_BYTES_MAX: u64 = 1 << 20;

/// Why [`read_capped`] returned no bytes.
#[derive(Debug, thiserror::Error)]
pub enum ReadCappedError {
    /// The storage failed, or holds no such object ([`opendal::ErrorKind::NotFound`]).
    #[error(transparent)]
    Storage(#[from] opendal::Error),
    /// The object is longer than the caller's limit; nothing of it was read.
    #[error("{path}: {len} bytes, over the limit of {max_bytes} bytes")]
    TooLarge {
        /// The object.
        path: String,
        /// Its length as the storage reports it, bytes.
        len: u64,
        /// The limit, bytes.
        max_bytes: u64,
    },
}

/// Reads the object at `path` if it is at most `max_bytes` long. Its length comes from a
/// stat, before anything is read, so an object over the limit takes no memory; the bytes
/// read are checked again (the object may have been replaced in between).
pub async fn read_capped(
    op: &Operator,
    path: &str,
    max_bytes: u64,
) -> Result<Vec<u8>, ReadCappedError> {
    let too_large = |len: u64| ReadCappedError::TooLarge {
        path: path.to_string(),
        len,
        max_bytes,
    };
    let len = op.stat(path).await?.content_length();
    if len > max_bytes {
        return Err(too_large(len));
    }
    let bytes = op.read(path).await?.to_vec();
    if bytes.len() as u64 > max_bytes {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// The commit marker: proof that every file was written completely.
#[derive(Debug, Serialize, Deserialize)]
struct Commit {
    step: u64,
    /// File name → (length in bytes, blake3 hex).
    files: BTreeMap<String, (u64, String)>,
}

/// Tries of a storage request that failed with a temporary error, after the first.
pub const STORAGE_RETRIES_MAX: usize = 4;

/// Builds an opendal operator from a storage URL: `file:///abs/path`, `memory://`,
/// `s3://bucket/prefix?endpoint=…&region=…` (other query keys are passed to the service as
/// its configuration), or `<scheme>://<root>?k=v` for other compiled-in services.
pub fn operator_from_url(url: &str) -> Result<Operator, TrainError> {
    // Registers the compiled-in services and installs the HTTP transport (S3 needs it).
    opendal::install_default();
    // Errors name the URL without its secrets (they end up in logs).
    let shown = crate::redact::redact_url(url);
    let bad = || TrainError::Spec(format!("storage url {shown:?}: want scheme://…"));
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut cfg: Vec<(String, String)> = query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_string(), v.to_string())
        })
        .collect();
    let op = match scheme {
        "file" | "fs" => {
            if !location.starts_with('/') {
                return Err(TrainError::Spec(format!(
                    "storage url {shown:?}: file:// needs an absolute path"
                )));
            }
            cfg.push(("root".into(), location.into()));
            Operator::via_iter("fs", cfg)?
        }
        "memory" => Operator::via_iter("memory", cfg)?,
        "s3" => {
            // `s3://KEY:SECRET@bucket/prefix`: the userinfo is the access key pair
            // (percent-encoded where it holds `/`, `@` or `:`), as the query keys would be.
            let location = match location.rsplit_once('@') {
                Some((userinfo, rest)) => {
                    let (key, secret) = userinfo.split_once(':').ok_or_else(|| {
                        TrainError::Spec(format!(
                            "storage url {shown:?}: s3://KEY:SECRET@bucket wants both the key and the secret"
                        ))
                    })?;
                    cfg.push(("access_key_id".into(), percent_decode(key)));
                    cfg.push(("secret_access_key".into(), percent_decode(secret)));
                    rest
                }
                None => location,
            };
            let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
            if bucket.is_empty() {
                return Err(TrainError::Spec(format!(
                    "storage url {shown:?}: s3:// needs a bucket"
                )));
            }
            cfg.push(("bucket".into(), bucket.into()));
            cfg.push(("root".into(), format!("/{prefix}")));
            if !cfg.iter().any(|(k, _)| k == "region") {
                cfg.push(("region".into(), "us-east-1".into()));
            }
            Operator::via_iter("s3", cfg)?
        }
        other => {
            cfg.push(("root".into(), location.into()));
            Operator::via_iter(other, cfg)?
        }
    };
    // A temporary error (a dropped connection, a throttled request) is retried with
    // exponential backoff instead of stopping the checkpoint writer.
    Ok(op.layer(opendal::layers::RetryLayer::new().with_max_times(STORAGE_RETRIES_MAX)))
}

/// `%XX` sequences decoded (a malformed one is kept as written).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The checkpoints of one job in one storage.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    op: Operator,
    job_id: String,
}

impl CheckpointStore {
    /// The checkpoints of `job_id` under `op`'s root. The id must be a plain name.
    pub fn new(op: Operator, job_id: &str) -> Result<Self, TrainError> {
        if job_id.is_empty()
            || job_id.len() > 128
            || !job_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            || job_id.starts_with('.')
        {
            return Err(TrainError::Spec(format!(
                "job id {job_id:?}: 1–128 of [A-Za-z0-9-_.]"
            )));
        }
        Ok(CheckpointStore {
            op,
            job_id: job_id.into(),
        })
    }

    /// The store for `job_id` at storage `url` (see [`operator_from_url`]).
    pub fn from_url(url: &str, job_id: &str) -> Result<Self, TrainError> {
        Self::new(operator_from_url(url)?, job_id)
    }

    fn root(&self) -> String {
        format!("jobs/{}/ckpt/", self.job_id)
    }

    /// The directory of the checkpoint at `step`.
    pub fn dir(&self, step: u64) -> String {
        format!("{}{step:012}/", self.root())
    }

    /// Writes the checkpoint of `state`: the files, then the commit marker. A checkpoint
    /// of the same step already there (an elastic run restored to an older commit trains
    /// that step again) loses its marker first, so a crash mid-rewrite leaves an
    /// uncommitted directory, never a marker over other files.
    pub async fn write(&self, state: &TrainState) -> Result<(), TrainError> {
        let dir = self.dir(state.meta.step);
        let marker = format!("{dir}{COMMIT_FILE}");
        if self.op.exists(&marker).await? {
            self.op.delete(&marker).await?;
        }
        let blobs = [
            TrainState::encode_tensors(&state.params)?,
            TrainState::encode_tensors(&state.optimizer)?,
            serde_json::to_vec_pretty(&state.meta).expect("meta serializes"),
        ];
        let mut files = BTreeMap::new();
        for (name, blob) in FILES.iter().zip(&blobs) {
            files.insert(
                name.to_string(),
                (blob.len() as u64, blake3::hash(blob).to_hex().to_string()),
            );
            self.op.write(&format!("{dir}{name}"), blob.clone()).await?;
        }
        let commit = Commit {
            step: state.meta.step,
            files,
        };
        self.op
            .write(
                &marker,
                serde_json::to_vec(&commit).expect("commit serializes"),
            )
            .await?;
        Ok(())
    }

    /// Steps that have a checkpoint directory (committed or not), ascending.
    pub async fn steps(&self) -> Result<Vec<u64>, TrainError> {
        let root = self.root();
        let entries = match self.op.list(&root).await {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut steps: Vec<u64> = entries
            .iter()
            .filter_map(|e| e.path().strip_prefix(&root))
            .filter_map(|p| p.trim_end_matches('/').parse().ok())
            .collect();
        steps.sort_unstable();
        steps.dedup();
        Ok(steps)
    }

    /// Loads and verifies the checkpoint at `step`: [`TrainError::Corrupt`] when the marker
    /// is missing or any file differs from it.
    pub async fn load(&self, step: u64) -> Result<TrainState, TrainError> {
        let dir = self.dir(step);
        let corrupt = |d: String| TrainError::Corrupt {
            what: dir.clone(),
            detail: d,
        };
        let marker =
            match read_capped(&self.op, &format!("{dir}{COMMIT_FILE}"), COMMIT_BYTES_MAX).await {
                Ok(b) => b,
                Err(ReadCappedError::Storage(e)) if e.kind() == ErrorKind::NotFound => {
                    return Err(corrupt("no commit marker (half-written)".into()))
                }
                Err(ReadCappedError::Storage(e)) => return Err(e.into()),
                Err(e @ ReadCappedError::TooLarge { .. }) => {
                    return Err(corrupt(format!("commit marker: {e}")))
                }
            };
        let commit: Commit =
            serde_json::from_slice(&marker).map_err(|e| corrupt(format!("commit marker: {e}")))?;
        if commit.step != step {
            return Err(corrupt(format!("marker names step {}", commit.step)));
        }
        let mut blobs = Vec::new();
        for name in FILES {
            let (len, hash) = commit
                .files
                .get(name)
                .ok_or_else(|| corrupt(format!("{name} not in marker")))?;
            let max = if name == "meta.json" {
                META_BYTES_MAX
            } else {
                CHECKPOINT_FILE_BYTES_MAX
            };
            if *len > max {
                return Err(corrupt(format!(
                    "{name}: length {len} in the marker, over the limit of {max} bytes"
                )));
            }
            // At most the marker's length: a longer object is refused before it is read.
            let blob = match read_capped(&self.op, &format!("{dir}{name}"), *len).await {
                Ok(b) => b,
                Err(ReadCappedError::Storage(e)) if e.kind() == ErrorKind::NotFound => {
                    return Err(corrupt(format!("{name} missing")))
                }
                Err(ReadCappedError::Storage(e)) => return Err(e.into()),
                Err(ReadCappedError::TooLarge { .. }) => {
                    return Err(corrupt(format!("{name} does not match its commit marker")))
                }
            };
            if blob.len() as u64 != *len || blake3::hash(&blob).to_hex().as_str() != hash {
                return Err(corrupt(format!("{name} does not match its commit marker")));
            }
            blobs.push(blob);
        }
        let meta: StateMeta =
            serde_json::from_slice(&blobs[2]).map_err(|e| corrupt(format!("meta.json: {e}")))?;
        if meta.format != STATE_FORMAT || meta.step != step {
            return Err(corrupt(format!(
                "meta.json: format {} step {}",
                meta.format, meta.step
            )));
        }
        Ok(TrainState {
            meta,
            params: TrainState::decode_tensors(&blobs[0], &format!("{dir}model.safetensors"))?,
            optimizer: TrainState::decode_tensors(
                &blobs[1],
                &format!("{dir}optimizer.safetensors"),
            )?,
        })
    }

    /// The newest checkpoint that loads and verifies; newer broken ones are skipped with a
    /// warning. `None` when there is none.
    pub async fn load_latest(&self) -> Result<Option<TrainState>, TrainError> {
        for step in self.steps().await?.into_iter().rev() {
            match self.load(step).await {
                Ok(s) => return Ok(Some(s)),
                Err(e @ TrainError::Corrupt { .. }) => {
                    warn!(job = %self.job_id, step, error = %e, "checkpoint skipped");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Deletes all but the newest `keep` committed checkpoints, and any uncommitted directory
    /// older than the newest committed one (left by a crash). Returns the steps deleted.
    pub async fn prune(&self, keep: usize) -> Result<Vec<u64>, TrainError> {
        let steps = self.steps().await?;
        let mut committed = Vec::new();
        let mut uncommitted = Vec::new();
        for &s in &steps {
            if self
                .op
                .exists(&format!("{}{COMMIT_FILE}", self.dir(s)))
                .await?
            {
                committed.push(s);
            } else {
                uncommitted.push(s);
            }
        }
        let newest = committed.last().copied();
        let mut doomed: Vec<u64> = committed.iter().rev().skip(keep).copied().collect();
        doomed.extend(uncommitted.into_iter().filter(|&s| Some(s) < newest));
        doomed.sort_unstable();
        for &s in &doomed {
            // Marker first, so a crash mid-delete leaves an uncommitted (ignored) directory.
            self.op
                .delete(&format!("{}{COMMIT_FILE}", self.dir(s)))
                .await?;
            self.op.delete_with(&self.dir(s)).recursive(true).await?;
        }
        Ok(doomed)
    }

    /// The underlying operator (tests use it to damage checkpoints).
    pub fn operator(&self) -> &Operator {
        &self.op
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_storage_url_is_named_without_its_secrets() {
        let err = operator_from_url("s3://?secret_access_key=hunter2&region=x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("secret_access_key=REDACTED"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn s3_userinfo_is_the_key_pair_not_part_of_the_bucket() {
        let op = operator_from_url("s3://AK:se%2Fcr%40t@bucket/runs?endpoint=http://127.0.0.1:1")
            .unwrap();
        assert_eq!(op.info().name(), "bucket");
        assert_eq!(percent_decode("se%2Fcr%40t%zz%"), "se/cr@t%zz%");
        let err = operator_from_url("s3://AK@bucket/runs")
            .unwrap_err()
            .to_string();
        assert!(err.contains("both the key and the secret"), "{err}");
    }
}
