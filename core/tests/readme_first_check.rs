//! The Rust first check of README.md ("A first check, per language") and of
//! docs/features.md ("Rust"): each block is held equal to a copy here, and the copy runs
//! against a real redis-server, with the limiter loaded from a config naming that server
//! instead of `shard-config.json`'s demo shards. The test fails when a block changes alone.

mod support;

use shardlimit::Limiter;
use std::time::Duration;
use support::RedisServer;

const README: &str = r####"use shardlimit::Limiter;
use std::time::Duration;

let limiter = Limiter::from_config_file("shard-config.json")?; // or from_json, from_env, memory()
limiter.connect(Duration::from_secs(2)).await?; // at start-up: connections and scripts
let d = limiter.check_by_name("user:alice", "login", 1).await?; // key first, then policy
if !d.allowed {
    // 429: d.headers() and d.body()
}
"####;

const FEATURES: &str = r####"use shardlimit::Limiter;
use std::time::Duration;

let limiter = Limiter::from_config_file("shard-config.json")?; // or from_json, from_env, memory()
limiter.connect(Duration::from_secs(2)).await?; // at start-up: connections and scripts, own timeout
let d = limiter.check_by_name("user:alice", "login", 1).await?; // key first, then policy
if !d.allowed {
    // 429: d.headers() has X-RateLimit-*, RateLimit, RateLimit-Policy and Retry-After;
    // d.body() is the JSON body
}
"####;

fn page(path: &str) -> String {
    std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))).expect(path)
}

#[test]
fn the_readmes_rust_first_check_runs() -> shardlimit::Result<()> {
    assert!(
        page("README.md").contains(&format!("```rust\n{README}```")),
        "README.md's Rust first check differs from this test's copy"
    );
    assert!(
        page("docs/features.md").contains(&format!("```rust\n{FEATURES}```")),
        "docs/features.md's Rust block differs from this test's copy"
    );
    let server = RedisServer::start();
    // shard-config.json's login policy (fixed_window, 5 per minute), on this server;
    // on_error "error": every decision comes from Redis
    let config = support::config(
        &[&server],
        r#"{"login": {"algorithm": "fixed_window", "limit": 5, "window": "1m", "on_error": "error"}}"#,
    );
    let limiter = Limiter::from_json(&config)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // the copy, with the limiter above
        limiter.connect(Duration::from_secs(2)).await?; // at start-up: connections and scripts
        let mut denied = 0;
        for _ in 0..6 {
            let d = limiter.check_by_name("user:alice", "login", 1).await?; // key first, then policy
            if !d.allowed {
                // 429: d.headers() and d.body()
                assert!(d.headers().iter().any(|(name, _)| *name == "Retry-After"));
                assert!(!d.body().is_null());
                denied += 1;
            }
        }
        assert_eq!(denied, 1, "the 6th check of 5 per minute is denied");
        Ok(())
    })
}
