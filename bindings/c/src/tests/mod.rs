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

fn owned(mut x: shardlimit_string) -> String {
    let out = unsafe { std::str::from_utf8(std::slice::from_raw_parts(x.ptr.cast::<u8>(), x.len)) }
        .unwrap()
        .to_string();
    unsafe { shardlimit_string_free(&mut x) };
    out
}

mod admin;
mod check;
mod errors;
mod layered;
mod overrides;
mod policy;
mod tls;
