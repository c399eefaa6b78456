//! The JVM binding of shardlimit: the JNI library behind the `io.shardlimit` jar.
//!
//! A thin skin over the core: it converts types and errors only. Every native method is a
//! static method of `io.shardlimit.Native`; the Java classes hold the public API.
//!
//! Async calls never block a Java thread inside JNI: a native method only *starts* the
//! core's future on the limiter's I/O runtime (`Limiter::spawner`) and returns. When the
//! future is done, the I/O thread (attached to the JVM as a daemon) converts the result
//! and calls `Native.deliver`, which hands the completion of the caller's
//! `CompletableFuture` to a Java executor: no user callback runs on the I/O thread. On
//! the in-memory engine a call never waits, so it runs to completion at once on the
//! calling thread and its future is returned already complete.
//!
//! Errors: a core error becomes the exception class of its `ErrorKind` (built by
//! `Native.error(code, message)`). Panics are caught at every entry point (and around
//! every future) and become `internal` errors: nothing unwinds into the JVM.
//!
//! Keys and policy names arrive as UTF-8 `byte[]` (the cheapest way through JNI); bytes
//! that are not UTF-8 are an `invalid_argument` error naming the argument.

// the core's check futures nest deeply (layers, fallback, handoff)
#![recursion_limit = "256"]

use jni::objects::{
    GlobalRef, JByteArray, JClass, JLongArray, JObject, JObjectArray, JString, JValue,
};
use jni::sys::{jboolean, jdouble, jint, jlong, jobject, jstring, JNI_ERR, JNI_VERSION_1_8};
use jni::{JNIEnv, JavaVM};
use serde_json::{json, Value};
use shardlimit::{Decision, Limiter, Source};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

/// What `JNI_OnLoad` caches: the VM (to attach the I/O threads) and the classes the
/// library calls, found with the class loader that loaded the jar (a thread attached
/// from Rust would only see the system class loader).
struct Globals {
    vm: JavaVM,
    native: GlobalRef,
    decision: GlobalRef,
    string: GlobalRef,
    object: GlobalRef,
}

static GLOBALS: OnceLock<Globals> = OnceLock::new();

const DELIVER_SIG: &str = "(Lio/shardlimit/Call;Ljava/lang/Object;ILjava/lang/String;Z)V";
const DECISION_SIG: &str = "(ZJJJJJLjava/lang/String;IIIZI[JJ)V";

/// # Safety
/// Called by the JVM with its own `JavaVM` pointer when `System.load` loads the library.
#[no_mangle]
pub unsafe extern "system" fn JNI_OnLoad(vm: *mut jni::sys::JavaVM, _: *mut u8) -> jint {
    let r = catch_unwind(AssertUnwindSafe(|| -> jni::errors::Result<()> {
        let vm = JavaVM::from_raw(vm)?;
        let mut env = vm.get_env()?;
        let mut class = |name: &str| -> jni::errors::Result<GlobalRef> {
            let c = env.find_class(name)?;
            env.new_global_ref(c)
        };
        let native = class("io/shardlimit/Native")?;
        let decision = class("io/shardlimit/Decision")?;
        let string = class("java/lang/String")?;
        let object = class("java/lang/Object")?;
        let _ = GLOBALS.set(Globals {
            vm,
            native,
            decision,
            string,
            object,
        });
        Ok(())
    }));
    match r {
        Ok(Ok(())) => JNI_VERSION_1_8,
        _ => JNI_ERR,
    }
}

fn globals() -> Result<&'static Globals, Fail> {
    GLOBALS.get().ok_or_else(|| {
        Fail::Core(internal(
            "the library was not loaded by io.shardlimit.Native",
        ))
    })
}

fn class(g: &GlobalRef) -> &JClass<'static> {
    <&JClass>::from(g.as_obj())
}

// ----- errors ------------------------------------------------------------------------

/// Why a native method failed: a core error (thrown as its exception class), or a JNI
/// failure (a Java exception is then usually pending already).
enum Fail {
    Core(shardlimit::Error),
    Jni(jni::errors::Error),
}

impl From<shardlimit::Error> for Fail {
    fn from(e: shardlimit::Error) -> Self {
        Fail::Core(e)
    }
}

impl From<jni::errors::Error> for Fail {
    fn from(e: jni::errors::Error) -> Self {
        Fail::Jni(e)
    }
}

fn internal(message: impl Into<String>) -> shardlimit::Error {
    shardlimit::Error::Internal(message.into())
}

fn invalid(what: &str, message: &str) -> shardlimit::Error {
    shardlimit::Error::InvalidArgument {
        what: what.to_string(),
        message: message.to_string(),
    }
}

fn panic_error(payload: Box<dyn std::any::Any + Send>) -> shardlimit::Error {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    internal(format!("panic: {what}"))
}

/// The exception object of a core error (`Native.error(code, message)`).
fn exception<'l>(env: &mut JNIEnv<'l>, e: &shardlimit::Error) -> jni::errors::Result<JObject<'l>> {
    let g = match GLOBALS.get() {
        Some(g) => g,
        None => return Err(jni::errors::Error::NullPtr("shardlimit: not loaded")),
    };
    let msg = env.new_string(e.to_string())?;
    env.call_static_method(
        class(&g.native),
        "error",
        "(ILjava/lang/String;)Ljava/lang/RuntimeException;",
        &[JValue::Int(e.kind().code() as jint), JValue::Object(&msg)],
    )?
    .l()
}

