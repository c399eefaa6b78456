//! Multi-limit policies: one name, several limits checked together (`"100/hour; 1000/day"`,
//! or `"limits": [...]` in the config). Each limit is a policy of the same name with a state
//! of its own; a check of the policy is a layered check of its limits on one key, so it is
//! decided atomically in one script call on the key's shard (`limiter/multi.rs`).
//!
//! State scopes: the first limit keeps the policy's own scope (`name`, Redis `name:algo:`),
//! so adding a limit to a policy keeps the budget of the limit it had; limit `i > 0` is
//! scoped `name#i` (Redis `name#i:algo:`). Policy names never hold `#` or `:`, so no scope
//! of one policy can spell another policy's, and the key layout stays collision-free
//! (`docs/keys.md`).

use super::{Algorithm, Limit, OnError, Policy, PolicyInner};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// The most limits one policy may hold (a layered check takes at most 64 layers).
pub(crate) const MAX_LIMITS: usize = 16;
/// What separates a policy's name from the index of its limit in a state scope (`api#1`).
const PART_SCOPE_SEP: char = '#';

impl Policy {
    /// A policy named `name` holding every limit of `limits`, checked together: a check is
    /// allowed only when every limit allows, and a denial consumes nothing in any of them.
    /// One limit gives a plain policy. Concurrency limits cannot be combined (a lease has
    /// one budget to return to).
    pub fn multi(name: &str, limits: Vec<Limit>) -> Result<Policy> {
        Policy::build_multi(
            name,
            limits,
            OnError::default(),
            &format!("policies.{name}"),
        )
        .map(Policy::ad_hoc)
    }

    pub(crate) fn build_multi(
        name: &str,
        limits: Vec<Limit>,
        on_error: OnError,
        field: &str,
    ) -> Result<Policy> {
        if limits.is_empty() {
            return Err(Error::config(
                format!("{field}.limits"),
                "must hold at least one limit",
            ));
        }
        if limits.len() > MAX_LIMITS {
            return Err(Error::config(
                format!("{field}.limits"),
                format!("at most {MAX_LIMITS} limits, got {}", limits.len()),
            ));
        }
        if limits.len() == 1 {
            let limit = limits.into_iter().next().expect("one limit");
            return Policy::build(name, limit, on_error, field);
        }
        let mut parts = Vec::with_capacity(limits.len());
        for (i, limit) in limits.into_iter().enumerate() {
            let f = format!("{field}.limits[{i}]");
            if limit.algorithm() == Algorithm::Concurrency {
                return Err(Error::config(
                    format!("{f}.algorithm"),
                    "a concurrency limit cannot be part of a multi-limit policy (its leases have one budget to return to); give it a policy of its own",
                ));
            }
            let part = Policy::build(name, limit, on_error, &f)?;
            parts.push(if i == 0 { part } else { part.rescoped(i) });
        }
        let first = &parts[0].0;
        Ok(Policy(Arc::new(PolicyInner {
            name: first.name.clone(),
            limit: first.limit.clone(),
            compiled: first.compiled,
            on_error,
            auto_block: None,
            local_admission: None,
            key_scope: first.key_scope.clone(),
            scale: AtomicU64::new(1.0f64.to_bits()),
            scope: first.scope.clone(),
            memory_seed: first.memory_seed,
            shadow: false,
            near_limit: first.near_limit,
            overrides: false,
            parts: Some(parts.into()),
            hot: Default::default(),
            adhoc: false,
        })))
    }

    /// An anonymous policy of `limits` (one, or several checked together), named after
    /// their parameters ([`Limit::id`]s joined by `--`, or `multi-<hash>` when that is
    /// longer than a name may be): what an ad-hoc limit given to a check becomes.
    pub fn from_limits(limits: Vec<Limit>) -> Result<Policy> {
        if limits.len() == 1 {
            return Policy::try_from(limits.into_iter().next().expect("one limit"));
        }
        let mut id = limits.iter().map(Limit::id).collect::<Vec<_>>().join("--");
        if id.len() > 128 {
            use std::hash::Hasher;
            let mut h = twox_hash::XxHash64::with_seed(0);
            h.write(id.as_bytes());
            id = format!("multi-{:016x}", h.finish());
        }
        Policy::build_multi(&id, limits, OnError::default(), "limit").map(Policy::ad_hoc)
    }

    /// An anonymous policy of a rate string (`"10/second; 1000/day"`) of `algorithm`:
    /// how every binding takes a rate string where an ad-hoc limit is accepted. Errors are
    /// `invalid_argument` (`rate`) naming the bad part, or the limit's own validation.
    pub fn from_rate(text: &str, algorithm: Algorithm) -> Result<Policy> {
        let limits = crate::rate::parse_rate_as(text, algorithm)?;
        Policy::from_limits(limits).map_err(|e| match e {
            Error::Config { field, message } => {
                Error::invalid("rate", format!("{field}: {message} (in {text:?})"))
            }
            other => other,
        })
    }

