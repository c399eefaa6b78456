//! The shared vectors in tests/vectors, replayed on both engines: the in-memory engine and
//! a real Redis, each with an injected clock. The Redis side is replayed three times, one
//! for each way a check reaches a script: async calls (the pipelined connection), blocking
//! calls (`*_blocking`, the blocking connection) and batch calls (each check issued in one
//! burst with a peek of its key, each `batch` step as one burst: one batch script call per
//! algorithm, counted). Every replay must produce exactly the expected results.
//!
//! The format is documented at the top of `tests/vectors/algorithms.json`. After adding
//! steps, `SHARDLIMIT_BLESS=1 cargo test -p shardlimit --test vectors` writes the in-memory
//! engine's results as their expectations, once all three Redis replays agree with it:
//! review the diff (a vector's worth is that someone checked it).

mod support;

use serde_json::{json, Value};
use shardlimit::{
    Config, Decision, Layer, Lease, Limiter, ManualClock, Policy, Reservation, Source,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The decision vectors: every file is replayed by every engine and binding.
const DECISION_FILES: [&str; 6] = [
    "algorithms.json",
    "plans.json",
    "precision.json",
    "shadow.json",
    "settle.json",
    "overrides.json",
];

fn path(name: &str) -> String {
    format!("{}/../tests/vectors/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn load(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path(name)).unwrap()).unwrap()
}

/// How a replay reaches its engine.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Memory,
    RedisAsync,
    RedisBlocking,
    RedisBatch,
}

/// A decision as the vectors write it.
fn expect_of(d: &Decision) -> Value {
    let mut v = json!({
        "allowed": d.allowed,
        "limit": d.limit,
        "remaining": d.remaining,
        "reset_after_us": d.reset_after.as_micros() as u64,
        "retry_after_us": d.retry_after.map(|r| r.as_micros() as u64),
        "delay_us": d.delay.as_micros() as u64,
        "policy": &*d.policy,
        "layer": d.layer,
    });
    // shadow.json: written only when true, so algorithms.json has no such field and a
    // shadow denial where none is expected (or none where one is) still differs
    if d.shadow_denied {
        v["shadow_denied"] = json!(true);
    }
    if let Some(i) = d.limit_index {
        // multi-limit policies (plans.json): which limit decided, and every window as
        // the headers list them
        v["limit_index"] = json!(i);
        let (_, policy) = d
            .headers()
            .into_iter()
            .find(|(h, _)| *h == "RateLimit-Policy")
            .expect("RateLimit-Policy");
        v["rate_limit_policy"] = json!(policy);
    }
    v
}

use support::{in_order, BoxFut};
type CallResult = shardlimit::Result<(Decision, Option<Lease>)>;

struct Replay<'a> {
    mode: Mode,
    server: Option<&'a support::RedisServer>,
}

/// One check, peek or acquire of a step (or of a `batch` step's items).
#[derive(Clone)]
struct Call {
    op: String,
    key: String,
    policy: Policy,
    cost: u64,
    /// a check with the per-call shadow option (`"shadow": true`)
    shadow: bool,
}

impl Call {
    fn of(step: &Value, policies: &HashMap<String, Policy>, at: &str) -> Call {
        let op = step["op"].as_str().unwrap().to_string();
        let name = step["policy"]
            .as_str()
            .unwrap_or_else(|| panic!("{at}: no policy"));
        // a check under a plan (plans.json): the policy as the plan has it
        let planned = step["plan"].as_str().map(|plan| format!("{plan}/{name}"));
        let name = planned.as_deref().unwrap_or(name);
        let cost = match op.as_str() {
            "check" => step["cost"].as_u64(),
            "acquire" => step["units"].as_u64(),
            "peek" => Some(1),
            other => panic!("{at}: op {other:?} cannot be a check (or a batch item)"),
        };
        Call {
            op,
            key: step["key"].as_str().unwrap().to_string(),
            policy: policies
                .get(name)
                .unwrap_or_else(|| panic!("{at}: unknown policy {name:?}"))
                .clone(),
            cost: cost.unwrap_or_else(|| panic!("{at}: no cost/units")),
            shadow: step["shadow"].as_bool().unwrap_or(false),
        }
    }

