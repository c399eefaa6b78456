//! Leases of a concurrency policy: `acquire` and `release`.

use super::*;

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
