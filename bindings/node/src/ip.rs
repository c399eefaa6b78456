//! The client's address behind trusted proxies, and its rate-limit key.

use super::*;

/// Trusted proxy networks, parsed once, for finding the client IP behind proxies.
#[napi]
pub struct TrustedProxies {
    pub(crate) inner: shardlimit::TrustedProxies,
}

#[napi]
impl TrustedProxies {
    /// `cidrs`: `10.0.0.0/8`, `2001:db8::/32`, or bare addresses.
    /// `ipv6_prefix` (1 to 128, default 64): how many bits of an IPv6 client's address
    /// make its key (`client_key`).
    #[napi(constructor, catch_unwind)]
    pub fn new(env: Env, cidrs: Vec<String>, ipv6_prefix: Option<u32>) -> Result<Self> {
        guarded(|| {
            let t = shardlimit::TrustedProxies::parse(&cidrs)?;
            match ipv6_prefix {
                Some(p) => t.with_ipv6_prefix(ipv6_prefix_u8(p)?),
                None => Ok(t),
            }
        })
        .map(|inner| TrustedProxies { inner })
        .map_err(|e| core_error(&env, e))
    }

    /// The rate-limit key of the client (the core's `client_key`): its address, IPv6
    /// aggregated to the prefix given to the constructor (`2001:db8:1:2::/64`).
    #[napi(catch_unwind)]
    pub fn client_key(
        &self,
        env: Env,
        peer: String,
        x_forwarded_for: Option<String>,
    ) -> Result<String> {
        guarded(|| {
            let peer = shardlimit::parse_peer(&peer)?;
            Ok(self.inner.client_key(peer, x_forwarded_for.as_deref()))
        })
        .map_err(|e| core_error(&env, e))
    }

    /// The client address (the core's rule): the peer unless it is a trusted proxy; then
    /// `X-Forwarded-For` from the right up to the first untrusted hop.
    #[napi(catch_unwind)]
    pub fn client_ip(
        &self,
        env: Env,
        peer: String,
        x_forwarded_for: Option<String>,
    ) -> Result<String> {
        guarded(|| {
            let peer = shardlimit::parse_peer(&peer)?;
            Ok(
                shardlimit::client_ip_with(peer, x_forwarded_for.as_deref(), &self.inner)
                    .to_string(),
            )
        })
        .map_err(|e| core_error(&env, e))
    }
}

pub(crate) fn ipv6_prefix_u8(p: u32) -> shardlimit::Result<u8> {
    u8::try_from(p).map_err(|_| shardlimit::Error::InvalidArgument {
        what: "ipv6_prefix".into(),
        message: format!("must be between 1 and 128, got {p}"),
    })
}

/// The rate-limit key of a client address (the core's `ip_key`): IPv4 (also IPv4-mapped)
/// as itself, IPv6 as its network of `ipv6_prefix` bits (1 to 128, default 64).
#[napi(catch_unwind)]
pub fn ip_key(env: Env, ip: String, ipv6_prefix: Option<u32>) -> Result<String> {
    guarded(|| {
        let p = ipv6_prefix_u8(ipv6_prefix.unwrap_or(shardlimit::DEFAULT_IPV6_PREFIX as u32))?;
        shardlimit::client_ip_key(&ip, None, &[] as &[&str], p)
    })
    .map_err(|e| core_error(&env, e))
}

/// The client address behind proxies (see `TrustedProxies.clientIp`).
#[napi(catch_unwind)]
pub fn client_ip(
    env: Env,
    peer: String,
    x_forwarded_for: Option<String>,
    trusted_proxies: Vec<String>,
) -> Result<String> {
    guarded(|| shardlimit::client_ip(&peer, x_forwarded_for.as_deref(), &trusted_proxies))
        .map(|ip| ip.to_string())
        .map_err(|e| core_error(&env, e))
}