/// Leaves the exception of `fail` pending in `env` (unless one is pending already).
fn throw(env: &mut JNIEnv, fail: Fail) {
    if env.exception_check().unwrap_or(true) {
        return;
    }
    let e = match fail {
        Fail::Core(e) => e,
        Fail::Jni(e) => internal(format!("JNI: {e}")),
    };
    match exception(env, &e) {
        Ok(obj) => {
            let _ = env.throw(jni::objects::JThrowable::from(obj));
        }
        Err(_) => {
            if !env.exception_check().unwrap_or(true) {
                let _ = env.throw_new("java/lang/IllegalStateException", e.to_string());
            }
        }
    }
}

/// Runs the body of a native method: a failure or a panic becomes a pending Java
/// exception, and the method returns `default`.
fn run<'l, T>(
    env: &mut JNIEnv<'l>,
    default: T,
    f: impl FnOnce(&mut JNIEnv<'l>) -> Result<T, Fail>,
) -> T {
    match catch_unwind(AssertUnwindSafe(|| f(env))) {
        Ok(Ok(v)) => v,
        Ok(Err(fail)) => {
            throw(env, fail);
            default
        }
        Err(payload) => {
            throw(env, Fail::Core(panic_error(payload)));
            default
        }
    }
}

/// A future that turns a panic while polling into an internal error.
struct CatchUnwind<F>(F);

impl<T, F: Future<Output = shardlimit::Result<T>>> Future for CatchUnwind<F> {
    type Output = shardlimit::Result<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: structural pinning: the inner future is never moved out of `self`.
        let fut = unsafe { self.map_unchecked_mut(|s| &mut s.0) };
        match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(p) => p,
            Err(payload) => Poll::Ready(Err(panic_error(payload))),
        }
    }
}

// ----- arguments ---------------------------------------------------------------------

/// A UTF-8 `byte[]` argument as a string; null or bytes that are not UTF-8 are an
/// `invalid_argument` error naming `what`.
fn text(env: &JNIEnv, bytes: &JByteArray, what: &str) -> Result<String, Fail> {
    if bytes.as_raw().is_null() {
        return Err(invalid(what, "must not be null").into());
    }
    let v = env.convert_byte_array(bytes)?;
    String::from_utf8(v).map_err(|_| invalid(what, "is not valid UTF-8").into())
}

fn opt_text(env: &JNIEnv, bytes: &JByteArray, what: &str) -> Result<Option<String>, Fail> {
    if bytes.as_raw().is_null() {
        Ok(None)
    } else {
        text(env, bytes, what).map(Some)
    }
}

/// A count of units from a Java `long` (negative is invalid).
fn units(what: &str, n: jlong) -> shardlimit::Result<u64> {
    u64::try_from(n).map_err(|_| invalid(what, "must not be negative"))
}

/// A duration in microseconds; negative means none.
fn opt_us(what: &str, us: jlong) -> shardlimit::Result<Option<Duration>> {
    match us {
        -1 => Ok(None),
        n if n >= 0 => Ok(Some(Duration::from_micros(n as u64))),
        _ => Err(invalid(what, "must not be negative")),
    }
}

/// The limiter of a handle (0 once closed: the Java side refuses calls then).
fn limiter<'a>(h: jlong) -> Result<&'a Limiter, Fail> {
    if h == 0 {
        return Err(invalid("limiter", "is closed").into());
    }
    // SAFETY: a handle is a `Box<Limiter>` from `boxed`, freed only by `Native.free`, which
    // the Java side calls under its write lock once no call holds the read lock.
    Ok(unsafe { &*(h as *const Limiter) })
}

fn boxed(l: Limiter) -> jlong {
    Box::into_raw(Box::new(l)) as jlong
}

fn clock(h: jlong) -> Option<Arc<shardlimit::ManualClock>> {
    if h == 0 {
        None
    } else {
        // SAFETY: a clock handle is a `Box<Arc<ManualClock>>` freed by `clockFree` only
        // when the Java clock is unreachable (its Cleaner).
        Some(unsafe { &*(h as *const Arc<shardlimit::ManualClock>) }.clone())
    }
}

fn with_clock(l: Limiter, c: jlong) -> shardlimit::Result<Limiter> {
    match clock(c) {
        Some(c) => l.with_clock(c),
        None => Ok(l),
    }
}

// ----- results -----------------------------------------------------------------------

type Convert<T> = for<'l> fn(&mut JNIEnv<'l>, T) -> jni::errors::Result<JObject<'l>>;

const SOURCES: [Source; 6] = [
    Source::Redis,
    Source::Memory,
    Source::Local,
    Source::Fallback,
    Source::Block,
    Source::LocalFallback,
];

fn us(d: Duration) -> jlong {
    d.as_micros().min(i64::MAX as u128) as jlong
}

fn opt_index(v: Option<u32>) -> jint {
    v.map(|v| v.min(i32::MAX as u32) as jint).unwrap_or(-1)
}

