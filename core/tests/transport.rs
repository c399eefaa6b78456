//! The transport against a real redis-server: connections that the server closed while
//! they sat idle are replaced before a call is sent on them, so no call fails for it.

mod support;

use shardlimit::{Limiter, Source};
use std::time::Duration;
use support::RedisServer;

fn limiter(s: &RedisServer) -> Limiter {
    Limiter::from_json(&format!(
        r#"{{"timeout_ms": 500, "on_error": "error", "shards": [{{"name": "s", "url": "{}"}}],
            "policies": {{"p": {{"algorithm": "fixed_window", "limit": 100, "window": "1h"}}}}}}"#,
        s.url()
    ))
    .unwrap()
}

#[test]
fn connections_closed_while_idle_are_replaced_before_use() {
    // the server drops clients idle for over a second (its `timeout`), as managed Redis
    // services and proxies do: the first call after that used to fail
    let s = RedisServer::start_with(support::free_port(), vec!["--timeout".into(), "1".into()]);
    let l = limiter(&s);
    let p = l.policy("p").unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut expect = 100;
    for round in 0..2 {
        let d = l.check_blocking("k", &p, 1).unwrap();
        expect -= 1;
        assert_eq!(
            (d.source, d.remaining),
            (Source::Redis, expect),
            "round {round}"
        );
        let d = rt.block_on(l.check("k", &p, 1)).unwrap();
        expect -= 1;
        assert_eq!(
            (d.source, d.remaining),
            (Source::Redis, expect),
            "round {round}"
        );
        // the server closes both connections (it checks idle clients ten times a second)
        let closed = std::time::Instant::now();
        loop {
            let mut c = s.conn();
            let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut c).unwrap();
            if list.lines().count() <= 1 {
                break; // only this one
            }
            assert!(
                closed.elapsed() < Duration::from_secs(5),
                "idle clients stayed: {list}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // and every later call is decided by Redis, none failed
    let d = l.check_blocking("k", &p, 1).unwrap();
    assert_eq!(d.remaining, expect - 1);
}

#[test]
fn killed_idle_connections_are_replaced_before_use() {
    let s = RedisServer::start();
    let l = limiter(&s);
    let p = l.policy("p").unwrap();
    for i in 0..3u64 {
        let d = l.check_blocking("k", &p, 1).unwrap();
        assert_eq!((d.source, d.remaining), (Source::Redis, 99 - 2 * i));
        let mut c = s.conn();
        let _: redis::Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query(&mut c)
            .unwrap();
        // the pooled blocking connection is dead: found before the next call is sent
        let d = l.check_blocking("k", &p, 1).unwrap();
        assert_eq!((d.source, d.remaining), (Source::Redis, 98 - 2 * i));
    }
}
