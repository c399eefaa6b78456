//! The client's address behind trusted proxies, and its rate-limit key.

use super::*;

/// Trusted proxy networks (`10.0.0.0/8`, `2001:db8::/32`, bare addresses), parsed once.
#[pyclass(frozen, module = "shardlimit", name = "TrustedProxies")]
pub struct TrustedProxies(pub(crate) shardlimit::TrustedProxies);

#[pymethods]
impl TrustedProxies {
    #[new]
    #[pyo3(signature = (cidrs = Vec::new()))]
    pub(crate) fn new(cidrs: Vec<String>) -> PyResult<TrustedProxies> {
        shardlimit::TrustedProxies::parse(&cidrs)
            .map(TrustedProxies)
            .map_err(core_err)
    }
    /// The client's address: `peer` (with or without a port) unless it is a trusted proxy;
    /// then X-Forwarded-For from the right, up to the first address not trusted.
    #[pyo3(signature = (peer, x_forwarded_for = None))]
    pub(crate) fn client_ip(&self, peer: &str, x_forwarded_for: Option<&str>) -> PyResult<String> {
        let peer = shardlimit::parse_peer(peer).map_err(core_err)?;
        Ok(shardlimit::client_ip_with(peer, x_forwarded_for, &self.0).to_string())
    }
    pub(crate) fn __contains__(&self, ip: &str) -> PyResult<bool> {
        Ok(self
            .0
            .contains(shardlimit::parse_peer(ip).map_err(core_err)?))
    }
}

/// The rate-limit key of a client address (the core's `ip_key`): IPv4, also IPv4-mapped,
/// as itself; IPv6 as its network of `ipv6_prefix` bits (1 to 128), `2001:db8:1:2::/64`.
#[pyfunction]
#[pyo3(signature = (ip, ipv6_prefix = shardlimit::DEFAULT_IPV6_PREFIX))]
pub(crate) fn ip_key(ip: &str, ipv6_prefix: u8) -> PyResult<String> {
    shardlimit::client_ip_key(ip, None, &[] as &[&str], ipv6_prefix).map_err(core_err)
}

/// The client's address behind proxies (see `TrustedProxies.client_ip`).
#[pyfunction]
#[pyo3(signature = (peer, x_forwarded_for = None, trusted_proxies = Vec::new()))]
pub(crate) fn client_ip(
    peer: &str,
    x_forwarded_for: Option<&str>,
    trusted_proxies: Vec<String>,
) -> PyResult<String> {
    shardlimit::client_ip(peer, x_forwarded_for, &trusted_proxies)
        .map(|ip| ip.to_string())
        .map_err(core_err)
}
