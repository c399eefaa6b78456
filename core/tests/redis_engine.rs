//! The Redis engine against real redis-server processes (and, where the property is
//! engine-independent, the in-memory engine too).

mod support;

use shardlimit::{ErrorKind, Limit, Limiter, ManualClock, Policy};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::RedisServer;

const T0: u64 = 1_800_000_000_123_457;

fn policies(limit: u64) -> Vec<Policy> {
    let s = Duration::from_secs;
    vec![
        Policy::new("fw", Limit::fixed_window(limit, s(3600))).unwrap(),
        Policy::new("sw", Limit::sliding_window(limit, s(3600))).unwrap(),
        Policy::new("sl", Limit::sliding_log(limit, s(3600))).unwrap(),
        Policy::new("tb", Limit::token_bucket(limit, 1.0 / 3600.0)).unwrap(),
        Policy::new("lb", Limit::leaky_bucket(limit, 1.0 / 3600.0)).unwrap(),
        Policy::new("cc", Limit::concurrency(limit, s(3600))).unwrap(),
    ]
}

fn redis_limiter(server: &RedisServer) -> Limiter {
    Limiter::from_json(&support::config(&[server], "{}")).unwrap()
}

fn with_clock(l: Limiter, t: u64) -> (Limiter, Arc<ManualClock>) {
    let c = ManualClock::new(t);
    (l.with_clock(c.clone()).unwrap(), c)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

/// 64 tasks, 3 attempts each, on one key: exactly `limit` admitted.
async fn hammer(limiter: &Limiter, policy: &Policy, key: &str) -> u64 {
    let allowed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (l, p, a, k) = (
            limiter.clone(),
            policy.clone(),
            allowed.clone(),
            key.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let d = support::take(&l, &k, &p, 1).await.unwrap();
                if d.allowed {
                    a.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    allowed.load(Ordering::SeqCst)
}

#[test]
fn exact_admission_under_64_concurrent_callers() {
    let server = RedisServer::start();
    let rt = rt();
    rt.block_on(async {
        // server clock (TIME) with limits that cannot refill during the test
        let limiter = redis_limiter(&server);
        for p in policies(50) {
            assert_eq!(
                hammer(&limiter, &p, "user:1").await,
                50,
                "{} on redis TIME",
                p.name()
            );
        }
        // injected clock, the memory engine too
        for limiter in [
            with_clock(redis_limiter(&server), T0).0,
            with_clock(Limiter::memory(), T0).0,
        ] {
            for p in policies(37) {
                assert_eq!(
                    hammer(&limiter, &p, "user:2").await,
                    37,
                    "{} on {limiter:?}",
                    p.name()
                );
            }
        }
    });
}

/// 64 threads, 3 blocking attempts each, on one key: exactly `limit` admitted. Blocking
/// calls run on the caller's thread over their own connections (a pool per shard).
fn hammer_blocking(limiter: &Limiter, policy: &Policy, key: &str) -> u64 {
    let allowed = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..64 {
            s.spawn(|| {
                for _ in 0..3 {
                    if support::take_blocking(limiter, key, policy, 1)
                        .unwrap()
                        .allowed
                    {
                        allowed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    allowed.load(Ordering::SeqCst)
}

#[test]
fn exact_admission_under_64_blocking_threads() {
    let server = RedisServer::start();
    for (limiter, what) in [
        (redis_limiter(&server), "redis TIME"),
        (with_clock(redis_limiter(&server), T0).0, "injected clock"),
    ] {
        for p in policies(50) {
            let key = format!("threads:{what}");
            assert_eq!(
                hammer_blocking(&limiter, &p, &key),
                50,
                "{} on {what}",
                p.name()
            );
            // async callers on the same key see the same state
            let d = rt().block_on(limiter.peek(&key, &p)).unwrap();
            assert_eq!(d.remaining, 0, "{} on {what}", p.name());
        }
    }
}

#[test]
fn blocking_and_async_calls_log_in_and_select_the_database() {
    let server = RedisServer::start_with(
        support::free_port(),
        vec!["--requirepass".into(), "s3cret".into()],
    );
    let url = format!("redis://:s3cret@127.0.0.1:{}/5", server.port);
    let cfg = format!(r#"{{"shards":[{{"name":"a","url":"{url}"}}]}}"#);
    let limiter = Limiter::from_json(&cfg).unwrap();
    let p = Policy::new("db5", Limit::fixed_window(3, Duration::from_secs(3600))).unwrap();
    assert_eq!(limiter.check_blocking("k", &p, 1).unwrap().remaining, 2);
    assert_eq!(
        rt().block_on(limiter.check("k", &p, 2)).unwrap().remaining,
        0
    );
    assert!(!limiter.check_blocking("k", &p, 1).unwrap().allowed);
    // the state is in database 5
    let mut c = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    redis::cmd("SELECT").arg(0).exec(&mut c).unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert!(keys.is_empty(), "{keys:?}");
    // a wrong password is a clear connection error on both paths, not a hang or a panic
    let limiter = Limiter::from_json(&cfg.replace("s3cret", "wrong")).unwrap();
    let p = p.with_on_error(shardlimit::OnError::Error);
    let e = limiter.check_blocking("k", &p, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(e.to_string().contains("AUTH"), "{e}");
    let e = rt().block_on(limiter.check("k", &p, 1)).unwrap_err();
    assert!(e.is_backend(), "{e}");
}

fn reads_processed(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut server.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_reads_processed:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_burst_of_spawned_calls_leaves_in_one_write() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let p = Policy::new("burst", Limit::fixed_window(40, Duration::from_secs(3600))).unwrap();
    // connect (the runtime's connection) and load the script first
    rt().block_on(limiter.check("warm", &p, 1)).unwrap();
    let spawner = limiter
        .spawner()
        .unwrap()
        .expect("a Redis limiter has a runtime");
    let run_burst = |key: &'static str| {
        // hold the I/O thread while the burst is submitted, as an event loop's burst
        // arrives while the thread is busy
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        spawner.spawn(async move {
            let _ = hold_rx.recv();
        });
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..64 {
            let (l, p, tx) = (limiter.clone(), p.clone(), tx.clone());
            spawner.spawn(async move {
                let _ = tx.send(l.check(key, &p, 1).await.unwrap().allowed);
            });
        }
        let before = reads_processed(&server);
        hold_tx.send(()).unwrap();
        let allowed = (0..64).filter(|_| rx.recv().unwrap()).count();
        (allowed, reads_processed(&server) - before)
    };
    let (allowed, reads) = run_burst("burst");
    assert_eq!(allowed, 40, "exact under a burst");
    // 64 commands of ~500 bytes (plus this test's INFO) in a few reads, not one read each
    // (the connection writes in frames of up to 8 KiB)
    assert!(reads <= 8, "{reads} reads for a burst of 64 checks");
}

/// A burst's checks go out as one batch script call per algorithm, and every check still
/// gets its own exact answer: a check whose key holds the wrong type gets its own error,
/// and the checks batched with it are unaffected. After SCRIPT FLUSH the batch is sent
/// again with EVAL.
#[test]
fn a_burst_of_checks_runs_as_batch_calls_with_answers_of_their_own() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let s = Duration::from_secs;
    let fw = Policy::new("bfw", Limit::fixed_window(10, s(3600))).unwrap();
    // a second fixed-window policy in the same batches: its own limit, sent once per batch
    let fw3 = Policy::new("bfw3", Limit::fixed_window(3, s(3600))).unwrap();
    // errors reach the caller (no fail-open decision hiding them)
    let sl = Policy::new("bsl", Limit::sliding_log(5, s(3600)))
        .unwrap()
        .with_on_error(shardlimit::OnError::Error);
    // a key whose sliding-log state is a plain string: its checks fail with WRONGTYPE
    let wrong_state = make_wrong_type(&server, &limiter, &sl, "wrong");
    let spawner = limiter
        .spawner()
        .unwrap()
        .expect("a Redis limiter has a runtime");
    // (policy, key) of every check of one burst, and what came back for each
    let run_burst = |checks: Vec<(Policy, &'static str)>| {
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        spawner.spawn(async move {
            let _ = hold_rx.recv();
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let n = checks.len();
        for (i, (p, key)) in checks.into_iter().enumerate() {
            let (l, tx) = (limiter.clone(), tx.clone());
            spawner.spawn(async move {
                let _ = tx.send((i, key, l.check(key, &p, 1).await));
            });
        }
        let before = server.script_calls();
        hold_tx.send(()).unwrap();
        let mut out: Vec<_> = (0..n).map(|_| rx.recv().unwrap()).collect();
        out.sort_by_key(|(i, _, _)| *i);
        (out, server.script_calls() - before)
    };
    let burst = || {
        let mut checks = Vec::new();
        for i in 0..60 {
            checks.push(match i % 3 {
                0 => (fw.clone(), "a"),
                1 => (sl.clone(), "b"),
                _ if i % 9 == 2 => (sl.clone(), "wrong"),
                _ if i % 9 == 5 => (fw3.clone(), "d"),
                _ => (fw.clone(), "c"),
            });
        }
        checks
    };
    let count = |out: &[(usize, &str, shardlimit::Result<shardlimit::Decision>)], key: &str| {
        let mine = out.iter().filter(|(_, k, _)| *k == key);
        let allowed = mine.clone().filter(|(_, _, r)| r.as_ref().unwrap().allowed);
        (mine.count(), allowed.count())
    };
    let check_burst = |out: &[(usize, &str, shardlimit::Result<shardlimit::Decision>)]| {
        for (_, key, r) in out {
            if *key == "wrong" {
                let e = r.as_ref().unwrap_err();
                assert!(e.to_string().contains("WRONGTYPE"), "{e}");
            }
        }
        count(out, "a")
    };

    let fresh = || {
        redis::cmd("FLUSHALL").exec(&mut server.conn()).unwrap();
        redis::cmd("SET")
            .arg(&wrong_state)
            .arg("not a sorted set")
            .exec(&mut server.conn())
            .unwrap();
    };
    let exact = |out: &[(usize, &str, shardlimit::Result<shardlimit::Decision>)]| {
        assert_eq!(check_burst(out), (20, 10), "key a: 20 checks, limit 10");
        assert_eq!(count(out, "b"), (20, 5), "key b: 20 checks, limit 5");
        assert_eq!(count(out, "c"), (6, 6), "key c: 6 checks, limit 10");
        assert_eq!(count(out, "d"), (7, 3), "key d: 7 checks, limit 3");
    };

    // the batch scripts are not loaded yet: NOSCRIPT, then the batches go again with EVAL
    fresh();
    let (out, _) = run_burst(burst());
    exact(&out);

    fresh();
    let (out, calls) = run_burst(burst());
    exact(&out);
    // a batch call per algorithm (fixed window, sliding log) for each part of the burst
    // the spawner polls in one go (futures-util's FuturesUnordered yields every 32), not
    // one call per check
    assert!(calls <= 4, "{calls} script calls for a burst of 60 checks");

    // the server loses its scripts again
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec(&mut server.conn())
        .unwrap();
    fresh();
    let (out, _) = run_burst(burst());
    exact(&out);
}

/// Checks `key` once on sliding-log `policy`, then overwrites its state with a plain string:
/// every later check of it fails with WRONGTYPE. Returns the state's Redis key.
fn make_wrong_type(server: &RedisServer, limiter: &Limiter, policy: &Policy, key: &str) -> String {
    rt().block_on(limiter.check(key, policy, 1)).unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{}*{key}*", policy.name()))
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    redis::cmd("SET")
        .arg(&keys[0])
        .arg("not a sorted set")
        .exec(&mut server.conn())
        .unwrap();
    keys.swap_remove(0)
}

/// A burst of two policies' checks (the general batch layout: each check its policy's index,
/// cost and tag) in which one key holds the wrong type: that key's checks get their
/// WRONGTYPE error, the checks after it in the same batch call their own exact decisions.
#[test]
fn one_checks_error_in_a_batch_of_two_policies_is_its_own() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let s = Duration::from_secs;
    let p3 = Policy::new("esl3", Limit::sliding_log(3, s(3600)))
        .unwrap()
        .with_on_error(shardlimit::OnError::Error);
    let p5 = Policy::new("esl5", Limit::sliding_log(5, s(3600)))
        .unwrap()
        .with_on_error(shardlimit::OnError::Error);
    make_wrong_type(&server, &limiter, &p3, "wrong");
    let spawner = limiter.spawner().unwrap().expect("a runtime");
    let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
    spawner.spawn(async move {
        let _ = hold_rx.recv();
    });
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..30 {
        let (p, key) = match i % 3 {
            0 => (p3.clone(), "a"),
            1 => (p5.clone(), "b"),
            _ => (p3.clone(), "wrong"),
        };
        let (l, tx) = (limiter.clone(), tx.clone());
        spawner.spawn(async move {
            let _ = tx.send((key, l.check(key, &p, 1).await));
        });
    }
    let before = server.script_calls();
    hold_tx.send(()).unwrap();
    let out: Vec<_> = (0..30).map(|_| rx.recv().unwrap()).collect();
    let calls = server.script_calls() - before;
    assert!(calls <= 4, "{calls} script calls for a burst of 30 checks");
    let allowed = |key: &str| {
        out.iter()
            .filter(|(k, r)| *k == key && r.as_ref().unwrap().allowed)
            .count()
    };
    for (key, r) in &out {
        if *key == "wrong" {
            let e = r.as_ref().unwrap_err();
            assert!(e.to_string().contains("WRONGTYPE"), "{e}");
        }
    }
    assert_eq!(allowed("a"), 3, "key a: 10 checks, limit 3");
    assert_eq!(allowed("b"), 5, "key b: 10 checks, limit 5");
}

/// A batch call of plain checks reads the block list once for all of them (one EXISTS of
/// their entries) and each entry only when one exists: a blocked key in a burst is still
/// denied by the script, whether blocked for a time, for good, or automatically by a check
/// of an earlier burst; an expired or removed entry no longer denies. The entries are
/// written straight into Redis, and each burst comes from a limiter that has seen no block
/// (the process's block cache knows nothing), so every denial here is the script's.
#[test]
fn a_batch_of_plain_checks_misses_no_block_entry() {
    use shardlimit::{AutoBlock, Source};
    let server = RedisServer::start();
    let s = Duration::from_secs;
    let p = Policy::new("bb", Limit::fixed_window(1000, s(3600)))
        .unwrap()
        .with_on_error(shardlimit::OnError::Error);
    // (key, allowed, source) of a burst of one check of `p` per key, sent as batch calls
    let burst = |p: &Policy, keys: &[String]| {
        let limiter = redis_limiter(&server);
        let spawner = limiter.spawner().unwrap().expect("a runtime");
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        spawner.spawn(async move {
            let _ = hold_rx.recv();
        });
        let (tx, rx) = std::sync::mpsc::channel();
        for key in keys {
            let (l, p, tx, key) = (limiter.clone(), p.clone(), tx.clone(), key.clone());
            spawner.spawn(async move {
                let d = l.check(&key, &p, 1).await.unwrap();
                let _ = tx.send((key, d.allowed, d.source));
            });
        }
        let before = server.script_calls();
        hold_tx.send(()).unwrap();
        let mut out: Vec<_> = (0..keys.len()).map(|_| rx.recv().unwrap()).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        let calls = server.script_calls() - before;
        assert!(
            keys.len() < 16 || calls <= 4,
            "{calls} calls for {} checks: not batched",
            keys.len()
        );
        out
    };
    let keys: Vec<String> = (0..16).map(|i| format!("k{i:02}")).collect();
    let denied = |out: &[(String, bool, Source)]| -> Vec<String> {
        for (k, allowed, source) in out {
            let want = if *allowed {
                Source::Redis
            } else {
                Source::Block
            };
            assert_eq!(*source, want, "{k}");
        }
        out.iter()
            .filter(|(_, a, _)| !a)
            .map(|(k, _, _)| k.clone())
            .collect()
    };
    let mut conn = server.conn();
    assert!(denied(&burst(&p, &keys)).is_empty());
    // one key blocked for a minute, one for good
    redis::cmd("SET")
        .arg("sl:b:{k03}")
        .arg("t")
        .arg("PX")
        .arg(60_000)
        .exec(&mut conn)
        .unwrap();
    redis::cmd("SET")
        .arg("sl:b:{k11}")
        .arg("t")
        .exec(&mut conn)
        .unwrap();
    assert_eq!(denied(&burst(&p, &keys)), ["k03", "k11"]);
    // the timed entry expires
    redis::cmd("PEXPIRE")
        .arg("sl:b:{k03}")
        .arg(1)
        .exec(&mut conn)
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(denied(&burst(&p, &keys)), ["k11"]);
    // unblocked
    let limiter = redis_limiter(&server);
    assert!(rt().block_on(limiter.unblock("k11")).unwrap());
    assert!(denied(&burst(&p, &keys)).is_empty());
    // blocked automatically (by another policy's denials, in an earlier burst)
    let auto = Policy::new("ba", Limit::fixed_window(1, s(3600)))
        .unwrap()
        .with_on_error(shardlimit::OnError::Error)
        .with_auto_block(AutoBlock {
            after: 1,
            within: s(60),
            duration: s(60),
        })
        .unwrap();
    let k07 = vec!["k07".to_string(); 4];
    let out = burst(&auto, &k07);
    assert_eq!(out.iter().filter(|(_, a, _)| *a).count(), 1, "{out:?}");
    assert_eq!(denied(&burst(&p, &keys)), ["k07"]);
}

/// CPU time (clock ticks) used so far by this process's threads named `name` (Linux).
#[cfg(target_os = "linux")]
fn thread_ticks(name: &str) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let stat = std::fs::read_to_string(task.unwrap().path().join("stat")).unwrap_or_default();
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] != name {
            continue;
        }
        let f: Vec<&str> = stat[close + 2..].split(' ').collect();
        total += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    }
    total
}

/// The I/O thread spins while a lone async check waits (see `spin_wait`), and stops
/// `spin_wait` after the last one: an idle limiter burns no CPU.
#[cfg(target_os = "linux")]
#[test]
fn the_io_thread_stops_spinning_when_idle() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let p = Policy::new("idle", Limit::fixed_window(1000, Duration::from_secs(60))).unwrap();
    let rt = rt();
    for _ in 0..200 {
        assert!(rt.block_on(limiter.check("k", &p, 1)).unwrap().allowed);
    }
    std::thread::sleep(Duration::from_millis(50)); // well past spin_wait (100 µs)
    let before = thread_ticks("shardlimit-io");
    std::thread::sleep(Duration::from_millis(500));
    let used = thread_ticks("shardlimit-io") - before;
    // a spinning thread would use about 50 ticks (USER_HZ 100) in half a second
    assert!(used <= 5, "the idle I/O thread used {used} ticks in 500 ms");
}

/// Calls handed to the I/O runtime wake its thread only when it is parked; an awake thread
/// starts them before it parks. Many threads handing calls over in bursts while the
/// runtime parks and wakes in between: every call runs.
#[test]
fn every_call_handed_over_runs_while_the_io_thread_parks_and_wakes() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let spawner = limiter
        .spawner()
        .unwrap()
        .expect("a Redis limiter has a runtime");
    let (tx, rx) = std::sync::mpsc::channel();
    let (threads, bursts, per_burst) = (4, 300, 7);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (spawner, tx) = (&spawner, tx.clone());
            s.spawn(move || {
                for b in 0..bursts {
                    for _ in 0..per_burst {
                        let tx = tx.clone();
                        spawner.spawn(async move {
                            // some calls finish at once, some after a timer (the thread
                            // parks in between)
                            if b % 3 == 0 {
                                tokio::time::sleep(Duration::from_micros(200)).await;
                            }
                            let _ = tx.send(());
                        });
                    }
                    if (b + t) % 5 == 0 {
                        std::thread::sleep(Duration::from_micros(300));
                    }
                }
            });
        }
    });
    for i in 0..threads * bursts * per_burst {
        rx.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("call {i} never ran"));
    }
}

