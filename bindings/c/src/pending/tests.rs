//! The started calls (`shardlimit_*_start`): on the in-memory engine, and against a real
//! redis-server that answers, then is stopped (SIGSTOP) so that a call stays in flight.

use super::*;
use std::process::{Child, Command, Stdio};
use std::ptr::{null, null_mut};
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

/// What a callback saw: how many times it ran, and the result code it read.
#[derive(Default)]
struct Seen {
    calls: AtomicU32,
    /// `calls`, for waiting on: a waiter of the pending may wake before the callback ends
    ran: std::sync::Mutex<u32>,
    ran_cond: std::sync::Condvar,
    code: AtomicU32,
    /// a blocking call made from inside the callback, on `limiter` when set
    limiter: AtomicUsize,
    blocking_code: AtomicU32,
}

unsafe extern "C" fn record(user: *mut c_void, p: *mut shardlimit_pending) {
    // SAFETY: `user` is the `Seen` the test keeps alive until every callback ran; `p` is
    // the pending the callback is given.
    unsafe {
        let seen = &*(user as *const Seen);
        let mut d = std::mem::MaybeUninit::<shardlimit_decision>::uninit();
        let rc = shardlimit_pending_decision(p, d.as_mut_ptr(), null_mut());
        seen.code.store(rc as u32, Ordering::SeqCst);
        let l = seen.limiter.load(Ordering::SeqCst);
        if l != 0 {
            let mut e = null_mut();
            let key = "k";
            let rc = shardlimit_check_named(
                std::ptr::without_provenance(l),
                key.as_ptr().cast(),
                key.len(),
                "api".as_ptr().cast(),
                3,
                1,
                d.as_mut_ptr(),
                &mut e,
            );
            shardlimit_error_free(e);
            seen.blocking_code.store(rc as u32, Ordering::SeqCst);
        }
        seen.calls.fetch_add(1, Ordering::SeqCst);
        *seen.ran.lock().unwrap() += 1;
        seen.ran_cond.notify_all();
    }
}

impl Seen {
    /// Waits (at most 10 s) until the callback has returned `n` times in all.
    fn wait_calls(&self, n: u32) {
        let g = self.ran.lock().unwrap();
        let (g, _) = self
            .ran_cond
            .wait_timeout_while(g, Duration::from_secs(10), |c| *c < n)
            .unwrap();
        assert_eq!(*g, n, "the callback ran {} times, not {n}", *g);
    }
}

fn user(seen: &Seen) -> *mut c_void {
    seen as *const Seen as *mut c_void
}

unsafe fn new_limiter(json: &str) -> *mut shardlimit_limiter {
    // SAFETY: the JSON is borrowed for the call, the out-parameter is ours.
    unsafe {
        let mut lim = null_mut();
        assert_eq!(
            shardlimit_limiter_new_json(
                json.as_ptr().cast(),
                json.len(),
                null(),
                &mut lim,
                null_mut()
            ),
            SHARDLIMIT_OK
        );
        lim
    }
}

unsafe fn start_check(
    lim: *const shardlimit_limiter,
    key: &str,
    seen: &Seen,
) -> *mut shardlimit_pending {
    // SAFETY: the key and policy are borrowed for the call; `seen` outlives the callback.
    unsafe {
        let mut p = null_mut();
        let mut e = null_mut();
        let rc = shardlimit_check_named_start(
            lim,
            key.as_ptr().cast(),
            key.len(),
            "api".as_ptr().cast(),
            3,
            1,
            Some(record),
            user(seen),
            &mut p,
            &mut e,
        );
        assert_eq!(rc, SHARDLIMIT_OK);
        assert!(!p.is_null());
        p
    }
}

