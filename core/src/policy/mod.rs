//! Limits (an algorithm with its parameters) and policies (a named, validated limit).

mod shadow;
use crate::error::{Error, Result};
pub(crate) use shadow::validate_near_limit;

mod offset;
pub(crate) mod precision;
pub use offset::{window_offset_us, WindowOffset, WINDOW_OFFSET_SEED};

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

mod multi;
pub(crate) use multi::MAX_LIMITS;
mod limit;
mod overridden;
use limit::period;
pub(crate) use limit::Compiled;
pub use limit::Limit;

/// The largest limit, capacity or cost shardlimit accepts. Redis scripts compute in IEEE
/// doubles, so every quantity they handle must stay an exact integer (< 2^53).
pub const MAX_LIMIT: u64 = 1_000_000_000_000;
/// The longest window, lease or refill period accepted: 366 days.
pub const MAX_PERIOD_US: u64 = 366 * 86_400_000_000;
/// The shortest window or lease accepted: one millisecond.
pub const MIN_PERIOD_US: u64 = 1_000;
/// The longest time a bucket may take to refill completely (about 35 years, in µs):
/// keeps `capacity × interval` exact in a double.
pub const MAX_BUCKET_SPAN_US: u64 = 1 << 50;

/// A rate-limiting algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    TokenBucket,
    LeakyBucket,
    Concurrency,
}

impl Algorithm {
    pub const ALL: &'static [Algorithm] = &[
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Concurrency,
    ];
    /// The config name (`"token_bucket"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Concurrency => "concurrency",
        }
    }
    /// Short code used in Redis key names, so that changing a policy's algorithm never
    /// reads state of another shape (no WRONGTYPE after a config change).
    pub fn code(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
            Algorithm::SlidingWindow => "sw",
            Algorithm::SlidingLog => "sl",
            Algorithm::TokenBucket => "tb",
            Algorithm::LeakyBucket => "lb",
            Algorithm::Concurrency => "cc",
        }
    }
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.iter().copied().find(|a| a.name() == name)
    }
    /// True for algorithms whose state is per-window counters (`key:index`).
    pub fn is_windowed(self) -> bool {
        matches!(self, Algorithm::FixedWindow | Algorithm::SlidingWindow)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a policy does when its Redis shard fails or does not answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnError {
    /// Allow the request (availability over strictness). The default.
    #[default]
    Open,
    /// Deny the request (strictness over availability).
    Closed,
    /// Decide with an in-process limiter holding `limit / instances`.
    Local,
    /// Return the error to the caller, who decides.
    Error,
}

impl OnError {
    pub fn name(self) -> &'static str {
        match self {
            OnError::Open => "open",
            OnError::Closed => "closed",
            OnError::Local => "local",
            OnError::Error => "error",
        }
    }
    pub fn from_name(s: &str) -> Option<OnError> {
        match s {
            "open" => Some(OnError::Open),
            "closed" => Some(OnError::Closed),
            "local" => Some(OnError::Local),
            "error" => Some(OnError::Error),
            _ => None,
        }
    }
    /// [`OnError::from_name`], or a config error for `field` that lists every name.
    pub fn parse(field: &str, s: &str) -> crate::error::Result<OnError> {
        OnError::from_name(s).ok_or_else(|| {
            crate::error::Error::config(
                field,
                format!("expected \"open\", \"closed\", \"local\" or \"error\", got {s:?}"),
            )
        })
    }
}

/// Automatic blocking: after `after` denials within `within`, the key is put on the block
/// list for `duration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoBlock {
    pub after: u64,
    pub within: Duration,
    pub duration: Duration,
}

/// Local admission: reserve a batch of up to `max_batch` units from Redis in one call and
/// admit from it in process, for at most `max_hold`. Units are taken from Redis before they
/// are admitted, so nothing over the global limit is ever admitted; the batch shrinks to 1
/// as the global remaining gets low.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalAdmission {
    pub max_batch: u64,
    pub max_hold: Duration,
}

/// A named, validated limit: what a check is made against. Cheap to clone; clones share
/// their scale factor. (Counters belong to each limiter, by policy name.)
#[derive(Debug, Clone)]
pub struct Policy(pub(crate) Arc<PolicyInner>);

