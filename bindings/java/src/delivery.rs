//! Starting a core future for a Java `Call` and completing it (`Native.deliver`), on
//! the calling thread (in-memory engine) or an attached I/O thread; result conversions.

use super::*;

const DELIVER_SIG: &str = "(Lio/shardlimit/Call;Ljava/lang/Object;ILjava/lang/String;Z)V";

pub(crate) type Convert<T> = for<'l> fn(&mut JNIEnv<'l>, T) -> jni::errors::Result<JObject<'l>>;

pub(crate) fn nothing<'l>(_: &mut JNIEnv<'l>, _: ()) -> jni::errors::Result<JObject<'l>> {
    Ok(JObject::null())
}

pub(crate) fn boolean<'l>(env: &mut JNIEnv<'l>, b: bool) -> jni::errors::Result<JObject<'l>> {
    // a String: the Java side reads "true" / "false" (no class lookup on the I/O thread)
    Ok(env.new_string(if b { "true" } else { "false" })?.into())
}

pub(crate) fn json_text<'l>(env: &mut JNIEnv<'l>, v: Value) -> jni::errors::Result<JObject<'l>> {
    Ok(env.new_string(v.to_string())?.into())
}

/// `Object[]{decision, json-or-null}`: acquire's and reserve's results.
pub(crate) fn pair<'l>(
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

/// Starts `fut` for the Java `Call` `call` (see the crate docs).
pub(crate) fn start<T: Send + 'static>(
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
pub(crate) use async_call;
