//! A shard behind Redis Sentinel follows a failover to the new primary, keeping its state.
//! Primary, replica and Sentinel are real processes the test starts on loopback ports.

mod support;

use shardlimit::{ErrorKind, Limiter, Source};
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
    sentinel_with(master_port, "")
}

/// A Sentinel watching the primary on `master_port`, with `extra` lines of configuration.
fn sentinel_with(master_port: u16, extra: &str) -> Sentinel {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {master_port} 1\n\
             sentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 4000\n{extra}",
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

/// What a failover needs: a primary, its replica (in sync) and a Sentinel watching the
/// primary that has seen the replica.
fn primary_replica_sentinel() -> (RedisServer, RedisServer, Sentinel) {
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
    wait("the replica to sync", || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut replica.conn())
            .unwrap_or_default();
        info.contains("master_link_status:up")
    });
    wait("the sentinel to see the replica", || {
        sentinel_cmd::<Vec<redis::Value>>(s.1, &["SENTINEL", "REPLICAS", "mymaster"])
            .map(|r| !r.is_empty())
            .unwrap_or(false)
    });
    (primary, replica, s)
}

#[test]
fn sentinel_shard_follows_failover() {
    let (primary, replica, s) = primary_replica_sentinel();
    let sport = s.1;

    let l = Limiter::from_json(&format!(
        r#"{{"timeout_ms": 500, "shards": [{{"name": "ha", "sentinel": {{"nodes": ["127.0.0.1:{sport}"], "master": "mymaster"}}}}],
            "policies": {{"login": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "closed"}}}}}}"#
    ))
    .unwrap();
    for _ in 0..5 {
        assert!(
            l.check_by_name_blocking("user:1", "login", 1)
                .unwrap()
                .allowed
        );
    }
    let d = l.check_by_name_blocking("user:1", "login", 1).unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Redis));
    // the state has reached the replica before we fail over to it
    wait("replication of the counter", || {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("sl:s:login:*")
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
        // the demoted server drops its clients: a reset connection is "not yet"
        let role: Vec<redis::Value> = primary
            .try_conn()
            .and_then(|mut c| redis::cmd("ROLE").query(&mut c))
            .unwrap_or_default();
        matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"slave")
    });
    wait("the limiter to write to the new primary", || {
        l.check_by_name_blocking("user:2", "login", 1)
            .map(|d| d.source == Source::Redis && d.allowed)
            .unwrap_or(false)
    });
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut replica.conn()).unwrap();
    assert!(matches!(&role[0], redis::Value::BulkString(r) if r == b"master"));
    let on_new: Vec<String> = redis::cmd("KEYS")
        .arg("sl:s:login:*user:2*")
        .query(&mut replica.conn())
        .unwrap();
    assert!(
        !on_new.is_empty(),
        "user:2 was not written to the new primary"
    );
    // and the client at its limit is still limited
    let d = l.check_by_name_blocking("user:1", "login", 1).unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Redis));
}

