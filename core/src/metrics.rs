//! Counters per policy and a Redis latency histogram, readable as a snapshot and
//! renderable in the Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use crate::decision::PolicyName;

/// Counters of one policy. Updated with relaxed atomics on the hot path; the two every
/// check counts are [`Striped`].
#[derive(Debug, Default)]
pub(crate) struct PolicyCounters {
    pub allowed: Striped,
    pub denied: Striped,
    pub fallback: AtomicU64,
    pub blocked: AtomicU64,
    pub local_admitted: AtomicU64,
    pub redis_errors: AtomicU64,
    pub shadow_denied: AtomicU64,
    pub near_limit: AtomicU64,
    pub charged_units: AtomicU64,
    pub refunded_units: AtomicU64,
}

impl PolicyCounters {
    pub fn snapshot(&self, policy: &str) -> PolicyMetrics {
        PolicyMetrics {
            policy: policy.to_string(),
            allowed: self.allowed.load(Relaxed),
            denied: self.denied.load(Relaxed),
            fallback: self.fallback.load(Relaxed),
            blocked: self.blocked.load(Relaxed),
            local_admitted: self.local_admitted.load(Relaxed),
            redis_errors: self.redis_errors.load(Relaxed),
            shadow_denied: self.shadow_denied.load(Relaxed),
            near_limit: self.near_limit.load(Relaxed),
            charged_units: self.charged_units.load(Relaxed),
            refunded_units: self.refunded_units.load(Relaxed),
        }
    }
}

/// Stripes of a [`Striped`] counter: a power of two.
const STRIPES: usize = 4;

/// A counter every check adds to, split over [`STRIPES`] cache lines: each thread adds to
/// the stripe of its own slot, so threads checking at once do not pull one line from core
/// to core on every check (one shared counter cost the two-thread bench more than the
/// decision). A read sums the stripes.
#[derive(Debug, Default)]
pub(crate) struct Striped([Padded; STRIPES]);

/// One stripe, alone on its cache lines (128 bytes: adjacent-line prefetch pairs lines).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

impl Striped {
    #[inline]
    pub fn fetch_add(&self, v: u64, order: Ordering) -> u64 {
        self.0[stripe()].0.fetch_add(v, order)
    }
    pub fn load(&self, order: Ordering) -> u64 {
        self.0
            .iter()
            .fold(0u64, |sum, s| sum.wrapping_add(s.0.load(order)))
    }
}

/// This thread's stripe: threads take slots in turn, the first time they count.
#[inline]
fn stripe() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SLOT.try_with(|s| {
        let mut v = s.get();
        if v == usize::MAX {
            v = NEXT.fetch_add(1, Relaxed) % STRIPES;
            s.set(v);
        }
        v
    })
    .unwrap_or(0) // (a thread being torn down)
}

/// The counters of one limiter, kept by a policy: the first limiter to count the policy
/// resolves its series by name once (`limiter/metrics.rs`), and every later check of that
/// limiter finds them here with one load. A limiter's series of a name never changes (a
/// reload carries it over), so the slot never goes stale; other limiters look up by name.
///
/// It also keeps the policy's name as decisions carry it ([`PolicyName`]): a short name
/// once (a copy per decision), a long one per stripe, made by the first thread of that
/// stripe to decide (a long name is an `Arc`, and threads cloning one `Arc` at once would
/// share its reference count's cache line as they would a counter).
#[derive(Debug, Default)]
pub(crate) struct Hot {
    counters: OnceLock<(u64, Arc<PolicyCounters>)>,
    short: OnceLock<PolicyName>,
    names: [OnceLock<PolicyName>; STRIPES],
}

impl Hot {
    /// The counters held for limiter `id`.
    #[inline]
    pub fn get(&self, id: u64) -> Option<&PolicyCounters> {
        match self.counters.get() {
            Some((of, c)) if *of == id => Some(c),
            _ => None,
        }
    }
    /// Keeps `c` as limiter `id`'s counters, unless the slot is taken.
    pub fn offer(&self, id: u64, c: &Arc<PolicyCounters>) {
        let _ = self.counters.set((id, c.clone()));
    }
    /// `name` (the policy's) as a decision carries it: a short name held in place, a long
    /// one as this thread's stripe's copy (equal, not the same `Arc`).
    #[inline(always)]
    pub fn name(&self, name: &Arc<str>) -> PolicyName {
        match self.short.get() {
            Some(n) => n.clone(),
            None => self.name_made(name),
        }
    }

    #[cold]
    fn name_made(&self, name: &Arc<str>) -> PolicyName {
        let n = PolicyName::from(name);
        if n.is_inline() {
            return self.short.get_or_init(|| n).clone();
        }
        // the first stripe to ask takes the policy's own `Arc`, so a policy decided on one
        // thread only (a binding's ad-hoc policy, made per call) allocates no copy
        self.names[stripe()]
            .get_or_init(|| {
                if self.names.iter().all(|n| n.get().is_none()) {
                    n
                } else {
                    PolicyName::from(Arc::<str>::from(&**name))
                }
            })
            .clone()
    }
}

/// A snapshot of one policy's counters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PolicyMetrics {
    pub policy: String,
    /// Allowed decisions, whoever made them (Redis, memory, local admission, fallback).
    pub allowed: u64,
    /// Denied decisions, blocks and fallbacks included.
    pub denied: u64,
    /// Decisions made by the `on_error` mode because a shard failed.
    pub fallback: u64,
    /// Decisions denied because the key is on the block list.
    pub blocked: u64,
    /// Decisions admitted from a locally held batch, without a Redis round trip.
    pub local_admitted: u64,
    /// Redis calls of this policy that failed or timed out.
    pub redis_errors: u64,
    /// Checks the limit would have denied, allowed because the policy or call was in
    /// shadow mode (counted as allowed too).
    pub shadow_denied: u64,
    /// Allowed checks that crossed the policy's `near_limit` fraction of its limit.
    pub near_limit: u64,
    /// Units consumed by `charge` and by `settle` beyond what was reserved.
    pub charged_units: u64,
    /// Units given back by `refund` and by `settle` below what was reserved.
    pub refunded_units: u64,
}

