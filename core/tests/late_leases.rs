//! A late reply is accounted: an `acquire` that gave up at its deadline (and fell back, or
//! failed under `on_error: error`) may still have been granted in Redis once the shard ran
//! its script. The client knows the lease id it sent, so it releases that lease as soon as
//! the shard answers again, instead of leaving the slot held for the whole lease TTL (one
//! stall of 1 s left 3 of 5 slots held for the TTL). The decisions are counted as what
//! they were: fallbacks.

mod support;

use shardlimit::{Limiter, Source};
use std::time::{Duration, Instant};
use support::RedisServer;

const TIMEOUT_MS: u64 = 100;
const MAX: u64 = 5;

fn config(s: &RedisServer) -> String {
    format!(
        r#"{{"timeout_ms": {TIMEOUT_MS}, "shards":[{{"name":"s0","url":"{}"}}],
        "policies": {{
          "open":  {{"algorithm":"concurrency","max":{MAX},"lease_ttl":"1h","on_error":"open"}},
          "error": {{"algorithm":"concurrency","max":{MAX},"lease_ttl":"1h","on_error":"error"}}
        }}}}"#,
        s.url()
    )
}

/// The units of `policy` free on `key`, as Redis says.
fn free(l: &Limiter, policy: &str, key: &str) -> Option<u64> {
    let p = l.policy(policy).unwrap();
    match l.peek_blocking(key, &p) {
        Ok(d) if d.source == Source::Redis => Some(d.remaining),
        _ => None,
    }
}

fn paused_while_acquiring(policy: &str) {
    let s = RedisServer::start();
    let l = Limiter::from_json(&config(&s)).unwrap();
    let p = l.policy(policy).unwrap();
    // connected, and the scripts loaded
    l.connect_blocking(Duration::from_secs(5)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (_, lease) = rt.block_on(l.acquire("warm", &p, 1)).unwrap();
    assert!(rt.block_on(l.release(&lease.unwrap())).unwrap());
    let fallbacks_before = fallbacks(&l, policy);

    // the server stops for 1 s (10 deadlines) while MAX acquires are sent to it, over the
    // connection made before (they reach its socket, and run once it resumes)
    unsafe { libc::kill(s.pid() as i32, libc::SIGSTOP) };
    let stopped = Instant::now();
    let acquires = rt.block_on(async {
        let tasks: Vec<_> = (0..MAX)
            .map(|_| {
                let (l, p) = (l.clone(), p.clone());
                tokio::spawn(async move { l.acquire("k", &p, 1).await })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    for a in acquires {
        match a {
            Ok((d, lease)) => {
                assert_eq!(policy, "open");
                assert_eq!((d.allowed, d.source), (true, Source::Fallback), "{d:?}");
                assert!(lease.is_none(), "a fallback gives no lease");
            }
            Err(e) => {
                assert_eq!(policy, "error");
                assert!(e.is_backend(), "{e}");
            }
        }
    }
    std::thread::sleep(Duration::from_secs(1).saturating_sub(stopped.elapsed()));
    unsafe { libc::kill(s.pid() as i32, libc::SIGCONT) };
    // the server answers again (it runs the acquires it had received first: they were
    // granted, to leases nobody holds)
    let _: String = redis::cmd("PING").query(&mut s.conn()).unwrap();
    let back = Instant::now();

    // every slot is free again well before the lease TTL (1 h): within a second of the
    // server answering, however the circuit and its probes go
    loop {
        if free(&l, policy, "k") == Some(MAX) {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(2),
            "{policy}: {:?} of {MAX} slots free 2 s after the server answered again",
            free(&l, policy, "k")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "{policy}: every slot free {:?} after PING answered",
        back.elapsed()
    );
    let m = l.metrics();
    assert!(
        (1..=MAX).contains(&m.late_leases_released),
        "{policy}: late leases released: {}",
        m.late_leases_released
    );
    assert_eq!(m.late_lease_releases_dropped, 0);
    // counted as what they were: fallbacks (or, under `error`, Redis errors), no lease
    if policy == "open" {
        assert_eq!(fallbacks(&l, policy) - fallbacks_before, MAX);
    }
    // and the limit holds: MAX leases, then a denial
    let leases: Vec<_> = (0..MAX)
        .map(|_| l.acquire_blocking("k", &p, 1).unwrap())
        .collect();
    assert!(leases.iter().all(|(d, l)| d.allowed && l.is_some()));
    let (d, lease) = l.acquire_blocking("k", &p, 1).unwrap();
    assert!(
        !d.allowed && lease.is_none() && d.source == Source::Redis,
        "{d:?}"
    );
}

fn fallbacks(l: &Limiter, policy: &str) -> u64 {
    l.metrics()
        .policies
        .iter()
        .find(|m| m.policy == policy)
        .map_or(0, |m| m.fallback)
}

#[test]
fn late_grants_of_acquires_that_fell_back_are_released() {
    paused_while_acquiring("open");
}

#[test]
fn late_grants_of_acquires_that_failed_are_released() {
    paused_while_acquiring("error");
}
