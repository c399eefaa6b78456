//! Costs up to the limit on every algorithm and both engines:
//! weighted sliding-log entries, weighted leases, bounded script time, validated leases.

mod support;

use shardlimit::{
    Algorithm, Decision, ErrorKind, Lease, Limit, Limiter, ManualClock, OnError, Policy, Source,
    MAX_LIMIT,
};
use std::sync::Arc;
use std::time::Duration;
use support::RedisServer;

const T0: u64 = 1_800_000_000_123_457;
const HOUR: Duration = Duration::from_secs(3600);

fn redis_limiter(server: &RedisServer) -> Limiter {
    Limiter::from_json(&support::config(&[server], "{}")).unwrap()
}

/// A limiter for the tests that first build a large state with 100,000 concurrent calls:
/// a long deadline, so that a machine shared with other builds cannot turn a slow call into
/// a fallback (their policies also use on_error "error").
fn patient_limiter(server: &RedisServer) -> Limiter {
    let cfg =
        support::config(&[server], "{}").replace(r#""timeout_ms": 2000"#, r#""timeout_ms": 60000"#);
    assert!(cfg.contains("60000"));
    Limiter::from_json(&cfg).unwrap()
}

fn with_clock(l: Limiter, t: u64) -> (Limiter, Arc<ManualClock>) {
    let c = ManualClock::new(t);
    (l.with_clock(c.clone()).unwrap(), c)
}

fn engines(server: &RedisServer) -> Vec<(Limiter, Arc<ManualClock>)> {
    redis::cmd("FLUSHALL").exec(&mut server.conn()).unwrap();
    vec![
        with_clock(redis_limiter(server), T0),
        with_clock(Limiter::memory(), T0),
    ]
}

/// Units a sliding log holds in Redis, from its members ("<before>:<cost>").
fn log_units(server: &RedisServer) -> u64 {
    let mut c = server.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    let mut units = 0;
    for k in keys {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(&k)
            .arg(0)
            .arg(-1)
            .query(&mut c)
            .unwrap();
        for m in members {
            units += m.split(':').nth(1).unwrap().parse::<u64>().unwrap();
        }
    }
    units
}

/// The issue's reproduction: a 10,000/h log, ten checks of cost 4000: exactly two are
/// admitted, by Redis itself (not a fallback), and Redis holds 8000 units.
#[test]
fn sliding_log_cost_4000_on_10000_per_hour_admits_exactly_two() {
    let _one_at_a_time = measuring();
    let server = RedisServer::start();
    let p = Policy::new("upload_kb", Limit::sliding_log(10_000, HOUR)).unwrap();
    for (i, (limiter, clock)) in engines(&server).into_iter().enumerate() {
        let mut admitted = 0;
        for step in 0..10 {
            clock.set_us(T0 + step * 1_000);
            let d = limiter.check_blocking("tenant:7", &p, 4000).unwrap();
            assert!(matches!(d.source, Source::Redis | Source::Memory), "{d:?}");
            if d.allowed {
                admitted += 1;
            } else {
                assert_eq!(d.remaining, 2000);
                // the first admission (at T0) must expire first
                assert_eq!(
                    d.retry_after,
                    Some(Duration::from_micros(
                        T0 + 3_600_000_000 - (T0 + step * 1_000)
                    ))
                );
            }
        }
        assert_eq!(admitted, 2);
        assert_eq!(
            limiter.peek_blocking("tenant:7", &p).unwrap().remaining,
            2000
        );
        if i == 0 {
            assert_eq!(log_units(&server), 8000);
        }
    }
}

/// A small deterministic generator (xorshift), so that the sequences are reproducible.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn all_algorithms(limit: u64, period: Duration) -> Vec<Policy> {
    // buckets refill completely in `period`, or at a token per µs when that is faster
    let per_sec = (limit as f64 / period.as_secs_f64()).min(1e6);
    // on_error "error": a failed call must fail the test, never pass as a fallback
    [
        Policy::new("fw", Limit::fixed_window(limit, period)).unwrap(),
        Policy::new("sw", Limit::sliding_window(limit, period)).unwrap(),
        Policy::new("sl", Limit::sliding_log(limit, period)).unwrap(),
        Policy::new("cc", Limit::concurrency(limit, period)).unwrap(),
        Policy::new("tb", Limit::token_bucket(limit, per_sec)).unwrap(),
        Policy::new("lb", Limit::leaky_bucket(limit, per_sec)).unwrap(),
    ]
    .into_iter()
    .map(|p| p.with_on_error(OnError::Error))
    .collect()
}

