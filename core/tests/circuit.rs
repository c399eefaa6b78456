//! Failure handling that follows what fails, against real redis-server processes: a
//! server at `maxclients` (no reconnect storm, the circuit opens), recovery within a few
//! hundred milliseconds of the server answering again.

mod support;

use shardlimit::{ErrorKind, Limiter, Source};
use std::time::{Duration, Instant};
use support::RedisServer;

fn config(s: &RedisServer) -> String {
    format!(
        r#"{{"timeout_ms": 150, "shards":[{{"name":"s0","url":"{}"}}],
        "policies": {{
          "open":   {{"algorithm":"fixed_window","limit":100,"window":"1h","on_error":"open"}},
          "closed": {{"algorithm":"fixed_window","limit":100,"window":"1h","on_error":"closed"}},
          "error":  {{"algorithm":"fixed_window","limit":100,"window":"1h","on_error":"error"}}
        }}}}"#,
        s.url()
    )
}

type Call = fn(&Limiter, &str, &str) -> shardlimit::Result<shardlimit::Decision>;

fn blocking_call(l: &Limiter, policy: &str, key: &str) -> shardlimit::Result<shardlimit::Decision> {
    l.check_by_name_blocking(key, policy, 1)
}

fn async_call(l: &Limiter, policy: &str, key: &str) -> shardlimit::Result<shardlimit::Decision> {
    thread_local!(static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap());
    RT.with(|rt| rt.block_on(l.check_by_name(key, policy, 1)))
}

/// `INFO stats` counters of the server, read over `admin`.
fn stat(admin: &mut redis::Connection, name: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("stats").query(admin).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in INFO stats"))
        .trim()
        .parse()
        .unwrap()
}

