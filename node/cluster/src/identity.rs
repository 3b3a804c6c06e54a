//! The node's persistent Ed25519 identity, the optional cluster pre-shared key, and peer ids'
//! text.

use std::{collections::HashMap, fs, io::Write, path::Path};

use anyhow::{bail, Context, Result};
use libp2p::{identity::Keypair, pnet::PreSharedKey};

/// Most peer ids [`peer_id_text`] remembers per thread (past it, it starts again).
const PEER_ID_TEXTS_MAX: usize = 20_000;

thread_local! {
    /// Each peer id's text, as the state names members: base58 of the id's bytes, an
    /// encoding quadratic in the id's length. Made again each time, it took a fifth of a
    /// settled decision at 1 000 members, and 2 % of a 128-node host while jobs were
    /// submitted (every node's supervisor writing every member's id once a second).
    static PEER_ID_TEXTS: std::cell::RefCell<HashMap<libp2p::PeerId, String>> =
        std::cell::RefCell::new(HashMap::new());
}

/// `id.to_string()`, remembered.
pub fn peer_id_text(id: &libp2p::PeerId) -> String {
    PEER_ID_TEXTS.with(|texts| {
        let mut texts = texts.borrow_mut();
        if texts.len() >= PEER_ID_TEXTS_MAX {
            texts.clear();
        }
        texts.entry(*id).or_insert_with(|| id.to_string()).clone()
    })
}

/// File name of the identity key inside the data directory.
pub const IDENTITY_FILE: &str = "identity.key";

/// Loads the keypair from `<data_dir>/identity.key`, or creates one there (mode 0600), so a
/// node keeps its peer id across restarts.
pub fn load_or_create_identity(data_dir: &Path) -> Result<Keypair> {
    let path = data_dir.join(IDENTITY_FILE);
    if path.exists() {
        let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        return Keypair::from_protobuf_encoding(&bytes)
            .with_context(|| format!("{} is not a valid identity key", path.display()));
    }
    let key = Keypair::generate_ed25519();
    let bytes = key
        .to_protobuf_encoding()
        .context("encoding identity key")?;
    let tmp = path.with_extension("tmp");
    {
        let mut opts = fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(key)
}

/// A cluster key: libp2p's pre-shared key, and the same secret for the node's own
/// authenticated connections (datasets), which get keys derived from it.
#[derive(Clone, Copy)]
pub struct ClusterKey {
    /// For libp2p's private-network layer.
    pub psk: PreSharedKey,
    secret: [u8; 32],
}

impl std::fmt::Debug for ClusterKey {
    /// The fingerprint's first digits, never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterKey({}…)", &self.fingerprint()[..12])
    }
}

impl ClusterKey {
    /// A key for one use, derived from the cluster key (BLAKE3's key derivation with
    /// `context`, a string unique to that use): holders of the cluster key agree on it,
    /// nobody else can compute it, and it reveals nothing of the cluster key.
    pub fn derive(&self, context: &str) -> [u8; 32] {
        blake3::derive_key(context, &self.secret)
    }

    /// A public name of this key (64 hex digits, derived with [`KEY_FINGERPRINT_CONTEXT`]):
    /// a key rotation names the new key by it in the replicated log and in messages; it
    /// reveals nothing of the key.
    pub fn fingerprint(&self) -> String {
        hex::encode(self.derive(KEY_FINGERPRINT_CONTEXT))
    }

    /// The key in the `swarm.key` text format [`parse_cluster_key`] reads.
    pub fn to_swarm_key_text(&self) -> String {
        format!(
            "/key/swarm/psk/1.0.0/\n/base16/\n{}\n",
            hex::encode(self.secret)
        )
    }
}

/// The key-derivation context of a cluster key's public fingerprint.
pub const KEY_FINGERPRINT_CONTEXT: &str = "ringleader 2026-12 cluster key fingerprint v1";

/// Reads a cluster key in the IPFS `swarm.key` format:
/// `/key/swarm/psk/1.0.0/`, `/base16/`, then 64 hex digits, one per line.
pub fn load_cluster_key(path: &Path) -> Result<ClusterKey> {
    let text = fs::read_to_string(path)
        .with_context(|| format!("reading cluster key {}", path.display()))?;
    parse_cluster_key(&text).with_context(|| format!("cluster key {}", path.display()))
}

/// Parses the `swarm.key` text format.
pub fn parse_cluster_key(text: &str) -> Result<ClusterKey> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    match lines.as_slice() {
        ["/key/swarm/psk/1.0.0/", "/base16/", hex] => {
            if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                bail!("expected 64 hex digits on the third line");
            }
            let normalised = format!("/key/swarm/psk/1.0.0/\n/base16/\n{hex}");
            let psk = normalised
                .parse::<PreSharedKey>()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let mut secret = [0u8; 32];
            hex::decode_to_slice(hex, &mut secret)?;
            Ok(ClusterKey { psk, secret })
        }
        _ => bail!("expected the swarm.key format: /key/swarm/psk/1.0.0/, /base16/, 64 hex digits"),
    }
}

/// A fresh random cluster key in the `swarm.key` format.
pub fn generate_cluster_key() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("/key/swarm/psk/1.0.0/\n/base16/\n{}\n", hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_id_s_remembered_text_is_its_text() {
        let ids: Vec<libp2p::PeerId> = (0..3).map(|_| libp2p::PeerId::random()).collect();
        for _ in 0..2 {
            for id in &ids {
                assert_eq!(peer_id_text(id), id.to_string());
            }
        }
    }

    #[test]
    fn identity_persists() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create_identity(dir.path()).unwrap();
        let b = load_or_create_identity(dir.path()).unwrap();
        assert_eq!(a.public().to_peer_id(), b.public().to_peer_id());
    }

    #[test]
    fn cluster_key_format() {
        let text = generate_cluster_key();
        let a = parse_cluster_key(&text).unwrap();
        let b = parse_cluster_key(&text).unwrap();
        assert_eq!(
            a.psk.fingerprint().to_string(),
            b.psk.fingerprint().to_string()
        );
        assert_eq!(a.derive("x"), b.derive("x"));
        assert_ne!(a.derive("x"), a.derive("y"));
        let other = parse_cluster_key(&generate_cluster_key()).unwrap();
        assert_ne!(a.derive("x"), other.derive("x"));
        assert_ne!(a.fingerprint(), other.fingerprint());
        let again = parse_cluster_key(&a.to_swarm_key_text()).unwrap();
        assert_eq!(again.fingerprint(), a.fingerprint());
        assert!(parse_cluster_key("/key/swarm/psk/1.0.0/\n/base16/\nabc\n").is_err());
        assert!(parse_cluster_key("hello").is_err());
    }
}
