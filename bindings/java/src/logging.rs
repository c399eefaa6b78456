//! The core's rate-limited log lines to a Java sink (`Native.setLogSink`).

use super::*;

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
