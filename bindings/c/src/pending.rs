//! Calls that complete later: each `shardlimit_*_start` function returns at once with a
//! `shardlimit_pending` and runs the call on the limiter's I/O runtime (the same runtime
//! and batching as Python's and Node's async calls). The caller either registers a
//! callback, waits on the pending (`shardlimit_pending_wait`) or polls it, and may cancel
//! it. A host with its own scheduler (Go's goroutines, a C++ executor) then waits without
//! holding an OS thread per call in flight.
//!
//! One state machine per call, `Running` → `Done`, and whoever makes that transition
//! (the runtime with the call's result, `shardlimit_pending_cancel`, or the runtime
//! dropping the task) calls the callback: exactly once, whatever happens.

use super::*;
use parking_lot::{Condvar, Mutex};
use std::cell::Cell;
use std::ffi::c_void;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

/// Called once when a started call completes (with its result, with
/// `SHARDLIMIT_ERR_CANCELLED`, or with an error when the runtime stopped): `user` is the
/// pointer given to the `_start` function, `pending` the call's handle, whose result is
/// ready to read. It runs on the library's I/O thread (or on the thread that completed the
/// call: inside the `_start` function when the call needed no I/O, inside
/// `shardlimit_pending_cancel()` or `shardlimit_pending_free()` when they cancelled it),
/// so it must return quickly: it may read the result, free the pending, start other calls
/// and signal the caller's own scheduler, but a blocking shardlimit call made from it
/// fails with INVALID_ARGUMENT and `shardlimit_pending_wait()` does not wait there.
pub type shardlimit_callback =
    Option<unsafe extern "C" fn(user: *mut c_void, pending: *mut shardlimit_pending)>;

/// A call in flight or completed, from a `shardlimit_*_start` function. An opaque handle
/// owned by the caller: read its result with the `shardlimit_pending_*` accessor of its
/// call (`_decision`, `_acquired`, `_bool`, `_block_info`, or `_result` for any call), then
/// free it with `shardlimit_pending_free()`, which cancels it if it is still running.
/// Thread-safe.
pub struct shardlimit_pending {
    state: Mutex<State>,
    done: Condvar,
    cancel: tokio::sync::Notify,
    callback: shardlimit_callback,
    /// The caller's pointer, kept as an integer: the library never dereferences it.
    user: usize,
    /// This object's own handle, for the callback.
    token: AtomicUsize,
}

enum State {
    Running,
    // boxed: the outcome (a decision and a lease) is large, and most of a pending's life
    // is spent Running
    Done(Box<Result<Outcome, Error>>),
}

/// What a completed call produced.
enum Outcome {
    Decision(Decision),
    /// The lease is handed to the caller (registered) by the first
    /// `shardlimit_pending_acquired()`.
    Acquired(Decision, Option<shardlimit_lease>),
    Bool(bool),
    Unit,
    Blocked(Option<BlockInfo>),
    Reserved(Decision, settle::shardlimit_reservation),
    /// A JSON text (an override, a page of them, a shadow report), or none (no override).
    Text(Option<String>),
}

impl Outcome {
    fn kind(&self) -> &'static str {
        match self {
            Outcome::Decision(_) => "decision (shardlimit_pending_decision)",
            Outcome::Acquired(..) => "lease (shardlimit_pending_acquired)",
            Outcome::Bool(_) => "boolean (shardlimit_pending_bool)",
            Outcome::Unit => "status (shardlimit_pending_result)",
            Outcome::Blocked(_) => "block-list entry (shardlimit_pending_block_info)",
            Outcome::Reserved(..) => "reservation (shardlimit_pending_reserved)",
            Outcome::Text(_) => "text (shardlimit_pending_string)",
        }
    }
}

