//! The operations of the Redis engine: checks, layered checks, refunds, leases, reset,
//! reshard dump/restore and the block list.

use super::*;

/// A reply the redis crate parsed, as [`Reply`] (Cluster, Sentinel and TLS shards).
pub(super) fn value_reply(v: redis::Value) -> Reply {
    match v {
        redis::Value::Nil => Reply::Nil,
        redis::Value::Int(n) => Reply::Int(n),
        redis::Value::BulkString(b) => Reply::Str(b),
        redis::Value::SimpleString(s) => Reply::Str(s.into_bytes()),
        redis::Value::Okay => Reply::Str(b"OK".to_vec()),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            Reply::Array(items.into_iter().map(value_reply).collect())
        }
        redis::Value::ServerError(e) => Reply::Error(format!("{e:?}")),
        other => Reply::Error(format!("unexpected reply {other:?}")),
    }
}

/// The window arguments of `reset.lua` and `migrate_dump.lua` for `key`: the window (µs;
/// 0 for an algorithm without windows) and the key's window offset.
fn window_args(c: &Compiled, key: &str) -> (u64, u64) {
    let window = if c.algorithm.is_windowed() {
        c.period_us
    } else {
        0
    };
    (window, c.shift_us(key))
}

impl RedisEngine {
    /// Connects to every shard and loads every script there, all within `timeout` (its
    /// own deadline, not a call's): the pipelined connection (or the redis crate's), and
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
        let mut r = Box::pin(self.raw(&st, shard, deadline, load)).await;
        let pooled = !st.blocking[shard].lock().is_empty();
        if let (Ok(()), Some(target), false) = (&r, &self.targets[shard], pooled) {
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
        let (limit, cost, tag) = (req.eff.limit, req.cost, req.tag);
        if self.targets[shard].is_some() {
            // the hot path: the pipelined connection, which sends a burst's checks together
            // (and takes a reply only if it carries the call's tag)
            let scripts = scripts::check_scripts(req.eff.algorithm);
            let call = |eval| CheckCall::new(scripts, eval, req, &self.prefix);
            // one deadline for the call, retry included
            let deadline = Instant::now() + self.timeout;
            let reply = evalsha_then_eval(|eval| {
                Box::pin(self.request_pipelined(shard, call(eval), deadline))
            })
            .await?;
            return self.script_reply(shard, reply, limit, cost);
        }
        let at = self
            .cluster_nodes
            .as_ref()
            .map(|_| state_key(&self.prefix, &req.policy.key_scope, req.key));
        let (first, again) = (req.cmd(&self.prefix, false), req.cmd(&self.prefix, true));
        let r: redis::Value = self
            .with_conn_at(shard, at.as_deref(), |conn| async move {
                query_script(conn, &first, &again).await
            })
            .await?;
        // the same reply the pipe reads, and the rule of `untag`
        let reply = value_reply(r);
        match untag(reply, tag) {
            Ok(reply) => self.script_reply(shard, reply, limit, cost),
            Err(_) => Err(self.not_theirs(shard)),
        }
    }

