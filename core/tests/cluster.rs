//! Redis Cluster mode against a real 3-primary cluster the test creates on loopback ports
//! (`redis-server --cluster-enabled yes` ×3, `redis-cli --cluster create`).

mod support;

use shardlimit::{Layer, Lease, Limiter, Policy, Source};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{Cluster, RedisServer};

fn wait(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn limiter(nodes: &Cluster, timeout_ms: u64) -> Limiter {
    Limiter::from_json(&nodes.config(
        timeout_ms,
        r#"{
            "api":   {"algorithm":"token_bucket","capacity":40,"refill_per_sec":0.001,"on_error":"error"},
            "login": {"algorithm":"fixed_window","limit":3,"window":"1h","on_error":"closed"},
            "ip":    {"algorithm":"sliding_window","limit":100,"window":"1h","on_error":"closed"}
        }"#,
    ))
    .unwrap()
}

#[test]
fn cluster_mode_end_to_end() {
    let mut nodes = Cluster::start();
    let l = limiter(&nodes, 1000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();

    // exact admission under concurrency on one key
    let allowed = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let (l, a) = (l.clone(), allowed.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..3 {
                    if l.check_by_name("user:hot", "api", 1).await.unwrap().allowed {
                        a.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    assert_eq!(allowed.load(Ordering::SeqCst), 40);

    // keys spread over all three primaries
    for i in 0..300 {
        assert!(
            l.check_by_name_blocking(&format!("user:{i}"), "api", 1)
                .unwrap()
                .allowed
        );
    }
    for n in &nodes {
        let size: u64 = redis::cmd("DBSIZE").query(&mut n.conn()).unwrap();
        assert!(size > 50, "node {} holds only {size} keys", n.port);
    }

    // layered check over keys in different slots: no CROSSSLOT, nothing consumed on deny
    for _ in 0..3 {
        let d = l
            .check_all_blocking(&[
                Layer::new("ip:1", &l.policy("ip").unwrap(), 1),
                Layer::new("user:login", &l.policy("login").unwrap(), 1),
            ])
            .unwrap();
        assert!(d.allowed, "{d:?}");
    }
    let d = l
        .check_all_blocking(&[
            Layer::new("ip:1", &l.policy("ip").unwrap(), 1),
            Layer::new("user:login", &l.policy("login").unwrap(), 1),
        ])
        .unwrap();
    assert!(!d.allowed);
    assert_eq!(&*d.policy, "login");
    assert_eq!(
        l.peek_blocking("ip:1", &l.policy("ip").unwrap())
            .unwrap()
            .remaining,
        97
    );

    // keys whose routing key holds braces (`x{}y` has an empty tag, so its routing key is
    // the whole key): grouped by the slot their Redis keys really have. `k` is a plain key
    // in the slot Redis gives the bare `x{}y`, which is not the slot of its hash tag.
    let bare: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg("x{}y")
        .query(&mut nodes[0].conn())
        .unwrap();
    let k = (0..1_000_000)
        .map(|i| format!("k{i}"))
        .find(|k| shardlimit::routing::cluster_slot(k) == bare)
        .unwrap();
    let ip = l.policy("ip").unwrap();
    let keys = ["w", "{w}", "{w}:x", "x{}y", "a}b", k.as_str()];
    let layers: Vec<Layer> = keys.iter().map(|k| Layer::new(*k, &ip, 1)).collect();
    let d = l.check_all_blocking(&layers).unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Redis), "{d:?}");
    for k in keys {
        assert_eq!(l.peek_blocking(k, &ip).unwrap().remaining, 99, "{k}");
    }

    // block list
    l.block_blocking("user:bad", Some(Duration::from_secs(60)), "cluster test")
        .unwrap();
    assert_eq!(
        l.check_by_name_blocking("user:bad", "ip", 1)
            .unwrap()
            .source,
        Source::Block
    );
    assert_eq!(
        l.blocked_blocking("user:bad").unwrap().unwrap().reason,
        "cluster test"
    );

    // scripts survive SCRIPT FLUSH on every node
    for n in &nodes {
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .exec(&mut n.conn())
            .unwrap();
    }
    assert!(
        l.check_by_name_blocking("user:after-flush", "ip", 1)
            .unwrap()
            .allowed
    );

    // a primary dies: the failure mode applies within the deadline; then the node comes
    // back (same directory, so it rejoins) and the client recovers by itself
    let victim = 1;
    // a key whose slot the victim owns: a non-owner answers MOVED (an error)
    let victim_key = (0..10_000)
        .map(|i| format!("k{i}"))
        .find(|k| {
            redis::cmd("GET")
                .arg(format!("{{{k}}}"))
                .query::<Option<String>>(&mut nodes[victim].conn())
                .is_ok()
        })
        .unwrap();
    let l = limiter(&nodes, 300);
    assert_eq!(
        l.check_by_name_blocking(&victim_key, "login", 1)
            .unwrap()
            .source,
        Source::Redis
    );
    nodes[victim].kill();
    let t = Instant::now();
    let d = l.check_by_name_blocking(&victim_key, "login", 1).unwrap();
    assert_eq!(
        (d.allowed, d.source),
        (false, Source::Fallback),
        "closed mode while the primary is down"
    );
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
    nodes[victim].restart();
    nodes.wait_ok("the cluster to heal");
    wait("the client to recover", || {
        l.check_by_name_blocking(&format!("{victim_key}-x"), "login", 1)
            .map(|d| d.source == Source::Redis)
            .unwrap_or(false)
    });
}

/// A key whose slot `nodes[i]` owns (any other node answers MOVED, an error).
fn key_owned_by(nodes: &[RedisServer], i: usize, prefix: &str) -> String {
    (0..10_000)
        .map(|n| format!("{prefix}{n}"))
        .find(|k| {
            redis::cmd("GET")
                .arg(format!("{{{k}}}"))
                .query::<Option<String>>(&mut nodes[i].conn())
                .is_ok()
        })
        .unwrap()
}

fn set_full_coverage(nodes: &[RedisServer], yes: bool) {
    for n in nodes {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-require-full-coverage")
            .arg(if yes { "yes" } else { "no" })
            .exec(&mut n.conn())
            .unwrap();
    }
}

/// One dead primary took every slot down: the whole Cluster shared one circuit, so
/// three failures on the dead primary's slots opened it for all (a key on a healthy
/// primary fell back for 4.4 s while Redis was serving it). Circuits follow the slot's
/// owner now: the dead primary's keys fall back, fast once its circuit is open, and
/// every check of a key on a healthy primary is decided by Redis. `CLUSTERDOWN` is a
/// backend error (the failure mode applies), not a script error.
#[test]
fn a_dead_primary_takes_only_its_own_slots_down() {
    let mut nodes = Cluster::start();
    // the healthy primaries go on serving their slots while one is down
    set_full_coverage(&nodes, false);
    let l = limiter(&nodes, 300);
    let victim = 1;
    let dead_key = key_owned_by(&nodes, victim, "dead");
    let live_key = key_owned_by(&nodes, 0, "live");
    let ip = |key: &str| l.check_by_name_blocking(key, "ip", 1).unwrap();
    assert_eq!(ip(&dead_key).source, Source::Redis);
    assert_eq!(ip(&live_key).source, Source::Redis);

    nodes[victim].kill();
    let start = Instant::now();
    let mut fast_fallbacks = 0;
    for i in 0..20 {
        // (several in a row: enough to open a circuit)
        for _ in 0..3 {
            let t = Instant::now();
            let d = ip(&dead_key);
            assert_eq!(
                (d.allowed, d.source),
                (false, Source::Fallback),
                "check {i}"
            );
            if t.elapsed() < Duration::from_millis(50) {
                fast_fallbacks += 1;
            }
        }
        let e = l.check_by_name_blocking(&dead_key, "api", 1).unwrap_err();
        assert!(
            e.is_backend() && e.kind() != shardlimit::ErrorKind::Script,
            "{e}"
        );
        let d = ip(&live_key);
        assert_eq!(
            d.source,
            Source::Redis,
            "check {i}: a healthy primary's key"
        );
    }
    assert!(
        fast_fallbacks >= 50,
        "the dead primary's circuit opened: {fast_fallbacks} of 60 fallbacks were fast"
    );
    eprintln!("20 rounds in {:?}", start.elapsed());

    // with full coverage required, the healthy primaries refuse every slot
    set_full_coverage(&nodes[..1], true);
    set_full_coverage(&nodes[2..], true);
    wait("cluster_state:fail", || !nodes[0].cluster_ok());
    let e = l.check_by_name_blocking(&live_key, "api", 1).unwrap_err();
    assert!(
        e.is_backend() && e.kind() != shardlimit::ErrorKind::Script,
        "CLUSTERDOWN is a backend error: {e}"
    );
    let d = ip(&live_key);
    assert_eq!((d.allowed, d.source), (false, Source::Fallback));
}

/// Weighted sliding-log entries and leases in Cluster mode: a cost of 4000 on a 10,000/h
/// log, and a lease of 600,000 units acquired and released (the release script routes by
/// its key like the checks).
#[test]
fn cluster_mode_costs_up_to_the_limit_and_lease_release() {
    let nodes = Cluster::start();
    let l = limiter(&nodes, 1000);
    let h = Duration::from_secs(3600);
    let log = shardlimit::Policy::new("log", shardlimit::Limit::sliding_log(10_000, h))
        .unwrap()
        .with_on_error(shardlimit::OnError::Error);
    let cc = shardlimit::Policy::new("cc", shardlimit::Limit::concurrency(1_000_000, h))
        .unwrap()
        .with_on_error(shardlimit::OnError::Error);
    let admitted = (0..10)
        .filter(|_| l.check_blocking("tenant:7", &log, 4000).unwrap().allowed)
        .count();
    assert_eq!(admitted, 2);
    for key in ["user:1", "user:2", "user:3"] {
        let (d, lease) = l.acquire_blocking(key, &cc, 600_000).unwrap();
        assert!(d.allowed && d.remaining == 400_000, "{d:?}");
        assert!(!l.acquire_blocking(key, &cc, 400_001).unwrap().0.allowed);
        assert!(release_with(&l, &cc, &lease.unwrap()).unwrap());
        assert_eq!(l.peek_blocking(key, &cc).unwrap().remaining, 1_000_000);
    }
}

/// [`Limiter::release_with`] on the calling thread (the core has no blocking twin of it:
/// bindings release leases of their config's policies).
fn release_with(limiter: &Limiter, policy: &Policy, lease: &Lease) -> shardlimit::Result<bool> {
    let (me, policy, lease) = (limiter.clone(), policy.clone(), lease.clone());
    limiter.block_on(async move { me.release_with(&policy, &lease).await })
}

/// Shadow mode on a Redis Cluster: the shadow script touches only the key's slot (no
/// CROSSSLOT), decides like anywhere else, and keeps no counts there (the policy's hash
/// would live in another slot), so `shadow_report` says so.
#[test]
fn cluster_mode_shadow_checks_decide_without_counts() {
    let nodes = Cluster::start();
    let l = limiter(&nodes, 1000);
    let login = l.policy("login").unwrap();
    for key in ["user:1", "{tenant}:a", "ip:9"] {
        for _ in 0..3 {
            assert!(!l.check_blocking(key, &login, 1).unwrap().shadow_denied);
        }
        let d = l.check_shadow_blocking(key, &login, 1).unwrap();
        assert!(
            d.allowed && d.shadow_denied && d.source == shardlimit::Source::Redis,
            "{d:?}"
        );
        assert!(!l.check_blocking(key, &login, 1).unwrap().allowed);
    }
    let e = l.shadow_report_blocking("login", None).unwrap_err();
    assert!(
        e.is_invalid_argument() && e.to_string().contains("Cluster"),
        "{e}"
    );
}

#[test]
fn cluster_mode_overrides_are_exact_on_the_next_check() {
    let nodes = Cluster::start();
    let make = || {
        Limiter::from_json(&nodes.config(
            1000,
            r#"{
                "api": {"algorithm":"fixed_window","limit":3,"window":"1h","on_error":"error","overrides":true}
            }"#,
        ))
        .unwrap()
    };
    let (a, b) = (make(), make());
    let p = b.policy("api").unwrap();
    // keys on every primary's slots
    for i in 0..12 {
        let key = format!("tenant:{i}");
        assert_eq!(b.check_blocking(&key, &p, 1).unwrap().limit, 3);
        a.set_override_blocking(&key, "api", "50/hour", None)
            .unwrap();
        let d = b.check_blocking(&key, &p, 1).unwrap();
        assert_eq!(
            (d.limit, d.remaining, d.source),
            (50, 48, Source::Redis),
            "{key}"
        );
        let got = b.get_override_blocking(&key, "api").unwrap().unwrap();
        assert_eq!(
            got.limit,
            shardlimit::Limit::fixed_window(50, Duration::from_secs(3600))
        );
        assert!(a.delete_override_blocking(&key, "api").unwrap());
        assert_eq!(b.check_blocking(&key, &p, 1).unwrap().limit, 3);
    }
    // listing needs every primary's SCAN: refused clearly
    let e = a.list_overrides_blocking("api", None, 10).unwrap_err();
    assert!(e.to_string().contains("Cluster"), "{e}");
}

fn node_id(n: &RedisServer) -> String {
    redis::cmd("CLUSTER")
        .arg("MYID")
        .query(&mut n.conn())
        .unwrap()
}

fn set_slot(n: &RedisServer, slot: u16, how: &str, id: &str) {
    redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg(how)
        .arg(id)
        .exec(&mut n.conn())
        .unwrap();
}

/// A slot migrated from one primary to another with `CLUSTER SETSLOT` and `MIGRATE`, as
/// `redis-cli --cluster reshard` does, between calls. While it migrates, the old owner
/// answers `ASK` for keys it does not hold, and a single-key command (an override) goes to
/// the new owner behind `ASKING`; a check there (two keys, its block entry missing) is
/// refused with `TRYAGAIN` by Redis itself until the migration ends, and is asked again
/// meanwhile (a node that is migrating a slot is not failing). Once the slot moved, the old
/// owner answers `MOVED`, which is followed (and the map read again). Every check is
/// decided by Redis (`on_error: error`) and counts on from where the key's state was.
#[test]
fn a_slot_migration_is_followed_through_ask_and_moved() {
    let nodes = Cluster::start();
    let l = Limiter::from_json(&nodes.config(
        1000,
        r#"{"api": {"algorithm":"fixed_window","limit":100,"window":"1h","on_error":"error","overrides":true}}"#,
    ))
    .unwrap();
    let p = l.policy("api").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (from, to) = (&nodes[0], &nodes[1]);
    let old = key_owned_by(&nodes, 0, "mig");
    // (a user key whose routing key is `old`: the same slot)
    let fresh = format!("{{{old}}}:fresh");
    let slot = shardlimit::routing::cluster_slot(&old);
    // `old`'s keys move, then the migration ends: every node names the new owner, the old
    // one answers MOVED
    let migrate_the_rest = |from: &RedisServer, to: &RedisServer| {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query(&mut from.conn())
            .unwrap();
        assert!(!keys.is_empty());
        redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(to.port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .exec(&mut from.conn())
            .unwrap();
        for n in nodes.iter() {
            set_slot(n, slot, "NODE", &node_id(to));
        }
    };
    let check = |k: &str| {
        let d = l.check_blocking(k, &p, 1).unwrap();
        assert_eq!(d.source, Source::Redis, "{k}");
        (d.limit, d.remaining)
    };
    assert_eq!(check(&old), (100, 99));
    assert_eq!(check(&old), (100, 98));

    set_slot(to, slot, "IMPORTING", &node_id(from));
    set_slot(from, slot, "MIGRATING", &node_id(to));
    let on = |n: &RedisServer| -> u64 {
        redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(&mut n.conn())
            .unwrap()
    };
    let (on_from, on_to) = (on(from), on(to));
    // none of `fresh`'s keys is on the old owner: ASK, and the new owner takes the write
    l.set_override_blocking(&fresh, "api", "50/hour", None)
        .unwrap();
    assert_eq!((on(from), on(to)), (on_from, on_to + 1));
    let got = rt.block_on(l.get_override(&fresh, "api")).unwrap().unwrap();
    assert_eq!(
        got.limit,
        shardlimit::Limit::fixed_window(50, Duration::from_secs(3600))
    );
    // a check of two keys in a slot being migrated: Redis's TRYAGAIN, asked again until the
    // slot has moved (the migration goes on only once the new owner has refused it)
    let tryagain = |n: &RedisServer| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("errorstats")
            .query(&mut n.conn())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("errorstat_TRYAGAIN:count="))
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    let refused_before = tryagain(to);
    let waiting = std::thread::scope(|s| {
        let waiting = s.spawn(|| l.check_blocking(&fresh, &p, 1));
        wait("the new owner refused the check with TRYAGAIN", || {
            tryagain(to) > refused_before
        });
        migrate_the_rest(from, to);
        waiting.join().unwrap()
    });
    let d = waiting.unwrap();
    assert_eq!((d.source, d.limit, d.remaining), (Source::Redis, 50, 49));
    assert_eq!(on(from), 0);
    assert_eq!(check(&old), (100, 97));
    assert_eq!(rt.block_on(l.check(&old, &p, 1)).unwrap().remaining, 96);
    assert_eq!(check(&fresh), (50, 48));
    // (the old owner counts each script call it redirected as rejected)
    let rejected = || -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut from.conn())
            .unwrap();
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| l.split("rejected_calls=").nth(1))
            .map(|v| v.split(',').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    assert!(rejected() >= 2, "the old owner redirected");
    // the map is read again after a MOVED: from then on the new owner is asked first
    wait("the map names the new owner", || {
        let before = rejected();
        check(&old);
        rejected() == before
    });
    assert_eq!(on(from), 0);
}

