//! The client's address behind trusted proxies, and its rate-limit key.

use super::*;

/// The rate-limit key part of a client (`client_ip_key`): the peer address, the
/// X-Forwarded-For header (null when absent) and the trusted proxies' CIDRs.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_clientIpKey(
    mut env: JNIEnv,
    _: JClass,
    peer: JByteArray,
    xff: JByteArray,
    trusted: JObjectArray,
    ipv6_prefix: jint,
) -> jstring {
    run(&mut env, std::ptr::null_mut(), |env| {
        let peer = text(env, &peer, "peer")?;
        let xff = opt_text(env, &xff, "x_forwarded_for")?;
        let mut cidrs = Vec::new();
        if !trusted.as_raw().is_null() {
            for i in 0..env.get_array_length(&trusted)? {
                let c = JByteArray::from(env.get_object_array_element(&trusted, i)?);
                cidrs.push(text(env, &c, "trusted_proxies")?);
            }
        }
        let prefix =
            u8::try_from(ipv6_prefix).map_err(|_| invalid("ipv6_prefix", "must be 1 to 128"))?;
        let key = shardlimit::client_ip_key(&peer, xff.as_deref(), &cidrs, prefix)?;
        jstr(env, key)
    })
}
