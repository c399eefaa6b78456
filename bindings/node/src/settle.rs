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
        self.units_call(
            &env,
            key,
            calls::named(policy),
            ("cost", cost),
            |l, k, p, n| async move { l.charge(&k, &p, n).await },
            calls::decision,
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
        self.units_call(
            &env,
            key,
            calls::named(policy),
            ("cost", cost),
            |l, k, p, n| async move { l.refund(&k, &p, n).await },
            calls::decision,
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
        self.units_call(
            &env,
            key,
            calls::named(policy),
            ("estimate", estimate),
            |l, k, p, n| async move { l.reserve(&k, &p, n).await },
            |env, (d, r)| reservation_obj(env, d, r),
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
                let r = reservation_of(reservation)?;
                let actual = units("actual", actual)?;
                me.settle(&r, actual).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }

    /// Reserves units of an ad-hoc limit.
    #[napi(
        catch_unwind,
        ts_return_type = "Promise<{ decision: Decision; reservation: Reservation | null }>"
    )]
    pub fn reserve_limit(
        &self,
        env: Env,
        key: String,
        limit: &NativeLimit,
        estimate: f64,
    ) -> Result<Unknown<'static>> {
        self.units_call(
            &env,
            key,
            calls::ad_hoc(limit),
            ("estimate", estimate),
            |l, k, p, n| async move { l.reserve(&k, &p, n).await },
            |env, (d, r)| reservation_obj(env, d, r),
        )
    }

    /// Settles a reservation of an ad-hoc limit.
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn settle_limit(
        &self,
        env: Env,
        reservation: Reservation,
        limit: &NativeLimit,
        actual: f64,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        let p = limit.policy.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let r = reservation_of(reservation)?;
                let actual = units("actual", actual)?;
                me.settle_with(&p, &r, actual).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }
}

fn reservation_obj(
    env: &Env,
    d: shardlimit::Decision,
    r: Option<shardlimit::Reservation>,
) -> Result<Object<'static>> {
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
}

fn reservation_of(r: Reservation) -> shardlimit::Result<shardlimit::Reservation> {
    Ok(shardlimit::Reservation {
        units: units("reservation.units", r.units)?,
        at_us: units("reservation.atUs", r.at_us)?,
        key: r.key,
        policy: r.policy,
    })
}
