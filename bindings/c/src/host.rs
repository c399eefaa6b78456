//! The host transport: the core's sans-I/O check path (`shardlimit::HostChecks`) behind
//! a handle, for a host that moves the bytes on its own event loop (Go's netpoller, a C
//! event loop): one socket per shard that the host opens, writes and reads; the library
//! builds the script calls, packs a burst's checks into one batch call, frames and checks
//! every reply, keeps the deadlines and decides (on_error, metrics, events, circuits). No
//! I/O thread, no thread hop per decision.
//!
//! The host's part, per shard: `shardlimit_host_connecting()` when it starts to connect,
//! `shardlimit_host_connected()` once the socket is open, then after any check
//! `shardlimit_host_transmit()` to get the bytes to write (written at once: the shard's
//! silence is counted from there), `shardlimit_host_input()` with every chunk read,
//! `shardlimit_host_closed()` when the socket closed or failed, and
//! `shardlimit_host_timeout()` when `shardlimit_host_next_deadline_us()` is due. When
//! `shardlimit_host_is_down()` the host closes its socket and connects again.
//!
//! A deadline is the shard's silence, never the host's own delay: before
//! `shardlimit_host_timeout()` the host hands in every byte its sockets already hold (a
//! process that was slow wakes with its timer and the replies both due: the replies go
//! first; Go's binding asks FIONREAD and waits for its reader). A check that comes back
//! `SHARDLIMIT_HOST_PENDING` on a shard whose socket the host is neither holding nor
//! opening (it waits out a reconnect back-off) means the shard's circuit is closed and the
//! library is connecting: the host connects now, and the check waits for that connect.

use super::*;
use parking_lot::Mutex;
use shardlimit::{HostChecks, HostStep};
use std::collections::VecDeque;
use std::time::Instant;

/// What became of a check given to `shardlimit_host_check()`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shardlimit_host_step {
    /// Decided without Redis (the block list, an open circuit's `on_error`): the decision
    /// is in `*out`.
    SHARDLIMIT_HOST_DECIDED = 1,
    /// Queued on shard `*shard`'s connection: its decision comes back as the completion
    /// with id `*id` (from `shardlimit_host_input()`, `_closed()` or `_timeout()`).
    SHARDLIMIT_HOST_PENDING = 2,
    /// This check needs the limiter's own path (a multi-limit, shadow, local-admission or
    /// overrides policy, a reshard handoff, a reloaded engine): call
    /// `shardlimit_check_named()` or its `_start` form instead.
    SHARDLIMIT_HOST_DELEGATE = 3,
}

/// The outcome of a check that was `SHARDLIMIT_HOST_PENDING`, written by
/// `shardlimit_host_input()`, `_closed()`, `_timeout()` and `_completions()`.
#[repr(C)]
#[derive(Debug)]
pub struct shardlimit_host_completion {
    /// The id `shardlimit_host_check()` gave the check.
    pub id: u64,
    /// SHARDLIMIT_OK with `decision` set, or the check's error (after its policy's
    /// `on_error`: only a failure the policy does not absorb comes back as an error).
    pub result: shardlimit_result,
    /// When `result` is not OK: the error, owned by the caller (free it with
    /// `shardlimit_error_free()`); NULL otherwise.
    pub error: *mut shardlimit_error,
    /// When `result` is OK: the decision.
    pub decision: shardlimit_decision,
}

/// The state machines of one limiter's shards, whose sockets the host owns: the host
/// transport. From `shardlimit_host_new()`; an opaque handle the caller owns and frees with
/// `shardlimit_host_free()`.
///
/// Thread-safe: every call locks the handle for its duration (a mutex), so calls from
/// several threads are serialised. What the caller must serialise itself: the check id
/// that `shardlimit_host_check()` returns may be completed by an `_input()` on another
/// thread before the checking thread has recorded who waits for it, so a host that checks
/// on one thread and reads on another holds one lock of its own across "check + record
/// the waiter" and across "input + hand the completions to their waiters".
pub struct shardlimit_host {
    state: Mutex<HostState>,
}

struct HostState {
    limiter: Limiter,
    inner: HostChecks,
    /// completions not yet handed to the caller (its buffer was full)
    ready: VecDeque<(u64, shardlimit::Result<Decision>)>,
    /// per shard: bytes to write not yet taken by `_transmit()` (its buffer was short)
    unsent: Vec<(Vec<u8>, usize)>,
}

impl Object for shardlimit_host {
    const TAG: Tag = Tag::Host;
}

fn host_arg(p: *const shardlimit_host) -> Result<Arc<shardlimit_host>, Error> {
    live("host", p)
}

