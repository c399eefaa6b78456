//! A policy's shadow mode and near-limit fraction; what they do
//! at check time lives in `limiter/shadow.rs`.

use super::{Algorithm, Policy};
use crate::error::{Error, Result};
use std::sync::Arc;

impl Policy {
    /// The same policy in shadow mode (or enforcing again, with `false`): a check that the
    /// limit would deny is allowed, consumes nothing, and is reported
    /// ([`crate::Decision::shadow_denied`], an event, a metric, the shadow counts).
    /// Block-list denials and `on_error` fallbacks are not shadowed. On a multi-limit policy
    /// a would-be denial by any limit is shadowed and consumes nothing in any; with
    /// per-key overrides the key's override decides. Not for concurrency
    /// policies (an `invalid_argument` error): a shadow lease would hold nothing.
    pub fn with_shadow(&self, shadow: bool) -> Result<Policy> {
        if shadow && self.algorithm() == Algorithm::Concurrency {
            return Err(Error::invalid(
                format!("policies.{}.shadow", self.name()),
                "shadow mode does not apply to concurrency policies",
            ));
        }
        let mut p = self.derive(self.0.on_error, self.0.auto_block, self.0.local_admission);
        if let Some(inner) = Arc::get_mut(&mut p.0) {
            inner.shadow = shadow;
        }
        Ok(p)
    }

    /// Whether the policy is in shadow mode.
    pub fn shadow(&self) -> bool {
        self.0.shadow
    }

    /// The same policy with another near-limit fraction: `Some(f)` with 0 < f ≤ 1 emits a
    /// near-limit event when an allowed check takes the key's usage to `ceil(f × limit)`
    /// units or more from below; `None` turns the events off. The default is 0.8.
    pub fn with_near_limit(&self, fraction: Option<f64>) -> Result<Policy> {
        if let Some(f) = fraction {
            validate_near_limit(&format!("policies.{}.near_limit", self.name()), f)?;
        }
        let mut p = self.derive(self.0.on_error, self.0.auto_block, self.0.local_admission);
        if let Some(inner) = Arc::get_mut(&mut p.0) {
            inner.near_limit = fraction;
        }
        Ok(p)
    }

    /// The near-limit fraction, `None` when near-limit events are off.
    pub fn near_limit(&self) -> Option<f64> {
        self.0.near_limit
    }
}

pub(crate) fn validate_near_limit(field: &str, f: f64) -> Result<()> {
    if !(f > 0.0 && f <= 1.0) {
        return Err(Error::config(
            field,
            format!("must be a fraction > 0 and <= 1 (or null/false to turn near-limit events off), got {f}"),
        ));
    }
    Ok(())
}