unsafe fn decision(p: *const shardlimit_pending) -> Result<shardlimit_decision, shardlimit_result> {
    // SAFETY: `p` is a live pending of the test; the decision is initialised on OK.
    unsafe {
        let mut d = std::mem::MaybeUninit::<shardlimit_decision>::uninit();
        let mut e = null_mut();
        match shardlimit_pending_decision(p, d.as_mut_ptr(), &mut e) {
            SHARDLIMIT_OK => Ok(d.assume_init()),
            rc => {
                shardlimit_error_free(e);
                Err(rc)
            }
        }
    }
}

const MEMORY: &str = r#"{"policies":{"api":{"algorithm":"fixed_window","limit":2,"window":"1h"},
    "conc":{"algorithm":"concurrency","max":1,"lease_ttl":"1h"}}}"#;

#[test]
fn in_memory_the_key_only_started_calls_read_and_lift_a_block() {
    unsafe {
        let lim = new_limiter(MEMORY);
        let (key, reason) = ("k", "abuse");
        let mut e = null_mut();
        let rc = shardlimit_block(
            lim,
            key.as_ptr().cast(),
            key.len(),
            0,
            reason.as_ptr().cast(),
            reason.len(),
            &mut e,
        );
        assert_eq!(rc, SHARDLIMIT_OK);
        let mut started = |f: unsafe extern "C" fn(
            *const shardlimit_limiter,
            *const c_char,
            usize,
            shardlimit_callback,
            *mut c_void,
            *mut *mut shardlimit_pending,
            *mut *mut shardlimit_error,
        ) -> shardlimit_result,
                           key: &str| {
            let mut p = null_mut();
            let rc = f(
                lim,
                key.as_ptr().cast(),
                key.len(),
                None,
                null_mut(),
                &mut p,
                &mut e,
            );
            (rc, p)
        };
        // blocked: the entry, with its reason
        let (rc, p) = started(shardlimit_blocked_start, key);
        assert_eq!(rc, SHARDLIMIT_OK);
        assert!(
            shardlimit_pending_wait(p, 0),
            "the in-memory engine never waits"
        );
        let mut info = std::mem::MaybeUninit::<shardlimit_block_info>::uninit();
        assert_eq!(
            shardlimit_pending_block_info(p, info.as_mut_ptr(), null_mut()),
            SHARDLIMIT_OK
        );
        let mut info = info.assume_init();
        assert!(info.blocked && info.permanent);
        let text = std::slice::from_raw_parts(info.reason.ptr.cast::<u8>(), info.reason.len);
        assert_eq!(text, reason.as_bytes());
        shardlimit_string_free(&mut info.reason);
        shardlimit_pending_free(p);
        // unblock: it was blocked, and then it is not
        for was in [true, false] {
            let (rc, p) = started(shardlimit_unblock_start, key);
            assert_eq!(rc, SHARDLIMIT_OK);
            let mut b = !was;
            assert_eq!(
                shardlimit_pending_bool(p, &mut b, null_mut()),
                SHARDLIMIT_OK
            );
            assert_eq!(b, was);
            shardlimit_pending_free(p);
        }
        // a NULL key fails the start itself: no pending is made
        let mut p = null_mut();
        let rc = shardlimit_unblock_start(lim, null(), 3, None, null_mut(), &mut p, &mut e);
        assert_eq!((rc, p.is_null()), (SHARDLIMIT_ERR_INVALID_ARGUMENT, true));
        shardlimit_error_free(e);
        shardlimit_limiter_free(lim);
    }
}

