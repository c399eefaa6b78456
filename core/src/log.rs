//! Rate-limited warnings for operators: a fallback to `on_error`, a circuit opened, a
//! reshard handoff that failed, a watched config rejected, a layered refund that failed.
//!
//! Each is one line per (reason, subject) per `log_interval` (10 s unless the config says):
//! the first occurrence is a line at once; the ones after it within the interval are
//! counted, and the next line after the interval carries that count (`suppressed`). A line
//! goes to `tracing` (target `shardlimit`, `warn!` or `error!`) and to the limiter's log
//! sink ([`crate::Limiter::set_log_sink`]), which the bindings install to forward lines to
//! their host's logger (Python `logging`, Node, Go `slog`, a C callback).
//!
//! Nothing here runs on a check that does not fail: the one call site on the check path is
//! inside the fallback itself. Memory is bounded: at most [`LOG_KEYS_MAX`] (reason,
//! subject) pairs are tracked; beyond that (many ad-hoc policies failing at once) the
//! others share one entry per reason whose subject is [`LOG_OVERFLOW_SUBJECT`].

use crate::error::{Error, ErrorKind};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The interval of rate-limited lines when the config sets no `log_interval`.
pub const DEFAULT_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// The most (reason, subject) pairs whose lines are rate-limited apart.
pub const LOG_KEYS_MAX: usize = 1024;
/// The subject of the pairs beyond [`LOG_KEYS_MAX`], which share one line per reason.
pub const LOG_OVERFLOW_SUBJECT: &str = "(other)";
/// The `target` of every line.
pub const LOG_TARGET: &str = "shardlimit";

/// How serious a line is. Deliberately not `#[non_exhaustive]`: every binding maps each
/// level to its host's, and a new one must fail their build until they do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogLevel {
    Warn,
    Error,
}

impl LogLevel {
    /// `"warn"` or `"error"`.
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

/// Why a line was written: one of [`LogReason::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LogReason {
    /// A check fell back to its policy's `on_error` (subject: the policy).
    Fallback,
    /// A shard's circuit opened after consecutive failures (subject: the shard).
    CircuitOpened,
    /// A key's state could not be carried to its new shard after a reshard (subject: the
    /// policy).
    HandoffFailed,
    /// A watched config file changed but was rejected; the old config stays (subject: the
    /// file).
    ConfigRejected,
    /// A layered check's refund failed; the units stay consumed (subject: the shard).
    RefundFailed,
}

impl LogReason {
    pub const ALL: &'static [LogReason] = &[
        LogReason::Fallback,
        LogReason::CircuitOpened,
        LogReason::HandoffFailed,
        LogReason::ConfigRejected,
        LogReason::RefundFailed,
    ];
    /// `"fallback"`, `"circuit_opened"`, `"handoff_failed"`, `"config_rejected"` or
    /// `"refund_failed"`.
    pub fn name(self) -> &'static str {
        match self {
            LogReason::Fallback => "fallback",
            LogReason::CircuitOpened => "circuit_opened",
            LogReason::HandoffFailed => "handoff_failed",
            LogReason::ConfigRejected => "config_rejected",
            LogReason::RefundFailed => "refund_failed",
        }
    }
    fn level(self) -> LogLevel {
        match self {
            LogReason::ConfigRejected => LogLevel::Error,
            _ => LogLevel::Warn,
        }
    }
}

/// One line for an operator. `message` is the whole line; the other fields are its parts,
/// for hosts that log structured records.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LogRecord {
    pub level: LogLevel,
    /// Always [`LOG_TARGET`].
    pub target: &'static str,
    pub reason: LogReason,
    /// The policy (fallback, handoff_failed), the shard (circuit_opened, refund_failed)
    /// or the config file (config_rejected); [`LOG_OVERFLOW_SUBJECT`] past the bound.
    pub subject: String,
    /// The kind of the error behind the line.
    pub error_kind: ErrorKind,
    /// The error's message (never a secret: errors carry none).
    pub error: String,
    /// Fallback: whether `on_error` allowed the check.
    pub allowed: Option<bool>,
    /// How many lines of this (reason, subject) were not written since the last one.
    pub suppressed: u64,
    /// The line.
    pub message: String,
}

