//! One check of one (key, policy): validation, the engine call, the decision.

use super::blocking::unleased;
use super::shadow::crosses_near;
use super::{Engine, Lease, Limiter};
use crate::config::Config;
use crate::decision::{Decision, Source};
use crate::engine::memory::MemoryEngine;
use crate::engine::outcome::Outcome;
use crate::engine::outcome::{BlockVerdict, Raw};
use crate::engine::CallMode;
use crate::error::{Error, Result};
use crate::events::Event;
use crate::key::validate_key;
use crate::policy::{Algorithm, Compiled, Policy, PolicyInner};
use crate::routing::shard_index;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A Redis check after its preamble: decided already (a cached block), or the script to run.
pub(super) enum Plan {
    Decided(Decision),
    Redis {
        eff: Compiled,
        cost: u64,
        shard: u32,
    },
}

impl Limiter {
    /// Checks `cost` units of `policy` for `key`. A denied check consumes nothing.
    /// A cost larger than the limit is denied with no `retry_after`.
    ///
    /// A concurrency policy is an `invalid_argument` error: use [`Limiter::acquire`], which
    /// returns the lease to release.
    ///
    /// For Redis this must be awaited inside a Tokio runtime with timers enabled; from
    /// anywhere else use [`Limiter::check_blocking`].
    pub async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision> {
        unleased(policy, "check")?;
        self.run(key, policy, cost, CallMode::Check).await
    }

    /// [`Limiter::check`] of the config's policy named `policy`: key first, as everywhere.
    pub async fn check_by_name(&self, key: &str, policy: &str, cost: u64) -> Result<Decision> {
        let p = self.policy(policy)?;
        self.check(key, &p, cost).await
    }

    /// The state of `key` under `policy` without consuming: `allowed` says whether a check
    /// of one unit would pass now, `remaining` how many units are available.
    /// On a concurrency policy: the units free now (it takes none, so needs no lease).
    pub async fn peek(&self, key: &str, policy: &Policy) -> Result<Decision> {
        self.run(key, policy, 1, CallMode::Peek).await
    }

    /// Acquires `units` of a concurrency policy. Returns the decision and, when allowed,
    /// the lease to release.
    ///
    /// Any other policy is an `invalid_argument` error that takes nothing: its units would
    /// be consumed with a lease that no release could give back.
    pub async fn acquire(
        &self,
        key: &str,
        policy: &Policy,
        units: u64,
    ) -> Result<(Decision, Option<Lease>)> {
        leased(policy)?;
        let id = self.lease_id();
        let d = self.run(key, policy, units, CallMode::Acquire(&id)).await?;
        let lease =
            (d.allowed && matches!(d.source, Source::Redis | Source::Memory)).then(|| Lease {
                key: key.to_string(),
                policy: policy.name().to_string(),
                id,
                units,
            });
        Ok((d, lease))
    }

    /// Releases a lease from [`Limiter::acquire`]. Returns false when it was no longer held
    /// (released before, or expired).
    pub async fn release(&self, lease: &Lease) -> Result<bool> {
        let policy = self.policy(&lease.policy)?;
        self.release_with(&policy, lease).await
    }

    /// Releases a lease of an ad-hoc concurrency policy.
    pub async fn release_with(&self, policy: &Policy, lease: &Lease) -> Result<bool> {
        self.release_lease(policy, lease, false).await
    }

    /// Releases `lease`; `late`: it is the lease of an acquire that gave up at its deadline
    /// (`late_leases.rs`), whose script may not have run yet: a release that finds nothing
    /// then leaves a tombstone for the lease TTL, so that the acquire, when it runs, grants
    /// nothing. Only those leave one (a release of a lease released before, or a forged
    /// one, leaves nothing: tombstones stay as few as the late leases).
    pub(super) async fn release_lease(
        &self,
        policy: &Policy,
        lease: &Lease,
        late: bool,
    ) -> Result<bool> {
        validate_key(&lease.key)?;
        validate_lease(policy, lease)?;
        match &self.view().engine {
            Engine::Memory(m) => Ok(m.release(
                &policy.0.scope,
                &lease.key,
                &lease.id,
                lease.units,
                self.now(),
            )),
            Engine::Redis(r) => {
                let shard = shard_index(&lease.key, r.shards.len() as u32) as usize;
                let now = self.now_override();
                r.release(
                    &policy.0,
                    &lease.key,
                    shard,
                    &lease.id,
                    lease.units,
                    now,
                    late,
                )
                .await
            }
        }
    }

