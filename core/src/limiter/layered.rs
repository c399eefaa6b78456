//! Layered checks: several (key, policy) pairs decided together; none consumes when one denies.

use super::layered_calls::{call_groups, checks_by_group, FellBack};
use super::{validate_key, Engine, Limiter};
use crate::decision::{Decision, Quota, Source};
use crate::engine::outcome::Outcome;
use crate::engine::outcome::{blocked_outcome, BlockVerdict, LayerReq, LayeredRaw};
use crate::engine::redis::{LayeredChecked, LayeredTail, OverrideArg, RedisEngine};
use crate::error::{Error, Result};
use crate::policy::{Algorithm, Compiled, Policy};
use crate::routing::shard_index;
use std::sync::Arc;

/// One layer of a layered check: `cost` units of `policy` for `key`.
#[derive(Debug, Clone)]
pub struct Layer {
    pub key: String,
    pub policy: Policy,
    pub cost: u64,
}

impl Layer {
    pub fn new(key: impl Into<String>, policy: &Policy, cost: u64) -> Layer {
        Layer {
            key: key.into(),
            policy: policy.clone(),
            cost,
        }
    }
}

impl Limiter {
    /// A layered check: allowed only if every layer allows; when any layer denies, no
    /// layer consumes. Layers on one shard are decided atomically in one script call;
    /// several shards are asked concurrently (one round trip each) and what was admitted
    /// is refunded when another shard's layer denies. The decision describes the layer
    /// that denied (with the longest `retry_after` of all denying layers), or, when all
    /// allow, the layer with the fewest units remaining; `layer` is its index. A layer of
    /// a concurrency policy is an `invalid_argument` error (its units would be taken under
    /// no lease the caller could release): acquire it with [`Limiter::acquire`].
    pub async fn check_all(&self, layers: &[Layer]) -> Result<Decision> {
        if layers.is_empty() {
            return Err(Error::invalid("layers", "must not be empty"));
        }
        if layers.len() > 64 {
            return Err(Error::invalid(
                "layers",
                format!("at most 64 layers, got {}", layers.len()),
            ));
        }
        for (i, l) in layers.iter().enumerate() {
            validate_key(&l.key)
                .map_err(|e| Error::invalid(format!("layers[{i}].key"), e.to_string()))?;
            if l.cost == 0 {
                return Err(Error::invalid(
                    format!("layers[{i}].cost"),
                    "must be at least 1",
                ));
            }
            if l.policy.algorithm() == Algorithm::Concurrency {
                // a layer takes units under no lease the caller could release: they would
                // stay taken until the lease's TTL
                return Err(Error::invalid(
                    format!("layers[{i}]"),
                    format!(
                        "policy \"{}\" is a concurrency policy: acquire() it and release the lease",
                        l.policy.name()
                    ),
                ));
            }
            if layers[..i]
                .iter()
                .any(|o| o.key == l.key && o.policy.name() == l.policy.name())
            {
                return Err(Error::invalid(
                    format!("layers[{i}]"),
                    format!(
                        "duplicate layer ({}, {}): merge their costs into one layer",
                        l.key,
                        l.policy.name()
                    ),
                ));
            }
        }
        if layers.iter().any(|l| l.policy.0.shadow) {
            return self.check_all_shadowed(layers).await;
        }
        self.check_all_enforced(layers).await
    }

    /// [`Limiter::check_all`] of validated layers none of which is in shadow.
    pub(super) async fn check_all_enforced(&self, layers: &[Layer]) -> Result<Decision> {
        if layers.iter().any(|l| l.policy.0.overrides) {
            // each such layer decided under its key's override (`layered_overrides.rs`)
            return self.check_all_overridden(layers).await;
        }
        if layers.iter().any(|l| l.policy.is_multi()) {
            // every limit of a multi-limit policy is a layer of its own
            let (expanded, origin) = super::multi::expand(layers)?;
            return self
                .layered(&expanded, &origin, layers, false, None, &[])
                .await?
                .decided();
        }
        let origin: Vec<(usize, Option<usize>)> = (0..layers.len()).map(|i| (i, None)).collect();
        self.layered(layers, &origin, layers, false, None, &[])
            .await?
            .decided()
    }

