//! Rate-limited warning lines: every fallback is logged, at most one
//! line per (reason, subject) per `log_interval`, with the count of the ones suppressed,
//! on the limiter's clock (injected here), to `tracing` and to the log sink the bindings
//! install.

mod support;

use parking_lot::Mutex;
use shardlimit::{
    Config, ErrorKind, Limiter, LogLevel, LogReason, LogRecord, ManualClock, DEFAULT_LOG_INTERVAL,
};
use std::sync::Arc;
use std::time::Duration;
use support::{free_port, RedisServer};

const T0: u64 = 1_700_000_000_000_000;

fn dead_config(extra: &str) -> String {
    // nothing listens on the port: every call fails fast (connection refused, then the
    // circuit is open)
    format!(
        r#"{{"timeout_ms": 50, {extra} "shards": [{{"name": "s0", "url": "redis://127.0.0.1:{}"}}],
            "policies": {{"api": {{"rate": "100/minute", "on_error": "open"}},
                          "login": {{"rate": "5/minute", "on_error": "closed"}},
                          "strict": {{"rate": "5/minute", "on_error": "error"}}}}}}"#,
        free_port()
    )
}

fn collect(l: &Limiter) -> Arc<Mutex<Vec<LogRecord>>> {
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    l.set_log_sink(Some(Arc::new(move |r: &LogRecord| {
        g.lock().push(r.clone())
    })));
    got
}

fn of(got: &Mutex<Vec<LogRecord>>, reason: LogReason, subject: &str) -> Vec<LogRecord> {
    got.lock()
        .iter()
        .filter(|r| r.reason == reason && r.subject == subject)
        .cloned()
        .collect()
}

#[test]
fn a_thousand_fallbacks_are_one_line_then_the_next_carries_the_count() {
    let clock = ManualClock::new(T0);
    let l = Limiter::from_json(&dead_config(""))
        .unwrap()
        .with_clock(clock.clone())
        .unwrap();
    let got = collect(&l);
    for _ in 0..1000 {
        let d = l.check_by_name_blocking("user:1", "api", 1).unwrap();
        assert!(d.allowed);
    }
    let lines = of(&got, LogReason::Fallback, "api");
    assert_eq!(lines.len(), 1, "{lines:?}");
    let first = &lines[0];
    assert_eq!(first.level, LogLevel::Warn);
    assert_eq!(first.target, "shardlimit");
    assert_eq!(first.allowed, Some(true));
    assert_eq!(first.suppressed, 0);
    assert!(first.error_kind.is_backend(), "{:?}", first.error_kind);
    assert!(first.message.contains("`api`"), "{}", first.message);
    assert!(first.message.contains("allowed"), "{}", first.message);
    assert!(
        first.message.contains(first.error_kind.name()),
        "{}",
        first.message
    );
    // the key is not in the line: it may be personal data, and it is not what an
    // operator acts on
    assert!(!first.message.contains("user:1"), "{}", first.message);

    // one interval later, the next fallback is a line with the 999 not written
    clock.advance_us(DEFAULT_LOG_INTERVAL.as_micros() as u64 - 1);
    l.check_by_name_blocking("user:1", "api", 1).unwrap();
    assert_eq!(of(&got, LogReason::Fallback, "api").len(), 1);
    clock.advance_us(1);
    l.check_by_name_blocking("user:1", "api", 1).unwrap();
    let lines = of(&got, LogReason::Fallback, "api");
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[1].suppressed, 1000);
    assert!(
        lines[1].message.contains("(1000 more since the last line"),
        "{}",
        lines[1].message
    );

    // the circuit opened once: one line for the shard
    let circuit = of(&got, LogReason::CircuitOpened, "s0");
    assert_eq!(circuit.len(), 1, "{circuit:?}");
    assert!(circuit[0].message.contains("circuit of shard `s0` opened"));
}

#[test]
fn each_policy_has_its_own_line_and_a_denying_fallback_says_so() {
    let clock = ManualClock::new(T0);
    let l = Limiter::from_json(&dead_config(""))
        .unwrap()
        .with_clock(clock)
        .unwrap();
    let got = collect(&l);
    for _ in 0..10 {
        assert!(l.check_by_name_blocking("k", "api", 1).unwrap().allowed);
        assert!(!l.check_by_name_blocking("k", "login", 1).unwrap().allowed);
        // on_error: error returns the error to the caller: not a fallback, no line
        let e = l.check_by_name_blocking("k", "strict", 1).unwrap_err();
        assert!(e.kind().is_backend());
    }
    assert_eq!(of(&got, LogReason::Fallback, "api").len(), 1);
    let login = of(&got, LogReason::Fallback, "login");
    assert_eq!(login.len(), 1);
    assert_eq!(login[0].allowed, Some(false));
    assert!(login[0].message.contains("denied"), "{}", login[0].message);
    assert!(of(&got, LogReason::Fallback, "strict").is_empty());
}