fn engines(server: &RedisServer) -> Vec<(Limiter, Arc<ManualClock>)> {
    redis::cmd("FLUSHALL").exec(&mut server.conn()).unwrap();
    vec![
        with_clock(redis_limiter(server), T0),
        with_clock(Limiter::memory(), T0),
    ]
}

#[test]
fn denied_checks_consume_nothing_and_costs_add_up() {
    let server = RedisServer::start();
    for (limiter, _clock) in engines(&server) {
        for p in policies(10) {
            let c = |cost| support::take_blocking(&limiter, "k", &p, cost).unwrap();
            let a = c(7);
            assert!(a.allowed && a.remaining == 3, "{}: {a:?}", p.name());
            let d = c(4);
            assert!(!d.allowed && d.remaining == 3, "{}: {d:?}", p.name());
            assert!(d.retry_after.is_some());
            let big = c(11);
            assert!(
                !big.allowed && big.retry_after.is_none(),
                "{}: {big:?}",
                p.name()
            );
            let huge = c(u64::MAX);
            assert!(!huge.allowed && huge.retry_after.is_none());
            let b = c(3);
            assert!(b.allowed && b.remaining == 0, "{}: {b:?}", p.name());
            assert!(!c(1).allowed);
        }
    }
}

#[test]
fn retry_after_is_exact() {
    let server = RedisServer::start();
    let ms = Duration::from_millis;
    let cases = [
        Limit::fixed_window(5, ms(1000)),
        Limit::sliding_window(5, ms(1000)),
        Limit::sliding_log(5, ms(1000)),
        Limit::token_bucket(5, 3.0),
        Limit::leaky_bucket(5, 7.0),
        Limit::concurrency(5, ms(1500)),
    ];
    for (limiter, clock) in engines(&server) {
        for limit in &cases {
            let p = Policy::new(limit.algorithm().name(), limit.clone()).unwrap();
            for cost in [1, 3, 5] {
                // a clean key, some admissions spread over time, then fill it up
                let start = T0 + 470_004;
                for t in [start + 2_000_000, start, T0] {
                    clock.set_us(t);
                    limiter.reset_blocking("k", &p).unwrap();
                }
                for (dt, c) in [(0, 2), (170_003, 1), (300_001, 1)] {
                    clock.advance_us(dt);
                    assert!(
                        support::take_blocking(&limiter, "k", &p, c)
                            .unwrap()
                            .allowed,
                        "{limit:?}"
                    );
                }
                while support::take_blocking(&limiter, "k", &p, 1)
                    .unwrap()
                    .allowed
                {}
                let d = support::take_blocking(&limiter, "k", &p, cost).unwrap();
                assert!(!d.allowed, "{limit:?} cost {cost}: {d:?}");
                let r = d.retry_after.unwrap().as_micros() as u64;
                clock.set_us(start + r - 1);
                let before = support::take_blocking(&limiter, "k", &p, cost).unwrap();
                assert!(
                    !before.allowed,
                    "{limit:?} cost {cost}: passed 1µs before retry_after {r}"
                );
                let peek_before = limiter.peek_blocking("k", &p).unwrap();
                clock.set_us(start + r);
                if cost == 1 {
                    // peek (one unit) agrees with a check of one unit
                    assert!(!peek_before.allowed);
                    assert!(limiter.peek_blocking("k", &p).unwrap().allowed);
                }
                let at = support::take_blocking(&limiter, "k", &p, cost).unwrap();
                assert!(
                    at.allowed,
                    "{limit:?} cost {cost}: denied at retry_after {r}: {at:?}"
                );
            }
        }
    }
}

