//! TLS for the API beyond loopback, pinned by one fingerprint per cluster.
//!
//! The API's TLS key is derived from the cluster key ([`API_TLS_KEY_CONTEXT`], an Ed25519
//! seed), so every node of a cluster has the same public key and one [`Fingerprint`] (the
//! SHA-256 of its SubjectPublicKeyInfo, written `sha256:HEX`) pins them all. Each node makes
//! a self-signed certificate for that key at every start ([`ApiTls::new`]), naming its API
//! addresses; nothing secret is written, since the key is derived again at each start.
//!
//! Clients trust no CA and check no host name: [`PinnedVerifier`] accepts a server whose
//! end-entity certificate carries the pinned key, and verifies the handshake's signatures
//! with the crypto provider's algorithms, so only a holder of the cluster key can answer.
//! The pin reaches clients on the second line of every keyed node's `<data-dir>/api.token`
//! (see the API's `auth::TokenFileText`) or in `RINGLEADER_TLS_SHA256`.
//!
//! When the API speaks TLS is [`ApiTlsMode`]: by default on every connection that did not
//! arrive on a loopback address (which never crosses a network), never under `--insecure`
//! (no key). TLS 1.3 only, on rustls with the aws-lc-rs provider the tree already builds.

use std::{fmt, net::IpAddr, str::FromStr, sync::Arc};

use rustls::{
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::{CryptoProvider, WebPkiSupportedAlgorithms},
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime},
    DigitallySignedStruct, SignatureScheme,
};
use sha2::Digest;

use crate::cluster::identity::ClusterKey;

/// The key-derivation context of the API's TLS key (changing it changes every cluster's
/// fingerprint).
pub const API_TLS_KEY_CONTEXT: &str = "ringleader 2026-11 api tls key v1";

/// How long a client may take to finish the TLS handshake after connecting, milliseconds
/// (a handshake is two round trips; this bounds connections that never send a hello).
pub const TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

/// The PKCS#8 v1 encoding of an Ed25519 private key (RFC 8410) up to the 32-byte seed:
/// `SEQUENCE { INTEGER 0, SEQUENCE { OID 1.3.101.112 }, OCTET STRING { OCTET STRING seed } }`.
const PKCS8_ED25519_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// How a fingerprint is written: this prefix, then 64 lowercase hex digits.
pub const FINGERPRINT_PREFIX: &str = "sha256:";

/// The common name of the API's certificates.
const CERT_COMMON_NAME: &str = "ringleader api";

/// Why TLS could not be set up, or a pin not read.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rcgen refused to make the certificate (a bug: the key and names are ours).
    #[error("making the API's TLS certificate: {0}")]
    Certificate(String),
    /// rustls refused the key or configuration (a bug).
    #[error("configuring the API's TLS: {0}")]
    Config(String),
    /// A certificate that cannot be parsed.
    #[error("unreadable TLS certificate: {0}")]
    BadCertificate(String),
    /// A pin that is not `sha256:` and 64 hex digits.
    #[error("not a TLS fingerprint: {0:?} (expected sha256: and 64 hex digits)")]
    BadFingerprint(String),
}

/// The SHA-256 of a certificate's SubjectPublicKeyInfo: what clients pin.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a DER SubjectPublicKeyInfo.
    pub fn of_spki(spki_der: &[u8]) -> Self {
        Fingerprint(sha2::Sha256::digest(spki_der).into())
    }

    /// The fingerprint of a DER certificate's public key.
    pub fn of_certificate(cert: &CertificateDer<'_>) -> Result<Self, TlsError> {
        let parsed = rustls::server::ParsedCertificate::try_from(cert)
            .map_err(|e| TlsError::BadCertificate(e.to_string()))?;
        Ok(Fingerprint::of_spki(
            parsed.subject_public_key_info().as_ref(),
        ))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{FINGERPRINT_PREFIX}{}", hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Fingerprint {
    type Err = TlsError;

    /// `sha256:HEX` (the prefix may be left out; hex in either case).
    fn from_str(s: &str) -> Result<Self, TlsError> {
        let t = s.trim();
        let digits = t
            .get(..FINGERPRINT_PREFIX.len())
            .filter(|p| p.eq_ignore_ascii_case(FINGERPRINT_PREFIX))
            .map_or(t, |_| &t[FINGERPRINT_PREFIX.len()..]);
        let mut out = [0u8; 32];
        match hex::decode_to_slice(digits, &mut out) {
            Ok(()) => Ok(Fingerprint(out)),
            Err(_) => Err(TlsError::BadFingerprint(s.to_string())),
        }
    }
}

