//! Live per-key overrides.

use super::*;

#[test]
fn overrides_through_the_abi() {
    let cfg = r#"{"policies":{
        "api":{"algorithm":"fixed_window","limit":3,"window":"10s","overrides":true},
        "plain":{"algorithm":"fixed_window","limit":3,"window":"10s"}}}"#;
    let lim = limiter(cfg);
    let check_key = |lim: *const shardlimit_limiter, policy: &str, key: &str| {
        let mut d = std::mem::MaybeUninit::<shardlimit_decision>::uninit();
        let rc = unsafe {
            shardlimit_check_named(
                lim,
                key.as_ptr().cast(),
                key.len(),
                policy.as_ptr().cast(),
                policy.len(),
                1,
                d.as_mut_ptr(),
                null_mut(),
            )
        };
        assert_eq!(rc, SHARDLIMIT_OK);
        unsafe { d.assume_init() }
    };
    let set = |key: &str, policy: &str, limit: &str, ttl_ms: u64| {
        let mut out = shardlimit_string {
            ptr: null_mut(),
            len: 0,
        };
        let mut e = null_mut();
        let rc = unsafe {
            shardlimit_set_override(
                lim,
                key.as_ptr().cast(),
                key.len(),
                policy.as_ptr().cast(),
                policy.len(),
                limit.as_ptr().cast(),
                limit.len(),
                ttl_ms,
                &mut out,
                &mut e,
            )
        };
        if rc == SHARDLIMIT_OK {
            Ok(owned(out))
        } else {
            assert!(
                out.ptr.is_null(),
                "out-parameters are written only on success"
            );
            Err(take_err(e))
        }
    };
    let get = |key: &str| {
        let mut found = true;
        let mut out = shardlimit_string {
            ptr: null_mut(),
            len: 0,
        };
        let rc = unsafe {
            shardlimit_get_override(
                lim,
                key.as_ptr().cast(),
                key.len(),
                "api".as_ptr().cast(),
                3,
                &mut found,
                &mut out,
                null_mut(),
            )
        };
        assert_eq!(rc, SHARDLIMIT_OK);
        found.then(|| owned(out))
    };
    assert_eq!(check_key(lim, "api", "t").limit, 3);
    let json = set("t", "api", "100/minute", 60_000).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["limit"]["limit"], 100);
    assert_eq!(v["remaining_ms"], 60_000);
    assert_eq!(check_key(lim, "api", "t").limit, 100);
    assert!(get("t").unwrap().contains("\"limit\":100"));
    assert_eq!(get("nobody"), None);
    // errors: a policy without overrides, a plan name, an unknown policy
    let (rc, msg) = set("t", "plain", "5/minute", 0).unwrap_err();
    assert_eq!(rc, SHARDLIMIT_ERR_INVALID_ARGUMENT, "{msg}");
    assert!(msg.contains("overrides"), "{msg}");
    let (rc, msg) = set("t", "api", "gold", 0).unwrap_err();
    assert_eq!(rc, SHARDLIMIT_ERR_INVALID_ARGUMENT, "{msg}");
    let (rc, _) = set("t", "nope", "5/minute", 0).unwrap_err();
    assert_eq!(rc, SHARDLIMIT_ERR_UNKNOWN_POLICY);
    // list: pages with a cursor
    set("u", "api", "7/minute", 0).unwrap();
    let mut keys = Vec::new();
    let mut cursor = String::new();
    loop {
        let mut out = shardlimit_string {
            ptr: null_mut(),
            len: 0,
        };
        let rc = unsafe {
            shardlimit_list_overrides(
                lim,
                "api".as_ptr().cast(),
                3,
                if cursor.is_empty() {
                    null()
                } else {
                    cursor.as_ptr().cast()
                },
                cursor.len(),
                1,
                &mut out,
                null_mut(),
            )
        };
        assert_eq!(rc, SHARDLIMIT_OK);
        let page: serde_json::Value = serde_json::from_str(&owned(out)).unwrap();
        for o in page["overrides"].as_array().unwrap() {
            keys.push(o["key"].as_str().unwrap().to_string());
        }
        match page["cursor"].as_str() {
            Some(c) => cursor = c.to_string(),
            None => break,
        }
    }
    assert_eq!(keys, ["t", "u"]);
    // delete: true, then false; the check is the policy's again
    for want in [true, false] {
        let mut deleted = !want;
        let rc = unsafe {
            shardlimit_delete_override(
                lim,
                "t".as_ptr().cast(),
                1,
                "api".as_ptr().cast(),
                3,
                &mut deleted,
                null_mut(),
            )
        };
        assert_eq!((rc, deleted), (SHARDLIMIT_OK, want));
    }
    assert_eq!(check_key(lim, "api", "t").limit, 3);
    unsafe { shardlimit_limiter_free(lim) };
}