/// Redis at `maxclients` accepts a connection, answers its first command with
/// `-ERR max number of clients reached` and closes it. That answer counted as a success
/// for the circuit and the connection went back to the pool: one process made 1031
/// refused connections in 0.1 s. Now a refused connection is a connection failure: the
/// circuit opens, connection attempts back off, and calls get their fallback at once.
fn maxclients_makes_no_reconnect_storm(call: Call) {
    let s = RedisServer::start();
    let mut admin = s.conn();
    let l = Limiter::from_json(&config(&s)).unwrap();
    // (the admin connection is the one client allowed)
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(1)
        .exec(&mut admin)
        .unwrap();
    let rejected0 = stat(&mut admin, "rejected_connections");
    let received0 = stat(&mut admin, "total_connections_received");
    let start = Instant::now();
    let mut calls = 0;
    while start.elapsed() < Duration::from_millis(500) {
        let t = Instant::now();
        let d = call(&l, "open", &format!("k{}", calls % 7)).unwrap();
        assert_eq!((d.allowed, d.source), (true, Source::Fallback));
        assert!(
            t.elapsed() < Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
        let e = call(&l, "error", "k").unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::Connection | ErrorKind::Unavailable),
            "a refused connection is a backend failure, not a script error: {e}"
        );
        calls += 1;
    }
    let rejected = stat(&mut admin, "rejected_connections") - rejected0;
    let received = stat(&mut admin, "total_connections_received") - received0;
    eprintln!("{calls} calls in 500 ms: {rejected} connections rejected, {received} received");
    assert!(calls > 100, "calls fail fast: only {calls} in 500 ms");
    // back-off: at most ~6 attempts of the callers (20 ms doubling) and ~7 probes
    // (25 ms doubling to 250 ms) in 500 ms
    assert!(rejected <= 20, "{rejected} rejected connections in 500 ms");
    assert!(received <= 20, "{received} connections in 500 ms");

    // room again: the limiter is back on Redis within a few hundred ms
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(1000)
        .exec(&mut admin)
        .unwrap();
    let back = Instant::now();
    loop {
        let d = call(&l, "open", "again").unwrap();
        if d.source == Source::Redis {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_millis(700),
            "still falling back {:?} after maxclients was raised",
            back.elapsed()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!(
        "back on Redis {:?} after maxclients was raised",
        back.elapsed()
    );
}

#[test]
fn maxclients_blocking_calls() {
    maxclients_makes_no_reconnect_storm(blocking_call);
}

#[test]
fn maxclients_async_calls() {
    maxclients_makes_no_reconnect_storm(async_call);
}

/// How long after the server answers PING again the first check is decided by Redis.
/// Calls keep coming (a 1 ms pause between them paces the loop; nothing waits on it).
fn first_redis_decision_after(call: Call, l: &Limiter, policy: &str) -> Duration {
    let back = Instant::now();
    loop {
        let d = call(l, policy, "recovery").unwrap();
        if d.source == Source::Redis {
            return back.elapsed();
        }
        assert!(!d.measured());
        assert!(
            back.elapsed() < Duration::from_secs(5),
            "no Redis decision 5 s after the server answered again"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Down for 3.5 s (long enough for any back-off to reach its longest), then back: the
/// first Redis decision comes within 500 ms of the server answering PING (it took
/// ~4.7 s: the probe back-off went up to 5 s). Under `closed` that is how long logins
/// stay denied after the outage.
fn recovers_within_a_few_hundred_ms(call: Call) {
    let mut s = RedisServer::start();
    let l = Limiter::from_json(&config(&s)).unwrap();
    assert_eq!(call(&l, "closed", "warm").unwrap().source, Source::Redis);

    // killed, then started again on its port
    s.kill();
    let down = Instant::now();
    while down.elapsed() < Duration::from_millis(3500) {
        let d = call(&l, "closed", "down").unwrap();
        assert_eq!((d.allowed, d.source), (false, Source::Fallback));
        std::thread::sleep(Duration::from_millis(2));
    }
    s.restart(); // returns once the server answers PING
    let took = first_redis_decision_after(call, &l, "closed");
    eprintln!("after a restart: first Redis decision {took:?} after PING answered");
    assert!(took < Duration::from_millis(500), "{took:?}");

    // hung (SIGSTOP), then resumed
    unsafe { libc::kill(s.pid() as i32, libc::SIGSTOP) };
    let down = Instant::now();
    while down.elapsed() < Duration::from_millis(3500) {
        let d = call(&l, "closed", "down").unwrap();
        assert_eq!((d.allowed, d.source), (false, Source::Fallback));
        std::thread::sleep(Duration::from_millis(2));
    }
    unsafe { libc::kill(s.pid() as i32, libc::SIGCONT) };
    let mut c = s.conn();
    let _: String = redis::cmd("PING").query(&mut c).unwrap();
    let took = first_redis_decision_after(call, &l, "closed");
    eprintln!("after SIGCONT: first Redis decision {took:?} after PING answered");
    assert!(took < Duration::from_millis(500), "{took:?}");
}

#[test]
fn recovery_blocking_calls() {
    recovers_within_a_few_hundred_ms(blocking_call);
}

#[test]
fn recovery_async_calls() {
    recovers_within_a_few_hundred_ms(async_call);
}

/// A fallback decision's headers carry no invented budget: an `open` fallback said
/// `X-RateLimit-Remaining: 99`.
#[test]
fn fallback_decisions_say_the_limit_was_not_measured() {
    let mut s = RedisServer::start();
    let l = Limiter::from_json(&config(&s)).unwrap();
    let d = blocking_call(&l, "open", "k").unwrap();
    assert!(d.measured());
    assert!(d
        .headers()
        .iter()
        .any(|(k, _)| *k == "X-RateLimit-Remaining"));
    s.kill();
    let d = blocking_call(&l, "open", "k").unwrap();
    assert_eq!(
        (d.allowed, d.source, d.measured()),
        (true, Source::Fallback, false)
    );
    let h = d.headers();
    assert!(
        h.iter()
            .all(|(k, _)| *k != "X-RateLimit-Remaining" && *k != "RateLimit"),
        "{h:?}"
    );
    assert!(
        h.contains(&("X-RateLimit-Status", "unmeasured".to_string())),
        "{h:?}"
    );
    let d = blocking_call(&l, "closed", "k").unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Fallback));
    assert!(d.body()["remaining"].is_null());
    assert!(d.headers().iter().any(|(k, _)| *k == "Retry-After"));
}