    /// Forgets `key`'s state under `policy`: its full budget is back.
    /// On a multi-limit policy: every limit's state; on a policy taking overrides, that
    /// of the key's override too (whose limits may keep state of their own).
    pub async fn reset(&self, key: &str, policy: &Policy) -> Result<()> {
        let own = policy.parts().map_or(std::slice::from_ref(policy), |p| p);
        for part in own {
            self.reset_state(key, part).await?;
        }
        if policy.0.overrides {
            if let Some(o) = self.override_in_force(key, policy).await? {
                for part in o.parts().map_or(std::slice::from_ref(&o), |p| p) {
                    if own.iter().all(|p| p.0.scope != part.0.scope) {
                        self.reset_state(key, part).await?;
                    }
                }
            }
        }
        Ok(())
    }

    async fn reset_state(&self, key: &str, policy: &Policy) -> Result<()> {
        validate_key(key)?;
        self.inner
            .local
            .lock()
            .remove(&PolicyKey::new(&policy.0.name, key));
        match &self.view().engine {
            Engine::Memory(m) => {
                m.reset(&policy.0.scope, key);
                Ok(())
            }
            Engine::Redis(r) => {
                let shard = shard_index(key, r.shards.len() as u32) as usize;
                r.reset(&policy.0, key, shard, self.now_override()).await
            }
        }
    }

    // (always: a caller returns it, and built in place it is not copied)
    #[inline(always)]
    pub(super) fn decision(
        &self,
        p: &PolicyInner,
        eff: &Compiled,
        o: Outcome,
        source: Source,
        shard: Option<u32>,
    ) -> Decision {
        Decision {
            allowed: o.allowed,
            limit: eff.limit,
            remaining: o.remaining,
            reset_after: Duration::from_micros(o.reset_us),
            retry_after: if o.allowed {
                None
            } else {
                o.retry_us.map(Duration::from_micros)
            },
            delay: Duration::from_micros(o.delay_us),
            policy: p.hot.name(&p.name),
            source,
            shard,
            window: Duration::from_micros(eff.window_us()),
            layer: None,
            limit_index: None,
            quotas: Vec::new(),
            shadow_denied: false,
            layers: Vec::new(),
        }
    }

    pub(super) fn on_denied(&self, p: &PolicyInner, key: &str, d: &Decision) {
        let wants_stream = matches!(&self.view().engine, Engine::Redis(_))
            && self.view().config.events_stream_maxlen.is_some();
        if !self.inner.subscribers.active() && !wants_stream {
            return;
        }
        let e = Event::Denied {
            policy: p.name.clone(),
            key: key.to_string(),
            decision: d.clone(),
        };
        self.publish(key, &e);
    }

    pub(super) fn on_blocked(&self, p: &PolicyInner, key: &str, d: &Decision, auto: bool) {
        self.cache_block(key, d.retry_after.map(|r| r.as_micros() as u64));
        let e = Event::Blocked {
            policy: p.name.clone(),
            key: key.to_string(),
            auto,
            retry_after: d.retry_after,
        };
        if auto {
            tracing::info!(policy = %p.name, key, "shardlimit: key blocked automatically");
        }
        self.publish(key, &e);
    }

    pub(super) fn publish(&self, key: &str, e: &Event) {
        if self.inner.subscribers.active() {
            self.inner.subscribers.emit(e);
        }
        if let Engine::Redis(r) = &self.view().engine {
            r.stream(shard_index(key, r.shards.len() as u32) as usize, e);
        }
    }

    /// Validates a check's key and cost. Returns the
    /// limit in force and the cost to decide with: costs above the limit can never fit, and
    /// sending at most `limit + 1` keeps every script quantity an exact integer.
    #[inline]
    pub(super) fn prepare(&self, key: &str, policy: &Policy, cost: u64) -> Result<(Compiled, u64)> {
        self.prepare_in(None, key, policy, cost)
    }

    /// [`Limiter::prepare`] with the config in force when the caller holds it already
    /// (the in-memory check: no second load of the limiter's view per check).
    #[inline]
    pub(super) fn prepare_in(
        &self,
        config: Option<&Config>,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<(Compiled, u64)> {
        validate_key(key)?;
        if policy.0.adhoc {
            match config {
                Some(config) => own_name_in(config, policy)?,
                None => self.own_name(policy)?,
            }
        }
        if cost == 0 {
            return Err(zero_cost());
        }
        let eff = policy.0.effective(self.global_scale());
        Ok((eff, cost.min(eff.limit + 1)))
    }

    /// A check (or peek) on the in-memory engine: synchronous, it never waits.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn check_memory(
        &self,
        config: &Config,
        m: &MemoryEngine,
        key: &str,
        policy: &Policy,
        cost: u64,
        mode: CallMode<'_>,
    ) -> Result<Decision> {
        let peek = mode.is_peek();
        // the policy's shadow mode (or the call's) holds for the key's override too
        let shadow = policy.0.shadow && mode == CallMode::Check;
        // one clock read per check (a read costs about as much as the decision itself):
        // the override lookup and the check see the same instant
        let now = self.now();
        // (the policy's flag first, inline: a policy taking no overrides pays no call)
        let ov = if policy.0.overrides {
            self.memory_override(&policy.0, key, now)
        } else {
            None
        };
        let (policy, scope) = match &ov {
            Some((a, _)) => {
                a.policy.follow_scale(policy);
                (&a.policy, &a.memory_scope)
            }
            None => (policy, &policy.0.scope),
        };
        if let Some(parts) = policy.parts() {
            return self.multi_memory(config, m, key, policy, parts, cost, mode, shadow);
        }
        if shadow {
            return self.shadow_memory(m, key, policy, scope, cost);
        }
        let (eff, cost) = self.prepare_in(Some(config), key, policy, cost)?;
        let p = &*policy.0;
        let raw = m.check(scope, &eff, key, now, cost, mode, p.auto_block.as_ref());
        Ok(self.memory_decision(p, &eff, key, raw, cost, peek))
    }

