//! A late reply is accounted: an `acquire` that gave up at its deadline (and fell back, or
//! failed under `on_error: error`) may still have been granted in Redis once the shard ran
//! its script. The client knows the lease id it sent, so it releases that lease as soon as
//! the shard answers again, instead of leaving the slot held for the whole lease TTL (one
//! stall of 1 s left 3 of 5 slots held for the TTL). The decisions are counted as what
//! they were: fallbacks.

mod support;

use shardlimit::{Limiter, Source};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::RedisServer;

const TIMEOUT_MS: u64 = 100;
const MAX: u64 = 5;

fn config(s: &RedisServer) -> String {
    format!(
        r#"{{"timeout_ms": {TIMEOUT_MS}, "shards":[{{"name":"s0","url":"{}"}}],
        "policies": {{
          "open":  {{"algorithm":"concurrency","max":{MAX},"lease_ttl":"1h","on_error":"open"}},
          "error": {{"algorithm":"concurrency","max":{MAX},"lease_ttl":"1h","on_error":"error"}}
        }}}}"#,
        s.url()
    )
}

/// The units of `policy` free on `key`, as Redis says.
fn free(l: &Limiter, policy: &str, key: &str) -> Option<u64> {
    let p = l.policy(policy).unwrap();
    match l.peek_blocking(key, &p) {
        Ok(d) if d.source == Source::Redis => Some(d.remaining),
        _ => None,
    }
}