/// A primary that requires a password, behind a Sentinel that requires one of its own:
/// both logins come from the config (structured form or URL), and a wrong one is a clear
/// connection error.
#[test]
fn sentinel_shard_logs_in_to_the_sentinel_and_the_primary() {
    let primary =
        RedisServer::start_with(free_port(), vec!["--requirepass".into(), "p@ss:1".into()]);
    let s = sentinel_with(
        primary.port,
        "sentinel auth-pass mymaster p@ss:1\nrequirepass s&pw\n",
    );
    let sport = s.1;
    wait("the sentinel to answer", || {
        redis::Client::open(format!("redis://:s%26pw@127.0.0.1:{sport}"))
            .and_then(|c| c.get_connection())
            .and_then(|mut c| {
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg("mymaster")
                    .query::<Vec<String>>(&mut c)
            })
            .map(|a| a.get(1) == Some(&primary.port.to_string()))
            .unwrap_or(false)
    });
    let policies = r#""policies": {"login": {"algorithm": "fixed_window", "limit": 3, "window": "1h", "on_error": "error"}}"#;
    let structured = |password: &str, sentinel_password: &str| {
        format!(
            r#"{{"timeout_ms": 2000, "shards": [{{"name": "ha", "sentinel": {{"nodes": ["127.0.0.1:{sport}"],
                "master": "mymaster", "password": "{password}", "sentinel_password": "{sentinel_password}"}}}}],
                {policies}}}"#
        )
    };
    let l = Limiter::from_json(&structured("p@ss:1", "s&pw")).unwrap();
    for left in [2, 1] {
        let d = l.check_by_name_blocking("user:1", "login", 1).unwrap();
        assert_eq!(
            (d.allowed, d.remaining, d.source),
            (true, left, Source::Redis)
        );
    }
    // the URL form, percent-encoded, reaches the same state
    let by_url = Limiter::from_json(&format!(
        r#"{{"timeout_ms": 2000, "shards": [{{"name": "ha",
            "url": "redis+sentinel://:p%40ss%3A1@127.0.0.1:{sport}/mymaster?sentinel_password=s%26pw"}}],
            {policies}}}"#
    ))
    .unwrap();
    let d = by_url.check_by_name_blocking("user:1", "login", 1).unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 0));
    let d = l.check_by_name_blocking("user:1", "login", 1).unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Redis));
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("sl:s:login:*")
        .query(
            &mut redis::Client::open(format!("redis://:p%40ss%3A1@127.0.0.1:{}", primary.port))
                .unwrap()
                .get_connection()
                .unwrap(),
        )
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");

    // a wrong password, for the primary or for the Sentinel: an error, never a decision
    for (password, sentinel_password) in [("wrong", "s&pw"), ("p@ss:1", "wrong")] {
        let l = Limiter::from_json(&structured(password, sentinel_password)).unwrap();
        let e = l.check_by_name_blocking("user:9", "login", 1).unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::Connection | ErrorKind::Unavailable),
            "{password}/{sentinel_password}: {e:?}"
        );
        assert!(!e.to_string().contains("wrong"), "{e}");
    }
}

