//! Production behaviour against real redis-server processes: layered checks, the block
//! list, failure modes under fault injection, local admission, scale, events, metrics.

mod support;

use shardlimit::{
    AutoBlock, Event, Layer, Limit, Limiter, LocalAdmission, ManualClock, OnError, Policy, Source,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{RedisServer, SlowReplies};

const T0: u64 = 1_800_000_000_000_000;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

fn json_limiter(servers: &[&RedisServer], extra: &str) -> Limiter {
    let shards: Vec<String> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| format!(r#"{{"name":"s{i}","url":"{}"}}"#, s.url()))
        .collect();
    Limiter::from_json(&format!(
        r#"{{"timeout_ms": 2000, "shards":[{}] {extra}}}"#,
        shards.join(",")
    ))
    .unwrap()
}

/// Keys that route to `n` distinct shards among the limiter's.
fn keys_on_distinct_shards(l: &Limiter, prefix: &str, n: usize) -> Vec<String> {
    let mut out: Vec<(u32, String)> = Vec::new();
    for i in 0..1000 {
        let k = format!("{prefix}{i}");
        let s = l.route(&k).unwrap().0;
        if !out.iter().any(|(o, _)| *o == s) {
            out.push((s, k));
        }
        if out.len() == n {
            break;
        }
    }
    assert_eq!(out.len(), n);
    out.into_iter().map(|(_, k)| k).collect()
}

fn layered_denial_leaves_other_layers_untouched(l: &Limiter, keys: &[String]) {
    let h = Duration::from_secs(3600);
    let ip = Policy::new("ip", Limit::fixed_window(100, h)).unwrap();
    let apikey = Policy::new("apikey", Limit::token_bucket(3, 1.0 / 3600.0)).unwrap();
    let tenant = Policy::new("tenant", Limit::sliding_window(1000, h)).unwrap();
    let global = Policy::new("global", Limit::sliding_log(50, h)).unwrap();
    let layers = vec![
        Layer::new(keys[0].clone(), &ip, 1),
        Layer::new(keys[1].clone(), &apikey, 1),
        Layer::new(keys[2].clone(), &tenant, 1),
        Layer::new("global", &global, 1),
    ];
    for i in 0..3 {
        let d = l.check_all_blocking(&layers).unwrap();
        assert!(d.allowed, "{i}: {d:?}");
        // the tightest layer is reported
        assert_eq!(&*d.policy, "apikey");
        assert_eq!(d.remaining, 2 - i);
    }
    let d = l.check_all_blocking(&layers).unwrap();
    assert!(!d.allowed);
    assert_eq!(
        &*d.policy, "apikey",
        "the decision names the layer that denied"
    );
    assert_eq!(d.layer, Some(1));
    assert!(d.retry_after.is_some());
    // no layer consumed anything for the denied request
    assert_eq!(l.peek_blocking(&keys[0], &ip).unwrap().remaining, 97);
    assert_eq!(l.peek_blocking(&keys[2], &tenant).unwrap().remaining, 997);
    assert_eq!(l.peek_blocking("global", &global).unwrap().remaining, 47);
}

#[test]
fn layered_on_one_shard_memory_and_across_shards() {
    let (a, b, c) = (
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    );
    let one = json_limiter(&[&a], "");
    layered_denial_leaves_other_layers_untouched(
        &one,
        &["ip:1".into(), "key:1".into(), "tenant:1".into()],
    );
    let mem = Limiter::memory();
    layered_denial_leaves_other_layers_untouched(
        &mem,
        &["ip:1".into(), "key:1".into(), "tenant:1".into()],
    );
    let three = json_limiter(&[&a, &b, &c], r#", "key_prefix": "x:""#);
    let keys = keys_on_distinct_shards(&three, "k", 3);
    layered_denial_leaves_other_layers_untouched(&three, &keys);
}

#[test]
fn layered_totals_are_exact_under_concurrency_across_shards() {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let l = json_limiter(&[&a, &b], "");
    let h = Duration::from_secs(3600);
    let per_user = Policy::new("user", Limit::fixed_window(10, h)).unwrap();
    let global = Policy::new("global", Limit::token_bucket(30, 1.0 / 3600.0)).unwrap();
    let users: Vec<String> = (0..5).map(|i| format!("user:{i}")).collect();
    let allowed: Arc<Vec<AtomicU64>> = Arc::new((0..5).map(|_| AtomicU64::new(0)).collect());
    rt().block_on(async {
        let mut tasks = Vec::new();
        for t in 0..64usize {
            let (l, pu, g, users, allowed) = (
                l.clone(),
                per_user.clone(),
                global.clone(),
                users.clone(),
                allowed.clone(),
            );
            tasks.push(tokio::spawn(async move {
                for j in 0..4usize {
                    let u = (t + j) % 5;
                    let layers = [
                        Layer::new(users[u].clone(), &pu, 1),
                        Layer::new("global:all", &g, 1),
                    ];
                    if l.check_all(&layers).await.unwrap().allowed {
                        allowed[u].fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let per: Vec<u64> = allowed.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    assert_eq!(per.iter().sum::<u64>(), 30, "{per:?}");
    assert!(per.iter().all(|n| *n <= 10), "{per:?}");
    // the counters in Redis agree: nothing was consumed by denied requests
    let used: u64 = users
        .iter()
        .map(|u| 10 - l.peek_blocking(u, &per_user).unwrap().remaining)
        .sum();
    assert_eq!(used, 30);
    assert_eq!(l.peek_blocking("global:all", &global).unwrap().remaining, 0);
}

#[test]
fn block_list_and_auto_block_across_two_instances() {
    let s = RedisServer::start();
    let policies = r#", "policies": {"login": {"algorithm":"fixed_window","limit":2,"window":"1h",
        "auto_block": {"after": 3, "within": "1m", "for": "10m"}}}"#;
    let a = json_limiter(&[&s], policies);
    let b = json_limiter(&[&s], policies);
    let login = a.policy("login").unwrap();
    // manual block, seen by the other instance
    a.block_blocking(
        "ip:6.6.6.6",
        Some(Duration::from_secs(30)),
        "abuse report #12",
    )
    .unwrap();
    let d = b.check_blocking("ip:6.6.6.6", &login, 1).unwrap();
    assert!(!d.allowed);
    assert_eq!(d.source, Source::Block);
    let retry = d.retry_after.unwrap();
    assert!(
        retry <= Duration::from_secs(30) && retry > Duration::from_secs(25),
        "{retry:?}"
    );
    let info = b.blocked_blocking("ip:6.6.6.6").unwrap().unwrap();
    assert_eq!(info.reason, "abuse report #12");
    // b now has it cached: blocked requests cost no round trip
    let before = evalsha_calls(&s);
    for _ in 0..10 {
        assert_eq!(
            b.check_blocking("ip:6.6.6.6", &login, 1).unwrap().source,
            Source::Block
        );
    }
    assert_eq!(
        evalsha_calls(&s),
        before,
        "cached blocks must not reach Redis"
    );
    assert!(a.unblock_blocking("ip:6.6.6.6").unwrap());
    assert!(b.blocked_blocking("ip:6.6.6.6").unwrap().is_none());
    assert!(a.check_blocking("ip:6.6.6.6", &login, 1).unwrap().allowed);
    // permanent block
    a.block_blocking("ip:7.7.7.7", None, "forever").unwrap();
    let d = b.check_blocking("ip:7.7.7.7", &login, 1).unwrap();
    assert!(!d.allowed && d.retry_after.is_none() && d.source == Source::Block);
    assert_eq!(
        b.blocked_blocking("ip:7.7.7.7").unwrap().unwrap().remaining,
        None
    );
    // automatic: 2 allowed, then 3 denials put the key on the block list
    for _ in 0..2 {
        assert!(a.check_blocking("user:eve", &login, 1).unwrap().allowed);
    }
    for i in 0..3 {
        let d = a.check_blocking("user:eve", &login, 1).unwrap();
        assert!(!d.allowed, "{i}");
    }
    let info = b
        .blocked_blocking("user:eve")
        .unwrap()
        .expect("auto-blocked");
    assert!(info.reason.contains("auto"), "{info:?}");
    assert!(info.remaining.unwrap() > Duration::from_secs(590));
    let d = b.check_blocking("user:eve", &login, 1).unwrap();
    assert_eq!(d.source, Source::Block);
    // bad input
    assert!(a.block_blocking("", None, "x").is_err());
    assert!(a.block_blocking("k", Some(Duration::ZERO), "x").is_err());
}

#[test]
fn block_list_on_the_memory_engine() {
    let clock = ManualClock::new(T0);
    let l = Limiter::memory().with_clock(clock.clone()).unwrap();
    let p = Policy::new("p", Limit::fixed_window(1, Duration::from_secs(3600)))
        .unwrap()
        .with_auto_block(AutoBlock {
            after: 2,
            within: Duration::from_secs(60),
            duration: Duration::from_secs(120),
        })
        .unwrap();
    l.block_blocking("a", Some(Duration::from_secs(5)), "r")
        .unwrap();
    let d = l.check_blocking("a", &p, 1).unwrap();
    assert_eq!(
        (d.allowed, d.source, d.retry_after),
        (false, Source::Block, Some(Duration::from_secs(5)))
    );
    clock.advance_us(5_000_000);
    assert!(
        l.check_blocking("a", &p, 1).unwrap().allowed,
        "block expired"
    );
    assert!(!l.check_blocking("a", &p, 1).unwrap().allowed);
    assert!(!l.check_blocking("a", &p, 1).unwrap().allowed);
    let info = l.blocked_blocking("a").unwrap().unwrap();
    assert_eq!(info.remaining, Some(Duration::from_secs(120)));
    assert!(l.unblock_blocking("a").unwrap());
}

fn evalsha_calls(s: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut s.conn())
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[test]
fn local_admission_cuts_redis_commands_and_never_over_admits() {
    let s = RedisServer::start();
    let cfg = |local: bool| {
        format!(
            r#", "instances": 4, "policies": {{"api": {{"algorithm":"fixed_window","limit":1000,"window":"1h"{}}}}}"#,
            if local {
                r#", "local_admission": {"max_batch": 100, "max_hold": "10s"}"#
            } else {
                ""
            }
        )
    };
    // a key at 50% of its limit, spread over 4 instances
    let run = |local: bool, key: &str| -> (u64, u64) {
        let instances: Vec<Limiter> = (0..4).map(|_| json_limiter(&[&s], &cfg(local))).collect();
        let before = evalsha_calls(&s);
        let mut allowed = 0;
        for i in 0..500 {
            if instances[i % 4]
                .check_by_name_blocking(key, "api", 1)
                .unwrap()
                .allowed
            {
                allowed += 1;
            }
        }
        (allowed, evalsha_calls(&s) - before)
    };
    let (base_allowed, base_calls) = run(false, "k:baseline");
    let (local_allowed, local_calls) = run(true, "k:local");
    assert_eq!((base_allowed, local_allowed), (500, 500));
    let drop = 1.0 - local_calls as f64 / base_calls as f64;
    println!("local admission: {base_calls} Redis script calls without, {local_calls} with ({:.1}% fewer)", drop * 100.0);
    assert!(drop >= 0.8, "only {:.1}% fewer Redis calls", drop * 100.0);

    // over-admission bound: zero. 4 instances x 64 tasks hammer one key far past its limit.
    let instances: Vec<Limiter> = (0..4).map(|_| json_limiter(&[&s], &cfg(true))).collect();
    let total = Arc::new(AtomicU64::new(0));
    let local_decisions = Arc::new(AtomicU64::new(0));
    rt().block_on(async {
        let mut tasks = Vec::new();
        for t in 0..256usize {
            let (l, total, ld) = (
                instances[t % 4].clone(),
                total.clone(),
                local_decisions.clone(),
            );
            tasks.push(tokio::spawn(async move {
                for _ in 0..8 {
                    let d = l.check_by_name("k:hammer", "api", 1).await.unwrap();
                    if d.allowed {
                        total.fetch_add(1, Ordering::SeqCst);
                    }
                    if d.source == Source::Local {
                        ld.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let total = total.load(Ordering::SeqCst);
    println!(
        "local admission under load: {total} admitted of 2048 (limit 1000), {} decided locally",
        local_decisions.load(Ordering::SeqCst)
    );
    assert!(total <= 1000, "over-admitted: {total}");
    // reserved units a lease still holds are the only shortfall: at most 4 x max_batch
    assert!(total >= 1000 - 4 * 100, "{total}");
    assert!(local_decisions.load(Ordering::SeqCst) > 0);
}

#[test]
fn adaptive_scale_reports_the_effective_limit() {
    let s = RedisServer::start();
    let l = json_limiter(
        &[&s],
        r#", "policies": {"api": {"algorithm":"fixed_window","limit":10,"window":"1h"}}"#,
    );
    l.set_scale(0.5, &["api"]).unwrap();
    let d = l.check_by_name_blocking("u", "api", 1).unwrap();
    assert_eq!((d.limit, d.remaining), (5, 4));
    assert!(d
        .headers()
        .contains(&("X-RateLimit-Limit", "5".to_string())));
    for _ in 0..4 {
        assert!(l.check_by_name_blocking("u", "api", 1).unwrap().allowed);
    }
    assert!(!l.check_by_name_blocking("u", "api", 1).unwrap().allowed);
    l.set_scale(1.0, &["api"]).unwrap();
    assert!(l.check_by_name_blocking("u", "api", 1).unwrap().allowed);
    // health hook: p99 latency 0.4 s against a 0.2 s target halves the limits
    l.set_scale_hook(shardlimit::latency_scale(Duration::from_millis(200), 0.1));
    assert_eq!(l.observe_health(0.4).unwrap(), 0.5);
    assert_eq!(l.check_by_name_blocking("v", "api", 1).unwrap().limit, 5);
    assert_eq!(l.observe_health(0.05).unwrap(), 1.0);
    assert!(l.set_scale(0.0, &[]).is_err());
    assert!(l.set_scale(1.5, &[]).is_err());
    assert!(l.set_scale(0.5, &["nope"]).is_err());
}

#[test]
fn events_reach_subscribers_and_a_capped_stream_and_metrics_count() {
    let s = RedisServer::start();
    let l = json_limiter(
        &[&s],
        r#", "events": {"stream_maxlen": 50}, "policies": {"api": {"algorithm":"fixed_window","limit":2,"window":"1h"}}"#,
    );
    let seen: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    l.subscribe(Arc::new(move |e: &Event| {
        sink.lock().unwrap().push(e.kind().to_string())
    }));
    for _ in 0..302 {
        l.check_by_name_blocking("u", "api", 1).unwrap();
    }
    assert_eq!(
        seen.lock()
            .unwrap()
            .iter()
            .filter(|k| *k == "denied")
            .count(),
        300
    );
    // the stream writer is asynchronous: wait (bounded) until it has written the last event
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut c = s.conn();
    loop {
        let entries: Vec<redis::Value> = redis::cmd("XREVRANGE")
            .arg("sl:events")
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query(&mut c)
            .unwrap();
        let len: u64 = redis::cmd("XLEN").arg("sl:events").query(&mut c).unwrap();
        let info: Vec<redis::Value> = redis::cmd("XINFO")
            .arg("STREAM")
            .arg("sl:events")
            .query(&mut c)
            .unwrap_or_default();
        let added = info
            .chunks(2)
            .find(|kv| matches!(&kv[0], redis::Value::BulkString(b) if b == b"entries-added"))
            .and_then(|kv| match &kv[1] {
                redis::Value::Int(n) => Some(*n as u64),
                _ => None,
            })
            .unwrap_or(0);
        if added >= 300 {
            assert!(!entries.is_empty());
            assert!(len <= 50 + 100, "stream not capped: {len}");
            // and it expires a week after its last event
            let ttl: i64 = redis::cmd("PTTL").arg("sl:events").query(&mut c).unwrap();
            assert!(ttl > 0 && ttl <= 7 * 86_400_000, "stream TTL {ttl}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stream has {added} of 300 events"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let m = l.metrics();
    let api = m.policies.iter().find(|p| p.policy == "api").unwrap();
    assert_eq!((api.allowed, api.denied), (2, 300));
    assert!(m.redis_latency.count >= 302);
    let text = m.to_prometheus();
    assert!(
        text.contains("shardlimit_denied_total{policy=\"api\"} 300"),
        "{text}"
    );
    assert!(text.contains("shardlimit_redis_latency_seconds_count"));
}

/// Runs checks of `policy` and returns each decision's (allowed, source) and how long the
/// slowest call took.
fn probe(call: Call, l: &Limiter, policy: &str, n: usize) -> (Vec<(bool, Source)>, Duration) {
    let mut out = Vec::new();
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        let t = Instant::now();
        let d = call(l, policy, &format!("fault:{i}")).unwrap();
        slowest = slowest.max(t.elapsed());
        out.push((d.allowed, d.source));
    }
    (out, slowest)
}

fn fault_config(s: &RedisServer) -> String {
    format!(
        r#"{{"timeout_ms": 150, "instances": 4, "shards":[{{"name":"s0","url":"{}"}}],
        "policies": {{
          "open":   {{"algorithm":"fixed_window","limit":100,"window":"1h","on_error":"open"}},
          "closed": {{"algorithm":"fixed_window","limit":100,"window":"1h","on_error":"closed"}},
          "local":  {{"algorithm":"fixed_window","limit":8,"window":"1h","on_error":"local"}},
          "error":  {{"algorithm":"fixed_window","limit":100,"window":"1h","on_error":"error"}}
        }}}}"#,
        s.url()
    )
}

fn assert_modes_while_down(call: Call, l: &Limiter, what: &str) {
    // generous margin over the 150 ms deadline: a hang would never return at all
    let bound = Duration::from_millis(1500);
    let (open, t) = probe(call, l, "open", 6);
    assert!(
        open.iter().all(|d| *d == (true, Source::Fallback)),
        "{what} open: {open:?}"
    );
    assert!(t < bound, "{what}: a call took {t:?}");
    let (closed, t) = probe(call, l, "closed", 6);
    assert!(
        closed.iter().all(|d| *d == (false, Source::Fallback)),
        "{what} closed: {closed:?}"
    );
    assert!(t < bound, "{what}: a call took {t:?}");
    // local: limit 8 shared by 4 instances -> 2 per key locally
    for i in 0..3 {
        let d = call(l, "local", &format!("{what}-same-key")).unwrap();
        // a real local decision: measured (its share's budget), a denial a rate limit
        assert_eq!(d.source, Source::LocalFallback);
        assert!(d.measured());
        if !d.allowed {
            assert!(d.retry_after.is_some(), "{d:?}");
            assert!(d
                .headers()
                .iter()
                .any(|(n, _)| *n == "X-RateLimit-Remaining"));
        }
        assert_eq!(d.allowed, i < 2, "{what} local #{i}: {d:?}");
        assert_eq!(d.limit, 2);
    }
    let e = call(l, "error", "k").unwrap_err();
    assert!(e.is_backend(), "{what}: {e}");
}

/// Waits (bounded) until the shard answers again: recovery happens in the background.
fn wait_recovered(call: Call, l: &Limiter, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let d = call(l, "open", "recovery").unwrap();
        if d.source == Source::Redis {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: did not recover");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One check as a caller makes it: blocking (on the caller's thread, over a blocking
/// connection) or awaited in the caller's Tokio runtime (over the multiplexed connection).
type Call = fn(&Limiter, &str, &str) -> shardlimit::Result<shardlimit::Decision>;

fn blocking_call(l: &Limiter, policy: &str, key: &str) -> shardlimit::Result<shardlimit::Decision> {
    l.check_by_name_blocking(key, policy, 1)
}

fn async_call(l: &Limiter, policy: &str, key: &str) -> shardlimit::Result<shardlimit::Decision> {
    thread_local!(static RT: tokio::runtime::Runtime = rt());
    RT.with(|rt| rt.block_on(l.check_by_name(key, policy, 1)))
}

#[test]
fn fault_injection_blocking_calls() {
    fault_injection_kill_restart_stop_flush_client_kill(blocking_call);
}

#[test]
fn fault_injection_async_calls() {
    fault_injection_kill_restart_stop_flush_client_kill(async_call);
}

#[test]
fn noscript_retry_is_answered_while_the_shard_replies_blocking_calls() {
    noscript_retry_is_answered_while_the_shard_replies(blocking_call);
}

#[test]
fn noscript_retry_is_answered_while_the_shard_replies_async_calls() {
    noscript_retry_is_answered_while_the_shard_replies(async_call);
}

/// A check that gets NOSCRIPT and sends the script's source again is two requests, each
/// judged by the shard's silence after its own write (`transport/sansio.rs`), not by one
/// deadline from the caller. Replies are held 1200 ms on their way back and the timeout is
/// 1800 ms: the shard is never silent for 1800 ms after a write, so the check is answered,
/// after both tries (2400 ms at the earliest); a shard whose replies take longer than the
/// timeout is silent and the call fails as a timeout (`hostile.rs`, `chaos.rs`).
fn noscript_retry_is_answered_while_the_shard_replies(call: Call) {
    const POLICY: &str =
        r#"{"error": {"algorithm":"fixed_window","limit":100,"window":"1h","on_error":"error"}}"#;
    let s = RedisServer::start();
    // the scripts are loaded (a check straight to the server), so one try fits
    let direct = json_limiter(&[&s], &format!(", \"policies\": {POLICY}"));
    assert!(call(&direct, "error", "k").unwrap().allowed);
    let slow = SlowReplies::start(s.port, Duration::from_millis(1200));
    let l = Limiter::from_json(&format!(
        r#"{{"timeout_ms": 1800, "shards":[{{"name":"s0","url":"{}"}}],
        "policies": {POLICY}}}"#,
        slow.url()
    ))
    .unwrap();
    let d = call(&l, "error", "k").unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 98));
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec(&mut s.conn())
        .unwrap();
    let t = Instant::now();
    let d = call(&l, "error", "k").unwrap();
    let took = t.elapsed();
    assert_eq!(
        (d.allowed, d.remaining),
        (true, 97),
        "decided by Redis after the retry"
    );
    assert!(took >= Duration::from_millis(2350), "two tries: {took:?}");
    // the retry loaded the script: the next check needs one try
    let t = Instant::now();
    assert!(call(&l, "error", "k").unwrap().allowed);
    assert!(t.elapsed() < Duration::from_millis(2350), "one try");
}

fn fault_injection_kill_restart_stop_flush_client_kill(call: Call) {
    let mut s = RedisServer::start();
    let port = s.port;
    let l = Limiter::from_json(&fault_config(&s)).unwrap();
    let events: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    l.subscribe(Arc::new(move |e: &Event| {
        if let Event::Circuit { state, .. } = e {
            sink.lock().unwrap().push(format!("{state:?}"));
        }
    }));
    assert_eq!(probe(call, &l, "open", 3).0, vec![(true, Source::Redis); 3]);

    // 1. killed mid-traffic
    s.kill();
    assert_modes_while_down(call, &l, "killed");
    // the circuit is open by now: calls fail fast
    let t = Instant::now();
    probe(call, &l, "open", 20);
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "open circuit still waits: {:?}",
        t.elapsed()
    );

    // 2. restarted empty on the same port: scripts are gone (NOSCRIPT), state is gone
    let s = RedisServer::start_on(port);
    wait_recovered(call, &l, "restart");
    assert!(events.lock().unwrap().iter().any(|e| e == "Open"));
    assert!(events.lock().unwrap().iter().any(|e| e == "Closed"));
    let d = call(&l, "closed", "after-restart").unwrap();
    assert_eq!(
        (d.allowed, d.source, d.remaining),
        (true, Source::Redis, 99)
    );

    // 3. hung: SIGSTOP, then SIGCONT
    unsafe { libc::kill(s.pid() as i32, libc::SIGSTOP) };
    assert_modes_while_down(call, &l, "stopped");
    unsafe { libc::kill(s.pid() as i32, libc::SIGCONT) };
    wait_recovered(call, &l, "SIGCONT");

    // 4. SCRIPT FLUSH: transparent
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec(&mut s.conn())
        .unwrap();
    assert_eq!(
        probe(call, &l, "closed", 3).0,
        vec![(true, Source::Redis); 3]
    );

    // 5. CLIENT KILL of our connection: at most the calls in flight fail over; then back
    let mut c = s.conn();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut c)
        .unwrap();
    let d = call(&l, "closed", "after-kill").unwrap();
    assert!(matches!(d.source, Source::Redis | Source::Fallback));
    wait_recovered(call, &l, "CLIENT KILL");
    let d = call(&l, "closed", "after-kill-2").unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Redis));
}

/// Replies that arrive after their callers gave up (a hung server) must not be handed to
/// later callers: every later decision is the one for its own key.
#[test]
fn late_replies_never_reach_the_wrong_caller() {
    let s = RedisServer::start();
    let l = Limiter::from_json(&fault_config(&s)).unwrap();
    let rt = rt();
    let check = |key: &str| rt.block_on(l.check_by_name(key, "error", 1));
    assert_eq!(check("warm").unwrap().remaining, 99);
    unsafe { libc::kill(s.pid() as i32, libc::SIGSTOP) };
    for i in 0..3 {
        let e = check(&format!("lost:{i}")).unwrap_err();
        assert!(e.is_backend(), "{e}");
    }
    unsafe { libc::kill(s.pid() as i32, libc::SIGCONT) };
    // the circuit opened: wait (bounded) until the shard answers again
    let deadline = Instant::now() + Duration::from_secs(15);
    while check("probe").is_err() {
        assert!(Instant::now() < deadline, "did not recover");
        std::thread::sleep(Duration::from_millis(50));
    }
    for n in 1..=5u64 {
        let d = check("mine").unwrap();
        assert_eq!(
            (d.source, d.remaining),
            (Source::Redis, 100 - n),
            "check {n}"
        );
    }
    // the lost checks were admitted by Redis when it woke up (their callers had gone)
    let d = rt.block_on(l.peek(&format!("lost:{}", 0), &l.policy("error").unwrap()));
    assert_eq!(d.unwrap().remaining, 99);
}

#[test]
fn policy_options_validate() {
    let p = Policy::new("lb", Limit::leaky_bucket(5, 1.0)).unwrap();
    let e = p
        .with_local_admission(LocalAdmission {
            max_batch: 10,
            max_hold: Duration::from_secs(1),
        })
        .unwrap_err();
    assert!(e.to_string().contains("local admission works with"), "{e}");
    let e = Limiter::from_json(r#"{"policies":{"a":{"algorithm":"fixed_window","limit":5,"window":"1m","auto_block":{"after":0,"within":"1m","for":"1h"}}}}"#).unwrap_err();
    assert!(
        e.to_string().starts_with("policies.a.auto_block.after"),
        "{e}"
    );
    let e = Limiter::from_json(r#"{"policies":{"a":{"algorithm":"fixed_window","limit":5,"window":"1m","on_error":"sometimes"}}}"#).unwrap_err();
    assert!(e.to_string().starts_with("policies.a.on_error"), "{e}");
    assert_eq!(p.with_on_error(OnError::Closed).on_error(), OnError::Closed);
}

/// A layered check decides a layer whose shard is down by that layer's `on_error`: an
/// `on_error: local` layer is decided locally (its share of the limit), so a denial by it
/// is a local rate-limit decision, as a check of its policy alone is; a denial by a layer
/// Redis decided is Redis's even when another layer's shard is down.
#[test]
fn a_layered_check_follows_each_failed_layers_on_error() {
    let up = RedisServer::start();
    let down = support::free_port(); // nothing listens there
    let l = Limiter::from_json(&format!(
        r#"{{"timeout_ms": 150, "instances": 4, "shards":[
            {{"name":"up","url":"{}"}}, {{"name":"down","url":"redis://127.0.0.1:{down}"}}],
        "policies": {{
          "local": {{"algorithm":"fixed_window","limit":8,"window":"1h","on_error":"local"}},
          "open":  {{"algorithm":"fixed_window","limit":8,"window":"1h","on_error":"open"}},
          "one":   {{"algorithm":"fixed_window","limit":1,"window":"1h","on_error":"error"}}
        }}}}"#,
        up.url()
    ))
    .unwrap();
    let (mut on_up, mut on_down) = (Vec::new(), Vec::new());
    for i in 0..200 {
        let k = format!("k{i}");
        match l.route(&k).unwrap().1.as_str() {
            "up" => on_up.push(k),
            _ => on_down.push(k),
        }
    }
    let (local, open, one) = (
        l.policy("local").unwrap(),
        l.policy("open").unwrap(),
        l.policy("one").unwrap(),
    );
    let rt = rt();
    let check = |layers: &[Layer]| rt.block_on(l.check_all(layers)).unwrap();
    // one layer, its shard down: limit 8 shared by 4 instances, 2 locally
    let alone = [Layer::new(&on_down[0], &local, 1)];
    for i in 0..3 {
        let d = check(&alone);
        assert_eq!(
            (d.allowed, d.source),
            (i < 2, Source::LocalFallback),
            "#{i}: {d:?}"
        );
        assert_eq!(d.limit, 2, "{d:?}");
        assert!(d.measured());
        if !d.allowed {
            assert!(d.retry_after.is_some(), "{d:?}");
        }
    }
    // the local layer denies beside a layer Redis admits: a local decision, not "unchecked"
    let beside = [
        Layer::new(&on_up[0], &one, 1),
        Layer::new(&on_down[0], &local, 1),
    ];
    let d = check(&beside);
    assert_eq!(
        (d.allowed, d.source, d.layer),
        (false, Source::LocalFallback, Some(1))
    );
    assert!(d.retry_after.is_some(), "{d:?}");
    // Redis denies while another layer's shard is down (and falls back open): Redis's denial
    let d = check(&[Layer::new(&on_up[1], &one, 1)]);
    assert!(d.allowed);
    let d = check(&[
        Layer::new(&on_up[1], &one, 1),
        Layer::new(&on_down[1], &open, 1),
    ]);
    assert_eq!(
        (d.allowed, d.source, d.layer),
        (false, Source::Redis, Some(0)),
        "{d:?}"
    );
    // all admit, one layer unmeasured: a fallback decision
    let d = check(&[
        Layer::new(&on_up[2], &one, 1),
        Layer::new(&on_down[2], &open, 1),
    ]);
    assert_eq!((d.allowed, d.source), (true, Source::Fallback), "{d:?}");
}
