//! The counters a limiter keeps and the snapshot it exports. They belong to the limiter,
//! by policy name: two limiters sharing a `Policy` count apart, ad-hoc policies with one
//! name (an ad-hoc limit's name is its [`crate::Limit::id`]) share one series, and a
//! reload keeps every count.

use super::{Engine, Limiter};
use crate::config::Config;
use crate::decision::{Decision, Source};
use crate::metrics::{LatencySnapshot, MetricsSnapshot, PolicyCounters};
use crate::policy::PolicyInner;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Counters by policy name.
pub(super) type Series = HashMap<Arc<str>, Arc<PolicyCounters>, foldhash::fast::RandomState>;

/// Ad-hoc series a limiter keeps at most (beyond, ad-hoc policies go uncounted).
const MAX_ADHOC_SERIES: usize = 10_000;

/// The series of `config`'s policies: the ones `old` or `adhoc` has by that name, else new.
pub(super) fn config_series(config: &Config, old: Option<&Series>, adhoc: &Series) -> Series {
    config
        .policies
        .keys()
        .map(|name| {
            let kept = old
                .and_then(|o| o.get(name.as_str()))
                .or_else(|| adhoc.get(name.as_str()));
            (Arc::from(name.as_str()), kept.cloned().unwrap_or_default())
        })
        .collect()
}

impl Limiter {
    /// Counters per policy and the Redis latency histogram.
    pub fn metrics(&self) -> MetricsSnapshot {
        let view = self.view();
        let mut policies: Vec<_> = view
            .config
            .policies
            .keys()
            .filter_map(|n| view.series.get(n.as_str()).map(|c| c.snapshot(n)))
            .collect();
        let adhoc = self.inner.adhoc.load();
        let mut extra: Vec<_> = adhoc
            .iter()
            .filter(|(n, _)| !view.series.contains_key(&***n))
            .map(|(n, c)| c.snapshot(n))
            .collect();
        extra.sort_by(|a, b| a.policy.cmp(&b.policy));
        policies.extend(extra);
        let (redis_latency, events_dropped) = match &view.engine {
            Engine::Redis(r) => (
                r.latency.snapshot(),
                r.events_dropped.load(Ordering::Relaxed),
            ),
            Engine::Memory(_) => (LatencySnapshot::default(), 0),
        };
        MetricsSnapshot {
            policies,
            redis_latency,
            events_dropped,
            late_leases_released: self.inner.late.released.load(Ordering::Relaxed),
            late_lease_releases_dropped: self.inner.late.dropped.load(Ordering::Relaxed),
        }
    }

    /// Runs `f` on the counters of policy `name`: a hash lookup in the config's series,
    /// else in the ad-hoc ones (no lock, no allocation), else a new ad-hoc series.
    #[inline]
    pub(super) fn with_counters(&self, name: &str, f: impl FnOnce(&PolicyCounters)) {
        if let Some(c) = self.inner.view.load().series.get(name) {
            return f(c);
        }
        if let Some(c) = self.inner.adhoc.load().get(name) {
            return f(c);
        }
        if let Some(c) = self.add_adhoc_series(name) {
            f(&c)
        }
    }

    /// Runs `f` on the counters of policy `p`: from the policy's slot when this limiter
    /// resolved them before (one load), else by name, then kept in the slot.
    #[inline(always)]
    pub(super) fn with_policy_counters(&self, p: &PolicyInner, f: impl FnOnce(&PolicyCounters)) {
        if let Some(c) = p.hot.get(self.inner.id) {
            return f(c);
        }
        if let Some(c) = self.resolve_counters(&p.name) {
            p.hot.offer(self.inner.id, &c);
            f(&c)
        }
    }

    /// The series of `name`, made when new (`None` past [`MAX_ADHOC_SERIES`]).
    #[cold]
    fn resolve_counters(&self, name: &str) -> Option<Arc<PolicyCounters>> {
        if let Some(c) = self.inner.view.load().series.get(name) {
            return Some(c.clone());
        }
        if let Some(c) = self.inner.adhoc.load().get(name) {
            return Some(c.clone());
        }
        self.add_adhoc_series(name)
    }

    #[cold]
    fn add_adhoc_series(&self, name: &str) -> Option<Arc<PolicyCounters>> {
        let _adding = self.inner.adhoc_add.lock();
        // a reload stores its view under this lock: the view is current here, and a name
        // it has is never given a second series
        if let Some(c) = self.inner.view.load().series.get(name) {
            return Some(c.clone());
        }
        let current = self.inner.adhoc.load_full();
        if let Some(c) = current.get(name) {
            return Some(c.clone());
        }
        if current.len() >= MAX_ADHOC_SERIES {
            return None;
        }
        let c = Arc::new(PolicyCounters::default());
        let mut next = (*current).clone();
        next.insert(Arc::from(name), c.clone());
        self.inner.adhoc.store(Arc::new(next));
        Some(c)
    }

    /// Counts decision `d` of policy `name`.
    #[inline]
    pub(super) fn count(&self, name: &str, d: &Decision) {
        self.with_counters(name, |c| tally(c, d));
    }

    /// Counts decision `d` of policy `p` (its counters resolved once, not by name).
    #[inline]
    pub(super) fn count_policy(&self, p: &PolicyInner, d: &Decision) {
        self.with_policy_counters(p, |c| tally(c, d));
    }
}

#[inline]
fn tally(c: &PolicyCounters, d: &Decision) {
    if d.allowed {
        c.allowed.fetch_add(1, Ordering::Relaxed);
    } else {
        c.denied.fetch_add(1, Ordering::Relaxed);
    }
    match d.source {
        Source::Block => {
            c.blocked.fetch_add(1, Ordering::Relaxed);
        }
        Source::Fallback | Source::LocalFallback => {
            c.fallback.fetch_add(1, Ordering::Relaxed);
        }
        Source::Local => {
            c.local_admitted.fetch_add(1, Ordering::Relaxed);
        }
        _ => {}
    }
}