#[derive(Debug)]
pub(crate) struct PolicyInner {
    pub name: Arc<str>,
    pub limit: Limit,
    pub compiled: Compiled,
    pub on_error: OnError,
    pub auto_block: Option<AutoBlock>,
    pub local_admission: Option<LocalAdmission>,
    /// `name:code:`, the part of Redis key names after the configured prefix.
    pub key_scope: String,
    /// The adaptive scale factor (f64 bits), 1.0 unless set.
    pub scale: AtomicU64,
    /// What the in-memory engines key this policy's state by: the name, or for the limits
    /// after the first of a multi-limit policy `name#i` (no policy name holds `#`).
    pub scope: Arc<str>,
    /// The in-memory engine's hash seed of `scope` (`key::hash::scope_seed`), made
    /// once: a check hashes only its key.
    pub memory_seed: u64,
    /// A multi-limit policy's limits, each a policy of the same name with its own state
    /// (`policy/multi.rs`); `None` for a policy of one limit.
    pub parts: Option<Arc<[Policy]>>,
    /// Shadow mode: a would-be denial is allowed, consumes nothing and is reported
    /// (`limiter/shadow.rs`).
    pub shadow: bool,
    /// The fraction of the limit whose crossing emits a near-limit event; `None`: off.
    pub near_limit: Option<f64>,
    /// Takes live per-key overrides (`"overrides": true`, `limiter/overrides.rs`).
    pub overrides: bool,
    /// What every check of this policy reads: the counters of the limiter that counted it
    /// first, resolved once (a check does not look its series up by name), and the name
    /// copied per thread stripe (`crate::metrics::Hot`).
    pub hot: crate::metrics::Hot,
    /// Made by the caller (`Policy::new`, an ad-hoc limit), not by a config: it may not
    /// take the name of a configured policy, whose state and counters it would share.
    pub adhoc: bool,
}

impl PolicyInner {
    /// The limit in force: the compiled limit scaled by this policy's factor and `global`.
    #[inline]
    pub fn effective(&self, global: f64) -> Compiled {
        let f = f64::from_bits(self.scale.load(Relaxed)) * global;
        self.compiled.scaled(f)
    }
}

impl Policy {
    /// A policy named `name` enforcing `limit`. Names may use letters, digits and
    /// `_ - .`; they appear in Redis key names and in headers.
    ///
    /// The name may not be one of a limiter's configured policies when checked on it (an
    /// `invalid_argument` error): the two would share state and counters.
    pub fn new(name: &str, limit: Limit) -> Result<Policy> {
        Policy::build(name, limit, OnError::default(), &format!("policies.{name}"))
            .map(Policy::ad_hoc)
    }