#[test]
fn reset_after_and_peek() {
    let server = RedisServer::start();
    for (limiter, clock) in engines(&server) {
        let p = Policy::new("login", Limit::fixed_window(5, Duration::from_secs(60))).unwrap();
        clock.set_us(1_800_000_000_000_000 + 15_000_000); // 15 s into a minute
        let d = limiter.check_blocking("u", &p, 2).unwrap();
        assert_eq!(d.reset_after, Duration::from_secs(45));
        assert_eq!(d.limit, 5);
        let peek = limiter.peek_blocking("u", &p).unwrap();
        assert!(peek.allowed && peek.remaining == 3);
        assert_eq!(
            limiter.peek_blocking("u", &p).unwrap().remaining,
            3,
            "peek consumed"
        );
        limiter.reset_blocking("u", &p).unwrap();
        assert_eq!(limiter.peek_blocking("u", &p).unwrap().remaining, 5);
        let tb = Policy::new("api", Limit::token_bucket(10, 2.0)).unwrap();
        let d = limiter.check_blocking("u", &tb, 4).unwrap();
        assert_eq!(
            d.reset_after,
            Duration::from_secs(2),
            "time until the bucket is full again"
        );
        assert_eq!(d.remaining, 6);
        assert_eq!(d.headers()[0], ("X-RateLimit-Limit", "10".to_string()));
    }
}