/// After a failover, a long-running limiter went on with the old primary until that one
/// failed its calls, then waited out the probe's back-off: it returned to Redis 0.9-1 s
/// after Sentinel had switched. It follows the switch as Sentinel reports it now
/// (`+switch-master`): checks made from 300 ms after the report on land on the new primary.
#[test]
fn sentinel_shard_follows_the_switch_as_sentinel_reports_it() {
    let (primary, replica, s) = primary_replica_sentinel();
    let sport = s.1;
    let l = Limiter::from_json(&format!(
        r#"{{"timeout_ms": 300, "shards": [{{"name": "ha", "sentinel": {{"nodes": ["127.0.0.1:{sport}"], "master": "mymaster"}}}}],
            "policies": {{"api": {{"algorithm": "fixed_window", "limit": 1000000, "window": "1h", "on_error": "open"}}}}}}"#
    ))
    .unwrap();
    assert_eq!(
        l.check_by_name_blocking("seq:warm", "api", 1)
            .unwrap()
            .source,
        Source::Redis
    );
    // the moment Sentinel reports the switch, seen by a subscriber of our own
    let mut sub = redis::Client::open(format!("redis://127.0.0.1:{sport}"))
        .unwrap()
        .get_connection()
        .unwrap();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let switched = std::thread::spawn(move || {
        let mut ps = sub.as_pubsub();
        ps.subscribe("+switch-master").unwrap();
        ready_tx.send(()).unwrap();
        ps.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        ps.get_message().expect("+switch-master within 20 s");
        Instant::now()
    });
    ready.recv().unwrap();
    // (the limiter's subscription is in place before the failover starts: a Sentinel
    // has no PUBSUB NUMSUB, its client list shows the subscribers)
    wait("the limiter's subscription", || {
        sentinel_cmd::<String>(sport, &["CLIENT", "LIST"])
            .map(|list| list.lines().filter(|c| c.contains(" sub=1 ")).count() >= 2)
            .unwrap_or(false)
    });
    let _: String = sentinel_cmd(sport, &["SENTINEL", "FAILOVER", "mymaster"]).unwrap();
    // checks of distinct keys, one after another, until 1.5 s after the switch
    let mut sent: Vec<(u64, Instant)> = Vec::new();
    let mut n = 0u64;
    let t_switch = loop {
        let t = Instant::now();
        let _ = l.check_by_name_blocking(&format!("seq:{n}"), "api", 1);
        sent.push((n, t));
        n += 1;
        if switched.is_finished() {
            break switched.join().unwrap();
        }
        assert!(sent.len() < 200_000, "no switch");
    };
    while t_switch.elapsed() < Duration::from_millis(1500) {
        let t = Instant::now();
        let _ = l.check_by_name_blocking(&format!("seq:{n}"), "api", 1);
        sent.push((n, t));
        n += 1;
    }
    // writes that went to the old primary were lost when it became a replica
    wait("the old primary to be demoted", || {
        // the demoted server drops its clients: a reset connection is "not yet"
        let role: Vec<redis::Value> = primary
            .try_conn()
            .and_then(|mut c| redis::cmd("ROLE").query(&mut c))
            .unwrap_or_default();
        matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"slave")
    });
    let on_new: Vec<String> = redis::cmd("KEYS")
        .arg("*seq:*")
        .query(&mut replica.conn())
        .unwrap();
    let landed: std::collections::HashSet<u64> = on_new
        .iter()
        .filter_map(|k| {
            let rest = &k[k.find("seq:")? + 4..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect();
    let late: Vec<u64> = sent
        .iter()
        .filter(|(n, t)| *t >= t_switch + Duration::from_millis(300) && !landed.contains(n))
        .map(|(n, _)| *n)
        .collect();
    let first = sent
        .iter()
        .find(|(n, t)| *t >= t_switch && landed.contains(n))
        .map(|(_, t)| t.duration_since(t_switch));
    eprintln!("first check on the new primary {first:?} after the switch was reported");
    assert!(
        late.is_empty(),
        "{} checks from 300 ms after the switch did not reach the new primary (first: {:?})",
        late.len(),
        late.first()
    );
}

/// A structured Sentinel config is used as it is, never turned into a URL and parsed again:
/// a master name and passwords holding every character a URL gives a meaning to (`/`, `@`,
/// `?`, `%`, `,`, `:`, `&`, `#`) reach a real Sentinel and primary, and the URL form, with
/// each part percent-encoded, names the same state. (Before the typed spec, such a master
/// name was refused as a config error.)
#[test]
fn a_structured_sentinel_config_takes_any_master_name_and_password() {
    const MASTER: &str = "my/ma@st?er%2C,x";
    const PRIMARY_PW: &str = "p/w@?%2F,x:&#";
    const SENTINEL_PW: &str = "s/e@n?t%41,1:&";
    let primary =
        RedisServer::start_with(free_port(), vec!["--requirepass".into(), PRIMARY_PW.into()]);
    let dir = tempfile::tempdir().unwrap();
    let sport = free_port();
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {sport}\nbind 127.0.0.1\ndir {}\nsentinel monitor {MASTER} 127.0.0.1 {} 1\n\
             sentinel auth-pass {MASTER} {PRIMARY_PW}\nrequirepass {SENTINEL_PW}\n",
            dir.path().display(),
            primary.port
        ),
    )
    .unwrap();
    let child = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server --sentinel");
    let _s = Sentinel(child, sport, dir);
    let sentinel_login = redis::RedisConnectionInfo::default().set_password(SENTINEL_PW);
    wait("the sentinel to answer", || {
        let info = redis::ConnectionAddr::Tcp("127.0.0.1".into(), sport);
        redis::IntoConnectionInfo::into_connection_info(info)
            .map(|i| i.set_redis_settings(sentinel_login.clone()))
            .and_then(redis::Client::open)
            .and_then(|c| c.get_connection())
            .and_then(|mut c| {
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(MASTER)
                    .query::<Vec<String>>(&mut c)
            })
            .map(|a| a.get(1) == Some(&primary.port.to_string()))
            .unwrap_or(false)
    });
    let policies = r#""policies": {"login": {"algorithm": "fixed_window", "limit": 3, "window": "1h", "on_error": "error"}}"#;
    let sentinel = serde_json::json!({
        "nodes": [format!("127.0.0.1:{sport}")],
        "master": MASTER,
        "password": PRIMARY_PW,
        "sentinel_password": SENTINEL_PW,
    });
    let l = Limiter::from_json(&format!(
        r#"{{"timeout_ms": 2000, "shards": [{{"name": "ha", "sentinel": {sentinel}}}], {policies}}}"#
    ))
    .unwrap();
    for left in [2, 1] {
        let d = l.check_by_name_blocking("user:1", "login", 1).unwrap();
        assert_eq!(
            (d.allowed, d.remaining, d.source),
            (true, left, Source::Redis)
        );
    }
    let enc = |s: &str| s.bytes().map(|b| format!("%{b:02X}")).collect::<String>();
    let by_url = Limiter::from_json(&format!(
        r#"{{"timeout_ms": 2000, "shards": [{{"name": "ha",
            "url": "redis+sentinel://:{}@127.0.0.1:{sport}/{}?sentinel_password={}"}}],
            {policies}}}"#,
        enc(PRIMARY_PW),
        enc(MASTER),
        enc(SENTINEL_PW)
    ))
    .unwrap();
    let d = by_url.check_by_name_blocking("user:1", "login", 1).unwrap();
    assert_eq!((d.allowed, d.remaining, d.source), (true, 0, Source::Redis));
    let d = l.check_by_name_blocking("user:1", "login", 1).unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Redis));
}

