//! Reserve-and-settle: `reserve` and `settle`.

use super::*;

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