#[test]
fn every_key_written_has_a_ttl() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let ms = Duration::from_millis;
    let ps = [
        Limit::fixed_window(3, ms(60_000)),
        Limit::sliding_window(3, ms(60_000)),
        Limit::sliding_log(3, ms(60_000)),
        // 0.01 units a second: a bucket's key lives 100 s a unit, not one second, which a
        // loaded machine may spend before PTTL reads it
        Limit::token_bucket(3, 0.01),
        Limit::leaky_bucket(3, 0.01),
        Limit::concurrency(3, ms(60_000)),
    ];
    for (i, l) in ps.iter().enumerate() {
        let p = Policy::new(&format!("p{i}"), l.clone()).unwrap();
        for k in ["a", "{t}:b", "c"] {
            for cost in [1, 2, 1] {
                support::take_blocking(&limiter, k, &p, cost).unwrap();
            }
        }
    }
    let mut c = server.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert!(keys.len() >= 18, "{keys:?}");
    for k in keys {
        let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut c).unwrap();
        assert!(ttl > 0, "key {k} has no TTL ({ttl})");
        assert!(k.starts_with("sl:s:p"), "{k}");
        assert!(
            k.contains("{a}") || k.contains("{t}:b") || k.contains("{c}"),
            "hash tag missing: {k}"
        );
    }
}

