//! Charge, refund, and reserve-and-settle: costs known only after the request (tokens,
//! bytes, compute), one script call each on Redis, the same books in memory
//! (`engine/settle.rs`, `core/lua/settle.lua`).

use super::check::validate_key;
use super::{Engine, Limiter};
use crate::decision::{Decision, Source};
use crate::engine::memory::Raw;
use crate::engine::redis::SettleCall;
use crate::engine::settle::SettleOp;
use crate::error::{Error, Result};
use crate::policy::{Algorithm, Compiled, Policy, WindowOffset};
use crate::routing::shard_index;
use std::sync::atomic::Ordering;

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
    /// `on_error` decision: nothing was charged).
    pub async fn charge(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision> {
        let eff = self.settle_prepare(key, policy, "charge", cost)?;
        let cost = cost.min(2 * eff.limit);
        let d = self
            .settle_run(key, policy, eff, SettleOp::Charge(cost))
            .await?;
        self.with_counters(policy.name(), |c| {
            c.charged_units.fetch_add(cost, Ordering::Relaxed);
        });
        Ok(d)
    }

    /// Gives `cost` units of `policy` back to `key`, never above its limit (a full budget
    /// stays full): units of the current window (fixed and sliding window), the newest
    /// units (sliding log, at most 64 entries), or the bucket's level. The decision is as
    /// [`Limiter::charge`]'s.
    pub async fn refund(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision> {
        let eff = self.settle_prepare(key, policy, "refund", cost)?;
        let cost = cost.min(2 * eff.limit);
        let d = self
            .settle_run(key, policy, eff, SettleOp::Refund(cost))
            .await?;
        self.with_counters(policy.name(), |c| {
            c.refunded_units.fetch_add(cost, Ordering::Relaxed);
        });
        Ok(d)
    }

    /// A check of an estimated cost that can be settled later: the decision of a check of
    /// `estimate` units and, when it was allowed (by Redis or the in-memory engine, not
    /// by `on_error`), the [`Reservation`] to settle with the actual cost.
    pub async fn reserve(
        &self,
        key: &str,
        policy: &Policy,
        estimate: u64,
    ) -> Result<(Decision, Option<Reservation>)> {
        let eff = self.settle_prepare(key, policy, "reserve", estimate)?;
        // as a check: a cost above the limit is denied with no retry_after
        let cost = estimate.min(eff.limit + 1);
        let p = &*policy.0;
        let (d, at) = match &self.view().engine {
            Engine::Memory(m) => {
                let now = self.now();
                let raw = m.check(
                    &p.name,
                    &eff,
                    key,
                    now,
                    cost,
                    false,
                    "",
                    p.auto_block.as_ref(),
                );
                (self.finish(p, &eff, key, raw, Source::Memory, None), now)
            }
            Engine::Redis(r) => {
                let shard = shard_index(key, r.shards.len() as u32);
                if let Some(h) = &self.view().handoff {
                    self.carry_over(h, r, p, key, shard as usize).await;
                }
                let call = SettleCall::Reserve(cost);
                let now = self.now_override();
                match r.settle_call(shard as usize, p, &eff, key, call, now).await {
                    Ok((raw, now)) => (
                        self.finish(p, &eff, key, raw, Source::Redis, Some(shard)),
                        now,
                    ),
                    Err(e) if e.is_backend() => {
                        let d = self.fallback(p, &eff, key, cost, false, e)?;
                        self.count(&p.name, &d);
                        return Ok((d, None));
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        self.count(&p.name, &d);
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
                    policy: p.name.to_string(),
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
        let eff = self.settle_prepare(&r.key, policy, "settle", r.units)?;
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
        if r.units > eff.limit.max(policy.0.compiled.limit) {
            return Err(Error::invalid(
                "reservation.units",
                format!(
                    "must be between 1 and the policy's limit {}, got {}",
                    policy.0.compiled.limit, r.units
                ),
            ));
        }
        if r.at_us >= MAX_AT_US {
            return Err(Error::invalid(
                "reservation.at_us",
                format!("must be below 2^53, got {}", r.at_us),
            ));
        }
        let actual = actual.min(r.units + 2 * eff.limit);
        let op = SettleOp::Settle {
            reserved: r.units,
            actual,
            at: r.at_us,
        };
        let d = self.settle_run(&r.key, policy, eff, op).await?;
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

    /// The key, the policy (no concurrency: it has leases) and the limit in force.
    fn settle_checked(&self, key: &str, policy: &Policy, op: &str) -> Result<Compiled> {
        validate_key(key)?;
        if policy.algorithm() == Algorithm::Concurrency {
            return Err(Error::invalid(
                "policy",
                format!(
                    "{} is a concurrency policy: {op} does not apply to leases; use acquire and release",
                    policy.name()
                ),
            ));
        }
        // (what the settle scripts do not handle yet is refused, never misread: their
        // state layouts are those of whole-µs buckets and aligned windows of one limit)
        if policy.is_multi() {
            return Err(Error::invalid(
                "policy",
                format!(
                    "{} holds several limits: {op} applies to a policy of one limit for now",
                    policy.name()
                ),
            ));
        }
        if policy.overrides() {
            return Err(Error::invalid(
                "policy",
                format!(
                    "{} takes per-key overrides: {op} applies to policies without them for now",
                    policy.name()
                ),
            ));
        }
        let c = &policy.0.compiled;
        if c.window_offset != WindowOffset::None {
            return Err(Error::invalid(
                "policy",
                format!(
                    "{} has window_offset per_key: {op} does not apply to offset windows yet",
                    policy.name()
                ),
            ));
        }
        let eff = policy.0.effective(self.global_scale());
        if eff.period_den != 1 {
            return Err(Error::invalid(
                "policy",
                format!(
                    "{} refills at an exact fractional rate: {op} applies to whole-microsecond refill intervals for now",
                    policy.name()
                ),
            ));
        }
        Ok(eff)
    }

    fn settle_prepare(&self, key: &str, policy: &Policy, op: &str, cost: u64) -> Result<Compiled> {
        let eff = self.settle_checked(key, policy, op)?;
        if cost == 0 {
            return Err(Error::invalid("cost", "must be at least 1"));
        }
        Ok(eff)
    }

    /// Runs a charge, refund or settle on the engine: a decision that always allows.
    async fn settle_run(
        &self,
        key: &str,
        policy: &Policy,
        eff: Compiled,
        op: SettleOp,
    ) -> Result<Decision> {
        let p = &*policy.0;
        let view = self.view();
        let (raw, source, shard) = match &view.engine {
            Engine::Memory(m) => {
                let o = m.settle(&p.name, &eff, key, self.now(), op);
                (
                    Raw {
                        outcome: o,
                        blocked: crate::engine::memory::BlockVerdict::Clear,
                        granted: 0,
                    },
                    Source::Memory,
                    None,
                )
            }
            Engine::Redis(r) => {
                let shard = shard_index(key, r.shards.len() as u32);
                if let Some(h) = &view.handoff {
                    self.carry_over(h, r, p, key, shard as usize).await;
                }
                let now = self.now_override();
                match r
                    .settle_call(shard as usize, p, &eff, key, SettleCall::Op(op), now)
                    .await
                {
                    Ok((raw, _)) => (raw, Source::Redis, Some(shard)),
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
        };
        Ok(self.decision(p, &eff, raw.outcome, source, shard))
    }
}
