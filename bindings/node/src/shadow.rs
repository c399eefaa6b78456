//! Shadow mode: the per-call option and the shadow report.

use super::*;

#[napi]
impl NativeLimiter {
    /// `check` in shadow mode for this one call (`{ shadow: true }`).
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn check_shadow(
        &self,
        env: Env,
        key: String,
        policy: String,
        cost: f64,
    ) -> Result<Unknown<'static>> {
        self.units_call(
            &env,
            key,
            calls::named(policy),
            ("cost", cost),
            |l, k, p, n| async move { l.check_shadow(&k, &p, n).await },
            calls::decision,
        )
    }

    /// `checkLimit` in shadow mode for this one call.
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn check_limit_shadow(
        &self,
        env: Env,
        key: String,
        limit: &NativeLimit,
        cost: f64,
    ) -> Result<Unknown<'static>> {
        self.units_call(
            &env,
            key,
            calls::ad_hoc(limit),
            ("cost", cost),
            |l, k, p, n| async move { l.check_shadow(&k, &p, n).await },
            calls::decision,
        )
    }

    /// The shadow-mode denials of a policy by key, summed over every shard:
    /// `{ policy, total, untracked, keys: [{ key, count }] }`; `top` (> 0) keeps that many.
    #[napi(catch_unwind, ts_return_type = "Promise<ShadowReport>")]
    pub fn shadow_report(
        &self,
        env: Env,
        policy: String,
        top: Option<f64>,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let top = match top {
                    Some(t) => Some(units("top", t)? as usize),
                    None => None,
                };
                me.shadow_report(&policy, top).await
            },
            |_, r| Ok(r.to_json()),
        )
    }
}