fn paused_while_acquiring(policy: &str) {
    let s = RedisServer::start();
    let l = Limiter::from_json(&config(&s)).unwrap();
    let p = l.policy(policy).unwrap();
    // connected, and the scripts loaded
    l.connect_blocking(Duration::from_secs(5)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (_, lease) = rt.block_on(l.acquire("warm", &p, 1)).unwrap();
    assert!(rt.block_on(l.release(&lease.unwrap())).unwrap());
    let fallbacks_before = fallbacks(&l, policy);

    // the server stops for 1 s (10 deadlines) while MAX acquires are sent to it, over the
    // connection made before (they reach its socket, and run once it resumes)
    unsafe { libc::kill(s.pid() as i32, libc::SIGSTOP) };
    let stopped = Instant::now();
    let acquires = rt.block_on(async {
        let tasks: Vec<_> = (0..MAX)
            .map(|_| {
                let (l, p) = (l.clone(), p.clone());
                tokio::spawn(async move { l.acquire("k", &p, 1).await })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    for a in acquires {
        match a {
            Ok((d, lease)) => {
                assert_eq!(policy, "open");
                assert_eq!((d.allowed, d.source), (true, Source::Fallback), "{d:?}");
                assert!(lease.is_none(), "a fallback gives no lease");
            }
            Err(e) => {
                assert_eq!(policy, "error");
                assert!(e.is_backend(), "{e}");
            }
        }
    }
    std::thread::sleep(Duration::from_secs(1).saturating_sub(stopped.elapsed()));
    unsafe { libc::kill(s.pid() as i32, libc::SIGCONT) };
    // the server answers again (it runs the acquires it had received first: they were
    // granted, to leases nobody holds)
    let _: String = redis::cmd("PING").query(&mut s.conn()).unwrap();
    let back = Instant::now();

    // every slot is free again well before the lease TTL (1 h): within a second of the
    // server answering, however the circuit and its probes go
    loop {
        if free(&l, policy, "k") == Some(MAX) {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(2),
            "{policy}: {:?} of {MAX} slots free 2 s after the server answered again",
            free(&l, policy, "k")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "{policy}: every slot free {:?} after PING answered",
        back.elapsed()
    );
    let m = l.metrics();
    assert!(
        (1..=MAX).contains(&m.late_leases_released),
        "{policy}: late leases released: {}",
        m.late_leases_released
    );
    assert_eq!(m.late_lease_releases_dropped, 0);
    // counted as what they were: fallbacks (or, under `error`, Redis errors), no lease
    if policy == "open" {
        assert_eq!(fallbacks(&l, policy) - fallbacks_before, MAX);
    }
    // and the limit holds: MAX leases, then a denial
    let leases: Vec<_> = (0..MAX)
        .map(|_| l.acquire_blocking("k", &p, 1).unwrap())
        .collect();
    assert!(leases.iter().all(|(d, l)| d.allowed && l.is_some()));
    let (d, lease) = l.acquire_blocking("k", &p, 1).unwrap();
    assert!(
        !d.allowed && lease.is_none() && d.source == Source::Redis,
        "{d:?}"
    );
}

fn fallbacks(l: &Limiter, policy: &str) -> u64 {
    l.metrics()
        .policies
        .iter()
        .find(|m| m.policy == policy)
        .map_or(0, |m| m.fallback)
}

#[test]
fn late_grants_of_acquires_that_fell_back_are_released() {
    paused_while_acquiring("open");
}

#[test]
fn late_grants_of_acquires_that_failed_are_released() {
    paused_while_acquiring("error");
}

// ---- a release that reaches Redis before its late acquire ----
//
// The client releases a late lease over whatever connection answers (a new one after the
// old one broke), so its release can reach Redis before the acquire it releases, which
// then runs late. The release finds no lease and leaves a tombstone for the lease TTL; the
// acquire meets it and grants nothing. The order is the test's, not a race's: a relay holds
// the acquire until the tombstone is there, and the scripts are also run directly.

/// The assembled script named `name` (`shardlimit::scripts::all`).
fn script(name: &str) -> &'static str {
    shardlimit::scripts::all()
        .into_iter()
        .find(|(n, _, _)| *n == name)
        .unwrap_or_else(|| panic!("no script {name}"))
        .1
}

/// A concurrency check script call as the core writes an acquire (`check.lua`'s layout: no
/// block list, the lease id as the extra argument; `now` None = the server clock): its 7
/// values, after checking the tag it echoes.
fn acquire_direct(
    c: &mut redis::Connection,
    state: &str,
    now: Option<u64>,
    id: &str,
    units: u64,
    max: u64,
    ttl_us: u64,
) -> Vec<i64> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script("concurrency")).arg(1).arg(state).arg(units);
    match now {
        Some(t) => cmd.arg("nxu").arg(t),
        None => cmd.arg("xu"),
    };
    cmd.arg(id).arg(max).arg(ttl_us).arg(4242);
    let mut r: Vec<i64> = cmd.query(c).unwrap();
    assert_eq!(r.pop(), Some(4242), "the tag");
    assert_eq!(r.len(), 7, "{r:?}");
    r
}

/// `release.lua` run directly: 1 when the lease was held.
fn release_direct(
    c: &mut redis::Connection,
    state: &str,
    now: u64,
    id: &str,
    units: u64,
    ttl_us: u64,
) -> i64 {
    redis::cmd("EVAL")
        .arg(script("release"))
        .arg(1)
        .arg(state)
        .arg(id)
        .arg(units)
        .arg(now)
        .arg(ttl_us)
        .query(c)
        .unwrap()
}

/// The retry_after of an acquire refused because its lease was released before it ran.
const RELEASED_ALREADY: i64 = -2;

/// A loopback relay in front of a server that, once told to, holds what the connections
/// made before that send (their requests reach the server only on `flush`); connections
/// made later pass straight through. A request waiting in a slow network, while the
/// client gives up, connects again and sends what follows.
struct HoldingRelay {
    port: u16,
    hold: Arc<AtomicBool>,
    held: Held,
}

/// Per connection held: its stream to the server and the bytes held.
type Held = Arc<Mutex<Vec<(TcpStream, Vec<u8>)>>>;

impl HoldingRelay {
    fn start(upstream: u16) -> HoldingRelay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hold = Arc::new(AtomicBool::new(false));
        let held: Held = Arc::default();
        let (h, hd) = (hold.clone(), held.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let holdable = !h.load(Ordering::SeqCst);
                let (mut c_in, mut s_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (h, hd) = (h.clone(), hd.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    while let Ok(n @ 1..) = c_in.read(&mut buf) {
                        if holdable && h.load(Ordering::SeqCst) {
                            let mut hd = hd.lock().unwrap();
                            match hd
                                .iter_mut()
                                .find(|(s, _)| s.local_addr().ok() == s_out.local_addr().ok())
                            {
                                Some((_, b)) => b.extend_from_slice(&buf[..n]),
                                None => hd.push((s_out.try_clone().unwrap(), buf[..n].to_vec())),
                            }
                        } else if s_out.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    // (the server's side stays open: what is held may still go to it)
                });
                let (mut s_in, mut c_out) = (server, client);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    while let Ok(n @ 1..) = s_in.read(&mut buf) {
                        let _ = c_out.write_all(&buf[..n]); // (the client may have gone)
                    }
                });
            }
        });
        HoldingRelay { port, hold, held }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// From now on, what the connections made so far send is held.
    fn hold(&self) {
        self.hold.store(true, Ordering::SeqCst);
    }

    /// Bytes held so far.
    fn held(&self) -> usize {
        self.held.lock().unwrap().iter().map(|(_, b)| b.len()).sum()
    }

    /// Sends what was held to the server.
    fn flush(&self) {
        for (s, b) in self.held.lock().unwrap().iter_mut() {
            s.write_all(b).unwrap();
            b.clear();
        }
    }
}