/// What both engines must agree on.
fn fields(d: &Decision) -> String {
    format!(
        "allowed {} remaining {} reset_after {:?} retry_after {:?} delay {:?} measured {}",
        d.allowed,
        d.remaining,
        d.reset_after,
        d.retry_after,
        d.delay,
        matches!(d.source, Source::Redis | Source::Memory)
    )
}

/// Costs from 1 to the limit (and one above it) on every algorithm: both engines give the
/// same decisions, step for step, including remaining, reset_after and retry_after; leases
/// of any size are released on both; no call costs Redis 5 ms of CPU (a sliding window's
/// retry_after walked one µs at a time cost it 1.4 s at limit 10^12).
#[test]
fn every_cost_up_to_the_limit_on_every_algorithm_engines_agree() {
    let _one_at_a_time = measuring();
    let server = RedisServer::start();
    // (CPU µs, what) of the costliest call to Redis, and every call's CPU µs
    let mut worst = (0, String::new());
    let mut cpus = Vec::new();
    for (limit, period) in [
        (10_000, Duration::from_secs(10)),
        (1_000_000, HOUR),
        (MAX_LIMIT, Duration::from_secs(86_400)),
    ] {
        for p in all_algorithms(limit, period) {
            let pair = engines(&server);
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ limit);
            let mut leases: Vec<[Option<Lease>; 2]> = Vec::new();
            let mut t = T0;
            for step in 0..200 {
                t += rng.below(period.as_micros() as u64 / 8);
                let cost = match rng.below(6) {
                    0 => 1,
                    1 => limit,
                    2 => limit + 1,
                    3 => limit / 2 + rng.below(2),
                    _ => 1 + rng.below(limit),
                };
                let key = ["a", "b"][rng.below(2) as usize];
                let op = rng.below(10);
                let mut got = Vec::new();
                let mut got_leases = Vec::new();
                for (limiter, clock) in &pair {
                    clock.set_us(t);
                    let before = server.main_thread_cpu_us();
                    if op == 0 {
                        got.push(fields(&limiter.peek_blocking(key, &p).unwrap()));
                    } else if op == 1
                        && p.algorithm() == Algorithm::Concurrency
                        && !leases.is_empty()
                    {
                        let i = rng.0 as usize % leases.len();
                        let e = got.len();
                        let r = leases[i][e]
                            .as_ref()
                            .map(|l| release_with(limiter, &p, l).unwrap());
                        got.push(format!("released {r:?}"));
                    } else if p.algorithm() == Algorithm::Concurrency {
                        let (d, lease) = limiter.acquire_blocking(key, &p, cost).unwrap();
                        got_leases.push(lease);
                        got.push(fields(&d));
                    } else {
                        got.push(fields(&limiter.check_blocking(key, &p, cost).unwrap()));
                    }
                    let cpu = server.main_thread_cpu_us().saturating_sub(before);
                    if got.len() == 1 {
                        cpus.push(cpu);
                        if cpu > worst.0 {
                            worst = (cpu, format!("{} limit {limit} step {step}", p.name()));
                        }
                    }
                }
                if got_leases.len() == 2 {
                    let b = got_leases.pop().unwrap();
                    let a = got_leases.pop().unwrap();
                    leases.push([a, b]);
                }
                assert_eq!(
                    got[0],
                    got[1],
                    "{} limit {limit}, step {step}, key {key}, cost {cost}",
                    p.name()
                );
            }
        }
    }
    within_budget(&format!("random costs, the costliest {worst:?}"), &cpus);
}

