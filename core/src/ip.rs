//! Client identity behind proxies: walk `X-Forwarded-For` from the right and stop at the
//! first address that is not a trusted proxy, so a client cannot pick its own IP by sending
//! the header itself.

use crate::error::{Error, Result};
use std::net::{IpAddr, SocketAddr};

/// An IP network, `203.0.113.0/24` or `2001:db8::/32` (a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Cidr> {
        let bad = |m: &str| Error::invalid("trusted_proxies", format!("{s:?}: {m}"));
        let (a, p) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = a.parse().map_err(|_| bad("not an IP address or CIDR"))?;
        let addr = canonical(addr);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| bad("bad prefix length"))?,
            None => max,
        };
        Ok(Cidr { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - self.prefix)
                };
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - self.prefix)
                };
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// A parsed list of trusted proxy networks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<Cidr>);

impl TrustedProxies {
    pub fn parse<S: AsRef<str>>(cidrs: &[S]) -> Result<TrustedProxies> {
        cidrs
            .iter()
            .map(|c| Cidr::parse(c.as_ref()))
            .collect::<Result<Vec<_>>>()
            .map(TrustedProxies)
    }
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`) are the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Parses `1.2.3.4`, `1.2.3.4:5678`, `::1`, `[::1]:80`.
pub fn parse_peer(peer: &str) -> Result<IpAddr> {
    let p = peer.trim();
    p.parse::<IpAddr>()
        .or_else(|_| p.parse::<SocketAddr>().map(|s| s.ip()))
        .map(canonical)
        .map_err(|_| Error::invalid("peer_addr", format!("{peer:?} is not an IP address")))
}

/// The client's address: the peer itself unless it is a trusted proxy; then the
/// `X-Forwarded-For` entries from the right, skipping trusted proxies, up to the first
/// untrusted one. Entries a client prepended itself are never reached.
pub fn client_ip_with(
    peer: IpAddr,
    x_forwarded_for: Option<&str>,
    trusted: &TrustedProxies,
) -> IpAddr {
    let mut candidate = canonical(peer);
    if let Some(xff) = x_forwarded_for {
        for entry in xff.rsplit(',') {
            if !trusted.contains(candidate) {
                return candidate;
            }
            match parse_peer(entry) {
                Ok(ip) => candidate = ip,
                // garbage in the chain: the hop that forwarded it is the best we know
                Err(_) => return candidate,
            }
        }
    }
    candidate
}

/// [`client_ip_with`] on strings: `peer_addr` (with or without a port), the raw
/// `X-Forwarded-For` header (several headers joined with ','), and trusted proxy CIDRs.
pub fn client_ip<S: AsRef<str>>(
    peer_addr: &str,
    x_forwarded_for: Option<&str>,
    trusted_proxies: &[S],
) -> Result<IpAddr> {
    let trusted = TrustedProxies::parse(trusted_proxies)?;
    Ok(client_ip_with(
        parse_peer(peer_addr)?,
        x_forwarded_for,
        &trusted,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    const PROXIES: &[&str] = &["10.0.0.0/8", "192.168.1.1", "2001:db8::/32"];
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }
    #[test]
    fn untrusted_peer_is_the_client_whatever_the_header_says() {
        assert_eq!(
            client_ip("203.0.113.9:4431", Some("1.1.1.1"), PROXIES).unwrap(),
            ip("203.0.113.9")
        );
        assert_eq!(
            client_ip("203.0.113.9", None, PROXIES).unwrap(),
            ip("203.0.113.9")
        );
    }
    #[test]
    fn spoofed_left_entries_are_ignored() {
        // the client sent "X-Forwarded-For: 6.6.6.6"; our proxy 10.0.0.5 appended the real peer
        let got = client_ip("10.0.0.5:80", Some("6.6.6.6, 198.51.100.7"), PROXIES).unwrap();
        assert_eq!(got, ip("198.51.100.7"));
        // two trusted hops
        let got = client_ip(
            "10.0.0.5",
            Some("6.6.6.6, 198.51.100.7, 192.168.1.1"),
            PROXIES,
        )
        .unwrap();
        assert_eq!(got, ip("198.51.100.7"));
    }
    #[test]
    fn all_trusted_gives_the_leftmost_and_garbage_stops_the_walk() {
        assert_eq!(
            client_ip("10.0.0.1", Some("10.0.0.2, 10.0.0.3"), PROXIES).unwrap(),
            ip("10.0.0.2")
        );
        assert_eq!(
            client_ip("10.0.0.1", Some("1.2.3.4, nonsense"), PROXIES).unwrap(),
            ip("10.0.0.1")
        );
        assert_eq!(
            client_ip("10.0.0.1", Some(""), PROXIES).unwrap(),
            ip("10.0.0.1")
        );
    }
    #[test]
    fn ipv6_and_mapped_addresses() {
        assert_eq!(
            client_ip("[2001:db8::1]:443", Some("2001:db9::5"), PROXIES).unwrap(),
            ip("2001:db9::5")
        );
        assert_eq!(
            client_ip("::ffff:10.1.2.3", Some("203.0.113.1"), PROXIES).unwrap(),
            ip("203.0.113.1")
        );
    }
    #[test]
    fn bad_input_names_the_argument() {
        assert!(client_ip("nope", None, PROXIES)
            .unwrap_err()
            .to_string()
            .contains("peer_addr"));
        assert!(client_ip("1.2.3.4", None, &["10.0.0.0/33"])
            .unwrap_err()
            .to_string()
            .contains("trusted_proxies"));
    }
}
