//! Local admission: units reserved from Redis in batches and admitted in process.

use super::{Limiter, PolicyKey};
use crate::decision::{Decision, Source};
use crate::engine::outcome::Outcome;
use crate::engine::outcome::Raw;
use crate::engine::redis::{Checked, Mode, RedisEngine};
use crate::engine::CallMode;
use crate::error::{Error, Result};
use crate::policy::{Algorithm, Compiled, PolicyInner};
use std::sync::Arc;

/// Units reserved from Redis for local admission.
#[derive(Debug, Clone, Copy)]
pub(super) struct LocalBatch {
    /// A reservation for this key is in flight: other callers check Redis directly
    /// instead of reserving too, so one instance holds at most one batch per key.
    fetching: bool,
    units: u64,
    expires_at: u64,
    global_remaining: u64,
    reset_at: u64,
}

impl Limiter {
    /// Local admission: admit from a batch reserved in Redis; reserve a new batch (one
    /// round trip) when it is used up or expired. The batch is sized from the global
    /// remaining and shrinks to the request's own cost as the limit nears. One reservation
    /// per key is in flight per limiter; meanwhile other callers are decided by Redis.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn local_admission(
        &self,
        r: &Arc<RedisEngine>,
        p: &PolicyInner,
        eff: &Compiled,
        la: crate::policy::LocalAdmission,
        key: &str,
        shard: u32,
        cost: u64,
    ) -> Result<Decision> {
        let lkey = PolicyKey::new(&p.name, key);
        let now = self.now();
        let reserve_from = {
            let mut map = self.inner.local.lock();
            // (a batch being reserved stays: it holds the one reservation of its key)
            map.sweep(now, |b| b.fetching);
            let b = map.get_or_insert_with(lkey.clone(), 0, || LocalBatch {
                fetching: false,
                units: 0,
                expires_at: 0,
                global_remaining: eff.limit,
                reset_at: 0,
            });
            if b.expires_at > now && b.units >= cost {
                b.units -= cost;
                let o = Outcome {
                    allowed: true,
                    remaining: b.global_remaining + b.units,
                    reset_us: b.reset_at.saturating_sub(now),
                    retry_us: None,
                    delay_us: 0,
                };
                drop(map);
                let d = self.decision(p, eff, o, Source::Local, Some(shard));
                self.count(&p.name, &d);
                return Ok(d);
            }
            if b.fetching {
                None
            } else {
                b.fetching = true;
                Some(b.global_remaining)
            }
        };
        let (batch, mode) = match reserve_from {
            Some(remaining) => {
                let instances = self.view().config.instances.max(1) as u64;
                let batch = (remaining / (2 * instances))
                    .clamp(1, la.max_batch)
                    .max(cost);
                (batch, Mode::Grant { need: cost })
            }
            // another caller is reserving this key's next batch: decide this one in Redis
            None => (cost, Mode::Check),
        };
        let req = self.request(p, eff, key, batch, mode, None);
        let raw = r.check(shard as usize, &req).await;
        let reserving = reserve_from.is_some();
        let raw = match raw {
            Ok(Checked::Decided(raw)) => Ok(raw),
            // a policy with local admission takes no overrides: its script reads none
            Ok(Checked::Override(_)) => Err(Error::Internal(
                "an override entry in the reply of a check that sent none".into(),
            )),
            Err(e) => Err(e),
        };
        let raw = match raw {
            Ok(raw) => raw,
            Err(e) => {
                if reserving {
                    if let Some(b) = self.inner.local.lock().get_mut(&lkey) {
                        b.fetching = false;
                    }
                }
                if !e.is_backend() {
                    return Err(e);
                }
                let d = self.fallback(p, eff, key, cost, CallMode::Check, e)?;
                self.count(&p.name, &d);
                return Ok(d);
            }
        };
        let mut o = raw.outcome;
        if reserving {
            let mut map = self.inner.local.lock();
            let b = map.get_or_insert_with(lkey.clone(), 0, || LocalBatch {
                fetching: false,
                units: 0,
                expires_at: 0,
                global_remaining: 0,
                reset_at: 0,
            });
            b.fetching = false;
            if raw.outcome.allowed && !raw.blocked.is_blocked() {
                let left = raw.granted.saturating_sub(cost);
                // reserved units may be used until the window they were counted in ends
                let window_left = match eff.algorithm {
                    Algorithm::FixedWindow => raw.outcome.reset_us,
                    Algorithm::SlidingWindow => raw.outcome.reset_us.saturating_sub(eff.period_us),
                    _ => u64::MAX,
                };
                if b.expires_at <= now {
                    // units of an expired batch lapse
                    b.units = 0;
                }
                b.units += left;
                b.expires_at = now + (la.max_hold.as_micros() as u64).min(window_left);
                b.global_remaining = raw.outcome.remaining;
                b.reset_at = now + raw.outcome.reset_us;
                o.remaining += b.units;
            } else {
                b.global_remaining = 0;
            }
            let expires_at = b.expires_at;
            map.set_expiry(&lkey, expires_at);
        }
        let d = self.finish(
            p,
            eff,
            key,
            Raw { outcome: o, ..raw },
            Source::Redis,
            Some(shard),
        );
        self.count(&p.name, &d);
        Ok(d)
    }
}