/// Runs `f` (one call to Redis) and returns its result with the main-thread CPU time it
/// cost Redis, less the `INFO cpu` that reads the clock (measured on an idle server).
fn cpu_of<T>(server: &RedisServer, f: impl FnOnce() -> T) -> (T, u64) {
    let before = server.main_thread_cpu_us();
    let r = f();
    (r, server.main_thread_cpu_us().saturating_sub(before))
}

/// The tests of this file run one at a time: those that measure Redis's CPU per call saw
/// the measure inflated past the budget now and then while sharing two cores with the
/// others.
static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn measuring() -> std::sync::MutexGuard<'static, ()> {
    MEASURING.lock().unwrap_or_else(|e| e.into_inner())
}

/// The most CPU one check may cost Redis in these tests: "a few milliseconds". The state
/// of the issue took 1,400,000 µs with a unit per member. The measure (`INFO cpu` around
/// one call) also counts whatever Redis's own cron did meanwhile (expiring keys), so on a
/// quiet machine a call of a few hundred µs read up to 3.3 ms now and then: hence 5 ms.
const CALL_BUDGET_US: u64 = 5_000;

/// Holds Redis's CPU per call (`samples`, µs, read from `/proc` around each call) to
/// [`CALL_BUDGET_US`] at the median and to four budgets at the worst. A `/proc` reading is a
/// coarse sample that another process's load can inflate on any one call (one of ~1000 read
/// 5.7 ms on a loaded CI machine, against 0.4-1.5 ms for the rest), so no single sample is
/// held to the budget; a call whose cost grew with the state (the issue's 1,400,000 µs) still
/// fails both bounds. What the tests prove about bounded work, they prove by their decisions.
fn within_budget(what: &str, samples: &[u64]) {
    assert!(!samples.is_empty(), "{what}: no samples");
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let (median, worst) = (sorted[sorted.len() / 2], sorted[sorted.len() - 1]);
    assert!(
        median < CALL_BUDGET_US,
        "{what}: median Redis CPU µs per call {median}: {samples:?}"
    );
    assert!(
        worst < 4 * CALL_BUDGET_US,
        "{what}: Redis CPU µs per call: {samples:?}"
    );
}

