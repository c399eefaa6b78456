//! The in-memory engine against governor's keyed limiter, in shapes that a busy machine
//! cannot blur: instructions per check under callgrind, and alternating wall-time rounds.
//! The same shapes as `benches/governor.rs`: 1000 keys `user:NNNNN`, never denied.
//!
//! Instructions per check (one thread; callgrind counts only inside `run_checks`):
//!   cargo bench -p shardlimit --bench governor_count --no-run
//!   valgrind --tool=callgrind --toggle-collect='*run_checks*' --callgrind-out-file=cg.out \
//!     $CARGO_TARGET_DIR/release/deps/governor_count-<hash> count fw 100000
//!   (fw | tb | gov; instructions ÷ 100000)
//! Wall time, alternating rounds (fw, gov, tb, gov), one thread and two:
//!   $CARGO_TARGET_DIR/release/deps/governor_count-<hash> wall <rounds> <checks per thread>

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use shardlimit::{Limit, Limiter, Policy};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

const KEYS: usize = 1_000;

enum Lib {
    Shardlimit(Limiter, Policy),
    Governor(DefaultKeyedRateLimiter<String>),
}

impl Lib {
    #[inline(always)]
    fn check(&self, key: &String) -> bool {
        match self {
            Lib::Shardlimit(l, p) => l.check_blocking(key, p, 1).expect("memory check").allowed,
            Lib::Governor(g) => g.check_key(key).is_ok(),
        }
    }
}

fn make(name: &str) -> Lib {
    match name {
        // never denied: a million-token bucket refilling 100k/s per key, a billion per hour
        "tb" => Lib::Shardlimit(
            Limiter::memory(),
            Policy::new("tb", Limit::token_bucket(1_000_000, 100_000.0)).unwrap(),
        ),
        "fw" => Lib::Shardlimit(
            Limiter::memory(),
            Policy::new(
                "fw",
                Limit::fixed_window(1_000_000_000, Duration::from_secs(3600)),
            )
            .unwrap(),
        ),
        "gov" => Lib::Governor(RateLimiter::keyed(
            Quota::per_second(NonZeroU32::new(100_000).unwrap())
                .allow_burst(NonZeroU32::new(1_000_000).unwrap()),
        )),
        other => panic!("unknown library {other}: fw, tb or gov"),
    }
}

/// `n` checks from key `start` on; the number denied (always 0 here).
#[inline(never)]
fn run_checks(lib: &Lib, keys: &[String], start: usize, n: u64) -> u64 {
    let (mut i, mut denied) = (start, 0);
    for _ in 0..n {
        i += 1;
        if i == KEYS {
            i = 0;
        }
        if !black_box(lib.check(&keys[i])) {
            denied += 1;
        }
    }
    denied
}

/// Wall time of `n` checks on each of `threads` threads started together, per check.
fn wall(lib: &Lib, keys: &[String], threads: usize, n: u64) -> f64 {
    let start = std::sync::Barrier::new(threads + 1);
    let t = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    run_checks(lib, keys, t * KEYS / threads, n)
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        for w in workers {
            assert_eq!(w.join().expect("worker"), 0, "a check was denied");
        }
        t0.elapsed()
    });
    t.as_nanos() as f64 / (threads as u64 * n) as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // (cargo bench passes `--bench`: with no mode, a short wall run)
    let args: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("user:{i:05}")).collect();
    match args.as_slice() {
        ["count", lib, n] => {
            let lib = make(lib);
            for k in &keys {
                assert!(lib.check(k));
            }
            let n: u64 = n.parse().expect("checks");
            assert_eq!(run_checks(&lib, &keys, 0, n), 0, "a check was denied");
        }
        rest => {
            let rounds: usize = rest.get(1).map_or(5, |r| r.parse().expect("rounds"));
            let n: u64 = rest.get(2).map_or(200_000, |r| r.parse().expect("checks"));
            let names = ["fw", "gov", "tb", "gov"];
            let libs: Vec<Lib> = names.iter().map(|n| make(n)).collect();
            for l in &libs {
                for k in &keys {
                    assert!(l.check(k));
                }
            }
            for threads in [1, 2] {
                let mut times = vec![Vec::new(); libs.len()];
                for _ in 0..rounds {
                    for (i, l) in libs.iter().enumerate() {
                        times[i].push(wall(l, &keys, threads, n));
                    }
                }
                let mut gov: Vec<f64> = times[1].iter().chain(&times[3]).copied().collect();
                let g = median(&mut gov);
                for (i, name) in names.iter().enumerate() {
                    if i == 3 {
                        continue;
                    }
                    let mut t = times[i].clone();
                    let lo = t.iter().copied().fold(f64::MAX, f64::min);
                    let hi = t.iter().copied().fold(0.0, f64::max);
                    let m = if i == 1 { g } else { median(&mut t) };
                    println!(
                        "{threads} thread(s) {name:>3}: median {m:6.1} ns/check (range {lo:.1}-{hi:.1}), governor ÷ this {:.2}",
                        g / m
                    );
                }
            }
        }
    }
}
