//! The counters a limiter keeps and the snapshot it exports.

use super::{Engine, Limiter};
use crate::decision::{Decision, Source};
use crate::metrics::{LatencySnapshot, MetricsSnapshot};
use crate::policy::{Policy, PolicyInner};
use std::sync::atomic::Ordering;

impl Limiter {
    /// Counters per policy and the Redis latency histogram.
    pub fn metrics(&self) -> MetricsSnapshot {
        let mut policies: Vec<_> = self
            .view()
            .config
            .policies
            .iter()
            .map(|(n, p)| p.0.counters.snapshot(n))
            .collect();
        policies.extend(
            self.inner
                .adhoc
                .lock()
                .iter()
                .map(|p| p.0.counters.snapshot(p.name())),
        );
        let (redis_latency, events_dropped) = match &self.view().engine {
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
        }
    }

    #[inline]
    pub(super) fn register(&self, policy: &Policy) {
        if !policy.0.registered.load(Ordering::Relaxed) {
            self.register_slow(policy);
        }
    }

    #[cold]
    pub(super) fn register_slow(&self, policy: &Policy) {
        if !policy.0.registered.swap(true, Ordering::Relaxed) {
            let mut adhoc = self.inner.adhoc.lock();
            if adhoc.len() < 10_000 {
                adhoc.push(policy.clone());
            }
        }
    }

    #[inline]
    pub(super) fn count(&self, p: &PolicyInner, d: &Decision) {
        let c = &p.counters;
        if d.allowed {
            c.allowed.fetch_add(1, Ordering::Relaxed);
        } else {
            c.denied.fetch_add(1, Ordering::Relaxed);
        }
        match d.source {
            Source::Block => {
                c.blocked.fetch_add(1, Ordering::Relaxed);
            }
            Source::Fallback => {
                c.fallback.fetch_add(1, Ordering::Relaxed);
            }
            Source::Local => {
                c.local_admitted.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}