/// The worst states the issue names, measured by Redis's own account of its main thread's
/// CPU time (`INFO cpu`, not the test's wall clock): 100,000 entries that expire at once,
/// then a cost of 500,000 on a 1,000,000/h log, and denied checks whose retry_after must
/// find a unit among 100,000 entries. No call may cost Redis 5 ms. The memory engine
/// decides the same.
#[test]
fn sliding_log_worst_case_script_calls_stay_within_a_few_ms() {
    let _one_at_a_time = measuring();
    let server = RedisServer::start();
    let p = Policy::new("big", Limit::sliding_log(1_000_000, HOUR))
        .unwrap()
        .with_on_error(OnError::Error);
    let (redis, rclock) = with_clock(patient_limiter(&server), T0);
    let (memory, mclock) = with_clock(Limiter::memory(), T0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // 100,000 checks of one unit at T0 (batched by the pipelined connection)
    const N: u64 = 100_000;
    for _ in 0..(N / 1000) {
        rt.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..1000 {
                let (l, p) = (redis.clone(), p.clone());
                tasks.push(tokio::spawn(async move {
                    l.check("k", &p, 1).await.unwrap().allowed
                }));
            }
            for t in tasks {
                assert!(t.await.unwrap());
            }
        });
    }
    for _ in 0..N {
        assert!(memory.check_blocking("k", &p, 1).unwrap().allowed);
    }
    let mut c = server.conn();
    let members: u64 = redis::cmd("ZCARD")
        .arg(
            redis::cmd("KEYS")
                .arg("*")
                .query::<Vec<String>>(&mut c)
                .unwrap()[0]
                .clone(),
        )
        .query(&mut c)
        .unwrap();
    assert_eq!(members, N);
    // (CPU µs, cost) of each call to Redis in the worst states
    let mut cpu = Vec::new();
    let mut both = |t: u64, cost: u64| {
        rclock.set_us(t);
        mclock.set_us(t);
        let (r, us) = cpu_of(&server, || redis.check_blocking("k", &p, cost).unwrap());
        cpu.push((us, cost));
        let m = memory.check_blocking("k", &p, cost).unwrap();
        assert_eq!(fields(&r), fields(&m));
        r
    };
    // denied checks whose k-th unit lies anywhere among the 100,000 live entries, all
    // recorded at T0: that unit expires an hour after T0
    for cost in [900_001, 925_000, 950_000, 999_999, 1_000_000] {
        let d = both(T0 + 1_000_000, cost);
        assert!(!d.allowed && d.remaining == 900_000, "{d:?}");
        assert_eq!(d.retry_after, Some(HOUR - Duration::from_secs(1)));
    }
    // every entry expires at once: a cost of 500,000, twice, then one more unit is denied
    let later = T0 + HOUR.as_micros() as u64 + 1_000_000;
    assert!(both(later, 500_000).allowed);
    assert!(both(later + 1, 500_000).allowed);
    let d = both(later + 2, 1);
    assert!(!d.allowed && d.remaining == 0);
    assert_eq!(d.retry_after, Some(HOUR - Duration::from_micros(2)));
    // the decisions prove the work bounded: each denial's retry_after found its unit
    // among 100,000 entries, and the mass expiry admitted 500,000 at once
    let samples: Vec<u64> = cpu.iter().map(|(us, _)| *us).collect();
    within_budget(
        &format!("sliding log worst cases (µs, cost) {cpu:?}"),
        &samples,
    );
    eprintln!("Redis main-thread CPU per call (µs, cost): {cpu:?}");
}

/// A forged lease is refused with a clear InvalidArgument before anything is built from
/// it, on both engines: units above the policy's max (1e9 here), zero units, malformed
/// ids, and a lease of a policy that is not a concurrency limit.
#[test]
fn forged_leases_are_rejected() {
    let _one_at_a_time = measuring();
    let server = RedisServer::start();
    let p = Policy::new("jobs", Limit::concurrency(10, HOUR)).unwrap();
    let fw = Policy::new("fw", Limit::fixed_window(10, HOUR)).unwrap();
    for (limiter, _clock) in engines(&server) {
        let (d, lease) = limiter.acquire_blocking("k", &p, 3).unwrap();
        assert!(d.allowed);
        let lease = lease.unwrap();
        let forged = [
            Lease {
                units: 1_000_000_000,
                ..lease.clone()
            },
            Lease {
                units: 11,
                ..lease.clone()
            },
            Lease {
                units: 0,
                ..lease.clone()
            },
            Lease {
                id: String::new(),
                ..lease.clone()
            },
            Lease {
                id: "x".repeat(1_000_000),
                ..lease.clone()
            },
            Lease {
                id: format!("{}:1", lease.id),
                ..lease.clone()
            },
            Lease {
                id: lease.id.to_uppercase(),
                ..lease.clone()
            },
        ];
        for f in &forged {
            let e = release_with(&limiter, &p, f).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(e.to_string().contains("lease."), "{e}");
        }
        let e = release_with(&limiter, &fw, &lease).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        // a well-formed lease of the wrong size is simply not held
        let other = Lease {
            units: 2,
            ..lease.clone()
        };
        assert!(!release_with(&limiter, &p, &other).unwrap());
        assert_eq!(limiter.peek_blocking("k", &p).unwrap().remaining, 7);
        assert!(release_with(&limiter, &p, &lease).unwrap());
        assert!(!release_with(&limiter, &p, &lease).unwrap());
        assert_eq!(limiter.peek_blocking("k", &p).unwrap().remaining, 10);
    }
}

