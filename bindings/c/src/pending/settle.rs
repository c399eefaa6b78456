//! Charge, refund and reserve-and-settle: blocking calls and their `_start` forms.

use super::*;
use shardlimit::Reservation;

/// Units reserved by `shardlimit_reserve()`, to settle with `shardlimit_settle()` once the
/// actual cost is known (each reservation once). A plain value the caller allocates and
/// keeps (copy it freely); nothing inside it needs freeing. The key and policy are not in
/// it: settle with the same key and policy as the reserve.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct shardlimit_reservation {
    /// True when units were reserved (the reserve was allowed by Redis or the in-memory
    /// engine); false when denied or decided by `on_error`: then there is nothing to settle.
    pub reserved: bool,
    /// The units reserved.
    pub units: u64,
    /// When they were recorded (µs, on the engine's clock): where settle gives the unused
    /// part back to.
    pub at_us: u64,
}

fn reservation_to_c(r: Option<&Reservation>) -> shardlimit_reservation {
    match r {
        Some(r) => shardlimit_reservation {
            reserved: true,
            units: r.units,
            at_us: r.at_us,
        },
        None => shardlimit_reservation::default(),
    }
}

fn reservation_arg(
    p: *const shardlimit_reservation,
    key: &str,
    policy: &Policy,
) -> Result<Reservation, Error> {
    let r = ref_arg("reservation", p)?;
    if !r.reserved {
        return Err(invalid(
            "reservation",
            "has reserved == false: a denied reserve has nothing to settle",
        ));
    }
    Ok(Reservation {
        key: key.to_string(),
        policy: policy.name().to_string(),
        units: r.units,
        at_us: r.at_us,
    })
}

/// Consumes `cost` (≥ 1) units of `policy` for `key` without ever denying: the key may go
/// into debt (capped at one limit), and later checks are denied until it is repaid. On
/// success `*out` is filled: always allowed, `remaining` (0 in debt) and `reset_after_us`
/// describe the key after the charge. A concurrency policy is INVALID_ARGUMENT (use
/// acquire and release). A backend failure is an error (nothing was charged).
/// Blocks for at most the configured deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_charge(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    cost: u64,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    decide_blocking(
        limiter,
        key,
        key_len,
        policy,
        cost,
        out,
        err,
        Limiter::charge_blocking,
    )
}

/// Gives `cost` (≥ 1) units of `policy` back to `key`, never above its limit (a full
/// budget stays full). `*out` as `shardlimit_charge()`'s. Blocks for at most the configured
/// deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_refund(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    cost: u64,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    decide_blocking(
        limiter,
        key,
        key_len,
        policy,
        cost,
        out,
        err,
        Limiter::refund_blocking,
    )
}

/// A check of an estimated cost (`estimate` ≥ 1 units) that can be settled later: on
/// success `*out` is the check's decision and `*out_reservation` (caller-allocated) says
/// what was reserved (`reserved` false when denied). Blocks for at most the configured
/// deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_reserve(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    estimate: u64,
    out: *mut shardlimit_decision,
    out_reservation: *mut shardlimit_reservation,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Blocking, limiter, key, key_len, policy)?;
        let out = out_arg("out", out)?;
        let out_reservation = out_arg("out_reservation", out_reservation)?;
        let (d, r) = l.reserve_blocking(key, &p, estimate)?;
        let d = decision_to_c(&d)?;
        out.write(d);
        out_reservation.write(reservation_to_c(r.as_ref()));
        Ok(())
    })
}

/// Settles a reservation of `shardlimit_reserve()` (made with the same key and policy) at
/// its `actual` cost (0 gives it all back): the unused part goes back to the window that
/// admitted it, the excess is charged. `*out` as `shardlimit_charge()`'s. Blocks for at
/// most the configured deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_settle(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    reservation: *const shardlimit_reservation,
    actual: u64,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Blocking, limiter, key, key_len, policy)?;
        let r = reservation_arg(reservation, key, &p)?;
        let out = out_arg("out", out)?;
        let d = decision_to_c(&l.settle_with_blocking(&p, &r, actual)?)?;
        out.write(d);
        Ok(())
    })
}

/// `shardlimit_charge()` that returns at once (see `shardlimit_check_start()`); read the
/// decision with `shardlimit_pending_decision()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_charge_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    cost: u64,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    start_decision(
        limiter,
        key,
        key_len,
        policy,
        cost,
        (callback, user, out_pending),
        err,
        |me, key, p, cost| async move { me.charge(&key, &p, cost).await },
    )
}

/// `shardlimit_refund()` that returns at once (see `shardlimit_check_start()`); read the
/// decision with `shardlimit_pending_decision()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_refund_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    cost: u64,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    start_decision(
        limiter,
        key,
        key_len,
        policy,
        cost,
        (callback, user, out_pending),
        err,
        |me, key, p, cost| async move { me.refund(&key, &p, cost).await },
    )
}

/// `shardlimit_reserve()` that returns at once (see `shardlimit_check_start()`); read the
/// decision and the reservation with `shardlimit_pending_reserved()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_reserve_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    estimate: u64,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Start, limiter, key, key_len, policy)?;
        let (me, key) = (l.clone(), owned_key(key));
        start(l, callback, user, out_pending, async move {
            let (d, r) = me.reserve(&key, &p, estimate).await?;
            Ok(Outcome::Reserved(d, reservation_to_c(r.as_ref())))
        })
    })
}

/// `shardlimit_settle()` that returns at once (see `shardlimit_check_start()`); the
/// reservation is copied. Read the decision with `shardlimit_pending_decision()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_settle_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    reservation: *const shardlimit_reservation,
    actual: u64,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Start, limiter, key, key_len, policy)?;
        let r = reservation_arg(reservation, key, &p)?;
        let me = l.clone();
        start(l, callback, user, out_pending, async move {
            Ok(Outcome::Decision(me.settle_with(&p, &r, actual).await?))
        })
    })
}

/// The decision and reservation of a completed `shardlimit_reserve_start()`: on success
/// `*out` and `*out_reservation` are filled. The call's own error otherwise;
/// INVALID_ARGUMENT when it has not completed or is another kind of call. May be read more
/// than once. Thread-safe. `err` may be NULL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_pending_reserved(
    pending: *const shardlimit_pending,
    out: *mut shardlimit_decision,
    out_reservation: *mut shardlimit_reservation,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let out = out_arg("out", out)?;
        let out_reservation = out_arg("out_reservation", out_reservation)?;
        let (d, r) = with_outcome(pending, |o| match o {
            Outcome::Reserved(d, r) => Ok((decision_to_c(d)?, *r)),
            o => Err(wrong_kind(o, "reservation")),
        })?;
        out.write(d);
        out_reservation.write(r);
        Ok(())
    })
}