/// A core decision as an `io.shardlimit.Decision`.
fn decision<'l>(env: &mut JNIEnv<'l>, d: Decision) -> jni::errors::Result<JObject<'l>> {
    let g = GLOBALS
        .get()
        .ok_or(jni::errors::Error::NullPtr("shardlimit: not loaded"))?;
    let policy = env.new_string(&*d.policy)?;
    let quotas: JObject = if d.quotas.is_empty() {
        JObject::null()
    } else {
        let flat: Vec<jlong> = d
            .quotas
            .iter()
            .flat_map(|q| [q.limit as jlong, us(q.window)])
            .collect();
        let arr = env.new_long_array(flat.len() as i32)?;
        env.set_long_array_region(&arr, 0, &flat)?;
        arr.into()
    };
    let source = SOURCES.iter().position(|s| *s == d.source).unwrap_or(0) as jint;
    env.new_object(
        class(&g.decision),
        DECISION_SIG,
        &[
            JValue::Bool(d.allowed as jboolean),
            JValue::Long(d.limit.min(i64::MAX as u64) as jlong),
            JValue::Long(d.remaining.min(i64::MAX as u64) as jlong),
            JValue::Long(us(d.reset_after)),
            JValue::Long(d.retry_after.map(us).unwrap_or(-1)),
            JValue::Long(us(d.delay)),
            JValue::Object(&policy),
            JValue::Int(source),
            JValue::Int(opt_index(d.shard)),
            JValue::Int(opt_index(d.layer.map(|l| l as u32))),
            JValue::Bool(d.shadow_denied as jboolean),
            JValue::Int(opt_index(d.limit_index.map(|l| l as u32))),
            JValue::Object(&quotas),
            JValue::Long(us(d.window)),
        ],
    )
}

fn nothing<'l>(_: &mut JNIEnv<'l>, _: ()) -> jni::errors::Result<JObject<'l>> {
    Ok(JObject::null())
}

fn boolean<'l>(env: &mut JNIEnv<'l>, b: bool) -> jni::errors::Result<JObject<'l>> {
    // a String: the Java side reads "true" / "false" (no class lookup on the I/O thread)
    Ok(env.new_string(if b { "true" } else { "false" })?.into())
}

fn json_text<'l>(env: &mut JNIEnv<'l>, v: Value) -> jni::errors::Result<JObject<'l>> {
    Ok(env.new_string(v.to_string())?.into())
}

/// `Object[]{decision, json-or-null}`: acquire's and reserve's results.
fn pair<'l>(
    env: &mut JNIEnv<'l>,
    (d, extra): (Decision, Option<Value>),
) -> jni::errors::Result<JObject<'l>> {
    let g = GLOBALS
        .get()
        .ok_or(jni::errors::Error::NullPtr("shardlimit: not loaded"))?;
    let arr = env.new_object_array(2, class(&g.object), JObject::null())?;
    let d = decision(env, d)?;
    env.set_object_array_element(&arr, 0, d)?;
    if let Some(v) = extra {
        let s = env.new_string(v.to_string())?;
        env.set_object_array_element(&arr, 1, s)?;
    }
    Ok(arr.into())
}

/// Completes the Java `Call` with `result` (`Native.deliver`); `inline`: on the calling
/// thread (the in-memory engine), else on an I/O thread, where the Java side hands the
/// completion to its executor.
fn deliver<T>(
    env: &mut JNIEnv,
    call: &GlobalRef,
    result: shardlimit::Result<T>,
    convert: Convert<T>,
    inline: bool,
) -> Result<(), Fail> {
    let g = globals()?;
    env.with_local_frame(16, |env| -> Result<(), Fail> {
        let converted = match result {
            Ok(v) => match catch_unwind(AssertUnwindSafe(|| convert(env, v))) {
                Ok(Ok(obj)) => Ok(obj),
                Ok(Err(e)) => {
                    let _ = env.exception_clear();
                    Err(internal(format!("could not convert the result: {e}")))
                }
                Err(p) => Err(panic_error(p)),
            },
            Err(e) => Err(e),
        };
        let (value, code, msg) = match converted {
            Ok(obj) => (obj, 0, JObject::null()),
            Err(e) => (
                JObject::null(),
                e.kind().code() as jint,
                JObject::from(env.new_string(e.to_string())?),
            ),
        };
        env.call_static_method(
            class(&g.native),
            "deliver",
            DELIVER_SIG,
            &[
                JValue::Object(call.as_obj()),
                JValue::Object(&value),
                JValue::Int(code),
                JValue::Object(&msg),
                JValue::Bool(inline as jboolean),
            ],
        )?;
        Ok(())
    })
}

/// On an I/O thread: attach it (as a daemon, so it never holds the JVM's exit) and deliver.
fn deliver_attached<T>(call: GlobalRef, result: shardlimit::Result<T>, convert: Convert<T>) {
    let _ = catch_unwind(AssertUnwindSafe(move || {
        let Some(g) = GLOBALS.get() else { return };
        let Ok(mut env) = g.vm.attach_current_thread_as_daemon() else {
            return;
        };
        if deliver(&mut env, &call, result, convert, false).is_err()
            || env.exception_check().unwrap_or(false)
        {
            // nothing on an I/O thread may throw into the JVM: report and go on
            let _ = env.exception_describe();
            let _ = env.exception_clear();
        }
        drop(call);
    }));
}

/// Starts `fut` for the Java `Call` `call` (see the module docs).
fn start<T: Send + 'static>(
    env: &mut JNIEnv,
    l: &Limiter,
    call: &JObject,
    fut: impl Future<Output = shardlimit::Result<T>> + Send + 'static,
    convert: Convert<T>,
) -> Result<(), Fail> {
    let call = env.new_global_ref(call)?;
    match l.spawner()? {
        Some(spawner) => {
            spawner.spawn(async move {
                let result = CatchUnwind(fut).await;
                deliver_attached(call, result, convert);
            });
            Ok(())
        }
        None => {
            let fut = CatchUnwind(fut);
            let result = catch_unwind(AssertUnwindSafe(|| l.block_on(fut)))
                .unwrap_or_else(|p| Err(panic_error(p)));
            deliver(env, &call, result, convert, true)
        }
    }
}

/// A native async method: `$body` evaluates to `(limiter, future, convert)`.
macro_rules! async_call {
    ($env:ident, $call:ident, |$e:ident| $body:block) => {{
        let mut env = $env;
        run(&mut env, (), |$e| {
            let (l, fut, convert) = $body;
            start($e, l, &$call, fut, convert)
        })
    }};
}

