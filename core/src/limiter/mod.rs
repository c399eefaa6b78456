//! The limiter handle: the public API every binding wraps.

use crate::config::Config;
use crate::engine::expiry::ExpiringMap;
use crate::engine::memory::MemoryEngine;
use crate::engine::redis::RedisEngine;
use crate::error::{Error, Result};
use crate::events::{Subscriber, Subscribers};
use crate::policy::Policy;
use crate::routing::shard_index;
use crate::time::clock::Clock;
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod block_list;
mod blocking;
mod check;
mod check_redis;
mod fallback;
mod handoff;
mod host;
mod late_leases;
mod layered;
mod layered_calls;
mod layered_overrides;
mod local_admission;
mod metrics;
mod multi;
mod override_retry;
mod override_value;
mod overrides;
mod reload;
mod scale;
mod settle;
mod shadow;

use crate::key::validate_key;
pub use block_list::BlockInfo;
pub use blocking::Spawner;
use check::PolicyKey;
use handoff::Handoff;
pub use host::{HostChecks, HostStep};
pub use layered::Layer;
use local_admission::LocalBatch;
use metrics::{config_series, Series};
pub use override_value::resolve_override;
pub use overrides::{OverrideInfo, OverridePage, OVERRIDE_CACHE_MAX};
pub use reload::ConfigWatcher;
pub use scale::{latency_scale, ScaleHook};
pub use settle::Reservation;
pub use shadow::ShadowReport;

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

#[derive(Debug)]
enum Engine {
    Memory(Arc<MemoryEngine>),
    Redis(Arc<RedisEngine>),
}

/// What a reload swaps atomically: the config and the engine built from it. In-flight
/// checks finish on the view they started with.
#[derive(Debug)]
struct View {
    config: Arc<Config>,
    engine: Engine,
    /// After a reshard: where moved keys' state still lives, until when.
    handoff: Option<Handoff>,
    /// The counters of the config's policies, by name (a reload keeps them).
    series: Series,
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
    /// The counters of ad-hoc policies (names not in the config), by name: copied on
    /// write, so that counting never takes a lock.
    adhoc: ArcSwap<Series>,
    /// Held while a name is added to `adhoc`.
    adhoc_add: Mutex<()>,
    /// key → (cached until, block ends at or None = permanent), clock µs
    /// key → block ends at or None = permanent, expiring when cached until (clock µs)
    block_cache: Mutex<ExpiringMap<String, Option<u64>>>,
    block_cache_len: AtomicUsize,
    /// local admission batches, expiring with the batch
    local: Mutex<ExpiringMap<PolicyKey, LocalBatch>>,
    /// The in-memory engine's shadow counts, by policy and key.
    shadow: shadow::ShadowCounts,
    /// per-key overrides: remembered from Redis, or the in-memory engine's
    overrides: overrides::OverrideState,
    /// This limiter's number, unique in the process: which limiter's counters a policy
    /// holds (`crate::metrics::Hot`).
    id: u64,
    /// How many reloads were applied (`Limiter::config_generation`).
    generation: AtomicU64,
    /// Leases an acquire may have been granted after it fell back, to release.
    late: late_leases::LateLeases,
    /// The in-memory engine this limiter was built with, which an in-memory check uses
    /// without loading the view while [`Inner::fast`] says the view in force still has it
    /// (loading the view and releasing it were about a sixth of a check). Kept until the
    /// limiter is dropped, even after a reload moved to Redis.
    memory: Option<Arc<MemoryEngine>>,
    /// [`FAST_MEMORY`] and [`FAST_NAMED`] of the view in force, stored after each view.
    fast: AtomicU8,
}

/// [`Inner::fast`]: the view's engine is [`Inner::memory`].
const FAST_MEMORY: u8 = 1;
/// [`Inner::fast`]: the view's config names policies (an ad-hoc policy's name is then
/// checked against them, on the view).
const FAST_NAMED: u8 = 2;

