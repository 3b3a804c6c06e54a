//! The network interface of this node's data-plane address, given to ranks as
//! `NCCL_SOCKET_IFNAME` and `GLOO_SOCKET_IFNAME` ([`super::launch::SOCKET_IFNAME_ENV`]):
//! left to themselves, NCCL and gloo pick the first interface they like, which on a host
//! with a docker bridge or a second NIC may not reach the other ranks.
//!
//! [`interface_of`] is the pure lookup over the host's addresses; [`host_addresses`] reads
//! them once (`getifaddrs`), at the node's start.
//!
//! May use: nothing of the node. Used by: the node's start-up.

use std::net::IpAddr;

/// One address of one interface, as `getifaddrs` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceAddress {
    /// The interface's name (`eth0`, `lo`).
    pub name: String,
    /// Its address.
    pub ip: IpAddr,
    /// Its netmask, when it has one of the same family.
    pub netmask: Option<IpAddr>,
}

/// The interface holding `ip`: the one whose address it is, else the first whose network
/// (address and netmask) contains it (a loopback address such as 127.0.0.2 is `lo`'s, which
/// holds 127.0.0.1/8). `None` for an unspecified address or one no interface holds.
pub fn interface_of(addresses: &[InterfaceAddress], ip: IpAddr) -> Option<String> {
    if ip.is_unspecified() {
        return None;
    }
    let exact = addresses.iter().find(|a| a.ip == ip);
    let within = || {
        addresses
            .iter()
            .find(|a| a.netmask.is_some_and(|mask| same_network(a.ip, ip, mask)))
    };
    exact.or_else(within).map(|a| a.name.clone())
}

/// Whether `a` and `b` agree on every bit `mask` sets (all three of one family).
fn same_network(a: IpAddr, b: IpAddr, mask: IpAddr) -> bool {
    let bits = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => (4, u128::from(u32::from(v4))),
        IpAddr::V6(v6) => (6, u128::from(v6)),
    };
    let ((fa, a), (fb, b), (fm, m)) = (bits(a), bits(b), bits(mask));
    fa == fb && fb == fm && m != 0 && a & m == b & m
}

/// This host's interface addresses; empty when they cannot be read.
pub fn host_addresses() -> Vec<InterfaceAddress> {
    let Ok(list) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let ip_of = |s: &nix::sys::socket::SockaddrStorage| -> Option<IpAddr> {
        if let Some(v4) = s.as_sockaddr_in() {
            return Some(IpAddr::V4(v4.ip()));
        }
        s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
    };
    list.filter_map(|entry| {
        Some(InterfaceAddress {
            ip: ip_of(entry.address.as_ref()?)?,
            netmask: entry.netmask.as_ref().and_then(ip_of),
            name: entry.interface_name,
        })
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, ip: &str, mask: &str) -> InterfaceAddress {
        InterfaceAddress {
            name: name.into(),
            ip: ip.parse().unwrap(),
            netmask: Some(mask.parse().unwrap()),
        }
    }

    #[test]
    fn the_interface_holding_the_address_or_its_network() {
        let host = [
            entry("lo", "127.0.0.1", "255.0.0.0"),
            entry("docker0", "172.17.0.1", "255.255.0.0"),
            entry("eth0", "10.0.3.7", "255.255.255.0"),
            entry("eth0", "fe80::1", "ffff:ffff:ffff:ffff::"),
            entry("eth1", "10.0.3.8", "255.255.255.0"),
        ];
        let of = |ip: &str| interface_of(&host, ip.parse().unwrap());
        assert_eq!(of("127.0.0.1").as_deref(), Some("lo"));
        assert_eq!(of("127.0.0.3").as_deref(), Some("lo"));
        assert_eq!(of("10.0.3.8").as_deref(), Some("eth1"), "exact first");
        assert_eq!(of("10.0.3.9").as_deref(), Some("eth0"));
        assert_eq!(of("fe80::2").as_deref(), Some("eth0"));
        assert_eq!(of("192.168.1.1"), None);
        assert_eq!(of("0.0.0.0"), None);
        let no_mask = [InterfaceAddress {
            netmask: None,
            ..entry("tun0", "10.8.0.2", "0.0.0.0")
        }];
        assert_eq!(interface_of(&no_mask, "10.8.0.3".parse().unwrap()), None);
        assert_eq!(
            interface_of(&no_mask, "10.8.0.2".parse().unwrap()).as_deref(),
            Some("tun0")
        );
    }

    #[test]
    fn this_hosts_loopback_is_found() {
        // Every test host has a loopback interface holding 127.0.0.1.
        let host = host_addresses();
        let lo = interface_of(&host, "127.0.0.1".parse().unwrap());
        assert!(lo.is_some(), "{host:?}");
    }
}