/// A hostile Sentinel: asked for the primary, it answers with a bulk string of 2^40 bytes;
/// it answers the `+switch-master` watch's SUBSCRIBE, then sends a message whose payload
/// is as long; both streamed for as long as the client reads (the redis crate read them
/// into memory). An answer or a message takes at most 4 KiB: the client closes each
/// connection after at most that and what the sockets hold, the shard (no primary named)
/// takes its failure mode within the deadline, and the watch subscribes again after a
/// back-off.
/// Writes `head` (a reply's start that announces a 1 TiB bulk) and then bytes until the
/// client closes the connection; the bytes it could write.
fn send_without_end(w: &mut impl std::io::Write, head: &[u8]) -> u64 {
    let mut sent = 0u64;
    if w.write_all(head).is_ok() {
        sent += head.len() as u64;
        let chunk = vec![b'x'; 64 << 10];
        while w.write_all(&chunk).is_ok() {
            sent += chunk.len() as u64;
        }
    }
    sent
}

#[test]
fn a_hostile_sentinel_cannot_grow_the_switch_watch() {
    use std::io::{BufRead, BufReader};
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let most_sent = Arc::new(AtomicU64::new(0));
    let (subscribed, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let asked = Arc::new(AtomicUsize::new(0));
    {
        let (most_sent, subscribed, closed, asked) = (
            most_sent.clone(),
            subscribed.clone(),
            closed.clone(),
            asked.clone(),
        );
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else { continue };
                let (most_sent, subscribed, closed, asked) = (
                    most_sent.clone(),
                    subscribed.clone(),
                    closed.clone(),
                    asked.clone(),
                );
                std::thread::spawn(move || {
                    let mut w = s.try_clone().unwrap();
                    let mut r = BufReader::new(s);
                    let mut line = String::new();
                    // (commands as RESP arrays; only their words matter here)
                    while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                        let word = line.trim_end().to_ascii_uppercase();
                        line.clear();
                        if word == "GET-MASTER-ADDR-BY-NAME" {
                            asked.fetch_add(1, Ordering::AcqRel);
                            let sent = send_without_end(&mut w, b"*2\r\n$1099511627776\r\n");
                            most_sent.fetch_max(sent, Ordering::AcqRel);
                            closed.fetch_add(1, Ordering::AcqRel);
                            return;
                        }
                        if word != "SUBSCRIBE" {
                            continue;
                        }
                        r.read_line(&mut line).unwrap(); // the channel's length
                        r.read_line(&mut line).unwrap(); // the channel
                        line.clear();
                        subscribed.fetch_add(1, Ordering::AcqRel);
                        let head = "*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n\
                                    *3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n$1099511627776\r\n";
                        let sent = send_without_end(&mut w, head.as_bytes());
                        most_sent.fetch_max(sent, Ordering::AcqRel);
                        closed.fetch_add(1, Ordering::AcqRel);
                        return;
                    }
                });
            }
        });
    }
    let l = Limiter::from_json(&format!(
        r#"{{"timeout_ms": 300, "shards": [{{"name": "ha", "sentinel": {{"nodes": ["127.0.0.1:{port}"], "master": "mymaster"}}}}],
            "policies": {{"api": {{"algorithm": "fixed_window", "limit": 10, "window": "1h", "on_error": "open"}}}}}}"#
    ))
    .unwrap();
    let t = Instant::now();
    let d = l.check_by_name_blocking("k", "api", 1).unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Fallback));
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    // the watch closed the endless message, and subscribed again
    let deadline = Instant::now() + Duration::from_secs(5);
    assert!(asked.load(Ordering::Acquire) >= 1);
    while closed.load(Ordering::Acquire) < 3 || subscribed.load(Ordering::Acquire) < 3 {
        assert!(
            Instant::now() < deadline,
            "the watch did not close the endless message ({} closed, {} subscribed, {} bytes)",
            closed.load(Ordering::Acquire),
            subscribed.load(Ordering::Acquire),
            most_sent.load(Ordering::Acquire)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let sent = most_sent.load(Ordering::Acquire);
    assert!(
        sent < 16 << 20,
        "{sent} bytes sent on one connection before its close"
    );
}
