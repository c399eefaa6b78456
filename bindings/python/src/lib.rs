//! `shardlimit._shardlimit`: the Python skin over the shardlimit core.
//!
//! Everything here converts types and errors; the logic lives in the core. Sync calls
//! release the GIL while they wait on Redis. Async calls are spawned on the limiter's own
//! Tokio runtime ([`shardlimit::Limiter::spawner`]) and resolve an asyncio future
//! through [`completion`]: the I/O thread never takes the GIL.

mod admin;
mod block;
mod calls;
mod check;
mod clock;
mod completion;
mod convert;
mod decision;
mod delivery;
mod events;
mod host;
mod ip;
mod lease;
mod limiter;
mod logging;
mod overrides;
mod policy;
mod settle;
mod shadow;

use convert::{
    as_invalid_argument, core_err, cost_arg, count_arg, decision_obj, json_to_py, layers_arg,
    lease_pair, rate_limit_exceeded, resolve_policies, resolve_policy, ttl_arg,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use shardlimit::{Error as CoreError, ErrorKind, Limit as CoreLimit, OnError};
use std::sync::{Arc, Mutex};

use admin::*;
use block::*;
use check::*;
use clock::*;
use decision::*;
use ip::*;
use lease::*;
use limiter::*;
use policy::*;

/// Every core error kind as (code, name), in code order: the exception table is tested
/// against it.
fn error_kinds(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    PyList::new(py, ErrorKind::ALL.iter().map(|k| (k.code(), k.name())))
}

#[pymodule]
fn _shardlimit(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", shardlimit::VERSION)?;
    m.add("ERROR_KINDS", error_kinds(m.py())?)?;
    m.add(
        "BACKEND_ERROR_KINDS",
        ErrorKind::ALL
            .iter()
            .filter(|k| k.is_backend())
            .map(|k| k.name())
            .collect::<Vec<_>>(),
    )?;
    m.add_class::<Decision>()?;
    m.add_class::<Limit>()?;
    m.add_class::<Policy>()?;
    m.add_class::<Lease>()?;
    m.add_class::<settle::Reservation>()?;
    m.add_class::<LeaseContext>()?;
    m.add_class::<ManualClock>()?;
    m.add_class::<BlockInfo>()?;
    m.add_class::<TrustedProxies>()?;
    m.add_function(wrap_pyfunction!(client_ip, m)?)?;
    m.add_function(wrap_pyfunction!(ip_key, m)?)?;
    m.add_function(wrap_pyfunction!(parse_rate, m)?)?;
    m.add_class::<ConfigWatcher>()?;
    m.add_class::<Limiter>()?;
    m.add_class::<host::HostChecks>()?;
    delivery::register(m)?;
    Ok(())
}

// The system allocator, not mimalloc: mimalloc takes the thread that first loads it for the
// process's main thread and gives it a static heap, which it tears down when that thread
// exits; glibc then reuses the thread's descriptor for the next thread, which mimalloc takes
// for the main thread again and hands the dead heap (a segfault on the first allocation).
// Importing shardlimit on a thread that exits, then using it from another, did exactly
// that (tests/test_threads.py).
