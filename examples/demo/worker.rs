//! The Rust worker of `make demo` (see `examples/demo/README.md`): sends a fixed number of
//! checks over a shared set of (policy, key) pairs and prints one JSON line with what was
//! admitted. The Python, Node and Go workers do exactly the same.
//!
//! ```text
//! shardlimit-demo-worker --config CONFIG.json [--requests 2400] [--concurrency 16]
//!     [--keys 8] [--policies billing,demo_daily,demo_burst] [--instance 0]
//!     [--threads 1] [--barrier]
//! ```
//!
//! Check `j` goes to pair `(j + 7 * instance) % pairs`, pairs being every policy × keys
//! `user:0..keys`. `--barrier` waits for standard input to close before sending (the demo
//! starts every worker, then releases them together). Progress goes to stderr as
//! `progress DONE/TOTAL` lines. `--threads N` (the in-memory demo) runs N workers as
//! concurrent task groups of this one multi-threaded process sharing one limiter, printing
//! one JSON line each.

use serde_json::{json, Map, Value};
use shardlimit::{Limiter, Source};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

struct Args {
    config: Option<String>,
    requests: u64,
    concurrency: usize,
    keys: usize,
    policies: Vec<String>,
    instance: u64,
    threads: u64,
    barrier: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        config: None,
        requests: 2400,
        concurrency: 16,
        keys: 8,
        policies: vec!["billing".into(), "demo_daily".into(), "demo_burst".into()],
        instance: 0,
        threads: 1,
        barrier: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |s: String| s.parse::<u64>().map_err(|_| format!("not a number: {s:?}"));
        match flag.as_str() {
            "--config" => a.config = Some(val()?),
            "--requests" => a.requests = num(val()?)?,
            "--concurrency" => a.concurrency = num(val()?)?.max(1) as usize,
            "--keys" => a.keys = num(val()?)?.max(1) as usize,
            "--policies" => a.policies = val()?.split(',').map(String::from).collect(),
            "--instance" => a.instance = num(val()?)?,
            "--threads" => a.threads = num(val()?)?.max(1),
            "--barrier" => a.barrier = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

#[derive(Default)]
struct Tally {
    allowed: u64,
    denied: u64,
    fallback: u64,
    errors: u64,
    per_key: BTreeMap<String, u64>,
}

async fn run_one(
    limiter: Limiter,
    pairs: Arc<Vec<(String, String)>>,
    args: Arc<Args>,
    instance: u64,
    progress: Arc<AtomicU64>,
) -> Value {
    let next = Arc::new(AtomicU64::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (limiter, pairs, args) = (limiter.clone(), pairs.clone(), args.clone());
        let (next, tally, progress) = (next.clone(), tally.clone(), progress.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let j = next.fetch_add(1, Ordering::Relaxed);
                if j >= args.requests {
                    break;
                }
                let (policy, key) = &pairs[((j + 7 * instance) % pairs.len() as u64) as usize];
                let r = limiter.check_by_name(key, policy, 1).await;
                {
                    let mut t = tally.lock().unwrap();
                    match r {
                        Ok(d) if matches!(d.source, Source::Fallback | Source::LocalFallback) => {
                            t.fallback += 1
                        }
                        Ok(d) if d.allowed => {
                            t.allowed += 1;
                            *t.per_key.entry(format!("{policy}/{key}")).or_default() += 1;
                        }
                        Ok(_) => t.denied += 1,
                        Err(e) => {
                            if t.errors == 0 {
                                eprintln!("rust worker: {e}");
                            }
                            t.errors += 1;
                        }
                    }
                }
                progress.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("a worker task panicked");
    }
    let t = tally.lock().unwrap();
    let mut per_key = Map::new();
    for (policy, key) in pairs.iter() {
        let k = format!("{policy}/{key}");
        per_key.insert(k.clone(), json!(t.per_key.get(&k).copied().unwrap_or(0)));
    }
    json!({
        "language": "rust",
        "instance": instance,
        "engine": if limiter.is_redis() { "redis" } else { "memory" },
        "sent": args.requests,
        "allowed": t.allowed,
        "denied": t.denied,
        "fallback": t.fallback,
        "errors": t.errors,
        "elapsed_ms": started.elapsed().as_millis() as u64,
        "per_key": per_key,
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => Arc::new(a),
        Err(e) => {
            eprintln!("shardlimit-demo-worker: {e}");
            return ExitCode::from(2);
        }
    };
    let limiter = match &args.config {
        Some(p) => Limiter::from_config_file(p),
        None => Limiter::from_env(),
    };
    let limiter = match limiter {
        Ok(l) => l,
        Err(e) => {
            eprintln!("shardlimit-demo-worker: {e}");
            return ExitCode::from(2);
        }
    };
    for p in &args.policies {
        // an unknown policy fails now; the peek also opens the shard connections
        let checked = match limiter.policy(p) {
            Ok(policy) => limiter.peek("demo:unused", &policy).await.map(|_| ()),
            Err(e) => Err(e),
        };
        if let Err(e) = checked {
            eprintln!("shardlimit-demo-worker: {e}");
            return ExitCode::from(2);
        }
    }
    let pairs: Arc<Vec<(String, String)>> = Arc::new(
        args.policies
            .iter()
            .flat_map(|p| (0..args.keys).map(move |k| (p.clone(), format!("user:{k}"))))
            .collect(),
    );
    eprintln!("ready");
    if args.barrier {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    }
    let total = args.requests * args.threads;
    let progress = Arc::new(AtomicU64::new(0));
    let reporter = {
        let progress = progress.clone();
        tokio::spawn(async move {
            loop {
                let done = progress.load(Ordering::Relaxed);
                eprintln!("progress {done}/{total}");
                if done >= total {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        })
    };
    let mut runs = Vec::new();
    for i in 0..args.threads {
        runs.push(tokio::spawn(run_one(
            limiter.clone(),
            pairs.clone(),
            args.clone(),
            args.instance + i,
            progress.clone(),
        )));
    }
    let mut out = std::io::stdout().lock();
    for r in runs {
        let v = r.await.expect("a worker panicked");
        let _ = writeln!(out, "{v}");
    }
    let _ = reporter.await;
    ExitCode::SUCCESS
}
