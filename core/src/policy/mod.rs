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
mod overridden;

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

/// An algorithm plus its parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum Limit {
    /// At most `limit` units per aligned window.
    FixedWindow { limit: u64, window: Duration },
    /// Two-counter estimate of a sliding window (Cloudflare).
    SlidingWindow { limit: u64, window: Duration },
    /// Exact sliding window: one log entry per admitted check, carrying its cost.
    SlidingLog { limit: u64, window: Duration },
    /// Starts full with `capacity` tokens, refills continuously.
    TokenBucket { capacity: u64, refill_per_sec: f64 },
    /// A shaper: admitted requests are told how long to wait; denied when the queue
    /// (of `capacity` units) is full.
    LeakyBucket { capacity: u64, leak_per_sec: f64 },
    /// At most `max` units held at once; leases expire after `lease_ttl`.
    Concurrency { max: u64, lease_ttl: Duration },
}

impl Limit {
    pub fn fixed_window(limit: u64, window: Duration) -> Limit {
        Limit::FixedWindow { limit, window }
    }
    pub fn sliding_window(limit: u64, window: Duration) -> Limit {
        Limit::SlidingWindow { limit, window }
    }
    pub fn sliding_log(limit: u64, window: Duration) -> Limit {
        Limit::SlidingLog { limit, window }
    }
    pub fn token_bucket(capacity: u64, refill_per_sec: f64) -> Limit {
        Limit::TokenBucket {
            capacity,
            refill_per_sec,
        }
    }
    pub fn leaky_bucket(capacity: u64, leak_per_sec: f64) -> Limit {
        Limit::LeakyBucket {
            capacity,
            leak_per_sec,
        }
    }
    pub fn concurrency(max: u64, lease_ttl: Duration) -> Limit {
        Limit::Concurrency { max, lease_ttl }
    }

    pub fn algorithm(&self) -> Algorithm {
        match self {
            Limit::FixedWindow { .. } => Algorithm::FixedWindow,
            Limit::SlidingWindow { .. } => Algorithm::SlidingWindow,
            Limit::SlidingLog { .. } => Algorithm::SlidingLog,
            Limit::TokenBucket { .. } => Algorithm::TokenBucket,
            Limit::LeakyBucket { .. } => Algorithm::LeakyBucket,
            Limit::Concurrency { .. } => Algorithm::Concurrency,
        }
    }

    /// Validates the parameters and compiles them to the integer form both engines use.
    /// `field` prefixes error messages (`policies.login`).
    pub(crate) fn compile(&self, field: &str) -> Result<Compiled> {
        let algorithm = self.algorithm();
        let (count, count_name) = match self {
            Limit::FixedWindow { limit, .. }
            | Limit::SlidingWindow { limit, .. }
            | Limit::SlidingLog { limit, .. } => (*limit, "limit"),
            Limit::TokenBucket { capacity, .. } | Limit::LeakyBucket { capacity, .. } => {
                (*capacity, "capacity")
            }
            Limit::Concurrency { max, .. } => (*max, "max"),
        };
        if count == 0 || count > MAX_LIMIT {
            return Err(Error::config(
                format!("{field}.{count_name}"),
                format!("must be between 1 and {MAX_LIMIT}, got {count}"),
            ));
        }
        let (period_us, period_den) = match self {
            Limit::FixedWindow { window, .. }
            | Limit::SlidingWindow { window, .. }
            | Limit::SlidingLog { window, .. } => (period(field, "window", *window)?, 1),
            Limit::Concurrency { lease_ttl, .. } => (period(field, "lease_ttl", *lease_ttl)?, 1),
            Limit::TokenBucket { refill_per_sec, .. } => {
                precision::interval(field, "refill_per_sec", *refill_per_sec, count)?
            }
            Limit::LeakyBucket { leak_per_sec, .. } => {
                precision::interval(field, "leak_per_sec", *leak_per_sec, count)?
            }
        };
        Ok(Compiled {
            algorithm,
            limit: count,
            period_us,
            period_den,
            window_offset: WindowOffset::None,
        })
    }

    /// A stable identifier of the limit's parameters, used as the policy name (and so in
    /// Redis key names) of limits passed directly to a check rather than by name.
    pub fn id(&self) -> String {
        match self {
            Limit::FixedWindow { limit, window }
            | Limit::SlidingWindow { limit, window }
            | Limit::SlidingLog { limit, window } => {
                format!("{}-{}-{}ms", self.algorithm(), limit, window.as_millis())
            }
            Limit::TokenBucket {
                capacity,
                refill_per_sec,
            } => format!("token_bucket-{capacity}-{refill_per_sec}ps"),
            Limit::LeakyBucket {
                capacity,
                leak_per_sec,
            } => format!("leaky_bucket-{capacity}-{leak_per_sec}ps"),
            Limit::Concurrency { max, lease_ttl } => {
                format!("concurrency-{max}-{}ms", lease_ttl.as_millis())
            }
        }
    }
}