    fn future(&self, l: &Limiter) -> BoxFut<CallResult> {
        let (l, key, p, cost) = (l.clone(), self.key.clone(), self.policy.clone(), self.cost);
        match self.op.as_str() {
            "check" if self.shadow => {
                Box::pin(async move { l.check_shadow(&key, &p, cost).await.map(|d| (d, None)) })
            }
            "check" => Box::pin(async move { l.check(&key, &p, cost).await.map(|d| (d, None)) }),
            "peek" => Box::pin(async move { l.peek(&key, &p).await.map(|d| (d, None)) }),
            _ => Box::pin(async move { l.acquire(&key, &p, cost).await }),
        }
    }

    fn blocking(&self, l: &Limiter) -> CallResult {
        match self.op.as_str() {
            "check" if self.shadow => l
                .check_shadow_blocking(&self.key, &self.policy, self.cost)
                .map(|d| (d, None)),
            "check" => l
                .check_blocking(&self.key, &self.policy, self.cost)
                .map(|d| (d, None)),
            "peek" => l.peek_blocking(&self.key, &self.policy).map(|d| (d, None)),
            _ => l.acquire_blocking(&self.key, &self.policy, self.cost),
        }
    }
}

impl Replay<'_> {
    fn limiter(&self, policies: &Value) -> (Limiter, Arc<ManualClock>) {
        self.limiter_of(&json!({ "policies": policies }))
    }

    /// A limiter of a case's config: its `policies`, and its `plans` and
    /// `default_algorithm` when it has them (plans.json).
    fn limiter_of(&self, case: &Value) -> (Limiter, Arc<ManualClock>) {
        let clock = ManualClock::new(0);
        let mut cfg = json!({ "policies": case["policies"] });
        for k in ["plans", "default_algorithm"] {
            if let Some(v) = case.get(k) {
                cfg[k] = v.clone();
            }
        }
        let limiter = match self.server {
            None => Limiter::new(Config::from_value(&cfg).unwrap()).unwrap(),
            Some(server) => {
                // a fresh key space per case
                redis::cmd("FLUSHALL").exec(&mut server.conn()).unwrap();
                let mut full: Value =
                    serde_json::from_str(&support::config(&[server], "{}")).unwrap();
                for (k, v) in cfg.as_object().unwrap() {
                    full[k] = v.clone();
                }
                Limiter::from_json(&full.to_string()).unwrap()
            }
        };
        let limiter = limiter.with_clock(clock.clone()).unwrap();
        if self.mode == Mode::RedisBatch {
            // connect the pipe, so that a burst's first check does not wait for it
            let l = limiter.clone();
            let warm = shardlimit::Limit::concurrency(1, Duration::from_secs(60));
            let p = Policy::new("warm", warm).unwrap();
            clock.set_us(1);
            limiter
                .block_on(async move { l.peek("warm", &p).await })
                .unwrap();
        }
        (limiter, clock)
    }

    fn script_calls(&self) -> u64 {
        self.server.unwrap().script_calls()
    }

    /// `calls` issued together on the I/O runtime; checks that they went as one batch
    /// script call per algorithm.
    fn burst(&self, l: &Limiter, calls: &[Call], at: &str) -> Vec<CallResult> {
        let futs: Vec<BoxFut<CallResult>> = calls.iter().map(|c| c.future(l)).collect();
        // a check in shadow mode is a script call of its own (main_check.lua built in shadow mode)
        let shadowed = |c: &Call| c.op == "check" && (c.shadow || c.policy.shadow());
        let mut algorithms: Vec<_> = calls
            .iter()
            .filter(|c| !shadowed(c))
            .map(|c| c.policy.algorithm())
            .collect();
        algorithms.sort_by_key(|a| a.name());
        algorithms.dedup();
        let expected_calls = algorithms.len() + calls.iter().filter(|c| shadowed(c)).count();
        let before = self.script_calls();
        let (tx, rx) = std::sync::mpsc::channel();
        l.spawner().unwrap().unwrap().spawn(async move {
            let _ = tx.send(in_order(futs).await);
        });
        let out = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{at}: the burst did not finish in 10 s"));
        let calls_made = self.script_calls() - before;
        assert_eq!(
            calls_made,
            expected_calls as u64,
            "{at}: {} checks of {} algorithms took {calls_made} script calls",
            calls.len(),
            algorithms.len()
        );
        out
    }

    /// The results of `calls` (one step's, or a batch's), one after another or together.
    fn decide(&self, l: &Limiter, calls: &[Call], batch: bool, at: &str) -> Vec<CallResult> {
        let multi = calls.iter().any(|c| c.policy.is_multi());
        match self.mode {
            // a multi-limit check is a layered script call, not a batch one
            Mode::RedisBatch if multi => calls.iter().map(|c| l.block_on(c.future(l))).collect(),
            Mode::RedisBatch if batch => self.burst(l, calls, at),
            Mode::RedisBatch => {
                // the check with a peek of its key after it, in one batch call
                assert_eq!(calls.len(), 1);
                let c = &calls[0];
                let peek = Call {
                    op: "peek".into(),
                    key: c.key.clone(),
                    policy: c.policy.clone(),
                    cost: 1,
                    shadow: false,
                };
                let mut out = self.burst(l, &[c.clone(), peek], at);
                out.truncate(1);
                out
            }
            Mode::RedisAsync => calls.iter().map(|c| l.block_on(c.future(l))).collect(),
            Mode::Memory | Mode::RedisBlocking => calls.iter().map(|c| c.blocking(l)).collect(),
        }
    }

    /// The document with every expectation replaced by what this replay observed.
    fn observe(&self, doc: &Value) -> Value {
        let mut out = doc.clone();
        let source = if self.mode == Mode::Memory {
            Source::Memory
        } else {
            Source::Redis
        };
        for case in out["cases"].as_array_mut().unwrap() {
            let name = case["name"].as_str().unwrap().to_string();
            let (limiter, clock) = self.limiter_of(case);
            let names: Vec<String> = case["policies"]
                .as_object()
                .unwrap_or_else(|| panic!("{name}: no policies"))
                .keys()
                .cloned()
                .collect();
            let mut policies: HashMap<String, Policy> = names
                .iter()
                .map(|n| (n.clone(), limiter.policy(n).unwrap()))
                .collect();
            for plan in case["plans"].as_object().into_iter().flat_map(|p| p.keys()) {
                for n in &names {
                    let p = limiter.plan_policy(plan, n).unwrap();
                    policies.insert(format!("{plan}/{n}"), p);
                }
            }
            let mut leases: HashMap<String, Lease> = HashMap::new();
            let mut reservations: HashMap<String, Reservation> = HashMap::new();
            for (i, step) in case["steps"].as_array_mut().unwrap().iter_mut().enumerate() {
                let at = format!("{:?}: {name}, step {i}", self.mode);
                clock.set_us(
                    step["t_us"]
                        .as_u64()
                        .unwrap_or_else(|| panic!("{at}: no t_us")),
                );
                let op = step["op"].as_str().unwrap_or("").to_string();
                let mut decided = |results: Vec<CallResult>, steps: Vec<&mut Value>| {
                    for (r, s) in results.into_iter().zip(steps) {
                        let (d, lease) = r.unwrap_or_else(|e| panic!("{at}: {e}"));
                        assert_eq!(d.source, source, "{at}: {d:?}");
                        s["expect"] = expect_of(&d);
                        match (s.get("lease_as"), lease) {
                            (Some(tag), Some(lease)) => {
                                leases.insert(tag.as_str().unwrap().to_string(), lease);
                            }
                            (Some(tag), None) => {
                                panic!("{at}: lease_as {tag} on an acquire that was denied")
                            }
                            _ => {}
                        }
                    }
                };
                match op.as_str() {
                    "check" | "peek" | "acquire" => {
                        let call = Call::of(step, &policies, &at);
                        let r = self.decide(&limiter, &[call], false, &at);
                        decided(r, vec![step]);
                    }
                    "batch" => {
                        let items = step["items"].as_array_mut().unwrap();
                        let calls: Vec<Call> = items
                            .iter()
                            .map(|it| Call::of(it, &policies, &at))
                            .collect();
                        let r = self.decide(&limiter, &calls, true, &at);
                        decided(r, items.iter_mut().collect());
                    }
                    "release" => {
                        let tag = step["lease"].as_str().unwrap();
                        let lease = leases
                            .get(tag)
                            .unwrap_or_else(|| panic!("{at}: no lease {tag:?} was taken"))
                            .clone();
                        let released = if self.mode == Mode::RedisBlocking || self.server.is_none()
                        {
                            limiter.release_blocking(&lease)
                        } else {
                            let l = limiter.clone();
                            limiter.block_on(async move { l.release(&lease).await })
                        };
                        step["expect_released"] =
                            json!(released.unwrap_or_else(|e| panic!("{at}: {e}")));
                    }
                    "reset" => {
                        let mut as_peek = step.clone();
                        as_peek["op"] = json!("peek");
                        let call = Call::of(&as_peek, &policies, &at);
                        let r = if self.mode == Mode::RedisBlocking || self.server.is_none() {
                            limiter.reset_blocking(&call.key, &call.policy)
                        } else {
                            let l = limiter.clone();
                            limiter.block_on(async move { l.reset(&call.key, &call.policy).await })
                        };
                        r.unwrap_or_else(|e| panic!("{at}: {e}"));
                    }
                    "check_all" => {
                        let layers: Vec<Layer> = step["layers"]
                            .as_array()
                            .unwrap_or_else(|| panic!("{at}: no layers"))
                            .iter()
                            .map(|l| {
                                let c = Call::of(
                                    &json!({"op": "check", "key": l["key"],
                                        "policy": l["policy"], "cost": l["cost"]}),
                                    &policies,
                                    &at,
                                );
                                Layer::new(c.key, &c.policy, c.cost)
                            })
                            .collect();
                        let r = if self.mode == Mode::RedisBlocking || self.server.is_none() {
                            limiter.check_all_blocking(&layers)
                        } else {
                            let l = limiter.clone();
                            limiter.block_on(async move { l.check_all(&layers).await })
                        };
                        decided(vec![r.map(|d| (d, None))], vec![step]);
                    }
                    "shadow_report" => {
                        let policy = step["policy"].as_str().unwrap().to_string();
                        let top = step["top"].as_u64().map(|n| n as usize);
                        let r = if self.mode == Mode::RedisBlocking || self.server.is_none() {
                            limiter.shadow_report_blocking(&policy, top)
                        } else {
                            let l = limiter.clone();
                            limiter.block_on(async move { l.shadow_report(&policy, top).await })
                        };
                        step["expect_report"] = r.unwrap_or_else(|e| panic!("{at}: {e}")).to_json();
                    }
                    "charge" | "refund" | "reserve" => {
                        let mut as_check = step.clone();
                        as_check["op"] = json!("check");
                        let c = Call::of(&as_check, &policies, &at);
                        let on_thread = self.mode == Mode::RedisBlocking || self.server.is_none();
                        let l = limiter.clone();
                        let r = match (op.as_str(), on_thread) {
                            ("charge", true) => l
                                .charge_blocking(&c.key, &c.policy, c.cost)
                                .map(|d| (d, None)),
                            ("refund", true) => l
                                .refund_blocking(&c.key, &c.policy, c.cost)
                                .map(|d| (d, None)),
                            (_, true) => l.reserve_blocking(&c.key, &c.policy, c.cost),
                            ("charge", false) => limiter.block_on(async move {
                                l.charge(&c.key, &c.policy, c.cost).await.map(|d| (d, None))
                            }),
                            ("refund", false) => limiter.block_on(async move {
                                l.refund(&c.key, &c.policy, c.cost).await.map(|d| (d, None))
                            }),
                            (_, false) => limiter.block_on(async move {
                                l.reserve(&c.key, &c.policy, c.cost).await
                            }),
                        };
                        let (d, reservation) = r.unwrap_or_else(|e| panic!("{at}: {e}"));
                        assert_eq!(d.source, source, "{at}: {d:?}");
                        step["expect"] = expect_of(&d);
                        match (step.get("reserve_as"), reservation) {
                            (Some(tag), Some(r)) => {
                                reservations.insert(tag.as_str().unwrap().to_string(), r);
                            }
                            (Some(tag), None) => {
                                panic!("{at}: reserve_as {tag} on a reserve that was denied")
                            }
                            _ => {}
                        }
                    }
                    "settle" => {
                        let tag = step["reservation"].as_str().unwrap();
                        let r = reservations
                            .get(tag)
                            .unwrap_or_else(|| panic!("{at}: no reservation {tag:?} was made"))
                            .clone();
                        let actual = step["actual"]
                            .as_u64()
                            .unwrap_or_else(|| panic!("{at}: no actual"));
                        let d = if self.mode == Mode::RedisBlocking || self.server.is_none() {
                            limiter.settle_blocking(&r, actual)
                        } else {
                            let l = limiter.clone();
                            limiter.block_on(async move { l.settle(&r, actual).await })
                        };
                        let d = d.unwrap_or_else(|e| panic!("{at}: {e}"));
                        assert_eq!(d.source, source, "{at}: {d:?}");
                        step["expect"] = expect_of(&d);
                    }
                    "set_override" => {
                        let (l, key, policy) = (
                            limiter.clone(),
                            step["key"].as_str().unwrap().to_string(),
                            step["policy"].as_str().unwrap().to_string(),
                        );
                        let limit = step["limit"].as_str().unwrap().to_string();
                        let ttl = step.get("ttl_ms").map(|t| {
                            Duration::from_millis(
                                t.as_u64().unwrap_or_else(|| panic!("{at}: ttl_ms")),
                            )
                        });
                        let r = if self.mode == Mode::RedisBlocking || self.server.is_none() {
                            l.set_override_blocking(&key, &policy, &limit, ttl)
                        } else {
                            limiter.block_on(async move {
                                l.set_override(&key, &policy, &limit, ttl).await
                            })
                        };
                        r.unwrap_or_else(|e| panic!("{at}: {e}"));
                    }
                    "delete_override" => {
                        let (l, key, policy) = (
                            limiter.clone(),
                            step["key"].as_str().unwrap().to_string(),
                            step["policy"].as_str().unwrap().to_string(),
                        );
                        let r = if self.mode == Mode::RedisBlocking || self.server.is_none() {
                            l.delete_override_blocking(&key, &policy)
                        } else {
                            limiter.block_on(async move { l.delete_override(&key, &policy).await })
                        };
                        step["expect_deleted"] = json!(r.unwrap_or_else(|e| panic!("{at}: {e}")));
                    }
                    other => panic!("{at}: unknown op {other:?}"),
                }
            }
        }
        out
    }
}

