//! One body per call shape of the `NativeLimiter` methods, as the C ABI's
//! `start_decision`: a (key, policy, units) call on a named policy or on an ad-hoc limit,
//! its units (and the named policy) checked inside the Promise, so that bad input rejects
//! it with the core's error. The methods differ only in the core call and the conversion.

use super::*;

/// The conversion of a call whose result is a decision.
pub(crate) fn decision(_: &Env, d: shardlimit::Decision) -> Result<Decision> {
    Ok(Decision { inner: d })
}

/// The conversion of `acquire`: `{ decision, lease }`.
pub(crate) fn lease_obj(
    env: &Env,
    (d, lease): (shardlimit::Decision, Option<shardlimit::Lease>),
) -> Result<Object<'static>> {
    let mut obj = Object::new(env)?;
    obj.set("decision", Decision { inner: d })?;
    obj.set(
        "lease",
        lease.map(|l| Lease {
            key: l.key,
            policy: l.policy,
            id: l.id,
            units: l.units as f64,
        }),
    )?;
    Ok(obj)
}

/// The policy of a call on the configured policy named `policy` (looked up in the Promise).
pub(crate) fn named(
    policy: String,
) -> impl FnOnce(&shardlimit::Limiter) -> shardlimit::Result<shardlimit::Policy> + Send + 'static {
    move |l| l.policy(&policy)
}

/// The policy of a call on an ad-hoc limit.
pub(crate) fn ad_hoc(
    limit: &NativeLimit,
) -> impl FnOnce(&shardlimit::Limiter) -> shardlimit::Result<shardlimit::Policy> + Send + 'static {
    let p = limit.policy.clone();
    move |_| Ok(p)
}

impl NativeLimiter {
    /// `call(limiter, key, policy, n)` with `n` the units argument named `what` and the
    /// policy from `policy` ([`named`] or [`ad_hoc`]), both checked in that order.
    pub(crate) fn units_call<T, V, F, C>(
        &self,
        env: &Env,
        key: String,
        policy: impl FnOnce(&shardlimit::Limiter) -> shardlimit::Result<shardlimit::Policy>
            + Send
            + 'static,
        (what, n): (&'static str, f64),
        call: impl FnOnce(shardlimit::Limiter, String, shardlimit::Policy, u64) -> F + Send + 'static,
        convert: C,
    ) -> Result<Unknown<'static>>
    where
        T: Send + 'static,
        V: ToNapiValue + 'static,
        F: Future<Output = shardlimit::Result<T>> + Send + 'static,
        C: FnOnce(&Env, T) -> Result<V> + Send + 'static,
    {
        let me = self.inner.clone();
        promise(
            env,
            &self.inner,
            async move {
                let n = units(what, n)?;
                let p = policy(&me)?;
                call(me, key, p, n).await
            },
            convert,
        )
    }
}
