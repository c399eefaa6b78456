//! Exact under load, Redis healthy: the process's CPUs are saturated by busy processes the
//! test starts (and kills by PID), Redis answers, `on_error` is `open` (the default), so a
//! check that fell back would show as an admission over the limit. Every shape must admit
//! exactly the limit, with no fallback and no error: a check waiting for a CPU, for the I/O
//! thread or for its turn in the pipeline is not Redis failing (see
//! `core/src/transport/sansio.rs`). Bounded: each shape stops after its checks are decided.
//! `#[ignore]`d: `scripts/test-overload.sh` runs them alone, one at a time.

mod support;

use shardlimit::{Limiter, Source};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::RedisServer;

/// The load: on a machine of N CPUs, Redis keeps the last CPU to itself (it is healthy:
/// it answers as fast as it can), and this test's thread, every thread it starts (the
/// limiter's I/O thread, the callers) and N+1 busy processes share the others, which they
/// saturate. The busy processes are killed by PID when this drops. (One CPU: nothing is
/// pinned, Redis shares it.)
struct Load(Vec<Child>);

#[cfg(target_os = "linux")]
fn pin(pid: u32, cpus: std::ops::Range<usize>) {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes within it; the set is
    // valid for the call.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        let r = libc::sched_setaffinity(pid as libc::pid_t, std::mem::size_of_val(&set), &set);
        assert_eq!(
            r,
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
    }
}

impl Load {
    fn start(redis: &RedisServer) -> Load {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        #[cfg(target_os = "linux")]
        if n >= 2 {
            pin(redis.pid(), n - 1..n);
            pin(0, 0..n - 1); // this thread, and what it starts from now on
        }
        // Redis before anything else on its CPU, where the test may raise it (root, or
        // CAP_SYS_NICE): on a machine that other work shares, Redis starved of CPU would be
        // silent for real, and that is a failing shard, not the load this test is about
        #[cfg(unix)]
        // SAFETY: setpriority on a child's process id; when it fails nothing changes.
        let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, redis.pid() as libc::id_t, -10) };
        #[cfg(not(target_os = "linux"))]
        let _ = redis;
        let kids = (0..n + 1)
            .map(|_| {
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .expect("a busy process")
            })
            .collect();
        Load(kids)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for k in &mut self.0 {
            let _ = k.kill();
            let _ = k.wait();
        }
    }
}

const LIMIT: u64 = 100;

/// The default config (`timeout_ms` 50, `on_error` open) with one policy of `LIMIT` an hour.
fn limiter(s: &RedisServer, prefix: &str) -> Limiter {
    Limiter::from_json(&format!(
        r#"{{"key_prefix": "{prefix}", "shards":[{{"name":"s0","url":"{}"}}],
            "policies": {{"api": {{"algorithm": "fixed_window", "limit": {LIMIT}, "window": "1h"}}}}}}"#,
        s.url()
    ))
    .unwrap()
}

/// What a shape's checks came to.
#[derive(Debug, Default)]
struct Tally {
    allowed: AtomicU64,
    denied: AtomicU64,
    fallback: AtomicU64,
    errors: AtomicU64,
}

impl Tally {
    fn add(&self, r: shardlimit::Result<shardlimit::Decision>) {
        match r {
            Ok(d) => {
                if d.source == Source::Fallback {
                    self.fallback.fetch_add(1, Ordering::Relaxed);
                }
                if d.allowed {
                    self.allowed.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.denied.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                if self.errors.fetch_add(1, Ordering::Relaxed) < 3 {
                    eprintln!("error: {e}");
                }
            }
        }
    }

    fn assert_exact(&self, shape: &str, total: u64, took: Duration) {
        let (a, d, f, e) = (
            self.allowed.load(Ordering::Relaxed),
            self.denied.load(Ordering::Relaxed),
            self.fallback.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        );
        eprintln!("{shape}: {total} checks in {took:?}: admitted {a} (limit {LIMIT}), denied {d}, fallbacks {f}, errors {e}");
        assert_eq!(
            (a, f, e, a + d),
            (LIMIT, 0, 0, total),
            "{shape}: admitted {a} of a limit of {LIMIT}, {f} fallbacks, {e} errors"
        );
    }
}

#[test]
#[ignore = "run alone by scripts/test-overload.sh: it saturates the CPUs"]
fn many_threads_on_one_key_through_the_blocking_path() {
    let s = RedisServer::start();
    let l = limiter(&s, "blocking:");
    let p = l.policy("api").unwrap();
    let _load = Load::start(&s);
    let tally = Arc::new(Tally::default());
    let (threads, each) = (64u64, 40u64);
    let t0 = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let (l, p, tally) = (&l, &p, Arc::clone(&tally));
            scope.spawn(move || {
                for _ in 0..each {
                    tally.add(l.check_blocking("one-key", p, 1));
                }
            });
        }
    });
    tally.assert_exact("blocking, 64 threads x 40", threads * each, t0.elapsed());
}

#[test]
#[ignore = "run alone by scripts/test-overload.sh: it saturates the CPUs"]
fn twenty_thousand_concurrent_checks_in_one_process() {
    let s = RedisServer::start();
    let l = limiter(&s, "async:");
    let p = l.policy("api").unwrap();
    let _load = Load::start(&s);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // connected and the scripts loaded before the load starts (as a service's first
    // requests would find them)
    rt.block_on(l.connect(Duration::from_secs(5))).unwrap();
    let tally = Tally::default();
    let n = 20_000u64;
    let t0 = Instant::now();
    let all = rt.block_on(futures_util::future::join_all(
        (0..n).map(|_| l.check("one-key", &p, 1)),
    ));
    for r in all {
        tally.add(r);
    }
    tally.assert_exact("async, 20,000 at once", n, t0.elapsed());
}

#[test]
#[ignore = "run alone by scripts/test-overload.sh: it saturates the CPUs"]
fn many_tasks_on_the_io_thread_from_a_multi_thread_runtime() {
    let s = RedisServer::start();
    let l = Arc::new(limiter(&s, "tasks:"));
    let p = l.policy("api").unwrap();
    let _load = Load::start(&s);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let tally = Arc::new(Tally::default());
    let (tasks, each) = (200u64, 25u64);
    let t0 = Instant::now();
    rt.block_on(async {
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (l, p, tally) = (Arc::clone(&l), p.clone(), Arc::clone(&tally));
                tokio::spawn(async move {
                    for _ in 0..each {
                        tally.add(l.check("one-key", &p, 1).await);
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
    });
    tally.assert_exact("async, 200 tasks x 25", tasks * each, t0.elapsed());
}