    /// A layered check of `layers` (validated), where layer `i` is limit `origin[i].1` (of
    /// a multi-limit policy, else `None`) of `originals[origin[i].0]`, what the caller
    /// asked for; `single`: the caller asked for one check of a multi-limit policy, whose
    /// `tail` (override version, shadow mode) goes in the same script call; `checks`: the
    /// override versions a layered check of policies with overrides decided with, each
    /// compared in the script call of its layer's shard (on Redis).
    pub(super) async fn layered(
        &self,
        layers: &[Layer],
        origin: &[(usize, Option<usize>)],
        originals: &[Layer],
        single: bool,
        tail: Option<&LayeredTail<'_>>,
        checks: &[OverrideCheck<'_>],
    ) -> Result<Layered> {
        tokio::task::consume_budget().await; // see Limiter::run
        let effs = self.layer_limits(layers);
        let mut reqs = layer_reqs(layers, &effs);
        let shadow = tail.is_some_and(|t| t.shadow);
        if shadow {
            // a shadow denial must not enforce anything
            reqs.iter_mut().for_each(|r| r.auto_block = None);
        }
        let view = self.view();
        let (raw, sources, shards) = match &view.engine {
            Engine::Memory(m) => (
                m.check_layers(&reqs, self.now()),
                vec![Source::Memory; layers.len()],
                vec![None; layers.len()],
            ),
            Engine::Redis(r) => {
                for (i, l) in layers.iter().enumerate() {
                    if let Some(ttl) = self.cached_block(&l.key) {
                        let mut d = self.decision(
                            &l.policy.0,
                            &effs[i],
                            blocked_outcome(ttl),
                            Source::Block,
                            None,
                        );
                        describe(&mut d, i, origin, &effs, single);
                        self.count(&l.policy.0.name, &d);
                        return Ok(Layered::Decided(d));
                    }
                }
                let n = r.shards.len() as u32;
                let shard_of: Vec<usize> = layers
                    .iter()
                    .map(|l| shard_index(&l.key, n) as usize)
                    .collect();
                if let Some(h) = &view.handoff {
                    for (i, l) in layers.iter().enumerate() {
                        self.carry_over(h, r, &l.policy.0, &l.key, shard_of[i])
                            .await;
                    }
                }
                let (raw, sources) = match self
                    .layered_groups(r, layers, &reqs, &shard_of, tail, checks)
                    .await?
                {
                    GroupsOut::Raw(raw, sources) => (raw, sources),
                    GroupsOut::Override(None, shard, v) => {
                        return Ok(Layered::Override(shard as u32, v))
                    }
                    GroupsOut::Override(Some(check), shard, entry) => {
                        return Ok(Layered::Overridden {
                            check,
                            shard: shard as u32,
                            entry,
                        })
                    }
                };
                (
                    raw,
                    sources,
                    shard_of.iter().map(|s| Some(*s as u32)).collect(),
                )
            }
        };
        Ok(Layered::Decided(self.conclude(
            layers, origin, originals, single, &effs, raw, &sources, &shards, shadow,
        )))
    }

    /// The limit in force of each layer. No layer is a concurrency limit (`check_all`
    /// rejects one, a multi-limit policy holds none), so no layer takes a lease.
    pub(super) fn layer_limits(&self, layers: &[Layer]) -> Vec<Compiled> {
        let global = self.global_scale();
        layers
            .iter()
            .map(|l| l.policy.0.effective(global))
            .collect()
    }

    /// The decision of a layered check from the engines' answer (`sources`: what decided
    /// each layer, its engine or its policy's `on_error` mode): it describes the layer
    /// that denied (with the longest `retry_after` of all denying layers) or the tightest;
    /// each of the caller's layers is counted once, and a denial or block is reported.
    /// A denial has the source of the layer that denied (a layer decided locally by
    /// `on_error: local` is a local decision, with its share as the limit, as a check of
    /// its policy alone is); an admission is a fallback when any layer's was.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn conclude(
        &self,
        layers: &[Layer],
        origin: &[(usize, Option<usize>)],
        originals: &[Layer],
        single: bool,
        effs: &[Compiled],
        raw: LayeredRaw,
        sources: &[Source],
        shards: &[Option<u32>],
        shadow: bool,
    ) -> Decision {
        // describe the deciding layer, or the tightest one
        let idx = raw.deciding.unwrap_or_else(|| {
            (0..layers.len())
                .min_by_key(|i| raw.outcomes[*i].remaining)
                .unwrap_or(0)
        });
        let blocked = raw.blocked.is_blocked();
        let mut o = raw.outcomes[idx];
        let fell_back = |s: &Source| matches!(s, Source::Fallback | Source::LocalFallback);
        let source = match raw.deciding {
            Some(_) if blocked => Source::Block,
            Some(_) => sources[idx],
            None => sources
                .iter()
                .copied()
                .find(|s| *s == Source::Fallback)
                .or_else(|| sources.iter().copied().find(fell_back))
                .unwrap_or(sources[idx]),
        };
        if raw.deciding.is_some() && !blocked {
            // every denying layer must pass before the request can: wait for the slowest
            let denying: Vec<&Outcome> = raw.outcomes.iter().filter(|o| !o.allowed).collect();
            o.retry_us = if denying.iter().all(|o| o.retry_us.is_some()) {
                denying.iter().filter_map(|o| o.retry_us).max()
            } else {
                None
            };
            o.allowed = false;
        }
        let mut d = self.decision(&layers[idx].policy.0, &effs[idx], o, source, shards[idx]);
        if sources[idx] == Source::LocalFallback {
            d.limit = effs[idx].share(self.view().config.instances).limit;
        }
        describe(&mut d, idx, origin, effs, single);
        if shadow && !d.allowed && !blocked && !fell_back(&sources[idx]) {
            // one check of a multi-limit policy in shadow mode: reported as for one limit
            self.shadow_denial(&layers[idx].policy.0, &layers[idx].key, &mut d);
        }
        if d.allowed && d.limit_index.is_some() {
            // a leaky bucket among the limits shapes the request even when another limit
            // is the tightest: wait for the longest delay of them all
            let mine = (0..layers.len()).filter(|i| origin[*i].0 == origin[idx].0);
            let delay = mine.map(|i| raw.outcomes[i].delay_us).max().unwrap_or(0);
            d.delay = std::time::Duration::from_micros(delay);
        }
        // a layered check's caller gets each layer's own decision, unless a block (no
        // layer was measured) decided
        let each_layer = !single && !blocked;
        let mut each = Vec::with_capacity(if each_layer { originals.len() } else { 0 });
        for (j, l) in originals.iter().enumerate() {
            // each layer the caller asked for is counted once: by the limit that decided
            // for it, else its tightest
            let ld = if j == origin[idx].0 {
                d.clone()
            } else {
                let mine = (0..layers.len()).filter(|i| origin[*i].0 == j);
                let i = mine
                    .clone()
                    .find(|i| !raw.outcomes[*i].allowed)
                    .or_else(|| mine.min_by_key(|i| raw.outcomes[*i].remaining))
                    .unwrap_or(j);
                self.decision(
                    &layers[i].policy.0,
                    &effs[i],
                    raw.outcomes[i],
                    if blocked { source } else { sources[i] },
                    shards[i],
                )
            };
            // counted with the check's verdict; kept with its own
            let own = ld.allowed;
            let mut ld = Decision {
                allowed: d.allowed,
                ..ld
            };
            self.count(&l.policy.0.name, &ld);
            if each_layer {
                ld.allowed = own;
                ld.layer = Some(j);
                each.push(ld);
            }
        }
        d.layers = each;
        if blocked {
            self.on_blocked(
                &layers[idx].policy.0,
                &layers[idx].key,
                &d,
                raw.blocked == BlockVerdict::BlockedNow,
            );
        } else if !d.allowed {
            self.on_denied(&layers[idx].policy.0, &layers[idx].key, &d);
        }
        d
    }

