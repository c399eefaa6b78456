//! The override store on Redis: one string per (policy, key) on the key's shard,
//! `<version> <limit JSON>` (`limiter/overrides.rs` writes and reads the value; the check
//! scripts compare the version, `core/lua/check.lua`).

use super::keys::{override_pattern, override_user_key};
use crate::engine::redis::keys::override_key;
use crate::engine::redis::RedisEngine;
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::Duration;

/// The most entries one SCAN step asks a shard for.
const SCAN_COUNT: u64 = 1_000;

impl RedisEngine {
    /// Writes the override entry of (policy, key) (`ttl` None: until deleted).
    pub async fn set_override(
        self: &Arc<Self>,
        shard: usize,
        policy: &str,
        key: &str,
        value: String,
        ttl: Option<Duration>,
    ) -> Result<()> {
        let okey = override_key(&self.prefix, policy, key);
        let at = self.at(&okey);
        self.with_conn_at(shard, at.as_deref(), |mut conn| async move {
            let mut cmd = redis::cmd("SET");
            cmd.arg(okey).arg(value);
            if let Some(t) = ttl {
                cmd.arg("PX").arg(t.as_millis().max(1) as u64);
            }
            cmd.query_async::<()>(&mut conn).await
        })
        .await
    }

    /// Deletes the override entry of (policy, key); true when there was one.
    pub async fn delete_override(
        self: &Arc<Self>,
        shard: usize,
        policy: &str,
        key: &str,
    ) -> Result<bool> {
        let okey = override_key(&self.prefix, policy, key);
        let at = self.at(&okey);
        let n: i64 = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                redis::cmd("DEL").arg(okey).query_async(&mut conn).await
            })
            .await?;
        Ok(n > 0)
    }

    /// The raw override entry of (policy, key) and its PTTL in ms (-1: none).
    pub async fn get_override(
        self: &Arc<Self>,
        shard: usize,
        policy: &str,
        key: &str,
    ) -> Result<Option<(Vec<u8>, i64)>> {
        let okey = override_key(&self.prefix, policy, key);
        let at = self.at(&okey);
        let (value, ttl): (Option<Vec<u8>>, i64) = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                redis::pipe()
                    .cmd("GET")
                    .arg(&okey)
                    .cmd("PTTL")
                    .arg(&okey)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(value.map(|v| (v, ttl)))
    }

    /// One SCAN step over `policy`'s override entries on `shard` from `cursor`: the next
    /// cursor (0: done) and up to [`SCAN_COUNT`]-ish entries as (user key, value, PTTL ms).
    /// Names that are not of [`override_key`]'s making are skipped.
    pub async fn scan_overrides(
        self: &Arc<Self>,
        shard: usize,
        policy: &str,
        cursor: u64,
    ) -> Result<(u64, Vec<(String, Vec<u8>, i64)>)> {
        if self.cluster_nodes.is_some() {
            return Err(Error::invalid(
                "list_overrides",
                "listing overrides on a Redis Cluster is not supported yet (get_override \
                 reads one key's override on any deployment)",
            ));
        }
        let pattern = override_pattern(&self.prefix, policy);
        let (next, names): (u64, Vec<String>) = self
            .with_conn(shard, |mut conn| async move {
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        if names.len() as u64 > 10 * SCAN_COUNT {
            return Err(Error::Script {
                shard: self.shards[shard].name.clone(),
                message: format!("SCAN returned {} names for COUNT {SCAN_COUNT}", names.len()),
            });
        }
        let names: Vec<(String, String)> = names
            .into_iter()
            .filter_map(|n| override_user_key(&self.prefix, policy, &n).map(|k| (n, k)))
            .collect();
        if names.is_empty() {
            return Ok((next, Vec::new()));
        }
        let mut pipe = redis::pipe();
        for (n, _) in &names {
            pipe.cmd("GET").arg(n).cmd("PTTL").arg(n);
        }
        let values: Vec<redis::Value> = self
            .with_conn(shard, |mut conn| async move {
                pipe.query_async(&mut conn).await
            })
            .await?;
        if values.len() != 2 * names.len() {
            return Err(Error::Script {
                shard: self.shards[shard].name.clone(),
                message: format!(
                    "{} replies to {} commands listing overrides",
                    values.len(),
                    2 * names.len()
                ),
            });
        }
        let mut out = Vec::with_capacity(names.len());
        for ((_, key), pair) in names.into_iter().zip(values.chunks(2)) {
            // deleted or expired between SCAN and GET: gone
            if let [redis::Value::BulkString(v), redis::Value::Int(ttl)] = pair {
                out.push((key, v.clone(), *ttl));
            }
        }
        Ok((next, out))
    }
}