impl HostState {
    fn shard(&self, shard: usize) -> Result<usize, Error> {
        let n = self.inner.shard_count();
        if shard < n {
            Ok(shard)
        } else {
            Err(invalid(
                "shard",
                format!("is {shard}; this limiter has {n} shards"),
            ))
        }
    }

    /// Moves queued completions to the caller's buffer: how many were written.
    fn hand_out(
        &mut self,
        out: *mut shardlimit_host_completion,
        cap: usize,
    ) -> Result<usize, Error> {
        if cap == 0 {
            return Ok(0);
        }
        let mut out = out_array_arg("out", out, cap)?;
        let mut n = 0;
        while n < cap {
            let Some((id, r)) = self.ready.pop_front() else {
                break;
            };
            let c = match r.map_err(Error::from).and_then(|d| decision_to_c(&d)) {
                Ok(decision) => shardlimit_host_completion {
                    id,
                    result: SHARDLIMIT_OK,
                    error: std::ptr::null_mut(),
                    decision,
                },
                Err(e) => {
                    let code = e.code;
                    let error = register(shardlimit_error {
                        code,
                        message: to_cstring(e.message),
                    })?;
                    shardlimit_host_completion {
                        id,
                        result: code,
                        error,
                        decision: empty_decision(),
                    }
                }
            };
            out.write(n, c);
            n += 1;
        }
        Ok(n)
    }
}

fn empty_decision() -> shardlimit_decision {
    shardlimit_decision {
        allowed: false,
        limit: 0,
        remaining: 0,
        reset_after_us: 0,
        has_retry_after: false,
        retry_after_us: 0,
        delay_us: 0,
        window_us: 0,
        source: 0,
        has_shard: false,
        shard: 0,
        policy_len: 0,
        policy: [0; SHARDLIMIT_POLICY_NAME_CAP],
        has_layer: false,
        layer: 0,
        has_limit_index: false,
        limit_index: 0,
        quota_count: 0,
        quotas: [shardlimit_quota::default(); SHARDLIMIT_MAX_LIMITS],
        shadow_denied: false,
    }
}

/// Runs `f` on the locked state of `host`, then writes up to `cap` queued completions to
/// `out` and their number to `*out_n`.
fn with_completions(
    host: *const shardlimit_host,
    out: *mut shardlimit_host_completion,
    cap: usize,
    out_n: *mut usize,
    err: *mut *mut shardlimit_error,
    f: impl FnOnce(&mut HostState) -> Result<(), Error>,
) -> shardlimit_result {
    guard(err, || {
        let h = host_arg(host)?;
        let out_n = out_arg("out_n", out_n)?;
        if cap > 0 {
            out_arg("out", out)?;
        }
        let mut s = h.state.lock();
        f(&mut s)?;
        let n = s.hand_out(out, cap)?;
        out_n.write(n);
        Ok(())
    })
}

/// The host transport of `limiter`. Its shards must all be standalone Redis servers over
/// plain TCP: CONFIG otherwise (naming the first that is not), and for the in-memory
/// engine. It opens no socket: the host connects (see `shardlimit_host_address()`).
///
/// Thread-safe. On success `*out` is a new handle the caller owns. `err` may be NULL.
/// Results: OK, CONFIG, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_host_new(
    limiter: *const shardlimit_limiter,
    out: *mut *mut shardlimit_host,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        let out = out_arg("out", out)?;
        let inner = HostChecks::new(&l)?;
        let unsent = (0..inner.shard_count()).map(|_| (Vec::new(), 0)).collect();
        let h = register(shardlimit_host {
            state: Mutex::new(HostState {
                limiter: l,
                inner,
                ready: VecDeque::new(),
                unsent,
            }),
        })?;
        out.write(h);
        Ok(())
    })
}

/// Frees the host transport. Checks still in flight are never completed: call
/// `shardlimit_host_closed()` for every shard first to fail them. NULL, a freed or a
/// foreign handle is a no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_host_free(host: *mut shardlimit_host) {
    quiet((), || {
        unregister(host);
    })
}

/// How many shards (sockets) the host transport has; 0 for an invalid handle.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_host_shard_count(host: *const shardlimit_host) -> usize {
    quiet(0, || {
        host_arg(host)
            .map(|h| h.state.lock().inner.shard_count())
            .unwrap_or(0)
    })
}

/// How many checks wait for their completion; 0 for an invalid handle.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_host_in_flight(host: *const shardlimit_host) -> usize {
    quiet(0, || {
        host_arg(host)
            .map(|h| h.state.lock().inner.in_flight())
            .unwrap_or(0)
    })
}

