//! The host transport (`transport="host"`): the core's sans-I/O check path
//! (`shardlimit::HostChecks`) with the bytes moved by `shardlimit/_host.py` on the asyncio
//! loop itself, one `asyncio.Protocol` per shard. A check's future is made here and
//! resolved here, on the loop thread, by the call that hands in the bytes of its reply
//! (`data_received`): no I/O thread, no wake-up socket, no thread hop per decision.
//!
//! Only `acheck` of one policy goes this way; what the core's host path does not take
//! (multi-limit, shadow, local admission, overrides, a reshard handoff) comes back as
//! `HostStep::Delegate` and runs on the limiter's own path, as does a call from another
//! event loop than the one the transport started on.

use crate::completion::resolve_future;
use crate::convert::{core_err, decision_obj};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::{MutexExt, PyOnceLock};
use pyo3::types::PyBytes;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// The state machines of one limiter's shards on one event loop; `_host.py` owns the
/// sockets and hands their transports in (`attach`).
#[pyclass(module = "shardlimit._shardlimit", name = "_HostChecks")]
pub struct HostChecks {
    inner: shardlimit::HostChecks,
    event_loop: Py<PyAny>,
    /// the loop's `create_future`, bound once (a method looked up on every check costs a
    /// lookup and a bound-method object under the abi3 build)
    create_future: Py<PyAny>,
    /// the future of each check in flight, by id
    waiting: HashMap<u64, Py<PyAny>>,
    /// each shard's open asyncio transport
    transports: Vec<Option<Py<PyAny>>>,
    /// the driver's `_flush`: scheduled with `call_soon` once per burst of checks
    flush: Option<Py<PyAny>>,
    /// the driver's `_connect_now`: called with a shard a check found down with its
    /// circuit closed (the check waits for that connect, not for the back-off)
    connect_now: Option<Py<PyAny>>,
    /// shards whose `connect_now` is scheduled (until the driver's `connecting`)
    connect_asked: Vec<bool>,
    flush_scheduled: bool,
    /// checks queued since the last write
    unsent: usize,
}

/// Checks queued in one loop iteration before they are written at once, without waiting
/// for the iteration's end (as Node's host transport): Redis starts on them while the loop
/// goes on with the tasks that follow, so several batches are in flight per connection
/// instead of one batch answered, then the next sent.
const PIPELINE_CHUNK: usize = 16;

/// Resolves `fut` with the decision `r` (unless it was cancelled meanwhile).
fn resolve(py: Python<'_>, fut: &Bound<'_, PyAny>, r: shardlimit::Result<shardlimit::Decision>) {
    resolve_future(
        py,
        fut,
        r.map_err(core_err).and_then(|d| decision_obj(py, d)),
    );
}

fn secs(d: Option<Instant>) -> Option<f64> {
    d.map(|d| d.saturating_duration_since(Instant::now()).as_secs_f64())
}

impl HostChecks {
    fn settle(
        &mut self,
        py: Python<'_>,
        done: Vec<(u64, shardlimit::Result<shardlimit::Decision>)>,
    ) {
        for (id, r) in done {
            if let Some(fut) = self.waiting.remove(&id) {
                resolve(py, fut.bind(py), r);
            }
        }
    }

    fn shard(&self, shard: usize) -> PyResult<usize> {
        if shard < self.transports.len() {
            Ok(shard)
        } else {
            self.inner.address(shard).map_err(core_err)?;
            Ok(shard)
        }
    }

    /// Writes what shard `shard` has to send, if its socket is open.
    fn transmit(&mut self, py: Python<'_>, shard: usize) -> PyResult<()> {
        if let Some(t) = &self.transports[shard] {
            if let Some(bytes) = self.inner.poll_transmit(shard) {
                t.bind(py)
                    .call_method1(intern!(py, "write"), (PyBytes::new(py, &bytes),))?;
            }
        }
        Ok(())
    }

