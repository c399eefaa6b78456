//! The Redis engine: one multiplexed, auto-reconnecting connection per shard, owned by a
//! Tokio runtime that belongs to the limiter. Runtime and connections are created lazily and
//! re-created in a forked child (the pid is checked on every call), because prefork servers
//! (gunicorn) and Go programs host this library.

use crate::algo::Outcome;
use crate::config::ShardConfig;
use crate::error::{Error, Result};
use crate::limit::PolicyInner;
use crate::routing::routing_key;
use crate::scripts;
use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;
use tokio::sync::OnceCell;

/// The runtime and connections of one process.
pub(crate) struct RtState {
    pid: u32,
    runtime: Option<Runtime>,
    conns: Vec<OnceCell<ConnectionManager>>,
}

impl RtState {
    pub fn runtime(&self) -> &Runtime {
        self.runtime.as_ref().expect("runtime present until drop")
    }
}

impl Drop for RtState {
    fn drop(&mut self) {
        // never blocks, so a limiter may be dropped inside an async context
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

pub(crate) struct RedisEngine {
    pub shards: Vec<ShardConfig>,
    clients: Vec<redis::Client>,
    pub timeout: Duration,
    prefix: String,
    worker_threads: usize,
    state: ArcSwapOption<RtState>,
    init: Mutex<()>,
}

impl std::fmt::Debug for RedisEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisEngine")
            .field("shards", &self.shards)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The Redis key holding `key`'s state for `policy`. It always carries a hash tag (the
/// user's own, or the whole key wrapped in braces), so that every key one check touches
/// lands in one Redis Cluster slot.
pub(crate) fn state_key(prefix: &str, policy: &PolicyInner, key: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + policy.key_scope.len() + key.len() + 2);
    s.push_str(prefix);
    s.push_str(&policy.key_scope);
    if routing_key(key).len() != key.len() {
        s.push_str(key);
    } else {
        s.push('{');
        s.push_str(key);
        s.push('}');
    }
    s
}

fn map_redis_error(shard: &ShardConfig, timeout: Duration, e: redis::RedisError) -> Error {
    if e.is_timeout() {
        Error::Timeout {
            shard: shard.name.clone(),
            timeout_ms: timeout.as_millis() as u64,
        }
    } else if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
    {
        Error::Connection {
            shard: shard.name.clone(),
            message: e.to_string(),
        }
    } else {
        Error::Script {
            shard: shard.name.clone(),
            message: e.to_string(),
        }
    }
}

impl RedisEngine {
    pub fn new(shards: Vec<ShardConfig>, prefix: String, timeout: Duration) -> Result<RedisEngine> {
        let clients = shards
            .iter()
            .enumerate()
            .map(|(i, s)| {
                redis::Client::open(s.url.as_str()).map_err(|e| {
                    Error::config(
                        format!("shards[{i}].url"),
                        format!("invalid Redis URL: {e}"),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let worker_threads = std::env::var("SHARDLIMIT_WORKER_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| (1..=64).contains(n))
            .unwrap_or(1);
        Ok(RedisEngine {
            shards,
            clients,
            timeout,
            prefix,
            worker_threads,
            state: ArcSwapOption::empty(),
            init: Mutex::new(()),
        })
    }

    /// The runtime state of this process, created on first use and again after a fork.
    pub fn state(&self) -> Result<Arc<RtState>> {
        let pid = std::process::id();
        if let Some(s) = self.state.load_full() {
            if s.pid == pid {
                return Ok(s);
            }
        }
        let _guard = self.init.lock();
        let current = self.state.load_full();
        if let Some(s) = current {
            if s.pid == pid {
                return Ok(s);
            }
            // Inherited through fork(): its threads do not exist in this process, so it
            // can neither run nor be shut down. Leak it on purpose.
            std::mem::forget(s);
            tracing::info!(
                pid,
                "shardlimit: fork detected, re-creating runtime and connections"
            );
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.worker_threads)
            .thread_name("shardlimit-io")
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("cannot start the I/O runtime: {e}")))?;
        let st = Arc::new(RtState {
            pid,
            runtime: Some(runtime),
            conns: self.shards.iter().map(|_| OnceCell::new()).collect(),
        });
        self.state.store(Some(st.clone()));
        Ok(st)
    }

    async fn connection(&self, st: &RtState, shard: usize) -> Result<ConnectionManager> {
        let conn = st.conns[shard]
            .get_or_try_init(|| async {
                let client = self.clients[shard].clone();
                let cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(500));
                // connect inside our runtime, so the connection's driver task lives there
                st.runtime()
                    .spawn(ConnectionManager::new_with_config(client, cfg))
                    .await
                    .map_err(|e| Error::Internal(format!("connect task failed: {e}")))?
                    .map_err(|e| map_redis_error(&self.shards[shard], self.timeout, e))
            })
            .await?;
        Ok(conn.clone())
    }

    /// Runs `f` with shard `shard`'s connection, under the deadline.
    pub async fn with_conn<T, F, Fut>(&self, shard: usize, f: F) -> Result<T>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let st = self.state()?;
        let work = async {
            let conn = self.connection(&st, shard).await?;
            f(conn)
                .await
                .map_err(|e| map_redis_error(&self.shards[shard], self.timeout, e))
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                shard: self.shards[shard].name.clone(),
                timeout_ms: self.timeout.as_millis() as u64,
            }),
        }
    }

