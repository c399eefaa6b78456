//! The core's rate-limited warning lines (fallbacks, circuits opened, failed handoffs and
//! refunds, rejected configs; `Limiter::set_log_sink`) for C hosts, two ways:
//!
//! - a callback (`shardlimit_set_log_callback`), called on the thread that logged, for C
//!   and C++ (`Limiter::on_log`);
//! - a log subscription (`shardlimit_subscribe_logs`), a bounded queue drained with
//!   `shardlimit_log_subscription_next`, for hosts that must not be called from a thread
//!   they did not make (Go drains it from a goroutine, as it drains events).
//!
//! One core sink per limiter handle feeds both. With no callback set, a limiter writes
//! its lines to stderr, as the CLI does (`SHARDLIMIT_LOG=off` in the environment, or a
//! NULL callback, silences that), so a C or C++ service hears about its fallbacks without
//! writing any code.

use super::queue::{capacity_arg, fill, BoundedQueue, Fanout};
use super::*;
use parking_lot::Mutex;
use shardlimit::{LogLevel, LogRecord};
use std::ffi::c_void;
use std::sync::OnceLock;

/// How serious a line is (`shardlimit_log_record.level`, `shardlimit_log_line.level`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shardlimit_log_level {
    /// Something failed and the library carried on (a fallback, a circuit opened).
    SHARDLIMIT_LOG_WARN = 1,
    /// Something failed and was refused (a watched config rejected).
    SHARDLIMIT_LOG_ERROR = 2,
}

/// One warning line, as a callback receives it. Every string is UTF-8 and NUL-terminated,
/// and borrowed for the duration of the call only (copy what you keep).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct shardlimit_log_record {
    /// A `shardlimit_log_level` value.
    pub level: u32,
    /// Always `"shardlimit"`.
    pub target: shardlimit_str,
    /// Why: `"fallback"`, `"circuit_opened"`, `"handoff_failed"`, `"config_rejected"` or
    /// `"refund_failed"` (more may come).
    pub reason: shardlimit_str,
    /// The policy (fallback, handoff_failed), the shard (circuit_opened, refund_failed) or
    /// the config file (config_rejected); `"(other)"` past the library's bound of 1024.
    pub subject: shardlimit_str,
    /// The `shardlimit_result` code of the error behind the line.
    pub error_code: u32,
    /// The error's message.
    pub error: shardlimit_str,
    /// True for a fallback: `allowed` says whether `on_error` allowed the check.
    pub has_allowed: bool,
    pub allowed: bool,
    /// How many lines of this (reason, subject) were not written since the last one.
    pub suppressed: u64,
    /// The whole line.
    pub message: shardlimit_str,
}

/// A log callback: `user_data` as registered, and the line (valid during the call only).
/// Called on the thread that logged (a caller's thread or the limiter's I/O thread), at
/// most one line per (reason, subject) per `log_interval`; it must be thread-safe, return
/// quickly and not call back into the limiter.
pub type shardlimit_log_callback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, record: *const shardlimit_log_record)>;

/// Size of `shardlimit_log_line.subject`; longer subjects are cut at a character
/// boundary and `truncated` is set.
pub const SHARDLIMIT_LOG_SUBJECT_CAP: usize = 256;
/// Size of `shardlimit_log_line.message`; longer lines are cut at a character boundary
/// and `truncated` is set.
pub const SHARDLIMIT_LOG_MESSAGE_CAP: usize = 1024;

/// One warning line, filled by `shardlimit_log_subscription_next()`: a plain struct the
/// caller allocates; nothing inside it needs freeing. Strings are NUL-terminated UTF-8.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct shardlimit_log_line {
    /// A `shardlimit_log_level` value.
    pub level: u32,
    /// The `shardlimit_result` code of the error behind the line.
    pub error_code: u32,
    /// True for a fallback: `allowed` says whether `on_error` allowed the check.
    pub has_allowed: bool,
    pub allowed: bool,
    /// How many lines of this (reason, subject) were not written since the last one.
    pub suppressed: u64,
    /// As `shardlimit_log_record.reason`.
    pub reason: [c_char; 32],
    pub subject_len: usize,
    /// As `shardlimit_log_record.subject`.
    pub subject: [c_char; SHARDLIMIT_LOG_SUBJECT_CAP],
    pub message_len: usize,
    /// The whole line (it holds the error's message).
    pub message: [c_char; SHARDLIMIT_LOG_MESSAGE_CAP],
    /// True when `subject` or `message` was cut to fit.
    pub truncated: bool,
}

/// The most lines one log subscription may hold (`shardlimit_subscribe_logs()`).
pub const SHARDLIMIT_MAX_LOG_CAPACITY: usize = 4096;

/// A subscription to a limiter's warning lines, from `shardlimit_subscribe_logs()`: a
/// bounded queue the caller drains with `shardlimit_log_subscription_next()`. An opaque
/// handle owned by the caller; free it with `shardlimit_log_subscription_free()`, which
/// wakes a thread waiting in `_next` (it returns CLOSED). Thread-safe.
pub struct shardlimit_log_subscription {
    queue: Arc<BoundedQueue<LogRecord>>,
}

