//! The in-memory engine against governor's keyed limiter, side by side.
//! Run: cargo bench -p shardlimit --bench governor [-- 1_thread | 2_threads]
//!
//! The same 1000 keys, never denied (the bench fails if either library denies once):
//! shardlimit's `Limiter::memory()` `check_blocking` (token bucket and fixed window) and
//! governor's `RateLimiter::keyed` (its default keyed state store) `check_key`. One thread:
//! `iter`, ns per check. Two threads: `iter_custom`, each thread doing `iters` checks from
//! its own place in the key ring, the wall time from a common start to the last finish
//! divided by two: wall time per check with both threads busy. The libraries alternate
//! within each group (shardlimit, governor, shardlimit). Results land in
//! `$CARGO_TARGET_DIR/criterion/memory_vs_governor/<library>/<threads>/`, which
//! `bench/report.py --criterion` reads.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use shardlimit::{Limit, Limiter, Policy};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const KEYS: usize = 1_000;

/// One library's check of one key; `true` when allowed. (`&String`: governor's keyed
/// limiter takes `&K`, the key type it stores.)
#[allow(clippy::ptr_arg)]
trait Checker: Sync {
    fn check(&self, key: &String) -> bool;
}

struct Shardlimit {
    limiter: Limiter,
    policy: Policy,
}

impl Checker for Shardlimit {
    fn check(&self, key: &String) -> bool {
        self.limiter
            .check_blocking(key, &self.policy, 1)
            .expect("memory check")
            .allowed
    }
}

struct Governor(DefaultKeyedRateLimiter<String>);

impl Checker for Governor {
    fn check(&self, key: &String) -> bool {
        self.0.check_key(key).is_ok()
    }
}

fn one_thread(c: &mut Criterion, keys: &[String], libs: &[(&str, &dyn Checker)]) {
    let mut g = c.benchmark_group("memory_vs_governor");
    g.throughput(Throughput::Elements(1));
    for (name, lib) in libs {
        let denied = AtomicU64::new(0);
        let mut i = 0usize;
        g.bench_function(BenchmarkId::new(*name, "1_thread"), |b| {
            b.iter(|| {
                i = (i + 1) % KEYS;
                if !black_box(lib.check(&keys[i])) {
                    denied.fetch_add(1, Ordering::Relaxed);
                }
            })
        });
        assert_eq!(denied.load(Ordering::Relaxed), 0, "{name} denied a check");
    }
    g.finish();
}

fn two_threads(c: &mut Criterion, keys: &[String], libs: &[(&str, &dyn Checker)]) {
    let mut g = c.benchmark_group("memory_vs_governor");
    g.throughput(Throughput::Elements(1));
    for (name, lib) in libs {
        let denied = AtomicU64::new(0);
        g.bench_function(BenchmarkId::new(*name, "2_threads"), |b| {
            b.iter_custom(|iters| {
                // both workers and this thread meet at the barrier; the clock starts there
                let start = Barrier::new(3);
                std::thread::scope(|s| {
                    let workers: Vec<_> = (0..2)
                        .map(|t| {
                            let (start, denied) = (&start, &denied);
                            s.spawn(move || {
                                let mut i = t * KEYS / 2;
                                let mut no = 0;
                                start.wait();
                                for _ in 0..iters {
                                    i = (i + 1) % KEYS;
                                    if !black_box(lib.check(&keys[i])) {
                                        no += 1;
                                    }
                                }
                                denied.fetch_add(no, Ordering::Relaxed);
                            })
                        })
                        .collect();
                    start.wait();
                    let t0 = Instant::now();
                    for w in workers {
                        w.join().expect("worker");
                    }
                    // 2 × iters checks in this wall time: per check, both threads busy
                    t0.elapsed() / 2
                })
            })
        });
        assert_eq!(denied.load(Ordering::Relaxed), 0, "{name} denied a check");
    }
    g.finish();
}

fn bench(c: &mut Criterion) {
    let keys: Vec<String> = (0..KEYS).map(|i| format!("user:{i:05}")).collect();
    // never denied: a million-token bucket refilling 100k/s per key (each key sees well
    // under 100k checks a second here), and a billion per hour window
    let tb = Shardlimit {
        limiter: Limiter::memory(),
        policy: Policy::new("tb", Limit::token_bucket(1_000_000, 100_000.0)).unwrap(),
    };
    let fw = Shardlimit {
        limiter: Limiter::memory(),
        policy: Policy::new(
            "fw",
            Limit::fixed_window(1_000_000_000, Duration::from_secs(3600)),
        )
        .unwrap(),
    };
    let quota = Quota::per_second(NonZeroU32::new(100_000).unwrap())
        .allow_burst(NonZeroU32::new(1_000_000).unwrap());
    let gov = Governor(RateLimiter::keyed(quota));
    // warm: every key exists in every store before the clock runs
    for k in &keys {
        assert!(tb.check(k) && fw.check(k) && gov.check(k));
    }
    let libs: [(&str, &dyn Checker); 4] = [
        ("shardlimit_token_bucket", &tb),
        ("governor_keyed", &gov),
        ("shardlimit_fixed_window", &fw),
        ("governor_keyed_again", &gov),
    ];
    one_thread(c, &keys, &libs);
    two_threads(c, &keys, &libs);
}

criterion_group!(benches, bench);
criterion_main!(benches);
