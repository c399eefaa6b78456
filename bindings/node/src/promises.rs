//! Settling Promises from the core's Tokio runtime, in batches.
//!
//! Each environment (the main thread, each worker) owns one threadsafe function. A finished
//! call pushes a settle job onto the environment's queue and, only when the queue was
//! empty, schedules one drain on the JS thread; the drain settles every queued Promise.
//! Under load one wake-up of the event loop settles many Promises, and no threadsafe
//! function is created per call (napi's `JsDeferred` creates one for every Promise).
//!
//! The threadsafe function is referenced (keeps the loop alive) only while Promises are
//! pending, and is aborted by an env cleanup hook, under the queue's lock, before Node
//! frees it: a call that finishes after its worker exited drops its job instead of touching
//! a dead environment.

use napi::bindgen_prelude::*;
use napi::sys;
use parking_lot::Mutex;
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::Arc;

/// Runs on the JS thread with its env; settles one Promise.
pub type Job = Box<dyn FnOnce(sys::napi_env) + Send>;

struct Queue {
    tsfn: Option<TsfnPtr>,
    jobs: Vec<Job>,
    scheduled: bool,
}

#[derive(Clone, Copy)]
struct TsfnPtr(sys::napi_threadsafe_function);
// SAFETY: a threadsafe function may be called from any thread; that is its purpose. It is
// only touched under the queue's lock, and removed from it before it is released.
unsafe impl Send for TsfnPtr {}

pub struct Shared {
    queue: Mutex<Queue>,
}

/// The per-environment half, used on the JS thread only.
pub struct Settler {
    shared: Arc<Shared>,
    pending: Cell<usize>,
}

/// A raw napi deferred: settled exactly once, on its env's JS thread.
pub struct Deferred(sys::napi_deferred);
// SAFETY: the pointer is only carried across threads; it is used on the JS thread only.
unsafe impl Send for Deferred {}

impl Settler {
    pub fn new(env: &Env) -> Result<Settler> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                tsfn: None,
                jobs: Vec::new(),
                scheduled: false,
            }),
        });
        let raw_env = env.raw();
        let mut name = std::ptr::null_mut();
        let mut tsfn = std::ptr::null_mut();
        // SAFETY: napi calls on the JS thread with its env; `context` is a leaked Arc that
        // the finalizer reclaims.
        unsafe {
            check_status!(sys::napi_create_string_utf8(
                raw_env,
                c"shardlimit.settle".as_ptr(),
                17,
                &mut name
            ))?;
            let context = Arc::into_raw(shared.clone()) as *mut c_void;
            check_status!(sys::napi_create_threadsafe_function(
                raw_env,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                name,
                0,
                1,
                context,
                Some(finalize),
                context,
                Some(drain),
                &mut tsfn,
            ))?;
            // idle until a Promise is pending
            check_status!(sys::napi_unref_threadsafe_function(raw_env, tsfn))?;
            shared.queue.lock().tsfn = Some(TsfnPtr(tsfn));
            let hook = Arc::into_raw(shared.clone()) as *mut c_void;
            check_status!(sys::napi_add_env_cleanup_hook(
                raw_env,
                Some(teardown),
                hook
            ))?;
        }
        Ok(Settler {
            shared,
            pending: Cell::new(0),
        })
    }

    /// A new pending Promise: `(deferred, promise)`. Call on the JS thread.
    pub fn create(&self, env: &Env) -> Result<(Deferred, sys::napi_value)> {
        let mut deferred = std::ptr::null_mut();
        let mut promise = std::ptr::null_mut();
        // SAFETY: JS thread, its env.
        unsafe {
            check_status!(sys::napi_create_promise(
                env.raw(),
                &mut deferred,
                &mut promise
            ))?;
        }
        let n = self.pending.get() + 1;
        self.pending.set(n);
        if n == 1 {
            if let Some(t) = self.shared.queue.lock().tsfn {
                // SAFETY: JS thread; the tsfn is alive while it is in the queue.
                unsafe { sys::napi_ref_threadsafe_function(env.raw(), t.0) };
            }
        }
        Ok((Deferred(deferred), promise))
    }

    /// A handle to queue settle jobs from any thread.
    pub fn sender(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    fn settled(&self, env: sys::napi_env) {
        let n = self.pending.get().saturating_sub(1);
        self.pending.set(n);
        if n == 0 {
            if let Some(t) = self.shared.queue.lock().tsfn {
                // SAFETY: JS thread; the tsfn is alive while it is in the queue.
                unsafe { sys::napi_unref_threadsafe_function(env, t.0) };
            }
        }
    }
}

impl Shared {
    /// Queues `job` to run on the JS thread. Any thread. Dropped when the env is gone.
    pub fn send(&self, job: Job) {
        let mut q = self.queue.lock();
        let Some(tsfn) = q.tsfn else { return };
        q.jobs.push(job);
        if !q.scheduled {
            q.scheduled = true;
            // SAFETY: the tsfn is alive while it is in the queue, and we hold the lock that
            // the teardown hook takes before releasing it.
            unsafe {
                sys::napi_call_threadsafe_function(
                    tsfn.0,
                    std::ptr::null_mut(),
                    sys::ThreadsafeFunctionCallMode::nonblocking,
                )
            };
        }
    }
}

/// Settles `deferred` with the outcome of `settle` (a value or an error).
///
/// # Safety
/// JS thread of `env`; `deferred` not settled before.
pub unsafe fn settle(env: sys::napi_env, deferred: Deferred, value: Result<sys::napi_value>) {
    unsafe {
        match value {
            Ok(v) => {
                sys::napi_resolve_deferred(env, deferred.0, v);
            }
            Err(e) => {
                let err = JsError::from(e).into_value(env);
                sys::napi_reject_deferred(env, deferred.0, err);
            }
        }
    }
}

unsafe extern "C" fn drain(
    env: sys::napi_env,
    _js_callback: sys::napi_value,
    context: *mut c_void,
    _data: *mut c_void,
) {
    // SAFETY: `context` is the Arc leaked in `Settler::new`, alive until `finalize`.
    let shared = unsafe { &*(context as *const Shared) };
    let jobs = {
        let mut q = shared.queue.lock();
        q.scheduled = false;
        std::mem::take(&mut q.jobs)
    };
    if env.is_null() {
        return; // tearing down: the Promises are gone with the environment
    }
    let settler = crate::env_data(&Env::from_raw(env)).and_then(|d| d.settler.as_ref());
    for job in jobs {
        job(env);
        if let Some(s) = settler {
            s.settled(env);
        }
    }
}

unsafe extern "C" fn teardown(hook: *mut c_void) {
    // SAFETY: the Arc leaked for this hook in `Settler::new`.
    let shared = unsafe { Arc::from_raw(hook as *const Shared) };
    let mut q = shared.queue.lock();
    if let Some(t) = q.tsfn.take() {
        // SAFETY: released once, under the lock every caller takes.
        unsafe {
            sys::napi_release_threadsafe_function(t.0, sys::ThreadsafeFunctionReleaseMode::abort)
        };
    }
    q.jobs.clear();
}

unsafe extern "C" fn finalize(_env: sys::napi_env, data: *mut c_void, _hint: *mut c_void) {
    // SAFETY: the Arc leaked as the tsfn's context in `Settler::new`.
    drop(unsafe { Arc::from_raw(data as *const Shared) });
}
