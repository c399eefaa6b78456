//! The limiter handle: the public API every binding wraps.

use crate::algo::Outcome;
use crate::clock::{Clock, MonotonicClock};
use crate::config::Config;
use crate::decision::{Decision, Source};
use crate::error::{Error, Result};
use crate::limit::{Algorithm, Limit, Policy, PolicyInner};
use crate::memory::MemoryEngine;
use crate::redis_engine::RedisEngine;
use crate::routing::shard_index;
use std::future::Future;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

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
    Memory(MemoryEngine),
    Redis(RedisEngine),
}

#[derive(Debug)]
struct Inner {
    config: Config,
    engine: Engine,
    clock: Option<Arc<dyn Clock>>,
    lease_seq: AtomicU64,
    lease_salt: u64,
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
        let engine = match &config.shards {
            Some(shards) => Engine::Redis(RedisEngine::new(
                shards.clone(),
                config.key_prefix.clone(),
                config.timeout,
            )?),
            None => Engine::Memory(MemoryEngine::default()),
        };
        let salt = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        Ok(Limiter {
            inner: Arc::new(Inner {
                config,
                engine,
                clock: None,
                lease_seq: AtomicU64::new(0),
                lease_salt: salt,
            }),
        })
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

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// True when decisions are made by Redis shards, false for the in-memory engine.
    pub fn is_redis(&self) -> bool {
        matches!(self.inner.engine, Engine::Redis(_))
    }

    /// Keys currently held by the in-memory engine (`None` for Redis): memory is bounded
    /// because expired state is swept out.
    pub fn memory_keys(&self) -> Option<usize> {
        match &self.inner.engine {
            Engine::Memory(m) => Some(m.len()),
            Engine::Redis(_) => None,
        }
    }

    /// The named policy from the config.
    pub fn policy(&self, name: &str) -> Result<Policy> {
        self.inner
            .config
            .policies
            .get(name)
            .cloned()
            .ok_or_else(|| Error::UnknownPolicy(name.to_string()))
    }

    /// The shard `key` routes to: (index, name). `None` on the in-memory engine.
    pub fn route(&self, key: &str) -> Option<(u32, &str)> {
        match &self.inner.engine {
            Engine::Redis(r) => {
                let i = shard_index(key, r.shards.len() as u32);
                Some((i, r.shards[i as usize].name.as_str()))
            }
            Engine::Memory(_) => None,
        }
    }

