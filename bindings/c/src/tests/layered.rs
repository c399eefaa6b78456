//! Layered checks, the block list and the client address.

use super::*;

#[test]
fn layered_checks_block_list_and_client_ip() {
    let f = Fixture::new();
    let mut api = null_mut();
    unsafe {
        assert_eq!(
            shardlimit_limiter_policy(f.lim, c"api".as_ptr(), 3, &mut api, null_mut()),
            SHARDLIMIT_OK
        );
        let layer = |key: &'static str, by_name: bool| shardlimit_layer {
            key: key.as_ptr().cast(),
            key_len: key.len(),
            policy: if by_name { null() } else { api },
            policy_name: c"api".as_ptr(),
            policy_name_len: 3,
            cost: 1,
        };
        // ip:1 has 3 units, tenant:1 gets 2 used first: the tenant layer denies at its 4th
        f.check("tenant:1", "api", 2);
        let layers = [layer("ip:1", true), layer("tenant:1", false)];
        let mut d: shardlimit_decision = std::mem::zeroed();
        assert_eq!(
            shardlimit_check_all(f.lim, layers.as_ptr(), 2, &mut d, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(d.allowed && d.has_layer && d.layer == 1 && d.remaining == 0);
        assert_eq!(
            shardlimit_check_all(f.lim, layers.as_ptr(), 2, &mut d, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(!d.allowed && d.has_layer && d.layer == 1);
        // the denied layered check consumed nothing on ip:1
        assert_eq!(f.check("ip:1", "api", 1).remaining, 1);
        let mut e = null_mut();
        assert_eq!(
            shardlimit_check_all(f.lim, layers.as_ptr(), 0, &mut d, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(take_err(e).1.contains("layers"));
        assert_eq!(
            shardlimit_check_all(f.lim, null(), 2, &mut d, null_mut()),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        let mut bad = layers;
        bad[1].policy = null();
        bad[1].policy_name = c"nope".as_ptr();
        bad[1].policy_name_len = 4;
        assert_eq!(
            shardlimit_check_all(f.lim, bad.as_ptr(), 2, &mut d, null_mut()),
            SHARDLIMIT_ERR_UNKNOWN_POLICY
        );
        shardlimit_policy_free(api);

        // block list
        let key = "bad:actor";
        let reason = "abuse";
        assert_eq!(
            shardlimit_block(
                f.lim,
                key.as_ptr().cast(),
                key.len(),
                60_000,
                reason.as_ptr().cast(),
                reason.len(),
                null_mut()
            ),
            SHARDLIMIT_OK
        );
        let d = f.check(key, "api", 1);
        assert!(!d.allowed);
        assert_eq!(d.source, SHARDLIMIT_SOURCE_BLOCK as u32);
        let mut info: shardlimit_block_info = std::mem::zeroed();
        assert_eq!(
            shardlimit_blocked(f.lim, key.as_ptr().cast(), key.len(), &mut info, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(info.blocked && !info.permanent && info.remaining_us == 60_000_000);
        assert_eq!(
            s(shardlimit_str {
                ptr: info.reason.ptr,
                len: info.reason.len
            }),
            "abuse"
        );
        shardlimit_string_free(&mut info.reason);
        let mut was = false;
        assert_eq!(
            shardlimit_unblock(f.lim, key.as_ptr().cast(), key.len(), &mut was, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(was);
        assert_eq!(
            shardlimit_blocked(f.lim, key.as_ptr().cast(), key.len(), &mut info, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(!info.blocked && info.reason.ptr.is_null());
        assert!(f.check(key, "api", 1).allowed);

        // client_ip: the proxy is trusted, so the XFF entry is the client
        let trusted = [shardlimit_str {
            ptr: c"10.0.0.0/8".as_ptr(),
            len: 10,
        }];
        let (peer, xff) = ("10.1.2.3:443", "198.51.100.7, 10.9.9.9");
        let mut out = shardlimit_string {
            ptr: null_mut(),
            len: 0,
        };
        assert_eq!(
            shardlimit_client_ip(
                peer.as_ptr().cast(),
                peer.len(),
                xff.as_ptr().cast(),
                xff.len(),
                trusted.as_ptr(),
                1,
                &mut out,
                null_mut()
            ),
            SHARDLIMIT_OK
        );
        assert_eq!(
            s(shardlimit_str {
                ptr: out.ptr,
                len: out.len
            }),
            "198.51.100.7"
        );
        shardlimit_string_free(&mut out);
        let mut e = null_mut();
        assert_eq!(
            shardlimit_client_ip(c"nope".as_ptr(), 4, null(), 0, null(), 0, &mut out, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(take_err(e).1.contains("peer"));
        assert!(out.ptr.is_null());
        // the key of a client: IPv6 per network of the prefix, IPv4-mapped as IPv4
        for (peer, prefix, want) in [
            ("[2001:db8:1:2:aaaa::5]:443", 64, "2001:db8:1:2::/64"),
            ("2001:db8:1:2:bbbb::9", 64, "2001:db8:1:2::/64"),
            ("2001:db8:1:2:bbbb::9", 56, "2001:db8:1::/56"),
            ("[::ffff:198.51.100.7]:80", 64, "198.51.100.7"),
            ("198.51.100.7:80", 64, "198.51.100.7"),
        ] {
            assert_eq!(
                shardlimit_client_ip_key(
                    peer.as_ptr().cast(),
                    peer.len(),
                    null(),
                    0,
                    null(),
                    0,
                    prefix,
                    &mut out,
                    null_mut()
                ),
                SHARDLIMIT_OK,
                "{peer}"
            );
            assert_eq!(
                s(shardlimit_str {
                    ptr: out.ptr,
                    len: out.len
                }),
                want,
                "{peer}"
            );
            shardlimit_string_free(&mut out);
        }
        let mut e = null_mut();
        let peer = "2001:db8::1";
        assert_eq!(
            shardlimit_client_ip_key(
                peer.as_ptr().cast(),
                peer.len(),
                null(),
                0,
                null(),
                0,
                0,
                &mut out,
                &mut e
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(take_err(e).1.contains("prefix"));
    }
}
