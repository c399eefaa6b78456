//! The engines agree when an injected clock moves back into the window before a key's
//! newest: Redis keeps a counter per window, and the in-memory engine read the earlier
//! window as empty (and then the newest as empty too), admitting 35 where Redis admitted
//! 20 on a limit of 10.

mod support;

use shardlimit::{Limit, Limiter, ManualClock, Policy};
use std::time::Duration;
use support::RedisServer;

/// A window start (µs, a multiple of 1 s).
const T0: u64 = 1_800_000_000_000_000;
const S: u64 = 1_000_000;

#[test]
fn a_clock_back_one_fixed_window_is_decided_alike_on_both_engines() {
    let server = RedisServer::start();
    let p = Policy::new("fw", Limit::fixed_window(10, Duration::from_secs(1))).unwrap();
    // (time, attempts of one unit)
    let steps = [
        (T0 + S / 2, 5),
        (T0 + S + S / 2, 12),
        (T0 + S / 2 + 1000, 12), // back into the first window
        (T0 + S + S / 2 + 1000, 12),
        (T0 + 2 * S + S / 2, 12),
        (T0 + S + S / 2 + 2000, 12), // back again, after a move forward
    ];
    let mut runs = Vec::new();
    for redis in [false, true] {
        let clock = ManualClock::new(T0);
        let l = if redis {
            Limiter::from_json(&support::config(&[&server], "{}")).unwrap()
        } else {
            Limiter::memory()
        };
        let l = l.with_clock(clock.clone()).unwrap();
        let mut out = Vec::new();
        for (t, n) in steps {
            clock.set_us(t);
            for _ in 0..n {
                let d = l.check_blocking("k", &p, 1).unwrap();
                out.push((d.allowed, d.remaining, d.reset_after, d.retry_after));
            }
            let d = l.peek_blocking("k", &p).unwrap();
            out.push((d.allowed, d.remaining, d.reset_after, d.retry_after));
        }
        runs.push(out);
    }
    let admitted: Vec<usize> = runs
        .iter()
        .map(|r| r.iter().filter(|d| d.0).count())
        .collect();
    for (i, (m, r)) in runs[0].iter().zip(&runs[1]).enumerate() {
        assert_eq!(
            m, r,
            "decision {i}: memory {m:?}, Redis {r:?} (admitted {admitted:?})"
        );
    }
}
