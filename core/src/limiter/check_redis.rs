//! A check of one (key, policy) on Redis: the plan (validation, scale, shard), the script
//! call on the async path or the calling thread ([`Limiter::run`], [`Limiter::run_blocking`]),
//! overrides learned on the way, and the decision after the script (or `on_error`).

use super::check::Plan;
use super::layered::Layered;
use super::override_retry::{Answered, OverrideRetry};
use super::Engine;
use super::Limiter;
use crate::decision::{Decision, Source};
use crate::engine::outcome::{blocked_outcome, Raw};
use crate::engine::redis::{CheckRequest, LayeredTail, Mode, OverrideArg, RedisEngine};
use crate::engine::CallMode;
use crate::error::{Error, Result};
use crate::events::Event;
use crate::policy::{Compiled, Policy, PolicyInner};
use crate::routing::shard_index;
use crate::transport::batch::next_tag;

impl Limiter {
    pub(super) async fn run(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        call: CallMode<'_>,
    ) -> Result<Decision> {
        // A check can answer at once (in memory, from the block cache, or failing fast
        // while a shard's circuit is open), so a caller's loop of checks might never give
        // its runtime back: other tasks on it, and their timers, would starve (seen in
        // the chaos run as calls outliving their deadline by 27 s). Tokio's cooperative
        // budget makes such a loop yield now and then, as tokio's own I/O does.
        tokio::task::consume_budget().await;
        if let Some(m) = self.memory_fast(policy) {
            if !policy.0.shadow {
                return self.check_memory_plain(m, key, policy, cost, call);
            }
            let none = super::blocking::no_policies();
            return self.check_memory(none, m, key, policy, cost, call);
        }
        let view = self.view();
        let r = match &view.engine {
            Engine::Memory(m) => {
                return self.check_memory(&view.config, m, key, policy, cost, call)
            }
            Engine::Redis(r) => r,
        };
        let base = policy;
        // (an acquire's lease holds these units)
        let units = cost;
        let (peek, lease) = (call.is_peek(), call.lease());
        // the policy's shadow mode (or the call's) holds for the key's override too
        let shadow = base.0.shadow && call == CallMode::Check;
        if let (Some(parts), false) = (base.parts(), base.0.overrides) {
            let tail = shadow.then(|| LayeredTail {
                ov: OverrideArg::Off,
                policy: &base.0.name,
                key,
                shadow,
                more: &[],
            });
            return self
                .multi_redis(key, base, parts, cost, call, tail.as_ref())
                .await?
                .decided();
        }
        let mut in_force = self.override_arg(&base.0, key);
        let mut retry = OverrideRetry::default();
        loop {
            let policy = in_force.policy(base);
            if let Some(parts) = policy.parts() {
                // several limits in force (the policy's, or the key's override): one
                // layered script call, which compares the override version first
                let tail = in_force.tail(base, key, shadow);
                match self
                    .multi_redis(key, policy, parts, cost, call, Some(&tail))
                    .await?
                {
                    Layered::Decided(d) => return Ok(d),
                    Layered::Override(shard, v) => {
                        let name = &r.shards[shard as usize].name;
                        in_force = retry.learn(self, (base, key), name, &v)?;
                        continue;
                    }
                    Layered::Overridden { shard, .. } => {
                        return Err(Error::Script {
                            shard: r.shards[shard as usize].name.clone(),
                            message: "a check of one key answered with another's override".into(),
                        })
                    }
                }
            }
            let (eff, cost, shard) = match self.plan(r, key, policy, cost)? {
                Plan::Decided(d) => return Ok(d),
                Plan::Redis { eff, cost, shard } => (eff, cost, shard),
            };
            let p = &*policy.0;
            if let (Some(h), true) = (&view.handoff, retry.first()) {
                self.carry_over(h, r, p, key, shard as usize).await;
            }
            if let (Some(la), false, None, false) = (p.local_admission, peek, lease, shadow) {
                return self.local_admission(r, p, &eff, la, key, shard, cost).await;
            }
            let mode = if peek { Mode::Peek } else { Mode::Check };
            let mut req = self.request(p, &eff, key, cost, mode, lease);
            req.ov = in_force.ov;
            let checked = if shadow {
                r.check_shadow(shard as usize, &req).await
            } else {
                r.check(shard as usize, &req).await
            };
            let raw = match retry.answered(self, (base, key), r, shard, checked) {
                Answered::Retry(next) => {
                    in_force = next;
                    continue;
                }
                Answered::Outcome(raw) => raw,
            };
            if shadow {
                return self.after_shadow(p, &eff, key, cost, shard, raw);
            }
            if let (Some(id), Err(e)) = (lease, &raw) {
                // the script may run (or have run) after this gave up: its lease is
                // released once the shard answers
                self.late_lease(base, key, id, units, shard, e);
            }
            return self.after_script(p, &eff, key, cost, call, shard, raw);
        }
    }

