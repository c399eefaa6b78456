//! The event stream to a Java sink (`Native.event`), from whatever thread the core
//! emits on.

use super::*;

/// Sends `(kind, json)` to the Java sink `Native.event(sink, kind, json)` from whatever
/// thread the core emits on; the Java side queues it for its executor (bounded).
pub(crate) fn to_sink(sink: &GlobalRef, kind: &str, fields: Value) {
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
