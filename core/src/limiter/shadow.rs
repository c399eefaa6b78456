//! Shadow mode and near-limit events.
//!
//! Shadow: the check runs; a would-be denial is allowed, consumes nothing (a denied check
//! never does), never counts toward automatic blocking, and is reported: the decision's
//! `shadow_denied`, an event, the `shadow_denied` metric and the shadow counts (in Redis,
//! in the same script call; in process on the in-memory engine). Block-list denials and
//! `on_error` fallbacks are not shadowed.
//!
//! Near-limit: an allowed check whose usage crosses `ceil(near_limit × limit)` units from
//! below emits one event and counts the `near_limit` metric.

use super::{Engine, Limiter};
use crate::decision::{Decision, Source};
use crate::engine::memory::MemoryEngine;
use crate::engine::outcome::Raw;
use crate::engine::redis::{SHADOW_MAX_KEYS, SHADOW_TTL};
use crate::engine::CallMode;
use crate::error::{Error, Result};
use crate::events::Event;
use crate::policy::{Compiled, Policy, PolicyInner};
use crate::Layer;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Shadow-mode denials of one policy, summed over every shard (or the in-memory engine).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ShadowReport {
    pub policy: String,
    /// Every shadow denial counted (the keys listed, those cut by `top`, and `untracked`).
    pub total: u64,
    /// (key, shadow denials), most first (ties by key), at most `top` of them.
    pub keys: Vec<(String, u64)>,
    /// Denials of keys beyond the bound of 1000 keys per policy per shard, not counted by
    /// key.
    pub untracked: u64,
}

impl ShadowReport {
    /// `{"policy", "total", "untracked", "keys": [{"key", "count"}]}`, as the CLI prints it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "policy": self.policy,
            "total": self.total,
            "untracked": self.untracked,
            "keys": self.keys.iter().map(|(k, n)| serde_json::json!({"key": k, "count": n})).collect::<Vec<_>>(),
        })
    }

    fn build(
        policy: &str,
        counts: HashMap<String, u64>,
        untracked: u64,
        top: Option<usize>,
    ) -> Self {
        let total = counts.values().sum::<u64>() + untracked;
        let mut keys: Vec<(String, u64)> = counts.into_iter().collect();
        keys.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        if let Some(n) = top {
            keys.truncate(n);
        }
        ShadowReport {
            policy: policy.to_string(),
            total,
            keys,
            untracked,
        }
    }
}

/// The in-memory engine's shadow counts: per policy, at most [`SHADOW_MAX_KEYS`] keys (the
/// rest in `untracked`), forgotten [`SHADOW_TTL`] after the policy's last count, as the
/// Redis hash is.
#[derive(Debug, Default)]
pub(super) struct ShadowCounts(Mutex<HashMap<Arc<str>, PolicyShadow>>);

#[derive(Debug, Default)]
struct PolicyShadow {
    keys: HashMap<String, u64>,
    untracked: u64,
    last_us: u64,
}

/// Policies whose shadow counts one limiter keeps in process at most.
const MAX_SHADOW_POLICIES: usize = 10_000;

impl ShadowCounts {
    fn add(&self, policy: &Arc<str>, key: &str, now_us: u64) {
        let mut all = self.0.lock();
        if !all.contains_key(policy) && all.len() >= MAX_SHADOW_POLICIES {
            return;
        }
        let p = all.entry(policy.clone()).or_default();
        if now_us.saturating_sub(p.last_us) > SHADOW_TTL.as_micros() as u64 && p.last_us != 0 {
            *p = PolicyShadow::default();
        }
        p.last_us = now_us.max(1);
        let room = (p.keys.len() as u64) < SHADOW_MAX_KEYS;
        match p.keys.get_mut(key) {
            Some(n) => *n += 1,
            None if room => {
                p.keys.insert(key.to_string(), 1);
            }
            None => p.untracked += 1,
        }
    }

    fn report(&self, policy: &str, now_us: u64, top: Option<usize>) -> ShadowReport {
        let all = self.0.lock();
        match all.get(policy) {
            Some(p) if now_us.saturating_sub(p.last_us) <= SHADOW_TTL.as_micros() as u64 => {
                ShadowReport::build(policy, p.keys.clone(), p.untracked, top)
            }
            _ => ShadowReport::build(policy, HashMap::new(), 0, top),
        }
    }
}