    /// This policy, marked as made by the caller rather than by a config (and its limits).
    pub(crate) fn ad_hoc(mut self) -> Policy {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            inner.adhoc = true;
            if let Some(parts) = inner.parts.as_mut().and_then(Arc::get_mut) {
                for part in parts.iter_mut() {
                    if let Some(p) = Arc::get_mut(&mut part.0) {
                        p.adhoc = true;
                    }
                }
            }
        }
        self
    }

    /// Whether this policy was made by the caller (`Policy::new`, an ad-hoc limit).
    pub fn is_ad_hoc(&self) -> bool {
        self.0.adhoc
    }

    fn derive(
        &self,
        on_error: OnError,
        auto_block: Option<AutoBlock>,
        local_admission: Option<LocalAdmission>,
    ) -> Policy {
        let p = &self.0;
        Policy(Arc::new(PolicyInner {
            name: p.name.clone(),
            limit: p.limit.clone(),
            compiled: p.compiled,
            on_error,
            auto_block,
            local_admission,
            key_scope: p.key_scope.clone(),
            scale: AtomicU64::new(p.scale.load(Relaxed)),
            scope: p.scope.clone(),
            memory_seed: p.memory_seed,
            parts: p.parts.as_ref().map(|parts| {
                parts
                    .iter()
                    .map(|part| part.derive(on_error, auto_block, None))
                    .collect()
            }),
            shadow: p.shadow,
            near_limit: p.near_limit,
            overrides: p.overrides,
            hot: Default::default(),
            adhoc: p.adhoc,
        }))
    }

    /// The same policy with another failure mode.
    pub fn with_on_error(&self, on_error: OnError) -> Policy {
        self.derive(on_error, self.0.auto_block, self.0.local_admission)
    }

    /// The same policy with automatic blocking.
    pub fn with_auto_block(&self, auto_block: AutoBlock) -> Result<Policy> {
        validate_auto_block(&format!("policies.{}.auto_block", self.name()), &auto_block)?;
        Ok(self.derive(self.0.on_error, Some(auto_block), self.0.local_admission))
    }

    /// The same policy with its windows placed by `offset` (fixed_window and
    /// sliding_window; `WindowOffset::None` on any algorithm).
    pub fn with_window_offset(&self, offset: WindowOffset) -> Result<Policy> {
        let field = format!("policies.{}.window_offset", self.name());
        if let Some(parts) = &self.0.parts {
            // a multi-limit policy: every windowed limit takes the offset (buckets have no
            // window boundaries to move); per_key needs at least one windowed limit
            if !parts.iter().any(|part| part.algorithm().is_windowed()) {
                validate_window_offset(&field, self.algorithm(), offset)?;
            }
            let parts = parts
                .iter()
                .map(|part| match part.algorithm().is_windowed() {
                    true => part.with_window_offset(offset),
                    false => Ok(part.clone()),
                })
                .collect::<Result<Vec<Policy>>>()?;
            let mut p = self.derive(self.0.on_error, self.0.auto_block, self.0.local_admission);
            let inner = Arc::get_mut(&mut p.0).expect("a policy just derived is not shared");
            inner.compiled = parts[0].0.compiled;
            inner.key_scope = parts[0].0.key_scope.clone();
            inner.parts = Some(parts.into());
            return Ok(p);
        }
        validate_window_offset(&field, self.algorithm(), offset)?;
        let mut p = self.derive(self.0.on_error, self.0.auto_block, self.0.local_admission);
        let inner = Arc::get_mut(&mut p.0).expect("a policy just derived is not shared");
        inner.compiled.window_offset = offset;
        // (`scope` is the name, or `name#i` for a later limit of a multi-limit policy)
        inner.key_scope = format!("{}:{}:", inner.scope, inner.compiled.state_code());
        Ok(p)
    }

    /// A bucket's emission interval as the reduced fraction (numerator, denominator) of µs
    /// per unit it runs at exactly (300,000/s is `(10, 3)`); `None` for other algorithms.
    pub fn emission_interval_us(&self) -> Option<(u64, u64)> {
        let c = &self.0.compiled;
        matches!(c.algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket)
            .then_some((c.period_us, c.period_den))
    }

    /// Where this policy's window boundaries fall.
    pub fn window_offset(&self) -> WindowOffset {
        self.0.compiled.window_offset
    }

    /// The same policy with local admission (fixed_window, sliding_window, token_bucket).
    pub fn with_local_admission(&self, local: LocalAdmission) -> Result<Policy> {
        multi::refuse_local(self, &format!("policies.{}.local_admission", self.name()))?;
        validate_local(
            &format!("policies.{}.local_admission", self.name()),
            self.algorithm(),
            &local,
        )?;
        if self.0.overrides {
            return Err(overrides_and_local(self.name()));
        }
        Ok(self.derive(self.0.on_error, self.0.auto_block, Some(local)))
    }

    pub(crate) fn build(
        name: &str,
        limit: Limit,
        on_error: OnError,
        field: &str,
    ) -> Result<Policy> {
        validate_policy_name(name, field)?;
        let compiled = limit.compile(field)?;
        Ok(Policy(Arc::new(PolicyInner {
            name: Arc::from(name),
            key_scope: format!("{name}:{}:", compiled.state_code()),
            limit,
            compiled,
            on_error,
            auto_block: None,
            local_admission: None,
            scale: AtomicU64::new(1.0f64.to_bits()),
            scope: Arc::from(name),
            memory_seed: crate::key::hash::scope_seed(name),
            parts: None,
            shadow: false,
            near_limit: Some(DEFAULT_NEAR_LIMIT),
            overrides: false,
            hot: Default::default(),
            adhoc: false,
        })))
    }

    /// The same policy taking live per-key overrides (`Limiter::set_override`). Not with
    /// local admission: the batches it holds in process were reserved under one limit.
    pub fn with_overrides(&self) -> Result<Policy> {
        if self.0.local_admission.is_some() {
            return Err(overrides_and_local(self.name()));
        }
        let p = self.derive(self.0.on_error, self.0.auto_block, None);
        let mut inner = Arc::try_unwrap(p.0).expect("a policy just made is not shared");
        inner.overrides = true;
        Ok(Policy(Arc::new(inner)))
    }

    /// True when the policy takes live per-key overrides.
    pub fn overrides(&self) -> bool {
        self.0.overrides
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }
    pub fn limit(&self) -> &Limit {
        &self.0.limit
    }
    pub fn algorithm(&self) -> Algorithm {
        self.0.compiled.algorithm
    }
    pub fn on_error(&self) -> OnError {
        self.0.on_error
    }
    pub fn auto_block(&self) -> Option<AutoBlock> {
        self.0.auto_block
    }
    pub fn local_admission(&self) -> Option<LocalAdmission> {
        self.0.local_admission
    }
    /// The configured limit (units per window, capacity, or max concurrent), unscaled.
    pub fn max(&self) -> u64 {
        self.0.compiled.limit
    }
    /// This policy's adaptive scale factor (1.0 unless set).
    pub fn scale(&self) -> f64 {
        f64::from_bits(self.0.scale.load(Relaxed))
    }
    /// Sets this policy's adaptive scale factor: 0 < factor ≤ 1. Applies at once to every
    /// limiter using this policy; decisions and headers report the effective limit.
    pub fn set_scale(&self, factor: f64) -> Result<()> {
        validate_scale(factor)?;
        self.0.scale.store(factor.to_bits(), Relaxed);
        for part in self.0.parts.iter().flat_map(|p| p.iter()) {
            part.0.scale.store(factor.to_bits(), Relaxed);
        }
        Ok(())
    }
}

