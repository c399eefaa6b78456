//! Scale-out: jump hash distribution figures, live reload under traffic, and the reshard
//! handoff that keeps a client at its limit limited when its key moves to a new shard.

mod support;

use shardlimit::routing::{jump_consistent_hash, key_hash};
use shardlimit::{Config, Limiter, Source};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::RedisServer;

#[test]
fn jump_hash_balance_and_minimal_movement() {
    let hashes: Vec<u64> = (0..1_000_000)
        .map(|i| key_hash(&format!("user:{i}")))
        .collect();
    let mut prev: Vec<u32> = vec![0; hashes.len()];
    let mut worst_balance: f64 = 0.0;
    for n in 1..=64u32 {
        let mut load = vec![0u64; n as usize];
        let mut moved = 0u64;
        for (i, h) in hashes.iter().enumerate() {
            let s = jump_consistent_hash(*h, n);
            load[s as usize] += 1;
            if n > 1 && s != prev[i] {
                // a key only ever moves to the new shard, never between old ones
                assert_eq!(
                    s,
                    n - 1,
                    "key {i} moved from {} to {s} going to {n} shards",
                    prev[i]
                );
                moved += 1;
            }
            prev[i] = s;
        }
        if n >= 2 {
            let mean = hashes.len() as f64 / n as f64;
            let max = *load.iter().max().unwrap() as f64;
            let balance = max / mean - 1.0;
            worst_balance = worst_balance.max(balance);
            assert!(
                balance < 0.05,
                "{n} shards: max load {max} is {:.1}% over the mean",
                balance * 100.0
            );
            let fraction = moved as f64 / hashes.len() as f64;
            let ideal = 1.0 / n as f64;
            assert!(
                (fraction - ideal).abs() < 0.1 * ideal + 0.002,
                "{n} shards: {fraction:.4} moved, ideal {ideal:.4}"
            );
        }
    }
    println!(
        "1,000,000 keys over 2..64 shards: worst max-over-mean {:.2}%",
        worst_balance * 100.0
    );
}

fn config(servers: &[&RedisServer], extra: &str) -> String {
    let shards: Vec<String> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| format!(r#"{{"name":"s{i}","url":"{}"}}"#, s.url()))
        .collect();
    format!(
        r#"{{"timeout_ms": 2000, "shards":[{}], "policies": {{
            "login": {{"algorithm":"fixed_window","limit":5,"window":"1h","on_error":"error"}},
            "api": {{"algorithm":"token_bucket","capacity":5,"refill_per_sec":0.001,"on_error":"error"}},
            "log": {{"algorithm":"sliding_log","limit":5,"window":"1h","on_error":"error"}}
            {extra} }}}}"#,
        shards.join(",")
    )
}

#[test]
fn reload_3_to_4_shards_under_traffic_keeps_budgets() {
    let servers: Vec<RedisServer> = (0..4).map(|_| RedisServer::start()).collect();
    let three: Vec<&RedisServer> = servers.iter().take(3).collect();
    let all: Vec<&RedisServer> = servers.iter().collect();
    let limiter = Limiter::from_json(&config(&three, "")).unwrap();
    // 200 clients at their limit on three policies
    let keys: Vec<String> = (0..200).map(|i| format!("client:{i}")).collect();
    for k in &keys {
        for p in ["login", "api", "log"] {
            for _ in 0..5 {
                assert!(limiter.check_by_name_blocking(k, p, 1).unwrap().allowed);
            }
            assert!(!limiter.check_by_name_blocking(k, p, 1).unwrap().allowed);
        }
    }
    // continuous traffic on other keys while the config changes
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for t in 0..4 {
        let (l, stop, calls) = (limiter.clone(), stop.clone(), calls.clone());
        threads.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let d = l.check_by_name_blocking(&format!("traffic:{t}:{}", i % 50), "api", 1);
                let d = d.unwrap_or_else(|e| panic!("a call failed during the reload: {e}"));
                assert_eq!(d.source, Source::Redis);
                calls.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        }));
    }
    let wait_calls = |n: u64| {
        let target = calls.load(Ordering::Relaxed) + n;
        let deadline = Instant::now() + Duration::from_secs(20);
        while calls.load(Ordering::Relaxed) < target {
            assert!(Instant::now() < deadline, "traffic stalled");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait_calls(200);
    // a bad new config is rejected and the old one stays
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        config(
            &all,
            r#", "broken": {"algorithm":"fixed_window","limit":0,"window":"1h"}"#,
        ),
    )
    .unwrap();
    let e = limiter.reload_from_file(&bad).unwrap_err();
    assert!(e.to_string().contains("policies.broken.limit"), "{e}");
    assert_eq!(limiter.config().shards.as_ref().unwrap().len(), 3);
    // the real change: a fourth shard
    let report = limiter
        .reload(Config::from_json(&config(&all, "")).unwrap())
        .unwrap();
    assert!(report.engine_changed && report.handoff);
    wait_calls(200);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    // keys that moved to the new shard are still at their limit
    let mut moved = 0;
    for k in &keys {
        let (s, _) = limiter.route(k).unwrap();
        if s == 3 {
            moved += 1;
        }
        for p in ["login", "api", "log"] {
            let d = limiter.check_by_name_blocking(k, p, 1).unwrap();
            assert!(
                !d.allowed,
                "{p} {k} (now on shard {s}) got a fresh budget: {d:?}"
            );
            assert_eq!(d.shard, Some(s));
        }
    }
    assert!(moved > 20, "only {moved} of 200 keys moved");
    // a key that never had state starts fresh on its new shard
    let fresh = (0..1000)
        .map(|i| format!("new:{i}"))
        .find(|k| limiter.route(k).unwrap().0 == 3)
        .unwrap();
    assert_eq!(
        limiter
            .check_by_name_blocking(&fresh, "login", 1)
            .unwrap()
            .remaining,
        4
    );
}

#[test]
fn watch_config_picks_up_changes_and_ignores_bad_ones() {
    let s = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlimit.json");
    std::fs::write(&path, config(&[&s], "")).unwrap();
    let limiter = Limiter::from_config_file(&path).unwrap();
    let _watch = limiter.watch_config(&path, Duration::from_millis(20));
    let wait_for = |f: &dyn Fn() -> bool, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // mtime resolution: make sure the new file looks newer
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(
        &path,
        config(
            &[&s],
            r#", "search": {"algorithm":"sliding_window","limit":9,"window":"1m"}"#,
        ),
    )
    .unwrap();
    wait_for(
        &|| limiter.policy("search").is_ok(),
        "the new policy never appeared",
    );
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(&path, "{ not json").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        limiter.policy("search").is_ok(),
        "a bad file replaced the config"
    );
    assert!(
        limiter
            .check_by_name_blocking("u", "search", 1)
            .unwrap()
            .allowed
    );
}