// ----- construction ------------------------------------------------------------------

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_memory(
    mut env: JNIEnv,
    _: JClass,
    clock: jlong,
) -> jlong {
    run(&mut env, 0, |_| {
        Ok(boxed(with_clock(Limiter::memory(), clock)?))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_fromJson(
    mut env: JNIEnv,
    _: JClass,
    json: JByteArray,
    clock: jlong,
) -> jlong {
    run(&mut env, 0, |env| {
        let text = text(env, &json, "config")?;
        Ok(boxed(with_clock(Limiter::from_json(&text)?, clock)?))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_fromConfigFile(
    mut env: JNIEnv,
    _: JClass,
    path: JByteArray,
    clock: jlong,
) -> jlong {
    run(&mut env, 0, |env| {
        let path = text(env, &path, "path")?;
        Ok(boxed(with_clock(Limiter::from_config_file(&path)?, clock)?))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_fromEnv(
    mut env: JNIEnv,
    _: JClass,
    clock: jlong,
) -> jlong {
    run(&mut env, 0, |_| {
        Ok(boxed(with_clock(Limiter::from_env()?, clock)?))
    })
}

/// Frees a limiter handle. Its I/O thread is joined when the last reference goes, which
/// may take a deadline: never on the caller's thread.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_free(mut env: JNIEnv, _: JClass, h: jlong) {
    run(&mut env, (), |_| {
        if h != 0 {
            // SAFETY: see `limiter`; the Java side calls this once, after the last use.
            let l = unsafe { Box::from_raw(h as *mut Limiter) };
            std::thread::Builder::new()
                .name("shardlimit-close".into())
                .spawn(move || drop(l))
                .map_err(|e| internal(format!("could not start the closing thread: {e}")))?;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_clockNew(
    mut env: JNIEnv,
    _: JClass,
    start_us: jlong,
) -> jlong {
    run(&mut env, 0, |_| {
        let c = shardlimit::ManualClock::new(units("startUs", start_us)?);
        Ok(Box::into_raw(Box::new(c)) as jlong)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_clockSet(
    mut env: JNIEnv,
    _: JClass,
    c: jlong,
    to_us: jlong,
    advance: jboolean,
) -> jlong {
    run(&mut env, 0, |_| {
        use shardlimit::Clock;
        let c = clock(c).ok_or_else(|| invalid("clock", "is freed"))?;
        if to_us != -1 {
            let n = units("us", to_us)?;
            if advance != 0 {
                c.advance_us(n);
            } else {
                c.set_us(n);
            }
        }
        Ok(c.now_us() as jlong)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_clockFree(_: JNIEnv, _: JClass, c: jlong) {
    if c != 0 {
        // SAFETY: called once by the Java clock's Cleaner.
        let _ =
            catch_unwind(|| drop(unsafe { Box::from_raw(c as *mut Arc<shardlimit::ManualClock>) }));
    }
}

// ----- checks ------------------------------------------------------------------------

/// What `Native.check` does with (key, policy, n).
const CHECK: jint = 0;
const PEEK: jint = 1;
const SHADOW: jint = 2;
const CHARGE: jint = 3;
const REFUND: jint = 4;
const RESET: jint = 5;

/// check, peek, check in shadow, charge, refund, reset: of the config's policy `policy`
/// as plan `plan` has it (or the policy itself when `plan` is null).
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_check(
    env: JNIEnv,
    _: JClass,
    h: jlong,
    key: JByteArray,
    policy: JByteArray,
    plan: JByteArray,
    n: jlong,
    mode: jint,
    call: JObject,
) {
    async_call!(env, call, |env| {
        let l = limiter(h)?;
        let key = text(env, &key, "key")?;
        let policy = text(env, &policy, "policy")?;
        let plan = opt_text(env, &plan, "plan")?;
        let me = l.clone();
        let fut = async move {
            let p = match &plan {
                Some(plan) => me.plan_policy(plan, &policy)?,
                None => me.policy(&policy)?,
            };
            let d = match mode {
                CHECK => me.check(&key, &p, units("cost", n)?).await?,
                PEEK => me.peek(&key, &p).await?,
                SHADOW => me.check_shadow(&key, &p, units("cost", n)?).await?,
                CHARGE => me.charge(&key, &p, units("cost", n)?).await?,
                REFUND => me.refund(&key, &p, units("cost", n)?).await?,
                RESET => {
                    me.reset(&key, &p).await?;
                    return Ok(None);
                }
                _ => return Err(invalid("mode", "unknown")),
            };
            Ok(Some(d))
        };
        let convert: Convert<Option<Decision>> = |env, d| match d {
            Some(d) => decision(env, d),
            None => Ok(JObject::null()),
        };
        (l, fut, convert)
    })
}

/// A layered check: keys and policy names as UTF-8 byte arrays, costs beside them.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_checkAll(
    env: JNIEnv,
    _: JClass,
    h: jlong,
    keys: JObjectArray,
    policies: JObjectArray,
    costs: JLongArray,
    call: JObject,
) {
    async_call!(env, call, |env| {
        let l = limiter(h)?;
        let n = env.get_array_length(&keys)?;
        if env.get_array_length(&policies)? != n || env.get_array_length(&costs)? != n {
            return Err(invalid("layers", "keys, policies and costs differ in length").into());
        }
        let mut c = vec![0; n as usize];
        env.get_long_array_region(&costs, 0, &mut c)?;
        let mut specs = Vec::with_capacity(n as usize);
        for i in 0..n {
            let k = JByteArray::from(env.get_object_array_element(&keys, i)?);
            let p = JByteArray::from(env.get_object_array_element(&policies, i)?);
            let key = text(env, &k, &format!("layers[{i}].key"))?;
            let policy = text(env, &p, &format!("layers[{i}].policy"))?;
            env.delete_local_ref(k)?;
            env.delete_local_ref(p)?;
            specs.push((key, policy, c[i as usize]));
        }
        let me = l.clone();
        let fut = async move {
            let layers = specs
                .into_iter()
                .enumerate()
                .map(|(i, (k, p, c))| {
                    let cost = units(&format!("layers[{i}].cost"), c)?;
                    Ok(shardlimit::Layer::new(k, &me.policy(&p)?, cost))
                })
                .collect::<shardlimit::Result<Vec<_>>>()?;
            me.check_all(&layers).await
        };
        (l, fut, decision as Convert<Decision>)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_acquire(
    env: JNIEnv,
    _: JClass,
    h: jlong,
    key: JByteArray,
    policy: JByteArray,
    n: jlong,
    call: JObject,
) {
    async_call!(env, call, |env| {
        let l = limiter(h)?;
        let key = text(env, &key, "key")?;
        let policy = text(env, &policy, "policy")?;
        let me = l.clone();
        let fut = async move {
            let p = me.policy(&policy)?;
            let (d, lease) = me.acquire(&key, &p, units("units", n)?).await?;
            Ok((
                d,
                lease.map(
                    |l| json!({"key": l.key, "policy": l.policy, "id": l.id, "units": l.units}),
                ),
            ))
        };
        (l, fut, pair as Convert<(Decision, Option<Value>)>)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_release(
    env: JNIEnv,
    _: JClass,
    h: jlong,
    key: JByteArray,
    policy: JByteArray,
    id: JByteArray,
    n: jlong,
    call: JObject,
) {
    async_call!(env, call, |env| {
        let l = limiter(h)?;
        let lease = shardlimit::Lease {
            key: text(env, &key, "lease.key")?,
            policy: text(env, &policy, "lease.policy")?,
            id: text(env, &id, "lease.id")?,
            units: units("lease.units", n)?,
        };
        let me = l.clone();
        let fut = async move { me.release(&lease).await };
        (l, fut, boolean as Convert<bool>)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_reserve(
    env: JNIEnv,
    _: JClass,
    h: jlong,
    key: JByteArray,
    policy: JByteArray,
    n: jlong,
    call: JObject,
) {
    async_call!(env, call, |env| {
        let l = limiter(h)?;
        let key = text(env, &key, "key")?;
        let policy = text(env, &policy, "policy")?;
        let me = l.clone();
        let fut = async move {
            let p = me.policy(&policy)?;
            let (d, r) = me.reserve(&key, &p, units("cost", n)?).await?;
            Ok((
                d,
                r.map(|r| json!({"key": r.key, "policy": r.policy, "units": r.units, "at_us": r.at_us})),
            ))
        };
        (l, fut, pair as Convert<(Decision, Option<Value>)>)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_settle(
    env: JNIEnv,
    _: JClass,
    h: jlong,
    key: JByteArray,
    policy: JByteArray,
    reserved: jlong,
    at_us: jlong,
    actual: jlong,
    call: JObject,
) {
    async_call!(env, call, |env| {
        let l = limiter(h)?;
        let r = shardlimit::Reservation {
            key: text(env, &key, "reservation.key")?,
            policy: text(env, &policy, "reservation.policy")?,
            units: units("reservation.units", reserved)?,
            at_us: units("reservation.atUs", at_us)?,
        };
        let me = l.clone();
        let fut = async move { me.settle(&r, units("actual", actual)?).await };
        (l, fut, decision as Convert<Decision>)
    })
}

// ----- block list, overrides, shadow report ------------------------------------------

/// 0 block (arg: reason, ttl), 1 unblock, 2 blocked.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_blockList(
    env: JNIEnv,
    _: JClass,
    h: jlong,
    op: jint,
    key: JByteArray,
    reason: JByteArray,
    ttl_us: jlong,
    call: JObject,
) {
    async_call!(env, call, |env| {
        let l = limiter(h)?;
        let key = text(env, &key, "key")?;
        let reason = opt_text(env, &reason, "reason")?.unwrap_or_default();
        let ttl = opt_us("ttl", ttl_us)?;
        let me = l.clone();
        let fut = async move {
            Ok(match op {
                0 => me.block(&key, ttl, &reason).await.map(|()| Value::Null)?,
                1 => Value::Bool(me.unblock(&key).await?),
                _ => match me.blocked(&key).await? {
                    Some(b) => json!({
                        "reason": b.reason,
                        "remaining_ms": b.remaining.map(|r| r.as_micros() as f64 / 1000.0),
                    }),
                    None => Value::Null,
                },
            })
        };
        (l, fut, json_text as Convert<Value>)
    })
}

/// 0 set (limit, ttl), 1 get, 2 delete, 3 list (key: the cursor or null, n: the page
/// size), 4 shadow report (n: top, or -1).
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_admin(
    env: JNIEnv,
    _: JClass,
    h: jlong,
    op: jint,
    key: JByteArray,
    policy: JByteArray,
    limit: JByteArray,
    n: jlong,
    call: JObject,
) {
    async_call!(env, call, |env| {
        let l = limiter(h)?;
        let key = opt_text(env, &key, "key")?;
        let policy = text(env, &policy, "policy")?;
        let limit = opt_text(env, &limit, "limit")?;
        let me = l.clone();
        let need = |k: Option<String>| k.ok_or_else(|| invalid("key", "must not be null"));
        let fut = async move {
            Ok(match op {
                0 => {
                    let ttl = opt_us("ttl", n)?;
                    let limit = limit.ok_or_else(|| invalid("limit", "must not be null"))?;
                    me.set_override(&need(key)?, &policy, &limit, ttl)
                        .await?
                        .to_json()
                }
                1 => match me.get_override(&need(key)?, &policy).await? {
                    Some(o) => o.to_json(),
                    None => Value::Null,
                },
                2 => Value::Bool(me.delete_override(&need(key)?, &policy).await?),
                3 => {
                    let size =
                        usize::try_from(n).map_err(|_| invalid("limit", "must not be negative"))?;
                    me.list_overrides(&policy, key.as_deref(), size)
                        .await?
                        .to_json()
                }
                _ => {
                    let top = match n {
                        -1 => None,
                        n => Some(
                            usize::try_from(n)
                                .map_err(|_| invalid("top", "must not be negative"))?,
                        ),
                    };
                    me.shadow_report(&policy, top).await?.to_json()
                }
            })
        };
        (l, fut, json_text as Convert<Value>)
    })
}

/// Connects to every shard within `timeout_us`.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_connect(
    env: JNIEnv,
    _: JClass,
    h: jlong,
    timeout_us: jlong,
    call: JObject,
) {
    async_call!(env, call, |env| {
        let l = limiter(h)?;
        let timeout = match timeout_us {
            1..=3_600_000_000 => Duration::from_micros(timeout_us as u64),
            _ => return Err(invalid("timeout", "must be above 0, at most 1 hour").into()),
        };
        let me = l.clone();
        let fut = async move { me.connect(timeout).await };
        (l, fut, nothing as Convert<()>)
    })
}

// ----- the limiter's state (synchronous) ---------------------------------------------

fn jstr<'l>(env: &mut JNIEnv<'l>, s: impl AsRef<str>) -> Result<jstring, Fail> {
    Ok(env.new_string(s.as_ref())?.into_raw())
}

fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

fn limit_json(l: &shardlimit::Limit) -> Value {
    use shardlimit::Limit;
    let params = match l {
        Limit::FixedWindow { limit, window }
        | Limit::SlidingWindow { limit, window }
        | Limit::SlidingLog { limit, window } => {
            json!({ "limit": limit, "window_ms": ms(*window) })
        }
        Limit::TokenBucket {
            capacity,
            refill_per_sec,
        } => json!({ "capacity": capacity, "refill_per_sec": refill_per_sec }),
        Limit::LeakyBucket {
            capacity,
            leak_per_sec,
        } => json!({ "capacity": capacity, "leak_per_sec": leak_per_sec }),
        Limit::Concurrency { max, lease_ttl } => {
            json!({ "max": max, "lease_ttl_ms": ms(*lease_ttl) })
        }
    };
    json!({ "algorithm": l.algorithm().name(), "params": params })
}

fn policy_json(p: &shardlimit::Policy) -> Value {
    let mut v = limit_json(p.limit());
    v["name"] = p.name().into();
    v["max"] = p.max().into();
    v["on_error"] = p.on_error().name().into();
    if p.is_multi() {
        v["limits"] = p.limits().iter().map(limit_json).collect();
    }
    v
}

/// What `Native.info` answers, as JSON text.
const INFO_CONFIG: jint = 0;
const INFO_POLICY: jint = 1;
const INFO_PLAN_POLICY: jint = 2;
const INFO_ROUTE: jint = 3;
const INFO_METRICS: jint = 4;
const INFO_METRICS_SNAPSHOT: jint = 5;
const INFO_STATE: jint = 6;

/// Synchronous questions to the limiter, answered as JSON (or Prometheus) text.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_info(
    mut env: JNIEnv,
    _: JClass,
    h: jlong,
    what: jint,
    a: JByteArray,
    b: JByteArray,
) -> jstring {
    run(&mut env, std::ptr::null_mut(), |env| {
        let l = limiter(h)?;
        let v = match what {
            INFO_CONFIG => {
                let c = l.config();
                let shards: Vec<String> = match &c.shards {
                    Some(s) => s.iter().map(|s| s.name.clone()).collect(),
                    None => Vec::new(),
                };
                json!({
                    "engine": if l.is_redis() { "redis" } else { "memory" },
                    "shards": shards,
                    "cluster": c.cluster.as_ref().map(|n| n.len()),
                    "key_prefix": c.key_prefix,
                    "timeout_ms": ms(c.timeout),
                    "on_error": c.on_error.name(),
                    "instances": c.instances,
                    "policies": c.policies.values().map(policy_json).collect::<Vec<_>>(),
                })
            }
            INFO_POLICY => policy_json(&l.policy(&text(env, &a, "policy")?)?),
            INFO_PLAN_POLICY => {
                policy_json(&l.plan_policy(&text(env, &a, "plan")?, &text(env, &b, "policy")?)?)
            }
            INFO_ROUTE => match l.route(&text(env, &a, "key")?) {
                Some((index, name)) => json!({"index": index, "name": name}),
                None => Value::Null,
            },
            INFO_METRICS => return jstr(env, l.metrics().to_prometheus()),
            INFO_METRICS_SNAPSHOT => {
                let m = l.metrics();
                let policies: Vec<_> = m
                    .policies
                    .iter()
                    .map(|p| {
                        json!({
                            "policy": p.policy,
                            "allowed": p.allowed,
                            "denied": p.denied,
                            "fallback": p.fallback,
                            "blocked": p.blocked,
                            "local_admitted": p.local_admitted,
                            "redis_errors": p.redis_errors,
                            "shadow_denied": p.shadow_denied,
                            "near_limit": p.near_limit,
                        })
                    })
                    .collect();
                json!({
                    "policies": policies,
                    "redis_latency": {
                        "buckets_us": shardlimit::metrics::LATENCY_BUCKETS_US,
                        "counts": m.redis_latency.buckets,
                        "sum_us": m.redis_latency.sum_us,
                        "count": m.redis_latency.count,
                    },
                    "events_dropped": m.events_dropped,
                })
            }
            INFO_STATE => json!({
                "is_redis": l.is_redis(),
                "memory_keys": l.memory_keys(),
                "config_generation": l.config_generation(),
                "scale": l.scale(),
                "policies": l.config().policies.keys().cloned().collect::<Vec<_>>(),
            }),
            _ => return Err(invalid("what", "unknown").into()),
        };
        jstr(env, v.to_string())
    })
}

fn report_json(r: shardlimit::ReloadReport) -> Value {
    json!({
        "engine_changed": r.engine_changed,
        "handoff": r.handoff,
        "policies_added": r.policies_added,
        "policies_removed": r.policies_removed,
        "policies_changed": r.policies_changed,
    })
}

/// Reloads from JSON text (`file` false) or a file; answers the report as JSON.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_reload(
    mut env: JNIEnv,
    _: JClass,
    h: jlong,
    arg: JByteArray,
    file: jboolean,
) -> jstring {
    run(&mut env, std::ptr::null_mut(), |env| {
        let l = limiter(h)?;
        let arg = text(env, &arg, if file != 0 { "path" } else { "config" })?;
        let report = if file != 0 {
            l.reload_from_file(&arg)?
        } else {
            l.reload(shardlimit::Config::from_json(&arg)?)?
        };
        jstr(env, report_json(report).to_string())
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_watchConfig(
    mut env: JNIEnv,
    _: JClass,
    h: jlong,
    path: JByteArray,
    every_us: jlong,
) -> jlong {
    run(&mut env, 0, |env| {
        let l = limiter(h)?;
        let path = text(env, &path, "path")?;
        let every = match every_us {
            1_000..=3_600_000_000 => Duration::from_micros(every_us as u64),
            _ => return Err(invalid("every", "must be 1 ms to 1 hour").into()),
        };
        Ok(Box::into_raw(Box::new(l.watch_config(path, every))) as jlong)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_unwatch(_: JNIEnv, _: JClass, w: jlong) {
    if w != 0 {
        // SAFETY: a handle from `watchConfig`, freed once by the Java watcher's close.
        let w = unsafe { Box::from_raw(w as *mut shardlimit::ConfigWatcher) };
        let _ = std::thread::Builder::new()
            .name("shardlimit-unwatch".into())
            .spawn(move || drop(w));
    }
}

/// set_scale (policies: null for all) or, with `observe`, observe_health(factor).
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_scale(
    mut env: JNIEnv,
    _: JClass,
    h: jlong,
    factor: jdouble,
    policies: JObjectArray,
    observe: jboolean,
) -> jdouble {
    run(&mut env, 0.0, |env| {
        let l = limiter(h)?;
        if observe != 0 {
            return Ok(l.observe_health(factor)?);
        }
        let mut names = Vec::new();
        if !policies.as_raw().is_null() {
            for i in 0..env.get_array_length(&policies)? {
                let p = JByteArray::from(env.get_object_array_element(&policies, i)?);
                names.push(text(env, &p, "policies")?);
            }
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        l.set_scale(factor, &names)?;
        Ok(l.scale())
    })
}

// ----- events and log lines ----------------------------------------------------------

/// Sends `(kind, json)` to the Java sink `Native.event(sink, kind, json)` from whatever
/// thread the core emits on; the Java side queues it for its executor (bounded).
fn to_sink(sink: &GlobalRef, kind: &str, fields: Value) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(g) = GLOBALS.get() else { return };
        let Ok(mut env) = g.vm.attach_current_thread_as_daemon() else {
            return;
        };
        let r = env.with_local_frame(8, |env| -> jni::errors::Result<()> {
            let kind = env.new_string(kind)?;
            let text = env.new_string(fields.to_string())?;
            env.call_static_method(
                class(&g.native),
                "event",
                "(Ljava/lang/Object;Ljava/lang/String;Ljava/lang/String;)V",
                &[
                    JValue::Object(sink.as_obj()),
                    JValue::Object(&kind),
                    JValue::Object(&text),
                ],
            )?;
            Ok(())
        });
        if r.is_err() || env.exception_check().unwrap_or(false) {
            let _ = env.exception_clear();
        }
    }));
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_subscribe(
    mut env: JNIEnv,
    _: JClass,
    h: jlong,
    sink: JObject,
) {
    run(&mut env, (), |env| {
        let l = limiter(h)?;
        let sink = env.new_global_ref(sink)?;
        l.subscribe(Arc::new(move |e: &shardlimit::Event| {
            let mut obj = serde_json::Map::new();
            for (k, v) in e.fields() {
                obj.insert(k.to_string(), v.into());
            }
            to_sink(&sink, e.kind(), Value::Object(obj));
        }));
        Ok(())
    })
}

/// Sends the limiter's log lines to the Java sink (null: to `tracing` only).
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_setLogSink(
    mut env: JNIEnv,
    _: JClass,
    h: jlong,
    sink: JObject,
) {
    run(&mut env, (), |env| {
        let l = limiter(h)?;
        if sink.as_raw().is_null() {
            l.set_log_sink(None);
            return Ok(());
        }
        let sink = env.new_global_ref(sink)?;
        l.set_log_sink(Some(Arc::new(move |r: &shardlimit::LogRecord| {
            let v = json!({
                "level": r.level.name(),
                "reason": r.reason.name(),
                "subject": r.subject,
                "error_kind": r.error_kind.name(),
                "error": r.error,
                "allowed": r.allowed,
                "suppressed": r.suppressed,
                "message": r.message,
            });
            to_sink(&sink, "log", v);
        })));
        Ok(())
    })
}

// ----- decisions, errors, client addresses -------------------------------------------

fn micros(us: jlong) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

/// The core decision of a Java `Decision`'s fields (what `decision` gave it).
#[allow(clippy::too_many_arguments)]
fn rebuild(
    env: &JNIEnv,
    allowed: jboolean,
    limit: jlong,
    remaining: jlong,
    reset_after_us: jlong,
    retry_after_us: jlong,
    policy: String,
    source: jint,
    shadow_denied: jboolean,
    limit_index: jint,
    quotas: &JLongArray,
    window_us: jlong,
) -> Result<Decision, Fail> {
    let mut q = Vec::new();
    if !quotas.as_raw().is_null() {
        let n = env.get_array_length(quotas)?;
        let mut flat = vec![0; n as usize];
        env.get_long_array_region(quotas, 0, &mut flat)?;
        q = flat
            .chunks_exact(2)
            .map(|c| shardlimit::Quota {
                limit: c[0].max(0) as u64,
                window: micros(c[1]),
            })
            .collect();
    }
    Ok(Decision {
        allowed: allowed != 0,
        limit: limit.max(0) as u64,
        remaining: remaining.max(0) as u64,
        reset_after: micros(reset_after_us),
        retry_after: (retry_after_us >= 0).then(|| micros(retry_after_us)),
        delay: Duration::ZERO,
        policy: policy.into(),
        source: SOURCES
            .get(source as usize)
            .copied()
            .unwrap_or(Source::Redis),
        shard: None,
        window: micros(window_us),
        layer: None,
        shadow_denied: shadow_denied != 0,
        limit_index: (limit_index >= 0).then_some(limit_index as usize),
        layers: Vec::new(),
        quotas: if limit_index >= 0 { q } else { Vec::new() },
    })
}

/// The core's headers (as name, value, name, value...) or, with `body`, its 429 body
/// (one JSON text) of a decision's fields.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_shardlimit_Native_render(
    mut env: JNIEnv,
    _: JClass,
    allowed: jboolean,
    limit: jlong,
    remaining: jlong,
    reset_after_us: jlong,
    retry_after_us: jlong,
    policy: JString,
    source: jint,
    shadow_denied: jboolean,
    limit_index: jint,
    quotas: JLongArray,
    window_us: jlong,
    body: jboolean,
) -> jobject {
    run(&mut env, std::ptr::null_mut(), |env| {
        let policy: String = env.get_string(&policy)?.into();
        let d = rebuild(
            env,
            allowed,
            limit,
            remaining,
            reset_after_us,
            retry_after_us,
            policy,
            source,
            shadow_denied,
            limit_index,
            &quotas,
            window_us,
        )?;
        let g = globals()?;
        let parts: Vec<String> = if body != 0 {
            vec![d.body().to_string()]
        } else {
            d.headers()
                .into_iter()
                .flat_map(|(k, v)| [k.to_string(), v])
                .collect()
        };
        let arr = env.new_object_array(parts.len() as i32, class(&g.string), JObject::null())?;
        for (i, p) in parts.iter().enumerate() {
            let s = env.new_string(p)?;
            env.set_object_array_element(&arr, i as i32, &s)?;
            env.delete_local_ref(s)?;
        }
        Ok(arr.into_raw())
    })
}

/// The rate-limit key part of a client (`client_ip_key`): the peer address, the
/// X-Forwarded-For header (null when absent) and the trusted proxies' CIDRs.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_clientIpKey(
    mut env: JNIEnv,
    _: JClass,
    peer: JByteArray,
    xff: JByteArray,
    trusted: JObjectArray,
    ipv6_prefix: jint,
) -> jstring {
    run(&mut env, std::ptr::null_mut(), |env| {
        let peer = text(env, &peer, "peer")?;
        let xff = opt_text(env, &xff, "x_forwarded_for")?;
        let mut cidrs = Vec::new();
        if !trusted.as_raw().is_null() {
            for i in 0..env.get_array_length(&trusted)? {
                let c = JByteArray::from(env.get_object_array_element(&trusted, i)?);
                cidrs.push(text(env, &c, "trusted_proxies")?);
            }
        }
        let prefix =
            u8::try_from(ipv6_prefix).map_err(|_| invalid("ipv6_prefix", "must be 1 to 128"))?;
        let key = shardlimit::client_ip_key(&peer, xff.as_deref(), &cidrs, prefix)?;
        jstr(env, key)
    })
}

/// Every error kind of the core as JSON (`[{name, code}]`), and the core's version.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_errorKinds(mut env: JNIEnv, _: JClass) -> jstring {
    run(&mut env, std::ptr::null_mut(), |env| {
        let kinds: Vec<Value> = shardlimit::ErrorKind::ALL
            .iter()
            .map(|k| json!({"name": k.name(), "code": k.code()}))
            .collect();
        jstr(
            env,
            json!({"kinds": kinds, "version": shardlimit::VERSION}).to_string(),
        )
    })
}

/// A test hook: a panic inside a native method, which must arrive as an internal error.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_panicForTest(mut env: JNIEnv, _: JClass) {
    run(&mut env, (), |_| -> Result<(), Fail> {
        panic!("a test panic")
    })
}