#[test]
fn in_memory_a_started_call_completes_before_start_returns() {
    unsafe {
        let lim = new_limiter(MEMORY);
        let seen = Seen::default();
        for i in 0..3 {
            let p = start_check(lim, "k", &seen);
            // the in-memory engine never waits: done, callback run, on this thread
            assert!(shardlimit_pending_poll(p));
            assert_eq!(seen.calls.load(Ordering::SeqCst), i + 1);
            let d = decision(p).unwrap();
            assert_eq!(d.allowed, i < 2, "check {i}");
            // reading twice gives the same decision; cancelling a completed call does nothing
            assert_eq!(decision(p).unwrap().remaining, d.remaining);
            assert!(!shardlimit_pending_cancel(p));
            assert_eq!(shardlimit_pending_result(p, null_mut()), SHARDLIMIT_OK);
            shardlimit_pending_free(p);
            // a freed pending is CLOSED, never another call's answer
            assert_eq!(decision(p).unwrap_err(), SHARDLIMIT_ERR_CLOSED);
            assert!(!shardlimit_pending_poll(p));
        }
        // a result of the wrong kind, and no callback (NULL) at all
        let mut pol = null_mut();
        assert_eq!(
            shardlimit_limiter_policy(lim, "conc".as_ptr().cast(), 4, &mut pol, null_mut()),
            SHARDLIMIT_OK
        );
        let mut p = null_mut();
        assert_eq!(
            shardlimit_acquire_start(
                lim,
                "k".as_ptr().cast(),
                1,
                pol,
                1,
                None,
                null_mut(),
                &mut p,
                null_mut()
            ),
            SHARDLIMIT_OK
        );
        assert!(shardlimit_pending_wait(p, u64::MAX));
        assert_eq!(decision(p).unwrap_err(), SHARDLIMIT_ERR_INVALID_ARGUMENT);
        let mut d = std::mem::MaybeUninit::<shardlimit_decision>::uninit();
        let mut lease = null_mut();
        assert_eq!(
            shardlimit_pending_acquired(p, d.as_mut_ptr(), &mut lease, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(d.assume_init().allowed && !lease.is_null());
        // the lease is handed out once
        let mut again = null_mut();
        assert_eq!(
            shardlimit_pending_acquired(p, d.as_mut_ptr(), &mut again, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(again.is_null());
        shardlimit_pending_free(p);
        let mut p = null_mut();
        assert_eq!(
            shardlimit_release_start(lim, lease, None, null_mut(), &mut p, null_mut()),
            SHARDLIMIT_OK
        );
        let mut released = false;
        assert_eq!(
            shardlimit_pending_bool(p, &mut released, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(released);
        shardlimit_pending_free(p);
        shardlimit_lease_free(lease);
        shardlimit_policy_free(pol);
        // an invalid key is the call's own error, through the pending (the core checks keys)
        let p = start_check(lim, "", &seen);
        assert_eq!(decision(p).unwrap_err(), SHARDLIMIT_ERR_INVALID_ARGUMENT);
        assert_eq!(
            seen.code.load(Ordering::SeqCst),
            SHARDLIMIT_ERR_INVALID_ARGUMENT as u32
        );
        shardlimit_pending_free(p);
        // arguments the binding reads itself fail at start: no pending, no callback
        let calls = seen.calls.load(Ordering::SeqCst);
        let mut p = null_mut();
        let mut e = null_mut();
        let rc = shardlimit_check_named_start(
            lim,
            "k".as_ptr().cast(),
            1,
            "nope".as_ptr().cast(),
            4,
            1,
            Some(record),
            user(&seen),
            &mut p,
            &mut e,
        );
        assert_eq!(rc, SHARDLIMIT_ERR_UNKNOWN_POLICY);
        shardlimit_error_free(e);
        let rc = shardlimit_check_named_start(
            lim,
            "k".as_ptr().cast(),
            1,
            "api".as_ptr().cast(),
            3,
            1,
            Some(record),
            user(&seen),
            null_mut(),
            &mut e,
        );
        assert_eq!(rc, SHARDLIMIT_ERR_INVALID_ARGUMENT);
        shardlimit_error_free(e);
        assert!(p.is_null());
        assert_eq!(seen.calls.load(Ordering::SeqCst), calls);
        shardlimit_limiter_free(lim);
    }
}

/// A redis-server on a free loopback port, killed when dropped.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    fn start() -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        // readiness, not a race: the port accepts connections, for at most 10 s
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Redis { child, port }
    }
    fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }
    fn config(&self) -> String {
        format!(
            r#"{{"timeout_ms": 10000, "shards": [{{"name": "s0", "url": "redis://127.0.0.1:{}"}}],
                "policies": {{"api": {{"algorithm": "fixed_window", "limit": 2, "window": "1h", "on_error": "error"}}}}}}"#,
            self.port
        )
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn on_redis_a_call_completes_on_the_runtime_and_a_stopped_one_can_be_cancelled() {
    let redis = Redis::start();
    unsafe {
        let lim = new_limiter(&redis.config());
        // Redis answers: the callback runs once, the decision is Redis's
        let seen = Seen::default();
        let p = start_check(lim, "k", &seen);
        assert!(shardlimit_pending_wait(p, 10_000_000));
        let d = decision(p).unwrap();
        assert!(d.allowed && d.remaining == 1 && d.source == SHARDLIMIT_SOURCE_REDIS as u32);
        // the waiter can wake while the callback still runs: wait for the callback too
        seen.wait_calls(1);
        shardlimit_pending_free(p);
        let seen2 = Seen::default();
        seen2.limiter.store(lim as usize, Ordering::SeqCst);
        let p = start_check(lim, "k", &seen2);
        seen2.wait_calls(1);
        shardlimit_pending_free(p);
        assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
        assert_eq!(seen.code.load(Ordering::SeqCst), SHARDLIMIT_OK as u32);
        // a blocking call from inside a callback is refused (it would wait for itself)
        assert_eq!(seen2.calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            seen2.blocking_code.load(Ordering::SeqCst),
            SHARDLIMIT_ERR_INVALID_ARGUMENT as u32
        );

        // Redis stopped: the call stays in flight until cancelled
        redis.signal("-STOP");
        let seen = Seen::default();
        let p = start_check(lim, "k", &seen);
        let t0 = Instant::now();
        assert!(
            !shardlimit_pending_wait(p, 50_000),
            "a stopped Redis answered"
        );
        assert!(!shardlimit_pending_poll(p));
        assert_eq!(decision(p).unwrap_err(), SHARDLIMIT_ERR_INVALID_ARGUMENT);
        assert_eq!(seen.calls.load(Ordering::SeqCst), 0);
        assert!(shardlimit_pending_cancel(p));
        // cancelled at once, on this thread: the callback has run before cancel returned
        assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            seen.code.load(Ordering::SeqCst),
            SHARDLIMIT_ERR_CANCELLED as u32
        );
        assert!(shardlimit_pending_poll(p) && shardlimit_pending_wait(p, u64::MAX));
        assert_eq!(decision(p).unwrap_err(), SHARDLIMIT_ERR_CANCELLED);
        assert!(!shardlimit_pending_cancel(p), "cancelled twice");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert_eq!(
            s(shardlimit_result_name(SHARDLIMIT_ERR_CANCELLED as u32)),
            "cancelled"
        );
        assert!(!shardlimit_result_is_backend(
            SHARDLIMIT_ERR_CANCELLED as u32
        ));
        shardlimit_pending_free(p);
        assert_eq!(
            seen.calls.load(Ordering::SeqCst),
            1,
            "the callback ran twice"
        );

        // freeing a call in flight cancels it: its callback runs once, with CANCELLED
        let seen = Seen::default();
        let p = start_check(lim, "k", &seen);
        shardlimit_limiter_free(lim); // the call in flight keeps its limiter
        assert_eq!(seen.calls.load(Ordering::SeqCst), 0);
        shardlimit_pending_free(p);
        assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            seen.code.load(Ordering::SeqCst),
            SHARDLIMIT_ERR_CANCELLED as u32
        );
        redis.signal("-CONT");
    }
}

fn s(x: shardlimit_str) -> String {
    let bytes = unsafe { std::slice::from_raw_parts(x.ptr.cast::<u8>(), x.len) };
    String::from_utf8(bytes.to_vec()).unwrap()
}