    /// A check of `policy`: its asyncio future, or None when the check needs the
    /// limiter's own path.
    pub(crate) fn check(
        &mut self,
        py: Python<'_>,
        key: &str,
        policy: &shardlimit::Policy,
        cost: u64,
    ) -> PyResult<Option<Py<PyAny>>> {
        let step = self.inner.check(key, policy, cost);
        if let Ok(shardlimit::HostStep::Delegate) = step {
            return Ok(None);
        }
        let fut = self.create_future.bind(py).call0()?;
        match step {
            Ok(shardlimit::HostStep::Pending { id, shard }) => {
                self.waiting.insert(id, fut.clone().unbind());
                if self.inner.wants_connect(shard) && !self.connect_asked[shard] {
                    if let Some(c) = &self.connect_now {
                        self.connect_asked[shard] = true;
                        // (not called here: it calls back into this object)
                        self.event_loop
                            .bind(py)
                            .call_method1(intern!(py, "call_soon"), (c, shard))?;
                    }
                }
                self.unsent += 1;
                if self.unsent >= PIPELINE_CHUNK {
                    // (the flush already scheduled writes the rest)
                    self.unsent = 0;
                    for shard in 0..self.transports.len() {
                        self.transmit(py, shard)?;
                    }
                } else if !self.flush_scheduled {
                    if let Some(f) = &self.flush {
                        // the rest of this loop iteration's checks go out in one write
                        self.event_loop
                            .bind(py)
                            .call_method1(intern!(py, "call_soon"), (f,))?;
                        self.flush_scheduled = true;
                    }
                }
            }
            Ok(shardlimit::HostStep::Decided(d)) => resolve(py, &fut, Ok(d)),
            Ok(shardlimit::HostStep::Delegate) => unreachable!("returned above"),
            Err(e) => resolve(py, &fut, Err(e)),
        }
        Ok(Some(fut.unbind()))
    }
}

#[pymethods]
impl HostChecks {
    /// The host transport of `limiter` on `event_loop`: a ConfigError unless every shard
    /// is a standalone Redis over plain TCP.
    #[new]
    fn new(
        py: Python<'_>,
        limiter: &crate::Limiter,
        event_loop: Py<PyAny>,
    ) -> PyResult<HostChecks> {
        let inner = shardlimit::HostChecks::new(&limiter.inner()?).map_err(core_err)?;
        let n = inner.shard_count();
        let create_future = event_loop.getattr(py, intern!(py, "create_future"))?;
        Ok(HostChecks {
            inner,
            event_loop,
            create_future,
            waiting: HashMap::new(),
            transports: (0..n).map(|_| None).collect(),
            flush: None,
            connect_now: None,
            connect_asked: vec![false; n],
            flush_scheduled: false,
            unsent: 0,
        })
    }

    /// The driver's flush callback (scheduled once per burst of checks) and its
    /// connect-now callback (a check found a shard down with its circuit closed).
    fn _bind(&mut self, flush: Py<PyAny>, connect_now: Py<PyAny>) {
        self.flush = Some(flush);
        self.connect_now = Some(connect_now);
    }

    #[getter]
    fn shard_count(&self) -> usize {
        self.inner.shard_count()
    }

    /// The config's `timeout` in seconds (how long a connect and log-in may take).
    #[getter]
    fn timeout(&self) -> f64 {
        self.inner.timeout().as_secs_f64()
    }

    /// How many checks wait for their reply.
    #[getter]
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    /// Where shard `shard` listens: (host, port).
    fn address(&self, shard: usize) -> PyResult<(String, u16)> {
        self.inner.address(shard).map_err(core_err)
    }

    /// Shard `shard`'s socket starts to connect.
    fn connecting(&mut self, shard: usize) -> PyResult<()> {
        let shard = self.shard(shard)?;
        self.connect_asked[shard] = false;
        self.inner.connecting(shard).map_err(core_err)
    }

    /// Shard `shard`'s socket is open: its asyncio transport.
    fn attach(&mut self, shard: usize, transport: Py<PyAny>) -> PyResult<()> {
        let shard = self.shard(shard)?;
        self.inner.connected(shard).map_err(core_err)?;
        self.transports[shard] = Some(transport);
        Ok(())
    }

    /// Writes what every open socket has to send; the seconds until the next deadline
    /// (None when nothing waits).
    fn flush(&mut self, py: Python<'_>) -> PyResult<Option<f64>> {
        self.flush_scheduled = false;
        self.unsent = 0;
        for shard in 0..self.transports.len() {
            self.transmit(py, shard)?;
        }
        Ok(secs(self.inner.next_deadline()))
    }