/// Upper bounds (µs) of the latency histogram's buckets; the last bucket is +Inf.
pub const LATENCY_BUCKETS_US: &[u64] = &[
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

#[derive(Debug)]
pub(crate) struct Latency {
    buckets: Vec<AtomicU64>,
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            buckets: (0..=LATENCY_BUCKETS_US.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
}

impl Latency {
    pub fn record(&self, us: u64) {
        let i = LATENCY_BUCKETS_US.partition_point(|b| *b < us);
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }
    pub fn snapshot(&self) -> LatencySnapshot {
        LatencySnapshot {
            buckets: self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
            sum_us: self.sum_us.load(Relaxed),
            count: self.count.load(Relaxed),
        }
    }
}

/// Redis call latency: counts per bucket of [`LATENCY_BUCKETS_US`] (not cumulative; the
/// last entry counts calls slower than the last bound), their sum and count.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LatencySnapshot {
    pub buckets: Vec<u64>,
    pub sum_us: u64,
    pub count: u64,
}

/// Everything a limiter counts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    pub policies: Vec<PolicyMetrics>,
    pub redis_latency: LatencySnapshot,
    /// Events not written to the Redis stream because its queue was full.
    pub events_dropped: u64,
    /// Leases granted in Redis after their acquire had fallen back (or failed), found held
    /// and released by the limiter once the shard answered again.
    pub late_leases_released: u64,
    /// Releases of such leases dropped, oldest first, because their shard's list was full:
    /// those leases expire by their `lease_ttl`.
    pub late_lease_releases_dropped: u64,
}

impl MetricsSnapshot {
    /// The Prometheus text exposition format (version 0.0.4).
    pub fn to_prometheus(&self) -> String {
        let mut s = String::new();
        type Counter = (&'static str, &'static str, fn(&PolicyMetrics) -> u64);
        let counters: [Counter; 10] = [
            ("allowed", "Allowed decisions", |m| m.allowed),
            ("denied", "Denied decisions", |m| m.denied),
            (
                "fallback",
                "Decisions made by on_error because a shard failed",
                |m| m.fallback,
            ),
            ("blocked", "Decisions denied by the block list", |m| {
                m.blocked
            }),
            (
                "local_admitted",
                "Decisions admitted from a local batch without a Redis call",
                |m| m.local_admitted,
            ),
            (
                "redis_errors",
                "Redis calls that failed or timed out",
                |m| m.redis_errors,
            ),
            (
                "shadow_denied",
                "Checks a limit in shadow mode would have denied (allowed)",
                |m| m.shadow_denied,
            ),
            (
                "near_limit",
                "Allowed checks that crossed the policy's near_limit fraction",
                |m| m.near_limit,
            ),
            (
                "charged_units",
                "Units consumed by charge and by settle beyond the reservation",
                |m| m.charged_units,
            ),
            (
                "refunded_units",
                "Units given back by refund and by settle below the reservation",
                |m| m.refunded_units,
            ),
        ];
        for (name, help, get) in counters {
            let _ = writeln!(s, "# HELP shardlimit_{name}_total {help}.");
            let _ = writeln!(s, "# TYPE shardlimit_{name}_total counter");
            for m in &self.policies {
                let _ = writeln!(
                    s,
                    "shardlimit_{name}_total{{policy=\"{}\"}} {}",
                    escape(&m.policy),
                    get(m)
                );
            }
        }
        let _ = writeln!(
            s,
            "# HELP shardlimit_redis_latency_seconds Latency of Redis calls."
        );
        let _ = writeln!(s, "# TYPE shardlimit_redis_latency_seconds histogram");
        let mut cumulative = 0;
        for (i, n) in self.redis_latency.buckets.iter().enumerate() {
            cumulative += n;
            let le = match LATENCY_BUCKETS_US.get(i) {
                Some(us) => format!("{}", *us as f64 / 1e6),
                None => "+Inf".to_string(),
            };
            let _ = writeln!(
                s,
                "shardlimit_redis_latency_seconds_bucket{{le=\"{le}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            s,
            "shardlimit_redis_latency_seconds_sum {}",
            self.redis_latency.sum_us as f64 / 1e6
        );
        let _ = writeln!(
            s,
            "shardlimit_redis_latency_seconds_count {}",
            self.redis_latency.count
        );
        let _ = writeln!(s, "# HELP shardlimit_events_dropped_total Events not written to the Redis stream (queue full).");
        let _ = writeln!(s, "# TYPE shardlimit_events_dropped_total counter");
        let _ = writeln!(s, "shardlimit_events_dropped_total {}", self.events_dropped);
        let _ = writeln!(s, "# HELP shardlimit_late_leases_released_total Leases granted after their acquire fell back, released once the shard answered.");
        let _ = writeln!(s, "# TYPE shardlimit_late_leases_released_total counter");
        let _ = writeln!(
            s,
            "shardlimit_late_leases_released_total {}",
            self.late_leases_released
        );
        let _ = writeln!(s, "# HELP shardlimit_late_lease_releases_dropped_total Releases of late leases dropped (list full); those leases expire by their TTL.");
        let _ = writeln!(
            s,
            "# TYPE shardlimit_late_lease_releases_dropped_total counter"
        );
        let _ = writeln!(
            s,
            "shardlimit_late_lease_releases_dropped_total {}",
            self.late_lease_releases_dropped
        );
        s
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