impl Object for shardlimit_log_subscription {
    const TAG: Tag = Tag::LogSubscription;
}

#[derive(Clone, Copy)]
struct Callback {
    f: unsafe extern "C" fn(*mut c_void, *const shardlimit_log_record),
    user_data: *mut c_void,
}
// SAFETY: the caller promises (header) that the callback and its user_data may be used
// from any thread
unsafe impl Send for Callback {}
unsafe impl Sync for Callback {}

/// The sinks of one limiter handle.
#[derive(Default)]
pub(crate) struct LogFanout {
    callback: Mutex<Option<Callback>>,
    queues: Fanout<LogRecord>,
    /// Lines go to stderr while no callback was ever set (`default_to_stderr`).
    stderr: std::sync::atomic::AtomicBool,
}

/// The default of a new limiter: its warning lines to stderr, as the CLI writes them
/// (`warn: shardlimit: ...`), until `shardlimit_set_log_callback()` replaces that (NULL:
/// nowhere); none when the environment has `SHARDLIMIT_LOG=off`.
pub(crate) fn default_to_stderr(l: &shardlimit_limiter) {
    let off = std::env::var_os("SHARDLIMIT_LOG").is_some_and(|v| v.eq_ignore_ascii_case("off"));
    if !off {
        log_fanout(l)
            .stderr
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Held only by the core sink: when the core limiter is gone, every log subscription
/// closes.
struct LogFeed(Arc<LogFanout>);

impl Drop for LogFeed {
    fn drop(&mut self) {
        self.0.queues.close_all();
    }
}

pub(crate) type LogFanoutCell = OnceLock<Arc<LogFanout>>;

fn log_fanout(l: &shardlimit_limiter) -> Arc<LogFanout> {
    l.logs
        .get_or_init(|| {
            let f = Arc::new(LogFanout::default());
            let feed = LogFeed(f.clone());
            l.limiter
                .set_log_sink(Some(Arc::new(move |r: &LogRecord| feed.emit(r))));
            f
        })
        .clone()
}

fn level(l: LogLevel) -> u32 {
    match l {
        LogLevel::Warn => shardlimit_log_level::SHARDLIMIT_LOG_WARN as u32,
        LogLevel::Error => shardlimit_log_level::SHARDLIMIT_LOG_ERROR as u32,
    }
}

fn borrowed(s: &CString) -> shardlimit_str {
    shardlimit_str {
        ptr: s.as_ptr(),
        len: s.as_bytes().len(),
    }
}

impl LogFeed {
    fn emit(&self, r: &LogRecord) {
        self.0.queues.emit(r);
        // held during the call: once shardlimit_set_log_callback() returns, the callback it
        // replaced is not running and never runs again
        let cb = self.0.callback.lock();
        if cb.is_none() && self.0.stderr.load(std::sync::atomic::Ordering::Relaxed) {
            use std::io::Write;
            // never a panic on the I/O thread: a closed stderr loses the line
            let _ = writeln!(
                std::io::stderr().lock(),
                "{}: {}",
                r.level.name(),
                r.message
            );
        }
        if let Some(cb) = *cb {
            // NUL-terminated copies, as every string the library hands out
            let [target, reason, subject, error, message] =
                [r.target, r.reason.name(), &r.subject, &r.error, &r.message]
                    .map(|s| to_cstring(s.to_string()));
            let rec = shardlimit_log_record {
                level: level(r.level),
                target: borrowed(&target),
                reason: borrowed(&reason),
                subject: borrowed(&subject),
                error_code: shardlimit_result::from_kind(r.error_kind) as u32,
                error: borrowed(&error),
                has_allowed: r.allowed.is_some(),
                allowed: r.allowed.unwrap_or(false),
                suppressed: r.suppressed,
                message: borrowed(&message),
            };
            // SAFETY: the caller registered `f` for this; `rec` outlives the call
            unsafe { (cb.f)(cb.user_data, &rec) };
        }
    }
}

fn line_to_c(r: &LogRecord) -> shardlimit_log_line {
    // SAFETY: every field is an integer, a bool or an array of them: all-zero is valid
    let mut out: shardlimit_log_line = unsafe { std::mem::zeroed() };
    out.level = level(r.level);
    out.error_code = shardlimit_result::from_kind(r.error_kind) as u32;
    out.has_allowed = r.allowed.is_some();
    out.allowed = r.allowed.unwrap_or(false);
    out.suppressed = r.suppressed;
    fill(&mut out.reason, r.reason.name());
    let (n, a) = fill(&mut out.subject, &r.subject);
    out.subject_len = n;
    let (m, b) = fill(&mut out.message, &r.message);
    out.message_len = m;
    out.truncated = a || b;
    out
}

/// Registers `callback` to receive the limiter's warning lines: every fallback to
/// `on_error`, a circuit opened, a failed reshard handoff or layered refund, a rejected
/// watched config, at most one line per (reason, subject) per the config's
/// `log_interval` (10 s by default), each carrying how many were suppressed since the
/// last. Replaces the callback registered before, and the default (each line written to
/// stderr, as `warn: shardlimit: ...`, from the moment the limiter is made unless the
/// environment has `SHARDLIMIT_LOG=off`); NULL removes it (lines then go nowhere but log
/// subscriptions: this is how to silence the default). `callback` is called on the
/// thread that logged (a caller's thread or the limiter's I/O thread) with `user_data`:
/// both must be usable from any thread until the callback is replaced or the limiter is
/// freed (`shardlimit_limiter_free()` and its last call returned). The callback must not call into the limiter. `err` may
/// be NULL. Thread-safe.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_set_log_callback(
    limiter: *const shardlimit_limiter,
    callback: shardlimit_log_callback,
    user_data: *mut c_void,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = live("limiter", limiter)?;
        let f = log_fanout(&l);
        let mut cb = f.callback.lock();
        *cb = callback.map(|f| Callback { f, user_data });
        f.stderr.store(false, std::sync::atomic::Ordering::Relaxed);
        drop(cb);
        Ok(())
    })
}