/// Where shard `shard` listens: `*host_out` (an owned string: free it with
/// `shardlimit_string_free()`) and `*port`, and in `*connect_timeout_us` how long the
/// connect and log-in may take (the config's `timeout_ms`).
///
/// Results: OK, INVALID_ARGUMENT (a shard out of range, a NULL output), CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_host_address(
    host: *const shardlimit_host,
    shard: usize,
    host_out: *mut shardlimit_string,
    port: *mut u16,
    connect_timeout_us: *mut u64,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let h = host_arg(host)?;
        let host_out = out_arg("host_out", host_out)?;
        let port = out_arg("port", port)?;
        let timeout = out_arg("connect_timeout_us", connect_timeout_us)?;
        let s = h.state.lock();
        let (name, p) = s.inner.address(s.shard(shard)?)?;
        let t = u64::try_from(s.inner.timeout().as_micros()).unwrap_or(u64::MAX);
        drop(s);
        host_out.write(owned_string(name));
        port.write(p);
        timeout.write(t);
        Ok(())
    })
}

/// Checks `cost` units of the configured policy named by `policy_len` bytes at `policy`
/// for `key` (the contract of `shardlimit_check_named()`). `*step` says what became of it:
/// `SHARDLIMIT_HOST_DECIDED` with `*out` filled, `SHARDLIMIT_HOST_PENDING` with `*id` and
/// `*shard` set (then call `shardlimit_host_transmit()` for that shard), or
/// `SHARDLIMIT_HOST_DELEGATE` (nothing else written: use the limiter's own check).
///
/// Thread-safe (see `shardlimit_host` for what the caller serialises). `err` may be NULL.
/// Results: OK, UNKNOWN_POLICY, INVALID_ARGUMENT, a backend error a policy with
/// `on_error: "error"` does not absorb (CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE), CLOSED,
/// INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_host_check(
    host: *const shardlimit_host,
    key: *const c_char,
    key_len: usize,
    policy: *const c_char,
    policy_len: usize,
    cost: u64,
    step: *mut u32,
    id: *mut u64,
    shard: *mut usize,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let h = host_arg(host)?;
        let key = key_arg(key, key_len)?;
        let policy = policy_name_arg(policy, policy_len)?;
        let step = out_arg("step", step)?;
        let id = out_arg("id", id)?;
        let shard = out_arg("shard", shard)?;
        let out = out_arg("out", out)?;
        let mut s = h.state.lock();
        let p = s.limiter.policy(policy)?;
        match s.inner.check(key, &p, cost)? {
            HostStep::Decided(d) => {
                drop(s);
                out.write(decision_to_c(&d)?);
                step.write(shardlimit_host_step::SHARDLIMIT_HOST_DECIDED as u32);
            }
            HostStep::Pending { id: i, shard: n } => {
                drop(s);
                id.write(i);
                shard.write(n);
                step.write(shardlimit_host_step::SHARDLIMIT_HOST_PENDING as u32);
            }
            HostStep::Delegate => {
                step.write(shardlimit_host_step::SHARDLIMIT_HOST_DELEGATE as u32);
            }
        }
        Ok(())
    })
}

/// The host starts to connect shard `shard`'s socket (the connect and log-in must be done
/// within the config's `timeout_ms`, or the checks waiting on it fail). Checks made while
/// nobody connects fail at once (and follow their policies' `on_error`).
///
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_host_connecting(
    host: *const shardlimit_host,
    shard: usize,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let h = host_arg(host)?;
        let mut s = h.state.lock();
        let n = s.shard(shard)?;
        s.unsent[n] = (Vec::new(), 0);
        Ok(s.inner.connecting(n)?)
    })
}

/// Shard `shard`'s socket is open: the log-in (AUTH, SELECT) goes first, then what waited
/// (call `shardlimit_host_transmit()`).
///
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_host_connected(
    host: *const shardlimit_host,
    shard: usize,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let h = host_arg(host)?;
        let mut s = h.state.lock();
        let n = s.shard(shard)?;
        Ok(s.inner.connected(n)?)
    })
}

/// True when shard `shard`'s socket must be closed (or is): the host closes it and
/// connects again. True for an invalid handle or shard.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_host_is_down(
    host: *const shardlimit_host,
    shard: usize,
) -> bool {
    quiet(true, || {
        host_arg(host)
            .map(|h| h.state.lock().inner.is_down(shard))
            .unwrap_or(true)
    })
}