/// Where a limiter's lines go besides `tracing`. Called on the thread that logged (a
/// caller's thread or the limiter's I/O thread): keep it short and never block on the
/// host (the bindings queue the record for their own thread or event loop).
pub type LogSink = Arc<dyn Fn(&LogRecord) + Send + Sync>;

struct Slot {
    /// When the last line of this pair was written (µs, on the clock passed in).
    last_us: u64,
    suppressed: u64,
}

/// The rate limiter of lines and the sink of one limiter.
pub(crate) struct Logs {
    interval_us: AtomicU64,
    slots: Mutex<HashMap<(LogReason, Box<str>), Slot>>,
    sink: RwLock<Option<LogSink>>,
}

impl Default for Logs {
    fn default() -> Logs {
        Logs {
            interval_us: AtomicU64::new(DEFAULT_LOG_INTERVAL.as_micros() as u64),
            slots: Mutex::new(HashMap::new()),
            sink: RwLock::new(None),
        }
    }
}

impl Logs {
    pub fn set_interval(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.interval_us.store(us, Ordering::Relaxed);
    }

    pub fn set_sink(&self, sink: Option<LogSink>) {
        *self.sink.write() = sink;
    }

    /// Counts one occurrence of `reason` for `subject` at `now_us`, and writes a line when
    /// it is the first of its pair or the last line is at least the interval old.
    pub fn note(
        &self,
        now_us: u64,
        reason: LogReason,
        subject: &str,
        error: &Error,
        allowed: Option<bool>,
    ) {
        let interval = self.interval_us.load(Ordering::Relaxed);
        // (Redis's text may hold a Redis key, and so a user key: never in a log line)
        let error = &error.clone().without_keys(None);
        let (subject, suppressed) = {
            let mut slots = self.slots.lock();
            let mut subject = subject;
            if slots.len() >= LOG_KEYS_MAX && !slots.contains_key(&(reason, subject.into())) {
                // forget the pairs with nothing to report: their next line is due at once
                slots
                    .retain(|_, s| s.suppressed > 0 || now_us.saturating_sub(s.last_us) < interval);
                if slots.len() >= LOG_KEYS_MAX {
                    subject = LOG_OVERFLOW_SUBJECT;
                }
            }
            match slots.get_mut(&(reason, subject.into())) {
                Some(s) if now_us.saturating_sub(s.last_us) < interval => {
                    s.suppressed += 1;
                    return;
                }
                Some(s) => {
                    let n = std::mem::take(&mut s.suppressed);
                    s.last_us = now_us;
                    (subject, n)
                }
                None => {
                    slots.insert(
                        (reason, subject.into()),
                        Slot {
                            last_us: now_us,
                            suppressed: 0,
                        },
                    );
                    (subject, 0)
                }
            }
        };
        self.write(LogRecord {
            level: reason.level(),
            target: LOG_TARGET,
            reason,
            subject: subject.to_string(),
            error_kind: error.kind(),
            error: error.to_string(),
            allowed,
            suppressed,
            message: message(reason, subject, error, allowed, suppressed, interval),
        });
    }

    fn write(&self, r: LogRecord) {
        let (reason, subject, suppressed) = (r.reason.name(), r.subject.as_str(), r.suppressed);
        let kind = r.error_kind.name();
        match r.level {
            LogLevel::Warn => {
                tracing::warn!(target: "shardlimit", reason, subject, kind, suppressed, "{}", r.message)
            }
            LogLevel::Error => {
                tracing::error!(target: "shardlimit", reason, subject, kind, suppressed, "{}", r.message)
            }
        }
        let sink = self.sink.read().clone();
        if let Some(sink) = sink {
            // a panicking sink must not take the check down with it
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink(&r)));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.lock().len()
    }
}

