//! asyncio futures resolved by the limiter's Tokio runtime.
//!
//! An async call creates an asyncio future on the running loop and spawns the core's future
//! on the limiter's runtime ([`shardlimit::Limiter::spawner`], which starts the calls of a
//! burst together, so their commands leave in one write): no thread per call.
//! When the core's future finishes, the runtime thread only pushes the result onto a queue
//! and, if the queue was empty, writes one byte to a socket the event loop watches
//! (`loop.add_reader`). The loop thread then drains the queue in a batch, converting results
//! and resolving futures under the GIL. The I/O thread never waits for the GIL, and a burst
//! of completions costs one wake-up of the loop.

use crate::convert::core_err;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::{MutexExt, PyOnceLock};
use std::future::Future;
use std::sync::{Arc, Mutex};

/// Builds the Python result of a finished call, on the loop thread.
type Settle = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

struct Done {
    fut: Py<PyAny>,
    settle: Settle,
}

fn settle<T: Send + 'static>(
    r: shardlimit::Result<T>,
    convert: impl FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
) -> Settle {
    Box::new(move |py| match r {
        Ok(v) => convert(py, v),
        Err(e) => Err(core_err(e)),
    })
}

/// Resolves one asyncio future (unless it was cancelled meanwhile).
fn resolve(py: Python<'_>, d: Done) {
    resolve_future(py, d.fut.bind(py), (d.settle)(py));
}

/// Resolves `fut` with `r`, its result or exception, on the loop thread (unless it was
/// cancelled meanwhile); also the host transport's (`host.rs`).
pub(crate) fn resolve_future(py: Python<'_>, fut: &Bound<'_, PyAny>, r: PyResult<Py<PyAny>>) {
    let plain = plain_future(py, fut);
    // (interned names: a method name made for every call costs an allocation and a hash)
    let r = match (r, plain) {
        (Ok(v), Some(api)) => api.set_result.bind(py).call1((fut, v)),
        (Ok(v), None) => fut.call_method1(intern!(py, "set_result"), (v,)),
        (Err(e), _) => fut.call_method1(intern!(py, "set_exception"), (e.into_value(py),)),
    };
    if let Err(e) = r {
        // a future cancelled meanwhile refuses a result (InvalidStateError): nothing to do.
        // (Asked only then: one method call less for every completion.)
        let cancelled = fut
            .call_method0(intern!(py, "done"))
            .and_then(|x| x.is_truthy())
            .unwrap_or(false);
        if !cancelled {
            e.write_unraisable(py, Some(fut));
        }
    }
}

/// `asyncio.Future` (the C class `_asyncio.Future` where CPython has it), what
/// `loop.create_future()` makes on asyncio's loops and uvloop's, and its methods taken
/// from the class once. The abi3 build calls a method by name as a lookup that makes a
/// bound-method object, then a call; the class's own function takes the future as its
/// first argument and needs neither.
struct FutureApi {
    class: Py<PyAny>,
    set_result: Py<PyAny>,
}

static FUTURE_API: PyOnceLock<Option<FutureApi>> = PyOnceLock::new();

/// The class's methods when `fut` is an `asyncio.Future` itself (not a subclass or
/// another loop's future type, which may override them): None otherwise.
fn plain_future<'a>(py: Python<'a>, fut: &Bound<'_, PyAny>) -> Option<&'a FutureApi> {
    let api = FUTURE_API
        .get_or_init(py, || {
            let class = py.import("asyncio").ok()?.getattr("Future").ok()?;
            let set_result = class.getattr("set_result").ok()?.unbind();
            Some(FutureApi {
                class: class.unbind(),
                set_result,
            })
        })
        .as_ref()?;
    fut.get_type().is(api.class.bind(py)).then_some(api)
}

/// `fut.__await__()`: for an `asyncio.Future`, `iter(fut)`, which is the same method
/// (`Future.__iter__ = __await__`) reached through the type's slot, without a lookup.
pub(crate) fn await_future<'py>(fut: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = fut.py();
    if plain_future(py, fut).is_some() {
        return Ok(fut.try_iter()?.into_any());
    }
    fut.call_method0(intern!(py, "__await__"))
}

/// The completion queue of one event loop.
struct Shared {
    queue: Mutex<Vec<Done>>,
    #[cfg(unix)]
    wake_tx: std::os::unix::net::UnixStream,
    #[cfg(unix)]
    wake_rx: std::os::unix::net::UnixStream,
    #[cfg(not(unix))]
    wake: std::sync::OnceLock<(Py<PyAny>, Py<PyAny>)>,
}