thread_local! {
    /// How many completion callbacks this thread is running (they can nest: a callback
    /// may start a call that completes at once).
    static IN_CALLBACK: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread is inside a completion callback.
pub(crate) fn in_callback() -> bool {
    IN_CALLBACK.with(|c| c.get() > 0)
}

impl shardlimit_pending {
    /// Makes the transition to `Done` unless another completion came first; the one that
    /// makes it calls the callback. Returns whether this one did.
    fn finish(&self, result: Result<Outcome, Error>) -> bool {
        {
            let mut s = self.state.lock();
            if !matches!(*s, State::Running) {
                return false;
            }
            *s = State::Done(Box::new(result));
        }
        self.done.notify_all();
        if let Some(cb) = self.callback {
            let token = self.token.load(Ordering::Acquire);
            IN_CALLBACK.with(|c| c.set(c.get() + 1));
            // SAFETY: the caller's function, with the pointer it gave us and our handle.
            unsafe {
                cb(
                    self.user as *mut c_void,
                    std::ptr::without_provenance_mut(token),
                )
            };
            IN_CALLBACK.with(|c| c.set(c.get() - 1));
        }
        true
    }

    fn cancelled() -> Error {
        Error {
            code: SHARDLIMIT_ERR_CANCELLED,
            message: "the call was cancelled before it completed".to_string(),
        }
    }
}

/// Completes the pending with an error if the runtime drops the task before it finished
/// (a runtime shut down), so that the callback still runs once.
struct DropGuard(Arc<shardlimit_pending>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        self.0.finish(Err(Error {
            code: SHARDLIMIT_ERR_INTERNAL,
            message: "internal error: the I/O runtime stopped before the call completed"
                .to_string(),
        }));
    }
}

/// A future whose panic becomes an INTERNAL error instead of unwinding into the runtime.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future<Output = Result<Outcome, Error>>> Future for CatchUnwind<F> {
    type Output = Result<Outcome, Error>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let fut = self.0.as_mut();
        match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(p) => p,
            Err(payload) => Poll::Ready(Err(Error {
                code: SHARDLIMIT_ERR_INTERNAL,
                message: format!(
                    "internal error (a bug in shardlimit): panic: {}",
                    panic_message(&*payload)
                ),
            })),
        }
    }
}

/// Starts `fut` for the limiter `l`: registers the pending, writes `*out`, then runs the
/// call on the I/O runtime, or right here on the in-memory engine (whose calls never wait).
fn start<F>(
    l: Limiter,
    callback: shardlimit_callback,
    user: *mut c_void,
    out: *mut *mut shardlimit_pending,
    fut: F,
) -> Result<(), Error>
where
    F: Future<Output = Result<Outcome, Error>> + Send + 'static,
{
    let out = out_arg("out_pending", out)?;
    let spawner = l.spawner()?;
    let p = Arc::new(shardlimit_pending {
        state: Mutex::new(State::Running),
        done: Condvar::new(),
        cancel: tokio::sync::Notify::new(),
        callback,
        user: user as usize,
        token: AtomicUsize::new(0),
    });
    let token = register_arc(p.clone())?;
    p.token.store(token as usize, Ordering::Release);
    out.write(token);
    let fut = CatchUnwind(Box::pin(fut));
    match spawner {
        None => {
            let r = l.block_on(async move { Ok(fut.await) });
            p.finish(r.unwrap_or_else(|e| Err(e.into())));
        }
        Some(spawner) => spawner.spawn(async move {
            let guard = DropGuard(p);
            let r = tokio::select! {
                biased;
                _ = guard.0.cancel.notified() => return,
                r = fut => r,
            };
            guard.0.finish(r);
        }),
    }
    Ok(())
}

/// The limiter of a `_start` function (allowed inside a callback).
pub(crate) fn start_limiter(p: *const shardlimit_limiter) -> Result<Limiter, Error> {
    limiter_arg(p)
}

/// The body of every `_start` call of the shape (limiter, key, policy, cost) -> decision
/// (`shardlimit_check_start`, `_check_shadow_start`, `_charge_start`, `_refund_start`):
/// the arguments checked as the blocking form checks them (`keyed_args`) and copied,
/// `call`'s future run on the limiter's I/O runtime.
#[allow(clippy::too_many_arguments)]
fn start_decision<F, Fut>(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    cost: u64,
    (callback, user, out_pending): (
        shardlimit_callback,
        *mut c_void,
        *mut *mut shardlimit_pending,
    ),
    err: *mut *mut shardlimit_error,
    call: F,
) -> shardlimit_result
where
    F: FnOnce(Limiter, String, Policy, u64) -> Fut,
    Fut: Future<Output = shardlimit::Result<Decision>> + Send + 'static,
{
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Start, limiter, key, key_len, policy)?;
        let fut = call(l.clone(), owned_key(key), p, cost);
        start(l, callback, user, out_pending, async move {
            Ok(Outcome::Decision(fut.await?))
        })
    })
}