/// When the API speaks TLS (`ringleader node --api-tls`, hidden).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ApiTlsMode {
    /// On every connection that did not arrive on a loopback address.
    #[default]
    Auto,
    /// On every connection, loopback too (tests).
    On,
    /// Never: the token crosses the network in clear (behind a TLS-terminating proxy).
    Off,
}

impl ApiTlsMode {
    /// Whether a connection that arrived on local address `local` does the handshake.
    pub fn applies_to(self, local: IpAddr) -> bool {
        match self {
            ApiTlsMode::On => true,
            ApiTlsMode::Off => false,
            ApiTlsMode::Auto => !is_loopback(local),
        }
    }
}

/// Whether `ip` is loopback (127/8, ::1, or an IPv4-mapped 127/8).
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// The crypto provider of the API's TLS, server and client: rustls' aws-lc-rs one.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The PKCS#8 encoding of the API's TLS key for the cluster whose key is `key`.
fn pkcs8(key: &ClusterKey) -> PrivatePkcs8KeyDer<'static> {
    let seed = key.derive(API_TLS_KEY_CONTEXT);
    let mut der = PKCS8_ED25519_PREFIX.to_vec();
    der.extend_from_slice(&seed);
    PrivatePkcs8KeyDer::from(der)
}

fn key_pair(key: &ClusterKey) -> Result<rcgen::KeyPair, TlsError> {
    rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8(key), &rcgen::PKCS_ED25519)
        .map_err(|e| TlsError::Certificate(e.to_string()))
}

/// The fingerprint every node of the cluster whose key is `key` serves (what its token
/// file carries).
pub fn fingerprint(key: &ClusterKey) -> Result<Fingerprint, TlsError> {
    Ok(Fingerprint::of_spki(&key_pair(key)?.public_key_der()))
}