impl Shared {
    fn new() -> PyResult<Shared> {
        #[cfg(unix)]
        {
            let (wake_tx, wake_rx) = std::os::unix::net::UnixStream::pair()?;
            wake_tx.set_nonblocking(true)?;
            wake_rx.set_nonblocking(true)?;
            Ok(Shared {
                queue: Mutex::new(Vec::new()),
                wake_tx,
                wake_rx,
            })
        }
        #[cfg(not(unix))]
        Ok(Shared {
            queue: Mutex::new(Vec::new()),
            wake: std::sync::OnceLock::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Done>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called on the runtime thread, without the GIL.
    fn push(&self, d: Done) {
        let was_empty = {
            let mut q = self.lock();
            let empty = q.is_empty();
            q.push(d);
            empty
        };
        if was_empty {
            self.wake();
        }
    }

    #[cfg(unix)]
    fn wake(&self) {
        use std::io::Write;
        // WouldBlock means the socket is full of wake-ups already: nothing is lost
        let _ = (&self.wake_tx).write(&[1]);
    }

    #[cfg(not(unix))]
    fn wake(&self) {
        // no add_reader on Windows' proactor loop: schedule the drain directly
        if let Some((ev, drain)) = self.wake.get() {
            Python::attach(|py| {
                let _ = ev.bind(py).call_method1("call_soon_threadsafe", (drain,));
            });
        }
    }
}

/// The loop-side end of a completion queue; the event loop calls `_drain` when woken.
#[pyclass(frozen, module = "shardlimit._shardlimit")]
pub struct Completer(Arc<Shared>);

#[pymethods]
impl Completer {
    fn _drain(&self, py: Python<'_>) {
        // empty the wake-up socket before the queue: a push after this point wakes us again
        #[cfg(unix)]
        {
            use std::io::Read;
            let mut buf = [0u8; 512];
            while let Ok(n) = (&self.0.wake_rx).read(&mut buf) {
                if n < buf.len() {
                    break;
                }
            }
        }
        let batch = std::mem::take(&mut *self.0.lock());
        for d in batch {
            resolve(py, d);
        }
    }
}

struct Entry {
    /// `shardlimit::fork_generation()` when registered: another value means a forked child
    generation: u64,
    event_loop: Py<PyAny>,
    shared: Arc<Shared>,
}

/// A limiter's completion queues, one per event loop (and process) that used it.
#[derive(Default)]
pub struct Completers {
    entries: Mutex<Vec<Entry>>,
}

static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

impl Completers {
    /// Runs `fut` on the limiter's runtime and returns an asyncio future of its result,
    /// converted by `convert` on the loop thread. Must be called with a running loop.
    pub fn spawn<'py, T, F, C>(
        &self,
        py: Python<'py>,
        limiter: &shardlimit::Limiter,
        fut: F,
        convert: C,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        T: Send + 'static,
        F: Future<Output = shardlimit::Result<T>> + Send + 'static,
        C: FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
    {
        let ev = GET_RUNNING_LOOP
            .import(py, "asyncio", "get_running_loop")?
            .call0()?;
        let pyfut = ev.call_method0(intern!(py, "create_future"))?;
        let Some(spawner) = limiter.spawner().map_err(core_err)? else {
            // the in-memory engine never waits: answer now
            let r = limiter.block_on(fut);
            resolve(
                py,
                Done {
                    fut: pyfut.clone().unbind(),
                    settle: settle(r, convert),
                },
            );
            return Ok(pyfut);
        };
        let shared = self.for_loop(py, &ev)?;
        let target = pyfut.clone().unbind();
        spawner.spawn(async move {
            let r = fut.await;
            shared.push(Done {
                fut: target,
                settle: settle(r, convert),
            });
        });
        Ok(pyfut)
    }

    /// A coroutine that, when first awaited, runs `fut` as [`Completers::spawn`] does. The
    /// asyncio future is made only then, on the loop that awaits it, so that
    /// `asyncio.run(limiter.acheck(...))` works: the call itself needs no running loop.
    /// The coroutine is a [`Call`]: one object per call, where a Python coroutine wrapping
    /// a started call would cost a closure, a coroutine and its frame more.
    pub fn coroutine<'py, T, F, C>(
        self: &Arc<Self>,
        py: Python<'py>,
        limiter: &shardlimit::Limiter,
        fut: F,
        convert: C,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        T: Send + 'static,
        F: Future<Output = shardlimit::Result<T>> + Send + 'static,
        C: FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
    {
        let me = self.clone();
        let limiter = limiter.clone();
        let start: Start =
            Box::new(move |py| me.spawn(py, &limiter, fut, convert).map(Bound::unbind));
        Ok(Bound::new(
            py,
            Call {
                state: Mutex::new(CallState::New(start)),
            },
        )?
        .into_any())
    }

    /// The coroutine of a call that `start` starts when first awaited (the host
    /// transport's checks, `host.rs`): a [`Call`], as [`Completers::coroutine`] makes.
    pub(crate) fn call<'py>(py: Python<'py>, start: Start) -> PyResult<Bound<'py, PyAny>> {
        Ok(Bound::new(
            py,
            Call {
                state: Mutex::new(CallState::New(start)),
            },
        )?
        .into_any())
    }

    fn for_loop(&self, py: Python<'_>, ev: &Bound<'_, PyAny>) -> PyResult<Arc<Shared>> {
        // (not the pid: getpid is a system call, and this runs on every async call)
        let generation = shardlimit::fork_generation();
        {
            let entries = self
                .entries
                .lock_py_attached(py)
                .unwrap_or_else(|e| e.into_inner());
            if let Some(e) = entries
                .iter()
                .find(|e| e.generation == generation && e.event_loop.is(ev))
            {
                return Ok(e.shared.clone());
            }
        }
        // first call on this loop (or in this forked child): register a new queue
        let shared = Arc::new(Shared::new()?);
        let completer = Bound::new(py, Completer(shared.clone()))?;
        let drain = completer.getattr("_drain")?;
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            ev.call_method1("add_reader", (shared.wake_rx.as_raw_fd(), drain))?;
        }
        #[cfg(not(unix))]
        {
            let _ = shared.wake.set((ev.clone().unbind(), drain.unbind()));
        }
        // forget the queues of closed loops and of the parent process. lock_py_attached
        // lets other threads take the GIL while this one waits, so Python may run under it
        let mut entries = self
            .entries
            .lock_py_attached(py)
            .unwrap_or_else(|e| e.into_inner());
        entries.retain(|e| {
            e.generation == generation
                && !e
                    .event_loop
                    .bind(py)
                    .call_method0("is_closed")
                    .and_then(|x| x.is_truthy())
                    .unwrap_or(true)
        });
        entries.push(Entry {
            generation,
            event_loop: ev.clone().unbind(),
            shared: shared.clone(),
        });
        Ok(shared)
    }
}

