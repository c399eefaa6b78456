//! Client identity behind proxies: walk `X-Forwarded-For` from the right and stop at the
//! first address that is not a trusted proxy, so a client cannot pick its own IP by sending
//! the header itself.

use crate::error::{Error, Result};
use std::net::IpAddr;

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

/// How many leading bits of an IPv6 client address make its rate-limit key by default: one
/// /64 is what a single subscriber or host usually gets, so a client rotating through the
/// addresses of its /64 keeps one budget.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// A parsed list of trusted proxy networks, and the IPv6 prefix length client-IP keys
/// aggregate to ([`DEFAULT_IPV6_PREFIX`] unless set with
/// [`TrustedProxies::with_ipv6_prefix`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<Cidr>,
    ipv6_prefix: u8,
}

impl Default for TrustedProxies {
    fn default() -> Self {
        TrustedProxies {
            nets: Vec::new(),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

impl TrustedProxies {
    pub fn parse<S: AsRef<str>>(cidrs: &[S]) -> Result<TrustedProxies> {
        let nets = cidrs
            .iter()
            .map(|c| Cidr::parse(c.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        Ok(TrustedProxies {
            nets,
            ..TrustedProxies::default()
        })
    }
    /// The same proxies, with client-IP keys of IPv6 clients aggregated to `/prefix`
    /// (1 to 128; 128 keys every address apart).
    pub fn with_ipv6_prefix(mut self, prefix: u8) -> Result<TrustedProxies> {
        validate_ipv6_prefix(prefix)?;
        self.ipv6_prefix = prefix;
        Ok(self)
    }
    pub fn ipv6_prefix(&self) -> u8 {
        self.ipv6_prefix
    }
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|c| c.contains(ip))
    }
    /// The rate-limit key part of the client behind `peer` ([`client_ip_with`], then
    /// [`ip_key`] with this list's IPv6 prefix).
    pub fn client_key(&self, peer: IpAddr, x_forwarded_for: Option<&str>) -> String {
        ip_key(
            client_ip_with(peer, x_forwarded_for, self),
            self.ipv6_prefix,
        )
    }
}

fn validate_ipv6_prefix(prefix: u8) -> Result<()> {
    if (1..=128).contains(&prefix) {
        Ok(())
    } else {
        Err(Error::invalid(
            "ipv6_prefix",
            format!("must be between 1 and 128, got {prefix}"),
        ))
    }
}

/// The rate-limit key of a client address, the same in every language: an IPv4 address
/// (also when written IPv4-mapped, `::ffff:1.2.3.4`) as itself, an IPv6 address as its
/// network of `ipv6_prefix` bits in canonical form (`2001:db8:1:2::/64`; a /128 is the bare
/// address), so that one client cannot rotate through its network for fresh budgets.
/// `ipv6_prefix` outside 1..=128 is taken as 128 (validate it with
/// [`TrustedProxies::with_ipv6_prefix`] or [`client_ip_key`]).
pub fn ip_key(ip: IpAddr, ipv6_prefix: u8) -> String {
    match canonical(ip) {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) if (1..128).contains(&ipv6_prefix) => {
            let mask = u128::MAX << (128 - ipv6_prefix);
            let net = std::net::Ipv6Addr::from(u128::from(v6) & mask);
            format!("{net}/{ipv6_prefix}")
        }
        IpAddr::V6(v6) => v6.to_string(),
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`) are the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Parses `1.2.3.4`, `1.2.3.4:5678`, `::1`, `[::1]`, `[::1]:80`, and IPv6 addresses with a
/// zone id (`fe80::1%eth0`, `[fe80::1%2]:80`; the zone is dropped).
pub fn parse_peer(peer: &str) -> Result<IpAddr> {
    let bad = || Error::invalid("peer_addr", format!("{peer:?} is not an IP address"));
    let p = peer.trim();
    // `[addr]` or `[addr]:port`
    let p = match p.strip_prefix('[') {
        Some(rest) => {
            let (inner, after) = rest.split_once(']').ok_or_else(bad)?;
            if !(after.is_empty()
                || after
                    .strip_prefix(':')
                    .is_some_and(|port| port.parse::<u16>().is_ok()))
            {
                return Err(bad());
            }
            inner
        }
        None => p,
    };
    let without_zone = |s: &str| -> Option<IpAddr> {
        let (addr, zone) = s.split_once('%')?;
        if zone.is_empty()
            || !zone
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return None;
        }
        addr.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6)
    };
    p.parse::<IpAddr>()
        .ok()
        .or_else(|| without_zone(p))
        .or_else(|| {
            // `1.2.3.4:80` (an IPv6 address with a port must be bracketed)
            let (a, port) = p.rsplit_once(':')?;
            port.parse::<u16>().ok()?;
            a.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
        })
        .map(canonical)
        .ok_or_else(bad)
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

/// The rate-limit key part of the client ([`client_ip`], then [`ip_key`]): what to put
/// after `ip:` in a key. `ipv6_prefix` is 1 to 128 ([`DEFAULT_IPV6_PREFIX`] is 64).
pub fn client_ip_key<S: AsRef<str>>(
    peer_addr: &str,
    x_forwarded_for: Option<&str>,
    trusted_proxies: &[S],
    ipv6_prefix: u8,
) -> Result<String> {
    validate_ipv6_prefix(ipv6_prefix)?;
    Ok(ip_key(
        client_ip(peer_addr, x_forwarded_for, trusted_proxies)?,
        ipv6_prefix,
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

    #[test]
    fn peers_in_every_form() {
        for (peer, want) in [
            ("1.2.3.4", "1.2.3.4"),
            (" 1.2.3.4:5678 ", "1.2.3.4"),
            ("::1", "::1"),
            ("[::1]", "::1"),
            ("[::1]:80", "::1"),
            ("2001:DB8:0:0:0:0:0:1", "2001:db8::1"),
            ("2001:db8::1%eth0", "2001:db8::1"),
            ("[fe80::1%2]:443", "fe80::1"),
            ("[fe80::1%en0]", "fe80::1"),
            ("::ffff:1.2.3.4", "1.2.3.4"),
            ("[::ffff:1.2.3.4]:99", "1.2.3.4"),
            ("::ffff:0102:0304", "1.2.3.4"),
            ("::1.2.3.4", "::102:304"),
        ] {
            assert_eq!(parse_peer(peer).unwrap().to_string(), want, "{peer}");
        }
        for bad in [
            "",
            "[",
            "[::1",
            "[::1]x",
            "[::1]:99999",
            "::1:80]",
            "1.2.3.4:",
            "1.2.3.4:x",
            "1.2.3",
            "2001:db8::1%",
            "2001:db8::1%a b",
            "1.2.3.4%eth0",
            "[1.2.3.4]:80x",
            "::1::2",
        ] {
            let e = parse_peer(bad).unwrap_err().to_string();
            assert!(e.contains("peer_addr"), "{bad}: {e}");
        }
    }

    #[test]
    fn ipv6_keys_aggregate_to_the_prefix() {
        let key = |s: &str, p: u8| ip_key(parse_peer(s).unwrap(), p);
        // one /64: every address of it (compressed or not, any zone) is one key
        let k = key("2001:db8:1:2::1", 64);
        assert_eq!(k, "2001:db8:1:2::/64");
        for same in [
            "2001:db8:1:2:ffff:ffff:ffff:ffff",
            "[2001:0db8:0001:0002:0000:0000:0000:0009]:443",
            "2001:db8:1:2::abcd%eth0",
            "2001:DB8:1:2:aaaa::",
        ] {
            assert_eq!(key(same, 64), k, "{same}");
        }
        assert_ne!(key("2001:db8:1:3::1", 64), k);
        assert_eq!(key("2001:db8:1:2ff::1", 56), "2001:db8:1:200::/56");
        assert_eq!(key("2001:db8::1", 128), "2001:db8::1");
        assert_eq!(key("2001:db8::1", 1), "::/1");
        assert_eq!(key("ffff::1", 1), "8000::/1");
        // IPv4, mapped or not, is never aggregated
        assert_eq!(key("::ffff:203.0.113.9", 64), "203.0.113.9");
        assert_eq!(key("203.0.113.9:80", 8), "203.0.113.9");
        assert_eq!(
            client_ip_key("[2001:db8::1]:443", Some("2001:db9::5"), PROXIES, 64).unwrap(),
            "2001:db9::/64"
        );
        assert_eq!(
            client_ip_key("10.0.0.5", Some("::ffff:198.51.100.7"), PROXIES, 64).unwrap(),
            "198.51.100.7"
        );
        let t = TrustedProxies::parse(PROXIES).unwrap();
        assert_eq!(t.ipv6_prefix(), DEFAULT_IPV6_PREFIX);
        assert_eq!(t.client_key(ip("2001:db9::5:6"), None), "2001:db9::/64");
        let t = t.with_ipv6_prefix(48).unwrap();
        assert_eq!(t.client_key(ip("2001:db9:7:8::1"), None), "2001:db9:7::/48");
        for bad in [0, 129, 255] {
            let e = TrustedProxies::default().with_ipv6_prefix(bad).unwrap_err();
            assert!(e.to_string().contains("ipv6_prefix"), "{e}");
            assert!(client_ip_key("::1", None, PROXIES, bad).is_err());
        }
    }
}