/// Tombstones in the state key `state` (members scored below -2^52).
fn tombstones(c: &mut redis::Connection, state: &str) -> u64 {
    redis::cmd("ZCOUNT")
        .arg(state)
        .arg("-inf")
        .arg("(-4503599627370496")
        .query(c)
        .unwrap()
}

#[test]
fn a_release_that_reaches_redis_before_its_late_acquire_leaves_no_slot_held() {
    let s = RedisServer::start();
    let relay = HoldingRelay::start(s.port);
    let cfg = |url: &str| config(&s).replace(&s.url(), url);
    // the limiter under test goes through the relay; `direct` reads the state
    let l = Limiter::from_json(&cfg(&relay.url())).unwrap();
    let direct = Limiter::from_json(&config(&s)).unwrap();
    let p = l.policy("error").unwrap(); // on_error: error, so every decision is Redis's
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut c = s.conn();
    // connected, the scripts loaded, one lease held (to find the key's state key)
    let (d, held) = rt.block_on(l.acquire("k", &p, 1)).unwrap();
    assert!(d.allowed && d.source == Source::Redis);
    let held = held.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    let state = keys
        .iter()
        .find(|k| k.contains("error:"))
        .unwrap_or_else(|| panic!("no state key in {keys:?}"))
        .clone();

    // the acquire waits in the network past its deadline; the client gives up, drops the
    // connection, and releases the lease over a new one: that release reaches Redis first
    relay.hold();
    let e = rt.block_on(l.acquire("k", &p, 1)).unwrap_err();
    assert!(e.is_backend(), "{e}");
    assert!(relay.held() > 0, "the acquire is held");
    let until = Instant::now() + Duration::from_secs(5);
    while tombstones(&mut c, &state) == 0 {
        assert!(Instant::now() < until, "the late release left no tombstone");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        l.metrics().late_leases_released,
        0,
        "it found nothing to release"
    );
    assert_eq!(
        free(&direct, "error", "k"),
        Some(MAX - 1),
        "a tombstone holds nothing"
    );

    // then the acquire runs: it meets the tombstone, grants nothing, and removes it
    relay.flush();
    while tombstones(&mut c, &state) > 0 {
        assert!(Instant::now() < until, "the late acquire never ran");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        free(&direct, "error", "k"),
        Some(MAX - 1),
        "no slot held by it"
    );

    // the normal path: the lease held is released, every slot is free, the limit holds
    assert!(rt.block_on(l.release(&held)).unwrap());
    assert_eq!(free(&direct, "error", "k"), Some(MAX));
    let exists: u64 = redis::cmd("EXISTS").arg(&state).query(&mut c).unwrap();
    assert_eq!(exists, 0, "nothing left behind");
    let leases: Vec<_> = (0..MAX)
        .map(|_| rt.block_on(l.acquire("k", &p, 1)).unwrap())
        .collect();
    assert!(leases.iter().all(|(d, l)| d.allowed && l.is_some()));
    let (d, _) = rt.block_on(l.acquire("k", &p, 1)).unwrap();
    assert!(!d.allowed && d.source == Source::Redis, "{d:?}");
    // a release of a lease that is not held (released before) leaves no tombstone: only
    // the client's releases of late leases do
    let lease = leases[0].1.clone().unwrap();
    assert!(rt.block_on(l.release(&lease)).unwrap());
    assert!(!rt.block_on(l.release(&lease)).unwrap());
    assert_eq!(tombstones(&mut c, &state), 0);
}