    /// Bytes read from shard `shard`: resolves the checks they answer (a NOSCRIPT check
    /// goes out again at once). True when the socket must be closed (bytes that could not
    /// be trusted: every check on it failed).
    fn on_data(&mut self, py: Python<'_>, shard: usize, data: &[u8]) -> PyResult<bool> {
        let shard = self.shard(shard)?;
        let done = self.inner.handle_input(shard, data);
        self.settle(py, done);
        if self.inner.is_down(shard) {
            return Ok(true);
        }
        self.transmit(py, shard)?;
        Ok(false)
    }

    /// Shard `shard`'s socket closed, failed or was dropped (`why`): its checks fail (and
    /// follow their policies' `on_error`).
    fn detach(&mut self, py: Python<'_>, shard: usize, why: &str) -> PyResult<()> {
        let shard = self.shard(shard)?;
        self.transports[shard] = None;
        let done = self.inner.handle_closed(shard, why);
        self.settle(py, done);
        Ok(())
    }

    /// True when shard `shard`'s connection is closed or must be.
    fn is_down(&self, shard: usize) -> bool {
        self.inner.is_down(shard)
    }

    /// Fails the checks (and connects) whose deadline passed; the seconds until the next
    /// deadline, or None.
    fn on_timer(&mut self, py: Python<'_>) -> Option<f64> {
        let done = self.inner.handle_timeout(Instant::now());
        self.settle(py, done);
        secs(self.inner.next_deadline())
    }

    /// The seconds until the next deadline (0 when due), or None when nothing waits.
    fn next_deadline(&self) -> Option<f64> {
        secs(self.inner.next_deadline())
    }

    /// Every check in flight fails with the limiter closed (following `on_error`).
    fn close(&mut self, py: Python<'_>) {
        self.flush = None;
        self.connect_now = None;
        for shard in 0..self.transports.len() {
            self.transports[shard] = None;
            let done = self.inner.handle_closed(shard, "the limiter was closed");
            self.settle(py, done);
        }
    }
}

/// A limiter's host transport, on the loop (and in the process) it started on.
struct OnLoop {
    generation: u64,
    event_loop: Py<PyAny>,
    native: Py<HostChecks>,
    driver: Py<PyAny>,
    /// the loop keeps the thread running it in `_thread_id` (asyncio's own loops; not
    /// uvloop's): then a check asks that, not `get_running_loop()`
    has_thread_id: bool,
}

impl OnLoop {
    /// True when this loop is running on the calling thread, in this process: it is the
    /// running loop (a thread runs one loop at a time, and `run_forever` sets
    /// `_thread_id` to its thread for as long as it runs and clears it when it returns).
    /// CPython 3.11's `get_running_loop()` makes a `getpid` system call on every call to
    /// tell a forked child from its parent; the fork generation tells it here.
    fn runs_here(&self, py: Python<'_>, generation: u64) -> bool {
        if !self.has_thread_id || self.generation != generation {
            return false;
        }
        let Ok(tid) = self.event_loop.bind(py).getattr(intern!(py, "_thread_id")) else {
            return false;
        };
        if tid.is_none() {
            return false;
        }
        GET_IDENT
            .import(py, "_thread", "get_ident")
            .and_then(|f| f.call0())
            .and_then(|me| me.eq(&tid))
            .unwrap_or(false)
    }
}

/// The host transport of a limiter made with `transport="host"`: started on the first
/// `acheck` awaited on a running loop.
#[derive(Default)]
pub struct Slot(Mutex<Option<OnLoop>>);

static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static GET_IDENT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn loop_closed(ev: &Bound<'_, PyAny>) -> bool {
    ev.call_method0("is_closed")
        .and_then(|x| x.is_truthy())
        .unwrap_or(true)
}

