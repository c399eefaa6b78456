//! The host transport (`HostChecks`, `transport/sansio.rs`) against real redis-servers,
//! driven by a plain `std::net::TcpStream` loop standing in for a host's event loop: its
//! decisions equal the default transport's, a lost script is loaded again, a stopped
//! server gives the `on_error` fallback within the deadline, and a killed one is
//! reconnected to.

mod support;

use shardlimit::{HostChecks, HostStep, Limiter, ManualClock, Policy, Source};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::RedisServer;

/// The host: one blocking socket per shard with a short read timeout, polled in turn.
struct Host {
    hc: HostChecks,
    socks: Vec<Option<TcpStream>>,
}

type Decided = HashMap<u64, shardlimit::Result<shardlimit::Decision>>;

impl Host {
    fn new(l: &Limiter) -> Host {
        let hc = HostChecks::new(l).unwrap();
        let socks = (0..hc.shard_count()).map(|_| None).collect();
        Host { hc, socks }
    }

    /// Connects what is down (a host reconnects in the background, between checks).
    fn connect(&mut self, out: &mut Decided) {
        for shard in 0..self.socks.len() {
            if self.hc.is_down(shard) {
                self.socks[shard] = None;
            }
            if self.socks[shard].is_none() {
                self.hc.connecting(shard).unwrap();
                let (host, port) = self.hc.address(shard).unwrap();
                let addr = format!("{host}:{port}").parse().unwrap();
                match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                    Ok(s) => {
                        s.set_nodelay(true).unwrap();
                        s.set_read_timeout(Some(Duration::from_millis(2))).unwrap();
                        self.socks[shard] = Some(s);
                        self.hc.connected(shard).unwrap();
                    }
                    Err(e) => out.extend(self.hc.handle_closed(shard, &e.to_string())),
                }
            }
        }
    }

    /// One turn of the loop: connect what is down, write what is due, read what came,
    /// fire the timers.
    fn turn(&mut self, out: &mut Decided) {
        self.connect(out);
        for shard in 0..self.socks.len() {
            let Some(sock) = self.socks[shard].as_mut() else {
                continue;
            };
            while let Some(bytes) = self.hc.poll_transmit(shard) {
                if let Err(e) = sock.write_all(&bytes) {
                    out.extend(self.hc.handle_closed(shard, &e.to_string()));
                    break;
                }
            }
            let mut buf = [0u8; 16 * 1024];
            match sock.read(&mut buf) {
                Ok(0) => out.extend(self.hc.handle_closed(shard, "closed by the server")),
                Ok(n) => out.extend(self.hc.handle_input(shard, &buf[..n])),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => out.extend(self.hc.handle_closed(shard, &e.to_string())),
            }
        }
        if self.hc.next_deadline().is_some_and(|d| d <= Instant::now()) {
            out.extend(self.hc.handle_timeout(Instant::now()));
        }
    }

    /// Checks a burst together and runs the loop until every one is decided (10 s at most).
    fn burst(&mut self, checks: &[(&str, &Policy, u64)]) -> Vec<shardlimit::Decision> {
        let mut ids = Vec::new();
        let mut out = Decided::new();
        let mut now = Vec::new();
        self.connect(&mut out);
        for (i, (key, p, cost)) in checks.iter().enumerate() {
            match self.hc.check(key, p, *cost).unwrap() {
                HostStep::Pending { id, .. } => ids.push((i, id)),
                HostStep::Decided(d) => now.push((i, d)),
                HostStep::Delegate => panic!("a plain check was delegated"),
            }
        }
        let t0 = Instant::now();
        while ids.iter().any(|(_, id)| !out.contains_key(id)) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the loop never ended"
            );
            self.turn(&mut out);
        }
        let mut all: Vec<(usize, shardlimit::Decision)> = ids
            .into_iter()
            .map(|(i, id)| (i, out.remove(&id).unwrap().unwrap()))
            .chain(now)
            .collect();
        all.sort_by_key(|(i, _)| *i);
        assert_eq!(self.hc.in_flight(), 0);
        all.into_iter().map(|(_, d)| d).collect()
    }
}

const T0: u64 = 1_800_000_000_000_000;

fn limiter(servers: &[&RedisServer], prefix: &str, extra: &str) -> Limiter {
    let shards: Vec<String> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| format!(r#"{{"name":"s{i}","url":"{}"}}"#, s.url()))
        .collect();
    Limiter::from_json(&format!(
        r#"{{"timeout_ms": 300, "key_prefix": "{prefix}", {extra} "shards":[{}],
            "policies": {{
              "fw": {{"algorithm": "fixed_window", "limit": 7, "window": "1m"}},
              "sl": {{"algorithm": "sliding_log", "limit": 5, "window": "1m"}},
              "tb": {{"algorithm": "token_bucket", "capacity": 6, "refill_per_sec": 0.5}},
              "sw": {{"algorithm": "sliding_window", "limit": 4, "window": "1m"}}
            }}}}"#,
        shards.join(",")
    ))
    .unwrap()
}