    /// The in-memory check of a policy that needs nothing but its own limit: no override,
    /// one limit, not in shadow, and (when the config names policies) not ad-hoc
    /// ([`Limiter::memory_fast`] and the caller say so). What [`Limiter::check_memory`]
    /// does for it, directly: the same errors, in the same order, and the same decision;
    /// the key is validated as it is hashed, from the seed the policy keeps.
    #[inline(always)]
    pub(super) fn check_memory_plain(
        &self,
        m: &MemoryEngine,
        key: &str,
        policy: &Policy,
        cost: u64,
        mode: CallMode<'_>,
    ) -> Result<Decision> {
        let p = &*policy.0;
        let Some(at) = m.locate_valid(p.memory_seed, key) else {
            return Err(key_error(key));
        };
        if cost == 0 {
            return Err(zero_cost());
        }
        let now = self.now();
        let f = f64::from_bits(p.scale.load(Ordering::Relaxed)) * self.global_scale();
        let eff = if f >= 1.0 {
            p.compiled
        } else {
            p.compiled.scaled(f)
        };
        let cost = cost.min(eff.limit + 1);
        let raw = m.check_at(
            at,
            &p.scope,
            &eff,
            key,
            now,
            cost,
            mode,
            p.auto_block.as_ref(),
        );
        if raw.outcome.allowed && !raw.blocked.is_blocked() && mode == CallMode::Check {
            // (the common case written out here, the decision built in the caller's
            // `Result`: through `memory_decision` it was built, then copied into it)
            self.with_policy_counters(p, |c| {
                c.allowed.fetch_add(1, Ordering::Relaxed);
            });
            // (no call to `crosses_near` for a policy without `near_limit`)
            if p.near_limit.is_none() || !crosses_near(p, eff.limit, raw.outcome.remaining, cost) {
                return Ok(self.decision(p, &eff, raw.outcome, Source::Memory, None));
            }
            let d = self.decision(p, &eff, raw.outcome, Source::Memory, None);
            self.near_crossed(p, key, &d);
            return Ok(d);
        }
        Ok(self.memory_decision(p, &eff, key, raw, cost, mode.is_peek()))
    }

    /// The decision of an in-memory check, counted and reported.
    #[inline(always)]
    fn memory_decision(
        &self,
        p: &PolicyInner,
        eff: &Compiled,
        key: &str,
        raw: Raw,
        cost: u64,
        peek: bool,
    ) -> Decision {
        if raw.outcome.allowed && !raw.blocked.is_blocked() {
            // the common case, with nothing to tell anyone: counted from the outcome, and
            // the decision built once, where it is returned (building it in `finish` and
            // moving it out would cost two copies of it per check)
            if !peek {
                self.with_policy_counters(p, |c| {
                    c.allowed.fetch_add(1, Ordering::Relaxed);
                });
                if crosses_near(p, eff.limit, raw.outcome.remaining, cost) {
                    let d = self.decision(p, eff, raw.outcome, Source::Memory, None);
                    self.near_crossed(p, key, &d);
                    return d;
                }
            }
            return self.decision(p, eff, raw.outcome, Source::Memory, None);
        }
        self.memory_denied(p, eff, key, raw, cost, peek)
    }

    #[inline(never)]
    fn memory_denied(
        &self,
        p: &PolicyInner,
        eff: &Compiled,
        key: &str,
        raw: Raw,
        cost: u64,
        peek: bool,
    ) -> Decision {
        let d = self.finish(p, eff, key, raw, Source::Memory, None);
        if !peek {
            self.count_policy(p, &d);
            self.near(p, key, cost, &d);
        }
        d
    }