/// 5,000 checks of one key at once from one thread, with the default deadline (50 ms)
/// and `on_error: open`: the last of them wait in this process far longer than 50 ms
/// before their turn on the connection, with Redis answering all the while. That is not
/// Redis failing: every check is decided by Redis, exactly the limit is admitted. (On the
/// redis crate's cluster client, whose response timeout counted from the hand-over, the
/// later checks fell back and were admitted.)
#[test]
fn checks_queued_in_a_busy_client_are_decided_by_redis() {
    let nodes = Cluster::start();
    let l = Limiter::from_json(&nodes.config(
        50,
        r#"{"api": {"algorithm":"fixed_window","limit":100,"window":"1h"}}"#,
    ))
    .unwrap();
    let p = l.policy("api").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // connected, the map read and every script loaded on every primary before the burst
    rt.block_on(l.connect(Duration::from_secs(5))).unwrap();
    for n in &nodes {
        for (name, _, sha) in shardlimit::scripts::all() {
            let there: Vec<bool> = redis::cmd("SCRIPT")
                .arg("EXISTS")
                .arg(&sha)
                .query(&mut n.conn())
                .unwrap();
            assert_eq!(there, [true], "{name} on node {}", n.port);
        }
    }
    let n = 5_000;
    let t0 = Instant::now();
    let all = rt.block_on(futures_util::future::join_all(
        (0..n).map(|_| l.check("one-key", &p, 1)),
    ));
    let took = t0.elapsed();
    let (mut allowed, mut fallbacks, mut errors) = (0, 0, 0);
    for r in all {
        match r {
            Ok(d) => {
                allowed += u64::from(d.allowed);
                fallbacks += u64::from(d.source == Source::Fallback);
            }
            Err(_) => errors += 1,
        }
    }
    eprintln!("{n} checks in {took:?}: admitted {allowed}, fallbacks {fallbacks}, errors {errors}");
    // (the last ones waited longer than the deadline, or the test shows nothing)
    assert!(took > Duration::from_millis(100), "took {took:?}");
    assert_eq!((allowed, fallbacks, errors), (100, 0, 0));
}