    /// Runs one algorithm step on Redis.
    #[allow(clippy::too_many_arguments)]
    pub async fn check(
        &self,
        policy: &PolicyInner,
        key: &str,
        shard: usize,
        now_us: Option<u64>,
        cost: u64,
        peek: bool,
        lease_id: &str,
    ) -> Result<Outcome> {
        let c = &policy.compiled;
        let script = scripts::for_algorithm(c.algorithm);
        let rkey = state_key(&self.prefix, policy, key);
        let r: Vec<i64> = self
            .with_conn(shard, |mut conn| async move {
                let mut inv = script.key(rkey);
                inv.arg(now_us.unwrap_or(0))
                    .arg(c.limit)
                    .arg(c.period_us)
                    .arg(cost)
                    .arg(if peek { "1" } else { "0" })
                    .arg(lease_id);
                inv.invoke_async(&mut conn).await
            })
            .await?;
        if r.len() != 5 || r[0] < 0 || r[1] < 0 || r[2] < 0 || r[4] < 0 {
            return Err(Error::Script {
                shard: self.shards[shard].name.clone(),
                message: format!("unexpected script reply {r:?}"),
            });
        }
        Ok(Outcome {
            allowed: r[0] == 1,
            remaining: r[1] as u64,
            reset_us: r[2] as u64,
            retry_us: (r[3] >= 0).then_some(r[3] as u64),
            delay_us: r[4] as u64,
        })
    }

    /// Releases `units` of concurrency lease `lease_id`; true when it was held.
    pub async fn release(
        &self,
        policy: &PolicyInner,
        key: &str,
        shard: usize,
        lease_id: &str,
        units: u64,
    ) -> Result<bool> {
        let rkey = state_key(&self.prefix, policy, key);
        let members: Vec<String> = (1..=units).map(|i| format!("{lease_id}:{i}")).collect();
        let removed: i64 = self
            .with_conn(shard, |mut conn| async move {
                redis::cmd("ZREM")
                    .arg(rkey)
                    .arg(members)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(removed > 0)
    }

    /// Deletes `key`'s state for `policy`.
    pub async fn reset(
        &self,
        policy: &PolicyInner,
        key: &str,
        shard: usize,
        now_us: Option<u64>,
    ) -> Result<()> {
        let c = &policy.compiled;
        let rkey = state_key(&self.prefix, policy, key);
        let window = if c.algorithm.is_windowed() {
            c.period_us
        } else {
            0
        };
        let _: i64 = self
            .with_conn(shard, |mut conn| async move {
                scripts::RESET
                    .key(rkey)
                    .arg(now_us.unwrap_or(0))
                    .arg(window)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(())
    }
}