    pub(super) fn finish(
        &self,
        p: &PolicyInner,
        eff: &Compiled,
        key: &str,
        raw: Raw,
        source: Source,
        shard: Option<u32>,
    ) -> Decision {
        if raw.blocked.is_blocked() {
            let now = raw.blocked == BlockVerdict::BlockedNow;
            let d = self.decision(p, eff, raw.outcome, Source::Block, shard);
            self.on_blocked(p, key, &d, now);
            let mut d = d;
            // (blocked by this denial: the denial itself was decided by the limit)
            d.source = if now { source } else { Source::Block };
            return d;
        }
        let d = self.decision(p, eff, raw.outcome, source, shard);
        if !d.allowed {
            self.on_denied(p, key, &d);
        }
        d
    }
}

impl Limiter {
    /// An ad-hoc policy named like a configured one would share its state and counters
    /// with limits of its own: an error naming the way out.
    #[cold]
    pub(super) fn own_name(&self, policy: &Policy) -> Result<()> {
        own_name_in(&self.inner.view.load().config, policy)
    }
}

/// The error of a key [`crate::key::validate_key`] refuses (out of line: the checks that
/// validate a key as they hash it only know that it was refused).
#[cold]
#[inline(never)]
fn key_error(key: &str) -> Error {
    match validate_key(key) {
        Err(e) => e,
        Ok(()) => Error::Internal(format!("key of {} bytes refused", key.len())),
    }
}

#[cold]
#[inline(never)]
fn zero_cost() -> Error {
    Error::invalid("cost", "must be at least 1")
}

/// [`Limiter::own_name`] against `config`, the config in force.
#[inline]
fn own_name_in(config: &Config, policy: &Policy) -> Result<()> {
    if config.policies.is_empty() {
        return Ok(());
    }
    own_name_of(config, policy)
}

#[cold]
fn own_name_of(config: &Config, policy: &Policy) -> Result<()> {
    let name = policy.name();
    if config.policies.contains_key(name) {
        return Err(Error::invalid(
            "policy",
            format!(
                "an ad-hoc policy named `{name}` has the name of a configured policy, whose state and counters it would share: give it another name, or use the configured policy (limiter.policy(\"{name}\"))"
            ),
        ));
    }
    Ok(())
}

/// A key under one policy: what in-process state per (policy, key) is kept by (local
/// admission batches, keys a reshard handoff carried over).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct PolicyKey {
    policy: std::sync::Arc<str>,
    key: String,
}

impl PolicyKey {
    pub(super) fn new(policy: &std::sync::Arc<str>, key: &str) -> PolicyKey {
        PolicyKey {
            policy: policy.clone(),
            key: key.to_string(),
        }
    }
    pub(super) fn policy_name(&self) -> &str {
        &self.policy
    }
    pub(super) fn key_name(&self) -> &str {
        &self.key
    }
}

/// An acquire of a policy that is not a concurrency limit would consume units with a lease
/// no release could give back: an error that names the operation to use instead.
pub(super) fn leased(policy: &Policy) -> Result<()> {
    if policy.algorithm() != Algorithm::Concurrency {
        let what = match policy.parts() {
            Some(parts) => format!("a multi-limit policy of {} limits", parts.len()),
            None => policy.algorithm().to_string(),
        };
        return Err(Error::invalid(
            "policy",
            format!(
                "{} is not a concurrency policy (it is {what}): acquire takes leases of a concurrency limit; use check",
                policy.name(),
            ),
        ));
    }
    Ok(())
}

/// A lease comes back from the caller (a binding's object, a JS literal, a C struct), so
/// it is checked before anything is built from it: a lease of a concurrency policy, `units`
/// between 1 and the policy's `max`, and an id of the form [`Limiter::lease_id`] makes.
pub(super) fn validate_lease(policy: &Policy, lease: &Lease) -> Result<()> {
    if policy.algorithm() != Algorithm::Concurrency {
        return Err(Error::invalid(
            "lease.policy",
            format!("policy {} is not a concurrency policy", policy.name()),
        ));
    }
    // a policy that takes overrides may have granted the lease under a larger override
    // (set or gone since): bounded by what any limit can be
    let max = if policy.0.overrides {
        crate::policy::MAX_LIMIT
    } else {
        policy.0.compiled.limit
    };
    if lease.units == 0 || lease.units > max {
        return Err(Error::invalid(
            "lease.units",
            format!(
                "must be between 1 and the policy's max {max}, got {}",
                lease.units
            ),
        ));
    }
    let id = lease.id.as_bytes();
    if !(LEASE_ID_LEN.contains(&id.len())
        && id
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)))
    {
        return Err(Error::invalid(
            "lease.id",
            format!(
                "must be {} to {} lowercase hex digits, as acquire returns it",
                LEASE_ID_LEN.start(),
                LEASE_ID_LEN.end()
            ),
        ));
    }
    Ok(())
}

/// Lengths of the ids [`Limiter::lease_id`] makes: 16 hex digits of hash, then the
/// sequence number in hex (1 to 16 digits).
pub(super) const LEASE_ID_LEN: std::ops::RangeInclusive<usize> = 17..=32;
