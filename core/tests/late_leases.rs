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

// ---- a release that reaches Redis before its late acquire ----
//
// The client releases a late lease over whatever connection answers (a new one after the
// old one broke), so its release can reach Redis before the acquire it releases, which
// then runs late. The release finds no lease and leaves a tombstone for the lease TTL; the
// acquire meets it and grants nothing. The scripts are run directly here, in the order the
// test chooses: no race decides it.

/// The assembled script named `name` (`shardlimit::scripts::all`).
fn script(name: &str) -> &'static str {
    shardlimit::scripts::all()
        .into_iter()
        .find(|(n, _, _)| *n == name)
        .unwrap_or_else(|| panic!("no script {name}"))
        .1
}

/// A concurrency check script call as the core writes an acquire (`check.lua`'s layout: no
/// block list, the lease id as the extra argument; `now` None = the server clock): its 7
/// values, after checking the tag it echoes.
fn acquire_direct(
    c: &mut redis::Connection,
    state: &str,
    now: Option<u64>,
    id: &str,
    units: u64,
    max: u64,
    ttl_us: u64,
) -> Vec<i64> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script("concurrency")).arg(1).arg(state).arg(units);
    match now {
        Some(t) => cmd.arg("nxu").arg(t),
        None => cmd.arg("xu"),
    };
    cmd.arg(id).arg(max).arg(ttl_us).arg(4242);
    let mut r: Vec<i64> = cmd.query(c).unwrap();
    assert_eq!(r.pop(), Some(4242), "the tag");
    assert_eq!(r.len(), 7, "{r:?}");
    r
}

/// `release.lua` run directly: 1 when the lease was held.
fn release_direct(
    c: &mut redis::Connection,
    state: &str,
    now: u64,
    id: &str,
    units: u64,
    ttl_us: u64,
) -> i64 {
    redis::cmd("EVAL")
        .arg(script("release"))
        .arg(1)
        .arg(state)
        .arg(id)
        .arg(units)
        .arg(now)
        .arg(ttl_us)
        .query(c)
        .unwrap()
}

/// The retry_after of an acquire refused because its lease was released before it ran.
const RELEASED_ALREADY: i64 = -2;

#[test]
fn a_release_that_reaches_redis_before_its_late_acquire_leaves_no_slot_held() {
    let s = RedisServer::start();
    let l = Limiter::from_json(&config(&s)).unwrap();
    let p = l.policy("error").unwrap(); // on_error: error, so every decision is Redis's
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut c = s.conn();
    // one lease held, to find the key's state key
    let (d, held) = rt.block_on(l.acquire("k", &p, 1)).unwrap();
    assert!(d.allowed && d.source == Source::Redis);
    let held = held.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    let state = keys
        .iter()
        .find(|k| k.contains("error:"))
        .unwrap_or_else(|| panic!("no state key in {keys:?}"))
        .clone();
    let ttl_us = 3_600_000_000; // lease_ttl 1h

    for units in [1, 3] {
        // the release arrives first (the core's own release path), and finds nothing
        let late = shardlimit::Lease {
            key: "k".into(),
            policy: "error".into(),
            id: format!("{:016x}{units}", 0x1a7e_u64),
            units,
        };
        assert!(
            !rt.block_on(l.release(&late)).unwrap(),
            "nothing to release yet"
        );
        assert_eq!(
            free(&l, "error", "k"),
            Some(MAX - 1),
            "a tombstone holds nothing"
        );
        // then the acquire the client gave up on runs: it grants nothing
        let r = acquire_direct(&mut c, &state, None, &late.id, units, MAX, ttl_us);
        assert_eq!((r[0], r[3], r[6]), (0, RELEASED_ALREADY, 0), "{r:?}");
        assert_eq!(
            free(&l, "error", "k"),
            Some(MAX - 1),
            "no slot held by {units}"
        );
        // its tombstone went with it: the key holds the sum and the one lease
        let n: u64 = redis::cmd("ZCARD").arg(&state).query(&mut c).unwrap();
        assert_eq!(n, 2);
    }

    // without a release before it, the same call is granted (what the tombstone stopped),
    // and released as usual
    let r = acquire_direct(&mut c, &state, None, "0000000000000000f", 1, MAX, ttl_us);
    assert_eq!((r[0], r[1], r[6]), (1, (MAX - 2) as i64, 1), "{r:?}");
    let granted = shardlimit::Lease {
        key: "k".into(),
        policy: "error".into(),
        id: "0000000000000000f".into(),
        units: 1,
    };
    assert!(rt.block_on(l.release(&granted)).unwrap());
    assert!(rt.block_on(l.release(&held)).unwrap());
    assert_eq!(free(&l, "error", "k"), Some(MAX));
    let exists: u64 = redis::cmd("EXISTS").arg(&state).query(&mut c).unwrap();
    assert_eq!(exists, 0, "nothing left behind");
    // the limit holds
    let leases: Vec<_> = (0..MAX)
        .map(|_| rt.block_on(l.acquire("k", &p, 1)).unwrap())
        .collect();
    assert!(leases.iter().all(|(d, l)| d.allowed && l.is_some()));
    let (d, _) = rt.block_on(l.acquire("k", &p, 1)).unwrap();
    assert!(!d.allowed && d.source == Source::Redis, "{d:?}");
}

