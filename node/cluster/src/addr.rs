//! Addresses as users write them: `host:port` (IP or DNS name) or a libp2p multiaddr.

use std::net::SocketAddr;

use libp2p::{multiaddr::Protocol, Multiaddr};
use thiserror::Error;

/// An address that could not be understood.
#[derive(Debug, Error, PartialEq)]
#[error("invalid address {input:?}: {reason} (expected host:port or a multiaddr such as /ip4/10.0.0.1/tcp/7070)")]
pub struct AddrError {
    pub input: String,
    pub reason: String,
}

fn err(input: &str, reason: impl Into<String>) -> AddrError {
    AddrError {
        input: input.to_string(),
        reason: reason.into(),
    }
}

/// Parses `host:port` or a multiaddr into a TCP multiaddr. DNS names become `/dns/NAME/tcp/P`,
/// resolved by the transport at dial time (so a seed whose name does not resolve yet is
/// retried like one that is down).
pub fn parse_p2p_addr(input: &str) -> Result<Multiaddr, AddrError> {
    let input = input.trim();
    if input.starts_with('/') {
        let addr: Multiaddr = input.parse().map_err(|e| err(input, format!("{e}")))?;
        let has_tcp = addr.iter().any(|p| matches!(p, Protocol::Tcp(_)));
        if !has_tcp {
            return Err(err(input, "no /tcp/ port"));
        }
        return Ok(addr);
    }
    let (host, port) = split_host_port(input)?;
    let mut addr = Multiaddr::empty();
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(ip)) => addr.push(Protocol::Ip4(ip)),
        Ok(std::net::IpAddr::V6(ip)) => addr.push(Protocol::Ip6(ip)),
        Err(_) => addr.push(Protocol::Dns(host.to_string().into())),
    }
    addr.push(Protocol::Tcp(port));
    Ok(addr)
}

/// Splits `host:port` (`[v6]:port` for IPv6), validating both parts.
pub fn split_host_port(input: &str) -> Result<(&str, u16), AddrError> {
    let (host, port) = input
        .rsplit_once(':')
        .ok_or_else(|| err(input, "missing :port"))?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return Err(err(input, "empty host"));
    }
    if host.contains(':') && host.parse::<std::net::Ipv6Addr>().is_err() {
        return Err(err(input, "bad IPv6 host"));
    }
    let valid_name = host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._:".contains(c));
    if !valid_name {
        return Err(err(input, "bad host name"));
    }
    let port = port
        .parse::<u16>()
        .map_err(|_| err(input, "port must be 0-65535"))?;
    Ok((host, port))
}

/// Parses a socket address to bind (`host:port`, host an IP or `localhost`).
pub fn parse_bind_addr(input: &str) -> Result<SocketAddr, AddrError> {
    let (host, port) = split_host_port(input.trim())?;
    let ip = if host == "localhost" {
        std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
    } else {
        host.parse()
            .map_err(|_| err(input, "to bind, the host must be an IP address"))?
    };
    Ok(SocketAddr::new(ip, port))
}

/// A TCP listen multiaddr for a socket address.
pub fn socket_to_multiaddr(addr: SocketAddr) -> Multiaddr {
    let mut m = Multiaddr::empty();
    match addr.ip() {
        std::net::IpAddr::V4(ip) => m.push(Protocol::Ip4(ip)),
        std::net::IpAddr::V6(ip) => m.push(Protocol::Ip6(ip)),
    }
    m.push(Protocol::Tcp(addr.port()));
    m
}

/// The IP and TCP port a multiaddr names, if it names both (the inverse of
/// [`socket_to_multiaddr`]).
pub fn multiaddr_to_socket(addr: &Multiaddr) -> Option<SocketAddr> {
    let mut ip = None;
    let mut port = None;
    for p in addr.iter() {
        match p {
            Protocol::Ip4(x) => ip = Some(std::net::IpAddr::V4(x)),
            Protocol::Ip6(x) => ip = Some(std::net::IpAddr::V6(x)),
            Protocol::Tcp(x) => port = Some(x),
            _ => {}
        }
    }
    Some(SocketAddr::new(ip?, port?))
}

/// Parses `--listen`: `host:port` or a multiaddr, into a bindable TCP multiaddr.
pub fn parse_listen_addr(input: &str) -> Result<Multiaddr, AddrError> {
    if input.trim().starts_with('/') {
        return parse_p2p_addr(input);
    }
    parse_bind_addr(input).map(socket_to_multiaddr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_forms() {
        assert_eq!(
            parse_p2p_addr("127.0.0.1:7070").unwrap().to_string(),
            "/ip4/127.0.0.1/tcp/7070"
        );
        assert_eq!(
            parse_p2p_addr("gpu-a:7070").unwrap().to_string(),
            "/dns/gpu-a/tcp/7070"
        );
        assert_eq!(
            parse_p2p_addr("[::1]:7070").unwrap().to_string(),
            "/ip6/::1/tcp/7070"
        );
        assert_eq!(
            parse_p2p_addr("/ip4/10.0.0.1/tcp/7070")
                .unwrap()
                .to_string(),
            "/ip4/10.0.0.1/tcp/7070"
        );
    }

    #[test]
    fn bad_addresses_are_clear_errors() {
        for bad in [
            "",
            "gpu-a",
            "gpu-a:",
            "gpu-a:99999",
            ":7070",
            "/ip4/1.2.3.4",
            "/nonsense",
            "a b:1",
        ] {
            let e = parse_p2p_addr(bad).unwrap_err();
            assert!(e.to_string().contains("invalid address"), "{bad}: {e}");
        }
        assert!(parse_bind_addr("gpu-a:7070").is_err());
        assert_eq!(
            parse_bind_addr("localhost:0").unwrap().to_string(),
            "127.0.0.1:0"
        );
    }
}
