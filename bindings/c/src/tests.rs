//! Tests of the ABI from Rust, on the in-memory engine with a manual clock, and one over
//! TLS against a real redis-server. The C, Go and C++ tests (scripts/test-c.sh) exercise
//! the same functions against real Redis.

use super::*;
use std::ptr::{null, null_mut};

fn s(x: shardlimit_str) -> String {
    let bytes = unsafe { std::slice::from_raw_parts(x.ptr.cast::<u8>(), x.len) };
    // every returned string is NUL-terminated after `len` bytes
    assert_eq!(unsafe { *x.ptr.add(x.len) }, 0);
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn take_err(e: *mut shardlimit_error) -> (shardlimit_result, String) {
    assert!(!e.is_null());
    let out = unsafe { (shardlimit_error_code(e), s(shardlimit_error_message(e))) };
    unsafe { shardlimit_error_free(e) };
    out
}

const CONFIG: &str = r#"{"policies":{
    "api":{"algorithm":"fixed_window","limit":3,"window":"10s"},
    "conc":{"algorithm":"concurrency","max":1,"lease_ttl":"5s"}}}"#;

struct Fixture {
    clock: *mut shardlimit_clock,
    lim: *mut shardlimit_limiter,
}

impl Fixture {
    fn new() -> Fixture {
        let mut clock = null_mut();
        let mut lim = null_mut();
        unsafe {
            assert_eq!(
                shardlimit_clock_new(1_700_000_000_000_000, &mut clock, null_mut()),
                SHARDLIMIT_OK
            );
            assert_eq!(
                shardlimit_limiter_new_json(
                    CONFIG.as_ptr().cast(),
                    CONFIG.len(),
                    clock,
                    &mut lim,
                    null_mut()
                ),
                SHARDLIMIT_OK
            );
        }
        Fixture { clock, lim }
    }
    fn check(&self, key: &str, policy: &str, cost: u64) -> shardlimit_decision {
        let mut d = std::mem::MaybeUninit::<shardlimit_decision>::uninit();
        let mut e = null_mut();
        let r = unsafe {
            shardlimit_check_named(
                self.lim,
                key.as_ptr().cast(),
                key.len(),
                policy.as_ptr().cast(),
                policy.len(),
                cost,
                d.as_mut_ptr(),
                &mut e,
            )
        };
        assert_eq!(r, SHARDLIMIT_OK, "{:?}", e.is_null().then_some(()));
        assert!(e.is_null());
        unsafe { d.assume_init() }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        unsafe {
            shardlimit_limiter_free(self.lim);
            shardlimit_clock_free(self.clock);
        }
    }
}

#[test]
fn result_codes_match_the_core() {
    for k in ErrorKind::ALL {
        let c = shardlimit_result::from_kind(*k);
        assert_eq!(c as u32, k.code(), "{k:?}");
        assert_eq!(s(shardlimit_result_name(k.code())), k.name());
        assert_eq!(shardlimit_result_is_backend(k.code()), k.is_backend());
        assert_eq!(
            shardlimit_result_parent(k.code()),
            k.parent().map_or(0, |p| p.code())
        );
    }
    assert_eq!(
        shardlimit_result_parent(SHARDLIMIT_ERR_UNKNOWN_POLICY as u32),
        SHARDLIMIT_ERR_INVALID_ARGUMENT as u32
    );
    assert_eq!(shardlimit_result_parent(SHARDLIMIT_ERR_CLOSED as u32), 0);
    assert_eq!(shardlimit_result_parent(4242), 0);
    assert_eq!(s(shardlimit_result_name(0)), "ok");
    for src in [
        Source::Redis,
        Source::Memory,
        Source::Local,
        Source::Fallback,
        Source::Block,
        Source::LocalFallback,
    ] {
        let code = source_to_c(src) as u32;
        assert_eq!(source_from_c(code), Some(src));
        assert_eq!(s(shardlimit_source_name(code)), src.name());
    }
    assert_eq!(s(shardlimit_source_name(0)), "unknown");
    assert_eq!(s(shardlimit_result_name(4242)), "unknown");
    assert!(!shardlimit_result_is_backend(0));
}