/// The API's TLS: its certificate (made at this start) and the acceptor for connections.
pub struct ApiTls {
    fingerprint: Fingerprint,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl fmt::Debug for ApiTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiTls")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl ApiTls {
    /// The TLS of an API with the cluster key `key`, reached by `names` (IP addresses and
    /// host names, written into the certificate for browsers; clients of ours check only
    /// the key).
    pub fn new(key: &ClusterKey, names: &[String]) -> Result<Self, TlsError> {
        let pair = key_pair(key)?;
        let mut sans: Vec<String> = Vec::new();
        for n in names {
            let n = n.trim().trim_start_matches('[').trim_end_matches(']');
            if !n.is_empty() && !sans.iter().any(|s| s == n) {
                sans.push(n.to_string());
            }
        }
        let mut params = rcgen::CertificateParams::new(sans)
            .map_err(|e| TlsError::Certificate(e.to_string()))?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, CERT_COMMON_NAME);
        let cert = params
            .self_signed(&pair)
            .map_err(|e| TlsError::Certificate(e.to_string()))?;
        let der = cert.der().clone();
        let fingerprint = Fingerprint::of_certificate(&der)?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![der], PrivateKeyDer::Pkcs8(pkcs8(key)))
            .map_err(|e| TlsError::Config(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(ApiTls {
            fingerprint,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// What clients pin.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// Accepts TLS connections.
    pub fn acceptor(&self) -> &tokio_rustls::TlsAcceptor {
        &self.acceptor
    }
}

/// A client's TLS configuration that trusts exactly the servers whose key is `pin`.
pub fn client_config(pin: Fingerprint) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let provider = provider();
    let verifier = Arc::new(PinnedVerifier::new(pin, &provider));
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The server's key is not the pinned one.
#[derive(Debug, thiserror::Error)]
#[error(
    "the node's TLS key is {got}, not the pinned {want} (another cluster, or a man in the middle)"
)]
pub struct PinMismatch {
    /// The pin.
    pub want: Fingerprint,
    /// What the server showed.
    pub got: Fingerprint,
}

/// Trusts a server by its key alone: the end-entity certificate's SubjectPublicKeyInfo must
/// hash to the pin, and the handshake's signature must verify under that key. No CA, no
/// host name, no validity dates: the certificate is a carrier for the key, which only
/// holders of the cluster key can derive.
#[derive(Debug)]
pub struct PinnedVerifier {
    pin: Fingerprint,
    algorithms: WebPkiSupportedAlgorithms,
}

impl PinnedVerifier {
    /// A verifier for `pin` with `provider`'s signature algorithms.
    pub fn new(pin: Fingerprint, provider: &CryptoProvider) -> Self {
        PinnedVerifier {
            pin,
            algorithms: provider.signature_verification_algorithms,
        }
    }
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = Fingerprint::of_certificate(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        if got == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            // `Error::Other` shows the mismatch's message (a certificate error would show
            // only its debug form).
            Err(rustls::Error::Other(rustls::OtherError(Arc::new(
                PinMismatch {
                    want: self.pin,
                    got,
                },
            ))))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::identity::{generate_cluster_key, parse_cluster_key};

    fn new_key() -> ClusterKey {
        parse_cluster_key(&generate_cluster_key()).unwrap()
    }

    #[test]
    fn one_key_one_fingerprint_on_every_node() {
        let key = new_key();
        let a = ApiTls::new(&key, &["10.0.0.1".into(), "gpu-a".into()]).unwrap();
        let b = ApiTls::new(&key, &["10.0.0.2".into(), "[::1]".into()]).unwrap();
        assert_eq!(
            a.fingerprint(),
            b.fingerprint(),
            "names differ, the key does not"
        );
        assert_eq!(a.fingerprint(), fingerprint(&key).unwrap());
        let other = ApiTls::new(&new_key(), &["10.0.0.1".into()]).unwrap();
        assert_ne!(a.fingerprint(), other.fingerprint());
    }

    #[test]
    fn fingerprints_round_trip_through_text() {
        let f = fingerprint(&new_key()).unwrap();
        let text = f.to_string();
        assert!(
            text.starts_with("sha256:") && text.len() == 7 + 64,
            "{text}"
        );
        assert_eq!(text.parse::<Fingerprint>().unwrap(), f);
        assert_eq!(text[7..].to_uppercase().parse::<Fingerprint>().unwrap(), f);
        for bad in ["", "sha256:", "sha256:abc", "md5:00", &format!("{text}00")] {
            assert!(bad.parse::<Fingerprint>().is_err(), "{bad}");
        }
    }

    #[test]
    fn modes_decide_by_the_local_address() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let lo6: IpAddr = "::1".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let net: IpAddr = "10.77.0.1".parse().unwrap();
        assert!(![lo, lo6, mapped]
            .iter()
            .any(|ip| ApiTlsMode::Auto.applies_to(*ip)));
        assert!(ApiTlsMode::Auto.applies_to(net));
        assert!(ApiTlsMode::On.applies_to(lo) && !ApiTlsMode::Off.applies_to(net));
    }

    /// Runs a handshake between a server of `server_key` and a client pinning `pin`.
    async fn handshake(server_key: &ClusterKey, pin: Fingerprint) -> Result<(), String> {
        let tls = ApiTls::new(server_key, &["127.0.0.1".into()]).unwrap();
        let (a, b) = tokio::io::duplex(64 * 1024);
        let acceptor = tls.acceptor().clone();
        let server = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut s = acceptor.accept(a).await.map_err(|e| e.to_string())?;
            s.write_all(b"hello").await.map_err(|e| e.to_string())?;
            s.shutdown().await.map_err(|e| e.to_string())
        });
        let connector = tokio_rustls::TlsConnector::from(client_config(pin).unwrap());
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let client = async {
            use tokio::io::AsyncReadExt;
            let mut c = connector
                .connect(name, b)
                .await
                .map_err(|e| e.to_string())?;
            let mut got = Vec::new();
            c.read_to_end(&mut got).await.map_err(|e| e.to_string())?;
            assert_eq!(got, b"hello");
            Ok::<(), String>(())
        };
        let res = client.await;
        let _ = server.await;
        res
    }

    #[tokio::test]
    async fn the_verifier_takes_the_pinned_key_only() {
        let key = new_key();
        handshake(&key, fingerprint(&key).unwrap()).await.unwrap();
        let err = handshake(&key, fingerprint(&new_key()).unwrap())
            .await
            .unwrap_err();
        assert!(err.contains("not the pinned"), "{err}");
    }
}
