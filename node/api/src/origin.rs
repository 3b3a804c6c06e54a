//! Which `Host` and `Origin` headers the API answers: the defence against DNS rebinding and
//! cross-site requests from browsers.
//!
//! A web page on any site can make the browser of someone on the node's host send requests
//! to `http://127.0.0.1:7071`: a `text/plain` POST needs no CORS preflight, so it reaches
//! the handler even though the page cannot read the answer (the ShadowRay pattern), and a
//! DNS name rebound to 127.0.0.1 lets the page read answers too. Both are told apart by the
//! headers the browser cannot forge: a rebound page sends `Host: attacker.example`, a
//! cross-site one `Origin: https://attacker.example`.
//!
//! So the server ([`super::server`]) refuses, before the router and the token check, a
//! request whose `Host` is missing or not one of the node's names, or whose `Origin` is
//! present and not one of them with the API's port. The names ([`HostNames`]): `localhost`,
//! `127.0.0.1`, `[::1]`, the API's bind and advertised IPs, the IP the connection reached
//! (an IP literal cannot be rebound), the host's name, and every `--api-host NAME`. A
//! `Host` may leave the port out or give the API's; an `--api-host name:port` allows that
//! port, an `--api-host name` any (a reverse proxy in front of the node). Requests without
//! `Origin` (the CLI, curl, scripts) only need a good `Host`; the dashboard the node serves
//! fetches same-origin, so its `Origin`, when the browser sends one, is the node's own.

use std::{
    collections::HashSet,
    net::{IpAddr, SocketAddr},
};

/// Why a request was refused (answered 403 with `{"error": …, "reason": "host" | "origin"}`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No `Host` header (HTTP/1.1 requires one; every client of ours sends it).
    #[error("missing Host header")]
    MissingHost,
    /// A `Host` that is not one of the node's names: a DNS-rebinding page, or a name the
    /// operator has not declared with `--api-host`.
    #[error("Host {0:?} is not one of this node's names (add it with `ringleader node --api-host NAME`)")]
    ForeignHost(String),
    /// An `Origin` that is not the node's own: a page of another site.
    #[error("cross-origin request from {0:?} refused: this API answers the pages it serves itself, and clients that send no Origin (add a name with `ringleader node --api-host NAME`)")]
    ForeignOrigin(String),
}

impl Refused {
    /// The `reason` field of the 403 answer.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::MissingHost | Refused::ForeignHost(_) => "host",
            Refused::ForeignOrigin(_) => "origin",
        }
    }
}

/// The names the API answers to (see the module docs), lowercased.
#[derive(Clone, Debug)]
pub struct HostNames {
    /// The API's port.
    port: u16,
    /// Hosts (`localhost`, `10.0.0.5`, `[::1]`) allowed without a port or with [`Self::port`].
    names: HashSet<String>,
    /// `--api-host` names given without a port: allowed with any port.
    any_port: HashSet<String>,
    /// `--api-host` names given with a port: allowed with that port.
    exact: HashSet<(String, u16)>,
}