impl Slot {
    /// The transport of the running loop, started if this is its first check; None when
    /// another loop (still open) has it: that call takes the limiter's own path.
    pub(crate) fn native(
        &self,
        py: Python<'_>,
        limiter: &crate::Limiter,
    ) -> PyResult<Option<Py<HostChecks>>> {
        let generation = shardlimit::fork_generation();
        if let Some(o) = &*self
            .0
            .lock_py_attached(py)
            .unwrap_or_else(|e| e.into_inner())
        {
            if o.runs_here(py, generation) {
                return Ok(Some(o.native.clone_ref(py)));
            }
        }
        let ev = GET_RUNNING_LOOP
            .import(py, "asyncio", "get_running_loop")?
            .call0()?;
        let mut slot = self
            .0
            .lock_py_attached(py)
            .unwrap_or_else(|e| e.into_inner());
        if let Some(o) = &*slot {
            if o.generation == generation && o.event_loop.is(&ev) {
                return Ok(Some(o.native.clone_ref(py)));
            }
            if o.generation == generation && !loop_closed(o.event_loop.bind(py)) {
                return Ok(None);
            }
            // a closed loop's transport, or the parent process's: this loop starts its own
            if o.generation == generation {
                if let Err(e) = o.driver.bind(py).call_method0(intern!(py, "abandon")) {
                    e.write_unraisable(py, Some(o.driver.bind(py)));
                }
            }
        }
        let native = Py::new(py, HostChecks::new(py, limiter, ev.clone().unbind())?)?;
        let driver = py
            .import(intern!(py, "shardlimit._host"))?
            .getattr(intern!(py, "HostTransport"))?
            .call1((native.clone_ref(py), &ev))?;
        let has_thread_id = ev.hasattr(intern!(py, "_thread_id")).unwrap_or(false);
        *slot = Some(OnLoop {
            generation,
            event_loop: ev.unbind(),
            native: native.clone_ref(py),
            driver: driver.unbind(),
            has_thread_id,
        });
        Ok(Some(native))
    }

    /// Closes the transport: on its loop now when that is the running one, else through
    /// `call_soon_threadsafe` (a closed loop's sockets are closed at once: `abandon`).
    pub(crate) fn close(&self, py: Python<'_>) {
        let Some(o) = self
            .0
            .lock_py_attached(py)
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        if o.generation != shardlimit::fork_generation() {
            return; // the parent's sockets: the parent closes them
        }
        let ev = o.event_loop.bind(py);
        let running = GET_RUNNING_LOOP
            .import(py, "asyncio", "get_running_loop")
            .and_then(|f| f.call0())
            .is_ok_and(|r| r.is(ev));
        let driver = o.driver.bind(py);
        let r = if running {
            driver.call_method0(intern!(py, "close")).map(drop)
        } else if !loop_closed(ev) {
            driver
                .getattr(intern!(py, "close"))
                .and_then(|c| ev.call_method1("call_soon_threadsafe", (c,)))
                .map(drop)
        } else {
            driver.call_method0(intern!(py, "abandon")).map(drop)
        };
        if let Err(e) = r {
            e.write_unraisable(py, Some(ev));
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let has = self.0.get_mut().map(|o| o.is_some()).unwrap_or(false);
        if has {
            Python::attach(|py| self.close(py));
        }
    }
}

/// `limiter.acheck(key, policy, cost)` of one policy on a limiter with the host
/// transport: a coroutine that, when awaited, checks on the running loop's transport, or
/// on the limiter's own path when the core delegates (or another loop has the transport).
pub(crate) fn acheck<'py>(
    limiter: &Bound<'py, crate::Limiter>,
    key: String,
    mut policies: Vec<shardlimit::Policy>,
    cost: u64,
) -> PyResult<Bound<'py, PyAny>> {
    let py = limiter.py();
    let me = limiter.clone().unbind();
    let policy = policies.pop().expect("one policy");
    // a call made before `close` holds the limiter and finishes, as on the I/O thread's
    // path: awaited after it, it takes that path with the limiter it was made on
    let core = limiter.get().inner()?;
    crate::completion::Completers::call(
        py,
        Box::new(move |py| {
            let l = me.get();
            let closed = l.cell.read().unwrap_or_else(|e| e.into_inner()).is_none();
            if let (Some(slot), false) = (&l.host, closed) {
                if let Some(native) = slot.native(py, l)? {
                    if let Some(fut) = native.borrow_mut(py).check(py, &key, &policy, cost)? {
                        return Ok(fut);
                    }
                }
            }
            let spawned = core.clone();
            l.completers()
                .spawn(
                    py,
                    &core,
                    async move { spawned.check(&key, &policy, cost).await },
                    decision_obj,
                )
                .map(Bound::unbind)
        }),
    )
}
