//! The script calls of a layered check on Redis: how the layers are grouped into calls,
//! a failed group decided by its policies' on_error modes, and what the groups that
//! admitted are given back when the check as a whole does not admit.

use super::layered::{Layer, OverrideCheck};
use super::Limiter;
use crate::engine::outcome::{LayerReq, LayeredRaw, Outcome};
use crate::engine::redis::RedisEngine;
use crate::engine::CallMode;
use crate::error::Error;
use std::sync::Arc;

impl Limiter {
    /// A group whose shard failed: each of its layers decided by its policy's on_error
    /// mode into `fb` (an `on_error: error` layer's error into its `first_error`).
    pub(super) fn fall_back_group(
        &self,
        layers: &[Layer],
        reqs: &[LayerReq<'_>],
        idx: &[usize],
        e: &Error,
        fb: &mut FellBack<'_>,
    ) {
        for i in idx {
            let p = &layers[*i].policy.0;
            let fallback = self.fallback(
                p,
                &reqs[*i].compiled,
                &layers[*i].key,
                reqs[*i].cost,
                CallMode::Check,
                e.clone(),
            );
            let d = match fallback {
                Ok(d) => d,
                // on_error: error
                Err(e) => {
                    fb.first_error.get_or_insert(e);
                    continue;
                }
            };
            // (a local decision stays one: `conclude` describes it as its policy's check)
            fb.sources[*i] = d.source;
            let out = &mut *fb.out;
            out.outcomes[*i] = Outcome {
                allowed: d.allowed,
                remaining: d.remaining,
                reset_us: d.reset_after.as_micros() as u64,
                retry_us: d.retry_after.map(|r| r.as_micros() as u64),
                delay_us: 0,
            };
            if !d.allowed && out.deciding.is_none_or(|o| *i < o) {
                out.deciding = Some(*i);
            }
        }
    }

    /// Gives back what the groups in `committed` (group, its `now`) admitted, when the
    /// layered check as a whole did not admit.
    pub(super) async fn give_back(
        &self,
        r: &Arc<RedisEngine>,
        layers: &[Layer],
        reqs: &[LayerReq<'_>],
        groups: &[(usize, Vec<usize>)],
        committed: &[(usize, u64)],
    ) {
        let refunds = committed.iter().map(|(g, now)| {
            let group: Vec<(LayerReq<'_>, &str)> = groups[*g]
                .1
                .iter()
                .map(|i| (reqs[*i].clone(), layers[*i].policy.0.key_scope.as_str()))
                .collect();
            let shard = groups[*g].0;
            async move {
                if let Err(e) = r.refund(shard, &group, *now).await {
                    self.inner.subscribers.log.note(
                        self.now(),
                        crate::log::LogReason::RefundFailed,
                        &r.shards[shard].name,
                        &e,
                        None,
                    );
                }
            }
        });
        futures_util::future::join_all(refunds).await;
    }
}

/// Where [`Limiter::fall_back_group`] writes: each layer's outcome, what decided it (its
/// policy's `on_error` mode), and the first `on_error: error` layer's error.
pub(super) struct FellBack<'a> {
    pub(super) out: &'a mut LayeredRaw,
    pub(super) sources: &'a mut [crate::decision::Source],
    pub(super) first_error: &'a mut Option<Error>,
}

/// The script calls of a layered check: (shard, the indexes of its layers), one per shard;
/// in a Redis Cluster, one per hash slot (a script's keys must share a slot), so no
/// CROSSSLOT error is possible.
pub(super) fn call_groups(
    r: &RedisEngine,
    layers: &[Layer],
    shard_of: &[usize],
) -> Vec<(usize, Vec<usize>)> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut group_keys: Vec<u32> = Vec::new();
    for (i, s) in shard_of.iter().enumerate() {
        let gk = if r.is_cluster() {
            crate::routing::cluster_slot(&layers[i].key) as u32
        } else {
            *s as u32
        };
        match group_keys.iter().position(|g| *g == gk) {
            Some(g) => groups[g].1.push(i),
            None => {
                group_keys.push(gk);
                groups.push((*s, vec![i]));
            }
        }
    }
    groups
}

/// Each group's override checks: those of its layers' keys (in `checks` order); nothing
/// at all (no allocation) for layers without overrides.
pub(super) fn checks_by_group(
    groups: &[(usize, Vec<usize>)],
    checks: &[OverrideCheck<'_>],
) -> Vec<Vec<usize>> {
    groups
        .iter()
        .take(if checks.is_empty() { 0 } else { groups.len() })
        .map(|(_, idx)| {
            (0..checks.len())
                .filter(|c| idx.contains(&checks[*c].at))
                .collect()
        })
        .collect()
}
