//! Charge, refund, and reserve-and-settle: costs known only after the request (tokens,
//! bytes, compute), one script call each on Redis, the same books in memory
//! (`engine/settle.rs`, `core/lua/settle.lua`).

use super::layered::{describe, layer_reqs, LayeredOut};
use super::override_retry::{InForce, OverrideRetry};
use super::{Engine, Layer, Limiter, View};
use crate::decision::{Decision, Source};
use crate::engine::outcome::Outcome;
use crate::engine::redis::{LayeredTail, MultiSettled, RedisEngine, SettleCall, Settled};
use crate::engine::settle::SettleOp;
use crate::engine::CallMode;
use crate::error::{Error, Result};
use crate::key::validate_key;
use crate::metrics::PolicyCounters;
use crate::policy::{Algorithm, Compiled, Policy};
use crate::routing::shard_index;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The largest `at_us` a reservation may carry (Lua's doubles are exact below 2^53).
const MAX_AT_US: u64 = 1 << 53;

/// Units reserved by [`Limiter::reserve`]: settle them with [`Limiter::settle`] once the
/// actual cost is known (each reservation once). It carries what settle needs: when the
/// units were recorded, so that unused units go back to the window (or sliding-log entry)
/// that admitted them and not to a later one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub key: String,
    pub policy: String,
    /// Units reserved.
    pub units: u64,
    /// When they were recorded, µs on the engine's clock (Redis `TIME`, or the limiter's).
    pub at_us: u64,
}