/// A `_start` call on one key and no policy (`key` checked and copied here), whose outcome
/// `call` makes: one body for the key-only calls (`unblock`, `blocked`).
fn start_key<F, Fut>(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    (callback, user, out_pending): (
        shardlimit_callback,
        *mut c_void,
        *mut *mut shardlimit_pending,
    ),
    err: *mut *mut shardlimit_error,
    call: F,
) -> shardlimit_result
where
    F: FnOnce(Limiter, String) -> Fut,
    Fut: Future<Output = Result<Outcome, Error>> + Send + 'static,
{
    guard(err, || {
        let l = start_limiter(limiter)?;
        let key = owned_key(key_arg(key, key_len)?);
        let fut = call(l.clone(), key);
        start(l, callback, user, out_pending, fut)
    })
}

fn owned_key(key: &str) -> String {
    key.to_string()
}

// ---------------------------------------------------------------------------------------
// Waiting, cancelling, reading

/// Whether the call has completed (with a result, an error or cancelled). False for NULL
/// or a handle that is not a live pending. Never blocks. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_pending_poll(pending: *const shardlimit_pending) -> bool {
    quiet(false, || {
        live("pending", pending).is_ok_and(|p| !matches!(*p.state.lock(), State::Running))
    })
}

/// Waits until the call completes or `timeout_us` microseconds pass (`UINT64_MAX`: no
/// limit; 0: do not wait) and returns whether it completed. The call's own deadline
/// (`timeout_ms`) bounds the wait as well. Inside a completion callback it does not wait
/// (it would hold the I/O thread): it answers like `shardlimit_pending_poll()`. False for
/// NULL or a handle that is not a live pending. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_pending_wait(
    pending: *const shardlimit_pending,
    timeout_us: u64,
) -> bool {
    quiet(false, || {
        let Ok(p) = live("pending", pending) else {
            return false;
        };
        let mut s = p.state.lock();
        if in_callback() || timeout_us == 0 {
            return !matches!(*s, State::Running);
        }
        let deadline = Instant::now().checked_add(Duration::from_micros(timeout_us));
        while matches!(*s, State::Running) {
            match deadline {
                Some(d) => {
                    if p.done.wait_until(&mut s, d).timed_out() {
                        return !matches!(*s, State::Running);
                    }
                }
                None => p.done.wait(&mut s),
            }
        }
        true
    })
}

/// Cancels the call if it has not completed: it completes now, on this thread, with
/// `SHARDLIMIT_ERR_CANCELLED` (the callback runs before this returns), and its work on
/// the runtime is dropped. Returns true when it cancelled the call, false when the call
/// had completed already (its result stands) or `pending` is not a live pending.
/// Cancelling does not undo what Redis may already have done: a check sent before the
/// cancel may still have been counted. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_pending_cancel(pending: *const shardlimit_pending) -> bool {
    quiet(false, || {
        let Ok(p) = live("pending", pending) else {
            return false;
        };
        cancel(&p)
    })
}

fn cancel(p: &shardlimit_pending) -> bool {
    if p.finish(Err(shardlimit_pending::cancelled())) {
        p.cancel.notify_one();
        true
    } else {
        false
    }
}

/// Runs `f` on the completed call's outcome; the call's own error when it failed.
fn with_outcome<R>(
    pending: *const shardlimit_pending,
    f: impl FnOnce(&mut Outcome) -> Result<R, Error>,
) -> Result<R, Error> {
    let p = live("pending", pending)?;
    let mut s = p.state.lock();
    match &mut *s {
        State::Running => Err(invalid(
            "pending",
            "has not completed yet: wait for it (shardlimit_pending_wait or the callback)",
        )),
        State::Done(done) => match &mut **done {
            Err(e) => Err(e.clone()),
            Ok(o) => f(o),
        },
    }
}

fn wrong_kind(o: &Outcome, wanted: &str) -> Error {
    invalid(
        "pending",
        format!("is a call whose result is a {}, not a {wanted}", o.kind()),
    )
}