impl Limiter {
    /// [`Limiter::check`] in shadow mode for this call, whatever the policy says: a check
    /// the limit would deny is allowed, consumes nothing and is reported
    /// (`decision.shadow_denied`). Block-list denials and `on_error` fallbacks are not
    /// shadowed. A concurrency policy is an `invalid_argument` error.
    pub async fn check_shadow(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision> {
        super::blocking::unleased(policy, "check_shadow")?;
        if policy.0.shadow {
            return self.check(key, policy, cost).await;
        }
        let shadowed = policy.with_shadow(true)?;
        self.check(key, &shadowed, cost).await
    }

    /// Blocking [`Limiter::check_shadow`].
    pub fn check_shadow_blocking(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision> {
        super::blocking::unleased(policy, "check_shadow")?;
        let shadowed = if policy.0.shadow {
            policy.clone()
        } else {
            policy.with_shadow(true)?
        };
        self.check_blocking(key, &shadowed, cost)
    }

    /// The shadow-mode denials of policy `policy` by key, summed over every shard (one
    /// `HGETALL` per shard), most first; `top` keeps that many keys. On the in-memory
    /// engine: this process's counts. Not available on a Redis Cluster (an
    /// `invalid_argument` error).
    pub async fn shadow_report(&self, policy: &str, top: Option<usize>) -> Result<ShadowReport> {
        crate::policy::validate_policy_name(policy, "policy")
            .map_err(|e| Error::invalid("policy", e.to_string()))?;
        let view = self.view();
        let r = match &view.engine {
            Engine::Memory(_) => return Ok(self.inner.shadow.report(policy, self.now(), top)),
            Engine::Redis(r) => r.clone(),
        };
        let calls = (0..r.shards.len()).map(|s| r.shadow_counts(s, policy));
        let mut counts: HashMap<String, u64> = HashMap::new();
        let mut untracked = 0u64;
        for res in futures_util::future::join_all(calls).await {
            let (keys, other) = res?;
            untracked = untracked.saturating_add(other);
            for (k, n) in keys {
                let e = counts.entry(k).or_default();
                *e = e.saturating_add(n);
            }
        }
        Ok(ShadowReport::build(policy, counts, untracked, top))
    }

    /// Blocking [`Limiter::shadow_report`].
    pub fn shadow_report_blocking(&self, policy: &str, top: Option<usize>) -> Result<ShadowReport> {
        let (me, policy) = (self.clone(), policy.to_string());
        self.block_on(async move { me.shadow_report(&policy, top).await })
    }

    /// A shadow check on the in-memory engine (from `check_memory`) of `policy`, the
    /// policy or the key's override of it, whose state is kept under `scope`.
    pub(super) fn shadow_memory(
        &self,
        m: &MemoryEngine,
        key: &str,
        policy: &Policy,
        scope: &Arc<str>,
        cost: u64,
    ) -> Result<Decision> {
        let (eff, cost) = self.prepare(key, policy, cost)?;
        let p = &*policy.0;
        let now = self.now();
        // no automatic blocking: a shadow denial must not enforce anything
        let raw = m.check(scope, &eff, key, now, cost, CallMode::Check, None);
        let d = self.finish_shadow(p, &eff, key, raw, Source::Memory, None);
        if d.shadow_denied {
            self.inner.shadow.add(&p.name, key, now);
        }
        self.count(&p.name, &d);
        self.near(p, key, cost, &d);
        Ok(d)
    }

    /// A shadow check on Redis after its script (`main_check.lua`'s shadow build, one
    /// round trip, which counted the denial), as `after_script` for a check.
    pub(super) fn after_shadow(
        &self,
        p: &PolicyInner,
        eff: &Compiled,
        key: &str,
        cost: u64,
        shard: u32,
        raw: Result<Raw>,
    ) -> Result<Decision> {
        let d = match raw {
            Ok(raw) => self.finish_shadow(p, eff, key, raw, Source::Redis, Some(shard)),
            // on_error decides, unshadowed: a fallback measured nothing to shadow
            Err(e) if e.is_backend() => self.fallback(p, eff, key, cost, CallMode::Check, e)?,
            Err(e) => return Err(e),
        };
        self.count(&p.name, &d);
        self.near(p, key, cost, &d);
        Ok(d)
    }

    /// The decision of a shadow check: a limit's denial becomes an allowed, shadow-denied
    /// decision with no `retry_after`; a block stays a block.
    fn finish_shadow(
        &self,
        p: &PolicyInner,
        eff: &Compiled,
        key: &str,
        raw: Raw,
        source: Source,
        shard: Option<u32>,
    ) -> Decision {
        if raw.blocked.is_blocked() || raw.outcome.allowed {
            return self.finish(p, eff, key, raw, source, shard);
        }
        let mut d = self.decision(p, eff, raw.outcome, source, shard);
        self.shadow_denial(p, key, &mut d);
        d
    }

    /// Makes the would-be denial `d` of a shadow check allowed, shadow-denied and without
    /// `retry_after`, and reports it (metric, event). The shadow counts are the caller's.
    pub(super) fn shadow_denial(&self, p: &PolicyInner, key: &str, d: &mut Decision) {
        d.allowed = true;
        d.retry_after = None;
        d.shadow_denied = true;
        self.with_counters(&p.name, |c| {
            c.shadow_denied.fetch_add(1, Ordering::Relaxed);
        });
        if self.wants_events() {
            let e = Event::ShadowDenied {
                policy: p.name.clone(),
                key: key.to_string(),
                decision: d.clone(),
            };
            self.publish(key, &e);
        }
    }

    /// Count one shadow denial of (policy, key) in process (the in-memory engine's counts).
    pub(super) fn count_shadow_memory(&self, policy: &std::sync::Arc<str>, key: &str) {
        self.inner.shadow.add(policy, key, self.now());
    }

    /// Whether an event would reach anyone: a subscriber, or the Redis event stream.
    fn wants_events(&self) -> bool {
        self.inner.subscribers.active()
            || (matches!(&self.view().engine, Engine::Redis(_))
                && self.view().config.events_stream_maxlen.is_some())
    }

    /// The near-limit event of an allowed check of `cost` units, when its usage crossed
    /// the policy's fraction: from below `ceil(f × limit)` units used to at or above it.
    /// Only measured, allowed decisions of the limit itself (not shadow denials, fallbacks,
    /// blocks or local admission).
    #[inline]
    pub(super) fn near(&self, p: &PolicyInner, key: &str, cost: u64, d: &Decision) {
        if !d.allowed || d.shadow_denied || !matches!(d.source, Source::Redis | Source::Memory) {
            return;
        }
        if crosses_near(p, d.limit, d.remaining, cost) {
            self.near_crossed(p, key, d);
        }
    }

    #[cold]
    pub(super) fn near_crossed(&self, p: &PolicyInner, key: &str, d: &Decision) {
        self.with_counters(&p.name, |c| {
            c.near_limit.fetch_add(1, Ordering::Relaxed);
        });
        if self.wants_events() {
            let e = Event::NearLimit {
                policy: p.name.clone(),
                key: key.to_string(),
                limit: d.limit,
                remaining: d.remaining,
            };
            self.publish(key, &e);
        }
    }

    /// A layered check with shadow layers. The enforced layers are decided first, as one
    /// layered check (atomic, none consumes when one denies); when they deny, that is the
    /// decision and the shadow layers are not checked. When they allow, each shadow layer
    /// is a shadow check of its own (its own round trip: it consumes when it allows, and a
    /// would-be denial consumes nothing and is counted). The decision describes the first
    /// shadow-denied layer (`shadow_denied`, allowed), else the layer with the fewest units
    /// remaining.
    pub(super) async fn check_all_shadowed(&self, layers: &[Layer]) -> Result<Decision> {
        let (shadow, enforced): (Vec<usize>, Vec<usize>) =
            (0..layers.len()).partition(|i| layers[*i].policy.0.shadow);
        let mut best: Option<Decision> = None;
        // each layer's own decision (see Decision::layers), in the caller's order
        let mut each: Vec<Option<Decision>> = vec![None; layers.len()];
        if !enforced.is_empty() {
            let sub: Vec<Layer> = enforced.iter().map(|i| layers[*i].clone()).collect();
            let mut d = self.check_all_enforced(&sub).await?;
            d.layer = d.layer.map(|i| enforced[i]);
            if !d.allowed {
                // the shadow layers were not asked: no layer-by-layer answer
                d.layers.clear();
                return Ok(d);
            }
            for (k, mut ld) in std::mem::take(&mut d.layers).into_iter().enumerate() {
                if let Some(&i) = enforced.get(k) {
                    ld.layer = Some(i);
                    each[i] = Some(ld);
                }
            }
            best = Some(d);
        }
        let mut denied: Option<Decision> = None;
        for i in shadow {
            let l = &layers[i];
            let mut d = Box::pin(self.check(&l.key, &l.policy, l.cost))
                .await
                .map_err(|e| match e {
                    Error::InvalidArgument { what, message } => {
                        Error::invalid(format!("layers[{i}].{what}"), message)
                    }
                    e => e,
                })?;
            d.layer = Some(i);
            each[i] = Some(d.clone());
            if d.shadow_denied {
                denied.get_or_insert(d);
            } else if best.as_ref().is_none_or(|b| d.remaining < b.remaining) {
                best = Some(d);
            }
        }
        let mut d = denied.or(best).expect("at least one layer");
        d.layers = each
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default();
        Ok(d)
    }
}

/// Whether an allowed check of `cost` units that left `remaining` of `limit` crossed the
/// policy's near-limit fraction: from below `ceil(f × limit)` units used to at or above it.
/// Compared with `f × limit` itself: for a whole number `n`, `n >= ceil(x)` exactly when
/// `n >= x` and `n < ceil(x)` exactly when `n < x`, and every quantity is below 2^53 (a
/// limit is at most `MAX_LIMIT`, `f` at most 1), so the doubles are exact. (`ceil` would be
/// a libm call on x86-64's baseline, on every allowed check.)
#[inline]
pub(super) fn crosses_near(p: &PolicyInner, limit: u64, remaining: u64, cost: u64) -> bool {
    let Some(f) = p.near_limit else { return false };
    let threshold = f * limit as i64 as f64;
    let used = limit.saturating_sub(remaining);
    // (as i64 first: below 2^53 the signed conversion is the same value, in one instruction)
    used as i64 as f64 >= threshold && (used.saturating_sub(cost) as i64 as f64) < threshold
}

#[cfg(test)]
mod near_tests {
    /// The definition: from below `ceil(f × limit)` units used to at or above it.
    fn by_ceil(f: f64, limit: u64, remaining: u64, cost: u64) -> bool {
        let threshold = (f * limit as f64).ceil() as u64;
        let used = limit.saturating_sub(remaining);
        used >= threshold && used.saturating_sub(cost) < threshold
    }

    #[test]
    fn the_crossing_is_the_one_of_the_ceiled_threshold() {
        let policy = |f: f64| {
            let limit = crate::Limit::fixed_window(10, std::time::Duration::from_secs(1));
            let p = crate::Policy::new("n", limit).unwrap();
            p.with_near_limit(Some(f)).unwrap()
        };
        let mut crossings = 0;
        for f in [1e-9, 0.1, 0.3, 0.5, 0.8, 0.9, 0.999_999, 1.0] {
            let p = policy(f);
            for limit in [
                1u64,
                2,
                3,
                7,
                10,
                49,
                1000,
                999_999_999_999,
                crate::policy::MAX_LIMIT,
            ] {
                let marks = [
                    0,
                    1,
                    2,
                    limit / 3,
                    limit / 2,
                    limit - limit / 5,
                    limit - 1,
                    limit,
                ];
                for remaining in marks {
                    for cost in [1u64, 2, 3, limit / 4 + 1, limit] {
                        let want = by_ceil(f, limit, remaining, cost);
                        crossings += usize::from(want);
                        assert_eq!(
                            super::crosses_near(&p.0, limit, remaining, cost),
                            want,
                            "f {f} limit {limit} remaining {remaining} cost {cost}"
                        );
                    }
                }
            }
        }
        assert!(
            crossings > 50,
            "the cases cross the threshold ({crossings})"
        );
    }
}