    /// Checks `cost` units of `policy` for `key`. A denied check consumes nothing.
    /// A cost larger than the limit is denied with no `retry_after`.
    ///
    /// For Redis this must be awaited inside a Tokio runtime with timers enabled; from
    /// anywhere else use [`Limiter::check_blocking`].
    ///
    /// On a concurrency policy this acquires a lease that is never released explicitly:
    /// it frees itself after `lease_ttl`. Use [`Limiter::acquire`] to release early.
    pub async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision> {
        if policy.algorithm() == Algorithm::Concurrency {
            return self.acquire(key, policy, cost).await.map(|(d, _)| d);
        }
        self.run(key, &policy.0, cost, false, "")
            .await
            .map(|(d, _)| d)
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
        self.run(key, &policy.0, 1, true, "").await.map(|(d, _)| d)
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
        let (d, _) = self.run(key, &policy.0, units, false, &id).await?;
        let lease = d.allowed.then(|| Lease {
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
        match &self.inner.engine {
            Engine::Memory(m) => Ok(m.release(&policy.0, &lease.key, &lease.id)),
            Engine::Redis(r) => {
                let shard = shard_index(&lease.key, r.shards.len() as u32) as usize;
                r.release(&policy.0, &lease.key, shard, &lease.id, lease.units)
                    .await
            }
        }
    }

    /// Forgets `key`'s state under `policy`: its full budget is back.
    pub async fn reset(&self, key: &str, policy: &Policy) -> Result<()> {
        validate_key(key)?;
        match &self.inner.engine {
            Engine::Memory(m) => {
                m.reset(&policy.0, key);
                Ok(())
            }
            Engine::Redis(r) => {
                let shard = shard_index(key, r.shards.len() as u32) as usize;
                let now = self.inner.clock.as_ref().map(|c| c.now_us());
                r.reset(&policy.0, key, shard, now).await
            }
        }
    }

    /// Runs an async call of this limiter to completion on the calling thread. Used by the
    /// blocking API and by bindings without an async runtime. The calling thread waits at
    /// most the configured deadline for Redis.
    pub fn block_on<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        match &self.inner.engine {
            Engine::Memory(_) => {
                // memory futures never wait: poll once on a trivial executor
                futures_lite_block_on(fut)
            }
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
        if let (Engine::Memory(m), false) = (
            &self.inner.engine,
            policy.algorithm() == Algorithm::Concurrency,
        ) {
            return self
                .check_memory(m, key, &policy.0, cost, false, "")
                .map(|(d, _)| d);
        }
        let (me, key, policy) = (self.clone(), key.to_string(), policy.clone());
        self.block_on(async move { me.check(&key, &policy, cost).await })
    }

    /// Blocking [`Limiter::check_named`].
    pub fn check_named_blocking(&self, policy: &str, key: &str, cost: u64) -> Result<Decision> {
        let p = self.policy(policy)?;
        self.check_blocking(key, &p, cost)
    }

    /// Blocking [`Limiter::peek`].
    pub fn peek_blocking(&self, key: &str, policy: &Policy) -> Result<Decision> {
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

    /// Blocking [`Limiter::reset`].
    pub fn reset_blocking(&self, key: &str, policy: &Policy) -> Result<()> {
        let (me, key, policy) = (self.clone(), key.to_string(), policy.clone());
        self.block_on(async move { me.reset(&key, &policy).await })
    }

    /// A handle to the runtime that drives this limiter's Redis connections (created on
    /// first use, re-created after fork). `None` on the in-memory engine. Bindings spawn
    /// their async calls here.
    pub fn runtime_handle(&self) -> Result<Option<tokio::runtime::Handle>> {
        match &self.inner.engine {
            Engine::Redis(r) => Ok(Some(r.state()?.runtime().handle().clone())),
            Engine::Memory(_) => Ok(None),
        }
    }

    fn lease_id(&self) -> String {
        let n = self.inner.lease_seq.fetch_add(1, Ordering::Relaxed);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.inner.lease_salt, n, std::process::id()).hash(&mut h);
        format!("{:016x}{:x}", h.finish(), n)
    }

    fn check_memory(
        &self,
        m: &MemoryEngine,
        key: &str,
        policy: &PolicyInner,
        cost: u64,
        peek: bool,
        lease_id: &str,
    ) -> Result<(Decision, Option<u32>)> {
        validate_key(key)?;
        let cost = clamp_cost(policy, cost)?;
        let now = match &self.inner.clock {
            Some(c) => c.now_us(),
            None => MonotonicClock.now_us(),
        };
        let out = m.check(policy, key, now, cost, peek, lease_id);
        Ok((decision(policy, out, Source::Memory, None), None))
    }

    async fn run(
        &self,
        key: &str,
        policy: &PolicyInner,
        cost: u64,
        peek: bool,
        lease_id: &str,
    ) -> Result<(Decision, Option<u32>)> {
        match &self.inner.engine {
            Engine::Memory(m) => self.check_memory(m, key, policy, cost, peek, lease_id),
            Engine::Redis(r) => {
                validate_key(key)?;
                let cost = clamp_cost(policy, cost)?;
                let shard = shard_index(key, r.shards.len() as u32);
                let now = self.inner.clock.as_ref().map(|c| c.now_us());
                let out = r
                    .check(policy, key, shard as usize, now, cost, peek, lease_id)
                    .await?;
                Ok((
                    decision(policy, out, Source::Redis, Some(shard)),
                    Some(shard),
                ))
            }
        }
    }
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
    Ok(())
}

/// Costs above the limit can never fit: they are denied, never an error. Sending at most
/// `limit + 1` keeps every script quantity an exact integer.
fn clamp_cost(policy: &PolicyInner, cost: u64) -> Result<u64> {
    if cost == 0 {
        return Err(Error::invalid("cost", "must be at least 1"));
    }
    Ok(cost.min(policy.compiled.limit + 1))
}

fn decision(policy: &PolicyInner, o: Outcome, source: Source, shard: Option<u32>) -> Decision {
    Decision {
        allowed: o.allowed,
        limit: policy.compiled.limit,
        remaining: o.remaining,
        reset_after: Duration::from_micros(o.reset_us),
        retry_after: if o.allowed {
            None
        } else {
            o.retry_us.map(Duration::from_micros)
        },
        delay: Duration::from_micros(o.delay_us),
        policy: policy.name.clone(),
        source,
        shard,
        window: Duration::from_micros(policy.compiled.window_us()),
    }
}

/// Polls a future that is known never to wait (memory engine) to completion.
fn futures_lite_block_on<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    use std::task::{Context, Poll, Waker};
    let mut fut = std::pin::pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => Err(Error::Internal("in-memory call did not complete".into())),
    }
}
