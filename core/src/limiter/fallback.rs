//! Decisions without the backend: the policy's `on_error` mode.

use super::{Limiter, CLOSED_RETRY_AFTER};
use crate::decision::{Decision, Source};
use crate::engine::outcome::Outcome;
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
        peek: bool,
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
                        peek,
                        None,
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
