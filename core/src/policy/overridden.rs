//! The policy a per-key override makes (`limiter/overrides.rs`): the base policy's name,
//! failure mode, automatic blocking, shadow mode, near-limit fraction and scale, and the
//! override's limits. Built from [`Policy::derive`], the one copy of every field, so that
//! a field added to `PolicyInner` cannot be forgotten here.
//!
//! State scopes (`docs/keys.md`): an override of one limit keeps the policy's scope
//! (`name:code:`, so an override of the policy's own algorithm decides on the key's
//! existing state, and one of another algorithm has state of its own); limit `i` of an
//! override of several limits is scoped `name#o<i>` (Redis `name#o<i>:code:`), which no
//! policy name (no `#`) and no limit of a multi-limit policy (`name#<digits>`) can spell.

use super::{Algorithm, Limit, Policy};
use crate::error::{Error, Result};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl Policy {
    /// The policy an override of this one with `limits` (one, or several checked together)
    /// makes. Errors are `invalid_argument` (`limit`) naming the bad part.
    pub(crate) fn overridden(&self, limits: Vec<Limit>) -> Result<Policy> {
        let field = format!("overrides.{}", self.0.name);
        let invalid = |e: Error| match e {
            Error::Config { field, message } => {
                Error::invalid("limit", format!("{field}: {message}"))
            }
            other => other,
        };
        if limits.len() == 1 {
            let limit = limits.into_iter().next().expect("one limit");
            return self.overridden_one(limit, &field).map_err(invalid);
        }
        // validates the set (count, no concurrency limit), as a config's multi-limit policy
        let multi = Policy::build_multi(&self.0.name, limits.clone(), self.0.on_error, &field)
            .map_err(invalid)?;
        let parts = limits
            .into_iter()
            .enumerate()
            .map(|(i, limit)| {
                let mut part = self.overridden_one(limit, &format!("{field}.limits[{i}]"))?;
                let inner = Arc::get_mut(&mut part.0).expect("a policy just made is not shared");
                let scope = format!("{}#o{i}:{}:", inner.name, inner.compiled.state_code());
                inner.key_scope = scope.clone();
                // (the in-memory engine keys state by scope alone: the code keeps apart
                // the state of two overrides of other algorithms)
                inner.scope = Arc::from(scope);
                // a limit of the override is checked as a layer: it reads no override
                inner.overrides = false;
                Ok(part)
            })
            .collect::<Result<Vec<Policy>>>()
            .map_err(invalid)?;
        let mut p = self.derive(self.0.on_error, self.0.auto_block, None);
        let inner = Arc::get_mut(&mut p.0).expect("a policy just derived is not shared");
        inner.limit = multi.0.limit.clone();
        inner.compiled = parts[0].0.compiled;
        inner.key_scope = parts[0].0.key_scope.clone();
        inner.parts = Some(parts.into());
        Ok(p)
    }

    fn overridden_one(&self, limit: Limit, field: &str) -> Result<Policy> {
        let b = &*self.0;
        let mut compiled = limit.compile(field)?;
        let (was, now) = (b.compiled.algorithm, compiled.algorithm);
        if (was == Algorithm::Concurrency) != (now == Algorithm::Concurrency) {
            return Err(Error::invalid(
                "limit",
                format!(
                    "policy {} is {was}: its override must {}be a concurrency limit, got {now}",
                    b.name,
                    if was == Algorithm::Concurrency {
                        ""
                    } else {
                        "not "
                    }
                ),
            ));
        }
        if now.is_windowed() {
            // the policy's window placement holds for its overrides too
            compiled.window_offset = b.compiled.window_offset;
        }
        let mut p = self.derive(b.on_error, b.auto_block, None);
        let inner = Arc::get_mut(&mut p.0).expect("a policy just derived is not shared");
        inner.key_scope = format!("{}:{}:", b.name, compiled.state_code());
        // the in-memory engine keys state by scope alone: another algorithm's is apart
        inner.scope = match now == was {
            true => b.name.clone(),
            false => Arc::from(inner.key_scope.as_str()),
        };
        inner.limit = limit;
        inner.compiled = compiled;
        inner.parts = None;
        inner.overrides = true;
        Ok(p)
    }

    /// Gives this policy (an override's) the scale factor of `base` when it differs: an
    /// override follows its policy's `set_scale`, made after the override was cached.
    #[inline]
    pub(crate) fn follow_scale(&self, base: &Policy) {
        let f = base.0.scale.load(Relaxed);
        if self.0.scale.load(Relaxed) != f {
            self.0.scale.store(f, Relaxed);
            for part in self.0.parts.iter().flat_map(|p| p.iter()) {
                part.0.scale.store(f, Relaxed);
            }
        }
    }
}
