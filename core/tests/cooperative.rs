//! Checks are cooperative: a loop of checks that all answer at once (in memory, or failing
//! fast while a shard's circuit is open) still gives its runtime back now and then, so other
//! tasks and their timers run. Without it, the chaos run saw async calls outlive their
//! 100 ms deadline by 27 s: their timers could not fire while a sibling task looped.

use shardlimit::{Limit, Limiter, Policy};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn a_loop_of_checks_lets_a_timer_fire(l: Limiter, p: Policy) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fired = Arc::new(AtomicBool::new(false));
    let waited = rt.block_on(async {
        let f = fired.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            f.store(true, Ordering::Release);
        });
        // the loop never awaits anything but the checks; it ends when the timer has
        // fired, or after 3 s
        let start = Instant::now();
        while !fired.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(3) {
            let _ = l.check("k", &p, 1).await;
        }
        start.elapsed()
    });
    assert!(
        fired.load(Ordering::Acquire),
        "the timer never fired while checks looped"
    );
    assert!(
        waited < Duration::from_secs(1),
        "the timer fired after {waited:?}"
    );
}

#[test]
fn a_loop_of_memory_checks_yields() {
    let p = Policy::new(
        "p",
        Limit::fixed_window(1_000_000_000, Duration::from_secs(60)),
    )
    .unwrap();
    a_loop_of_checks_lets_a_timer_fire(Limiter::memory(), p);
}

#[test]
fn a_loop_of_fast_failing_checks_yields() {
    // nothing listens on this port: with the circuit open, each check fails at once
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let l = Limiter::from_json(&format!(
        r#"{{"timeout_ms": 50, "on_error": "closed",
            "shards": [{{"name": "gone", "url": "redis://127.0.0.1:{port}"}}],
            "policies": {{"p": {{"algorithm": "fixed_window", "limit": 10, "window": "1m"}}}}}}"#
    ))
    .unwrap();
    let p = l.policy("p").unwrap();
    a_loop_of_checks_lets_a_timer_fire(l, p);
}

#[test]
fn blocking_memory_calls_inside_a_task_never_run_out_of_budget() {
    // the blocking calls poll an in-memory future once: it must never be asked to yield,
    // however many a task makes in one go
    let l = Limiter::memory();
    let p = Policy::new("p", Limit::fixed_window(1_000_000, Duration::from_secs(60))).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::spawn(async move {
            let layers = [
                shardlimit::Layer::new("a", &p, 1),
                shardlimit::Layer::new("b", &p, 1),
            ];
            for i in 0..1000 {
                l.check_all_blocking(&layers)
                    .unwrap_or_else(|e| panic!("call {i}: {e}"));
                l.peek_blocking("a", &p)
                    .unwrap_or_else(|e| panic!("call {i}: {e}"));
            }
        })
        .await
        .unwrap();
    });
}