impl HostNames {
    /// The names of an API bound to `bind`, advertised as `advertised`, on a host called
    /// `hostname`, plus the operator's `extra` names (`name` or `name:port`).
    pub fn new(bind: SocketAddr, advertised: SocketAddr, hostname: &str, extra: &[String]) -> Self {
        let mut names: HashSet<String> = ["localhost", "127.0.0.1", "[::1]"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        for ip in [bind.ip(), advertised.ip()] {
            if !ip.is_unspecified() {
                names.insert(ip_host(ip));
            }
        }
        if !hostname.trim().is_empty() {
            names.insert(hostname.trim().to_ascii_lowercase());
        }
        let mut any_port = HashSet::new();
        let mut exact = HashSet::new();
        for e in extra {
            match parse_authority(e.trim()) {
                Some((host, Some(port))) => {
                    exact.insert((host, port));
                }
                Some((host, None)) => {
                    any_port.insert(host);
                }
                None => {}
            }
        }
        HostNames {
            port: bind.port(),
            names,
            any_port,
            exact,
        }
    }

    /// Whether `host` (lowercased) with `port` (`None`: not given) is one of the names;
    /// `local` is the IP the connection reached. A `Host` header may leave the port out; an
    /// `Origin`'s is always known (the scheme's default).
    fn allows(&self, host: &str, port: Option<u16>, local: Option<IpAddr>) -> bool {
        let own = self.names.contains(host) || local.is_some_and(|ip| ip_host(ip) == host);
        (own && port.is_none_or(|p| p == self.port))
            || self.any_port.contains(host)
            || port.is_some_and(|p| self.exact.contains(&(host.to_owned(), p)))
    }

    /// Checks a request's `Host` (and the authority of an absolute-form target, when there
    /// is one) and `Origin`; `local`: the IP the connection reached.
    pub fn check(
        &self,
        host: Option<&str>,
        target_authority: Option<&str>,
        origin: Option<&str>,
        local: Option<IpAddr>,
    ) -> Result<(), Refused> {
        let host = host.ok_or(Refused::MissingHost)?;
        for h in std::iter::once(host).chain(target_authority) {
            let ok = parse_authority(h).is_some_and(|(name, port)| self.allows(&name, port, local));
            if !ok {
                return Err(Refused::ForeignHost(shorten(h)));
            }
        }
        if let Some(origin) = origin {
            let ok = parse_origin(origin)
                .is_some_and(|(name, port)| self.allows(&name, Some(port), local));
            if !ok {
                return Err(Refused::ForeignOrigin(shorten(origin)));
            }
        }
        Ok(())
    }
}

/// Longest header value quoted back in an error, bytes.
const QUOTED_BYTES_MAX: usize = 128;

fn shorten(s: &str) -> String {
    let mut end = s.len().min(QUOTED_BYTES_MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// An IP as it appears in a `Host` header: `10.0.0.5`, `[::1]`.
fn ip_host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// `host[:port]` into the lowercased host (IPv6 in brackets) and the port; `None` for
/// anything else (empty, a bare IPv6 address, a bad port, a user part).
pub fn parse_authority(s: &str) -> Option<(String, Option<u16>)> {
    if s.is_empty() || s.contains(['@', '/', ' ', '\\']) {
        return None;
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let v6: std::net::Ipv6Addr = inside.parse().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (format!("[{v6}]"), port)
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h.to_ascii_lowercase(), Some(p)),
            None => (s.to_ascii_lowercase(), None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok()?),
        None => None,
    };
    Some((host, port))
}

/// An `Origin` (`scheme://host[:port]`) into its host and port (the scheme's default when
/// left out); `None` for `null` and anything not http(s).
fn parse_origin(s: &str) -> Option<(String, u16)> {
    let (scheme, authority) = s.split_once("://")?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let (host, port) = parse_authority(authority)?;
    Some((host, port.unwrap_or(default_port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(extra: &[&str]) -> HostNames {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        HostNames::new(
            "127.0.0.1:7071".parse().unwrap(),
            "127.0.0.1:7071".parse().unwrap(),
            "Gpu-Box",
            &extra,
        )
    }

    fn host_ok(n: &HostNames, host: &str) -> bool {
        n.check(Some(host), None, None, None).is_ok()
    }

    #[test]
    fn the_nodes_own_names_pass_with_or_without_the_api_port() {
        let n = names(&[]);
        for h in [
            "localhost",
            "LOCALHOST:7071",
            "127.0.0.1",
            "127.0.0.1:7071",
            "[::1]:7071",
            "[0:0::1]",
            "gpu-box:7071",
        ] {
            assert!(host_ok(&n, h), "{h}");
        }
    }

    #[test]
    fn foreign_hosts_and_wrong_ports_are_refused() {
        let n = names(&[]);
        for h in [
            "evil.example",
            "evil.example:7071",
            "localhost:8080",
            "localhost.",
            "127.0.0.2",
            "::1",
            "",
            "user@localhost",
            "localhost:99999",
            "localhost:",
        ] {
            assert!(
                matches!(
                    n.check(Some(h), None, None, None),
                    Err(Refused::ForeignHost(_))
                ),
                "{h}"
            );
        }
        assert_eq!(n.check(None, None, None, None), Err(Refused::MissingHost));
        // An absolute-form target naming another host is refused even with a good Host.
        assert!(n
            .check(Some("localhost:7071"), Some("evil.example"), None, None)
            .is_err());
    }

    #[test]
    fn the_ip_the_connection_reached_is_a_name() {
        let n = HostNames::new(
            "0.0.0.0:7071".parse().unwrap(),
            "0.0.0.0:7071".parse().unwrap(),
            "box",
            &[],
        );
        let local: IpAddr = "10.1.2.3".parse().unwrap();
        assert!(n
            .check(Some("10.1.2.3:7071"), None, None, Some(local))
            .is_ok());
        assert!(n
            .check(Some("10.1.2.4:7071"), None, None, Some(local))
            .is_err());
        assert!(n
            .check(Some("0.0.0.0:7071"), None, None, Some(local))
            .is_err());
    }

    #[test]
    fn origins_must_be_the_nodes_own_with_the_api_port() {
        let n = names(&[]);
        let check = |o: &str| n.check(Some("127.0.0.1:7071"), None, Some(o), None);
        for o in [
            "http://127.0.0.1:7071",
            "http://localhost:7071",
            "HTTP://[::1]:7071",
        ] {
            assert!(check(o).is_ok(), "{o}");
        }
        for o in [
            "https://evil.example",
            "http://evil.example:7071",
            "http://localhost",
            "http://localhost:8080",
            "null",
            "file://",
            "chrome-extension://abc",
            "http://127.0.0.1:7071.evil.example",
        ] {
            assert!(matches!(check(o), Err(Refused::ForeignOrigin(_))), "{o}");
        }
    }

    #[test]
    fn api_host_names_allow_any_port_or_the_given_one() {
        let n = names(&["Ring.Example", "proxy.example:8443"]);
        assert!(host_ok(&n, "ring.example"));
        assert!(host_ok(&n, "ring.example:443"));
        assert!(host_ok(&n, "proxy.example:8443"));
        assert!(!host_ok(&n, "proxy.example:8444"));
        assert!(!host_ok(&n, "proxy.example"));
        let check = |o: &str| n.check(Some("ring.example"), None, Some(o), None);
        assert!(check("https://ring.example").is_ok());
        assert!(check("https://proxy.example:8443").is_ok());
        assert!(check("https://proxy.example").is_err());
    }

    #[test]
    fn errors_quote_at_most_a_bounded_prefix() {
        let n = names(&[]);
        let long = "é".repeat(1_000);
        let err = n.check(Some(&long), None, None, None).unwrap_err();
        assert!(err.to_string().len() < 400, "{err}");
        assert_eq!(err.reason(), "host");
    }
}
