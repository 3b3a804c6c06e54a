//! The cluster key and the API token a node runs with, decided once at start.
//!
//! | started with | cluster key | API token |
//! | --- | --- | --- |
//! | `--cluster-key FILE` | FILE's | derived from the key |
//! | no key, `<data-dir>/cluster.key` exists | that file's (a restart) | derived from the key |
//! | no key, no `--join`, a new data directory (the first node) | made now: `<data-dir>/cluster.key`, 0600 | derived from the key |
//! | no key, no `--join`, a data directory a node ran in | refused: a key made now would split it from its cluster | — |
//! | no key, `--join` | refused: a joiner needs the key | — |
//! | `--insecure` | none: the cluster is open | none, unless `--token-file` |
//!
//! The admin token is derived from the cluster key ([`admin_token`], BLAKE3's key
//! derivation), so one token works on every node and nothing about it has to be replicated:
//! whoever holds the key is a member, and a member already runs commands on every node, so
//! the token grants nothing the key does not; a key rotation (`rotation`) changes it with the
//! key ([`write_api_token`]). Every keyed node writes it to
//! `<data-dir>/api.token` (0600), where the CLI on that host finds it, with a second line
//! `tls sha256:HEX`: the fingerprint of the API's TLS key, also derived from the cluster
//! key ([`tls`]), by which clients beyond loopback verify the node. `--token-file` adds
//! a token of the operator's choosing beside it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::{
    cluster::identity::{self, ClusterKey},
    security::{
        api_token::{ApiToken, TokenFileText},
        modes, tls,
    },
};

/// File in the data directory holding the cluster key (swarm.key format, 0600).
pub const CLUSTER_KEY_FILE: &str = "cluster.key";

/// File in the data directory holding the admin API token (0600).
pub const API_TOKEN_FILE: &str = "api.token";

/// The key-derivation context of the admin token (changing it changes every cluster's
/// token).
const ADMIN_TOKEN_CONTEXT: &str = "ringleader 2026-11 api admin token v1";

/// The admin API token of the cluster whose key is `key`: 64 hex digits.
pub fn admin_token(key: &ClusterKey) -> String {
    hex::encode(key.derive(ADMIN_TOKEN_CONTEXT))
}

