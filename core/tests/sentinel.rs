//! A shard behind Redis Sentinel follows a failover to the new primary, keeping its state.
//! Primary, replica and Sentinel are real processes the test starts on loopback ports.

mod support;

use shardlimit::{Limiter, Source};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{free_port, RedisServer};

struct Sentinel(Child, u16, #[allow(dead_code)] tempfile::TempDir);

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sentinel(master_port: u16) -> Sentinel {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {master_port} 1\n\
             sentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 4000\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let child = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server --sentinel");
    Sentinel(child, port, dir)
}

fn sentinel_cmd<T: redis::FromRedisValue>(port: u16, args: &[&str]) -> redis::RedisResult<T> {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))?.get_connection()?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut c)
}

fn wait(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sentinel_shard_follows_failover() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(
        free_port(),
        vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            primary.port.to_string(),
        ],
    );
    let s = sentinel(primary.port);
    let sport = s.1;
    wait("the replica to sync", || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut replica.conn())
            .unwrap_or_default();
        info.contains("master_link_status:up")
    });
    wait("the sentinel to see the replica", || {
        sentinel_cmd::<Vec<redis::Value>>(sport, &["SENTINEL", "REPLICAS", "mymaster"])
            .map(|r| !r.is_empty())
            .unwrap_or(false)
    });

    let l = Limiter::from_json(&format!(
        r#"{{"timeout_ms": 500, "shards": [{{"name": "ha", "sentinel": {{"nodes": ["127.0.0.1:{sport}"], "master": "mymaster"}}}}],
            "policies": {{"login": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "closed"}}}}}}"#
    ))
    .unwrap();
    for _ in 0..5 {
        assert!(
            l.check_named_blocking("login", "user:1", 1)
                .unwrap()
                .allowed
        );
    }
    let d = l.check_named_blocking("login", "user:1", 1).unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Redis));
    // the state has reached the replica before we fail over to it
    wait("replication of the counter", || {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("sl:login:*")
            .query(&mut replica.conn())
            .unwrap_or_default();
        keys.iter().any(|k| {
            redis::cmd("GET")
                .arg(k)
                .query::<Option<u64>>(&mut replica.conn())
                .ok()
                .flatten()
                == Some(5)
        })
    });

    let _: String = sentinel_cmd(sport, &["SENTINEL", "FAILOVER", "mymaster"]).unwrap();
    wait("the sentinel to promote the replica", || {
        sentinel_cmd::<Vec<String>>(sport, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])
            .map(|a| a.get(1) == Some(&replica.port.to_string()))
            .unwrap_or(false)
    });
    // Redis fails over asynchronously: the old primary takes writes until it is demoted,
    // and those are lost. Once it is a replica, writes can only go to the new primary.
    wait("the old primary to be demoted", || {
        let role: Vec<redis::Value> = redis::cmd("ROLE")
            .query(&mut primary.conn())
            .unwrap_or_default();
        matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"slave")
    });
    wait("the limiter to write to the new primary", || {
        l.check_named_blocking("login", "user:2", 1)
            .map(|d| d.source == Source::Redis && d.allowed)
            .unwrap_or(false)
    });
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut replica.conn()).unwrap();
    assert!(matches!(&role[0], redis::Value::BulkString(r) if r == b"master"));
    let on_new: Vec<String> = redis::cmd("KEYS")
        .arg("sl:login:*user:2*")
        .query(&mut replica.conn())
        .unwrap();
    assert!(
        !on_new.is_empty(),
        "user:2 was not written to the new primary"
    );
    // and the client at its limit is still limited
    let d = l.check_named_blocking("login", "user:1", 1).unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Redis));
}
