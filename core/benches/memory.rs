//! In-memory engine throughput: single-threaded checks on a warm key set.
//! Run: cargo bench -p shardlimit --bench memory

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shardlimit::{Limit, Limiter, Policy, WindowOffset};
use std::hint::black_box;
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let limiter = Limiter::memory();
    let cases = [
        Policy::new("tb", Limit::token_bucket(1_000_000, 100_000.0)).unwrap(),
        Policy::new(
            "fw",
            Limit::fixed_window(1_000_000_000, Duration::from_secs(3600)),
        )
        .unwrap(),
        Policy::new(
            "sw",
            Limit::sliding_window(1_000_000_000, Duration::from_secs(3600)),
        )
        .unwrap(),
    ];
    // the variants of issue 18 (items 7 and 8): a fixed window placed per key, a bucket
    // refilling at an exact 300,000/s (10/3 µs per token)
    let variants = [
        (
            "fixed_window_per_key",
            Policy::new(
                "fo",
                Limit::fixed_window(1_000_000_000, Duration::from_secs(3600)),
            )
            .unwrap()
            .with_window_offset(WindowOffset::PerKey)
            .unwrap(),
        ),
        (
            "token_bucket_exact",
            Policy::new("tq", Limit::token_bucket(1_000_000, 300_000.0)).unwrap(),
        ),
    ];
    let keys: Vec<String> = (0..1_000).map(|i| format!("user:{i:05}")).collect();
    let mut g = c.benchmark_group("memory_check");
    g.throughput(Throughput::Elements(1));
    for p in &cases {
        for k in &keys {
            limiter.check_blocking(k, p, 1).unwrap();
        }
        let mut i = 0usize;
        g.bench_function(p.algorithm().name(), |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                black_box(limiter.check_blocking(&keys[i], p, 1).unwrap())
            })
        });
    }
    for (name, p) in &variants {
        for k in &keys {
            limiter.check_blocking(k, p, 1).unwrap();
        }
        let mut i = 0usize;
        g.bench_function(*name, |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                black_box(limiter.check_blocking(&keys[i], p, 1).unwrap())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