    /// [`RedisEngine::check`] on the calling thread, over a blocking connection (see
    /// [`RedisEngine::request_blocking`]).
    pub fn check_blocking(
        self: &Arc<Self>,
        shard: usize,
        req: &CheckRequest<'_>,
    ) -> Result<Checked> {
        let packed = |eval| req.cmd(&self.prefix, eval).get_packed_command();
        // one deadline for the call, retry included
        let deadline = Instant::now() + self.timeout;
        let reply = evalsha_then_eval_blocking(|eval| {
            self.request_blocking(shard, &packed(eval), deadline, req.tag)
        })?;
        self.script_reply(shard, reply, req.eff.limit, req.cost)
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
        let mut inv = ScriptId::Layered.script().prepare_invoke();
        inv.arg(now_us.unwrap_or(0)).arg(layers.len());
        for (l, key_scope) in layers {
            let (after, within, dur) = auto_block_args(l.auto_block.as_ref());
            inv.key(state_key(&self.prefix, key_scope, l.key))
                .key(block_key(&self.prefix, l.key))
                .key(denial_key(&self.prefix, key_scope, l.key))
                .arg(l.compiled.algorithm.code())
                .arg(l.compiled.limit)
                .arg(l.compiled.period_us)
                .arg(l.cost)
                .arg(layer_extra(l))
                .arg(after)
                .arg(within)
                .arg(dur)
                .arg(if after > 0 {
                    format!("auto: policy {}", l.scope)
                } else {
                    String::new()
                });
        }
        if let Some(t) = tail {
            // core/lua/main_layered.lua's tail
            t.push_override(&self.prefix, &mut inv);
            inv.arg(t.key)
                .arg(super::SHADOW_TTL.as_millis() as u64)
                .arg(super::SHADOW_MAX_KEYS);
            if t.shadow && !self.is_cluster() {
                inv.key(super::keys::shadow_key(&self.prefix, t.policy));
            }
            if !t.more.is_empty() {
                // the last M keys (each shares the slot of its user key's state)
                inv.arg(t.more.len());
                for (ov, policy, key) in t.more {
                    match ov {
                        OverrideArg::Cached(v) => inv.arg(*v),
                        _ => inv.arg(""),
                    };
                    inv.key(override_key(&self.prefix, policy, key));
                }
            }
        }
        let at = self.layers_at(layers);
        let v: redis::Value = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                inv.invoke_async(&mut conn).await
            })
            .await?;
        let sc = &self.shards[shard];
        let script_error = |message: String| Error::Script {
            shard: sc.name.clone(),
            message,
        };
        let r: Vec<i64> = match value_reply(v) {
            Reply::Array(items)
                if tail.is_some()
                    && items.len() == 3
                    && matches!(&items[0], Reply::Str(s) if s == b"o") =>
            {
                let mut items = items.into_iter().skip(1);
                let more = tail.map_or(0, |t| t.more.len()) as i64;
                return match (items.next(), items.next()) {
                    (Some(Reply::Str(v)), Some(Reply::Int(j))) if (0..=more).contains(&j) => {
                        Ok(LayeredChecked::Override(v, j as usize))
                    }
                    other => Err(script_error(format!(
                        "unexpected override entry in a layered reply: {other:?}"
                    ))),
                };
            }
            Reply::Array(items) => items
                .iter()
                .map(|i| match i {
                    Reply::Int(n) => Ok(*n),
                    other => Err(script_error(format!("unexpected layered reply {other:?}"))),
                })
                .collect::<Result<Vec<i64>>>()?,
            other => return Err(script_error(format!("unexpected layered reply {other:?}"))),
        };
        if r.len() != 3 + 5 * layers.len() {
            return Err(implausible(
                sc,
                &r,
                &format!("not 3 + 5 x {} values", layers.len()),
            ));
        }
        let outcomes = (0..layers.len())
            .map(|i| outcome(&r[3 + 5 * i..8 + 5 * i], sc, layers[i].0.compiled.limit))
            .collect::<Result<Vec<_>>>()?;
        if r[0] < 0 {
            return Err(implausible(sc, &r, "a negative time"));
        }
        // the deciding layer, 1-based, 0 for none
        if r[1] < 0 || r[1] as usize > layers.len() {
            return Err(implausible(
                sc,
                &r,
                &format!("no layer {} of {}", r[1], layers.len()),
            ));
        }
        Ok(LayeredChecked::Decided(LayeredRaw {
            now: r[0] as u64,
            deciding: (r[1] as usize).checked_sub(1),
            blocked: block_verdict(sc, &r, r[2])?,
            outcomes,
        }))
    }

    /// Gives back what a layered check admitted on `shard` at `now`.
    pub async fn refund(
        self: &Arc<Self>,
        shard: usize,
        layers: &[(LayerReq<'_>, &str)],
        now: u64,
    ) -> Result<()> {
        let mut inv = ScriptId::Refund.script().prepare_invoke();
        inv.arg(now).arg(layers.len());
        for (l, key_scope) in layers {
            inv.key(state_key(&self.prefix, key_scope, l.key))
                .arg(l.compiled.algorithm.code())
                .arg(l.compiled.period_us)
                .arg(l.cost)
                .arg(layer_extra(l));
        }
        let at = self.layers_at(layers);
        let _: i64 = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                inv.invoke_async(&mut conn).await
            })
            .await?;
        Ok(())
    }

    /// Releases `units` of concurrency lease `lease_id`; true when it was held.
    pub async fn release(
        self: &Arc<Self>,
        policy: &PolicyInner,
        key: &str,
        shard: usize,
        lease_id: &str,
        units: u64,
        now_us: Option<u64>,
    ) -> Result<bool> {
        let rkey = state_key(&self.prefix, &policy.key_scope, key);
        let at = self.at(&rkey);
        let removed: i64 = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                ScriptId::Release
                    .script()
                    .key(rkey)
                    .arg(lease_id)
                    .arg(units)
                    .arg(now_us.unwrap_or(0))
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(removed == 1)
    }

    /// Deletes `key`'s state for `policy`.
    pub async fn reset(
        self: &Arc<Self>,
        policy: &PolicyInner,
        key: &str,
        shard: usize,
        now_us: Option<u64>,
    ) -> Result<()> {
        let rkey = state_key(&self.prefix, &policy.key_scope, key);
        let (window, shift) = window_args(&policy.compiled, key);
        let at = self.at(&rkey);
        let _: i64 = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                ScriptId::Reset
                    .script()
                    .key(rkey)
                    .arg(now_us.unwrap_or(0))
                    .arg(window)
                    .arg(shift)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(())
    }

    /// Reads `key`'s state for `policy` (and its block entry) on `shard`, for a handoff:
    /// (name, pttl in ms or 0, DUMP payload) per existing key.
    pub async fn dump_state(
        self: &Arc<Self>,
        shard: usize,
        policy: &PolicyInner,
        key: &str,
        now_us: Option<u64>,
    ) -> Result<Vec<(String, i64, Vec<u8>)>> {
        let (window, shift) = window_args(&policy.compiled, key);
        let (skey, bkey) = (
            state_key(&self.prefix, &policy.key_scope, key),
            block_key(&self.prefix, key),
        );
        let v: Vec<redis::Value> = self
            .with_conn(shard, |mut conn| async move {
                ScriptId::MigrateDump
                    .script()
                    .key(skey)
                    .key(bkey)
                    .arg(now_us.unwrap_or(0))
                    .arg(window)
                    .arg(shift)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        let mut out = Vec::new();
        for t in v.chunks(3) {
            if let [redis::Value::BulkString(name), redis::Value::Int(ttl), redis::Value::BulkString(payload)] =
                t
            {
                out.push((
                    String::from_utf8_lossy(name).into_owned(),
                    *ttl,
                    payload.clone(),
                ));
            }
        }
        Ok(out)
    }

    /// Writes state read by [`RedisEngine::dump_state`] on `shard` where it has none yet.
    pub async fn restore_state(
        self: &Arc<Self>,
        shard: usize,
        items: Vec<(String, i64, Vec<u8>)>,
    ) -> Result<u64> {
        if items.is_empty() {
            return Ok(0);
        }
        let mut inv = ScriptId::MigrateRestore.script().prepare_invoke();
        for (name, ttl, payload) in items {
            inv.key(name).arg(ttl).arg(payload);
        }
        let n: i64 = self
            .with_conn(shard, |mut conn| async move {
                inv.invoke_async(&mut conn).await
            })
            .await?;
        Ok(n.max(0) as u64)
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

/// A layer's 7th algorithm argument (see `CheckRequest::write`): its lease id, or the
/// per-key window shift or exact interval denominator of its limit, or "".
fn layer_extra(l: &LayerReq<'_>) -> String {
    if !l.lease.is_empty() {
        return l.lease.to_string();
    }
    l.compiled
        .extra_arg(l.key)
        .map_or_else(String::new, |x| x.to_string())
}
