//! The core's rate-limited warning lines (`Limiter::set_log_sink`) into Python: by default
//! `logging.getLogger("shardlimit")`, or a callback the user sets
//! (`Limiter.set_log_sink`). The core's sink only queues the line; one thread per
//! process (started on first use, and again in a forked child) takes the GIL and calls
//! Python, so the I/O thread never waits for the GIL; it stops when the interpreter exits
//! (`crate::delivery`).

use pyo3::prelude::*;
use pyo3::types::PyDict;
use shardlimit::{LogLevel, LogRecord};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};

/// Lines waiting for the Python thread before later ones are dropped.
const QUEUE: usize = 1024;

/// Where a limiter's lines go: the `logging` module, or a callable.
enum Target {
    Logging,
    Callback(Py<PyAny>),
}

type Item = (Arc<Target>, LogRecord);

/// The sender to the Python thread, and the process it was started in.
static WORKER: Mutex<Option<(u32, SyncSender<Item>)>> = Mutex::new(None);

fn sender() -> Option<SyncSender<Item>> {
    let mut w = WORKER.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if let Some((p, tx)) = w.as_ref() {
        if *p == pid {
            return Some(tx.clone());
        }
    }
    // first use, or a forked child (the parent's thread does not exist here)
    if crate::delivery::stopping() {
        return None; // the interpreter is exiting: no thread to call it
    }
    let (tx, rx) = sync_channel::<Item>(QUEUE);
    crate::delivery::spawn("shardlimit-log", rx, |py, (target, r): Item| {
        deliver(py, &target, &r)
    })
    .ok()?;
    *w = Some((pid, tx.clone()));
    Some(tx)
}

fn fields<'py>(py: Python<'py>, r: &LogRecord) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("level", r.level.name())?;
    d.set_item("target", r.target)?;
    d.set_item("reason", r.reason.name())?;
    d.set_item("subject", &r.subject)?;
    d.set_item("error_kind", r.error_kind.name())?;
    d.set_item("error", &r.error)?;
    d.set_item("allowed", r.allowed)?;
    d.set_item("suppressed", r.suppressed)?;
    d.set_item("message", &r.message)?;
    Ok(d)
}

fn deliver(py: Python<'_>, target: &Target, r: &LogRecord) {
    let run = || -> PyResult<()> {
        let f = fields(py, r)?;
        match target {
            Target::Callback(cb) => {
                cb.call1(py, (f,))?;
            }
            Target::Logging => {
                let logger = py
                    .import("logging")?
                    .call_method1("getLogger", ("shardlimit",))?;
                let level: u32 = match r.level {
                    LogLevel::Warn => 30,
                    LogLevel::Error => 40,
                };
                let extra = PyDict::new(py);
                extra.set_item("shardlimit", f)?;
                let kw = PyDict::new(py);
                kw.set_item("extra", extra)?;
                logger.call_method("log", (level, &r.message), Some(&kw))?;
            }
        }
        Ok(())
    };
    if let Err(e) = run() {
        match target {
            Target::Callback(cb) => e.write_unraisable(py, Some(cb.bind(py))),
            Target::Logging => e.write_unraisable(py, None),
        }
    }
}

fn install(l: &shardlimit::Limiter, target: Target) {
    let target = Arc::new(target);
    l.set_log_sink(Some(Arc::new(move |r: &LogRecord| {
        if let Some(tx) = sender() {
            let _ = tx.try_send((target.clone(), r.clone()));
        }
    })));
}

/// The default of every limiter: `logging.getLogger("shardlimit")`.
pub(crate) fn to_logging(l: &shardlimit::Limiter) {
    install(l, Target::Logging);
}

/// `Limiter.set_log_sink`: a callable, or None to drop the lines.
pub(crate) fn set_sink(l: &shardlimit::Limiter, callback: Option<Py<PyAny>>) {
    match callback {
        Some(cb) => install(l, Target::Callback(cb)),
        None => l.set_log_sink(None),
    }
}
