//! Limits: an algorithm with its parameters ([`Limit`], what users write) and the integer
//! form both engines run ([`Compiled`]).

use super::*;

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

pub(super) fn period(field: &str, name: &str, d: Duration) -> Result<u64> {
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
    #[inline]
    pub fn window_us(&self) -> u64 {
        match self.algorithm {
            // (a whole-µs interval, most buckets: no division, every decision reads this)
            Algorithm::TokenBucket | Algorithm::LeakyBucket if self.period_den == 1 => {
                self.limit * self.period_us
            }
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