/// The first difference between the expectations of `want` and `got`, named.
fn assert_same(want: &Value, got: &Value, mode: Mode, file: &str) {
    let (w, g) = (
        want["cases"].as_array().unwrap(),
        got["cases"].as_array().unwrap(),
    );
    for (wc, gc) in w.iter().zip(g) {
        for (i, (ws, gs)) in wc["steps"]
            .as_array()
            .unwrap()
            .iter()
            .zip(gc["steps"].as_array().unwrap())
            .enumerate()
        {
            assert_eq!(
                ws, gs,
                "{file}, {mode:?}: {}, step {i}: expected (left) and observed (right) differ",
                wc["name"]
            );
        }
    }
}

/// Ops a step may have; every replay must run every one of them.
const OPS: [&str; 14] = [
    "check",
    "peek",
    "acquire",
    "release",
    "reset",
    "check_all",
    "batch",
    "charge",
    "refund",
    "reserve",
    "settle",
    "shadow_report",
    "set_override",
    "delete_override",
];

/// Steps in all; every op is there on every algorithm it applies to.
fn census(doc: &Value, file: &str) -> usize {
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut steps = 0;
    for case in doc["cases"].as_array().unwrap() {
        // (a policy may be a rate string or a multi-limit object: plans.json)
        let algo = |p: &Value| {
            case["policies"][p.as_str().unwrap()]["algorithm"]
                .as_str()
                .unwrap_or("multi")
                .to_string()
        };
        for step in case["steps"].as_array().unwrap() {
            steps += 1;
            let op = step["op"].as_str().unwrap().to_string();
            assert!(OPS.contains(&op.as_str()), "unknown op {op}");
            let algos: Vec<String> = match op.as_str() {
                "check_all" => step["layers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| algo(&l["policy"]))
                    .collect(),
                "batch" => step["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| algo(&l["policy"]))
                    .collect(),
                "release" => vec!["concurrency".into()],
                "settle" => vec![settled_algo(case, step)],
                _ => vec![algo(&step["policy"])],
            };
            for a in algos {
                if !seen.contains(&(op.clone(), a.clone())) {
                    seen.push((op.clone(), a));
                }
            }
        }
    }
    if file == "settle.json" {
        for a in [
            "fixed_window",
            "sliding_window",
            "sliding_log",
            "token_bucket",
            "leaky_bucket",
        ] {
            for op in ["charge", "refund", "reserve", "settle", "check"] {
                assert!(
                    seen.contains(&(op.to_string(), a.to_string())),
                    "{file}: no {op} step on {a}"
                );
            }
        }
        return steps;
    }
    if file != "algorithms.json" {
        // (the other files hold the cases of one feature each)
        return steps;
    }
    for a in [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "leaky_bucket",
        "concurrency",
    ] {
        for op in ["check", "peek", "reset", "check_all", "batch"] {
            if (op == "check" || op == "check_all") && a == "concurrency" {
                // an error (check and check_all take units no lease gives back): acquire
                // is the check (core/tests/layered_concurrency.rs)
                continue;
            }
            assert!(
                seen.contains(&(op.to_string(), a.to_string())),
                "no {op} step on {a}"
            );
        }
    }
    for op in ["acquire", "release"] {
        assert!(seen.contains(&(op.to_string(), "concurrency".to_string())));
    }
    steps
}

/// The algorithm of the policy a `settle` step's reservation was made under.
fn settled_algo(case: &Value, step: &Value) -> String {
    let tag = &step["reservation"];
    let reserve = case["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["op"] == "reserve" && &s["reserve_as"] == tag)
        .unwrap_or_else(|| panic!("no reserve step with reserve_as {tag}"));
    // (a multi-limit policy: a rate string or an object of `limits`)
    case["policies"][reserve["policy"].as_str().unwrap()]["algorithm"]
        .as_str()
        .unwrap_or("multi")
        .to_string()
}

/// overrides.json: both override ops, and a check or acquire under an override on every
/// algorithm.
fn overrides_census(doc: &Value) {
    let mut seen: Vec<String> = Vec::new();
    for case in doc["cases"].as_array().unwrap() {
        let mut set = false;
        for step in case["steps"].as_array().unwrap() {
            let op = step["op"].as_str().unwrap();
            assert!(OPS.contains(&op), "unknown op {op}");
            seen.push(op.to_string());
            set |= op == "set_override";
            if set && matches!(op, "check" | "acquire") {
                let p = step["policy"].as_str().unwrap();
                seen.push(
                    case["policies"][p]["algorithm"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                );
            }
        }
    }
    for want in [
        "set_override",
        "delete_override",
        "batch",
        "peek",
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "leaky_bucket",
        "concurrency",
    ] {
        assert!(seen.iter().any(|s| s == want), "overrides.json: no {want}");
    }
}

#[test]
fn memory_engine_matches_vectors() {
    for file in DECISION_FILES {
        let doc = load(file);
        let least = if file == "algorithms.json" { 100 } else { 20 };
        assert!(census(&doc, file) > least, "{file}: too few steps");
        if file == "overrides.json" {
            overrides_census(&doc);
        }
        let got = Replay {
            mode: Mode::Memory,
            server: None,
        }
        .observe(&doc);
        if std::env::var_os("SHARDLIMIT_BLESS").is_some() {
            // only when Redis, on each path, agrees
            let server = support::RedisServer::start();
            warm_up_scripts(&server);
            for mode in [Mode::RedisAsync, Mode::RedisBlocking, Mode::RedisBatch] {
                let redis = Replay {
                    mode,
                    server: Some(&server),
                }
                .observe(&doc);
                assert_same(&got, &redis, mode, file);
            }
            let mut text = String::new();
            write_json(&got, 0, &mut text);
            std::fs::write(path(file), text + "\n").unwrap();
            continue;
        }
        assert_same(&doc, &got, Mode::Memory, file);
    }
}

/// The vectors' layout: keys in the order a reader wants them (documentation first, a step's
/// op and time first, an expectation's verdict first), objects of plain values on one line,
/// a step's inputs on one line and each of its expectations on a line of its own.
fn write_json(v: &Value, indent: usize, out: &mut String) {
    const ORDER: [&str; 36] = [
        "description",
        "format",
        "name",
        "default_algorithm",
        "policies",
        "plans",
        "algorithm",
        "limit",
        "window",
        "capacity",
        "refill_per_sec",
        "leak_per_sec",
        "max",
        "lease_ttl",
        "op",
        "t_us",
        "key",
        "policy",
        "plan",
        "cost",
        "units",
        "lease_as",
        "reserve_as",
        "reservation",
        "actual",
        "lease",
        "expect_released",
        "ttl_ms",
        "expect_deleted",
        "layers",
        "items",
        "expect",
        "cases",
        "hex",
        "accepted",
        "steps",
    ];
    const DECISION: [&str; 8] = [
        "allowed",
        "limit",
        "remaining",
        "reset_after_us",
        "retry_after_us",
        "delay_us",
        "policy",
        "layer",
    ];
    let plain = |v: &Value| !(v.is_object() || v.is_array());
    let pad = " ".repeat(indent);
    match v {
        Value::Object(m) => {
            let order: &[&str] = if m.contains_key("allowed") {
                &DECISION
            } else {
                &ORDER
            };
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_by_key(|k| (order.iter().position(|o| *o == k.as_str()), (*k).clone()));
            // unknown keys last
            keys.sort_by_key(|k| !order.contains(&k.as_str()));
            let field = |k: &str, out: &mut String, indent: usize| {
                out.push_str(&Value::from(k).to_string());
                out.push_str(": ");
                write_json(&m[k], indent, out);
            };
            let (flat, nested): (Vec<&String>, Vec<&String>) =
                keys.iter().partition(|k| plain(&m[k.as_str()]));
            let one_level = nested.iter().all(|k| {
                m[k.as_str()]
                    .as_object()
                    .is_some_and(|o| o.values().all(plain))
            });
            if one_level && !flat.is_empty() {
                // a step: its inputs, then each expectation on a line of its own
                out.push('{');
                for (i, k) in flat.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    field(k, out, indent);
                }
                for k in &nested {
                    out.push_str(",\n");
                    out.push_str(&pad);
                    out.push_str("  ");
                    field(k, out, indent + 2);
                }
                out.push('}');
                return;
            }
            out.push_str("{\n");
            for (i, k) in keys.iter().enumerate() {
                out.push_str(&pad);
                out.push(' ');
                field(k, out, indent + 1);
                out.push_str(if i + 1 < keys.len() { ",\n" } else { "\n" });
            }
            out.push_str(&pad);
            out.push('}');
        }
        Value::Array(a) if a.is_empty() => out.push_str("[]"),
        Value::Array(a) => {
            out.push_str("[\n");
            for (i, v) in a.iter().enumerate() {
                out.push_str(&pad);
                out.push(' ');
                write_json(v, indent + 1, out);
                out.push_str(if i + 1 < a.len() { ",\n" } else { "\n" });
            }
            out.push_str(&pad);
            out.push(']');
        }
        v => out.push_str(&v.to_string()),
    }
}

/// Loads the single, the batch and the shadow script of every algorithm (a script's first call would
/// see NOSCRIPT and go again, which the count of script calls would see).
fn warm_up_scripts(server: &support::RedisServer) {
    let replay = Replay {
        mode: Mode::RedisBatch,
        server: Some(server),
    };
    let policies = json!({
        "fw": {"algorithm": "fixed_window", "limit": 1, "window": "1s"},
        "sw": {"algorithm": "sliding_window", "limit": 1, "window": "1s"},
        "sl": {"algorithm": "sliding_log", "limit": 1, "window": "1s"},
        "tb": {"algorithm": "token_bucket", "capacity": 1, "refill_per_sec": 1},
        "lb": {"algorithm": "leaky_bucket", "capacity": 1, "leak_per_sec": 1},
        "cc": {"algorithm": "concurrency", "max": 1, "lease_ttl": "1s"},
    });
    let (l, _) = replay.limiter(&policies);
    for name in ["fw", "sw", "sl", "tb", "lb", "cc"] {
        let p = l.policy(name).unwrap();
        l.peek_blocking("warm", &p).unwrap();
        if name != "cc" {
            // and its shadow script (main_check.lua built in shadow mode)
            l.check_shadow_blocking("warm", &p, 1).unwrap();
        }
        let peeks: Vec<BoxFut<shardlimit::Result<Decision>>> = (0..2)
            .map(|_| {
                let (l, p) = (l.clone(), p.clone());
                Box::pin(async move { l.peek("warm", &p).await }) as BoxFut<_>
            })
            .collect();
        let (tx, rx) = std::sync::mpsc::channel();
        l.spawner().unwrap().unwrap().spawn(async move {
            let _ = tx.send(in_order(peeks).await);
        });
        for r in rx.recv_timeout(Duration::from_secs(10)).unwrap() {
            r.unwrap();
        }
    }
}

fn redis_replay(mode: Mode) {
    let server = support::RedisServer::start();
    if mode == Mode::RedisBatch {
        warm_up_scripts(&server);
    }
    for file in DECISION_FILES {
        let doc = load(file);
        let got = Replay {
            mode,
            server: Some(&server),
        }
        .observe(&doc);
        assert_same(&doc, &got, mode, file);
    }
}

#[test]
fn redis_engine_async_matches_vectors() {
    redis_replay(Mode::RedisAsync);
}

#[test]
fn redis_engine_blocking_matches_vectors() {
    redis_replay(Mode::RedisBlocking);
}

#[test]
fn redis_engine_batch_scripts_match_vectors() {
    redis_replay(Mode::RedisBatch);
}

/// The per-key window offset function, pinned (`precision.json`, `offsets`).
#[test]
fn window_offsets_match_vectors() {
    let doc = load("precision.json");
    let offsets = doc["offsets"].as_array().unwrap();
    assert!(offsets.len() >= 64);
    for o in offsets {
        let key = o["key"].as_str().unwrap();
        let w = o["window_us"].as_u64().unwrap();
        let want = o["offset_us"].as_u64().unwrap();
        assert_eq!(shardlimit::window_offset_us(key, w), want, "{key:?} {w}");
    }
}

#[test]
fn routing_matches_vectors() {
    let doc = load("routing.json");
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 64);
    for case in cases {
        let key = case["key"].as_str().unwrap();
        assert_eq!(
            shardlimit::routing::routing_key(key),
            case["routing_key"].as_str().unwrap()
        );
        assert_eq!(
            format!("{:016x}", shardlimit::routing::key_hash(key)),
            case["xxh64"].as_str().unwrap(),
            "{key}"
        );
        for (n, want) in case["shard_for"].as_array().unwrap().iter().enumerate() {
            assert_eq!(
                shardlimit::routing::shard_index(key, n as u32 + 1) as u64,
                want.as_u64().unwrap(),
                "key {key:?} among {} shards",
                n + 1
            );
        }
    }
}

/// The one key rule (tests/vectors/keys.json): every binding accepts and rejects the same keys.
#[test]
fn key_rule_vectors() {
    let doc = load("keys.json");
    let limiter = Limiter::memory();
    let policy = Policy::new(
        "p",
        shardlimit::Limit::fixed_window(10, std::time::Duration::from_secs(60)),
    )
    .unwrap();
    let mut seen = 0;
    for case in doc["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let hex = case["hex"].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let accepted = case["accepted"].as_bool().unwrap();
        match String::from_utf8(bytes) {
            // a &str cannot hold it: rejected by the type, as the case expects
            Err(_) => assert!(!accepted, "{name}: not UTF-8 yet expected to be accepted"),
            Ok(key) => {
                let got = limiter.check_blocking(&key, &policy, 1);
                match (accepted, got) {
                    (true, Ok(_)) => {}
                    (false, Err(e)) => {
                        assert!(e.is_invalid_argument(), "{name}: {e}");
                        assert!(e.to_string().contains("`key`"), "{name}: {e}");
                    }
                    (want, got) => panic!("{name}: expected accepted={want}, got {got:?}"),
                }
            }
        }
        seen += 1;
    }
    assert!(seen >= 10);
}
