//! Checks: one key (`check`, `peek`, shadow, `charge`, `refund`, `reset`, on a policy or
//! a plan's) and layered (`checkAll`).

use super::*;

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
