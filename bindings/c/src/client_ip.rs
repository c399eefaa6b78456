//! The client's address and rate-limit key from a peer and `X-Forwarded-For`.

use super::*;

/// The client's IP address for rate limiting: the peer itself unless it is one of the
/// trusted proxies; then the `X-Forwarded-For` entries from the right, skipping trusted
/// proxies, up to the first untrusted one (entries a client prepended are never
/// reached). `peer` is the socket's remote address with or without a port (`1.2.3.4`,
/// `1.2.3.4:5678`, `[::1]:80`); `xff` the raw header (several headers joined with `,`), or
/// NULL when absent; `trusted` an array of `trusted_count` CIDRs (`10.0.0.0/8`, a bare
/// address), may be NULL when the count is 0. All borrowed for the call only.
///
/// On success `*out` is the address as text, an owned string the caller frees with
/// `shardlimit_string_free()`. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT (a peer that is not an address, a bad CIDR), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_client_ip(
    peer: *const c_char,
    peer_len: usize,
    xff: *const c_char,
    xff_len: usize,
    trusted: *const shardlimit_str,
    trusted_count: usize,
    out: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (peer, xff, cidrs) =
            client_ip_args(peer, peer_len, xff, xff_len, trusted, trusted_count)?;
        let out = out_arg("out", out)?;
        let ip = shardlimit::client_ip(peer, xff, &cidrs)?;
        out.write(owned_string(ip.to_string()));
        Ok(())
    })
}

/// The rate-limit key of the client that `shardlimit_client_ip()` finds (same arguments):
/// an IPv4 address (or an IPv4-mapped IPv6 one) as the IPv4 address, an IPv6 address as its
/// network of `ipv6_prefix` bits (`2001:db8:1:2::/64`; 1 to 128, 64 in every binding's
/// default), so that one client cannot get a fresh budget per address of its network. The
/// rule lives in the core: every language gives the same key.
///
/// On success `*out` is the key, an owned string the caller frees with
/// `shardlimit_string_free()`. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT (a peer that is not an address, a bad CIDR, a prefix
/// outside 1..=128), INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_client_ip_key(
    peer: *const c_char,
    peer_len: usize,
    xff: *const c_char,
    xff_len: usize,
    trusted: *const shardlimit_str,
    trusted_count: usize,
    ipv6_prefix: u8,
    out: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (peer, xff, cidrs) =
            client_ip_args(peer, peer_len, xff, xff_len, trusted, trusted_count)?;
        let out = out_arg("out", out)?;
        let key = shardlimit::client_ip_key(peer, xff, &cidrs, ipv6_prefix)?;
        out.write(owned_string(key));
        Ok(())
    })
}

/// The borrowed arguments of `shardlimit_client_ip()` and `shardlimit_client_ip_key()`.
pub(crate) fn client_ip_args<'a>(
    peer: *const c_char,
    peer_len: usize,
    xff: *const c_char,
    xff_len: usize,
    trusted: *const shardlimit_str,
    trusted_count: usize,
) -> Result<(&'a str, Option<&'a str>, Vec<&'a str>), Error> {
    let peer = str_arg("peer", peer, peer_len)?;
    let xff = if xff.is_null() {
        None
    } else {
        Some(str_arg("xff", xff, xff_len)?)
    };
    if trusted_count > MAX_LAYERS_READ {
        return Err(invalid(
            "trusted_count",
            format!("{trusted_count} is implausible"),
        ));
    }
    let raw = slice_arg("trusted", trusted, trusted_count)?;
    let cidrs = raw
        .iter()
        .enumerate()
        .map(|(i, s)| str_arg(&format!("trusted[{i}]"), s.ptr, s.len))
        .collect::<Result<Vec<&str>, Error>>()?;
    Ok((peer, xff, cidrs))
}
