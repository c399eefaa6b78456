//! The operations of the Redis engine: checks, layered checks, refunds, leases, reset,
//! reshard dump/restore and the block list.

use crate::engine::outcome::LayerReq;
use crate::engine::redis::keys::block_key;
use crate::engine::redis::{
    connect_panic, connect_timeout, scripts, Breaker, CheckRequest, Checked, Conn, DumpRequest,
    Dumped, LayeredChecked, LayeredRequest, LayeredTail, RedisEngine, RefundRequest,
    ReleaseRequest, ResetRequest, RestoreRequest, BLOCKING_IDLE_MAX,
};
use crate::error::{Error, Result};
use crate::policy::PolicyInner;
use crate::transport::blocking::BlockingConn;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl RedisEngine {
    /// Connects to every shard and loads every script there, all within `timeout` (its
    /// own deadline, not a call's): the pipelined connection (a Cluster's: one per primary), and
    /// one blocking connection per shard that takes them, so that no call's deadline is
    /// spent on a TCP connect. The first failure is returned; it counts for the shard's
    /// circuit like a call's.
    pub async fn connect(self: &Arc<Self>, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let calls = (0..self.shards.len()).map(|shard| self.warm_up(shard, deadline, timeout));
        for r in futures_util::future::join_all(calls).await {
            r?;
        }
        Ok(())
    }

    async fn warm_up(
        self: &Arc<Self>,
        shard: usize,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<()> {
        let st = self.state()?;
        let b = Breaker::Shard;
        self.gate(shard, &b)?;
        let start = Instant::now();
        let load = |mut conn: Conn| async move {
            for (_, src, _) in scripts::all() {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(src)
                    .query_async::<String>(&mut conn)
                    .await?;
            }
            Ok(())
        };
        // (the warm-up's own deadline, which the caller chose)
        let work = async {
            if self.cluster_nodes.is_some() {
                // every primary of the map loads them
                self.cluster_warm_up(&st)
                    .await
                    .map_err(|e| self.io_error(shard, e))
            } else {
                self.raw(&st, shard, None, load).await
            }
        };
        let mut r = match tokio::time::timeout_at(deadline.into(), Box::pin(work)).await {
            Ok(r) => r,
            Err(_) => Err(self.timeout_error(shard)),
        };
        let pooled = !st.blocking[shard].lock().is_empty();
        let blocking = self.targets[shard].as_ref().filter(|t| !t.is_tls());
        if let (Ok(()), Some(target), false) = (&r, blocking, pooled) {
            // a blocking caller's first call finds a connection in the pool
            let (target, left) = (target.clone(), connect_timeout(deadline));
            r = match tokio::task::spawn_blocking(move || BlockingConn::connect(&target, left))
                .await
            {
                Ok(Ok(c)) => {
                    let mut idle = st.blocking[shard].lock();
                    if idle.len() < BLOCKING_IDLE_MAX {
                        idle.push(c);
                    }
                    Ok(())
                }
                Ok(Err(e)) => Err(self.io_error(shard, e)),
                Err(e) => Err(connect_panic(&self.shards[shard], e)),
            };
        }
        // a timeout here is the connect's, not a call's
        let r = r.map_err(|e| match e {
            Error::Timeout { shard, .. } => Error::Timeout {
                shard,
                timeout_ms: timeout.as_millis() as u64,
            },
            e => e,
        });
        self.account(&st, shard, &b, start, &r);
        if r.is_ok() {
            self.connect_ok(shard);
        }
        r
    }

    /// Runs one check script.
    pub async fn check(self: &Arc<Self>, shard: usize, req: &CheckRequest<'_>) -> Result<Checked> {
        self.call(shard, req).await
    }

    /// [`RedisEngine::check`] on the calling thread, over a blocking connection (see
    /// [`RedisEngine::call_blocking`]).
    pub fn check_blocking(
        self: &Arc<Self>,
        shard: usize,
        req: &CheckRequest<'_>,
    ) -> Result<Checked> {
        self.call_blocking(shard, req)
    }

    /// A layered check of layers that all live on shard `shard`, atomic in one script call;
    /// for one key's layers (a multi-limit policy's limits) with `tail`: the key's override
    /// version compared first, and in shadow mode a would-be denial counted in the
    /// policy's shadow hash, in the same script call.
    pub async fn check_layers_with(
        self: &Arc<Self>,
        shard: usize,
        layers: &[(LayerReq<'_>, &str)],
        now_us: Option<u64>,
        tail: Option<&LayeredTail<'_>>,
    ) -> Result<LayeredChecked> {
        let req = LayeredRequest {
            layers,
            now_us,
            tail,
            cluster: self.is_cluster(),
        };
        self.call(shard, &req).await
    }

    /// Gives back what a layered check admitted on `shard` at `now`.
    pub async fn refund(
        self: &Arc<Self>,
        shard: usize,
        layers: &[(LayerReq<'_>, &str)],
        now: u64,
    ) -> Result<()> {
        let req = RefundRequest { layers, now };
        self.call(shard, &req).await
    }

    /// Releases `units` of concurrency lease `lease_id`; true when it was held. `late`: the
    /// lease of an acquire that gave up at its deadline (a release that finds nothing leaves
    /// a tombstone, see [`ReleaseRequest`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn release(
        self: &Arc<Self>,
        policy: &PolicyInner,
        key: &str,
        shard: usize,
        lease_id: &str,
        units: u64,
        now_us: Option<u64>,
        late: bool,
    ) -> Result<bool> {
        let req = ReleaseRequest {
            policy,
            key,
            lease: lease_id,
            units,
            now_us,
            late,
        };
        self.call(shard, &req).await
    }

    /// Deletes `key`'s state for `policy`.
    pub async fn reset(
        self: &Arc<Self>,
        policy: &PolicyInner,
        key: &str,
        shard: usize,
        now_us: Option<u64>,
    ) -> Result<()> {
        let req = ResetRequest {
            policy,
            key,
            now_us,
        };
        self.call(shard, &req).await
    }

    /// Reads `key`'s state for `policy` (and its block entry) on `shard`, for a handoff:
    /// (name, pttl in ms or 0, DUMP payload) per existing key.
    pub async fn dump_state(
        self: &Arc<Self>,
        shard: usize,
        policy: &PolicyInner,
        key: &str,
        now_us: Option<u64>,
    ) -> Result<Vec<Dumped>> {
        let req = DumpRequest {
            policy,
            key,
            now_us,
        };
        self.call(shard, &req).await
    }

    /// Writes state read by [`RedisEngine::dump_state`] on `shard` where it has none yet.
    pub async fn restore_state(self: &Arc<Self>, shard: usize, items: Vec<Dumped>) -> Result<u64> {
        if items.is_empty() {
            return Ok(0);
        }
        let req = RestoreRequest { items: &items };
        self.call(shard, &req).await
    }

    /// Puts `key` on the block list of its shard (`ttl` None = permanent).
    pub async fn block(
        self: &Arc<Self>,
        shard: usize,
        key: &str,
        ttl: Option<Duration>,
        reason: &str,
    ) -> Result<()> {
        let bkey = block_key(&self.prefix, key);
        let at = self.at(&bkey);
        let reason = reason.to_string();
        self.with_conn_at(shard, at.as_deref(), |mut conn| async move {
            let mut cmd = redis::cmd("SET");
            cmd.arg(bkey).arg(reason);
            if let Some(t) = ttl {
                cmd.arg("PX").arg(t.as_millis().max(1) as u64);
            }
            cmd.query_async::<()>(&mut conn).await
        })
        .await
    }

    pub async fn unblock(self: &Arc<Self>, shard: usize, key: &str) -> Result<bool> {
        let bkey = block_key(&self.prefix, key);
        let at = self.at(&bkey);
        let n: i64 = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                redis::cmd("DEL").arg(bkey).query_async(&mut conn).await
            })
            .await?;
        Ok(n > 0)
    }

    /// (reason, remaining time or None when permanent) when `key` is blocked.
    pub async fn blocked(
        self: &Arc<Self>,
        shard: usize,
        key: &str,
    ) -> Result<Option<(String, Option<Duration>)>> {
        let bkey = block_key(&self.prefix, key);
        let at = self.at(&bkey);
        let (reason, ttl): (Option<String>, i64) = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                redis::pipe()
                    .cmd("GET")
                    .arg(&bkey)
                    .cmd("PTTL")
                    .arg(&bkey)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(match (reason, ttl) {
            (Some(r), -1) => Some((r, None)),
            (Some(r), t) if t >= 0 => Some((r, Some(Duration::from_millis(t as u64)))),
            _ => None,
        })
    }
}
