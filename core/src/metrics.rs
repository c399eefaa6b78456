//! Counters per policy and a Redis latency histogram, readable as a snapshot and
//! renderable in the Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters of one policy. Updated with relaxed atomics on the hot path.
#[derive(Debug, Default)]
pub(crate) struct PolicyCounters {
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
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

/// A snapshot of one policy's counters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
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
pub struct LatencySnapshot {
    pub buckets: Vec<u64>,
    pub sum_us: u64,
    pub count: u64,
}

/// Everything a limiter counts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetricsSnapshot {
    pub policies: Vec<PolicyMetrics>,
    pub redis_latency: LatencySnapshot,
    /// Events not written to the Redis stream because its queue was full.
    pub events_dropped: u64,
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
        s
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
