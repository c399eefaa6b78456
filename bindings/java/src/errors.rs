//! Errors across the boundary: a core or JNI failure becomes the exception of its kind
//! (`Native.error`), a panic an `internal` error; and the table of error kinds.

use super::*;

/// Why a native method failed: a core error (thrown as its exception class), or a JNI
/// failure (a Java exception is then usually pending already).
pub(crate) enum Fail {
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

pub(crate) fn internal(message: impl Into<String>) -> shardlimit::Error {
    shardlimit::Error::Internal(message.into())
}

pub(crate) fn invalid(what: &str, message: &str) -> shardlimit::Error {
    shardlimit::Error::InvalidArgument {
        what: what.to_string(),
        message: message.to_string(),
    }
}

pub(crate) fn panic_error(payload: Box<dyn std::any::Any + Send>) -> shardlimit::Error {
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
pub(crate) fn run<'l, T>(
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
pub(crate) struct CatchUnwind<F>(pub(crate) F);

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
