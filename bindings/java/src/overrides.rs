//! Live per-key overrides and the shadow report (`Native.admin`).

use super::*;

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
