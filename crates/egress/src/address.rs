//! Resolution and the address check: ring0 resolves every name itself (the contained process
//! has no resolver and no route), then refuses addresses a name must not lead to.
//!
//! An address is *internal* when it is loopback, private (RFC 1918, IPv6 unique local),
//! link-local, shared (carrier-grade NAT), unspecified, multicast, broadcast, documentation,
//! benchmarking or reserved. A name that resolves only to internal addresses is refused unless
//! the rule that allowed it names the address ([`crate::AllowRule::names_address`]). The proxy
//! connects to an address it checked, never resolving the name again (no rebinding between the
//! check and the connection).

use crate::policy::canonical_ip;
use async_trait::async_trait;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Most addresses of one name that are considered.
pub const ADDRESSES_MAX: usize = 16;

/// Resolves names to addresses. The proxy's default is the system resolver
/// ([`SystemResolver`]); tests and hosts with their own DNS plug in another.
#[async_trait]
pub trait Resolve: Send + Sync {
    /// The addresses of `name` at `port`.
    async fn resolve(&self, name: &str, port: u16) -> io::Result<Vec<SocketAddr>>;
}

/// The operating system's resolver (`getaddrinfo`, on tokio's blocking pool).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

#[async_trait]
impl Resolve for SystemResolver {
    async fn resolve(&self, name: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        let found = tokio::net::lookup_host((name, port)).await?;
        Ok(found.take(ADDRESSES_MAX).collect())
    }
}

/// Whether `ip` is internal (see the module docs).
pub fn is_internal(ip: IpAddr) -> bool {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => is_internal_v4(v4),
        IpAddr::V6(v6) => is_internal_v6(v6),
    }
}

fn is_internal_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0
        // 100.64.0.0/10, shared address space.
        || (a == 100 && (b & 0xc0) == 64)
        // 192.0.0.0/24, protocol assignments.
        || (a == 192 && b == 0 && c == 0)
        // 198.18.0.0/15, benchmarking.
        || (a == 198 && (b & 0xfe) == 18)
        // 240.0.0.0/4, reserved.
        || a >= 240
}

fn is_internal_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        // fc00::/7, unique local.
        || (first & 0xfe00) == 0xfc00
        // fe80::/10, link-local.
        || (first & 0xffc0) == 0xfe80
        // 2001:db8::/32, documentation.
        || (first == 0x2001 && ip.segments()[1] == 0x0db8)
        // 64:ff9b:1::/48, local-use NAT64; ::/96, IPv4-compatible (deprecated).
        || (first == 0x0064 && ip.segments()[1] == 0xff9b && ip.segments()[2] == 1)
        || ip.segments()[..6].iter().all(|s| *s == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_ranges_are_recognized() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "93.184.215.14",
            "1.1.1.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
    }
}