/// The default fraction of a policy's limit at which a near-limit event is emitted.
pub const DEFAULT_NEAR_LIMIT: f64 = 0.8;
fn overrides_and_local(name: &str) -> Error {
    Error::config(
        format!("policies.{name}.overrides"),
        "per-key overrides and local_admission cannot be combined (local batches are reserved under one limit)",
    )
}

pub(crate) fn validate_scale(factor: f64) -> Result<()> {
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(Error::invalid(
            "factor",
            format!("must be > 0 and <= 1, got {factor}"),
        ));
    }
    Ok(())
}

pub(crate) fn validate_auto_block(field: &str, a: &AutoBlock) -> Result<()> {
    if a.after == 0 || a.after > MAX_LIMIT {
        return Err(Error::config(
            format!("{field}.after"),
            format!("must be between 1 and {MAX_LIMIT}, got {}", a.after),
        ));
    }
    period(field, "within", a.within)?;
    period(field, "for", a.duration)?;
    Ok(())
}

pub(crate) fn validate_window_offset(
    field: &str,
    algorithm: Algorithm,
    offset: WindowOffset,
) -> Result<()> {
    if offset == WindowOffset::PerKey && !algorithm.is_windowed() {
        return Err(Error::config(
            field,
            format!("\"per_key\" works with fixed_window and sliding_window, not {algorithm} (whose state has no window boundaries)"),
        ));
    }
    Ok(())
}

pub(crate) fn validate_local(field: &str, algorithm: Algorithm, l: &LocalAdmission) -> Result<()> {
    if !matches!(
        algorithm,
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::TokenBucket
    ) {
        return Err(Error::config(
            field,
            format!("local admission works with fixed_window, sliding_window and token_bucket, not {algorithm}"),
        ));
    }
    if l.max_batch == 0 || l.max_batch > 1_000_000 {
        return Err(Error::config(
            format!("{field}.max_batch"),
            format!("must be between 1 and 1000000, got {}", l.max_batch),
        ));
    }
    period(field, "max_hold", l.max_hold)?;
    Ok(())
}

impl TryFrom<Limit> for Policy {
    type Error = Error;
    /// An anonymous policy named after the limit's parameters ([`Limit::id`]).
    fn try_from(limit: Limit) -> Result<Policy> {
        let id = limit.id();
        Policy::build(&id, limit, OnError::default(), "limit").map(Policy::ad_hoc)
    }
}

pub(crate) fn validate_policy_name(name: &str, field: &str) -> Result<()> {
    if name.is_empty() || name.len() > 128 {
        return Err(Error::config(
            field,
            "policy names must be 1 to 128 characters long",
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(Error::config(
            field,
            format!("policy name {name:?} contains {c:?}; use letters, digits, '_', '-' and '.'"),
        ));
    }
    Ok(())
}

#[cfg(test)]
impl Error {
    fn field_for_test(&self) -> &str {
        match self {
            Error::Config { field, .. } => field,
            _ => "",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn rejects_absurd_values() {
        let ms = Duration::from_millis;
        assert!(Policy::new("a", Limit::fixed_window(0, ms(1000))).is_err());
        assert!(Policy::new("a", Limit::fixed_window(1, ms(0))).is_err());
        let e = Policy::new("a", Limit::token_bucket(1 << 63, 1.0)).unwrap_err();
        assert_eq!(e.field_for_test(), "policies.a.capacity");
        assert!(Policy::new("a", Limit::token_bucket(10, f64::NAN)).is_err());
        assert!(Policy::new("a", Limit::token_bucket(10, -1.0)).is_err());
        assert!(Policy::new("a", Limit::token_bucket(10, 1e9)).is_err());
        assert!(Policy::new("a", Limit::leaky_bucket(1_000_000_000, 0.001)).is_err());
        assert!(Policy::new("bad name", Limit::fixed_window(1, ms(1000))).is_err());
        assert!(Policy::new("ok", Limit::concurrency(3, ms(1500))).is_ok());
    }
}
