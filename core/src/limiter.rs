//! The limiter handle: the public API every binding wraps.

use crate::algo::Outcome;
use crate::clock::{Clock, MonotonicClock};
use crate::config::Config;
use crate::decision::{Decision, Source};
use crate::error::{Error, Result};
use crate::events::{Event, Subscriber, Subscribers};
use crate::expiry::ExpiringMap;
use crate::limit::{validate_scale, Algorithm, Compiled, Limit, OnError, Policy, PolicyInner};
use crate::memory::{blocked_outcome, LayerReq, LayeredRaw, MemoryEngine, Raw};
use crate::metrics::{LatencySnapshot, MetricsSnapshot};
use crate::redis_engine::{Mode, RedisEngine};
use crate::routing::shard_index;
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use std::future::Future;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;
/// How long a limiter trusts its own memory of a block before asking Redis again.
pub const BLOCK_CACHE_TTL: Duration = Duration::from_secs(1);
/// `retry_after` of a decision denied by `on_error: closed`.
pub const CLOSED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A held unit (or units) of a concurrency limit. Release it with [`Limiter::release`];
/// if it never is, it expires after the policy's `lease_ttl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub key: String,
    pub policy: String,
    pub id: String,
    pub units: u64,
}

/// One layer of a layered check: `cost` units of `policy` for `key`.
#[derive(Debug, Clone)]
pub struct Layer {
    pub key: String,
    pub policy: Policy,
    pub cost: u64,
}

impl Layer {
    pub fn new(key: impl Into<String>, policy: &Policy, cost: u64) -> Layer {
        Layer {
            key: key.into(),
            policy: policy.clone(),
            cost,
        }
    }
}

/// Stops watching a config file when dropped.
#[derive(Debug)]
pub struct ConfigWatcher {
    stop: Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ConfigWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// A block-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    pub reason: String,
    /// Time left; `None` for a permanent block.
    pub remaining: Option<Duration>,
}

/// A function from a health signal the application supplies (dependency p99 latency in
/// seconds, error rate, queue depth...) to a scale factor in (0, 1].
pub type ScaleHook = Arc<dyn Fn(f64) -> f64 + Send + Sync>;

/// A [`ScaleHook`] for latency: full limits while `signal` (seconds) is at or under
/// `target`, proportionally less above it (`target / signal`), never below `min_factor`.
pub fn latency_scale(target: Duration, min_factor: f64) -> ScaleHook {
    let t = target.as_secs_f64();
    let min = min_factor.clamp(f64::MIN_POSITIVE, 1.0);
    Arc::new(move |signal: f64| {
        if signal <= t || signal.is_nan() {
            1.0
        } else {
            (t / signal).clamp(min, 1.0)
        }
    })
}

#[derive(Debug)]
enum Engine {
    Memory(Arc<MemoryEngine>),
    Redis(Arc<RedisEngine>),
}

/// Starts futures on a limiter's I/O runtime (from [`Limiter::spawner`]).
#[derive(Clone)]
pub struct Spawner(Arc<crate::redis_engine::RtState>);

impl std::fmt::Debug for Spawner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Spawner")
    }
}

impl Spawner {
    /// Starts `fut` on the I/O runtime, from any thread. Futures spawned while earlier ones
    /// wait to start are started together, so the Redis commands of a burst of calls from
    /// an event loop leave in one write, and the I/O thread wakes once for them.
    pub fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        self.0.submit(Box::pin(fut));
    }
}

/// A Redis check after its preamble: decided already (a cached block), or the script to run.
enum Plan {
    Decided(Decision),
    Redis {
        eff: Compiled,
        cost: u64,
        shard: u32,
    },
}

/// Units reserved from Redis for local admission.
#[derive(Debug, Clone, Copy)]
struct LocalBatch {
    /// A reservation for this key is in flight: other callers check Redis directly
    /// instead of reserving too, so one instance holds at most one batch per key.
    fetching: bool,
    units: u64,
    expires_at: u64,
    global_remaining: u64,
    reset_at: u64,
}

/// What a reload swaps atomically: the config and the engine built from it. In-flight
/// checks finish on the view they started with.
#[derive(Debug)]
struct View {
    config: Arc<Config>,
    engine: Engine,
    /// After a reshard: where moved keys' state still lives, until when.
    handoff: Option<Handoff>,
}

/// State of a reshard: for a while after the shard list changed, the first check of a key
/// whose shard changed carries its state over from the old shard.
struct Handoff {
    old: Arc<RedisEngine>,
    /// Monotonic µs until which moved keys are carried over.
    until: u64,
    /// "policy\0key" pairs already carried over by this limiter.
    done: Mutex<std::collections::HashSet<String>>,
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff")
            .field("old", &self.old)
            .field("until", &self.until)
            .finish()
    }
}

/// What [`Limiter::reload`] changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadReport {
    /// True when the shard list (or prefix, deadline) changed and new connections were made.
    pub engine_changed: bool,
    /// True when moved keys are being carried over from their old shards.
    pub handoff: bool,
    pub policies_added: Vec<String>,
    pub policies_removed: Vec<String>,
    pub policies_changed: Vec<String>,
}

struct Inner {
    view: ArcSwap<View>,
    clock: Option<Arc<dyn Clock>>,
    lease_seq: AtomicU64,
    lease_salt: u64,
    /// The in-process limiter of `on_error: local`.
    fallback: MemoryEngine,
    subscribers: Arc<Subscribers>,
    global_scale: AtomicU64,
    scale_hook: Mutex<Option<ScaleHook>>,
    /// Ad-hoc policies seen by this limiter, for metrics.
    adhoc: Mutex<Vec<Policy>>,
    /// key → (cached until, block ends at or None = permanent), clock µs
    /// key → block ends at or None = permanent, expiring when cached until (clock µs)
    block_cache: Mutex<ExpiringMap<String, Option<u64>>>,
    block_cache_len: AtomicUsize,
    /// local admission batches, expiring with the batch
    local: Mutex<ExpiringMap<String, LocalBatch>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("view", &self.view.load())
            .finish()
    }
}

/// A rate limiter: a config, an engine (Redis shards or in-memory) and, for Redis, a
/// runtime with one connection per shard. Cheap to clone; clones share everything.
/// Thread-safe.
#[derive(Debug, Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

impl Limiter {
    /// A limiter on the in-memory engine with no named policies.
    pub fn memory() -> Limiter {
        Limiter::new(Config::default()).expect("the default config is valid")
    }

    /// A limiter for a validated config: Redis shards when it has `shards`, else in-memory.
    /// Does not connect: connections are made on first use.
    pub fn new(config: Config) -> Result<Limiter> {
        let subscribers = Arc::new(Subscribers::default());
        let engine = Limiter::build_engine(&config, subscribers.clone())?;
        let salt = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        for p in config.policies.values() {
            p.0.registered.store(true, Ordering::Relaxed);
        }
        Ok(Limiter {
            inner: Arc::new(Inner {
                view: ArcSwap::from_pointee(View {
                    config: Arc::new(config),
                    engine,
                    handoff: None,
                }),
                clock: None,
                lease_seq: AtomicU64::new(0),
                lease_salt: salt,
                fallback: MemoryEngine::default(),
                subscribers,
                global_scale: AtomicU64::new(1.0f64.to_bits()),
                scale_hook: Mutex::new(None),
                adhoc: Mutex::new(Vec::new()),
                block_cache: Mutex::new(ExpiringMap::default()),
                block_cache_len: AtomicUsize::new(0),
                local: Mutex::new(ExpiringMap::default()),
            }),
        })
    }