    /// This limit, as limit `i` of a multi-limit policy: scoped `name#i`.
    fn rescoped(&self, i: usize) -> Policy {
        let p = &self.0;
        let scope = format!("{}{PART_SCOPE_SEP}{i}", p.name);
        Policy(Arc::new(PolicyInner {
            name: p.name.clone(),
            limit: p.limit.clone(),
            compiled: p.compiled,
            on_error: p.on_error,
            auto_block: p.auto_block,
            local_admission: None,
            key_scope: format!("{scope}:{}:", p.compiled.state_code()),
            scale: AtomicU64::new(p.scale.load(Relaxed)),
            memory_seed: crate::key::hash::scope_seed(&scope),
            scope: Arc::from(scope),
            parts: None,
            shadow: p.shadow,
            near_limit: p.near_limit,
            overrides: false,
            hot: Default::default(),
            adhoc: p.adhoc,
        }))
    }

    /// Every limit of this policy, in the order configured (one for a plain policy).
    pub fn limits(&self) -> Vec<Limit> {
        match &self.0.parts {
            Some(parts) => parts.iter().map(|p| p.0.limit.clone()).collect(),
            None => vec![self.0.limit.clone()],
        }
    }

    /// True when the policy holds more than one limit.
    pub fn is_multi(&self) -> bool {
        self.0.parts.is_some()
    }

    /// The limits of a multi-limit policy as policies of its name, each with its own state
    /// (a peek of one reads that limit alone); `None` for a plain one.
    pub fn parts(&self) -> Option<&[Policy]> {
        self.0.parts.as_deref()
    }
}

/// Local admission reserves batches of one budget; a multi-limit policy has several.
pub(crate) fn refuse_local(policy: &Policy, field: &str) -> Result<()> {
    if policy.is_multi() {
        return Err(Error::config(
            field,
            format!(
                "local admission cannot apply to the multi-limit policy {} ({} limits): it reserves batches of one limit's budget",
                policy.name(),
                policy.limits().len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn scopes_and_accessors() {
        let p = Policy::multi(
            "api",
            vec![
                Limit::fixed_window(10, Duration::from_secs(1)),
                Limit::fixed_window(1000, Duration::from_secs(86_400)),
                Limit::token_bucket(5, 1.0),
            ],
        )
        .unwrap();
        assert!(p.is_multi());
        assert_eq!(p.limits().len(), 3);
        assert_eq!(p.max(), 10);
        assert_eq!(p.algorithm(), Algorithm::FixedWindow);
        let parts = p.parts().unwrap();
        let scopes: Vec<&str> = parts.iter().map(|q| q.0.key_scope.as_str()).collect();
        assert_eq!(scopes, ["api:fw:", "api#1:fw:", "api#2:tb:"]);
        assert!(parts.iter().all(|q| q.name() == "api"));
        p.set_scale(0.5).unwrap();
        assert!(parts.iter().all(|q| q.scale() == 0.5));
        let one = Policy::multi("one", vec![Limit::fixed_window(1, Duration::from_secs(1))]);
        assert!(!one.unwrap().is_multi());
    }

    #[test]
    fn ad_hoc_policies_of_rate_strings() {
        let p = Policy::from_rate("10/second; 1000/day", Algorithm::FixedWindow).unwrap();
        assert!(p.is_multi());
        assert_eq!(
            p.name(),
            "fixed_window-10-1000ms--fixed_window-1000-86400000ms"
        );
        let one = Policy::from_rate("5/minute", Algorithm::TokenBucket).unwrap();
        assert_eq!(one.limits(), [Limit::token_bucket(5, 5.0 / 60.0)]);
        let long = ["1/second"; 9].join(";");
        let p = Policy::from_rate(&long, Algorithm::SlidingWindow).unwrap();
        assert!(
            p.name().starts_with("multi-") && p.name().len() == 22,
            "{}",
            p.name()
        );
        let e = Policy::from_rate("5/fortnight", Algorithm::FixedWindow).unwrap_err();
        assert!(
            e.is_invalid_argument() && e.to_string().contains("fortnight"),
            "{e}"
        );
        let e = Policy::from_rate("1/2 years", Algorithm::FixedWindow).unwrap_err();
        assert!(
            e.is_invalid_argument() && e.to_string().contains("366d"),
            "{e}"
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let e = Policy::multi(
            "api",
            vec![
                Limit::fixed_window(10, Duration::from_secs(1)),
                Limit::concurrency(3, Duration::from_secs(1)),
            ],
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("policies.api.limits[1].algorithm"),
            "{e}"
        );
        let e = Policy::multi("api", vec![]).unwrap_err();
        assert!(e.to_string().contains("policies.api.limits"), "{e}");
        let p = Policy::multi(
            "api",
            vec![
                Limit::fixed_window(10, Duration::from_secs(1)),
                Limit::fixed_window(0, Duration::from_secs(1)),
            ],
        )
        .unwrap_err();
        assert!(
            p.to_string().contains("policies.api.limits[1].limit"),
            "{p}"
        );
        let m = Policy::multi(
            "api",
            vec![
                Limit::fixed_window(10, Duration::from_secs(1)),
                Limit::fixed_window(100, Duration::from_secs(60)),
            ],
        )
        .unwrap();
        let e = m
            .with_local_admission(crate::policy::LocalAdmission {
                max_batch: 10,
                max_hold: Duration::from_secs(1),
            })
            .unwrap_err();
        assert!(e.to_string().contains("multi-limit"), "{e}");
    }
}
