//! Checks through the ABI: one key, leases, decisions round-tripped, the environment.

use super::*;

#[test]
fn fixed_window_through_the_abi() {
    let f = Fixture::new();
    for i in 0..3 {
        let d = f.check("user:1", "api", 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, 2 - i);
        assert_eq!(d.limit, 3);
        assert_eq!(d.source, SHARDLIMIT_SOURCE_MEMORY as u32);
        assert!(!d.has_shard);
        assert_eq!(
            &d.policy[..4],
            &[b'a' as c_char, b'p' as c_char, b'i' as c_char, 0]
        );
        assert_eq!(d.policy_len, 3);
    }
    let d = f.check("user:1", "api", 1);
    assert!(!d.allowed);
    assert!(d.has_retry_after);
    assert!(d.retry_after_us > 0 && d.retry_after_us <= 10_000_000);
    // a cost that can never fit has no retry_after
    let never = f.check("user:2", "api", 4);
    assert!(!never.allowed && !never.has_retry_after);

    // headers and body come from the core's renderers
    let mut h = null_mut();
    unsafe {
        assert_eq!(
            shardlimit_decision_headers(&d, &mut h, null_mut()),
            SHARDLIMIT_OK
        );
        let core = decision_from_c(&d).unwrap().headers();
        assert_eq!(shardlimit_headers_len(h), core.len());
        for (i, (k, v)) in core.iter().enumerate() {
            let (mut n, mut val) = (shardlimit_str::EMPTY, shardlimit_str::EMPTY);
            assert_eq!(
                shardlimit_headers_get(h, i, &mut n, &mut val, null_mut()),
                SHARDLIMIT_OK
            );
            assert_eq!((s(n).as_str(), s(val)), (*k, v.clone()));
        }
        let (mut n, mut val) = (shardlimit_str::EMPTY, shardlimit_str::EMPTY);
        let mut e = null_mut();
        assert_eq!(
            shardlimit_headers_get(h, core.len(), &mut n, &mut val, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(take_err(e).1.contains("out of range"));
        shardlimit_headers_free(h);
        shardlimit_headers_free(h); // a double free is detected and ignored

        let mut body = shardlimit_string {
            ptr: null_mut(),
            len: 0,
        };
        assert_eq!(
            shardlimit_decision_body(&d, &mut body, null_mut()),
            SHARDLIMIT_OK
        );
        let text = s(shardlimit_str {
            ptr: body.ptr,
            len: body.len,
        });
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"], "rate_limited");
        assert_eq!(v["policy"], "api");
        shardlimit_string_free(&mut body);
        assert!(body.ptr.is_null());
        shardlimit_string_free(&mut body);
        shardlimit_string_free(null_mut());
    }
    // the window ends: time comes from the injected clock only
    unsafe {
        assert_eq!(
            shardlimit_clock_advance_us(f.clock, 10_000_000, null_mut()),
            SHARDLIMIT_OK
        );
    }
    assert!(f.check("user:1", "api", 1).allowed);
}

/// The config-reload pattern: threads check through one limiter while it is
/// freed and a new one (another limit) is created at once. Every call must return a
/// decision of the limiter it was given, or CLOSED; never the new limiter's decision.
#[test]
fn closing_a_limiter_while_threads_check() {
    const OLD: &str =
        r#"{"policies":{"api":{"algorithm":"fixed_window","limit":1000000,"window":"1h"}}}"#;
    const NEW: &str =
        r#"{"policies":{"api":{"algorithm":"fixed_window","limit":7,"window":"1h"}}}"#;
    const THREADS: usize = 4;
    use std::sync::atomic::{AtomicUsize, Ordering};
    for _round in 0..50 {
        let old = limiter(OLD) as usize;
        let checked = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let checked = checked.clone();
                std::thread::spawn(move || {
                    let lim = old as *const shardlimit_limiter;
                    let (mut decided, mut closed) = (0, 0);
                    // until CLOSED, then 100 calls more: each must be CLOSED again
                    while closed < 100 {
                        match check_named(lim, "k", "api") {
                            Ok(d) => {
                                assert_eq!(closed, 0, "a decision after CLOSED");
                                assert_eq!(d.limit, 1_000_000, "another limiter's decision");
                                decided += 1;
                                checked.fetch_add(1, Ordering::Relaxed);
                            }
                            Err((code, msg)) => {
                                assert_eq!(code, SHARDLIMIT_ERR_CLOSED, "{msg}");
                                closed += 1;
                            }
                        }
                    }
                    decided
                })
            })
            .collect();
        // free only once every thread is checking (each has made some decisions)
        while checked.load(Ordering::Relaxed) < THREADS * 20 {
            std::thread::yield_now();
        }
        unsafe { shardlimit_limiter_free(old as *mut shardlimit_limiter) };
        let new = limiter(NEW);
        let decided: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(decided >= THREADS * 20);
        assert_eq!(check_named(new, "k", "api").unwrap().limit, 7);
        unsafe { shardlimit_limiter_free(new) };
    }
}