/// A lease of the policy's whole max (10^12 units) is one sorted-set member, acquired and
/// released within the CPU budget (five rounds on Redis, held at the median and the worst).
#[test]
fn a_lease_of_max_limit_units_is_one_member() {
    let _one_at_a_time = measuring();
    let server = RedisServer::start();
    let p = Policy::new("cc", Limit::concurrency(MAX_LIMIT, HOUR)).unwrap();
    for (i, (limiter, _clock)) in engines(&server).into_iter().enumerate() {
        let (mut acquired, mut released_us) = (Vec::new(), Vec::new());
        for _round in 0..if i == 0 { 5 } else { 1 } {
            let ((d, lease), us) = cpu_of(&server, || {
                limiter.acquire_blocking("k", &p, MAX_LIMIT).unwrap()
            });
            acquired.push(us);
            assert!(d.allowed && d.remaining == 0, "{d:?}");
            if i == 0 {
                // the lease and the sum of units held
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg("*")
                    .query(&mut server.conn())
                    .unwrap();
                let n: u64 = redis::cmd("ZCARD")
                    .arg(&keys[0])
                    .query(&mut server.conn())
                    .unwrap();
                assert_eq!(n, 2);
            }
            let d = limiter.acquire_blocking("k", &p, 1).unwrap().0;
            assert!(!d.allowed && d.retry_after == Some(HOUR), "{d:?}");
            let (released, us) = cpu_of(&server, || release_with(&limiter, &p, &lease.unwrap()));
            released_us.push(us);
            assert!(released.unwrap());
            assert_eq!(limiter.peek_blocking("k", &p).unwrap().remaining, MAX_LIMIT);
        }
        if i == 0 {
            within_budget("acquiring MAX_LIMIT units", &acquired);
            within_budget("releasing MAX_LIMIT units", &released_us);
        }
    }
}

/// A layered check across two shards whose second shard denies: the weighted log entry
/// the first shard admitted is refunded exactly (the refund script), and a layered check on
/// one shard (one script) consumes nothing when a layer denies. (A concurrency policy is
/// never a layer: `layered_concurrency.rs`.)
#[test]
fn layered_checks_refund_weighted_entries() {
    let _one_at_a_time = measuring();
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let two = Limiter::from_json(&support::config(&[&a, &b], "{}")).unwrap();
    let one = redis_limiter(&a);
    let sl = Policy::new("sl", Limit::sliding_log(10_000, HOUR)).unwrap();
    let fw = Policy::new("fw", Limit::fixed_window(1, HOUR)).unwrap();
    for (l, name) in [(&two, "two shards"), (&one, "one shard")] {
        // keys on distinct shards: the first on the limiter's shard 0, the other elsewhere
        let mut keys = (0..1000).map(|i| format!("t{i}"));
        let k0 = keys.find(|k| l.route(k).unwrap().0 == 0).unwrap();
        let k1 = if name == "two shards" {
            keys.find(|k| l.route(k).unwrap().0 == 1).unwrap()
        } else {
            keys.next().unwrap()
        };
        assert!(l.check_blocking(&k0, &sl, 1000).unwrap().allowed);
        assert!(l.check_blocking(&k1, &fw, 1).unwrap().allowed);
        let layers = [
            shardlimit::Layer::new(k0.clone(), &sl, 4000),
            shardlimit::Layer::new(k1.clone(), &fw, 1),
        ];
        for _ in 0..3 {
            let d = l.check_all_blocking(&layers).unwrap();
            assert!(!d.allowed && &*d.policy == "fw", "{name}: {d:?}");
        }
        assert_eq!(l.peek_blocking(&k0, &sl).unwrap().remaining, 9000, "{name}");
        // the entry before the refunded ones still counts, and is the one to expire
        let d = l.check_blocking(&k0, &sl, 9001).unwrap();
        assert!(!d.allowed && d.remaining == 9000, "{name}: {d:?}");
        assert!(l.check_blocking(&k0, &sl, 9000).unwrap().allowed, "{name}");
    }
}