#[test]
fn the_interval_comes_from_the_config_and_a_reload_changes_it() {
    let clock = ManualClock::new(T0);
    let text = dead_config(r#""log_interval": "1h","#);
    let l = Limiter::from_json(&text)
        .unwrap()
        .with_clock(clock.clone())
        .unwrap();
    assert_eq!(l.config().log_interval, Duration::from_secs(3600));
    let got = collect(&l);
    l.check_by_name_blocking("k", "api", 1).unwrap();
    clock.advance_us(10_000_000);
    l.check_by_name_blocking("k", "api", 1).unwrap();
    assert_eq!(of(&got, LogReason::Fallback, "api").len(), 1);
    // a reload to 5 s: 10 s after the first line, the next is due
    l.reload(Config::from_json(&text.replace(r#""1h""#, r#""5s""#)).unwrap())
        .unwrap();
    l.check_by_name_blocking("k", "api", 1).unwrap();
    let lines = of(&got, LogReason::Fallback, "api");
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1].suppressed, 1);
    assert!(
        lines[1].message.contains("one line per 5s"),
        "{}",
        lines[1].message
    );
}

#[test]
fn a_bad_log_interval_is_a_config_error_naming_it() {
    for bad in [r#""0s""#, r#""2d""#, r#""soon""#, "true", "-1"] {
        let e = Config::from_json(&format!(r#"{{"log_interval": {bad}}}"#)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{bad}");
        assert!(e.to_string().contains("log_interval"), "{bad}: {e}");
    }
    let c = Config::from_json(r#"{"log_interval": "250ms"}"#).unwrap();
    assert_eq!(c.log_interval, Duration::from_millis(250));
    assert_eq!(Config::default().log_interval, DEFAULT_LOG_INTERVAL);
}

#[test]
fn nothing_is_logged_while_redis_answers_and_the_outage_is_logged() {
    let mut server = RedisServer::start();
    let cfg = support::config(
        &[&server],
        r#"{"api": {"rate": "1000/minute", "on_error": "open"}}"#,
    )
    .replace(r#""timeout_ms": 2000"#, r#""timeout_ms": 200"#);
    let l = Limiter::from_json(&cfg).unwrap();
    let got = collect(&l);
    for _ in 0..100 {
        assert!(l.check_by_name_blocking("k", "api", 1).unwrap().allowed);
    }
    assert!(got.lock().is_empty(), "{:?}", got.lock());
    server.kill();
    for _ in 0..100 {
        assert!(l.check_by_name_blocking("k", "api", 1).unwrap().allowed);
    }
    let lines = of(&got, LogReason::Fallback, "api");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].suppressed, 0);
}

#[test]
fn a_sink_removed_gets_nothing_more() {
    let clock = ManualClock::new(T0);
    let l = Limiter::from_json(&dead_config(""))
        .unwrap()
        .with_clock(clock.clone())
        .unwrap();
    let got = collect(&l);
    l.check_by_name_blocking("k", "api", 1).unwrap();
    l.set_log_sink(None);
    clock.advance_us(60_000_000);
    l.check_by_name_blocking("k", "api", 1).unwrap();
    assert_eq!(of(&got, LogReason::Fallback, "api").len(), 1);
}

/// A Redis error whose text holds the Redis key (a script that finds a state it cannot
/// read names the key it read) reaches no log line with the user's key in it: user keys
/// are API keys and e-mail addresses.
#[test]
fn user_keys_are_scrubbed_from_redis_error_text_in_log_lines() {
    let server = RedisServer::start();
    let l = Limiter::from_json(&format!(
        r#"{{"shards": [{{"name": "s0", "url": "{}"}}], "log_interval": "1ms",
            "policies": {{"open": {{"algorithm": "token_bucket", "capacity": 10, "refill_per_sec": 0.003, "on_error": "open"}}}}}}"#,
        server.url()
    ))
    .unwrap();
    let clock = ManualClock::new(T0);
    let l = l.with_clock(clock.clone()).unwrap();
    let got = collect(&l);
    for key in ["alice@example.com", "{acme}:sk_live_51Hsecret"] {
        assert!(l.check_by_name_blocking(key, "open", 1).unwrap().allowed);
        // the state becomes one the script cannot read
        let mut c = server.conn();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
        assert!(!keys.is_empty());
        for k in keys {
            let _: () = redis::cmd("SET")
                .arg(&k)
                .arg("not:a:state")
                .query(&mut c)
                .unwrap();
        }
        let d = l.check_by_name_blocking(key, "open", 1).unwrap();
        assert_eq!(d.source, shardlimit::Source::Fallback, "{d:?}");
        clock.advance_us(1_000_000); // past log_interval: the next fallback is a line
    }
    let lines = of(&got, LogReason::Fallback, "open");
    assert_eq!(lines.len(), 2, "{lines:?}");
    for r in lines {
        assert_eq!(r.error_kind, ErrorKind::Script);
        for text in [&r.message, &r.error] {
            assert!(
                text.contains("unreadable") && text.contains("<key>"),
                "{text}"
            );
            assert!(
                !text.contains("alice") && !text.contains("sk_live") && !text.contains("acme"),
                "{text}"
            );
        }
    }
}
