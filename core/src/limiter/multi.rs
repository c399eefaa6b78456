//! Multi-limit policies (`policy/multi.rs`): a check is a layered check of the policy's
//! limits on one key, so all of them land on the key's shard and are decided in one script
//! call (`main_layered.lua`), or under the in-memory engine's shard locks; peeks read each
//! limit. And plans: the policy in force under a plan.

use super::layered::{layer_reqs, Layered};
use super::{validate_key, Layer, Limiter};
use crate::decision::{Decision, Quota};
use crate::engine::memory::MemoryEngine;
use crate::engine::redis::LayeredTail;
use crate::engine::CallMode;
use crate::error::{Error, Result};
use crate::policy::{Policy, MAX_LIMITS};

impl Limiter {
    /// The policy `policy` as plan `plan` has it: the plan's replacement limits under the
    /// policy's name (so its keys, counters and headers stay the same), or the policy
    /// itself when the plan does not change it. Errors: `unknown_policy` when the config
    /// has no such policy, `invalid_argument` (field `plan`) when it has no such plan.
    /// Check under a plan with `limiter.check(key, &limiter.plan_policy(plan, name)?, 1)`.
    pub fn plan_policy(&self, plan: &str, policy: &str) -> Result<Policy> {
        self.view().config.plan_policy(plan, policy)
    }

    /// A multi-limit check or peek on the in-memory engine (synchronous, like every
    /// in-memory decision); `shadow`: a would-be denial is allowed, counted and reported.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn multi_memory(
        &self,
        config: &crate::config::Config,
        m: &MemoryEngine,
        key: &str,
        policy: &Policy,
        parts: &[Policy],
        cost: u64,
        call: CallMode<'_>,
        shadow: bool,
    ) -> Result<Decision> {
        validate(key, cost, call)?;
        if call.is_peek() {
            let ds = parts
                .iter()
                .map(|p| self.check_memory(config, m, key, p, 1, CallMode::Peek))
                .collect::<Result<Vec<_>>>()?;
            return Ok(combine_peeks(ds));
        }
        let (layers, origin, originals) = as_layers(key, policy, parts, cost);
        let effs = self.layer_limits(&layers);
        let mut reqs = layer_reqs(&layers, &effs);
        if shadow {
            // a shadow denial must not enforce anything
            reqs.iter_mut().for_each(|r| r.auto_block = None);
        }
        let raw = m.check_layers(&reqs, self.now());
        let shards = vec![None; layers.len()];
        let d = self.conclude(
            &layers,
            &origin,
            &originals,
            true,
            &effs,
            raw,
            &vec![crate::decision::Source::Memory; layers.len()],
            &shards,
            shadow,
        );
        if d.shadow_denied {
            self.count_shadow_memory(&policy.0.name, key);
        }
        Ok(d)
    }

    /// A multi-limit check (one script call on the key's shard, with `tail`: the override
    /// version compared and shadow counting in the same call) or peek (each limit read,
    /// concurrently) on Redis.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn multi_redis(
        &self,
        key: &str,
        policy: &Policy,
        parts: &[Policy],
        cost: u64,
        call: CallMode<'_>,
        tail: Option<&LayeredTail<'_>>,
    ) -> Result<Layered> {
        validate(key, cost, call)?;
        if call.is_peek() {
            let peeks = parts
                .iter()
                .map(|p| Box::pin(self.run(key, p, 1, CallMode::Peek)));
            let ds = futures_util::future::join_all(peeks)
                .await
                .into_iter()
                .collect::<Result<Vec<_>>>()?;
            return Ok(Layered::Decided(combine_peeks(ds)));
        }
        let (layers, origin, originals) = as_layers(key, policy, parts, cost);
        self.layered(&layers, &origin, &originals, true, tail, &[])
            .await
    }
}

/// The caller's layers with every multi-limit policy expanded into one layer per limit:
/// (layers, origin of each: (caller's layer, limit index)).
pub(super) fn expand(layers: &[Layer]) -> Result<(Vec<Layer>, Vec<Origin>)> {
    let mut out = Vec::new();
    let mut origin = Vec::new();
    for (j, l) in layers.iter().enumerate() {
        match l.policy.parts() {
            Some(parts) => {
                for (i, p) in parts.iter().enumerate() {
                    out.push(Layer::new(l.key.clone(), p, l.cost));
                    origin.push((j, Some(i)));
                }
            }
            None => {
                out.push(l.clone());
                origin.push((j, None));
            }
        }
    }
    if out.len() > 64 {
        return Err(Error::invalid(
            "layers",
            format!(
                "at most 64 limits in all (a multi-limit policy counts each of its limits), got {}",
                out.len()
            ),
        ));
    }
    Ok((out, origin))
}

/// Where an expanded layer comes from: (the caller's layer, the limit of its policy).
pub(super) type Origin = (usize, Option<usize>);
type Expanded = (Vec<Layer>, Vec<Origin>, Vec<Layer>);

/// One check of a multi-limit policy as the layers of its limits.
fn as_layers(key: &str, policy: &Policy, parts: &[Policy], cost: u64) -> Expanded {
    debug_assert!(parts.len() <= MAX_LIMITS);
    let layers = parts.iter().map(|p| Layer::new(key, p, cost)).collect();
    let origin = (0..parts.len()).map(|i| (0, Some(i))).collect();
    (layers, origin, vec![Layer::new(key, policy, cost)])
}

fn validate(key: &str, cost: u64, call: CallMode<'_>) -> Result<()> {
    validate_key(key)?;
    if cost == 0 {
        return Err(Error::invalid("cost", "must be at least 1"));
    }
    if call.lease().is_some() {
        return Err(Error::invalid(
            "policy",
            "a multi-limit policy holds no concurrency limit, so it has no leases: use check",
        ));
    }
    Ok(())
}

/// The peek of a multi-limit policy from the peeks of its limits: allowed when every limit
/// would allow one unit; it describes the first that would deny (waiting for the slowest
/// of those), or the one with the fewest units left.
fn combine_peeks(ds: Vec<Decision>) -> Decision {
    let quotas: Vec<Quota> = ds
        .iter()
        .map(|d| Quota {
            limit: d.limit,
            window: d.window,
        })
        .collect();
    let idx = ds
        .iter()
        .position(|d| !d.allowed)
        .unwrap_or_else(|| (0..ds.len()).min_by_key(|i| ds[*i].remaining).unwrap_or(0));
    let mut d = ds[idx].clone();
    if d.allowed {
        d.delay = ds.iter().map(|d| d.delay).max().unwrap_or_default();
    } else {
        let denying: Vec<&Decision> = ds.iter().filter(|d| !d.allowed).collect();
        d.retry_after = if denying.iter().all(|d| d.retry_after.is_some()) {
            denying.iter().filter_map(|d| d.retry_after).max()
        } else {
            None
        };
    }
    d.limit_index = Some(idx);
    d.quotas = quotas;
    d
}
