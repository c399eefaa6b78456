//! The NOSCRIPT retry (one place: `core/src/engine/redis/call.rs`) on every path that sends
//! EVALSHA itself: after `SCRIPT FLUSH`, the next check, blocking check and shadow check
//! each load their script again and decide as before.

mod support;

use shardlimit::{Limit, Limiter, ManualClock, Policy};
use support::RedisServer;

fn flush(server: &RedisServer) {
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec(&mut server.conn())
        .unwrap();
}

#[test]
fn every_evalsha_path_loads_its_script_again_after_script_flush() {
    let server = RedisServer::start();
    let l = Limiter::from_json(&support::config(&[&server], "{}"))
        .unwrap()
        .with_clock(ManualClock::new(1_800_000_000_000_000))
        .unwrap();
    let p = Policy::new("x", Limit::token_bucket(10, 1.0)).unwrap();
    let s = p.with_shadow(true).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut remaining = 10;
    for step in 0..3 {
        flush(&server);
        let d = match step {
            0 => rt.block_on(l.check("k", &p, 1)).unwrap(),
            1 => l.check_blocking("k", &p, 1).unwrap(),
            _ => l.check_shadow_blocking("k", &s, 1).unwrap(),
        };
        remaining -= 1;
        assert!(d.allowed, "step {step}");
        assert_eq!(d.remaining, remaining, "step {step}: {d:?}");
    }
}
