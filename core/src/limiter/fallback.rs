//! Decisions without the backend: the policy's `on_error` mode.

use super::{Limiter, CLOSED_RETRY_AFTER};
use crate::decision::{Decision, Source};
use crate::engine::outcome::Outcome;
use crate::engine::CallMode;
use crate::error::{Error, Result};
use crate::events::Event;
use crate::log::LogReason;
use crate::policy::{Compiled, OnError, PolicyInner};
use std::sync::atomic::Ordering;

impl Limiter {
    /// Decides with the policy's `on_error` mode after a backend failure.
    pub(super) fn fallback(
        &self,
        p: &PolicyInner,
        eff: &Compiled,
        key: &str,
        cost: u64,
        call: CallMode<'_>,
        e: Error,
    ) -> Result<Decision> {
        // the limits after the first of a multi-limit policy (scoped `name#i`) fall back
        // with it: one failure is counted and reported once, by the first
        let primary = *p.scope == *p.name;
        if primary {
            self.with_counters(&p.name, |c| {
                c.redis_errors.fetch_add(1, Ordering::Relaxed);
            });
        }
        if p.on_error == OnError::Error {
            return Err(e); // (the caller's own key may be named: the caller has it)
        }
        // the error's text may name the key (a Redis key, or the core's own words), which
        // no log line holds
        let e = e.without_keys(Some(key));
        let o = match p.on_error {
            // nothing was measured: no invented budget (Decision::measured)
            OnError::Open => Outcome {
                allowed: true,
                remaining: 0,
                reset_us: 0,
                retry_us: None,
                delay_us: 0,
            },
            OnError::Closed => Outcome {
                allowed: false,
                remaining: 0,
                reset_us: CLOSED_RETRY_AFTER.as_micros() as u64,
                retry_us: Some(CLOSED_RETRY_AFTER.as_micros() as u64),
                delay_us: 0,
            },
            _ => {
                let share = eff.share(self.view().config.instances);
                self.inner
                    .fallback
                    .check(
                        &p.scope,
                        &share,
                        key,
                        self.now(),
                        cost.min(share.limit + 1),
                        // (a local decision takes no lease: the units are the share's)
                        if call.is_peek() {
                            CallMode::Peek
                        } else {
                            CallMode::Check
                        },
                        None,
                    )
                    .outcome
            }
        };
        let source = if p.on_error == OnError::Local {
            Source::LocalFallback
        } else {
            Source::Fallback
        };
        let mut d = self.decision(p, eff, o, source, None);
        if p.on_error == OnError::Local {
            d.limit = eff.share(self.view().config.instances).limit;
        }
        tracing::debug!(policy = %p.name, key, error = %e, allowed = d.allowed, "shardlimit: fallback decision");
        if primary {
            // rate-limited: one line per policy per `log_interval` (crate::log)
            self.inner.subscribers.log.note(
                self.now(),
                LogReason::Fallback,
                &p.name,
                &e,
                Some(d.allowed),
            );
        }
        if primary && self.inner.subscribers.active() {
            self.inner.subscribers.emit(&Event::Fallback {
                policy: p.name.clone(),
                key: key.to_string(),
                error: e,
                allowed: d.allowed,
            });
        }
        Ok(d)
    }
}

impl Limiter {
    /// The decision `layers` get from their policies' `on_error` modes, without asking the
    /// backend, after a failure the caller observed itself: for a caller whose own deadline
    /// is shorter than the config's `timeout_ms` (a gateway answering Envoy within the gRPC
    /// deadline gives up on the call and decides with this). Each layer is decided as a
    /// failed layer of [`Limiter::check_all`] is (a cost of 0 is a peek); the decision
    /// describes the first layer that denies, else the one with the fewest units left, and
    /// `layer` is its index when there are several. An `on_error: error` layer returns
    /// `error`.
    pub fn fallback_decision(&self, layers: &[super::Layer], error: Error) -> Result<Decision> {
        let global = self.global_scale();
        let mut best: Option<(usize, Decision)> = None;
        for (i, l) in layers.iter().enumerate() {
            let eff = l.policy.0.effective(global);
            let mut d = self.fallback(
                &l.policy.0,
                &eff,
                &l.key,
                l.cost.max(1),
                if l.cost == 0 {
                    CallMode::Peek
                } else {
                    CallMode::Check
                },
                error.clone(),
            )?;
            if layers.len() > 1 {
                d.layer = Some(i);
            }
            let better = match &best {
                None => true,
                Some((_, b)) => {
                    (b.allowed && !d.allowed)
                        || (b.allowed == d.allowed && d.allowed && d.remaining < b.remaining)
                }
            };
            if better {
                best = Some((i, d));
            }
        }
        best.map(|(_, d)| d)
            .ok_or_else(|| Error::invalid("layers", "must not be empty"))
    }
}
