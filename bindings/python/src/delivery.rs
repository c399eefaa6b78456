//! The threads of shardlimit's own that call into Python (`subscribe()` callbacks, log
//! lines), and their stop when the interpreter exits.
//!
//! A thread that calls into Python while the interpreter finalizes crashes the process
//! (pyo3 panics on a finalizing interpreter; CPython ends or hangs a thread that takes the
//! GIL then). So the module registers an `atexit` hook, which runs while the interpreter
//! is still whole: it closes the gate below and waits (GIL released) until no delivery is
//! under way. A delivery thread passes the gate before each item and leaves the gate
//! after it; once the gate is closed, it calls no Python again and ends, dropping what it
//! had queued. The gate is two counters (no lock a fork could leave held).

use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// Closed by the exit hook: no delivery starts after it.
static STOPPING: AtomicBool = AtomicBool::new(false);
/// Deliveries under way (threads past the gate).
static DELIVERING: AtomicUsize = AtomicUsize::new(0);
/// The process that counted them: a forked child has none of its parent's threads.
static COUNTED_IN: AtomicU32 = AtomicU32::new(0);

/// How long the exit hook waits for a callback under way to return. A callback that
/// blocks longer is left behind: the interpreter's own rules for threads at exit apply.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// Passes the gate: false once the interpreter is exiting (deliver nothing more).
fn enter() -> bool {
    DELIVERING.fetch_add(1, SeqCst);
    COUNTED_IN.store(std::process::id(), SeqCst);
    // (SeqCst both ways: either the exit hook sees this count, or this sees the gate shut)
    if STOPPING.load(SeqCst) {
        DELIVERING.fetch_sub(1, SeqCst);
        return false;
    }
    true
}

struct Leave;
impl Drop for Leave {
    fn drop(&mut self) {
        DELIVERING.fetch_sub(1, SeqCst);
    }
}

/// Whether the interpreter is exiting (the exit hook ran).
pub(crate) fn stopping() -> bool {
    STOPPING.load(SeqCst)
}

/// Runs `deliver` with the GIL for each item `rx` receives, on a new thread named
/// `name`, until `rx` is closed or the interpreter exits.
pub(crate) fn spawn<T: Send + 'static>(
    name: &str,
    rx: std::sync::mpsc::Receiver<T>,
    mut deliver: impl FnMut(Python<'_>, T) + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            for item in rx {
                if !enter() {
                    return;
                }
                let _leave = Leave;
                // None: no interpreter to call (finalizing, or gone)
                let called = Python::try_attach(|py| {
                    if !stopping() {
                        deliver(py, item);
                    }
                });
                if called.is_none() || stopping() {
                    return;
                }
            }
        })
        .map(drop)
}

/// The `atexit` hook: closes the gate and waits for the deliveries under way.
#[pyfunction]
fn _stop_delivery(py: Python<'_>) {
    STOPPING.store(true, SeqCst);
    if COUNTED_IN.load(SeqCst) != std::process::id() {
        return; // none of this process's threads ever delivered
    }
    // without the GIL, which a delivery under way needs to finish
    py.detach(|| {
        let deadline = Instant::now() + STOP_WAIT;
        while DELIVERING.load(SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// Registers the exit hook (at import).
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let hook = wrap_pyfunction!(_stop_delivery, m)?;
    m.py().import("atexit")?.call_method1("register", (hook,))?;
    Ok(())
}