/// A clock that goes back (an injected one, or a Redis TIME stepped back): an admission is
/// recorded no earlier than the newest entry (so `before` grows with the score), the same
/// way on both engines.
#[test]
fn sliding_log_with_a_clock_that_goes_back_engines_agree() {
    let _one_at_a_time = measuring();
    let server = RedisServer::start();
    let p = Policy::new("sl", Limit::sliding_log(1000, Duration::from_secs(10))).unwrap();
    let pair = engines(&server);
    let mut rng = Rng(12345);
    let mut t = T0;
    for step in 0..400 {
        // mostly forward, sometimes back by up to 5 s
        if rng.below(4) == 0 {
            t -= rng.below(5_000_000);
        } else {
            t += rng.below(2_000_000);
        }
        let cost = 1 + rng.below(400);
        let got: Vec<String> = pair
            .iter()
            .map(|(l, c)| {
                c.set_us(t);
                fields(&l.check_blocking("k", &p, cost).unwrap())
            })
            .collect();
        assert_eq!(got[0], got[1], "step {step}, t {t}, cost {cost}");
    }
}

/// State an older version wrote (one member per unit) never fails a check: a sliding log
/// starts afresh on its first write, old leases count one unit each until they expire.
#[test]
fn state_of_the_previous_format_is_read_safely() {
    let _one_at_a_time = measuring();
    let server = RedisServer::start();
    let (limiter, clock) = with_clock(redis_limiter(&server), T0);
    let sl = Policy::new("sl", Limit::sliding_log(10, HOUR))
        .unwrap()
        .with_on_error(OnError::Error);
    let cc = Policy::new("cc", Limit::concurrency(10, HOUR))
        .unwrap()
        .with_on_error(OnError::Error);
    let mut c = server.conn();
    for p in [&sl, &cc] {
        // find the state key by making one, then replace it with members of the old format
        redis::cmd("FLUSHALL").exec(&mut c).unwrap();
        support::take_blocking(&limiter, "k", p, 1).unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
        assert_eq!(keys.len(), 1, "{keys:?}");
        redis::cmd("DEL").arg(&keys).exec(&mut c).unwrap();
        let score = if p.name() == "sl" {
            T0
        } else {
            T0 + 3_600_000_000
        };
        for i in 1..=4 {
            redis::cmd("ZADD")
                .arg(&keys[0])
                .arg(score)
                .arg(format!("{T0}-{i}"))
                .exec(&mut c)
                .unwrap();
        }
        clock.set_us(T0 + 1);
        let peek = limiter.peek_blocking("k", p).unwrap();
        let d = support::take_blocking(&limiter, "k", p, 5).unwrap();
        assert!(d.allowed, "{}: {d:?}", p.name());
        if p.name() == "sl" {
            assert_eq!((peek.remaining, d.remaining), (10, 5));
        } else {
            assert_eq!((peek.remaining, d.remaining), (6, 1));
        }
        clock.set_us(T0);
    }
}

