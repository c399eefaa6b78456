//! Scaling limits down under stress: a global factor, per-policy factors, a health hook.

use super::Limiter;
use crate::error::{Error, Result};
use crate::policy::validate_scale;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A function from a health signal the application supplies (dependency p99 latency in
/// seconds, error rate, queue depth...) to a scale factor in (0, 1].
pub type ScaleHook = Arc<dyn Fn(f64) -> f64 + Send + Sync>;

/// A [`ScaleHook`] for latency: full limits while `signal` (seconds) is at or under
/// `target`, proportionally less above it (`target / signal`), never below `min_factor`.
pub fn latency_scale(target: Duration, min_factor: f64) -> ScaleHook {
    let t = target.as_secs_f64();
    let min = min_factor.clamp(f64::MIN_POSITIVE, 1.0);
    Arc::new(move |signal: f64| {
        if signal <= t || signal.is_nan() {
            1.0
        } else {
            (t / signal).clamp(min, 1.0)
        }
    })
}

impl Limiter {
    /// Scales limits by `factor` (0 < factor ≤ 1): every policy when `policies` is empty,
    /// else the named ones. Decisions and headers report the effective limit.
    pub fn set_scale(&self, factor: f64, policies: &[&str]) -> Result<()> {
        validate_scale(factor)?;
        if policies.is_empty() {
            self.inner
                .global_scale
                .store(factor.to_bits(), Ordering::Relaxed);
            return Ok(());
        }
        let found = policies
            .iter()
            .map(|n| self.policy(n))
            .collect::<Result<Vec<_>>>()?;
        for p in found {
            p.set_scale(factor)?;
        }
        Ok(())
    }

    /// The global scale factor (policies may have their own on top).
    pub fn scale(&self) -> f64 {
        f64::from_bits(self.inner.global_scale.load(Ordering::Relaxed))
    }

    /// Installs the hook [`Limiter::observe_health`] uses to turn a health signal into the
    /// global scale factor (see [`latency_scale`]).
    pub fn set_scale_hook(&self, hook: ScaleHook) {
        *self.inner.scale_hook.lock() = Some(hook);
    }

    /// Feeds a health signal to the scale hook and applies the factor it returns (clamped
    /// to (0, 1]). Returns the factor now in force.
    pub fn observe_health(&self, signal: f64) -> Result<f64> {
        let hook = self.inner.scale_hook.lock().clone().ok_or_else(|| {
            Error::invalid("scale_hook", "no scale hook installed (set_scale_hook)")
        })?;
        let f = hook(signal);
        let f = if f.is_nan() { 1.0 } else { f.clamp(1e-6, 1.0) };
        self.set_scale(f, &[])?;
        Ok(f)
    }
}