/// Writes `<data-dir>/api.token` (0600, atomically) for the cluster key `key`: the admin
/// token derived from it, then `tls` (the pin of the API's TLS key), as at start. A key
/// rotation calls it on every member when it switches.
pub fn write_api_token(
    data_dir: &Path,
    key: &ClusterKey,
    tls: Option<tls::Fingerprint>,
) -> Result<()> {
    let path = data_dir.join(API_TOKEN_FILE);
    let text = TokenFileText {
        token: admin_token(key),
        tls,
    }
    .to_string();
    modes::write_private(&path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// What the operator asked for at start.
#[derive(Clone, Debug, Default)]
pub struct Asked<'a> {
    /// `--cluster-key`.
    pub cluster_key: Option<&'a Path>,
    /// `--token-file`.
    pub token_file: Option<&'a Path>,
    /// Whether `--join` named a seed.
    pub joining: bool,
    /// `--insecure`.
    pub insecure: bool,
    /// Whether the data directory held a node before this start (its identity key): such
    /// a node never makes a key of its own, which would split it from its cluster.
    pub ran_before: bool,
}

/// The secrets a node runs with.
pub struct Secrets {
    /// The cluster key; `None` only with `--insecure`.
    pub key: Option<ClusterKey>,
    /// The file the key was read from (`--cluster-key`'s, or `<data-dir>/cluster.key`),
    /// which a key rotation replaces.
    pub key_file: Option<PathBuf>,
    /// The tokens the API accepts; `None`: the API is open (only with `--insecure`).
    pub token: Option<ApiToken>,
    /// Files made at this start, to print once: (what, path).
    pub created: Vec<(&'static str, PathBuf)>,
}

impl Secrets {
    /// Whether the node runs an open cluster (`--insecure`).
    pub fn insecure(&self) -> bool {
        self.key.is_none()
    }
}

/// Decides the node's secrets from the flags and its data directory (created already),
/// making the key and the token files where the table in the module doc says.
pub fn resolve(data_dir: &Path, asked: &Asked<'_>) -> Result<Secrets> {
    let mut created = Vec::new();
    let stored = data_dir.join(CLUSTER_KEY_FILE);
    let key_file = match (asked.insecure, asked.cluster_key) {
        (true, _) => None,
        (false, Some(path)) => Some(path.to_path_buf()),
        (false, None) => Some(stored.clone()),
    };
    let key = match (asked.insecure, asked.cluster_key) {
        (true, Some(_)) => {
            bail!("--insecure runs an open cluster and cannot take --cluster-key: choose one")
        }
        (true, None) => None,
        (false, Some(path)) => Some(load_key(path)?),
        (false, None) if stored.exists() => Some(load_key(&stored)?),
        (false, None) if asked.joining => bail!(
            "--join needs the cluster key: copy <data-dir>/{CLUSTER_KEY_FILE} from a member \
             (the first node made it at its first start) and pass --cluster-key FILE \
             (or --insecure for an open cluster)"
        ),
        (false, None) if asked.ran_before => bail!(
            "{} belongs to a node that ran without --cluster-key and holds no {CLUSTER_KEY_FILE}: \
             pass its cluster's key with --cluster-key FILE (or --insecure for an open cluster)",
            data_dir.display()
        ),
        (false, None) => {
            let text = identity::generate_cluster_key();
            modes::write_private(&stored, text.as_bytes())
                .with_context(|| format!("writing {}", stored.display()))?;
            created.push((CREATED_CLUSTER_KEY, stored.clone()));
            Some(load_key(&stored)?)
        }
    };
    let mut token = None;
    if let Some(key) = &key {
        let admin = admin_token(key);
        let path = data_dir.join(API_TOKEN_FILE);
        let text = TokenFileText {
            token: admin.clone(),
            tls: Some(tls::fingerprint(key)?),
        }
        .to_string();
        let current = std::fs::read_to_string(&path).ok();
        if current.as_deref() != Some(text.as_str()) {
            let said = current
                .and_then(|c| c.parse::<TokenFileText>().ok())
                .is_some_and(|c| c.token == admin);
            modes::write_private(&path, text.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
            // A file an older node wrote (the token alone) gains its TLS line silently.
            if !said {
                created.push(("API token", path));
            }
        }
        token = Some(ApiToken::new(&admin, API_TOKEN_FILE)?);
    }
    if let Some(path) = asked.token_file {
        let extra = ApiToken::from_file(path).context("--token-file")?;
        token = Some(match token {
            Some(t) => t.or(extra),
            None => extra,
        });
    }
    Ok(Secrets {
        key,
        key_file,
        token,
        created,
    })
}

fn load_key(path: &Path) -> Result<ClusterKey> {
    modes::check_secret_file(path, "cluster key")?;
    identity::load_cluster_key(path)
}

/// The name [`Secrets::created`] gives a cluster key made at this start.
pub const CREATED_CLUSTER_KEY: &str = "cluster key";

/// What the first node of a new cluster prints once, at the start that made the key: how a
/// second host joins it (copy the key, then the exact command). `listen` is the node's
/// `--listen`: a loopback address can only be joined from this host (a second node here, with
/// ports and a data directory of its own), an unspecified one (`0.0.0.0`) by this host's
/// address, which the node cannot know for its peers.
pub fn join_hint(listen: &libp2p::Multiaddr, key_file: &Path) -> String {
    let socket = crate::cluster::addr::multiaddr_to_socket(listen);
    let host = socket.map(|s| s.ip());
    let port = socket.map_or(7070, |s| s.port());
    let key = key_file.display();
    match host {
        Some(ip) if ip.is_loopback() => format!(
            "ringleader: a new cluster. To start a second node on this host (it listens on \
             loopback only; --listen 0.0.0.0:{port} lets other hosts join):\n    \
             ringleader node --cluster-key {key} --join {ip}:{port} --listen {ip}:{p2} \
             --api {ip}:{a2} --data-dir ringleader-data-2",
            p2 = port.saturating_add(10),
            a2 = port.saturating_add(11),
        ),
        Some(ip) if !ip.is_unspecified() => format!(
            "ringleader: a new cluster. To add a host, copy {key} to it (mode 0600), then run \
             there:\n    ringleader node --cluster-key cluster.key --join {ip}:{port} \
             --listen 0.0.0.0:{port}"
        ),
        _ => format!(
            "ringleader: a new cluster. To add a host, copy {key} to it (mode 0600), then run \
             there (with this host's address):\n    ringleader node --cluster-key cluster.key \
             --join THIS-HOST:{port} --listen 0.0.0.0:{port}"
        ),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_join_hint_names_the_key_and_an_address_a_second_node_reaches() {
        let key = Path::new("/data/cluster.key");
        let local = join_hint(&"/ip4/127.0.0.1/tcp/7070".parse().unwrap(), key);
        assert!(
            local.contains("--cluster-key /data/cluster.key --join 127.0.0.1:7070"),
            "{local}"
        );
        assert!(
            local.contains("--listen 127.0.0.1:7080 --api 127.0.0.1:7081"),
            "{local}"
        );
        let lan = join_hint(&"/ip4/10.0.0.5/tcp/9000".parse().unwrap(), key);
        assert!(lan.contains("copy /data/cluster.key"), "{lan}");
        assert!(
            lan.contains("--join 10.0.0.5:9000 --listen 0.0.0.0:9000"),
            "{lan}"
        );
        let any = join_hint(&"/ip4/0.0.0.0/tcp/7070".parse().unwrap(), key);
        assert!(any.contains("--join THIS-HOST:7070"), "{any}");
    }
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_first_node_makes_a_key_and_a_token_and_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let s = resolve(dir.path(), &Asked::default()).unwrap();
        assert!(!s.insecure());
        let names: Vec<_> = s.created.iter().map(|(w, _)| *w).collect();
        assert_eq!(names, ["cluster key", "API token"]);
        for f in [CLUSTER_KEY_FILE, API_TOKEN_FILE] {
            let mode = std::fs::metadata(dir.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
        let file: TokenFileText = std::fs::read_to_string(dir.path().join(API_TOKEN_FILE))
            .unwrap()
            .parse()
            .unwrap();
        let token = file.token;
        assert!(s.token.as_ref().unwrap().matches(&token));
        let key = identity::load_cluster_key(&dir.path().join(CLUSTER_KEY_FILE)).unwrap();
        assert_eq!(file.tls, Some(tls::fingerprint(&key).unwrap()));
        // A restart finds both and makes nothing.
        let again = resolve(dir.path(), &Asked::default()).unwrap();
        assert!(again.created.is_empty());
        assert!(again.token.unwrap().matches(&token));
        // A token file an older node wrote (the token alone) gains its TLS line quietly.
        modes::write_private(
            &dir.path().join(API_TOKEN_FILE),
            format!("{token}\n").as_bytes(),
        )
        .unwrap();
        let upgraded = resolve(dir.path(), &Asked::default()).unwrap();
        assert!(upgraded.created.is_empty());
        let text = std::fs::read_to_string(dir.path().join(API_TOKEN_FILE)).unwrap();
        assert_eq!(text.parse::<TokenFileText>().unwrap().tls, file.tls);
        // A node that ran before (open, or keyed by a flag) never makes a key of its own.
        let old = tempfile::tempdir().unwrap();
        let asked = Asked {
            ran_before: true,
            ..Asked::default()
        };
        let err = resolve(old.path(), &asked).err().unwrap();
        assert!(err.to_string().contains("--cluster-key FILE"), "{err}");
    }

    #[test]
    fn a_joiner_needs_the_key_and_derives_the_same_token() {
        let first = tempfile::tempdir().unwrap();
        resolve(first.path(), &Asked::default()).unwrap();
        let key = first.path().join(CLUSTER_KEY_FILE);
        let joiner = tempfile::tempdir().unwrap();
        let err = resolve(
            joiner.path(),
            &Asked {
                joining: true,
                ..Asked::default()
            },
        )
        .err()
        .unwrap();
        assert!(
            err.to_string().contains("--join needs the cluster key"),
            "{err}"
        );
        let s = resolve(
            joiner.path(),
            &Asked {
                joining: true,
                cluster_key: Some(&key),
                ..Asked::default()
            },
        )
        .unwrap();
        let token = std::fs::read_to_string(first.path().join(API_TOKEN_FILE)).unwrap();
        let token = token.parse::<TokenFileText>().unwrap().token;
        assert!(s.token.unwrap().matches(&token), "one token, every node");
        assert!(!joiner.path().join(CLUSTER_KEY_FILE).exists());
    }

    #[test]
    fn insecure_is_open_unless_a_token_file_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let open = Asked {
            insecure: true,
            ..Asked::default()
        };
        let s = resolve(dir.path(), &open).unwrap();
        assert!(s.insecure() && s.token.is_none() && s.created.is_empty());
        let tf = dir.path().join("t");
        modes::write_private(&tf, b"mine\n").unwrap();
        let s = resolve(
            dir.path(),
            &Asked {
                token_file: Some(&tf),
                ..open.clone()
            },
        )
        .unwrap();
        assert!(s.token.unwrap().matches("mine"));
        let key = dir.path().join("k");
        modes::write_private(&key, identity::generate_cluster_key().as_bytes()).unwrap();
        assert!(resolve(
            dir.path(),
            &Asked {
                cluster_key: Some(&key),
                ..open
            }
        )
        .is_err());
    }

    #[test]
    fn a_key_file_others_may_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k");
        std::fs::write(&key, identity::generate_cluster_key()).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = resolve(
            dir.path(),
            &Asked {
                cluster_key: Some(&key),
                ..Asked::default()
            },
        )
        .err()
        .unwrap();
        assert!(format!("{err:#}").contains("chmod 600"), "{err:#}");
    }

    #[test]
    fn a_token_file_beside_the_key_adds_a_token() {
        let dir = tempfile::tempdir().unwrap();
        let tf = dir.path().join("t");
        modes::write_private(&tf, b"mine\n").unwrap();
        let s = resolve(
            dir.path(),
            &Asked {
                token_file: Some(&tf),
                ..Asked::default()
            },
        )
        .unwrap();
        let admin = std::fs::read_to_string(dir.path().join(API_TOKEN_FILE)).unwrap();
        let admin = admin.parse::<TokenFileText>().unwrap().token;
        let t = s.token.unwrap();
        assert!(t.matches("mine") && t.matches(&admin) && !t.matches("other"));
    }
}