/// 100,000 leases that expire at once: the next call reclaims at most 128 of them (the
/// rest count as held until later calls reclaim them), so no call costs Redis 5 ms of CPU;
/// both engines decide the same all the way (every lease is one unit, so which of the
/// leases expiring in the same µs go first does not matter).
#[test]
fn leases_expiring_at_once_are_reclaimed_in_bounded_steps() {
    let _one_at_a_time = measuring();
    let server = RedisServer::start();
    let p = Policy::new("cc", Limit::concurrency(100_000, HOUR))
        .unwrap()
        .with_on_error(OnError::Error);
    let (redis, rclock) = with_clock(patient_limiter(&server), T0);
    let (memory, mclock) = with_clock(Limiter::memory(), T0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for _ in 0..100 {
        rt.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..1000 {
                let (l, p) = (redis.clone(), p.clone());
                tasks.push(tokio::spawn(async move {
                    l.acquire("k", &p, 1).await.unwrap().0.allowed
                }));
            }
            for t in tasks {
                assert!(t.await.unwrap());
            }
        });
    }
    for _ in 0..100_000 {
        assert!(memory.acquire_blocking("k", &p, 1).unwrap().0.allowed);
    }
    let mut cpu = Vec::new();
    let mut both = |t: u64, cost: u64| {
        rclock.set_us(t);
        mclock.set_us(t);
        let ((r, _), us) = cpu_of(&server, || redis.acquire_blocking("k", &p, cost).unwrap());
        cpu.push(us);
        let (m, _) = memory.acquire_blocking("k", &p, cost).unwrap();
        assert_eq!(fields(&r), fields(&m));
        r
    };
    let d = both(T0 + 1_000_000, 1);
    assert!(!d.allowed && d.retry_after == Some(HOUR - Duration::from_secs(1)));
    // all expired: each call reclaims 128 of them, so admissions resume at once, 128 units
    // at a time, and stop when the new leases fill the max, the old ones all reclaimed
    let later = T0 + HOUR.as_micros() as u64;
    let first = both(later, 1);
    assert!(first.allowed && first.remaining == 128 - 1, "{first:?}");
    let mut admitted = 1;
    for i in 1..1000 {
        if both(later + i, 128).allowed {
            admitted += 128;
        }
    }
    assert_eq!(admitted, 1 + 128 * 781);
    let d = both(later + 1000, 100_000 - admitted);
    assert!(d.allowed && d.remaining == 0, "{d:?}");
    // The bound itself is proved by the decisions above: `first.remaining == 127` and the
    // 128-unit admissions mean each call reclaimed 128 leases, not 100,000.
    within_budget("leases expiring at once", &cpu);
}

/// A sliding log's running count of units wraps at 2^52 (every number the script handles
/// stays exact in a double): on a 10^12 log, after ~9,000 checks of ~5·10^11 units. Both
/// engines agree across the wrap, including the check recorded one µs later so that the
/// members of one instant stay in order, and retry_after still finds the right entry.
#[test]
fn sliding_log_running_count_wraps_and_engines_agree() {
    let _one_at_a_time = measuring();
    let server = RedisServer::start();
    let p = Policy::new("sl", Limit::sliding_log(MAX_LIMIT, Duration::from_secs(1)))
        .unwrap()
        .with_on_error(OnError::Error);
    let pair = engines(&server);
    let c: u64 = 499_500_000_000; // floor(2^52 / c) is even: the wrap falls inside a pair
    let mut t = T0;
    let mut recorded: u128 = 0;
    let mut wrapped_retry = None;
    for step in 0..4600 {
        for cost in [c, c, MAX_LIMIT - 2 * c + 1, MAX_LIMIT - c + 1] {
            let got: Vec<(String, Decision)> = pair
                .iter()
                .map(|(l, clock)| {
                    clock.set_us(t);
                    let d = l.check_blocking("k", &p, cost).unwrap();
                    (fields(&d), d)
                })
                .collect();
            assert_eq!(got[0].0, got[1].0, "step {step}, cost {cost}");
            let d = &got[0].1;
            if d.allowed {
                recorded += cost as u128;
            } else if cost == MAX_LIMIT - c + 1 && d.retry_after > Some(Duration::from_secs(1)) {
                // the second check of the pair that wrapped was recorded 1 µs later
                wrapped_retry.get_or_insert((step, d.retry_after));
            }
        }
        t += 1_000_000;
    }
    assert!(recorded > 1 << 52, "{recorded}");
    let (step, retry) = wrapped_retry.expect("a check recorded 1 µs later at the wrap");
    assert_eq!(retry, Some(Duration::from_micros(1_000_001)), "step {step}");
}

/// [`Limiter::release_with`] on the calling thread (the core has no blocking twin of it:
/// bindings release leases of their config's policies).
fn release_with(limiter: &Limiter, policy: &Policy, lease: &Lease) -> shardlimit::Result<bool> {
    let (me, policy, lease) = (limiter.clone(), policy.clone(), lease.clone());
    limiter.block_on(async move { me.release_with(&policy, &lease).await })
}