#[test]
fn embedded_script_sha1_equals_script_load() {
    let server = RedisServer::start();
    let mut c = server.conn();
    for (file, src, sha) in shardlimit::scripts::all() {
        let loaded: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(src)
            .query(&mut c)
            .unwrap();
        assert_eq!(loaded, sha, "{file}");
        let mut h = sha1_smol::Sha1::new();
        h.update(src.as_bytes());
        assert_eq!(h.digest().to_string(), sha, "{file}");
    }
}

#[test]
fn scripts_reload_after_script_flush() {
    let server = RedisServer::start();
    // an injected clock: on the wall clock a second between the checks refills a token
    let (limiter, _clock) = with_clock(redis_limiter(&server), T0);
    let p = Policy::new("x", Limit::token_bucket(5, 1.0)).unwrap();
    assert!(limiter.check_blocking("k", &p, 1).unwrap().allowed);
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec(&mut server.conn())
        .unwrap();
    let d = limiter.check_blocking("k", &p, 1).unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 3);
}

#[test]
fn keys_land_on_the_routed_shard() {
    let (a, b, c) = (
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    );
    let limiter = Limiter::from_json(&support::config(&[&a, &b, &c], "{}")).unwrap();
    // 0.01 units a second: the key lives 100 s, not the one second a loaded machine may
    // spend between the check and EXISTS
    let p = Policy::new("r", Limit::token_bucket(5, 0.01)).unwrap();
    let servers = [&a, &b, &c];
    let mut used = [0; 3];
    for i in 0..60 {
        let key = format!("user:{i}");
        let d = limiter.check_blocking(&key, &p, 1).unwrap();
        let (shard, name) = limiter.route(&key).unwrap();
        assert_eq!(d.shard, Some(shard));
        assert_eq!(name, format!("s{shard}"));
        used[shard as usize] += 1;
        let exists: bool = redis::cmd("EXISTS")
            .arg(format!("sl:s:r:tb:{{{key}}}"))
            .query(&mut servers[shard as usize].conn())
            .unwrap();
        assert!(exists, "{key} not on shard {shard}");
    }
    assert!(used.iter().all(|n| *n > 5), "{used:?}");
    // a hash tag keeps a tenant's keys together
    let s1 = limiter.route("{acme}:user:1").unwrap().0;
    assert_eq!(limiter.route("{acme}:user:2").unwrap().0, s1);
}

