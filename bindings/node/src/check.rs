//! Checks: one key, a plan's policy, an ad-hoc limit (`check`, `peek`, `reset`), and
//! layered (`checkAll`).

use super::*;

/// One layer of a layered check.
#[napi(object)]
pub struct LayerSpec {
    pub key: String,
    pub policy: String,
    pub cost: Option<f64>,
}

#[napi]
impl NativeLimiter {
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn check(
        &self,
        env: Env,
        key: String,
        policy: String,
        cost: f64,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let cost = units("cost", cost)?;
                me.check_by_name(&key, &policy, cost).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }

    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn peek(&self, env: Env, key: String, policy: String) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let p = me.policy(&policy)?;
                me.peek(&key, &p).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }

    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn reset(&self, env: Env, key: String, policy: String) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let p = me.policy(&policy)?;
                me.reset(&key, &p).await
            },
            |_, ()| Ok(()),
        )
    }

    /// A layered check: allowed only if every layer allows; if any denies, none consumes.
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn check_all(&self, env: Env, layers: Vec<LayerSpec>) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let layers = layers
                    .into_iter()
                    .enumerate()
                    .map(|(i, l)| {
                        let cost = units(&format!("layers[{i}].cost"), l.cost.unwrap_or(1.0))?;
                        Ok(shardlimit::Layer::new(l.key, &me.policy(&l.policy)?, cost))
                    })
                    .collect::<shardlimit::Result<Vec<_>>>()?;
                me.check_all(&layers).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }

    /// Checks the config's policy `policy` as plan `plan` has it.
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn check_plan(
        &self,
        env: Env,
        key: String,
        plan: String,
        policy: String,
        cost: f64,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let cost = units("cost", cost)?;
                let p = me.plan_policy(&plan, &policy)?;
                me.check(&key, &p, cost).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }

    /// Peeks at the config's policy `policy` as plan `plan` has it.
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn peek_plan(
        &self,
        env: Env,
        key: String,
        plan: String,
        policy: String,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let p = me.plan_policy(&plan, &policy)?;
                me.peek(&key, &p).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }

    /// Checks an ad-hoc limit (see `NativeLimit`).
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn check_limit(
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
            |l, k, p, n| async move { l.check(&k, &p, n).await },
            calls::decision,
        )
    }

    /// Peeks at an ad-hoc limit.
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn peek_limit(
        &self,
        env: Env,
        key: String,
        limit: &NativeLimit,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        let p = limit.policy.clone();
        promise(
            &env,
            &self.inner,
            async move { me.peek(&key, &p).await },
            |_, d| Ok(Decision { inner: d }),
        )
    }
}
