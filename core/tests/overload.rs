//! Exact under load (scratch)

mod support;

use shardlimit::Limiter;
use support::RedisServer;

#[test]
fn scratch_one_async_check() {
    let s = RedisServer::start();
    let l = Limiter::from_json(&format!(
        r#"{{"timeout_ms": 300, "shards":[{{"name":"s0","url":"{}"}}],
            "policies": {{"fw": {{"algorithm": "fixed_window", "limit": 7, "window": "1m"}}}}}}"#,
        s.url()
    ))
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let p = l.policy("fw").unwrap();
    for i in 0..3 {
        let t = std::time::Instant::now();
        let d = rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(3), l.check("k", &p, 1)).await
        });
        eprintln!("{i}: {:?} {:?}", t.elapsed(), d);
    }
}