#[test]
fn bad_input_is_a_clear_error() {
    let server = RedisServer::start();
    for limiter in [redis_limiter(&server), Limiter::memory()] {
        let p = Policy::new("x", Limit::token_bucket(5, 1.0)).unwrap();
        let e = limiter.check_blocking("", &p, 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("key"), "{e}");
        let big = "k".repeat(1 << 20);
        let e = limiter.check_blocking(&big, &p, 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("1048576 bytes"), "{e}");
        let e = limiter.check_blocking("k", &p, 0).unwrap_err();
        assert!(e.to_string().contains("cost"), "{e}");
        let e = limiter.check_by_name_blocking("k", "nope", 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownPolicy);
    }
}

#[test]
fn unreachable_shard_is_a_connection_error_not_a_panic() {
    // port 1 on loopback: nothing listens there
    let limiter = Limiter::from_json(
        r#"{"timeout_ms": 300, "shards":[{"name":"dead","url":"redis://127.0.0.1:1"}],
            "policies":{"api":{"algorithm":"token_bucket","capacity":5,"refill_per_sec":1,"on_error":"error"},
                        "open":{"algorithm":"token_bucket","capacity":5,"refill_per_sec":1,"on_error":"open"}}}"#,
    )
    .unwrap();
    let e = limiter.check_by_name_blocking("k", "api", 1).unwrap_err();
    assert!(e.is_backend(), "{e:?}");
    assert!(
        e.to_string().contains("dead"),
        "the error names the shard: {e}"
    );
    // and again (no cached broken state, no panic)
    assert!(limiter.check_by_name_blocking("k", "api", 1).is_err());
    // from inside an async runtime as well
    rt().block_on(async {
        assert!(limiter.check_by_name("k", "api", 1).await.is_err());
        // the blocking call from inside a runtime does not panic either
        assert!(limiter.check_by_name_blocking("k", "api", 1).is_err());
    });
    // with on_error open the caller gets an allowed fallback decision instead
    let d = limiter.check_by_name_blocking("k", "open", 1).unwrap();
    assert!(d.allowed);
    assert_eq!(d.source, shardlimit::Source::Fallback);
}

