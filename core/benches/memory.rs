//! In-memory engine throughput: single-threaded checks on a warm key set.
//! Run: cargo bench -p shardlimit --bench memory

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shardlimit::Limiter;
use std::hint::black_box;

#[path = "fixtures/memory_policies.rs"]
mod fixtures;

fn bench(c: &mut Criterion) {
    let limiter = Limiter::memory();
    let keys: Vec<String> = (0..1_000).map(|i| format!("user:{i:05}")).collect();
    let mut g = c.benchmark_group("memory_check");
    g.throughput(Throughput::Elements(1));
    for (name, p) in &fixtures::memory_policies() {
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