/// [`Inner::fast`] for a view of `engine` and `config`.
fn fast_flags(memory: Option<&Arc<MemoryEngine>>, engine: &Engine, config: &Config) -> u8 {
    let live = matches!((memory, engine), (Some(a), Engine::Memory(b)) if Arc::ptr_eq(a, b));
    let named = !config.policies.is_empty();
    (if live { FAST_MEMORY } else { 0 }) | (if named { FAST_NAMED } else { 0 })
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
        subscribers.log.set_interval(config.log_interval);
        let engine = Limiter::build_engine(&config, subscribers.clone())?;
        let memory = match &engine {
            Engine::Memory(m) => Some(m.clone()),
            Engine::Redis(_) => None,
        };
        let fast = fast_flags(memory.as_ref(), &engine, &config);
        let salt = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        Ok(Limiter {
            inner: Arc::new(Inner {
                view: ArcSwap::from_pointee(View {
                    series: config_series(&config, None, &Series::default()),
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
                adhoc: ArcSwap::from_pointee(Series::default()),
                adhoc_add: Mutex::new(()),
                block_cache: Mutex::new(ExpiringMap::default()),
                block_cache_len: AtomicUsize::new(0),
                local: Mutex::new(ExpiringMap::default()),
                shadow: shadow::ShadowCounts::default(),
                overrides: overrides::OverrideState::default(),
                id: {
                    static NEXT: AtomicU64 = AtomicU64::new(1);
                    NEXT.fetch_add(1, Ordering::Relaxed)
                },
                generation: AtomicU64::new(0),
                late: Default::default(),
                memory,
                fast: AtomicU8::new(fast),
            }),
        })
    }

    fn build_engine(config: &Config, subscribers: Arc<Subscribers>) -> Result<Engine> {
        let (prefix, timeout, maxlen) = (
            config.key_prefix.clone(),
            config.timeout,
            config.events_stream_maxlen,
        );
        match (&config.shards, &config.cluster) {
            (Some(shards), _) => fd_budget(shards.len(), "shards")?,
            (None, Some(nodes)) => fd_budget(nodes.len(), "cluster.nodes")?,
            (None, None) => {}
        }
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
        e.set_max_queue(config.max_queue);
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

    /// How many reloads this limiter has applied (0 when it was made; `reload`,
    /// `reload_from_file` and a config watcher each add one, after the new config is in
    /// force). Cheap (one atomic load): a host that derives something from the config
    /// (which policies are concurrency limits, say) reads it per request and derives again
    /// when it changed. Read it before `config()`: a reload in between then shows as a
    /// change the next time.
    pub fn config_generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
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
            .ok_or_else(|| Error::unknown_policy(name))
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

    /// Connects to every shard and loads the scripts, within `timeout` (its own deadline,
    /// not the per-call `timeout_ms`), so that the first calls do not spend their deadline
    /// on a TCP connect and fall back to `on_error`. Call it at start-up; a failure says
    /// which shard could not be reached (calls still connect lazily later). Nothing to do
    /// on the in-memory engine.
    pub async fn connect(&self, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::invalid("timeout", "must be more than 0"));
        }
        match &self.view().engine {
            Engine::Memory(_) => Ok(()),
            Engine::Redis(r) => r.connect(timeout).await,
        }
    }

    /// Calls `subscriber` for every event: denials, blocks, fallbacks, circuit changes,
    /// shadow denials and near-limit crossings.
    pub fn subscribe(&self, subscriber: Subscriber) {
        self.inner.subscribers.add(subscriber);
    }

    /// Sends the limiter's warning lines (fallbacks, circuits opened, failed handoffs,
    /// rejected configs, failed refunds; at most one per (reason, subject) per
    /// `log_interval`, see [`crate::log`]) to `sink` as well as to `tracing`; `None`
    /// removes it. The bindings install one that forwards to their host's logger.
    pub fn set_log_sink(&self, sink: Option<crate::log::LogSink>) {
        self.inner.subscribers.log.set_sink(sink);
    }

    #[inline]
    fn view(&self) -> Arc<View> {
        self.inner.view.load_full()
    }

    /// The in-memory engine in force, when a check of `policy` may run on it without the
    /// view: the view's engine is the one this limiter was built with, and the check needs
    /// nothing else of the view (no configured name to check an ad-hoc policy's against, no
    /// override, not a multi-limit policy). A reload racing with the check leaves it on the
    /// engine it started with, as a check in flight on the old view.
    #[inline]
    fn memory_fast(&self, policy: &Policy) -> Option<&MemoryEngine> {
        let m = self.inner.memory.as_deref()?;
        let f = self.inner.fast.load(Ordering::Acquire);
        let p = &policy.0;
        let fits = f & FAST_MEMORY != 0
            && (f & FAST_NAMED == 0 || !p.adhoc)
            && !p.overrides
            && p.parts.is_none();
        fits.then_some(m)
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
            None => crate::time::clock::fast_now_us(),
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
}

/// File descriptors a process keeps for everything but shardlimit's connections.
#[cfg(unix)]
const FD_HEADROOM: libc::rlim_t = 64;

/// Refuses a config of `n` shards (or Cluster nodes) that the process's file descriptor
/// limit cannot hold: a limiter keeps one connection per shard (more while blocking calls
/// use their own), so beyond `RLIMIT_NOFILE` connections fail and checks fall back (3000
/// shards under 1024 sent two checks in three to `on_error`).
fn fd_budget(n: usize, field: &str) -> Result<()> {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return Ok(()); // unknown: nothing to say
        }
        let soft = lim.rlim_cur;
        let need = (n as libc::rlim_t).saturating_add(FD_HEADROOM);
        if lim.rlim_cur != libc::RLIM_INFINITY && need > soft {
            return Err(Error::config(
                field,
                format!(
                    "{n} shards need at least {n} connections per process (one per shard, more while blocking calls use their own), plus ~{FD_HEADROOM} file descriptors for the rest of the process, but this process's RLIMIT_NOFILE is {soft} (hard limit {}): raise it (`ulimit -n {}`, systemd's LimitNOFILE=) or configure fewer shards",
                    if lim.rlim_max == libc::RLIM_INFINITY { "unlimited".to_string() } else { lim.rlim_max.to_string() },
                    need.next_power_of_two().max(4096),
                ),
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = (n, field);
    Ok(())
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