#[test]
fn redis_memory_per_active_key() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let mut c = server.conn();
    let usage = |c: &mut redis::Connection, pattern: &str| -> u64 {
        let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(c).unwrap();
        assert!(!keys.is_empty(), "{pattern}");
        keys.iter()
            .map(|k| {
                redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(k)
                    .query::<u64>(c)
                    .unwrap()
            })
            .sum()
    };
    let s = Duration::from_secs;
    // keys that outlive the test on a loaded machine: at 10 units a second the bucket's key
    // lived 100 ms (a second limiter connects in between), a 1 s window's counters 1-2 s
    let tb = Policy::new("api", Limit::token_bucket(100, 0.01)).unwrap();
    let fw = Policy::new("api", Limit::fixed_window(100, s(60))).unwrap();
    let sw = Policy::new("api", Limit::sliding_window(100, s(60))).unwrap();
    limiter.check_blocking("user:12345", &tb, 1).unwrap();
    limiter.check_blocking("user:12345", &fw, 1).unwrap();
    // two counters: admit in one window, then in the next
    let (swl, clock) = with_clock(redis_limiter(&server), T0);
    swl.check_blocking("user:12345", &sw, 1).unwrap();
    clock.advance_us(60_000_000);
    swl.check_blocking("user:12345", &sw, 1).unwrap();
    let (tbu, fwu, swu) = (
        usage(&mut c, "sl:s:api:tb:*"),
        usage(&mut c, "sl:s:api:fw:*"),
        usage(&mut c, "sl:s:api:sw:*"),
    );
    println!("MEMORY USAGE: token_bucket {tbu} B, fixed_window {fwu} B, sliding_window (2 counters) {swu} B");
    assert!(tbu <= 96, "token bucket {tbu}");
    assert!(fwu <= 96, "fixed window {fwu}");
    assert!(swu <= 192, "sliding window {swu}");
}

#[test]
fn memory_engine_is_bounded() {
    let (limiter, clock) = with_clock(Limiter::memory(), T0);
    let p = Policy::new("m", Limit::fixed_window(5, Duration::from_millis(10))).unwrap();
    for round in 0..20u64 {
        for i in 0..10_000 {
            limiter
                .check_blocking(&format!("k{round}:{i}"), &p, 1)
                .unwrap();
        }
        clock.advance_us(20_000); // every earlier window is over
    }
    let held = limiter.memory_keys().unwrap();
    assert!(held <= 40_000, "200k keys written, {held} still held");
}

#[test]
fn a_check_of_a_concurrency_policy_is_an_error_naming_acquire() {
    let server = RedisServer::start();
    let cc = Policy::new("cc", Limit::concurrency(2, Duration::from_secs(60))).unwrap();
    let rt = rt();
    for limiter in [Limiter::memory(), redis_limiter(&server)] {
        let errors = [
            limiter.check_blocking("k", &cc, 1).unwrap_err(),
            rt.block_on(limiter.check("k", &cc, 1)).unwrap_err(),
            limiter.check_by_name_blocking("k", "cc", 1).unwrap_err(),
        ];
        for e in errors.iter().take(2) {
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(e.to_string().contains("acquire"), "{e}");
        }
        assert_eq!(errors[2].kind(), ErrorKind::UnknownPolicy, "{}", errors[2]);
        // a peek takes nothing: it needs no lease
        assert_eq!(limiter.peek_blocking("k", &cc).unwrap().remaining, 2);
        assert_eq!(rt.block_on(limiter.peek("k", &cc)).unwrap().remaining, 2);
        // nothing was taken: both units are there
        let (d, lease) = limiter.acquire_blocking("k", &cc, 2).unwrap();
        assert!(d.allowed && lease.is_some(), "{d:?}");
    }
}

#[test]
fn an_acquire_of_a_policy_that_is_not_a_concurrency_limit_is_an_error_taking_nothing() {
    let server = RedisServer::start();
    let fw = Policy::new("fw", Limit::fixed_window(2, Duration::from_secs(60))).unwrap();
    let rt = rt();
    for limiter in [Limiter::memory(), redis_limiter(&server)] {
        let errors = [
            limiter.acquire_blocking("k", &fw, 1).unwrap_err(),
            rt.block_on(limiter.acquire("k", &fw, 1)).unwrap_err(),
        ];
        for e in &errors {
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            let m = e.to_string();
            assert!(m.contains("fw") && m.contains("concurrency"), "{m}");
        }
        // nothing was taken: both units are there
        assert_eq!(limiter.peek_blocking("k", &fw).unwrap().remaining, 2);
    }
}