/// Subscribes to the limiter's warning lines (the ones `shardlimit_set_log_callback()`
/// gets), from the moment it returns, for hosts that take them on a thread of their own.
/// Lines wait in a queue of `capacity` lines (0: 256; at most
/// `SHARDLIMIT_MAX_LOG_CAPACITY`); when it is full, later ones are dropped and counted
/// (`shardlimit_log_subscription_dropped()`). The subscription closes when freed or when
/// the limiter is gone; it does not keep the limiter alive.
///
/// On success `*out` is a new log subscription the caller owns (free with
/// `shardlimit_log_subscription_free()`). `err` may be NULL. Thread-safe.
/// Results: OK, INVALID_ARGUMENT (`capacity` too large, NULL `out`), CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_subscribe_logs(
    limiter: *const shardlimit_limiter,
    capacity: usize,
    out: *mut *mut shardlimit_log_subscription,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = live("limiter", limiter)?;
        let capacity = capacity_arg(capacity, 256, SHARDLIMIT_MAX_LOG_CAPACITY, "lines")?;
        let out = out_arg("out", out)?;
        let queue = log_fanout(&l).queues.subscribe(capacity);
        out.write(register(shardlimit_log_subscription { queue })?);
        Ok(())
    })
}

/// Takes the oldest queued line, waiting up to `timeout_us` microseconds for one
/// (`UINT64_MAX`: no limit; 0: do not wait). On OK, `*out_got` says whether a line came
/// and, when it did, `*out` holds it (left untouched otherwise). CLOSED once the
/// subscription is freed (also while this waits: it wakes) or the limiter is gone and
/// every queued line was taken. Inside a completion callback it never waits. `err` may be
/// NULL. Thread-safe.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_log_subscription_next(
    subscription: *const shardlimit_log_subscription,
    timeout_us: u64,
    out_got: *mut bool,
    out: *mut shardlimit_log_line,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let sub = live("subscription", subscription)?;
        let out_got = out_arg("out_got", out_got)?;
        let out = out_arg("out", out)?;
        sub.queue
            .next_into(timeout_us, out_got, out, |r| Ok(line_to_c(r)))
    })
}

/// How many lines this log subscription dropped because its queue was full. 0 for NULL
/// or a handle that is not a live log subscription. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_log_subscription_dropped(
    subscription: *const shardlimit_log_subscription,
) -> u64 {
    quiet(0, || {
        live("subscription", subscription).map_or(0, |s| s.queue.dropped())
    })
}

/// Ends a log subscription and frees it; a thread waiting in
/// `shardlimit_log_subscription_next()` wakes with CLOSED. NULL, a second free, or a
/// pointer that is not a log subscription is a no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_log_subscription_free(
    subscription: *mut shardlimit_log_subscription,
) {
    quiet((), || {
        if let Some(obj) = unregister(subscription) {
            if let Ok(s) = obj.downcast::<shardlimit_log_subscription>() {
                s.queue.close_and_discard();
            }
        }
    })
}

/// Registers `callback` (see `shardlimit_notify_callback`) to be called with `user` when
/// the log subscription goes from empty to holding a line and when it closes, so that a
/// host drains it from its own event loop (`shardlimit_log_subscription_next()` with a
/// timeout of 0, until no line comes) instead of a thread waiting in `_next`. When lines
/// are queued already, or the subscription is closed, it is called once before this
/// returns. Once per subscription. `callback` and `user` must be usable from any thread
/// until the subscription is freed. `err` may be NULL. Thread-safe.
/// Results: OK, INVALID_ARGUMENT (NULL `callback`, one set already), CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_log_subscription_set_notify(
    subscription: *const shardlimit_log_subscription,
    callback: notify::shardlimit_notify_callback,
    user: *mut c_void,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        live("subscription", subscription)?
            .queue
            .set_notify(callback, user)
    })
}