impl Limiter {
    /// Consumes `cost` units of `policy` for `key` without ever denying: the key may go
    /// into debt, and later checks are denied (with an exact `retry_after`) until it is
    /// repaid. A key's debt is capped at one limit (it never holds more than twice its
    /// limit), so one huge charge cannot lock it out for more than about two periods.
    /// The decision is always allowed; `remaining` and `reset_after` describe the key
    /// after the charge (`remaining` 0 while in debt). A backend failure is an error (no
    /// `on_error` decision: nothing was charged). On a multi-limit policy every limit is
    /// charged (each may go into debt) and the decision describes the tightest; on a
    /// policy with overrides, the key's limits in force are charged (its override's, one
    /// or several, else the policy's).
    pub async fn charge(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision> {
        self.units_call(key, policy, cost, SettleOp::Charge, |c| &c.charged_units)
            .await
    }

    /// Gives `cost` units of `policy` back to `key`, never above its limit (a full budget
    /// stays full): units of the current window (fixed and sliding window), the newest
    /// units (sliding log, at most 64 entries), or the bucket's level; on a multi-limit
    /// policy, in every limit. The decision is as [`Limiter::charge`]'s.
    pub async fn refund(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision> {
        self.units_call(key, policy, cost, SettleOp::Refund, |c| &c.refunded_units)
            .await
    }

    /// A charge or a refund of `cost` units (`op`, bounded by twice the limit in force),
    /// counted in the policy's `counter`.
    async fn units_call(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        op: fn(u64) -> SettleOp,
        counter: fn(&PolicyCounters) -> &AtomicU64,
    ) -> Result<Decision> {
        settle_checked(key, policy)?;
        positive(cost)?;
        let (d, ran) = self
            .settle_run(key, policy, &|eff| Ok(op(cost.min(2 * eff.limit))))
            .await?;
        self.with_counters(policy.name(), |c| {
            counter(c).fetch_add(ran.args().1, Ordering::Relaxed);
        });
        Ok(d)
    }

    /// A check of an estimated cost that can be settled later: the decision of a check of
    /// `estimate` units and, when it was allowed (by Redis or the in-memory engine, not
    /// by `on_error`), the [`Reservation`] to settle with the actual cost. With several
    /// limits in force (a multi-limit policy, or a key's override of several limits) it is
    /// their all-or-nothing check, and the reservation settles in every limit in force
    /// when it is settled.
    pub async fn reserve(
        &self,
        key: &str,
        policy: &Policy,
        estimate: u64,
    ) -> Result<(Decision, Option<Reservation>)> {
        settle_checked(key, policy)?;
        positive(estimate)?;
        if let (Some(parts), false) = (policy.parts(), policy.overrides()) {
            return self
                .reserve_multi(key, policy, policy, parts, estimate, None)
                .await?
                .done();
        }
        let base = policy;
        let view = self.view();
        let (d, at, eff, cost) = match &view.engine {
            Engine::Memory(m) => {
                let now = self.now();
                let ov = self.memory_override(&base.0, key, now);
                let (policy, scope) = match &ov {
                    Some((a, _)) => (&a.policy, &a.memory_scope),
                    None => (base, &base.0.scope),
                };
                if let Some(parts) = policy.parts() {
                    // several limits in force: their all-or-nothing check
                    policy.follow_scale(base);
                    return self
                        .reserve_multi(key, base, policy, parts, estimate, None)
                        .await?
                        .done();
                }
                let p = &*policy.0;
                let eff = p.effective(self.global_scale());
                // as a check: a cost above the limit is denied with no retry_after
                let cost = estimate.min(eff.limit + 1);
                let raw = m.check(
                    scope,
                    &eff,
                    key,
                    now,
                    cost,
                    CallMode::Check,
                    p.auto_block.as_ref(),
                );
                let d = self.finish(p, &eff, key, raw, Source::Memory, None);
                (d, now, eff, cost)
            }
            Engine::Redis(r) => {
                let (shard, now, mut in_force, mut retry) =
                    self.redis_start(&view, r, base, key).await;
                let name = &r.shards[shard as usize].name;
                loop {
                    let policy = in_force.policy(base);
                    if let Some(parts) = policy.parts() {
                        // several limits in force (the policy's, or the key's override):
                        // their all-or-nothing check, the override version compared first
                        let tail = in_force.tail(base, key, false);
                        match self
                            .reserve_multi(key, base, policy, parts, estimate, Some(&tail))
                            .await?
                        {
                            Multi::Done(out) => return Ok(out),
                            Multi::Override(v) => {
                                in_force = retry.learn(self, (base, key), name, &v)?;
                                continue;
                            }
                        }
                    }
                    let p = &*policy.0;
                    let eff = p.effective(self.global_scale());
                    let cost = estimate.min(eff.limit + 1);
                    let call = SettleCall::Reserve(cost);
                    match r
                        .settle_call(shard as usize, p, &eff, key, call, now, in_force.ov)
                        .await
                    {
                        Ok(Settled::Done(raw, now)) => {
                            let d = self.finish(p, &eff, key, raw, Source::Redis, Some(shard));
                            break (d, now, eff, cost);
                        }
                        Ok(Settled::Override(v)) => {
                            in_force = retry.learn(self, (base, key), name, &v)?;
                        }
                        Err(e) if e.is_backend() => {
                            let d = self.fallback(p, &eff, key, cost, CallMode::Check, e)?;
                            self.count(&p.name, &d);
                            return Ok((d, None));
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        };
        self.count(base.name(), &d);
        let reservation =
            (d.allowed && matches!(d.source, Source::Redis | Source::Memory)).then(|| {
                // a sliding log records its entry at `at + reset - window` (never before `at`)
                let at_us = if eff.algorithm == Algorithm::SlidingLog {
                    (at + d.reset_after.as_micros() as u64).saturating_sub(eff.period_us)
                } else {
                    at
                };
                Reservation {
                    key: key.to_string(),
                    policy: base.name().to_string(),
                    units: cost,
                    at_us,
                }
            });
        Ok((d, reservation))
    }

    /// Settles a [`Reservation`] at its `actual` cost (0 gives everything back): the unused
    /// part goes back to the window that admitted it (nothing once that window no longer
    /// counts; on a sliding log, to its entry while at most 256 entries came after it,
    /// else the units stay counted until the entry expires), the excess is charged as by
    /// [`Limiter::charge`]. The decision is as [`Limiter::charge`]'s.
    pub async fn settle(&self, reservation: &Reservation, actual: u64) -> Result<Decision> {
        let policy = self.policy(&reservation.policy)?;
        self.settle_with(&policy, reservation, actual).await
    }

    /// [`Limiter::settle`] of a reservation of an ad-hoc policy.
    pub async fn settle_with(
        &self,
        policy: &Policy,
        reservation: &Reservation,
        actual: u64,
    ) -> Result<Decision> {
        let r = reservation;
        if r.units == 0 {
            return Err(Error::invalid(
                "reservation.units",
                "must be at least 1, as reserve returns it",
            ));
        }
        settle_checked(&r.key, policy)?;
        if r.policy != policy.name() {
            return Err(Error::invalid(
                "reservation.policy",
                format!(
                    "is {:?}, not the policy {:?} it is settled with",
                    r.policy,
                    policy.name()
                ),
            ));
        }
        if r.at_us >= MAX_AT_US {
            return Err(Error::invalid(
                "reservation.at_us",
                format!("must be below 2^53, got {}", r.at_us),
            ));
        }
        let base_limit = policy.0.compiled.limit;
        let overrides = policy.overrides();
        let (d, op) = self
            .settle_run(&r.key, policy, &|eff| {
                // (the limit in force: the policy's, the key's override, or for a
                // multi-limit policy its largest; under overrides, the one the units were
                // reserved under may have changed since, so any limit shardlimit accepts:
                // what a give-back returns is bounded by what the state holds)
                let most = if overrides {
                    crate::policy::MAX_LIMIT
                } else {
                    eff.limit.max(base_limit)
                };
                if r.units > most {
                    return Err(Error::invalid(
                        "reservation.units",
                        format!(
                            "must be between 1 and the policy's limit {most}, got {}",
                            r.units
                        ),
                    ));
                }
                Ok(SettleOp::Settle {
                    reserved: r.units,
                    actual: actual.min(r.units + 2 * eff.limit),
                    at: r.at_us,
                })
            })
            .await?;
        let (_, _, actual, _) = op.args();
        self.with_counters(policy.name(), |c| {
            if actual > r.units {
                c.charged_units
                    .fetch_add(actual - r.units, Ordering::Relaxed);
            } else {
                c.refunded_units
                    .fetch_add(r.units - actual, Ordering::Relaxed);
            }
        });
        Ok(d)
    }

    /// What a reserve or a settle on Redis starts from: the key's shard (its state carried
    /// over first while a resharding hand-off runs), the injected clock, and the override
    /// this process knows, with a fresh retry count.
    async fn redis_start(
        &self,
        view: &View,
        r: &Arc<RedisEngine>,
        base: &Policy,
        key: &str,
    ) -> (u32, Option<u64>, InForce, OverrideRetry) {
        let shard = shard_index(key, r.shards.len() as u32);
        if let Some(h) = &view.handoff {
            self.carry_over(h, r, &base.0, key, shard as usize).await;
        }
        let now = self.now_override();
        (
            shard,
            now,
            self.override_arg(&base.0, key),
            OverrideRetry::default(),
        )
    }

    /// Runs a charge, refund or settle on the engine, the op built by `mk` for the limit
    /// in force (the key's override if it has one): a decision that always allows, and
    /// the op as it ran.
    async fn settle_run(
        &self,
        key: &str,
        base: &Policy,
        mk: &(dyn Fn(&Compiled) -> Result<SettleOp> + Sync),
    ) -> Result<(Decision, SettleOp)> {
        if let (Some(parts), false) = (base.parts(), base.overrides()) {
            return self.settle_multi(key, base, parts, mk, None).await?.done();
        }
        let view = self.view();
        match &view.engine {
            Engine::Memory(m) => {
                let now = self.now();
                let ov = self.memory_override(&base.0, key, now);
                let (policy, scope) = match &ov {
                    Some((a, _)) => (&a.policy, &a.memory_scope),
                    None => (base, &base.0.scope),
                };
                if let Some(parts) = policy.parts() {
                    // several limits in force: the op in each of them
                    policy.follow_scale(base);
                    return self.settle_multi(key, base, parts, mk, None).await?.done();
                }
                let eff = policy.0.effective(self.global_scale());
                let op = mk(&eff)?;
                let o = m.settle(scope, &eff, key, now, op);
                Ok((self.decision(&policy.0, &eff, o, Source::Memory, None), op))
            }
            Engine::Redis(r) => {
                let (shard, now, mut in_force, mut retry) =
                    self.redis_start(&view, r, base, key).await;
                let name = &r.shards[shard as usize].name;
                loop {
                    let policy = in_force.policy(base);
                    if let Some(parts) = policy.parts() {
                        // several limits in force (the policy's, or the key's override):
                        // one multi-limit script call, the override version compared first
                        let tail = in_force.tail(base, key, false);
                        match self.settle_multi(key, base, parts, mk, Some(&tail)).await? {
                            Multi::Done(out) => return Ok(out),
                            Multi::Override(v) => {
                                in_force = retry.learn(self, (base, key), name, &v)?;
                                continue;
                            }
                        }
                    }
                    let p = &*policy.0;
                    let eff = p.effective(self.global_scale());
                    let op = mk(&eff)?;
                    let call = SettleCall::Op(op);
                    match r
                        .settle_call(shard as usize, p, &eff, key, call, now, in_force.ov)
                        .await
                    {
                        Ok(Settled::Done(raw, _)) => {
                            let d = self.decision(p, &eff, raw.outcome, Source::Redis, Some(shard));
                            return Ok((d, op));
                        }
                        Ok(Settled::Override(v)) => {
                            in_force = retry.learn(self, (base, key), name, &v)?;
                        }
                        Err(e) => {
                            if e.is_backend() {
                                self.with_counters(&p.name, |c| {
                                    c.redis_errors.fetch_add(1, Ordering::Relaxed);
                                });
                            }
                            return Err(e);
                        }
                    }
                }
            }
        }
    }

    /// A charge, refund or settle of several limits in force (`parts`: a multi-limit
    /// policy's, or the limits of `base`'s override for `key`): the op in every limit
    /// (each capped at twice its own limit), in one script call on the key's shard (with
    /// `tail`, the override version compared first); the decision describes the limit
    /// with the fewest units left (the one in debt).
    async fn settle_multi(
        &self,
        key: &str,
        base: &Policy,
        parts: &[Policy],
        mk: &(dyn Fn(&Compiled) -> Result<SettleOp> + Sync),
        tail: Option<&LayeredTail<'_>>,
    ) -> Result<Multi<(Decision, SettleOp)>> {
        let global = self.global_scale();
        let effs: Vec<Compiled> = parts.iter().map(|p| p.0.effective(global)).collect();
        let widest = effs
            .iter()
            .max_by_key(|e| e.limit)
            .expect("a multi-limit policy holds limits");
        let op = mk(widest)?;
        let ops: Vec<SettleOp> = effs.iter().map(|e| op.capped(2 * e.limit)).collect();
        let view = self.view();
        let (outcomes, source, shard): (Vec<Outcome>, _, _) = match &view.engine {
            Engine::Memory(m) => {
                let now = self.now();
                let o = parts
                    .iter()
                    .enumerate()
                    .map(|(i, p)| m.settle(&p.0.scope, &effs[i], key, now, ops[i]))
                    .collect();
                (o, Source::Memory, None)
            }
            Engine::Redis(r) => {
                let shard = shard_index(key, r.shards.len() as u32);
                if let Some(h) = &view.handoff {
                    for p in parts {
                        self.carry_over(h, r, &p.0, key, shard as usize).await;
                    }
                }
                let now = self.now_override();
                let limits: Vec<(&str, Compiled, SettleOp)> = parts
                    .iter()
                    .enumerate()
                    .map(|(i, p)| (p.0.key_scope.as_str(), effs[i], ops[i]))
                    .collect();
                match r
                    .settle_multi(shard as usize, key, &limits, now, tail)
                    .await
                {
                    Ok(MultiSettled::Done(o)) => (o, Source::Redis, Some(shard)),
                    Ok(MultiSettled::Override(v)) => return Ok(Multi::Override(v)),
                    Err(e) => {
                        if e.is_backend() {
                            self.with_counters(base.name(), |c| {
                                c.redis_errors.fetch_add(1, Ordering::Relaxed);
                            });
                        }
                        return Err(e);
                    }
                }
            }
        };
        let idx = (0..outcomes.len())
            .min_by_key(|i| outcomes[*i].remaining)
            .unwrap_or(0);
        let mut d = self.decision(&parts[idx].0, &effs[idx], outcomes[idx], source, shard);
        let origin: Vec<(usize, Option<usize>)> = (0..parts.len()).map(|i| (0, Some(i))).collect();
        describe(&mut d, idx, &origin, &effs, true);
        Ok(Multi::Done((d, op)))
    }

    /// [`Limiter::reserve`] of several limits in force (`parts` of `policy`: `base` itself,
    /// a multi-limit policy, or its override for `key`): their all-or-nothing check (one
    /// script call on the key's shard, with `tail` the override version compared first),
    /// and the time it was decided at for the reservation.
    async fn reserve_multi(
        &self,
        key: &str,
        base: &Policy,
        policy: &Policy,
        parts: &[Policy],
        estimate: u64,
        tail: Option<&LayeredTail<'_>>,
    ) -> Result<Multi<(Decision, Option<Reservation>)>> {
        let layers: Vec<Layer> = parts.iter().map(|p| Layer::new(key, p, estimate)).collect();
        let origin: Vec<(usize, Option<usize>)> = (0..parts.len()).map(|i| (0, Some(i))).collect();
        let originals = [Layer::new(key, policy, estimate)];
        let effs = self.layer_limits(&layers);
        let reqs = layer_reqs(&layers, &effs);
        let view = self.view();
        let n = layers.len();
        let (raw, sources, shards) = match &view.engine {
            Engine::Memory(m) => (
                m.check_layers(&reqs, self.now()),
                vec![Source::Memory; n],
                vec![None; n],
            ),
            Engine::Redis(r) => {
                let shard = shard_index(key, r.shards.len() as u32);
                if let Some(h) = &view.handoff {
                    for p in parts {
                        self.carry_over(h, r, &p.0, key, shard as usize).await;
                    }
                }
                let shard_of = vec![shard as usize; n];
                let (raw, sources) = match self
                    .layered_redis(r, &layers, &reqs, &shard_of, tail)
                    .await?
                {
                    LayeredOut::Raw(raw, sources) => (raw, sources),
                    LayeredOut::Override(v) if tail.is_some() => return Ok(Multi::Override(v)),
                    LayeredOut::Override(_) => {
                        return Err(Error::Internal(
                            "a layered call without overrides answered with an override".into(),
                        ))
                    }
                };
                (raw, sources, vec![Some(shard); n])
            }
        };
        let at = raw.now;
        let d = self.conclude(
            &layers, &origin, &originals, true, &effs, raw, &sources, &shards, false,
        );
        // (every limit admitted `estimate` units at `at`: each settles into its window of
        // `at`; a sliding-log limit gives back to its entry of `at`, when it recorded it
        // there, else its units stay counted until the entry expires)
        let reservation =
            (d.allowed && matches!(d.source, Source::Redis | Source::Memory)).then(|| {
                Reservation {
                    key: key.to_string(),
                    policy: base.name().to_string(),
                    units: estimate,
                    at_us: at,
                }
            });
        Ok(Multi::Done((d, reservation)))
    }
}

/// What an op on several limits in force found: its result, or the key's override entry
/// when it is not the one the call was made with (nothing done: learn it and retry).
enum Multi<T> {
    Done(T),
    Override(Vec<u8>),
}

impl<T> Multi<T> {
    /// The result of a call that read no override entry.
    fn done(self) -> Result<T> {
        match self {
            Multi::Done(t) => Ok(t),
            Multi::Override(_) => Err(Error::Internal(
                "an override entry in the reply of a settle call that read none".into(),
            )),
        }
    }
}

/// The key, and the policy: every policy but a concurrency one (it has leases).
fn settle_checked(key: &str, policy: &Policy) -> Result<()> {
    validate_key(key)?;
    if policy.algorithm() == Algorithm::Concurrency {
        return Err(Error::invalid(
            "policy",
            format!(
                "{} is a concurrency policy: charge, refund, reserve and settle do not apply to leases; use acquire and release",
                policy.name()
            ),
        ));
    }
    Ok(())
}

fn positive(cost: u64) -> Result<()> {
    if cost == 0 {
        return Err(Error::invalid("cost", "must be at least 1"));
    }
    Ok(())
}
