//! The shared vectors in tests/vectors, replayed on both engines: the in-memory engine and
//! a real Redis, each with an injected clock. Both must produce exactly the expected
//! decisions, which also makes them identical to each other.

mod support;

use serde_json::Value;
use shardlimit::{Config, Lease, Limiter, ManualClock, Policy};
use std::collections::HashMap;
use std::sync::Arc;

fn load(name: &str) -> Value {
    let path = format!("{}/../tests/vectors/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn policy_of(case: &Value) -> Policy {
    let cfg =
        Config::from_value(&serde_json::json!({ "policies": { "p": case["policy"] } })).unwrap();
    cfg.policies["p"].clone()
}

fn replay(limiter_for: impl Fn() -> (Limiter, Arc<ManualClock>)) -> usize {
    let doc = load("algorithms.json");
    let mut steps = 0;
    for case in doc["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let (limiter, clock) = limiter_for();
        let policy = policy_of(case);
        let mut leases: HashMap<String, Lease> = HashMap::new();
        for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            clock.set_us(step["t_us"].as_u64().unwrap());
            let key = step["key"].as_str().unwrap();
            match step["op"].as_str().unwrap() {
                "release" => {
                    let lease = &leases[step["lease"].as_str().unwrap()];
                    let released = limiter.block_on({
                        let (l, p, lease) = (limiter.clone(), policy.clone(), lease.clone());
                        async move { l.release_with(&p, &lease).await }
                    });
                    assert_eq!(
                        released.unwrap(),
                        step["expect_released"].as_bool().unwrap(),
                        "{name} step {i}"
                    );
                }
                "check" => {
                    let cost = step["cost"].as_u64().unwrap();
                    let (d, lease) = limiter.acquire_blocking(key, &policy, cost).unwrap();
                    if let (Some(tag), Some(lease)) = (step.get("lease_as"), lease) {
                        leases.insert(tag.as_str().unwrap().to_string(), lease);
                    }
                    let got = serde_json::json!({
                        "allowed": d.allowed,
                        "remaining": d.remaining,
                        "reset_after_us": d.reset_after.as_micros() as u64,
                        "retry_after_us": d.retry_after.map(|r| r.as_micros() as u64),
                        "delay_us": d.delay.as_micros() as u64,
                    });
                    assert_eq!(got, step["expect"], "{name}, step {i}: {step}");
                }
                op => panic!("unknown op {op}"),
            }
            steps += 1;
        }
    }
    steps
}

#[test]
fn memory_engine_matches_vectors() {
    let n = replay(|| {
        let clock = ManualClock::new(0);
        (Limiter::memory().with_clock(clock.clone()).unwrap(), clock)
    });
    assert!(n > 30);
}

#[test]
fn redis_engine_matches_vectors() {
    let server = support::RedisServer::start();
    let cfg = support::config(&[&server], "{}");
    let n = replay(|| {
        // a fresh key space per case
        redis::cmd("FLUSHALL").exec(&mut server.conn()).unwrap();
        let clock = ManualClock::new(0);
        (
            Limiter::from_json(&cfg)
                .unwrap()
                .with_clock(clock.clone())
                .unwrap(),
            clock,
        )
    });
    assert!(n > 30);
}

#[test]
fn routing_matches_vectors() {
    let doc = load("routing.json");
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 64);
    for case in cases {
        let key = case["key"].as_str().unwrap();
        assert_eq!(
            shardlimit::routing::routing_key(key),
            case["routing_key"].as_str().unwrap()
        );
        assert_eq!(
            format!("{:016x}", shardlimit::routing::key_hash(key)),
            case["xxh64"].as_str().unwrap(),
            "{key}"
        );
        for (n, want) in case["shard_for"].as_array().unwrap().iter().enumerate() {
            assert_eq!(
                shardlimit::routing::shard_index(key, n as u32 + 1) as u64,
                want.as_u64().unwrap(),
                "key {key:?} among {} shards",
                n + 1
            );
        }
    }
}

/// The one key rule (tests/vectors/keys.json): every binding accepts and rejects the same keys.
#[test]
fn key_rule_vectors() {
    let doc = load("keys.json");
    let limiter = Limiter::memory();
    let policy = Policy::new(
        "p",
        shardlimit::Limit::fixed_window(10, std::time::Duration::from_secs(60)),
    )
    .unwrap();
    let mut seen = 0;
    for case in doc["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let hex = case["hex"].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let accepted = case["accepted"].as_bool().unwrap();
        match String::from_utf8(bytes) {
            // a &str cannot hold it: rejected by the type, as the case expects
            Err(_) => assert!(!accepted, "{name}: not UTF-8 yet expected to be accepted"),
            Ok(key) => {
                let got = limiter.check_blocking(&key, &policy, 1);
                match (accepted, got) {
                    (true, Ok(_)) => {}
                    (false, Err(e)) => {
                        assert!(e.is_invalid_argument(), "{name}: {e}");
                        assert!(e.to_string().contains("`key`"), "{name}: {e}");
                    }
                    (want, got) => panic!("{name}: expected accepted={want}, got {got:?}"),
                }
            }
        }
        seen += 1;
    }
    assert!(seen >= 10);
}