#[test]
fn version_matches_the_core_and_the_header() {
    assert_eq!(
        format!("{SHARDLIMIT_VERSION_MAJOR}.{SHARDLIMIT_VERSION_MINOR}.{SHARDLIMIT_VERSION_PATCH}"),
        shardlimit::VERSION
    );
    assert_eq!(s(shardlimit_version()), shardlimit::VERSION);
    let header = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../include/shardlimit.h"
    ))
    .expect("include/shardlimit.h is committed");
    assert!(header.contains(&format!(
        "#define SHARDLIMIT_VERSION \"{}\"",
        shardlimit::VERSION
    )));
}

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

#[test]
fn errors_come_back_owned_and_out_params_stay_untouched() {
    let f = Fixture::new();
    let mut d: shardlimit_decision = unsafe { std::mem::zeroed() };
    d.limit = 77;
    type Case = (
        &'static [u8],
        &'static [u8],
        u64,
        shardlimit_result,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            b"k",
            b"nope",
            1,
            SHARDLIMIT_ERR_UNKNOWN_POLICY,
            "unknown policy `nope`",
        ),
        (b"", b"api", 1, SHARDLIMIT_ERR_INVALID_ARGUMENT, "key"),
        (b"k", b"api", 0, SHARDLIMIT_ERR_INVALID_ARGUMENT, "cost"),
        (b"\xff", b"api", 1, SHARDLIMIT_ERR_INVALID_ARGUMENT, "UTF-8"),
        (b"a\0b", b"api", 1, SHARDLIMIT_ERR_INVALID_ARGUMENT, "NUL"),
    ];
    for (key, policy, cost, code, needle) in cases {
        let mut e = null_mut();
        let r = unsafe {
            shardlimit_check_named(
                f.lim,
                key.as_ptr().cast(),
                key.len(),
                policy.as_ptr().cast(),
                policy.len(),
                cost,
                &mut d,
                &mut e,
            )
        };
        assert_eq!(r, code);
        let (c, m) = take_err(e);
        assert_eq!(c, code);
        assert!(m.contains(needle), "{m}");
        assert_eq!(d.limit, 77, "out-param written on failure");
    }
    // NULL with a length, a wild length, a NULL limiter, a NULL out
    unsafe {
        let p = "api";
        assert_eq!(
            shardlimit_check_named(
                f.lim,
                null(),
                3,
                p.as_ptr().cast(),
                3,
                1,
                &mut d,
                null_mut()
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            shardlimit_check_named(
                f.lim,
                p.as_ptr().cast(),
                usize::MAX,
                p.as_ptr().cast(),
                3,
                1,
                &mut d,
                null_mut()
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            shardlimit_check_named(
                null(),
                p.as_ptr().cast(),
                1,
                p.as_ptr().cast(),
                3,
                1,
                &mut d,
                null_mut()
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            shardlimit_check_named(
                f.lim,
                p.as_ptr().cast(),
                1,
                p.as_ptr().cast(),
                3,
                1,
                null_mut(),
                null_mut()
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            shardlimit_error_code(null()),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(s(shardlimit_error_message(null())), "");
        shardlimit_error_free(null_mut());
    }
    assert_eq!(d.limit, 77);
}

#[test]
fn bad_configs_name_the_field() {
    let bad: &[(&str, shardlimit_result, &str)] = &[
        ("{", SHARDLIMIT_ERR_CONFIG, "not valid JSON"),
        (
            r#"{"policies":{"a":{"algorithm":"fixed_window","limit":0,"window":"1s"}}}"#,
            SHARDLIMIT_ERR_CONFIG,
            "policies.a.limit",
        ),
        (r#"{"shards":[]}"#, SHARDLIMIT_ERR_CONFIG, "shards"),
    ];
    for (json, code, needle) in bad {
        let sentinel: *mut shardlimit_limiter = std::ptr::NonNull::dangling().as_ptr();
        let mut lim = sentinel;
        let mut e = null_mut();
        let r = unsafe {
            shardlimit_limiter_new_json(json.as_ptr().cast(), json.len(), null(), &mut lim, &mut e)
        };
        assert_eq!(r, *code);
        assert_eq!(lim, sentinel, "out-param written on failure");
        let (c, m) = take_err(e);
        assert_eq!(c, *code);
        assert!(m.contains(needle), "{m}");
    }
    let mut lim = null_mut();
    let path = "/nonexistent/shardlimit.json";
    let mut e = null_mut();
    let r = unsafe {
        shardlimit_limiter_new_file(path.as_ptr().cast(), path.len(), null(), &mut lim, &mut e)
    };
    assert_eq!(r, SHARDLIMIT_ERR_IO);
    assert!(take_err(e).1.contains(path));
    assert!(lim.is_null());
}

#[test]
fn freed_and_foreign_handles_are_detected() {
    unsafe {
        let lim = limiter("{}");
        shardlimit_limiter_free(lim);
        shardlimit_limiter_free(lim); // a double free is a no-op
        shardlimit_limiter_free(null_mut());
        let mut p = null_mut();
        let mut e = null_mut();
        let n = "x";
        assert_eq!(
            shardlimit_limiter_policy(lim, n.as_ptr().cast(), 1, &mut p, &mut e),
            SHARDLIMIT_ERR_CLOSED
        );
        let (code, msg) = take_err(e);
        assert_eq!(code, SHARDLIMIT_ERR_CLOSED);
        assert!(msg.contains("shardlimit_limiter was freed"), "{msg}");
        assert_eq!(
            s(shardlimit_result_name(SHARDLIMIT_ERR_CLOSED as u32)),
            "closed"
        );
        assert!(!shardlimit_result_is_backend(SHARDLIMIT_ERR_CLOSED as u32));

        // a handle of another type is not a limiter, and freeing it as one frees nothing
        let mut clock = null_mut();
        assert_eq!(
            shardlimit_clock_new(0, &mut clock, null_mut()),
            SHARDLIMIT_OK
        );
        let mut e = null_mut();
        assert_eq!(
            shardlimit_limiter_policy(clock.cast(), n.as_ptr().cast(), 1, &mut p, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        let msg = take_err(e).1;
        assert!(
            msg.contains("is a shardlimit_clock, not a shardlimit_limiter"),
            "{msg}"
        );
        shardlimit_limiter_free(clock.cast());
        shardlimit_policy_free(clock.cast());
        assert_eq!(shardlimit_clock_set_us(clock, 5, null_mut()), SHARDLIMIT_OK);
        shardlimit_clock_free(clock);
        assert_eq!(
            shardlimit_clock_set_us(clock, 5, null_mut()),
            SHARDLIMIT_ERR_CLOSED
        );

        // a real address, NULL, and a value in the handle range never issued
        let real = Box::into_raw(Box::new(0u64));
        for (bogus, want) in [
            (
                real as *const shardlimit_limiter,
                "never returned by shardlimit",
            ),
            (null(), "is NULL"),
            (
                std::ptr::without_provenance(HANDLE_BASE | (MAX_ID >> 1) << TAG_BITS | 1),
                "never returned by shardlimit",
            ),
        ] {
            let mut e = null_mut();
            assert_eq!(
                shardlimit_limiter_policy(bogus, n.as_ptr().cast(), 1, &mut p, &mut e),
                SHARDLIMIT_ERR_INVALID_ARGUMENT
            );
            let msg = take_err(e).1;
            assert!(msg.contains(want), "{msg}");
            shardlimit_limiter_free(bogus.cast_mut()); // a no-op, not a crash
        }
        drop(Box::from_raw(real));
        assert!(p.is_null());

        // errors: a freed error says CLOSED, a double free is a no-op
        let mut e = null_mut();
        assert_eq!(
            shardlimit_clock_new(0, null_mut(), &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(shardlimit_error_code(e), SHARDLIMIT_ERR_INVALID_ARGUMENT);
        shardlimit_error_free(e);
        shardlimit_error_free(e);
        assert_eq!(shardlimit_error_code(e), SHARDLIMIT_ERR_CLOSED);
        assert_eq!(shardlimit_error_message(e).len, 0);
        assert_eq!(
            shardlimit_error_code(null()),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn a_freed_handle_is_never_given_to_a_new_object() {
    unsafe {
        let first = limiter(CONFIG);
        shardlimit_limiter_free(first);
        // an allocator hands the freed block to the next object of the same size; a handle
        // table keyed by address then answered for the new limiter through the old handle
        let later: Vec<_> = (0..64).map(|_| limiter(CONFIG)).collect();
        assert!(later.iter().all(|l| *l != first));
        let (code, _) = check_named(first, "k", "api").unwrap_err();
        assert_eq!(code, SHARDLIMIT_ERR_CLOSED);
        for l in later {
            assert_eq!(check_named(l, "k", "api").unwrap().limit, 3);
            shardlimit_limiter_free(l);
        }
    }
}

/// The config-reload pattern of issue 13: threads check through one limiter while it is
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
fn a_panic_becomes_internal() {
    let mut e = null_mut();
    let r = unsafe { guard(&mut e, || panic!("boom")) };
    assert_eq!(r, SHARDLIMIT_ERR_INTERNAL);
    let (c, m) = take_err(e);
    assert_eq!(c, SHARDLIMIT_ERR_INTERNAL);
    assert!(m.contains("panic: boom"), "{m}");
}

#[test]
fn decisions_round_trip_and_bad_structs_are_rejected() {
    let f = Fixture::new();
    let d = f.check("rt", "api", 1);
    let core = unsafe { decision_from_c(&d) }.unwrap();
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

/// A real redis-server that also listens for TLS and requires a client certificate, with a
/// CA made for the test by tests/tls/gen-certs.sh; stopped when dropped.
struct TlsRedis {
    child: std::process::Child,
    tls_port: u16,
    certs: tempfile::TempDir,
}

impl TlsRedis {
    fn start() -> TlsRedis {
        use std::process::{Command, Stdio};
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let certs = tempfile::tempdir().unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/tls/gen-certs.sh");
        let st = Command::new("sh")
            .arg(script)
            .arg(certs.path())
            .status()
            .unwrap();
        assert!(st.success(), "gen-certs.sh failed");
        let (port, tls_port) = (free(), free());
        let path = |n: &str| certs.path().join(n);
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(certs.path())
            .args([
                "--tls-port",
                &tls_port.to_string(),
                "--tls-auth-clients",
                "yes",
            ])
            .arg("--tls-cert-file")
            .arg(path("server.crt"))
            .arg("--tls-key-file")
            .arg(path("server.key"))
            .arg("--tls-ca-cert-file")
            .arg(path("ca.crt"))
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let server = TlsRedis {
            child,
            tls_port,
            certs,
        };
        // readiness, not a race: the TLS port accepts connections, for at most 10 s
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", tls_port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        server
    }

    fn config(&self, tls: &str) -> String {
        format!(
            r#"{{"timeout_ms": 2000,
                "shards": [{{"name": "s0", "url": "rediss://127.0.0.1:{}", "tls": {tls}}}],
                "policies": {{
                  "strict": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "error"}},
                  "closed": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "closed"}}}}}}"#,
            self.tls_port
        )
    }

    fn path(&self, name: &str) -> String {
        self.certs.path().join(name).display().to_string()
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn check_named(
    lim: *const shardlimit_limiter,
    key: &str,
    policy: &str,
) -> Result<shardlimit_decision, (shardlimit_result, String)> {
    let mut d = std::mem::MaybeUninit::<shardlimit_decision>::uninit();
    let mut e = null_mut();
    let r = unsafe {
        shardlimit_check_named(
            lim,
            key.as_ptr().cast(),
            key.len(),
            policy.as_ptr().cast(),
            policy.len(),
            1,
            d.as_mut_ptr(),
            &mut e,
        )
    };
    if r == SHARDLIMIT_OK {
        assert!(e.is_null());
        Ok(unsafe { d.assume_init() })
    } else {
        let (code, msg) = take_err(e);
        assert_eq!(code, r);
        Err((r, msg))
    }
}

fn limiter(cfg: &str) -> *mut shardlimit_limiter {
    let mut lim = null_mut();
    let r = unsafe {
        shardlimit_limiter_new_json(cfg.as_ptr().cast(), cfg.len(), null(), &mut lim, null_mut())
    };
    assert_eq!(r, SHARDLIMIT_OK);
    lim
}

#[test]
fn decisions_over_tls_with_mtls() {
    let redis = TlsRedis::start();
    let verified = redis.config(&format!(
        r#"{{"ca_file": "{}", "cert_file": "{}", "key_file": "{}"}}"#,
        redis.path("ca.crt"),
        redis.path("client.crt"),
        redis.path("client.key")
    ));
    let lim = limiter(&verified);
    let d = check_named(lim, "tls-user", "strict").unwrap();
    assert!(d.allowed);
    assert_eq!(d.source, SHARDLIMIT_SOURCE_REDIS as u32);
    assert_eq!(d.remaining, 4);
    unsafe { shardlimit_limiter_free(lim) };
    // a wrong CA, and no client certificate: SHARDLIMIT_ERR_CONNECTION, and on_error decides
    for tls in [
        format!(r#"{{"ca_file": "{}"}}"#, redis.path("other-ca.crt")),
        format!(r#"{{"ca_file": "{}"}}"#, redis.path("ca.crt")),
    ] {
        let lim = limiter(&redis.config(&tls));
        let (code, msg) = check_named(lim, "k", "strict").unwrap_err();
        assert_eq!(code, SHARDLIMIT_ERR_CONNECTION, "{msg}");
        assert!(msg.contains("shard `s0`"), "{msg}");
        let d = check_named(lim, "k", "closed").unwrap();
        assert!(!d.allowed);
        assert_eq!(d.source, SHARDLIMIT_SOURCE_FALLBACK as u32);
        unsafe { shardlimit_limiter_free(lim) };
    }
    // a bad tls field is a config error naming it, through the ABI
    let bad = redis.config(r#"{"ca_file": "/nonexistent/ca.pem"}"#);
    let (mut lim, mut e) = (null_mut(), null_mut());
    let r = unsafe {
        shardlimit_limiter_new_json(bad.as_ptr().cast(), bad.len(), null(), &mut lim, &mut e)
    };
    assert_eq!(r, SHARDLIMIT_ERR_CONFIG);
    assert!(lim.is_null());
    let (_, msg) = take_err(e);
    assert!(
        msg.contains(r#"shards[0].tls.ca_file: cannot read "/nonexistent/ca.pem""#),
        "{msg}"
    );
}

fn owned(mut x: shardlimit_string) -> String {
    let out = unsafe { std::str::from_utf8(std::slice::from_raw_parts(x.ptr.cast::<u8>(), x.len)) }
        .unwrap()
        .to_string();
    unsafe { shardlimit_string_free(&mut x) };
    out
}

#[test]
fn engine_reload_scale_health_and_metrics() {
    let f = Fixture::new();
    unsafe {
        assert!(!shardlimit_is_redis(f.lim));
        assert!(!shardlimit_is_redis(null()));
        let (mut has, mut n) = (true, 99usize);
        f.check("user:1", "api", 1);
        assert_eq!(
            shardlimit_memory_keys(f.lim, &mut has, &mut n, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(has && n >= 1, "{has} {n}");
        let (mut idx, mut name) = (
            0u32,
            shardlimit_string {
                ptr: null_mut(),
                len: 0,
            },
        );
        let mut e = null_mut();
        assert_eq!(
            shardlimit_route(f.lim, "k".as_ptr().cast(), 1, &mut idx, &mut name, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(take_err(e).1.contains("memory"));
        // scale: every policy's limit, then back
        assert_eq!(shardlimit_scale(f.lim), 1.0);
        assert_eq!(
            shardlimit_set_scale(f.lim, 0.5, null(), 0, null_mut()),
            SHARDLIMIT_OK
        );
        assert_eq!(shardlimit_scale(f.lim), 0.5);
        let mut e = null_mut();
        assert_eq!(
            shardlimit_set_scale(f.lim, 2.0, null(), 0, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        take_err(e);
        let unknown = [shardlimit_str {
            ptr: c"nope".as_ptr(),
            len: 4,
        }];
        let mut e = null_mut();
        assert_eq!(
            shardlimit_set_scale(f.lim, 0.5, unknown.as_ptr(), 1, &mut e),
            SHARDLIMIT_ERR_UNKNOWN_POLICY
        );
        take_err(e);
        // health: no hook is an error; the latency hook halves at twice the target
        let mut factor = 0.0;
        let mut e = null_mut();
        assert_eq!(
            shardlimit_observe_health(f.lim, 0.1, &mut factor, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        take_err(e);
        assert_eq!(
            shardlimit_set_latency_scale(f.lim, 100_000, 0.1, null_mut()),
            SHARDLIMIT_OK
        );
        assert_eq!(
            shardlimit_observe_health(f.lim, 0.2, &mut factor, null_mut()),
            SHARDLIMIT_OK
        );
        assert!((factor - 0.5).abs() < 1e-9, "{factor}");
        assert_eq!(
            shardlimit_observe_health(f.lim, 0.05, &mut factor, null_mut()),
            SHARDLIMIT_OK
        );
        assert_eq!(factor, 1.0);
        // reload: the new limit applies to the next check, a bad config changes nothing
        let cfg = r#"{"policies":{"api":{"algorithm":"fixed_window","limit":7,"window":"10s"}}}"#;
        assert_eq!(
            shardlimit_reload(f.lim, cfg.as_ptr().cast(), cfg.len(), null_mut()),
            SHARDLIMIT_OK
        );
        assert_eq!(f.check("user:2", "api", 1).limit, 7);
        let bad = r#"{"policies":{"api":{"algorithm":"fixed_window","limit":0,"window":"10s"}}}"#;
        let mut e = null_mut();
        assert_eq!(
            shardlimit_reload(f.lim, bad.as_ptr().cast(), bad.len(), &mut e),
            SHARDLIMIT_ERR_CONFIG
        );
        assert!(take_err(e).1.contains("limit"));
        assert_eq!(f.check("user:3", "api", 1).limit, 7);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        std::fs::write(&path, cfg.replace('7', "8")).unwrap();
        let p = path.to_str().unwrap();
        assert_eq!(
            shardlimit_reload_from_file(f.lim, p.as_ptr().cast(), p.len(), null_mut()),
            SHARDLIMIT_OK
        );
        assert_eq!(f.check("user:4", "api", 1).limit, 8);
        let mut e = null_mut();
        assert_eq!(
            shardlimit_reload_from_file(f.lim, "/nonexistent/x.json".as_ptr().cast(), 19, &mut e),
            SHARDLIMIT_ERR_IO
        );
        take_err(e);
        // metrics: JSON and Prometheus text, with the checks made above
        let mut out = shardlimit_string {
            ptr: null_mut(),
            len: 0,
        };
        assert_eq!(
            shardlimit_metrics(f.lim, &mut out, null_mut()),
            SHARDLIMIT_OK
        );
        let json: serde_json::Value = serde_json::from_str(&owned(out)).unwrap();
        let api = json["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["policy"] == "api")
            .expect("api's counters");
        // (one check since the last reload: the core's reload restarts the counters today)
        assert!(api["allowed"].as_u64().unwrap() >= 1, "{json}");
        let mut out = shardlimit_string {
            ptr: null_mut(),
            len: 0,
        };
        assert_eq!(
            shardlimit_metrics_prometheus(f.lim, &mut out, null_mut()),
            SHARDLIMIT_OK
        );
        let text = owned(out);
        assert!(text.contains("policy=\"api\""), "{text}");
    }
}

/// Rate strings and plans through the ABI: a multi-limit policy decides in one call, the
/// decision carries its limits, and the headers rendered from the C struct are the core's.
#[test]
fn rate_policies_plans_and_multi_limit_decisions() {
    const PLANS: &str = r#"{"policies":{"api":"2/second; 3/minute"},
        "plans":{"pro":{"api":"10/second; 100/minute"}}}"#;
    let header = |d: &shardlimit_decision, name: &str| -> String {
        let mut h = null_mut();
        unsafe {
            assert_eq!(
                shardlimit_decision_headers(d, &mut h, null_mut()),
                SHARDLIMIT_OK
            );
            let mut found = String::new();
            for i in 0..shardlimit_headers_len(h) {
                let (mut n, mut v) = (shardlimit_str::EMPTY, shardlimit_str::EMPTY);
                shardlimit_headers_get(h, i, &mut n, &mut v, null_mut());
                if s(n) == name {
                    found = s(v);
                }
            }
            shardlimit_headers_free(h);
            found
        }
    };
    unsafe {
        let mut clock = null_mut();
        shardlimit_clock_new(1_700_006_400_000_000, &mut clock, null_mut());
        let mut lim = null_mut();
        assert_eq!(
            shardlimit_limiter_new_json(
                PLANS.as_ptr().cast(),
                PLANS.len(),
                clock,
                &mut lim,
                null_mut()
            ),
            SHARDLIMIT_OK
        );
        // an ad-hoc rate string, named and unnamed
        let rate = "1/second; 2/minute";
        let mut p = null_mut();
        let fw = shardlimit_algorithm::SHARDLIMIT_ALGORITHM_FIXED_WINDOW as u32;
        assert_eq!(
            shardlimit_policy_new_rate(
                b"burst".as_ptr().cast(),
                5,
                rate.as_ptr().cast(),
                rate.len(),
                fw,
                &mut p,
                null_mut()
            ),
            SHARDLIMIT_OK
        );
        assert_eq!(s(shardlimit_policy_name(p)), "burst");
        let mut d: shardlimit_decision = std::mem::zeroed();
        assert_eq!(
            shardlimit_check(lim, b"k".as_ptr().cast(), 1, p, 1, &mut d, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(d.allowed && d.has_limit_index && d.limit_index == 0 && d.quota_count == 2);
        assert_eq!((d.quotas[1].limit, d.quotas[1].window_us), (2, 60_000_000));
        assert_eq!(
            header(&d, "RateLimit-Policy"),
            r#""burst";q=1;w=1, "burst#1";q=2;w=60"#
        );
        assert_eq!(
            shardlimit_check(lim, b"k".as_ptr().cast(), 1, p, 1, &mut d, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(!d.allowed && d.limit_index == 0);
        shardlimit_policy_free(p);
        let mut anon = null_mut();
        assert_eq!(
            shardlimit_policy_new_rate(
                null(),
                0,
                rate.as_ptr().cast(),
                rate.len(),
                fw,
                &mut anon,
                null_mut()
            ),
            SHARDLIMIT_OK
        );
        assert_eq!(
            s(shardlimit_policy_name(anon)),
            "fixed_window-1-1000ms--fixed_window-2-60000ms"
        );
        shardlimit_policy_free(anon);
        let mut e = null_mut();
        let bad = "5/fortnight";
        assert_eq!(
            shardlimit_policy_new_rate(
                null(),
                0,
                bad.as_ptr().cast(),
                bad.len(),
                fw,
                &mut anon,
                &mut e
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(take_err(e).1.contains("fortnight"));
        let mut e = null_mut();
        assert_eq!(
            shardlimit_policy_new_rate(
                null(),
                0,
                rate.as_ptr().cast(),
                rate.len(),
                99,
                &mut anon,
                &mut e
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        take_err(e);
        // under a plan: the same name and state
        let mut pro = null_mut();
        assert_eq!(
            shardlimit_plan_policy(
                lim,
                b"pro".as_ptr().cast(),
                3,
                b"api".as_ptr().cast(),
                3,
                &mut pro,
                null_mut()
            ),
            SHARDLIMIT_OK
        );
        assert_eq!(s(shardlimit_policy_name(pro)), "api");
        for _ in 0..2 {
            shardlimit_check_named(
                lim,
                b"t".as_ptr().cast(),
                1,
                b"api".as_ptr().cast(),
                3,
                1,
                &mut d,
                null_mut(),
            );
        }
        assert!(!{
            shardlimit_check_named(
                lim,
                b"t".as_ptr().cast(),
                1,
                b"api".as_ptr().cast(),
                3,
                1,
                &mut d,
                null_mut(),
            );
            d.allowed
        });
        assert_eq!(
            shardlimit_check(lim, b"t".as_ptr().cast(), 1, pro, 1, &mut d, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(d.allowed && d.limit == 10 && d.remaining == 7);
        shardlimit_policy_free(pro);
        let mut e = null_mut();
        assert_eq!(
            shardlimit_plan_policy(
                lim,
                b"gold".as_ptr().cast(),
                4,
                b"api".as_ptr().cast(),
                3,
                &mut pro,
                &mut e
            ),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(take_err(e).1.contains("gold"));
        // a decision from C is checked before headers are rendered from it
        let mut forged = d;
        forged.has_limit_index = true;
        forged.quota_count = 17;
        let mut h = null_mut();
        let mut e = null_mut();
        assert_eq!(
            shardlimit_decision_headers(&forged, &mut h, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(take_err(e).1.contains("quota_count"));
        forged.quota_count = 2;
        forged.limit_index = 2;
        let mut e = null_mut();
        assert_eq!(
            shardlimit_decision_headers(&forged, &mut h, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(take_err(e).1.contains("limit_index"));
        shardlimit_limiter_free(lim);
        shardlimit_clock_free(clock);
    }
}

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