/// The result code of a completed call, whatever it returns: OK, or its error (also
/// through `*err`). INVALID_ARGUMENT when it has not completed. The result of
/// `shardlimit_reset_start()` and `shardlimit_block_start()`. Thread-safe. `err` may be
/// NULL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_pending_result(
    pending: *const shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || with_outcome(pending, |_| Ok(())))
}

/// The decision of a completed check, peek or layered check: on success `*out` is
/// filled. The call's own error (CONNECTION, TIMEOUT, CANCELLED...) otherwise;
/// INVALID_ARGUMENT when it has not completed or is another kind of call. May be read
/// more than once. Thread-safe. `err` may be NULL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_pending_decision(
    pending: *const shardlimit_pending,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let out = out_arg("out", out)?;
        let d = with_outcome(pending, |o| match o {
            Outcome::Decision(d) => decision_to_c(d),
            o => Err(wrong_kind(o, "decision")),
        })?;
        out.write(d);
        Ok(())
    })
}

/// The decision and lease of a completed `shardlimit_acquire_start()`: on success `*out`
/// is filled and `*out_lease` set, to a new lease the caller owns when Redis granted the
/// units (the first time only: later calls give NULL), or NULL when nothing is held:
/// denied, or allowed by a fallback (`out->source == SHARDLIMIT_SOURCE_FALLBACK`; see
/// `shardlimit_acquire()`: branch on `out->allowed`). The call's own error
/// otherwise; INVALID_ARGUMENT when it has not completed or is another kind of call.
/// Thread-safe. `err` may be NULL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_pending_acquired(
    pending: *const shardlimit_pending,
    out: *mut shardlimit_decision,
    out_lease: *mut *mut shardlimit_lease,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let out = out_arg("out", out)?;
        let out_lease = out_arg("out_lease", out_lease)?;
        let (d, lease) = with_outcome(pending, |o| match o {
            Outcome::Acquired(d, lease) => {
                let d = decision_to_c(d)?;
                let lease = match lease.take() {
                    Some(l) => register(l)?,
                    None => std::ptr::null_mut(),
                };
                Ok((d, lease))
            }
            o => Err(wrong_kind(o, "lease")),
        })?;
        out.write(d);
        out_lease.write(lease);
        Ok(())
    })
}

/// The answer of a completed `shardlimit_release_start()` (whether the lease was still
/// held) or `shardlimit_unblock_start()` (whether the key was blocked): on success `*out`
/// is set. The call's own error otherwise; INVALID_ARGUMENT when it has not completed or
/// is another kind of call. Thread-safe. `err` may be NULL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_pending_bool(
    pending: *const shardlimit_pending,
    out: *mut bool,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let out = out_arg("out", out)?;
        let b = with_outcome(pending, |o| match o {
            Outcome::Bool(b) => Ok(*b),
            o => Err(wrong_kind(o, "boolean")),
        })?;
        out.write(b);
        Ok(())
    })
}

/// The block-list entry of a completed `shardlimit_blocked_start()`: on success `*out` is
/// filled as by `shardlimit_blocked()` (free `out->reason` with
/// `shardlimit_string_free()`). The call's own error otherwise; INVALID_ARGUMENT when it
/// has not completed or is another kind of call. Thread-safe. `err` may be NULL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_pending_block_info(
    pending: *const shardlimit_pending,
    out: *mut shardlimit_block_info,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let out = out_arg("out", out)?;
        let info = with_outcome(pending, |o| match o {
            Outcome::Blocked(b) => Ok(b.clone()),
            o => Err(wrong_kind(o, "block-list entry")),
        })?;
        out.write(block_info_to_c(info));
        Ok(())
    })
}

/// Frees a pending. One still running is cancelled first (its callback runs, with
/// CANCELLED, before this returns). A lease never read is freed with it. NULL, a pending
/// already freed, or a pointer that is not a pending, is a no-op. Thread-safe; may be
/// called from the pending's own callback.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_pending_free(pending: *mut shardlimit_pending) {
    quiet((), || {
        if let Ok(p) = live("pending", pending.cast_const()) {
            cancel(&p);
        }
        drop(unregister(pending))
    })
}

mod shadow;
pub use shadow::*;
mod settle;
mod start;
pub use start::*;
mod text;
pub use text::*;

#[cfg(test)]
mod tests;