    fn build_engine(config: &Config, subscribers: Arc<Subscribers>) -> Result<Engine> {
        let (prefix, timeout, maxlen) = (
            config.key_prefix.clone(),
            config.timeout,
            config.events_stream_maxlen,
        );
        let e = match (&config.shards, &config.cluster) {
            (Some(shards), _) => {
                RedisEngine::new(shards.clone(), prefix, timeout, subscribers, maxlen)?
            }
            (None, Some(nodes)) => {
                let tls = config.cluster_tls.clone();
                RedisEngine::cluster(nodes.clone(), tls, prefix, timeout, subscribers, maxlen)?
            }
            (None, None) => return Ok(Engine::Memory(Arc::new(MemoryEngine::default()))),
        };
        e.set_spin_wait(config.spin_wait);
        Ok(Engine::Redis(Arc::new(e)))
    }

    /// Loads a JSON config file.
    pub fn from_config_file(path: impl AsRef<std::path::Path>) -> Result<Limiter> {
        Limiter::new(Config::from_file(path)?)
    }

    /// Parses a JSON config string.
    pub fn from_json(text: &str) -> Result<Limiter> {
        Limiter::new(Config::from_json(text)?)
    }

    /// Uses `$SHARDLIMIT_CONFIG` (a path or inline JSON); the in-memory engine when unset.
    pub fn from_env() -> Result<Limiter> {
        match Config::from_env()? {
            Some(c) => Limiter::new(c),
            None => Ok(Limiter::memory()),
        }
    }