fn message(
    reason: LogReason,
    subject: &str,
    e: &Error,
    allowed: Option<bool>,
    suppressed: u64,
    interval_us: u64,
) -> String {
    let kind = e.kind().name();
    let mut m = match reason {
        LogReason::Fallback => format!(
            "shardlimit: policy `{subject}` fell back to on_error and {} the check: {kind}: {e}",
            if allowed == Some(false) { "denied" } else { "allowed" }
        ),
        LogReason::CircuitOpened => format!(
            "shardlimit: circuit of shard `{subject}` opened after consecutive failures: {kind}: {e}"
        ),
        LogReason::HandoffFailed => format!(
            "shardlimit: reshard handoff failed for policy `{subject}` (the key's state stays on its old shard): {kind}: {e}"
        ),
        LogReason::ConfigRejected => format!(
            "shardlimit: new config `{subject}` rejected, keeping the old one: {kind}: {e}"
        ),
        LogReason::RefundFailed => format!(
            "shardlimit: refund of a layered check failed on shard `{subject}`; the units stay consumed: {kind}: {e}"
        ),
    };
    if suppressed > 0 {
        let s = Duration::from_micros(interval_us);
        m.push_str(&format!(
            " ({suppressed} more since the last line; one line per {s:?})"
        ));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err() -> Error {
        Error::Timeout {
            shard: "s0".into(),
            timeout_ms: 50,
        }
    }

    fn collect(l: &Logs) -> Arc<Mutex<Vec<LogRecord>>> {
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        l.set_sink(Some(Arc::new(move |r: &LogRecord| {
            g.lock().push(r.clone())
        })));
        got
    }

    #[test]
    fn one_line_per_pair_per_interval_with_the_count_of_the_others() {
        let l = Logs::default();
        let got = collect(&l);
        for i in 0..1000 {
            l.note(1_000 + i, LogReason::Fallback, "api", &err(), Some(true));
        }
        l.note(1_000, LogReason::Fallback, "login", &err(), Some(false));
        assert_eq!(got.lock().len(), 2);
        // just before the interval: still counted
        l.note(10_000_999, LogReason::Fallback, "api", &err(), Some(true));
        assert_eq!(got.lock().len(), 2);
        l.note(10_001_000, LogReason::Fallback, "api", &err(), Some(true));
        let g = got.lock();
        assert_eq!(g.len(), 3);
        assert_eq!((g[0].subject.as_str(), g[0].suppressed), ("api", 0));
        assert_eq!(
            (g[1].subject.as_str(), g[1].allowed),
            ("login", Some(false))
        );
        assert!(g[1].message.contains("denied"), "{}", g[1].message);
        assert_eq!((g[2].subject.as_str(), g[2].suppressed), ("api", 1000));
        assert!(
            g[2].message.contains("(1000 more since the last line"),
            "{}",
            g[2].message
        );
        assert_eq!(g[2].error_kind, ErrorKind::Timeout);
        assert_eq!(g[2].target, "shardlimit");
    }

    #[test]
    fn the_pairs_are_bounded_and_the_rest_share_one_line() {
        let l = Logs::default();
        let got = collect(&l);
        for i in 0..(LOG_KEYS_MAX + 500) {
            l.note(1, LogReason::Fallback, &format!("p{i}"), &err(), Some(true));
        }
        assert_eq!(l.len(), LOG_KEYS_MAX + 1);
        let g = got.lock();
        assert_eq!(g.len(), LOG_KEYS_MAX + 1);
        assert_eq!(g[LOG_KEYS_MAX].subject, LOG_OVERFLOW_SUBJECT);
        drop(g);
        // once an interval has passed, the pairs with nothing to report make room
        l.note(20_000_000, LogReason::Fallback, "late", &err(), Some(true));
        assert_eq!(got.lock().last().unwrap().subject, "late");
        assert!(l.len() <= 2, "{}", l.len());
    }

    #[test]
    fn a_panicking_sink_is_contained() {
        let l = Logs::default();
        l.set_sink(Some(Arc::new(|_: &LogRecord| panic!("sink"))));
        l.note(1, LogReason::CircuitOpened, "s0", &err(), None);
    }
}
