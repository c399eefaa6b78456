//! Install test of the packaged crate (scripts/test-dist.sh): cargo run -- PORT
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let port = &args[1];
    let config = format!(
        r#"{{"shards":[{{"name":"a","url":"redis://127.0.0.1:{port}"}}],"timeout_ms":2000,
            "policies":{{"p":{{"algorithm":"fixed_window","limit":5,"window":"1h"}}}}}}"#
    );
    let limiter = shardlimit::Limiter::from_json(&config).expect("config");
    let mut allowed = Vec::new();
    for _ in 0..8 {
        let d = limiter
            .check_by_name_blocking("user:rust", "p", 1)
            .expect("check");
        assert_eq!(d.shard, Some(0), "decided by {:?}", d.source);
        allowed.push(d.allowed);
    }
    assert_eq!(allowed, [true, true, true, true, true, false, false, false]);
    println!(
        "rust: admitted {} of 8 (limit 5)",
        allowed.iter().filter(|a| **a).count()
    );
}