/// Starts a call on the running loop: its asyncio future.
pub(crate) type Start = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

enum CallState {
    /// not awaited yet
    New(Start),
    /// started: the iterator of its asyncio future (`send`/`throw` go to it)
    Started(Py<PyAny>),
    /// awaited through `__await__` (the iterator is the interpreter's), or closed
    Gone,
}

/// The coroutine of an async call (`limiter.acheck(...)`): awaiting it starts the call on
/// the running loop and waits for its asyncio future. It has `__await__` (what `await`
/// uses) and `send`/`throw`/`close` (what a Task and `asyncio.run` use), so
/// `asyncio.iscoroutine` holds for it. Awaited once.
#[pyclass(frozen, module = "shardlimit._shardlimit", name = "Call")]
pub struct Call {
    state: Mutex<CallState>,
}

impl Call {
    fn take_start(&self, py: Python<'_>) -> PyResult<Start> {
        let mut st = self
            .state
            .lock_py_attached(py)
            .unwrap_or_else(|e| e.into_inner());
        match std::mem::replace(&mut *st, CallState::Gone) {
            CallState::New(start) => Ok(start),
            other => {
                *st = other;
                Err(pyo3::exceptions::PyRuntimeError::new_err(
                    "this call was awaited already",
                ))
            }
        }
    }

    /// The future's iterator, starting the call on the first `send`.
    fn iter<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        {
            let st = self
                .state
                .lock_py_attached(py)
                .unwrap_or_else(|e| e.into_inner());
            if let CallState::Started(it) = &*st {
                return Ok(it.bind(py).clone());
            }
        }
        let start = self.take_start(py)?;
        let it = await_future(start(py)?.bind(py))?;
        *self
            .state
            .lock_py_attached(py)
            .unwrap_or_else(|e| e.into_inner()) = CallState::Started(it.clone().unbind());
        Ok(it)
    }
}

#[pymethods]
impl Call {
    fn __await__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let start = self.take_start(py)?;
        await_future(start(py)?.bind(py))
    }

    fn send<'py>(&self, py: Python<'py>, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.iter(py)?.call_method1(intern!(py, "send"), (value,))
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.iter(py)?
            .call_method1(intern!(py, "send"), (py.None(),))
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (typ, val = None, tb = None))]
    fn throw<'py>(
        &self,
        py: Python<'py>,
        typ: &Bound<'py, PyAny>,
        val: Option<&Bound<'py, PyAny>>,
        tb: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let started = {
            let mut st = self
                .state
                .lock_py_attached(py)
                .unwrap_or_else(|e| e.into_inner());
            match &*st {
                CallState::Started(it) => Some(it.bind(py).clone()),
                _ => {
                    // never started: nothing to cancel, the exception goes back to the caller
                    *st = CallState::Gone;
                    None
                }
            }
        };
        match started {
            Some(it) => it.call_method1(intern!(py, "throw"), (typ, val, tb)),
            None => {
                let exc = match val {
                    Some(v) if !v.is_none() => v.clone(),
                    _ if typ.is_instance_of::<pyo3::types::PyType>() => typ.call0()?,
                    _ => typ.clone(),
                };
                Err(PyErr::from_value(exc))
            }
        }
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let st = std::mem::replace(
            &mut *self
                .state
                .lock_py_attached(py)
                .unwrap_or_else(|e| e.into_inner()),
            CallState::Gone,
        );
        if let CallState::Started(it) = st {
            // a started call's future is cancelled (the core's call finishes unobserved)
            it.bind(py).call_method0(intern!(py, "close"))?;
        }
        Ok(())
    }
}