#[test]
fn tombstones_count_as_nothing_expire_and_leave_renewals_alone() {
    let s = RedisServer::start();
    let mut c = s.conn();
    let key = "{t}s:p:cc:k";
    let (t, ttl) = (1_800_000_000_000_000u64, 1_000_000u64);
    let score = |c: &mut redis::Connection, m: &str| -> Option<f64> {
        redis::cmd("ZSCORE").arg(key).arg(m).query(c).unwrap()
    };

    // a release of a lease not acquired: a tombstone, the sum written, the key kept for
    // the lease TTL
    assert_eq!(release_direct(&mut c, key, t, "a", 1, ttl), 0);
    assert_eq!(score(&mut c, "#"), Some(-1.0));
    assert!(score(&mut c, "a*1").unwrap() < -(2f64.powi(52)));
    let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut c).unwrap();
    assert!((1..=1000).contains(&pttl), "{pttl}");
    // released again: still not held, the tombstone stays
    assert_eq!(release_direct(&mut c, key, t, "a", 1, ttl), 0);
    assert!(score(&mut c, "a*1").is_some());

    // every slot is there for other leases (a tombstone is no lease)
    for i in 0..MAX - 1 {
        let r = acquire_direct(&mut c, key, Some(t), &format!("l{i}"), 1, MAX, ttl);
        assert_eq!((r[0], r[1]), (1, (MAX - 1 - i) as i64), "{r:?}");
    }
    // a lease acquired again keeps its units and takes the later expiry (as before)
    let r = acquire_direct(&mut c, key, Some(t + 500_000), "l0", 1, MAX, ttl);
    assert_eq!((r[0], r[1]), (1, 1), "{r:?}");
    assert_eq!(score(&mut c, "l0*1"), Some((t + 500_000 + ttl) as f64));
    assert_eq!(score(&mut c, "#"), Some(-(MAX as f64)));
    let r = acquire_direct(&mut c, key, Some(t), "l4", 1, MAX, ttl);
    assert_eq!((r[0], r[1]), (1, 0), "{r:?}");
    let r = acquire_direct(&mut c, key, Some(t), "l9", 1, MAX, ttl);
    assert_eq!(
        (r[0], r[3]),
        (0, ttl as i64),
        "denied until l1 expires: {r:?}"
    );

    // all leases expire; the next release of a lease not found removes the tombstones that
    // expired before it leaves its own
    let later = t + 2 * ttl;
    assert_eq!(release_direct(&mut c, key, later, "b", 2, ttl), 0);
    assert_eq!(score(&mut c, "a*1"), None, "expired tombstone removed");
    assert!(score(&mut c, "b*2").is_some());
    // the expired leases are reclaimed as usual, the tombstone is not counted
    let r = acquire_direct(&mut c, key, Some(later), "c", MAX, MAX, ttl);
    assert_eq!((r[0], r[1]), (1, 0), "{r:?}");
    assert_eq!(release_direct(&mut c, key, later, "c", MAX, ttl), 1);
    // b's acquire runs late: refused, and its tombstone is gone
    let r = acquire_direct(&mut c, key, Some(later + 1), "b", 2, MAX, ttl);
    assert_eq!(
        (r[0], r[1], r[3], r[6]),
        (0, MAX as i64, RELEASED_ALREADY, 0),
        "{r:?}"
    );
    assert_eq!(score(&mut c, "b*2"), None);
    let exists: u64 = redis::cmd("EXISTS").arg(key).query(&mut c).unwrap();
    assert_eq!(exists, 0, "nothing held, no tombstone: the key is gone");
}