#[test]
fn decisions_equal_the_default_transports() {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let clock = ManualClock::new(T0);
    let default = limiter(&[&a, &b], "d:", "")
        .with_clock(clock.clone())
        .unwrap();
    let hosted = limiter(&[&a, &b], "h:", "")
        .with_clock(clock.clone())
        .unwrap();
    let mut host = Host::new(&hosted);
    let names = ["fw", "sl", "tb", "sw"];
    let policies: Vec<(Policy, Policy)> = names
        .iter()
        .map(|n| (default.policy(n).unwrap(), hosted.policy(n).unwrap()))
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let keys: Vec<String> = (0..6).map(|i| format!("user-{i}")).collect();
    let mut compared = 0;
    for round in 0..12u64 {
        // a burst of every key under every policy, some costs above one
        let mut want = Vec::new();
        let mut checks = Vec::new();
        for (pi, (dp, hp)) in policies.iter().enumerate() {
            for (ki, k) in keys.iter().enumerate() {
                let cost = 1 + ((round + ki as u64 + pi as u64) % 3);
                want.push(rt.block_on(default.check(k, dp, cost)).unwrap());
                checks.push((k.as_str(), hp, cost));
            }
        }
        let got = host.burst(&checks);
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(g.source, Source::Redis, "round {round}");
            let shape = |d: &shardlimit::Decision| {
                (
                    d.allowed,
                    d.remaining,
                    d.limit,
                    d.reset_after,
                    d.retry_after,
                    d.shard,
                )
            };
            assert_eq!(shape(w), shape(g), "round {round}: {w:?} / {g:?}");
            assert_eq!(w.policy, g.policy);
            compared += 1;
        }
        clock.advance_us(3_100_000);
    }
    assert_eq!(compared, 12 * 24);
    // the same requests went to the same shards: both limiters route alike
    let m = hosted.metrics();
    let n: u64 = m.policies.iter().map(|p| p.allowed + p.denied).sum();
    assert_eq!(n, 12 * 24, "the host path counts its decisions");
}

#[test]
fn a_lost_script_is_loaded_again_and_the_check_decides() {
    let s = RedisServer::start();
    let l = limiter(&[&s], "n:", "");
    let mut host = Host::new(&l);
    let p = l.policy("fw").unwrap();
    let d = host.burst(&[("k", &p, 1), ("k", &p, 1)]);
    assert_eq!((d[0].remaining, d[1].remaining), (6, 5));
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut s.conn())
        .unwrap();
    let d = host.burst(&[("k", &p, 1)]);
    assert_eq!((d[0].source, d[0].remaining), (Source::Redis, 4));
    let d = host.burst(&[("k", &p, 1), ("j", &p, 2)]);
    assert_eq!((d[0].remaining, d[1].remaining), (3, 5));
}

#[test]
fn a_stopped_server_gives_the_fallback_within_the_deadline_and_a_killed_one_is_reconnected() {
    let mut s = RedisServer::start();
    let l = limiter(&[&s], "f:", r#""on_error": "open","#);
    let mut host = Host::new(&l);
    let p = l.policy("fw").unwrap();
    assert_eq!(host.burst(&[("k", &p, 1)])[0].source, Source::Redis);
    // SIGSTOP: the connection stays open, no reply comes
    let pid = s.pid().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let t0 = Instant::now();
    let d = host.burst(&[("k", &p, 1), ("j", &p, 1)]);
    let took = t0.elapsed();
    assert!(std::process::Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
    for d in &d {
        assert_eq!((d.allowed, d.source), (true, Source::Fallback), "{d:?}");
    }
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(
        took < Duration::from_millis(900),
        "the deadline is 300 ms: {took:?}"
    );
    // the server answers again: a new connection decides on Redis
    let d = host.burst(&[("k", &p, 1)]);
    assert_eq!((d[0].source, d[0].remaining), (Source::Redis, 5));
    // killed: connection errors, the fallback; restarted on its port: reconnected
    s.kill();
    let d = host.burst(&[("k", &p, 1)]);
    assert_eq!(d[0].source, Source::Fallback);
    s.restart();
    let t0 = Instant::now();
    loop {
        let d = host.burst(&[("fresh", &p, 1)]);
        if d[0].source == Source::Redis {
            assert_eq!(d[0].remaining, 6);
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "never reconnected: {d:?}"
        );
    }
}

#[test]
fn other_shapes_are_refused_and_other_checks_delegated() {
    let l = Limiter::memory();
    let e = HostChecks::new(&l).unwrap_err();
    assert!(e.to_string().contains("needs Redis shards"), "{e}");
    let tls = Limiter::from_json(
        r#"{"shards":[{"name":"t","url":"rediss://127.0.0.1:1"}],"policies":{}}"#,
    )
    .unwrap();
    let e = HostChecks::new(&tls).unwrap_err();
    assert!(e.to_string().contains("plain TCP only"), "{e}");
    let s = RedisServer::start();
    let l = Limiter::from_json(&format!(
        r#"{{"shards":[{{"name":"s","url":"{}"}}], "policies": {{
            "sh": {{"algorithm": "fixed_window", "limit": 1, "window": "1m", "shadow": true}},
            "fw": {{"algorithm": "fixed_window", "limit": 1, "window": "1m"}},
            "c": {{"algorithm": "concurrency", "max": 2, "lease_ttl": "1m"}}}}}}"#,
        s.url()
    ))
    .unwrap();
    let mut hc = HostChecks::new(&l).unwrap();
    let sh = l.policy("sh").unwrap();
    assert!(matches!(hc.check("k", &sh, 1).unwrap(), HostStep::Delegate));
    let c = l.policy("c").unwrap();
    assert!(
        hc.check("k", &c, 1).is_err(),
        "a concurrency policy takes acquire"
    );
    let e = hc.check("", &l.policy("fw").unwrap(), 1).unwrap_err();
    assert_eq!(e.kind(), shardlimit::ErrorKind::InvalidArgument);
}