    pub(super) async fn layered_redis(
        &self,
        r: &Arc<RedisEngine>,
        layers: &[Layer],
        reqs: &[LayerReq<'_>],
        shard_of: &[usize],
        tail: Option<&LayeredTail<'_>>,
    ) -> Result<LayeredOut> {
        match self
            .layered_groups(r, layers, reqs, shard_of, tail, &[])
            .await?
        {
            GroupsOut::Raw(raw, sources) => Ok(LayeredOut::Raw(raw, sources)),
            GroupsOut::Override(None, _, v) => Ok(LayeredOut::Override(v)),
            GroupsOut::Override(Some(_), shard, _) => Err(Error::Script {
                shard: r.shards[shard].name.clone(),
                message: "a layered call that compared no override answered with one".into(),
            }),
        }
    }

    /// [`Limiter::layered_redis`], with `checks` compared each in its group's call.
    async fn layered_groups(
        &self,
        r: &Arc<RedisEngine>,
        layers: &[Layer],
        reqs: &[LayerReq<'_>],
        shard_of: &[usize],
        tail: Option<&LayeredTail<'_>>,
        checks: &[OverrideCheck<'_>],
    ) -> Result<GroupsOut> {
        let groups = call_groups(r, layers, shard_of);
        let now = self.now_override();
        let group_checks = checks_by_group(&groups, checks);
        let group_more: Vec<Vec<(OverrideArg, &str, &str)>> = group_checks
            .iter()
            .map(|cs| {
                cs.iter()
                    .map(|c| (checks[*c].ov, checks[*c].policy, checks[*c].key))
                    .collect()
            })
            .collect();
        let group_tails: Vec<Option<LayeredTail<'_>>> = groups
            .iter()
            .zip(&group_more)
            .map(|((_, idx), more)| {
                (!more.is_empty()).then(|| LayeredTail {
                    ov: OverrideArg::Off,
                    policy: "",
                    key: &layers[idx[0]].key,
                    shadow: false,
                    more,
                })
            })
            .collect();
        let calls = groups.iter().enumerate().map(|(g, (shard, idx))| {
            let group: Vec<(LayerReq<'_>, &str)> = idx
                .iter()
                .map(|i| (reqs[*i].clone(), layers[*i].policy.0.key_scope.as_str()))
                .collect();
            let tail = tail.or(group_tails.get(g).and_then(|t| t.as_ref()));
            async move { r.check_layers_with(*shard, &group, now, tail).await }
        });
        let results = futures_util::future::join_all(calls).await;
        let mut out = LayeredRaw {
            now: 0,
            deciding: None,
            blocked: BlockVerdict::Clear,
            outcomes: vec![blocked_outcome(None); layers.len()],
        };
        let mut sources = vec![Source::Redis; layers.len()];
        let mut committed: Vec<(usize, u64)> = Vec::new(); // (group, now)
        let mut first_error = None;
        let mut overridden = None;
        for (g, res) in results.into_iter().enumerate() {
            let idx = &groups[g].1;
            match res {
                // nothing decided in this group: the whole check is made again under the
                // override found (what other groups admitted is given back below)
                Ok(LayeredChecked::Override(v, j)) => {
                    let check = if tail.is_some() {
                        None // the tail's (one key's layers: one group)
                    } else {
                        match group_checks.get(g).and_then(|cs| cs.get(j.checked_sub(1)?)) {
                            Some(c) => Some(*c),
                            None => {
                                return Err(Error::Script {
                                    shard: r.shards[groups[g].0].name.clone(),
                                    message: format!("no override entry {j} in a layered call"),
                                })
                            }
                        }
                    };
                    overridden.get_or_insert((check, groups[g].0, v));
                }
                Ok(LayeredChecked::Decided(raw)) => {
                    for (j, i) in idx.iter().enumerate() {
                        out.outcomes[*i] = raw.outcomes[j];
                    }
                    out.now = raw.now;
                    match raw.deciding {
                        None => committed.push((g, raw.now)),
                        Some(d) => {
                            // the first denying layer of all decides
                            let i = idx[d];
                            if out.deciding.is_none_or(|o| i < o) {
                                out.deciding = Some(i);
                                out.blocked = raw.blocked;
                            }
                        }
                    }
                }
                Err(e) if e.is_backend() => {
                    let mut fb = FellBack {
                        out: &mut out,
                        sources: &mut sources,
                        first_error: &mut first_error,
                    };
                    self.fall_back_group(layers, reqs, idx, &e, &mut fb);
                }
                Err(e) => return Err(e),
            }
        }
        if out.deciding.is_some() || first_error.is_some() || overridden.is_some() {
            self.give_back(r, layers, reqs, &groups, &committed).await;
            // what a given-back group's layers have left is what they had before
            for (g, _) in &committed {
                for i in &groups[*g].1 {
                    let o = &mut out.outcomes[*i];
                    o.remaining = o.remaining.saturating_add(reqs[*i].cost);
                }
            }
        }
        if let Some((check, shard, v)) = overridden {
            return Ok(GroupsOut::Override(check, shard, v));
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok(GroupsOut::Raw(out, sources))
    }
}

/// What [`Limiter::layered_groups`] found: the engines' answer, or (which of the checks,
/// `None` for the tail's; shard; the override entry found), nothing decided.
enum GroupsOut {
    Raw(LayeredRaw, Vec<Source>),
    Override(Option<usize>, usize, Vec<u8>),
}

/// One override version a layered check decided a caller's layer with: compared in the
/// script call of the shard (or slot) of expanded layer `at`, whose key is `key`.
pub(super) struct OverrideCheck<'a> {
    pub at: usize,
    pub ov: OverrideArg,
    /// the base policy's name (whose override entry it is)
    pub policy: &'a str,
    pub key: &'a str,
}

/// What [`Limiter::layered_redis`] found: the engines' answer, or the key's override entry
/// when it is not the one the call was made with (nothing decided).
pub(super) enum LayeredOut {
    /// the answer, and what decided each layer
    Raw(LayeredRaw, Vec<Source>),
    #[allow(dead_code)] // (its one caller, settle.rs, sends no override to compare)
    Override(Vec<u8>),
}

/// What [`Limiter::layered`] found: a decision, or (shard, the key's override entry), or
/// for check `check` of its `checks` the override entry found on `shard`.
pub(super) enum Layered {
    Decided(Decision),
    Override(u32, Vec<u8>),
    Overridden {
        check: usize,
        shard: u32,
        entry: Vec<u8>,
    },
}

impl Layered {
    /// The decision of a call that read no override entry.
    pub(super) fn decided(self) -> Result<Decision> {
        match self {
            Layered::Decided(d) => Ok(d),
            Layered::Override(shard, _) | Layered::Overridden { shard, .. } => Err(Error::Script {
                shard: shard.to_string(),
                message: "an override entry in the reply of a layered check that read none".into(),
            }),
        }
    }
}

/// What the engines take for each layer.
pub(super) fn layer_reqs<'a>(layers: &'a [Layer], effs: &[Compiled]) -> Vec<LayerReq<'a>> {
    layers
        .iter()
        .enumerate()
        .map(|(i, l)| LayerReq {
            scope: &l.policy.0.scope,
            compiled: effs[i],
            key: &l.key,
            cost: l.cost.min(effs[i].limit + 1),
            auto_block: l.policy.0.auto_block,
        })
        .collect()
}

/// Says which layer (of the caller's) and which limit (of a multi-limit policy) `d`
/// describes, with every limit of that policy for `RateLimit-Policy`.
pub(super) fn describe(
    d: &mut Decision,
    idx: usize,
    origin: &[(usize, Option<usize>)],
    effs: &[Compiled],
    single: bool,
) {
    let (layer, limit) = origin[idx];
    d.layer = (!single).then_some(layer);
    if limit.is_some() {
        d.limit_index = limit;
        d.quotas = (0..origin.len())
            .filter(|i| origin[*i].0 == layer)
            .map(|i| Quota {
                limit: effs[i].limit,
                window: std::time::Duration::from_micros(effs[i].window_us()),
            })
            .collect();
    }
}
