//! Shadow mode and near-limit events, on both engines with an
//! injected clock and on real Redis: events, metrics, the shadow counts in Redis read by
//! another limiter, their bound and TTL, what is not shadowed (blocks, fallbacks), hostile
//! shadow hashes, and the config fields. Decisions themselves are in tests/vectors/shadow.json.

mod support;

use shardlimit::{Config, Event, Limit, Limiter, ManualClock, Policy, Source};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::RedisServer;

const T0: u64 = 1_700_000_000_000_000;

fn memory(policies: &str) -> (Limiter, Arc<ManualClock>) {
    let cfg = Config::from_json(&format!(r#"{{"policies": {policies}}}"#)).unwrap();
    let clock = ManualClock::new(T0);
    (
        Limiter::new(cfg)
            .unwrap()
            .with_clock(clock.clone())
            .unwrap(),
        clock,
    )
}

fn redis(servers: &[&RedisServer], policies: &str) -> (Limiter, Arc<ManualClock>) {
    let clock = ManualClock::new(T0);
    let l = Limiter::from_json(&support::config(servers, policies)).unwrap();
    (l.with_clock(clock.clone()).unwrap(), clock)
}

/// Events as (kind, fields).
type Seen = Arc<Mutex<Vec<(String, Vec<(&'static str, String)>)>>>;

/// Every event a limiter emits.
fn record(l: &Limiter) -> Seen {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    l.subscribe(Arc::new(move |e: &Event| {
        sink.lock()
            .unwrap()
            .push((e.kind().to_string(), e.fields()))
    }));
    seen
}

fn field<'a>(fields: &'a [(&'static str, String)], name: &str) -> &'a str {
    fields
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no field {name} in {fields:?}"))
}

/// Near-limit: one event per crossing of ceil(0.8 × 10) = 8 units used, on the check that
/// crosses (by one unit or by a jump), none above it, again in the next window; off with
/// `null`; a metric per policy. The same on both engines.
fn near_limit_crossings(l: &Limiter, clock: &ManualClock) {
    let seen = record(l);
    let near = || {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| k == "near_limit")
            .map(|(_, f)| {
                (
                    field(f, "key").to_string(),
                    field(f, "limit").parse::<u64>().unwrap(),
                    field(f, "remaining").parse::<u64>().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    for i in 1..=7 {
        let d = l.check_by_name_blocking("k", "p", 1).unwrap();
        assert_eq!(d.remaining, 10 - i);
    }
    assert!(near().is_empty(), "{:?}", near());
    l.check_by_name_blocking("k", "p", 1).unwrap(); // 8 used: crosses
    assert_eq!(near(), vec![("k".to_string(), 10, 2)]);
    l.check_by_name_blocking("k", "p", 1).unwrap(); // 9: above, no new event
    l.check_by_name_blocking("k", "p", 1).unwrap(); // 10
    assert!(!l.check_by_name_blocking("k", "p", 1).unwrap().allowed);
    assert_eq!(near().len(), 1);
    // a jump across the threshold: 6 -> 9
    l.check_by_name_blocking("j", "p", 6).unwrap();
    l.check_by_name_blocking("j", "p", 3).unwrap();
    assert_eq!(near()[1], ("j".to_string(), 10, 1));
    // the next window: crossing again
    clock.advance_us((60) * 1_000_000);
    l.check_by_name_blocking("k", "p", 8).unwrap();
    assert_eq!(near().len(), 3);
    // turned off
    for _ in 0..10 {
        l.check_by_name_blocking("k", "off", 1).unwrap();
    }
    assert_eq!(near().len(), 3);
    let m = l.metrics();
    let get = |n: &str| m.policies.iter().find(|p| p.policy == n).unwrap().clone();
    assert_eq!(get("p").near_limit, 3);
    assert_eq!(get("off").near_limit, 0);
    let text = m.to_prometheus();
    assert!(
        text.contains("shardlimit_near_limit_total{policy=\"p\"} 3"),
        "{text}"
    );
}

const NEAR: &str = r#"{"p": {"algorithm": "fixed_window", "limit": 10, "window": "1m"},
    "off": {"algorithm": "fixed_window", "limit": 10, "window": "1m", "near_limit": null}}"#;

#[test]
fn near_limit_memory() {
    let (l, clock) = memory(NEAR);
    near_limit_crossings(&l, &clock);
}

#[test]
fn near_limit_redis() {
    let s = RedisServer::start();
    let (l, clock) = redis(&[&s], NEAR);
    near_limit_crossings(&l, &clock);
}

/// Shadow denials: an event with policy, key, limit and remaining; the metric; allowed
/// counted as allowed; no `denied` event; headers that do not say limited.
fn shadow_events_and_metrics(l: &Limiter) {
    let seen = record(l);
    for _ in 0..2 {
        assert!(!l.check_by_name_blocking("k", "p", 1).unwrap().shadow_denied);
    }
    let d = l.check_by_name_blocking("k", "p", 1).unwrap();
    assert!(
        d.allowed && d.shadow_denied && d.retry_after.is_none(),
        "{d:?}"
    );
    assert!(d
        .headers()
        .iter()
        .all(|(h, _)| *h != "Retry-After" && *h != "X-RateLimit-Remaining" && *h != "RateLimit"));
    // the per-call option on an enforcing policy
    let e = l.policy("e").unwrap();
    l.check_blocking("k", &e, 2).unwrap();
    let d = l.check_shadow_blocking("k", &e, 1).unwrap();
    assert!(d.allowed && d.shadow_denied);
    let d = l.check_blocking("k", &e, 1).unwrap();
    assert!(!d.allowed && !d.shadow_denied);
    let kinds: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| *k == "shadow_denied").count(),
        2,
        "{kinds:?}"
    );
    assert_eq!(kinds.iter().filter(|k| *k == "denied").count(), 1);
    let ev = seen.lock().unwrap();
    let (_, f) = ev.iter().find(|(k, _)| k == "shadow_denied").unwrap();
    assert_eq!(field(f, "policy"), "p");
    assert_eq!(field(f, "key"), "k");
    assert_eq!(field(f, "limit"), "2");
    assert_eq!(field(f, "remaining"), "0");
    let m = l.metrics();
    let p = m.policies.iter().find(|p| p.policy == "p").unwrap();
    assert_eq!((p.allowed, p.denied, p.shadow_denied), (3, 0, 1));
    let text = m.to_prometheus();
    assert!(
        text.contains("shardlimit_shadow_denied_total{policy=\"p\"} 1"),
        "{text}"
    );
}

const TWO: &str = r#"{"p": {"algorithm": "fixed_window", "limit": 2, "window": "1m", "shadow": true},
    "e": {"algorithm": "token_bucket", "capacity": 2, "refill_per_sec": 1}}"#;

#[test]
fn shadow_events_and_metrics_memory() {
    let (l, _) = memory(TWO);
    shadow_events_and_metrics(&l);
}

#[test]
fn shadow_events_and_metrics_redis() {
    let s = RedisServer::start();
    let (l, _) = redis(&[&s], TWO);
    shadow_events_and_metrics(&l);
}

/// The counts live in Redis, one hash per policy per shard with a TTL, written in the
/// check's own script call: another limiter (another process) reads them, summed over
/// every shard, and they survive the limiter that wrote them.
#[test]
fn shadow_counts_in_redis_are_read_across_limiters_and_shards() {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let policies =
        r#"{"p": {"algorithm": "fixed_window", "limit": 1, "window": "1h", "shadow": true}}"#;
    let keys: Vec<String> = (0..40).map(|i| format!("user:{i}")).collect();
    {
        let (w, _) = redis(&[&a, &b], policies);
        w.connect_blocking(Duration::from_secs(5)).unwrap(); // loads every script
        let calls_before = a.script_calls() + b.script_calls();
        for (i, k) in keys.iter().enumerate() {
            // key i: 1 allowed, then i % 3 shadow denials
            for _ in 0..=(i % 3) {
                w.check_by_name_blocking(k, "p", 1).unwrap();
            }
        }
        let checks: u64 = (0..keys.len()).map(|i| 1 + (i % 3) as u64).sum();
        // one script call per check (no second command counts the denial)
        assert_eq!(a.script_calls() + b.script_calls() - calls_before, checks);
    }
    let (r, _) = redis(&[&a, &b], policies);
    let report = r.shadow_report_blocking("p", None).unwrap();
    let want: u64 = (0..keys.len()).map(|i| (i % 3) as u64).sum();
    assert_eq!(report.total, want);
    assert_eq!(report.untracked, 0);
    assert_eq!(
        report.keys.len(),
        keys.iter().enumerate().filter(|(i, _)| i % 3 > 0).count()
    );
    assert!(report.keys.windows(2).all(|w| w[0].1 >= w[1].1));
    assert_eq!(report.keys[0].1, 2);
    for (k, n) in &report.keys {
        let i: usize = k.strip_prefix("user:").unwrap().parse().unwrap();
        assert_eq!(*n, (i % 3) as u64, "{k}");
    }
    // both shards hold a part, in sl:h:p, expiring
    for s in [&a, &b] {
        let mut c = s.conn();
        let n: u64 = redis::cmd("HLEN").arg("sl:h:p").query(&mut c).unwrap();
        assert!(n > 0, "a shard holds no shadow counts");
        let ttl: i64 = redis::cmd("PTTL").arg("sl:h:p").query(&mut c).unwrap();
        assert!(ttl > 6 * 86_400_000 && ttl <= 7 * 86_400_000, "TTL {ttl}");
    }
    let top = r.shadow_report_blocking("p", Some(3)).unwrap();
    assert_eq!(top.keys, report.keys[..3].to_vec());
    assert_eq!(top.total, report.total);
    // an enforcing policy, or none at all: nothing counted
    let none = r.shadow_report_blocking("other", None).unwrap();
    assert_eq!((none.total, none.keys.len()), (0, 0));
    assert!(r.shadow_report_blocking("bad:name", None).is_err());
}

/// At most 1000 keys per policy per shard (per policy in memory); the denials of further
/// keys are counted as `untracked`, so the total stays exact and memory bounded.
fn bounded(l: &Limiter) {
    for i in 0..1003 {
        // a cost above the limit: a shadow denial at once
        let d = l.check_by_name_blocking(&format!("k{i}"), "p", 5).unwrap();
        assert!(d.shadow_denied);
    }
    l.check_by_name_blocking("k0", "p", 5).unwrap(); // a tracked key still counts
    let r = l.shadow_report_blocking("p", Some(2)).unwrap();
    assert_eq!((r.total, r.untracked), (1004, 3));
    assert_eq!(r.keys, vec![("k0".to_string(), 2), ("k1".to_string(), 1)]);
}

const ONE: &str =
    r#"{"p": {"algorithm": "fixed_window", "limit": 1, "window": "1h", "shadow": true}}"#;

#[test]
fn shadow_counts_are_bounded_memory() {
    let (l, _) = memory(ONE);
    bounded(&l);
}

#[test]
fn shadow_counts_are_bounded_redis() {
    let s = RedisServer::start();
    let (l, _) = redis(&[&s], ONE);
    bounded(&l);
    let n: u64 = redis::cmd("HLEN")
        .arg("sl:h:p")
        .query(&mut s.conn())
        .unwrap();
    assert_eq!(n, 1001); // 1000 keys and the untracked field
}

/// In memory, counts are forgotten a week after the policy's last shadow denial (the Redis
/// hash's TTL), by the injected clock.
#[test]
fn memory_shadow_counts_expire_like_the_redis_hash() {
    let (l, clock) = memory(ONE);
    l.check_by_name_blocking("a", "p", 5).unwrap();
    clock.advance_us((6 * 86_400) * 1_000_000);
    l.check_by_name_blocking("a", "p", 5).unwrap();
    clock.advance_us((6 * 86_400) * 1_000_000);
    assert_eq!(l.shadow_report_blocking("p", None).unwrap().total, 2);
    clock.advance_us((86_400 + 1) * 1_000_000);
    assert_eq!(l.shadow_report_blocking("p", None).unwrap().total, 0);
    l.check_by_name_blocking("b", "p", 5).unwrap();
    let r = l.shadow_report_blocking("p", None).unwrap();
    assert_eq!((r.total, r.keys), (1, vec![("b".to_string(), 1)]));
}

/// Not shadowed: a block-list denial, and an `on_error` fallback (a dead shard).
#[test]
fn blocks_and_fallbacks_are_not_shadowed() {
    let mut s = RedisServer::start();
    let (l, _) = redis(
        &[&s],
        r#"{"p": {"algorithm": "fixed_window", "limit": 5, "window": "1h", "shadow": true, "on_error": "closed"}}"#,
    );
    l.block_blocking("bad", None, "abuse").unwrap();
    let d = l.check_by_name_blocking("bad", "p", 1).unwrap();
    assert!(
        !d.allowed && !d.shadow_denied && d.source == Source::Block,
        "{d:?}"
    );
    let e = l.policy("p").unwrap();
    let d = l.check_shadow_blocking("bad", &e, 1).unwrap();
    assert!(!d.allowed && !d.shadow_denied);
    assert_eq!(l.shadow_report_blocking("p", None).unwrap().total, 0);
    s.kill();
    let d = l.check_by_name_blocking("u", "p", 1).unwrap();
    assert!(
        !d.allowed && !d.shadow_denied && d.source == Source::Fallback,
        "{d:?}"
    );
    // the report needs the shards
    let t = Instant::now();
    assert!(l
        .shadow_report_blocking("p", None)
        .unwrap_err()
        .is_backend());
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// The shadow denial reaches the Redis event stream when events go there.
#[test]
fn shadow_and_near_limit_events_reach_the_stream() {
    let s = RedisServer::start();
    let cfg = format!(
        r#"{{"timeout_ms": 2000, "shards": [{{"name": "s0", "url": "{}"}}], "events": {{"stream_maxlen": 100}},
        "policies": {{"p": {{"algorithm": "fixed_window", "limit": 2, "window": "1h", "shadow": true, "near_limit": 1.0}}}}}}"#,
        s.url()
    );
    let l = Limiter::from_json(&cfg).unwrap();
    for _ in 0..3 {
        l.check_by_name_blocking("k", "p", 1).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut c = s.conn();
    loop {
        let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg("sl:events")
            .arg("-")
            .arg("+")
            .query(&mut c)
            .unwrap_or_default();
        let kinds: Vec<String> = entries
            .iter()
            .filter_map(|(_, f)| f.iter().find(|(k, _)| k == "kind").map(|(_, v)| v.clone()))
            .collect();
        if kinds.len() >= 2 {
            assert_eq!(kinds, vec!["near_limit", "shadow_denied"]);
            break;
        }
        assert!(Instant::now() < deadline, "stream has {kinds:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Config: `shadow` is a boolean; `near_limit` a fraction in (0, 1], null or false; errors
/// name the field. Concurrency policies cannot be in shadow (a lease would hold nothing).
#[test]
fn config_fields_and_errors() {
    let cfg = |p: &str| Config::from_json(&format!(r#"{{"policies": {{"p": {p}}}}}"#));
    let fw = r#""algorithm": "fixed_window", "limit": 5, "window": "1m""#;
    let c = cfg(&format!("{{{fw}, \"shadow\": true, \"near_limit\": 0.5}}")).unwrap();
    let l = Limiter::new(c).unwrap();
    let p = l.policy("p").unwrap();
    assert!(p.shadow());
    assert_eq!(p.near_limit(), Some(0.5));
    for off in ["null", "false"] {
        let c = cfg(&format!("{{{fw}, \"near_limit\": {off}}}")).unwrap();
        assert_eq!(
            Limiter::new(c).unwrap().policy("p").unwrap().near_limit(),
            None
        );
    }
    let c = cfg(&format!("{{{fw}}}")).unwrap();
    let p = Limiter::new(c).unwrap().policy("p").unwrap();
    assert_eq!((p.shadow(), p.near_limit()), (false, Some(0.8)));
    for (bad, field) in [
        (
            format!("{{{fw}, \"shadow\": \"yes\"}}"),
            "policies.p.shadow",
        ),
        (
            format!("{{{fw}, \"near_limit\": 1.5}}"),
            "policies.p.near_limit",
        ),
        (
            format!("{{{fw}, \"near_limit\": 0}}"),
            "policies.p.near_limit",
        ),
        (
            format!("{{{fw}, \"near_limit\": true}}"),
            "policies.p.near_limit",
        ),
        (
            r#"{"algorithm": "concurrency", "max": 2, "lease_ttl": "1s", "shadow": true}"#
                .to_string(),
            "policies.p.shadow",
        ),
    ] {
        let e = cfg(&bad).unwrap_err();
        assert!(e.is_config() && e.to_string().contains(field), "{bad}: {e}");
    }
    let cc = Policy::new("c", Limit::concurrency(2, Duration::from_secs(1))).unwrap();
    assert!(cc.with_shadow(true).unwrap_err().is_invalid_argument());
    let l = Limiter::memory();
    let e = l.check_shadow_blocking("k", &cc, 1).unwrap_err();
    assert!(
        e.is_invalid_argument() && e.to_string().contains("acquire"),
        "{e}"
    );
    let fwp = Policy::new("f", Limit::fixed_window(1, Duration::from_secs(1))).unwrap();
    assert!(fwp.with_near_limit(Some(f64::NAN)).is_err());
    assert!(fwp.with_shadow(true).unwrap().shadow());
    assert!(!fwp
        .with_shadow(true)
        .unwrap()
        .with_shadow(false)
        .unwrap()
        .shadow());
}

/// Every byte from Redis is untrusted: a shadow hash that our script cannot have written
/// is an error naming it, never a report.
#[test]
fn hostile_shadow_hashes_are_refused() {
    let s = RedisServer::start();
    let (l, _) = redis(&[&s], ONE);
    let mut c = s.conn();
    redis::cmd("HSET")
        .arg("sl:h:p")
        .arg("k")
        .arg("many")
        .exec(&mut c)
        .unwrap();
    let e = l.shadow_report_blocking("p", None).unwrap_err();
    assert!(e.to_string().contains("shadow hash of policy p"), "{e}");
    redis::cmd("DEL").arg("sl:h:p").exec(&mut c).unwrap();
    let mut cmd = redis::cmd("HSET");
    cmd.arg("sl:h:p");
    for i in 0..1002 {
        cmd.arg(format!("k{i}")).arg(1);
    }
    cmd.exec(&mut c).unwrap();
    let e = l.shadow_report_blocking("p", None).unwrap_err();
    assert!(e.to_string().contains("1002 fields"), "{e}");
    redis::cmd("DEL").arg("sl:h:p").exec(&mut c).unwrap();
    redis::cmd("HSET")
        .arg("sl:h:p")
        .arg(b"\xff\xfe".as_slice())
        .arg(1)
        .exec(&mut c)
        .unwrap();
    assert!(l.shadow_report_blocking("p", None).is_err());
}

/// The guide's near-limit snippet, read from docs/guide.md and run as written here (on an
/// injected clock too, where the one event it must print is counted).
#[test]
fn readme_near_limit_snippet_runs() -> shardlimit::Result<()> {
    const SNIPPET: &str = r####"let limiter = shardlimit::Limiter::from_json(r#"{"policies": {"free": "10/day"}}"#)?;
limiter.subscribe(std::sync::Arc::new(|e: &shardlimit::Event| {
    if let shardlimit::Event::NearLimit { key, limit, remaining, .. } = e {
        println!("{key} has {remaining} of {limit} left today"); // 8 of 10 used: 2 left
    }
}));
for _ in 0..8 {
    limiter.check_by_name_blocking("tenant:7", "free", 1)?;
}
"####;
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/guide.md"))
        .expect("docs/guide.md");
    assert!(
        readme.contains(&format!("```rust\n{SNIPPET}```")),
        "the guide's near-limit snippet differs from this test's copy"
    );
    let limiter = shardlimit::Limiter::from_json(r#"{"policies": {"free": "10/day"}}"#)?;
    limiter.subscribe(std::sync::Arc::new(|e: &shardlimit::Event| {
        if let shardlimit::Event::NearLimit {
            key,
            limit,
            remaining,
            ..
        } = e
        {
            println!("{key} has {remaining} of {limit} left today"); // 8 of 10 used: 2 left
        }
    }));
    for _ in 0..8 {
        limiter.check_by_name_blocking("tenant:7", "free", 1)?;
    }
    // what it prints, counted on an injected clock (no day can end mid-test)
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let clocked = shardlimit::Limiter::from_json(r#"{"policies": {"free": "10/day"}}"#)?
        .with_clock(shardlimit::ManualClock::new(1_700_006_400_000_000))?;
    let s = seen.clone();
    clocked.subscribe(std::sync::Arc::new(move |e: &shardlimit::Event| {
        if let shardlimit::Event::NearLimit {
            remaining, limit, ..
        } = e
        {
            s.lock().unwrap().push((*remaining, *limit));
        }
    }));
    for _ in 0..10 {
        clocked.check_by_name_blocking("tenant:7", "free", 1)?;
    }
    assert_eq!(*seen.lock().unwrap(), vec![(2, 10)]);
    Ok(())
}