    /// [`Limiter::run`] (without a lease) on the calling thread: the script is sent and
    /// its reply read over a blocking connection, with no hand-off to the I/O runtime.
    /// `None` when the check needs the runtime: Cluster, Sentinel or TLS shards, a reshard
    /// handoff in progress, local admission, shadow mode, or several limits in force (a
    /// multi-limit policy, or an override of several limits, even one found on the way).
    pub(super) fn run_blocking(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        call: CallMode<'_>,
    ) -> Option<Result<Decision>> {
        let peek = call.is_peek();
        debug_assert!(call.lease().is_none(), "an acquire needs the runtime");
        let view = self.inner.view.load();
        let Engine::Redis(r) = &view.engine else {
            return None;
        };
        let p = &*policy.0;
        if !r.blocking_capable()
            || view.handoff.is_some()
            || ((p.local_admission.is_some() || p.shadow) && !peek)
            || p.parts.is_some()
        {
            return None;
        }
        // more blocking callers than CPUs: the I/O thread batches their commands better
        let _slot = crate::transport::blocking::OWN_IO.take()?;
        (|| {
            let base = policy;
            let mut in_force = self.override_arg(p, key);
            let mut retry = OverrideRetry::default();
            loop {
                let policy = in_force.policy(base);
                if policy.is_multi() {
                    return None; // nothing decided yet: the async path checks
                }
                let (eff, cost, shard) = match self.plan(r, key, policy, cost) {
                    Err(e) => return Some(Err(e)),
                    Ok(Plan::Decided(d)) => return Some(Ok(d)),
                    Ok(Plan::Redis { eff, cost, shard }) => (eff, cost, shard),
                };
                let p = &*policy.0;
                let mode = if peek { Mode::Peek } else { Mode::Check };
                let mut req = self.request(p, &eff, key, cost, mode, None);
                req.ov = in_force.ov;
                let checked = r.check_blocking(shard as usize, &req);
                let raw = match retry.answered(self, (base, key), r, shard, checked) {
                    Answered::Retry(next) => {
                        in_force = next;
                        continue;
                    }
                    Answered::Outcome(raw) => raw,
                };
                return Some(self.after_script(p, &eff, key, cost, call, shard, raw));
            }
        })()
    }

    /// The script call of a check, with the injected clock and a fresh tag.
    pub(super) fn request<'a>(
        &self,
        policy: &'a PolicyInner,
        eff: &'a Compiled,
        key: &'a str,
        cost: u64,
        mode: Mode,
        lease: Option<&'a str>,
    ) -> CheckRequest<'a> {
        CheckRequest {
            policy,
            eff,
            key,
            now_us: self.now_override(),
            cost,
            mode,
            lease,
            tag: next_tag(),
            ov: crate::engine::redis::OverrideArg::Off,
        }
    }

    /// What a Redis check does before its script: validate, and answer from the block
    /// cache when the key is known to be blocked. Otherwise the limit, cost and shard.
    pub(super) fn plan(
        &self,
        r: &RedisEngine,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<Plan> {
        let (eff, cost) = self.prepare(key, policy, cost)?;
        if let Some(ttl) = self.cached_block(key) {
            let p = &*policy.0;
            let d = self.decision(p, &eff, blocked_outcome(ttl), Source::Block, None);
            self.count(&p.name, &d);
            // a check that meets the block list is an event, also when the cache answers
            // (to subscribers: the stream is told when Redis answers)
            if self.inner.subscribers.active() {
                self.inner.subscribers.emit(&Event::Blocked {
                    policy: p.name.clone(),
                    key: key.to_string(),
                    auto: false,
                    retry_after: d.retry_after,
                });
            }
            return Ok(Plan::Decided(d));
        }
        let shard = shard_index(key, r.shards.len() as u32);
        Ok(Plan::Redis { eff, cost, shard })
    }

    /// What a Redis check does after its script: the decision from the reply, or from
    /// `on_error` when the shard failed; counted unless it was a peek.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn after_script(
        &self,
        p: &PolicyInner,
        eff: &Compiled,
        key: &str,
        cost: u64,
        call: CallMode<'_>,
        shard: u32,
        raw: Result<Raw>,
    ) -> Result<Decision> {
        let d = match raw {
            Ok(raw) => self.finish(p, eff, key, raw, Source::Redis, Some(shard)),
            Err(e) if e.is_backend() => self.fallback(p, eff, key, cost, call, e)?,
            Err(e) => return Err(e),
        };
        if !call.is_peek() {
            self.count_policy(p, &d);
            self.near(p, key, cost, &d);
        }
        Ok(d)
    }
}
