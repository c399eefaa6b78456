//! The block list: `block`, `unblock`, `blocked`.

use super::*;

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