#[test]
fn ad_hoc_policies_peek_reset_and_leases() {
    let f = Fixture::new();
    let lim = shardlimit_limit {
        algorithm: shardlimit_algorithm::SHARDLIMIT_ALGORITHM_TOKEN_BUCKET as u32,
        limit: 2,
        period_ms: 0,
        rate_per_sec: 1.0,
        on_error: shardlimit_on_error::SHARDLIMIT_ON_ERROR_CLOSED as u32,
    };
    let name = "tb";
    let mut p = null_mut();
    unsafe {
        assert_eq!(
            shardlimit_policy_new(name.as_ptr().cast(), 2, &lim, &mut p, null_mut()),
            SHARDLIMIT_OK
        );
        assert_eq!(s(shardlimit_policy_name(p)), "tb");
        let key = "k";
        let mut d: shardlimit_decision = std::mem::zeroed();
        for _ in 0..2 {
            assert_eq!(
                shardlimit_check(f.lim, key.as_ptr().cast(), 1, p, 1, &mut d, null_mut()),
                SHARDLIMIT_OK
            );
            assert!(d.allowed);
        }
        assert_eq!(
            shardlimit_peek(f.lim, key.as_ptr().cast(), 1, p, &mut d, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(
            shardlimit_reset(f.lim, key.as_ptr().cast(), 1, p, null_mut()),
            SHARDLIMIT_OK
        );
        assert_eq!(
            shardlimit_peek(f.lim, key.as_ptr().cast(), 1, p, &mut d, null_mut()),
            SHARDLIMIT_OK
        );
        assert_eq!(d.remaining, 2);
        shardlimit_policy_free(p);

        // bad parameters are config errors naming the field
        let mut bad = lim;
        bad.rate_per_sec = f64::NAN;
        let mut e = null_mut();
        assert_eq!(
            shardlimit_policy_new(name.as_ptr().cast(), 2, &bad, &mut p, &mut e),
            SHARDLIMIT_ERR_CONFIG
        );
        assert!(take_err(e).1.contains("refill_per_sec"));
        bad.algorithm = 99;
        assert_eq!(
            shardlimit_policy_new(name.as_ptr().cast(), 2, &bad, &mut p, null_mut()),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );

        // leases: one unit of `conc`
        let cname = "conc";
        let mut conc = null_mut();
        assert_eq!(
            shardlimit_limiter_policy(f.lim, cname.as_ptr().cast(), 4, &mut conc, null_mut()),
            SHARDLIMIT_OK
        );
        let mut lease = null_mut();
        assert_eq!(
            shardlimit_acquire(
                f.lim,
                key.as_ptr().cast(),
                1,
                conc,
                1,
                &mut d,
                &mut lease,
                null_mut()
            ),
            SHARDLIMIT_OK
        );
        assert!(d.allowed && !lease.is_null());
        let mut second: *mut shardlimit_lease = std::ptr::NonNull::dangling().as_ptr();
        assert_eq!(
            shardlimit_acquire(
                f.lim,
                key.as_ptr().cast(),
                1,
                conc,
                1,
                &mut d,
                &mut second,
                null_mut()
            ),
            SHARDLIMIT_OK
        );
        assert!(!d.allowed && second.is_null());
        let mut released = false;
        assert_eq!(
            shardlimit_release(f.lim, lease, &mut released, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(released);
        assert_eq!(
            shardlimit_release(f.lim, lease, &mut released, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(!released);
        shardlimit_lease_free(lease);
        shardlimit_lease_free(lease);
        assert_eq!(
            shardlimit_release(f.lim, lease, &mut released, null_mut()),
            SHARDLIMIT_ERR_CLOSED
        );
        shardlimit_policy_free(conc);
    }
}

#[test]
fn decisions_round_trip_and_bad_structs_are_rejected() {
    let f = Fixture::new();
    let d = f.check("rt", "api", 1);
    let core = decision_from_c(&d).unwrap();
    let again = decision_to_c(&core).unwrap();
    assert_eq!(format!("{:?}", again), format!("{:?}", d));
    let mut bad = d;
    bad.source = 0;
    let mut h = null_mut();
    unsafe {
        assert_eq!(
            shardlimit_decision_headers(&bad, &mut h, null_mut()),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        bad = d;
        bad.policy_len = 500;
        let mut js = shardlimit_string {
            ptr: null_mut(),
            len: 0,
        };
        assert_eq!(
            shardlimit_decision_to_json(&bad, &mut js, null_mut()),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(js.ptr.is_null());
        assert_eq!(
            shardlimit_decision_to_json(&d, &mut js, null_mut()),
            SHARDLIMIT_OK
        );
        let v: serde_json::Value = serde_json::from_str(&s(shardlimit_str {
            ptr: js.ptr,
            len: js.len,
        }))
        .unwrap();
        assert_eq!(v, core.to_json());
        shardlimit_string_free(&mut js);
    }
    assert!(h.is_null());
}

#[test]
fn env_config() {
    // the only test touching the environment
    let lim_json = r#"{"policies":{"e":{"algorithm":"fixed_window","limit":1,"window":"1s"}}}"#;
    std::env::set_var("SHARDLIMIT_CONFIG", lim_json);
    let mut lim = null_mut();
    let mut p = null_mut();
    unsafe {
        assert_eq!(
            shardlimit_limiter_new_env(null(), &mut lim, null_mut()),
            SHARDLIMIT_OK
        );
        assert_eq!(
            shardlimit_limiter_policy(lim, c"e".as_ptr(), 1, &mut p, null_mut()),
            SHARDLIMIT_OK
        );
        shardlimit_policy_free(p);
        shardlimit_limiter_free(lim);
    }
    std::env::remove_var("SHARDLIMIT_CONFIG");
}
