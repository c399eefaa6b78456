//! Leases of a concurrency policy: `acquire` and `release`.

use super::*;

/// A held lease of a concurrency policy: a plain object, safe to pass between workers.
#[napi(object)]
#[derive(Clone)]
pub struct Lease {
    pub key: String,
    pub policy: String,
    pub id: String,
    pub units: f64,
}

#[napi]
impl NativeLimiter {
    #[napi(
        catch_unwind,
        ts_return_type = "Promise<{ decision: Decision; lease: Lease | null }>"
    )]
    pub fn acquire(
        &self,
        env: Env,
        key: String,
        policy: String,
        units_: f64,
    ) -> Result<Unknown<'static>> {
        self.units_call(
            &env,
            key,
            calls::named(policy),
            ("units", units_),
            |l, k, p, n| async move { l.acquire(&k, &p, n).await },
            calls::lease_obj,
        )
    }

    #[napi(catch_unwind, ts_return_type = "Promise<boolean>")]
    pub fn release(&self, env: Env, lease: Lease) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let lease = shardlimit::Lease {
                    units: units("lease.units", lease.units)?,
                    key: lease.key,
                    policy: lease.policy,
                    id: lease.id,
                };
                me.release(&lease).await
            },
            |_, released| Ok(released),
        )
    }

    /// Acquires a lease of an ad-hoc concurrency limit.
    #[napi(
        catch_unwind,
        ts_return_type = "Promise<{ decision: Decision; lease: Lease | null }>"
    )]
    pub fn acquire_limit(
        &self,
        env: Env,
        key: String,
        limit: &NativeLimit,
        units_: f64,
    ) -> Result<Unknown<'static>> {
        self.units_call(
            &env,
            key,
            calls::ad_hoc(limit),
            ("units", units_),
            |l, k, p, n| async move { l.acquire(&k, &p, n).await },
            calls::lease_obj,
        )
    }

    /// Releases a lease of an ad-hoc concurrency limit.
    #[napi(catch_unwind, ts_return_type = "Promise<boolean>")]
    pub fn release_limit(
        &self,
        env: Env,
        lease: Lease,
        limit: &NativeLimit,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        let p = limit.policy.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let lease = shardlimit::Lease {
                    units: units("lease.units", lease.units)?,
                    key: lease.key,
                    policy: lease.policy,
                    id: lease.id,
                };
                me.release_with(&p, &lease).await
            },
            |_, released| Ok(released),
        )
    }
}