/// Copies up to `cap` bytes that must be written to shard `shard` now into `buf`, their
/// number to `*out_len` (0: nothing to write). What does not fit stays for the next call:
/// call it until it writes 0 bytes (or fewer than `cap`). Every check queued since the last
/// call goes out in this write (a burst's checks of one algorithm as one batch call).
///
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_host_transmit(
    host: *const shardlimit_host,
    shard: usize,
    buf: *mut u8,
    cap: usize,
    out_len: *mut usize,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let h = host_arg(host)?;
        let out_len = out_arg("out_len", out_len)?;
        if buf.is_null() && cap > 0 {
            return Err(invalid("buf", format!("is NULL with capacity {cap}")));
        }
        let mut guard = h.state.lock();
        let s = &mut *guard;
        let n = s.shard(shard)?;
        if s.unsent[n].1 >= s.unsent[n].0.len() {
            let bytes = s.inner.poll_transmit(n).unwrap_or_default();
            s.unsent[n] = (bytes, 0);
        }
        let (bytes, at) = &mut s.unsent[n];
        let take = (bytes.len() - *at).min(cap);
        if take > 0 {
            out_array_arg("buf", buf, cap)?.copy_from(&bytes[*at..*at + take]);
            *at += take;
        }
        if *at >= bytes.len() {
            // every byte copied out: the buffer goes back to the machine, whose next
            // hand-out reuses it (no allocation per write)
            let done = std::mem::take(bytes);
            *at = 0;
            if done.capacity() > 0 {
                s.inner.recycle(n, done);
            }
        }
        out_len.write(take);
        Ok(())
    })
}

/// `len` bytes read from shard `shard`'s socket: the checks they complete, up to `cap` of
/// them into `out` (their number in `*out_n`); more stay queued for
/// `shardlimit_host_completions()`. Afterwards check `shardlimit_host_is_down()`: bytes the
/// library cannot trust (a reply outside the limits, one nobody asked for, another call's)
/// fail every check on the connection, which must then be closed. After a NOSCRIPT reply
/// a check goes out again: call `shardlimit_host_transmit()`.
///
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_host_input(
    host: *const shardlimit_host,
    shard: usize,
    bytes: *const u8,
    len: usize,
    out: *mut shardlimit_host_completion,
    cap: usize,
    out_n: *mut usize,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    with_completions(host, out, cap, out_n, err, |s| {
        let n = s.shard(shard)?;
        let bytes = bytes_arg("bytes", bytes.cast(), len)?;
        let done = s.inner.handle_input(n, bytes);
        s.ready.extend(done);
        Ok(())
    })
}

/// Shard `shard`'s socket closed or failed (`why`, `why_len` bytes of UTF-8, quoted in
/// the errors): every check on it fails (and follows its policy's `on_error`); completions
/// as `shardlimit_host_input()`.
///
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_host_closed(
    host: *const shardlimit_host,
    shard: usize,
    why: *const c_char,
    why_len: usize,
    out: *mut shardlimit_host_completion,
    cap: usize,
    out_n: *mut usize,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    with_completions(host, out, cap, out_n, err, |s| {
        let n = s.shard(shard)?;
        let why = str_arg("why", why, why_len)?;
        s.unsent[n] = (Vec::new(), 0);
        let done = s.inner.handle_closed(n, why);
        s.ready.extend(done);
        Ok(())
    })
}

/// The time now: checks (and connects) whose deadline passed fail; completions as
/// `shardlimit_host_input()`. Afterwards check `shardlimit_host_is_down()` for each shard.
///
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_host_timeout(
    host: *const shardlimit_host,
    out: *mut shardlimit_host_completion,
    cap: usize,
    out_n: *mut usize,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    with_completions(host, out, cap, out_n, err, |s| {
        let done = s.inner.handle_timeout(Instant::now());
        s.ready.extend(done);
        Ok(())
    })
}

/// The completions that did not fit the buffer of an earlier call, up to `cap` of them.
///
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_host_completions(
    host: *const shardlimit_host,
    out: *mut shardlimit_host_completion,
    cap: usize,
    out_n: *mut usize,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    with_completions(host, out, cap, out_n, err, |_| Ok(()))
}

/// When `shardlimit_host_timeout()` is due next: `*has` is false when nothing waits,
/// otherwise `*in_us` is the microseconds from now (0 when due).
///
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_host_next_deadline_us(
    host: *const shardlimit_host,
    has: *mut bool,
    in_us: *mut u64,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let h = host_arg(host)?;
        let has = out_arg("has", has)?;
        let in_us = out_arg("in_us", in_us)?;
        let next = h.state.lock().inner.next_deadline();
        let us = next.map(|d| {
            let left = d.saturating_duration_since(Instant::now());
            // rounded up: a timer armed for it fires at or after the deadline
            u64::try_from(left.as_micros()).unwrap_or(u64::MAX)
                + u64::from(left.subsec_nanos() % 1000 != 0)
        });
        has.write(us.is_some());
        in_us.write(us.unwrap_or(0));
        Ok(())
    })
}