/// An ad-hoc policy named like a configured one would read and spend that policy's state
/// (and count in its metrics) with limits of its own: refused, naming the way out. So is
/// an anonymous limit whose id a configured policy's name spells.
#[test]
fn an_ad_hoc_policy_may_not_take_a_configured_policy_name() {
    let server = RedisServer::start();
    let policies = r#"{"login": {"rate": "2/minute"},
        "fixed_window-1000-60000ms": {"rate": "2/minute"}}"#;
    let rt = rt();
    for limiter in [
        Limiter::from_json(&format!(r#"{{"policies": {policies}}}"#)).unwrap(),
        Limiter::from_json(&support::config(&[&server], policies)).unwrap(),
    ] {
        let big = Limit::fixed_window(1000, Duration::from_secs(60));
        let named = Policy::new("login", big.clone()).unwrap();
        let anonymous = Policy::try_from(big.clone()).unwrap();
        assert_eq!(anonymous.name(), "fixed_window-1000-60000ms");
        for p in [&named, &anonymous] {
            for e in [
                limiter.check_blocking("k", p, 1).unwrap_err(),
                rt.block_on(limiter.check("k", p, 1)).unwrap_err(),
                limiter.peek_blocking("k", p).unwrap_err(),
            ] {
                assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
                assert!(e.to_string().contains("configured policy"), "{e}");
            }
        }
        // the configured policies' budgets are untouched; other names are fine
        for name in ["login", "fixed_window-1000-60000ms"] {
            assert_eq!(
                limiter
                    .peek_blocking("k", &limiter.policy(name).unwrap())
                    .unwrap()
                    .remaining,
                2
            );
        }
        let other = Policy::new("login-burst", big).unwrap();
        assert_eq!(
            limiter.check_blocking("k", &other, 1).unwrap().remaining,
            999
        );
    }
}

fn clients(server: &RedisServer) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut server.conn())
        .unwrap();
    // (less the connection that asks)
    list.lines().count() - 1
}

#[test]
fn connect_makes_the_connections_and_loads_the_scripts_within_its_own_timeout() {
    let server = RedisServer::start();
    let l = redis_limiter(&server);
    assert_eq!(clients(&server), 0);
    l.connect_blocking(Duration::from_secs(5)).unwrap();
    let shas: Vec<String> = shardlimit::scripts::all()
        .into_iter()
        .map(|(_, _, sha)| sha)
        .collect();
    let loaded: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(&shas)
        .query(&mut server.conn())
        .unwrap();
    assert!(loaded.iter().all(|e| *e == 1), "{loaded:?}");
    // the pipelined connection and one blocking connection
    assert_eq!(clients(&server), 2);
    // calls after it find their connections made
    let p = Policy::new("fw", Limit::fixed_window(5, Duration::from_secs(60))).unwrap();
    assert!(l.check_blocking("k", &p, 1).unwrap().allowed);
    assert!(rt().block_on(l.check("k", &p, 1)).unwrap().allowed);
    assert_eq!(clients(&server), 2);
    // again: nothing new
    l.connect_blocking(Duration::from_secs(5)).unwrap();
    assert_eq!(clients(&server), 2);
}

#[test]
fn connect_reports_a_shard_it_cannot_reach() {
    let port = support::free_port();
    let l = Limiter::from_json(&format!(
        r#"{{"shards": [{{"name": "gone", "url": "redis://127.0.0.1:{port}"}}], "policies": {{}}}}"#
    ))
    .unwrap();
    let e = l.connect_blocking(Duration::from_secs(2)).unwrap_err();
    assert!(e.is_backend(), "{e}");
    assert!(e.to_string().contains("gone"), "{e}");
    let e = l.connect_blocking(Duration::ZERO).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    // nothing to do in memory
    Limiter::memory()
        .connect_blocking(Duration::from_secs(1))
        .unwrap();
}

/// A shard that accepts connections but never answers (SIGSTOP): connect times out within
/// its own timeout, with or without policies in the config, and never reports success.
#[test]
fn connect_times_out_on_a_shard_that_does_not_answer() {
    let s = support::RedisServer::start();
    for policies in [
        "{}",
        r#"{"p": {"algorithm": "fixed_window", "limit": 5, "window": "1m"}}"#,
    ] {
        // stopped before the limiter is even built: nothing of it can have connected
        unsafe { libc::kill(s.pid() as i32, libc::SIGSTOP) };
        let l = Limiter::from_json(&format!(
            r#"{{"shards": [{{"name": "s0", "url": "{}"}}], "timeout_ms": 50, "policies": {policies}}}"#,
            s.url()
        ))
        .unwrap();
        let t0 = std::time::Instant::now();
        let r = l.connect_blocking(Duration::from_millis(300));
        let took = t0.elapsed();
        unsafe { libc::kill(s.pid() as i32, libc::SIGCONT) };
        let e = r.expect_err(&format!(
            "connect succeeded against a stopped shard ({policies})"
        ));
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(e.to_string().contains("300 ms"), "{e}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
}
