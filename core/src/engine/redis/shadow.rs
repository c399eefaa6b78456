//! Shadow mode on Redis: a check by the shadow build of `main_check.lua`, which counts
//! would-be denials in one hash per policy per shard in the same script call, and the read
//! of those counts. (A multi-limit policy's shadow check is `main_layered.lua`'s, given
//! the same hash: `RedisEngine::check_layers_with`.)

use super::*;
use crate::engine::redis::keys::shadow_key;

/// The most user keys one policy's shadow hash holds on one shard; the denials of further
/// keys are counted in the field "" (the report's `other`).
pub const SHADOW_MAX_KEYS: u64 = 1000;
/// How long a shadow hash lives after its last count.
pub const SHADOW_TTL: Duration = Duration::from_secs(7 * 86_400);

impl RedisEngine {
    /// Runs one check in shadow mode (`main_check.lua`'s shadow build). In a Redis Cluster
    /// the count is not kept (the hash would live in another slot than the key). Like a
    /// check, it compares the key's override version first (`req.ov`): a different one is
    /// answered with the entry, nothing decided or counted.
    pub async fn check_shadow(
        self: &Arc<Self>,
        shard: usize,
        req: &CheckRequest<'_>,
    ) -> Result<Checked> {
        let req = ShadowRequest {
            req,
            cluster: self.is_cluster(),
        };
        self.call(shard, &req).await
    }

    /// The shadow counts of `policy` on `shard`: (key, count) pairs and the count of keys
    /// beyond the bound. The reply is untrusted: at most [`SHADOW_MAX_KEYS`] + 1 fields of
    /// UTF-8 keys and integer counts.
    pub async fn shadow_counts(
        self: &Arc<Self>,
        shard: usize,
        policy: &str,
    ) -> Result<(Vec<(String, u64)>, u64)> {
        if self.is_cluster() {
            return Err(Error::invalid(
                "shadow_report",
                "shadow counts are not kept on a Redis Cluster (a policy's hash would live in another slot than its keys)",
            ));
        }
        let key = shadow_key(&self.prefix, policy);
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = self
            .with_conn(shard, |mut conn| async move {
                redis::cmd("HGETALL").arg(key).query_async(&mut conn).await
            })
            .await?;
        let bad = |why: String| Error::Script {
            shard: self.shards[shard].name.clone(),
            message: format!("implausible shadow hash of policy {policy}: {why}"),
        };
        if pairs.len() as u64 > SHADOW_MAX_KEYS + 1 {
            return Err(bad(format!(
                "{} fields, at most {} expected",
                pairs.len(),
                SHADOW_MAX_KEYS + 1
            )));
        }
        let mut keys = Vec::with_capacity(pairs.len());
        let mut other = 0;
        for (k, v) in pairs {
            let n = std::str::from_utf8(&v)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| bad("a count that is not a non-negative integer".into()))?;
            if k.is_empty() {
                other = n;
                continue;
            }
            let k = String::from_utf8(k).map_err(|_| bad("a key that is not UTF-8".into()))?;
            if k.len() > crate::limiter::MAX_KEY_LEN {
                return Err(bad("a key longer than any valid key".into()));
            }
            keys.push((k, n));
        }
        Ok((keys, other))
    }
}