    /// The same limiter deciding with `clock` instead of the engine's own time source
    /// (Redis `TIME`, or the monotonic clock). For deterministic tests and replays.
    /// Must be called before the limiter is cloned or used.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Result<Limiter> {
        let inner = Arc::get_mut(&mut self.inner).ok_or_else(|| {
            Error::invalid(
                "clock",
                "with_clock must be called before the limiter is shared",
            )
        })?;
        inner.clock = Some(clock);
        Ok(self)
    }

    /// The config in force (a reload swaps it).
    pub fn config(&self) -> Arc<Config> {
        self.view().config.clone()
    }

    /// True when decisions are made by Redis shards, false for the in-memory engine.
    pub fn is_redis(&self) -> bool {
        matches!(self.view().engine, Engine::Redis(_))
    }

    /// Keys currently held by the in-memory engine (`None` for Redis): memory is bounded
    /// because expired state is swept out.
    pub fn memory_keys(&self) -> Option<usize> {
        match &self.view().engine {
            Engine::Memory(m) => Some(m.len()),
            Engine::Redis(_) => None,
        }
    }

    /// The named policy from the config.
    pub fn policy(&self, name: &str) -> Result<Policy> {
        self.view()
            .config
            .policies
            .get(name)
            .cloned()
            .ok_or_else(|| Error::UnknownPolicy(name.to_string()))
    }

    /// The shard `key` routes to: (index, name). `None` on the in-memory engine.
    pub fn route(&self, key: &str) -> Option<(u32, String)> {
        match &self.view().engine {
            Engine::Redis(r) => {
                let i = shard_index(key, r.shards.len() as u32);
                Some((i, r.shards[i as usize].name.clone()))
            }
            Engine::Memory(_) => None,
        }
    }

    /// Calls `subscriber` for every event: denials, blocks, fallbacks, circuit changes.
    pub fn subscribe(&self, subscriber: Subscriber) {
        self.inner.subscribers.add(subscriber);
    }

    // ----- reload ----------------------------------------------------------------------

    /// Swaps in a new, already validated config atomically: checks in flight finish on the
    /// old shards and policies, new checks use the new ones, none fails. Connections are
    /// kept when the shard list is unchanged. When it changed, keys whose shard changed
    /// carry their state over from the old shard on their first check during
    /// `reshard_handoff` (default 10 minutes), so a client at its limit stays limited.
    pub fn reload(&self, config: Config) -> Result<ReloadReport> {
        let old = self.view();
        let same_backend = old.config.shards == config.shards
            && old.config.cluster == config.cluster
            && old.config.cluster_tls == config.cluster_tls
            && old.config.key_prefix == config.key_prefix
            && old.config.timeout == config.timeout
            && old.config.events_stream_maxlen == config.events_stream_maxlen;
        let engine = if same_backend {
            match &old.engine {
                Engine::Memory(m) => Engine::Memory(m.clone()),
                Engine::Redis(r) => {
                    // the connections stay; the spinning follows the new config
                    r.set_spin_wait(config.spin_wait);
                    Engine::Redis(r.clone())
                }
            }
        } else {
            Limiter::build_engine(&config, self.inner.subscribers.clone())?
        };
        let handoff = match (&old.engine, &engine) {
            (Engine::Redis(o), Engine::Redis(n)) if !Arc::ptr_eq(o, n) => {
                let moved = o
                    .shards
                    .iter()
                    .map(|s| &s.url)
                    .ne(n.shards.iter().map(|s| &s.url));
                moved.then(|| Handoff {
                    old: o.clone(),
                    until: MonotonicClock.now_us() + config.reshard_handoff.as_micros() as u64,
                    done: Mutex::new(Default::default()),
                })
            }
            // a reload that keeps the backend keeps an ongoing handoff
            _ if same_backend => old.handoff.as_ref().map(|h| Handoff {
                old: h.old.clone(),
                until: h.until,
                done: Mutex::new(h.done.lock().clone()),
            }),
            _ => None,
        };
        for p in config.policies.values() {
            p.0.registered.store(true, Ordering::Relaxed);
        }
        let names = |c: &Config| {
            c.policies
                .keys()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>()
        };
        let (before, after) = (names(&old.config), names(&config));
        let report = ReloadReport {
            engine_changed: !same_backend,
            handoff: handoff.is_some(),
            policies_added: after.difference(&before).cloned().collect(),
            policies_removed: before.difference(&after).cloned().collect(),
            policies_changed: after
                .intersection(&before)
                .filter(|n| {
                    let (a, b) = (&old.config.policies[*n], &config.policies[*n]);
                    a.limit() != b.limit()
                        || a.on_error() != b.on_error()
                        || a.auto_block() != b.auto_block()
                        || a.local_admission() != b.local_admission()
                })
                .cloned()
                .collect(),
        };
        self.inner.view.store(Arc::new(View {
            config: Arc::new(config),
            engine,
            handoff,
        }));
        tracing::info!(?report, "shardlimit: config reloaded");
        Ok(report)
    }

    /// Reads, validates and applies a config file. A bad file is rejected with the reason
    /// and the old config stays in force.
    pub fn reload_from_file(&self, path: impl AsRef<std::path::Path>) -> Result<ReloadReport> {
        self.reload(Config::from_file(path)?)
    }

    /// Watches `path` (polling its modification time every `every`) and reloads when it
    /// changes; a bad new config is logged and ignored. Stops when the returned watcher is
    /// dropped, or when every clone of this limiter is gone.
    pub fn watch_config(
        &self,
        path: impl Into<std::path::PathBuf>,
        every: Duration,
    ) -> ConfigWatcher {
        let path = path.into();
        let weak = Arc::downgrade(&self.inner);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let mtime = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let mut last = mtime(&path);
        let handle = std::thread::Builder::new()
            .name("shardlimit-config-watch".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    std::thread::sleep(every);
                    let Some(inner) = weak.upgrade() else { return };
                    let now = mtime(&path);
                    if now != last {
                        last = now;
                        let limiter = Limiter { inner };
                        match limiter.reload_from_file(&path) {
                            Ok(_) => {}
                            Err(e) => tracing::error!(path = %path.display(), error = %e, "shardlimit: new config rejected, keeping the old one"),
                        }
                    }
                }
            })
            .ok();
        ConfigWatcher { stop, handle }
    }

    // ----- scale -----------------------------------------------------------------------

    /// Scales limits by `factor` (0 < factor ≤ 1): every policy when `policies` is empty,
    /// else the named ones. Decisions and headers report the effective limit.
    pub fn set_scale(&self, factor: f64, policies: &[&str]) -> Result<()> {
        validate_scale(factor)?;
        if policies.is_empty() {
            self.inner
                .global_scale
                .store(factor.to_bits(), Ordering::Relaxed);
            return Ok(());
        }
        let found = policies
            .iter()
            .map(|n| self.policy(n))
            .collect::<Result<Vec<_>>>()?;
        for p in found {
            p.set_scale(factor)?;
        }
        Ok(())
    }

    /// The global scale factor (policies may have their own on top).
    pub fn scale(&self) -> f64 {
        f64::from_bits(self.inner.global_scale.load(Ordering::Relaxed))
    }

    /// Installs the hook [`Limiter::observe_health`] uses to turn a health signal into the
    /// global scale factor (see [`latency_scale`]).
    pub fn set_scale_hook(&self, hook: ScaleHook) {
        *self.inner.scale_hook.lock() = Some(hook);
    }

    /// Feeds a health signal to the scale hook and applies the factor it returns (clamped
    /// to (0, 1]). Returns the factor now in force.
    pub fn observe_health(&self, signal: f64) -> Result<f64> {
        let hook = self.inner.scale_hook.lock().clone().ok_or_else(|| {
            Error::invalid("scale_hook", "no scale hook installed (set_scale_hook)")
        })?;
        let f = hook(signal);
        let f = if f.is_nan() { 1.0 } else { f.clamp(1e-6, 1.0) };
        self.set_scale(f, &[])?;
        Ok(f)
    }

    // ----- metrics ---------------------------------------------------------------------

    /// Counters per policy and the Redis latency histogram.
    pub fn metrics(&self) -> MetricsSnapshot {
        let mut policies: Vec<_> = self
            .view()
            .config
            .policies
            .iter()
            .map(|(n, p)| p.0.counters.snapshot(n))
            .collect();
        policies.extend(
            self.inner
                .adhoc
                .lock()
                .iter()
                .map(|p| p.0.counters.snapshot(p.name())),
        );
        let (redis_latency, events_dropped) = match &self.view().engine {
            Engine::Redis(r) => (
                r.latency.snapshot(),
                r.events_dropped.load(Ordering::Relaxed),
            ),
            Engine::Memory(_) => (LatencySnapshot::default(), 0),
        };
        MetricsSnapshot {
            policies,
            redis_latency,
            events_dropped,
        }
    }

    // ----- checks ----------------------------------------------------------------------

    /// Checks `cost` units of `policy` for `key`. A denied check consumes nothing.
    /// A cost larger than the limit is denied with no `retry_after`.
    ///
    /// On a concurrency policy this acquires a lease that is never released explicitly:
    /// it frees itself after `lease_ttl`. Use [`Limiter::acquire`] to release early.
    ///
    /// For Redis this must be awaited inside a Tokio runtime with timers enabled; from
    /// anywhere else use [`Limiter::check_blocking`].
    pub async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision> {
        if policy.algorithm() == Algorithm::Concurrency {
            return self.acquire(key, policy, cost).await.map(|(d, _)| d);
        }
        self.run(key, policy, cost, false, "").await
    }

    /// Checks a policy of the config by name.
    pub async fn check_named(&self, policy: &str, key: &str, cost: u64) -> Result<Decision> {
        let p = self.policy(policy)?;
        self.check(key, &p, cost).await
    }

    /// Checks an ad-hoc limit (its policy name is [`Limit::id`]).
    pub async fn check_limit(&self, key: &str, limit: &Limit, cost: u64) -> Result<Decision> {
        let p = Policy::try_from(limit.clone())?;
        self.check(key, &p, cost).await
    }

    /// The state of `key` under `policy` without consuming: `allowed` says whether a check
    /// of one unit would pass now, `remaining` how many units are available.
    pub async fn peek(&self, key: &str, policy: &Policy) -> Result<Decision> {
        self.run(key, policy, 1, true, "").await
    }

    /// Acquires `units` of a concurrency policy. Returns the decision and, when allowed,
    /// the lease to release.
    pub async fn acquire(
        &self,
        key: &str,
        policy: &Policy,
        units: u64,
    ) -> Result<(Decision, Option<Lease>)> {
        let id = self.lease_id();
        let d = self.run(key, policy, units, false, &id).await?;
        let lease =
            (d.allowed && matches!(d.source, Source::Redis | Source::Memory)).then(|| Lease {
                key: key.to_string(),
                policy: policy.name().to_string(),
                id,
                units,
            });
        Ok((d, lease))
    }

    /// Releases a lease from [`Limiter::acquire`]. Returns false when it was no longer held
    /// (released before, or expired).
    pub async fn release(&self, lease: &Lease) -> Result<bool> {
        let policy = self.policy(&lease.policy)?;
        self.release_with(&policy, lease).await
    }

    /// Releases a lease of an ad-hoc concurrency policy.
    pub async fn release_with(&self, policy: &Policy, lease: &Lease) -> Result<bool> {
        validate_key(&lease.key)?;
        validate_lease(policy, lease)?;
        match &self.view().engine {
            Engine::Memory(m) => Ok(m.release(
                &policy.0.name,
                &lease.key,
                &lease.id,
                lease.units,
                self.now(),
            )),
            Engine::Redis(r) => {
                let shard = shard_index(&lease.key, r.shards.len() as u32) as usize;
                let now = self.now_override();
                r.release(&policy.0, &lease.key, shard, &lease.id, lease.units, now)
                    .await
            }
        }
    }

    /// Forgets `key`'s state under `policy`: its full budget is back.
    pub async fn reset(&self, key: &str, policy: &Policy) -> Result<()> {
        validate_key(key)?;
        self.inner
            .local
            .lock()
            .remove(&local_key(&policy.0.name, key));
        match &self.view().engine {
            Engine::Memory(m) => {
                m.reset(&policy.0.name, key);
                Ok(())
            }
            Engine::Redis(r) => {
                let shard = shard_index(key, r.shards.len() as u32) as usize;
                r.reset(&policy.0, key, shard, self.now_override()).await
            }
        }
    }

    /// A layered check: allowed only if every layer allows; when any layer denies, no
    /// layer consumes. Layers on one shard are decided atomically in one script call;
    /// several shards are asked concurrently (one round trip each) and what was admitted
    /// is refunded when another shard's layer denies. The decision describes the layer
    /// that denied (with the longest `retry_after` of all denying layers), or, when all
    /// allow, the layer with the fewest units remaining; `layer` is its index.
    pub async fn check_all(&self, layers: &[Layer]) -> Result<Decision> {
        if layers.is_empty() {
            return Err(Error::invalid("layers", "must not be empty"));
        }
        if layers.len() > 64 {
            return Err(Error::invalid(
                "layers",
                format!("at most 64 layers, got {}", layers.len()),
            ));
        }
        tokio::task::consume_budget().await; // see Limiter::run
        let global = self.global_scale();
        let mut effs = Vec::with_capacity(layers.len());
        let mut leases = Vec::with_capacity(layers.len());
        for (i, l) in layers.iter().enumerate() {
            validate_key(&l.key)
                .map_err(|e| Error::invalid(format!("layers[{i}].key"), e.to_string()))?;
            if l.cost == 0 {
                return Err(Error::invalid(
                    format!("layers[{i}].cost"),
                    "must be at least 1",
                ));
            }
            if layers[..i]
                .iter()
                .any(|o| o.key == l.key && o.policy.name() == l.policy.name())
            {
                return Err(Error::invalid(
                    format!("layers[{i}]"),
                    format!(
                        "duplicate layer ({}, {}): merge their costs into one layer",
                        l.key,
                        l.policy.name()
                    ),
                ));
            }
            self.register(&l.policy);
            let eff = l.policy.0.effective(global);
            effs.push(eff);
            leases.push(if eff.algorithm == Algorithm::Concurrency {
                self.lease_id()
            } else {
                String::new()
            });
        }
        let reqs: Vec<LayerReq<'_>> = layers
            .iter()
            .enumerate()
            .map(|(i, l)| LayerReq {
                scope: &l.policy.0.name,
                compiled: effs[i],
                key: &l.key,
                cost: l.cost.min(effs[i].limit + 1),
                lease: &leases[i],
                auto_block: l.policy.0.auto_block,
            })
            .collect();
        let view = self.view();
        let (raw, source, shards) = match &view.engine {
            Engine::Memory(m) => (
                m.check_layers(&reqs, self.now()),
                Source::Memory,
                vec![None; layers.len()],
            ),
            Engine::Redis(r) => {
                for (i, l) in layers.iter().enumerate() {
                    if let Some(ttl) = self.cached_block(&l.key) {
                        let mut d = self.decision(
                            &l.policy.0,
                            &effs[i],
                            blocked_outcome(ttl),
                            Source::Block,
                            None,
                        );
                        d.layer = Some(i);
                        self.count(&l.policy.0, &d);
                        return Ok(d);
                    }
                }
                let n = r.shards.len() as u32;
                let shard_of: Vec<usize> = layers
                    .iter()
                    .map(|l| shard_index(&l.key, n) as usize)
                    .collect();
                if let Some(h) = &view.handoff {
                    for (i, l) in layers.iter().enumerate() {
                        self.carry_over(h, r, &l.policy.0, &l.key, shard_of[i])
                            .await;
                    }
                }
                let (raw, src) = self.layered_redis(r, layers, &reqs, &shard_of).await?;
                (raw, src, shard_of.iter().map(|s| Some(*s as u32)).collect())
            }
        };
        // describe the deciding layer, or the tightest one
        let idx = if raw.deciding > 0 {
            raw.deciding - 1
        } else {
            (0..layers.len())
                .min_by_key(|i| raw.outcomes[*i].remaining)
                .unwrap_or(0)
        };
        let mut o = raw.outcomes[idx];
        let source = if raw.blocked != 0 && raw.deciding > 0 {
            Source::Block
        } else {
            source
        };
        if raw.deciding > 0 && raw.blocked == 0 {
            // every denying layer must pass before the request can: wait for the slowest
            let denying: Vec<&Outcome> = raw.outcomes.iter().filter(|o| !o.allowed).collect();
            o.retry_us = if denying.iter().all(|o| o.retry_us.is_some()) {
                denying.iter().filter_map(|o| o.retry_us).max()
            } else {
                None
            };
            o.allowed = false;
        }
        let mut d = self.decision(&layers[idx].policy.0, &effs[idx], o, source, shards[idx]);
        d.layer = Some(idx);
        for (i, l) in layers.iter().enumerate() {
            let ld = if i == idx {
                d.clone()
            } else {
                self.decision(&l.policy.0, &effs[i], raw.outcomes[i], source, shards[i])
            };
            let ld = Decision {
                allowed: d.allowed,
                ..ld
            };
            self.count(&l.policy.0, &ld);
        }
        if raw.blocked != 0 {
            self.on_blocked(
                &layers[idx].policy.0,
                &layers[idx].key,
                &d,
                raw.blocked == 2,
            );
        } else if !d.allowed {
            self.on_denied(&layers[idx].policy.0, &layers[idx].key, &d);
        }
        Ok(d)
    }

    async fn layered_redis(
        &self,
        r: &Arc<RedisEngine>,
        layers: &[Layer],
        reqs: &[LayerReq<'_>],
        shard_of: &[usize],
    ) -> Result<(LayeredRaw, Source)> {
        // one script call per shard; in a Redis Cluster, per hash slot (a script's keys
        // must share a slot), so no CROSSSLOT error is possible
        let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
        let mut group_keys: Vec<u32> = Vec::new();
        for (i, s) in shard_of.iter().enumerate() {
            let gk = if r.is_cluster() {
                crate::routing::cluster_slot(&layers[i].key) as u32
            } else {
                *s as u32
            };
            match group_keys.iter().position(|g| *g == gk) {
                Some(g) => groups[g].1.push(i),
                None => {
                    group_keys.push(gk);
                    groups.push((*s, vec![i]));
                }
            }
        }
        let now = self.now_override();
        let calls = groups.iter().map(|(shard, idx)| {
            let group: Vec<(LayerReq<'_>, &str)> = idx
                .iter()
                .map(|i| (reqs[*i].clone(), layers[*i].policy.0.key_scope.as_str()))
                .collect();
            async move { r.check_layers(*shard, &group, now).await }
        });
        let results = futures_util::future::join_all(calls).await;
        let mut out = LayeredRaw {
            now: 0,
            deciding: 0,
            blocked: 0,
            outcomes: vec![blocked_outcome(None); layers.len()],
        };
        let mut source = Source::Redis;
        let mut committed: Vec<(usize, u64)> = Vec::new(); // (group, now)
        let mut first_error = None;
        for (g, res) in results.into_iter().enumerate() {
            let idx = &groups[g].1;
            match res {
                Ok(raw) => {
                    for (j, i) in idx.iter().enumerate() {
                        out.outcomes[*i] = raw.outcomes[j];
                    }
                    if raw.deciding == 0 {
                        committed.push((g, raw.now));
                    } else {
                        let i = idx[raw.deciding - 1];
                        if out.deciding == 0 || i < out.deciding - 1 {
                            out.deciding = i + 1;
                            out.blocked = raw.blocked;
                        }
                    }
                }
                Err(e) if e.is_backend() => {
                    // each failed layer is decided by its policy's on_error mode
                    source = Source::Fallback;
                    for i in idx {
                        let p = &layers[*i].policy.0;
                        let fallback = self.fallback(
                            p,
                            &reqs[*i].compiled,
                            &layers[*i].key,
                            reqs[*i].cost,
                            false,
                            e.clone(),
                        );
                        let d = match fallback {
                            Ok(d) => d,
                            // on_error: error
                            Err(e) => {
                                first_error.get_or_insert(e);
                                continue;
                            }
                        };
                        out.outcomes[*i] = Outcome {
                            allowed: d.allowed,
                            remaining: d.remaining,
                            reset_us: d.reset_after.as_micros() as u64,
                            retry_us: d.retry_after.map(|r| r.as_micros() as u64),
                            delay_us: 0,
                        };
                        if !d.allowed && (out.deciding == 0 || *i < out.deciding - 1) {
                            out.deciding = i + 1;
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if out.deciding != 0 || first_error.is_some() {
            // give back what the allowing shards admitted
            let refunds = committed.iter().map(|(g, now)| {
                let group: Vec<(LayerReq<'_>, &str)> = groups[*g]
                    .1
                    .iter()
                    .map(|i| (reqs[*i].clone(), layers[*i].policy.0.key_scope.as_str()))
                    .collect();
                let shard = groups[*g].0;
                async move {
                    if let Err(e) = r.refund(shard, &group, *now).await {
                        tracing::warn!(error = %e, "shardlimit: refund of a layered check failed; the units stay consumed");
                    }
                }
            });
            futures_util::future::join_all(refunds).await;
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok((out, source))
    }

    // ----- block list ------------------------------------------------------------------

    /// Puts `key` on the block list for `ttl` (`None`: until unblocked). Every limiter of
    /// every language sharing the shards sees it; checks of a blocked key are denied with
    /// `source = block` and the block's remaining time as `retry_after`.
    pub async fn block(&self, key: &str, ttl: Option<Duration>, reason: &str) -> Result<()> {
        validate_key(key)?;
        if let Some(t) = ttl {
            if t.is_zero() || t > Duration::from_micros(crate::limit::MAX_PERIOD_US) {
                return Err(Error::invalid(
                    "ttl",
                    "must be between 1ms and 366 days (or none for a permanent block)",
                ));
            }
        }
        if reason.len() > 1024 {
            return Err(Error::invalid("reason", "at most 1024 bytes"));
        }
        match &self.view().engine {
            Engine::Memory(m) => {
                let now = self.now();
                m.block(key, ttl.map(|t| now + t.as_micros() as u64), now, reason);
                Ok(())
            }
            Engine::Redis(r) => {
                let shard = shard_index(key, r.shards.len() as u32) as usize;
                r.block(shard, key, ttl, reason).await?;
                self.cache_block(key, ttl.map(|t| t.as_micros() as u64));
                Ok(())
            }
        }
    }

    /// Removes `key` from the block list; true when it was blocked. Other limiter instances
    /// notice within [`BLOCK_CACHE_TTL`].
    pub async fn unblock(&self, key: &str) -> Result<bool> {
        validate_key(key)?;
        self.uncache_block(key);
        match &self.view().engine {
            Engine::Memory(m) => Ok(m.unblock(key)),
            Engine::Redis(r) => {
                let shard = shard_index(key, r.shards.len() as u32) as usize;
                r.unblock(shard, key).await
            }
        }
    }

    /// The block-list entry of `key`, if it is blocked.
    pub async fn blocked(&self, key: &str) -> Result<Option<BlockInfo>> {
        validate_key(key)?;
        match &self.view().engine {
            Engine::Memory(m) => Ok(m.blocked(key, self.now()).map(|(reason, ttl)| BlockInfo {
                reason,
                remaining: ttl.map(Duration::from_micros),
            })),
            Engine::Redis(r) => {
                let shard = shard_index(key, r.shards.len() as u32) as usize;
                Ok(r.blocked(shard, key)
                    .await?
                    .map(|(reason, remaining)| BlockInfo { reason, remaining }))
            }
        }
    }

    // ----- blocking twins --------------------------------------------------------------

    /// Where bindings run async calls: `None` on the in-memory engine (its calls never
    /// wait: run them inline), else a [`Spawner`] onto this limiter's I/O runtime that
    /// batches the calls of a burst (see [`Spawner::spawn`]).
    pub fn spawner(&self) -> Result<Option<Spawner>> {
        match &self.view().engine {
            Engine::Memory(_) => Ok(None),
            Engine::Redis(r) => Ok(Some(Spawner(r.state()?))),
        }
    }

    /// Runs an async call of this limiter to completion on the calling thread. Used by the
    /// blocking API and by bindings without an async runtime. The calling thread waits at
    /// most the configured deadline for Redis.
    pub fn block_on<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        match &self.view().engine {
            // memory futures never wait: poll once on a trivial executor
            Engine::Memory(_) => poll_once(fut),
            Engine::Redis(r) => {
                let st = r.state()?;
                if tokio::runtime::Handle::try_current().is_ok() {
                    // inside someone's runtime, block_on would panic: run on ours and wait
                    let (tx, rx) = std::sync::mpsc::sync_channel(1);
                    st.runtime().spawn(async move {
                        let _ = tx.send(fut.await);
                    });
                    rx.recv()
                        .map_err(|_| Error::Internal("the I/O runtime stopped".into()))?
                } else {
                    st.runtime().block_on(fut)
                }
            }
        }
    }

    /// Blocking [`Limiter::check`].
    pub fn check_blocking(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision> {
        if policy.algorithm() != Algorithm::Concurrency {
            // the in-memory engine never waits: decide right here, no future, no runtime
            let view = self.inner.view.load();
            if let Engine::Memory(m) = &view.engine {
                return self.check_memory(m, key, policy, cost, false, "");
            }
        }
        if policy.algorithm() != Algorithm::Concurrency {
            if let Some(r) = self.run_blocking(key, policy, cost, false) {
                return r;
            }
        }
        let (me, key, policy) = (self.clone(), key.to_string(), policy.clone());
        self.block_on(async move { me.check(&key, &policy, cost).await })
    }

    /// Blocking [`Limiter::check_named`].
    pub fn check_named_blocking(&self, policy: &str, key: &str, cost: u64) -> Result<Decision> {
        let p = self.policy(policy)?;
        self.check_blocking(key, &p, cost)
    }

    /// Blocking [`Limiter::check_all`].
    pub fn check_all_blocking(&self, layers: &[Layer]) -> Result<Decision> {
        let (me, layers) = (self.clone(), layers.to_vec());
        self.block_on(async move { me.check_all(&layers).await })
    }

    /// Blocking [`Limiter::peek`].
    pub fn peek_blocking(&self, key: &str, policy: &Policy) -> Result<Decision> {
        if let Some(r) = self.run_blocking(key, policy, 1, true) {
            return r;
        }
        let (me, key, policy) = (self.clone(), key.to_string(), policy.clone());
        self.block_on(async move { me.peek(&key, &policy).await })
    }

    /// Blocking [`Limiter::acquire`].
    pub fn acquire_blocking(
        &self,
        key: &str,
        policy: &Policy,
        units: u64,
    ) -> Result<(Decision, Option<Lease>)> {
        let (me, key, policy) = (self.clone(), key.to_string(), policy.clone());
        self.block_on(async move { me.acquire(&key, &policy, units).await })
    }

    /// Blocking [`Limiter::release`].
    pub fn release_blocking(&self, lease: &Lease) -> Result<bool> {
        let (me, lease) = (self.clone(), lease.clone());
        self.block_on(async move { me.release(&lease).await })
    }

    /// Blocking [`Limiter::release_with`].
    pub fn release_with_blocking(&self, policy: &Policy, lease: &Lease) -> Result<bool> {
        let (me, policy, lease) = (self.clone(), policy.clone(), lease.clone());
        self.block_on(async move { me.release_with(&policy, &lease).await })
    }

    /// Blocking [`Limiter::reset`].
    pub fn reset_blocking(&self, key: &str, policy: &Policy) -> Result<()> {
        let (me, key, policy) = (self.clone(), key.to_string(), policy.clone());
        self.block_on(async move { me.reset(&key, &policy).await })
    }

    /// Blocking [`Limiter::block`].
    pub fn block_blocking(&self, key: &str, ttl: Option<Duration>, reason: &str) -> Result<()> {
        let (me, key, reason) = (self.clone(), key.to_string(), reason.to_string());
        self.block_on(async move { me.block(&key, ttl, &reason).await })
    }

    /// Blocking [`Limiter::unblock`].
    pub fn unblock_blocking(&self, key: &str) -> Result<bool> {
        let (me, key) = (self.clone(), key.to_string());
        self.block_on(async move { me.unblock(&key).await })
    }

    /// Blocking [`Limiter::blocked`].
    pub fn blocked_blocking(&self, key: &str) -> Result<Option<BlockInfo>> {
        let (me, key) = (self.clone(), key.to_string());
        self.block_on(async move { me.blocked(&key).await })
    }

    /// A handle to the runtime that drives this limiter's Redis connections (created on
    /// first use, re-created after fork). `None` on the in-memory engine. Bindings spawn
    /// their async calls here.
    pub fn runtime_handle(&self) -> Result<Option<tokio::runtime::Handle>> {
        match &self.view().engine {
            Engine::Redis(r) => Ok(Some(r.state()?.runtime().clone())),
            Engine::Memory(_) => Ok(None),
        }
    }

    // ----- internals -------------------------------------------------------------------

    #[inline]
    fn view(&self) -> Arc<View> {
        self.inner.view.load_full()
    }

    fn lease_id(&self) -> String {
        let n = self.inner.lease_seq.fetch_add(1, Ordering::Relaxed);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.inner.lease_salt, n, std::process::id()).hash(&mut h);
        format!("{:016x}{:x}", h.finish(), n)
    }

    /// Now, from the injected clock or the monotonic clock (µs).
    #[inline]
    fn now(&self) -> u64 {
        match &self.inner.clock {
            Some(c) => c.now_us(),
            None => MonotonicClock.now_us(),
        }
    }

    /// The time to hand Redis scripts: the injected clock, or None for the server's TIME.
    fn now_override(&self) -> Option<u64> {
        self.inner.clock.as_ref().map(|c| c.now_us())
    }

    #[inline]
    fn global_scale(&self) -> f64 {
        f64::from_bits(self.inner.global_scale.load(Ordering::Relaxed))
    }

    #[inline]
    fn register(&self, policy: &Policy) {
        if !policy.0.registered.load(Ordering::Relaxed) {
            self.register_slow(policy);
        }
    }

    #[cold]
    fn register_slow(&self, policy: &Policy) {
        if !policy.0.registered.swap(true, Ordering::Relaxed) {
            let mut adhoc = self.inner.adhoc.lock();
            if adhoc.len() < 10_000 {
                adhoc.push(policy.clone());
            }
        }
    }

    fn decision(
        &self,
        p: &PolicyInner,
        eff: &Compiled,
        o: Outcome,
        source: Source,
        shard: Option<u32>,
    ) -> Decision {
        Decision {
            allowed: o.allowed,
            limit: eff.limit,
            remaining: o.remaining,
            reset_after: Duration::from_micros(o.reset_us),
            retry_after: if o.allowed {
                None
            } else {
                o.retry_us.map(Duration::from_micros)
            },
            delay: Duration::from_micros(o.delay_us),
            policy: p.name.clone(),
            source,
            shard,
            window: Duration::from_micros(eff.window_us()),
            layer: None,
        }
    }

    #[inline]
    fn count(&self, p: &PolicyInner, d: &Decision) {
        let c = &p.counters;
        if d.allowed {
            c.allowed.fetch_add(1, Ordering::Relaxed);
        } else {
            c.denied.fetch_add(1, Ordering::Relaxed);
        }
        match d.source {
            Source::Block => {
                c.blocked.fetch_add(1, Ordering::Relaxed);
            }
            Source::Fallback => {
                c.fallback.fetch_add(1, Ordering::Relaxed);
            }
            Source::Local => {
                c.local_admitted.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    fn on_denied(&self, p: &PolicyInner, key: &str, d: &Decision) {
        let wants_stream = matches!(&self.view().engine, Engine::Redis(_))
            && self.view().config.events_stream_maxlen.is_some();
        if !self.inner.subscribers.active() && !wants_stream {
            return;
        }
        let e = Event::Denied {
            policy: p.name.clone(),
            key: key.to_string(),
            decision: d.clone(),
        };
        self.publish(key, &e);
    }

    fn on_blocked(&self, p: &PolicyInner, key: &str, d: &Decision, auto: bool) {
        self.cache_block(key, d.retry_after.map(|r| r.as_micros() as u64));
        let e = Event::Blocked {
            policy: p.name.clone(),
            key: key.to_string(),
            auto,
            retry_after: d.retry_after,
        };
        if auto {
            tracing::info!(policy = %p.name, key, "shardlimit: key blocked automatically");
        }
        self.publish(key, &e);
    }

    fn publish(&self, key: &str, e: &Event) {
        if self.inner.subscribers.active() {
            self.inner.subscribers.emit(e);
        }
        if let Engine::Redis(r) = &self.view().engine {
            r.stream(shard_index(key, r.shards.len() as u32) as usize, e);
        }
    }

    fn cached_block(&self, key: &str) -> Option<Option<u64>> {
        if self.inner.block_cache_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let now = self.now();
        let mut c = self.inner.block_cache.lock();
        c.sweep(now, |_| false);
        let r = match c.get(key) {
            Some((expires, until)) if until > now => Some(expires.map(|e| e.saturating_sub(now))),
            Some(_) => {
                c.remove(key);
                None
            }
            None => None,
        };
        self.inner.block_cache_len.store(c.len(), Ordering::Release);
        r
    }

    fn cache_block(&self, key: &str, remaining_us: Option<u64>) {
        let now = self.now();
        let cap = BLOCK_CACHE_TTL.as_micros() as u64;
        let for_us = remaining_us.map_or(cap, |r| r.min(cap));
        if for_us == 0 {
            return;
        }
        let mut c = self.inner.block_cache.lock();
        c.sweep(now, |_| false);
        c.insert(key.to_string(), remaining_us.map(|r| now + r), now + for_us);
        self.inner.block_cache_len.store(c.len(), Ordering::Release);
    }

    fn uncache_block(&self, key: &str) {
        let mut c = self.inner.block_cache.lock();
        c.remove(key);
        self.inner.block_cache_len.store(c.len(), Ordering::Release);
    }

    /// Decides with the policy's `on_error` mode after a backend failure.
    fn fallback(
        &self,
        p: &PolicyInner,
        eff: &Compiled,
        key: &str,
        cost: u64,
        peek: bool,
        e: Error,
    ) -> Result<Decision> {
        p.counters.redis_errors.fetch_add(1, Ordering::Relaxed);
        if p.on_error == OnError::Error {
            return Err(e);
        }
        let o = match p.on_error {
            // nothing was measured: no invented budget (Decision::measured)
            OnError::Open => Outcome {
                allowed: true,
                remaining: 0,
                reset_us: 0,
                retry_us: None,
                delay_us: 0,
            },
            OnError::Closed => Outcome {
                allowed: false,
                remaining: 0,
                reset_us: CLOSED_RETRY_AFTER.as_micros() as u64,
                retry_us: Some(CLOSED_RETRY_AFTER.as_micros() as u64),
                delay_us: 0,
            },
            _ => {
                let share = eff.share(self.view().config.instances);
                self.inner
                    .fallback
                    .check(
                        &p.name,
                        &share,
                        key,
                        self.now(),
                        cost.min(share.limit + 1),
                        peek,
                        "",
                        None,
                    )
                    .outcome
            }
        };
        let mut d = self.decision(p, eff, o, Source::Fallback, None);
        if p.on_error == OnError::Local {
            d.limit = eff.share(self.view().config.instances).limit;
        }
        tracing::debug!(policy = %p.name, key, error = %e, allowed = d.allowed, "shardlimit: fallback decision");
        if self.inner.subscribers.active() {
            self.inner.subscribers.emit(&Event::Fallback {
                policy: p.name.clone(),
                key: key.to_string(),
                error: e,
                allowed: d.allowed,
            });
        }
        Ok(d)
    }

    /// Validates a check's key and cost and registers its policy for metrics. Returns the
    /// limit in force and the cost to decide with: costs above the limit can never fit, and
    /// sending at most `limit + 1` keeps every script quantity an exact integer.
    #[inline]
    fn prepare(&self, key: &str, policy: &Policy, cost: u64) -> Result<(Compiled, u64)> {
        validate_key(key)?;
        if cost == 0 {
            return Err(Error::invalid("cost", "must be at least 1"));
        }
        self.register(policy);
        let eff = policy.0.effective(self.global_scale());
        Ok((eff, cost.min(eff.limit + 1)))
    }

    /// A check (or peek) on the in-memory engine: synchronous, it never waits.
    #[inline]
    fn check_memory(
        &self,
        m: &MemoryEngine,
        key: &str,
        policy: &Policy,
        cost: u64,
        peek: bool,
        lease: &str,
    ) -> Result<Decision> {
        let (eff, cost) = self.prepare(key, policy, cost)?;
        let p = &*policy.0;
        let raw = m.check(
            &p.name,
            &eff,
            key,
            self.now(),
            cost,
            peek,
            lease,
            p.auto_block.as_ref(),
        );
        let d = self.finish(p, &eff, key, raw, Source::Memory, None);
        if !peek {
            self.count(p, &d);
        }
        Ok(d)
    }

    async fn run(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        peek: bool,
        lease: &str,
    ) -> Result<Decision> {
        // A check can answer at once (in memory, from the block cache, or failing fast
        // while a shard's circuit is open), so a caller's loop of checks might never give
        // its runtime back: other tasks on it, and their timers, would starve (seen in
        // the chaos run as calls outliving their deadline by 27 s). Tokio's cooperative
        // budget makes such a loop yield now and then, as tokio's own I/O does.
        tokio::task::consume_budget().await;
        let view = self.view();
        let r = match &view.engine {
            Engine::Memory(m) => return self.check_memory(m, key, policy, cost, peek, lease),
            Engine::Redis(r) => r,
        };
        let (eff, cost, shard) = match self.plan(r, key, policy, cost)? {
            Plan::Decided(d) => return Ok(d),
            Plan::Redis { eff, cost, shard } => (eff, cost, shard),
        };
        let p = &*policy.0;
        if let Some(h) = &view.handoff {
            self.carry_over(h, r, p, key, shard as usize).await;
        }
        if let (Some(la), false, true) = (p.local_admission, peek, lease.is_empty()) {
            return self.local_admission(r, p, &eff, la, key, shard, cost).await;
        }
        let mode = if peek { Mode::Peek } else { Mode::Check };
        let raw = r
            .check(
                shard as usize,
                p,
                &eff,
                key,
                self.now_override(),
                cost,
                mode,
                lease,
            )
            .await;
        self.settle(p, &eff, key, cost, peek, shard, raw)
    }

    /// [`Limiter::run`] (without a lease) on the calling thread: the script is sent and
    /// its reply read over a blocking connection, with no hand-off to the I/O runtime.
    /// `None` when the check needs the runtime: Cluster, Sentinel or TLS shards, a reshard
    /// handoff in progress, or local admission.
    fn run_blocking(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        peek: bool,
    ) -> Option<Result<Decision>> {
        let view = self.inner.view.load();
        let Engine::Redis(r) = &view.engine else {
            return None;
        };
        let p = &*policy.0;
        if !r.blocking_capable() || view.handoff.is_some() || (p.local_admission.is_some() && !peek)
        {
            return None;
        }
        // more blocking callers than CPUs: the I/O thread batches their commands better
        let _slot = crate::blocking::OWN_IO.take()?;
        Some((|| {
            let (eff, cost, shard) = match self.plan(r, key, policy, cost)? {
                Plan::Decided(d) => return Ok(d),
                Plan::Redis { eff, cost, shard } => (eff, cost, shard),
            };
            let mode = if peek { Mode::Peek } else { Mode::Check };
            let raw = r.check_blocking(
                shard as usize,
                p,
                &eff,
                key,
                self.now_override(),
                cost,
                mode,
                "",
            );
            self.settle(p, &eff, key, cost, peek, shard, raw)
        })())
    }

    /// What a Redis check does before its script: validate, and answer from the block
    /// cache when the key is known to be blocked. Otherwise the limit, cost and shard.
    fn plan(&self, r: &RedisEngine, key: &str, policy: &Policy, cost: u64) -> Result<Plan> {
        let (eff, cost) = self.prepare(key, policy, cost)?;
        if let Some(ttl) = self.cached_block(key) {
            let p = &*policy.0;
            let d = self.decision(p, &eff, blocked_outcome(ttl), Source::Block, None);
            self.count(p, &d);
            return Ok(Plan::Decided(d));
        }
        let shard = shard_index(key, r.shards.len() as u32);
        Ok(Plan::Redis { eff, cost, shard })
    }

    /// What a Redis check does after its script: the decision from the reply, or from
    /// `on_error` when the shard failed; counted unless it was a peek.
    #[allow(clippy::too_many_arguments)]
    fn settle(
        &self,
        p: &PolicyInner,
        eff: &Compiled,
        key: &str,
        cost: u64,
        peek: bool,
        shard: u32,
        raw: Result<Raw>,
    ) -> Result<Decision> {
        let d = match raw {
            Ok(raw) => self.finish(p, eff, key, raw, Source::Redis, Some(shard)),
            Err(e) if e.is_backend() => self.fallback(p, eff, key, cost, peek, e)?,
            Err(e) => return Err(e),
        };
        if !peek {
            self.count(p, &d);
        }
        Ok(d)
    }

    fn finish(
        &self,
        p: &PolicyInner,
        eff: &Compiled,
        key: &str,
        raw: Raw,
        source: Source,
        shard: Option<u32>,
    ) -> Decision {
        if raw.blocked != 0 {
            let d = self.decision(p, eff, raw.outcome, Source::Block, shard);
            self.on_blocked(p, key, &d, raw.blocked == 2);
            let mut d = d;
            d.source = if raw.blocked == 2 {
                source
            } else {
                Source::Block
            };
            return d;
        }
        let d = self.decision(p, eff, raw.outcome, source, shard);
        if !d.allowed {
            self.on_denied(p, key, &d);
        }
        d
    }

    /// Local admission: admit from a batch reserved in Redis; reserve a new batch (one
    /// round trip) when it is used up or expired. The batch is sized from the global
    /// remaining and shrinks to the request's own cost as the limit nears. One reservation
    /// per key is in flight per limiter; meanwhile other callers are decided by Redis.
    #[allow(clippy::too_many_arguments)]
    async fn local_admission(
        &self,
        r: &Arc<RedisEngine>,
        p: &PolicyInner,
        eff: &Compiled,
        la: crate::limit::LocalAdmission,
        key: &str,
        shard: u32,
        cost: u64,
    ) -> Result<Decision> {
        let lkey = local_key(&p.name, key);
        let now = self.now();
        let reserve_from = {
            let mut map = self.inner.local.lock();
            // (a batch being reserved stays: it holds the one reservation of its key)
            map.sweep(now, |b| b.fetching);
            let b = map.get_or_insert_with(lkey.clone(), 0, || LocalBatch {
                fetching: false,
                units: 0,
                expires_at: 0,
                global_remaining: eff.limit,
                reset_at: 0,
            });
            if b.expires_at > now && b.units >= cost {
                b.units -= cost;
                let o = Outcome {
                    allowed: true,
                    remaining: b.global_remaining + b.units,
                    reset_us: b.reset_at.saturating_sub(now),
                    retry_us: None,
                    delay_us: 0,
                };
                drop(map);
                let d = self.decision(p, eff, o, Source::Local, Some(shard));
                self.count(p, &d);
                return Ok(d);
            }
            if b.fetching {
                None
            } else {
                b.fetching = true;
                Some(b.global_remaining)
            }
        };
        let (batch, mode) = match reserve_from {
            Some(remaining) => {
                let instances = self.view().config.instances.max(1) as u64;
                let batch = (remaining / (2 * instances))
                    .clamp(1, la.max_batch)
                    .max(cost);
                (batch, Mode::Grant { need: cost })
            }
            // another caller is reserving this key's next batch: decide this one in Redis
            None => (cost, Mode::Check),
        };
        let raw = r
            .check(
                shard as usize,
                p,
                eff,
                key,
                self.now_override(),
                batch,
                mode,
                "",
            )
            .await;
        let reserving = reserve_from.is_some();
        let raw = match raw {
            Ok(raw) => raw,
            Err(e) => {
                if reserving {
                    if let Some(b) = self.inner.local.lock().get_mut(&lkey) {
                        b.fetching = false;
                    }
                }
                if !e.is_backend() {
                    return Err(e);
                }
                let d = self.fallback(p, eff, key, cost, false, e)?;
                self.count(p, &d);
                return Ok(d);
            }
        };
        let mut o = raw.outcome;
        if reserving {
            let mut map = self.inner.local.lock();
            let b = map.get_or_insert_with(lkey.clone(), 0, || LocalBatch {
                fetching: false,
                units: 0,
                expires_at: 0,
                global_remaining: 0,
                reset_at: 0,
            });
            b.fetching = false;
            if raw.outcome.allowed && raw.blocked == 0 {
                let left = raw.granted.saturating_sub(cost);
                // reserved units may be used until the window they were counted in ends
                let window_left = match eff.algorithm {
                    Algorithm::FixedWindow => raw.outcome.reset_us,
                    Algorithm::SlidingWindow => raw.outcome.reset_us.saturating_sub(eff.period_us),
                    _ => u64::MAX,
                };
                if b.expires_at <= now {
                    // units of an expired batch lapse
                    b.units = 0;
                }
                b.units += left;
                b.expires_at = now + (la.max_hold.as_micros() as u64).min(window_left);
                b.global_remaining = raw.outcome.remaining;
                b.reset_at = now + raw.outcome.reset_us;
                o.remaining += b.units;
            } else {
                b.global_remaining = 0;
            }
            let expires_at = b.expires_at;
            map.set_expiry(lkey.as_str(), expires_at);
        }
        let d = self.finish(
            p,
            eff,
            key,
            Raw { outcome: o, ..raw },
            Source::Redis,
            Some(shard),
        );
        self.count(p, &d);
        Ok(d)
    }
}

impl Limiter {
    /// During a reshard handoff: if `key` now lives on another server than before, copy its
    /// state for `p` (and its block entry) from the old shard, once per limiter. The new
    /// shard keeps any state it already has. Failures are logged: the check goes on.
    async fn carry_over(
        &self,
        h: &Handoff,
        r: &Arc<RedisEngine>,
        p: &PolicyInner,
        key: &str,
        new_shard: usize,
    ) {
        if MonotonicClock.now_us() >= h.until {
            return;
        }
        let old_shard = shard_index(key, h.old.shards.len() as u32) as usize;
        if h.old.shards[old_shard].url == r.shards[new_shard].url {
            return;
        }
        let id = local_key(&p.name, key);
        if h.done.lock().contains(&id) {
            return;
        }
        let now = self.now_override();
        let moved = async {
            let items = h.old.dump_state(old_shard, p, key, now).await?;
            r.restore_state(new_shard, items).await
        };
        match moved.await {
            Ok(n) => {
                tracing::debug!(policy = %p.name, key, keys = n, "shardlimit: carried state over to the new shard");
                let mut done = h.done.lock();
                if done.len() > 1_000_000 {
                    done.clear();
                }
                done.insert(id);
            }
            Err(e) => {
                tracing::warn!(policy = %p.name, key, error = %e, "shardlimit: reshard handoff failed for this key")
            }
        }
    }
}

fn local_key(scope: &str, key: &str) -> String {
    let mut s = String::with_capacity(scope.len() + key.len() + 1);
    s.push_str(scope);
    s.push('\0');
    s.push_str(key);
    s
}

fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("key", "must not be empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::invalid(
            "key",
            format!("is {} bytes long; the maximum is {MAX_KEY_LEN}", key.len()),
        ));
    }
    // The rule every binding shares (tests/vectors/keys.json): UTF-8 (the type), no NUL.
    // A NUL would let `a\0b` under one scope collide with composite keys built of parts.
    if let Some(at) = key.bytes().position(|b| b == 0) {
        return Err(Error::invalid(
            "key",
            format!("contains a NUL byte at offset {at}; keys are UTF-8 text without NUL"),
        ));
    }
    Ok(())
}

/// A lease comes back from the caller (a binding's object, a JS literal, a C struct), so
/// it is checked before anything is built from it: a lease of a concurrency policy, `units`
/// between 1 and the policy's `max`, and an id of the form [`Limiter::lease_id`] makes.
fn validate_lease(policy: &Policy, lease: &Lease) -> Result<()> {
    if policy.algorithm() != Algorithm::Concurrency {
        return Err(Error::invalid(
            "lease.policy",
            format!("policy {} is not a concurrency policy", policy.name()),
        ));
    }
    let max = policy.0.compiled.limit;
    if lease.units == 0 || lease.units > max {
        return Err(Error::invalid(
            "lease.units",
            format!(
                "must be between 1 and the policy's max {max}, got {}",
                lease.units
            ),
        ));
    }
    let id = lease.id.as_bytes();
    if !(LEASE_ID_LEN.contains(&id.len())
        && id
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)))
    {
        return Err(Error::invalid(
            "lease.id",
            format!(
                "must be {} to {} lowercase hex digits, as acquire returns it",
                LEASE_ID_LEN.start(),
                LEASE_ID_LEN.end()
            ),
        ));
    }
    Ok(())
}

/// Lengths of the ids [`Limiter::lease_id`] makes: 16 hex digits of hash, then the
/// sequence number in hex (1 to 16 digits).
const LEASE_ID_LEN: std::ops::RangeInclusive<usize> = 17..=32;

/// Polls a future that is known never to wait (memory engine) to completion.
fn poll_once<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    use std::task::{Context, Poll, Waker};
    // unconstrained: inside a tokio task the checks' cooperative budget could run out
    // (Limiter::run), and a future polled once must not be asked to yield
    let mut fut = std::pin::pin!(tokio::task::unconstrained(fut));
    let mut cx = Context::from_waker(Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => Err(Error::Internal("in-memory call did not complete".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(spin_wait: &str) -> Config {
        // never connected: the engine connects lazily
        Config::from_json(&format!(
            r#"{{"shards":[{{"name":"a","url":"redis://127.0.0.1:1"}}],
                "spin_wait":"{spin_wait}","policies":{{}}}}"#
        ))
        .unwrap()
    }

    fn redis(l: &Limiter) -> Arc<RedisEngine> {
        match &l.view().engine {
            Engine::Redis(r) => Arc::clone(r),
            Engine::Memory(_) => panic!("a Redis config made an in-memory engine"),
        }
    }

    #[test]
    fn a_reload_that_keeps_the_connections_applies_the_new_spin_wait() {
        let l = Limiter::new(config("100us")).unwrap();
        let before = redis(&l);
        assert_eq!(before.spin_wait(), Duration::from_micros(100));
        l.reload(config("2ms")).unwrap();
        let after = redis(&l);
        assert!(
            Arc::ptr_eq(&before, &after),
            "same shards: the engine is kept"
        );
        assert_eq!(after.spin_wait(), Duration::from_millis(2));
        l.reload(config("0")).unwrap();
        assert_eq!(redis(&l).spin_wait(), Duration::ZERO);
    }
}
