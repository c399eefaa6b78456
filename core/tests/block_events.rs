//! A check that meets the block list is an `Event::Blocked`, on Redis also when the
//! limiter's block cache answers it without a script call (it did not emit one before).

mod support;

use shardlimit::{Event, Limiter, Source};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use support::RedisServer;

#[test]
fn a_check_answered_from_the_block_cache_is_a_blocked_event() {
    let s = RedisServer::start();
    let limiter = Limiter::from_json(&format!(
        r#"{{"shards": [{{"name": "s0", "url": "{}"}}], "timeout_ms": 5000,
            "policies": {{"api": {{"algorithm": "fixed_window", "limit": 100, "window": "1h"}}}}}}"#,
        s.url()
    ))
    .unwrap();
    let (tx, rx) = mpsc::sync_channel(16);
    limiter.subscribe(Arc::new(move |e: &Event| {
        if let Event::Blocked { key, auto, .. } = e {
            let _ = tx.try_send((key.clone(), *auto));
        }
    }));
    limiter
        .block_blocking("bad", Some(Duration::from_secs(60)), "abuse")
        .unwrap();
    for _ in 0..2 {
        let d = limiter.check_by_name_blocking("bad", "api", 1).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.source, Source::Block);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)),
            Ok(("bad".to_string(), false)),
            "a blocked check without its event"
        );
    }
}