#[test]
fn tombstones_count_as_nothing_expire_and_leave_renewals_alone() {
    let s = RedisServer::start();
    let mut c = s.conn();
    let key = "{t}s:p:cc:k";
    let (t, ttl) = (1_800_000_000_000_000u64, 1_000_000u64);
    let score = |c: &mut redis::Connection, m: &str| -> Option<f64> {
        redis::cmd("ZSCORE").arg(key).arg(m).query(c).unwrap()
    };

    // a release of a lease not acquired: a tombstone, the sum written, the key kept for
    // the lease TTL
    assert_eq!(release_direct(&mut c, key, t, "a", 1, ttl), 0);
    assert_eq!(score(&mut c, "#"), Some(-1.0));
    assert!(score(&mut c, "a*1").unwrap() < -(2f64.powi(52)));
    let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut c).unwrap();
    assert!((1..=1000).contains(&pttl), "{pttl}");
    // released again: still not held, the tombstone stays
    assert_eq!(release_direct(&mut c, key, t, "a", 1, ttl), 0);
    assert!(score(&mut c, "a*1").is_some());

    // every slot is there for other leases (a tombstone is no lease)
    for i in 0..MAX - 1 {
        let r = acquire_direct(&mut c, key, Some(t), &format!("l{i}"), 1, MAX, ttl);
        assert_eq!((r[0], r[1]), (1, (MAX - 1 - i) as i64), "{r:?}");
    }
    // a lease acquired again keeps its units and takes the later expiry (as before)
    let r = acquire_direct(&mut c, key, Some(t + 500_000), "l0", 1, MAX, ttl);
    assert_eq!((r[0], r[1]), (1, 1), "{r:?}");
    assert_eq!(score(&mut c, "l0*1"), Some((t + 500_000 + ttl) as f64));
    assert_eq!(score(&mut c, "#"), Some(-(MAX as f64)));
    let r = acquire_direct(&mut c, key, Some(t), "l4", 1, MAX, ttl);
    assert_eq!((r[0], r[1]), (1, 0), "{r:?}");
    let r = acquire_direct(&mut c, key, Some(t), "l9", 1, MAX, ttl);
    assert_eq!(
        (r[0], r[3]),
        (0, ttl as i64),
        "denied until l1 expires: {r:?}"
    );

    // all leases expire; the next release of a lease not found removes the tombstones that
    // expired before it leaves its own
    let later = t + 2 * ttl;
    assert_eq!(release_direct(&mut c, key, later, "b", 2, ttl), 0);
    assert_eq!(score(&mut c, "a*1"), None, "expired tombstone removed");
    assert!(score(&mut c, "b*2").is_some());
    // the expired leases are reclaimed as usual, the tombstone is not counted
    let r = acquire_direct(&mut c, key, Some(later), "c", MAX, MAX, ttl);
    assert_eq!((r[0], r[1]), (1, 0), "{r:?}");
    assert_eq!(release_direct(&mut c, key, later, "c", MAX, ttl), 1);
    // b's acquire runs late: refused, and its tombstone is gone
    let r = acquire_direct(&mut c, key, Some(later + 1), "b", 2, MAX, ttl);
    assert_eq!(
        (r[0], r[1], r[3], r[6]),
        (0, MAX as i64, RELEASED_ALREADY, 0),
        "{r:?}"
    );
    assert_eq!(score(&mut c, "b*2"), None);
    let exists: u64 = redis::cmd("EXISTS").arg(key).query(&mut c).unwrap();
    assert_eq!(exists, 0, "nothing held, no tombstone: the key is gone");
}
