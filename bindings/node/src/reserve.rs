//! Charge, refund and reserve-and-settle: the core's calls as Promises.

use super::*;

/// Units reserved by `reserve`, to settle with `settle` once the actual cost is known.
#[napi(object)]
#[derive(Clone)]
pub struct Reservation {
    pub key: String,
    pub policy: String,
    pub units: f64,
    /// When the units were recorded (µs on the engine's clock).
    pub at_us: f64,
}

#[napi]
impl NativeLimiter {
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn charge(
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
                let p = me.policy(&policy)?;
                me.charge(&key, &p, cost).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }

    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn refund(
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
                let p = me.policy(&policy)?;
                me.refund(&key, &p, cost).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }

    #[napi(
        catch_unwind,
        ts_return_type = "Promise<{ decision: Decision; reservation: Reservation | null }>"
    )]
    pub fn reserve(
        &self,
        env: Env,
        key: String,
        policy: String,
        estimate: f64,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let n = units("estimate", estimate)?;
                let p = me.policy(&policy)?;
                me.reserve(&key, &p, n).await
            },
            |env, (d, r)| {
                let mut obj = Object::new(env)?;
                obj.set("decision", Decision { inner: d })?;
                obj.set(
                    "reservation",
                    r.map(|r| Reservation {
                        key: r.key,
                        policy: r.policy,
                        units: r.units as f64,
                        at_us: r.at_us as f64,
                    }),
                )?;
                Ok(obj)
            },
        )
    }

    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn settle(
        &self,
        env: Env,
        reservation: Reservation,
        actual: f64,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let r = shardlimit::Reservation {
                    units: units("reservation.units", reservation.units)?,
                    at_us: units("reservation.atUs", reservation.at_us)?,
                    key: reservation.key,
                    policy: reservation.policy,
                };
                let actual = units("actual", actual)?;
                me.settle(&r, actual).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }
}