impl fmt::Display for Limit {
    /// `fixed_window limit=5 window=60000ms`, `token_bucket capacity=100 refill_per_sec=10`...
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: &Duration| format!("{}ms", d.as_millis());
        match self {
            Limit::FixedWindow { limit, window }
            | Limit::SlidingWindow { limit, window }
            | Limit::SlidingLog { limit, window } => {
                write!(
                    f,
                    "{} limit={limit} window={}",
                    self.algorithm(),
                    ms(window)
                )
            }
            Limit::TokenBucket {
                capacity,
                refill_per_sec,
            } => {
                write!(
                    f,
                    "token_bucket capacity={capacity} refill_per_sec={refill_per_sec}"
                )
            }
            Limit::LeakyBucket {
                capacity,
                leak_per_sec,
            } => {
                write!(
                    f,
                    "leaky_bucket capacity={capacity} leak_per_sec={leak_per_sec}"
                )
            }
            Limit::Concurrency { max, lease_ttl } => {
                write!(f, "concurrency max={max} lease_ttl={}", ms(lease_ttl))
            }
        }
    }
}

fn period(field: &str, name: &str, d: Duration) -> Result<u64> {
    let us = d.as_micros();
    if us < MIN_PERIOD_US as u128 || us > MAX_PERIOD_US as u128 {
        return Err(Error::config(
            format!("{field}.{name}"),
            format!("must be between 1ms and 366d, got {}ms", d.as_millis()),
        ));
    }
    if !us.is_multiple_of(1_000) {
        return Err(Error::config(
            format!("{field}.{name}"),
            "must be a whole number of milliseconds",
        ));
    }
    Ok(us as u64)
}

/// The integer form of a limit that both engines run: `limit` units and a `period_us`
/// that is the window, the lease TTL, or the emission interval of a bucket, which is
/// `period_us / period_den` µs per unit (a reduced fraction, `period_den` 1 for whole µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Compiled {
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period_us: u64,
    /// The denominator of a bucket's emission interval (`policy/precision.rs`); 1 for
    /// whole µs and for every other algorithm.
    pub period_den: u64,
    /// Where a fixed or sliding window's boundaries fall (`policy/offset.rs`).
    pub window_offset: WindowOffset,
}

impl Compiled {
    /// The limit scaled by `factor` (0 < factor ≤ 1): fewer units, and for buckets a
    /// proportionally slower rate. Never below one unit.
    #[inline]
    pub fn scaled(&self, factor: f64) -> Compiled {
        if factor >= 1.0 {
            return *self;
        }
        let limit = ((self.limit as f64 * factor).floor() as u64).max(1);
        // (an exact interval P/Q keeps its denominator: P/factor rounded up, over Q)
        let period_us = match self.algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                (self.period_us as f64 / factor).ceil() as u64
            }
            _ => self.period_us,
        };
        Compiled {
            limit,
            period_us,
            ..*self
        }
    }

    /// This instance's share when `instances` share the limit (`on_error: local`).
    pub fn share(&self, instances: u32) -> Compiled {
        self.scaled(1.0 / instances.max(1) as f64)
    }

    /// The window the limit is measured over, for `RateLimit-Policy` (`w`).
    pub fn window_us(&self) -> u64 {
        match self.algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                (self.limit * self.period_us).div_ceil(self.period_den)
            }
            _ => self.period_us,
        }
    }

    /// The code naming this limit's state in Redis keys (`docs/keys.md`): the algorithm's,
    /// or for the variants whose state reads differently `fo`/`so` (per-key window
    /// offsets: other window indices) and `tq`/`lq` (an exact fractional interval: the
    /// state is `T:f`), so that old and new state are never misread for one another.
    pub fn state_code(&self) -> &'static str {
        match self.algorithm {
            Algorithm::FixedWindow if self.window_offset == WindowOffset::PerKey => "fo",
            Algorithm::SlidingWindow if self.window_offset == WindowOffset::PerKey => "so",
            Algorithm::TokenBucket if self.period_den > 1 => "tq",
            Algorithm::LeakyBucket if self.period_den > 1 => "lq",
            a => a.code(),
        }
    }

    /// What a windowed algorithm adds to `now` for `key` (0 unless per-key offsets).
    #[inline]
    pub fn shift_us(&self, key: &str) -> u64 {
        match self.window_offset {
            WindowOffset::None => 0,
            WindowOffset::PerKey => offset::shift_us(key, self.period_us),
        }
    }

    /// The scripts' 7th algorithm argument for a check of `key` that is not a lease: the
    /// window shift (`fo`, `so`) or the interval's denominator (`tq`, `lq`); `None` when
    /// the argument is empty (every other limit: today's scripts, byte for byte).
    #[inline]
    pub fn extra_arg(&self, key: &str) -> Option<u64> {
        if self.window_offset == WindowOffset::PerKey {
            Some(self.shift_us(key))
        } else if self.period_den > 1 {
            Some(self.period_den)
        } else {
            None
        }
    }
}

/// What a policy does when its Redis shard fails or does not answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
    pub fn new(name: &str, limit: Limit) -> Result<Policy> {
        Policy::build(name, limit, OnError::default(), &format!("policies.{name}"))
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
            parts: None,
            shadow: false,
            near_limit: Some(DEFAULT_NEAR_LIMIT),
            overrides: false,
            hot: Default::default(),
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
        Policy::build(&id, limit, OnError::default(), "limit")
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
