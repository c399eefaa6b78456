//! Reshard handoff: carrying a moved key's state from its old shard to its new one.

use super::{Limiter, PolicyKey};
use crate::engine::redis::RedisEngine;
use crate::policy::PolicyInner;
use crate::routing::shard_index;
use crate::time::clock::{Clock, MonotonicClock};
use parking_lot::Mutex;
use std::sync::Arc;

/// State of a reshard: for a while after the shard list changed, the first check of a key
/// whose shard changed carries its state over from the old shard.
pub(super) struct Handoff {
    pub(super) old: Arc<RedisEngine>,
    /// Monotonic µs until which moved keys are carried over.
    pub(super) until: u64,
    /// (policy, key) pairs already carried over by this limiter.
    pub(super) done: Mutex<std::collections::HashSet<PolicyKey>>,
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff")
            .field("old", &self.old)
            .field("until", &self.until)
            .finish()
    }
}

impl Limiter {
    /// During a reshard handoff: if `key` now lives on another server than before, copy its
    /// state for `p` (and its block entry) from the old shard, once per limiter. The new
    /// shard keeps any state it already has. Failures are logged: the check goes on.
    pub(super) async fn carry_over(
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
        let id = PolicyKey::new(&p.scope, key);
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
                tracing::debug!(policy = %p.name, key, error = %e, "shardlimit: reshard handoff failed for this key");
                self.inner.subscribers.log.note(
                    self.now(),
                    crate::log::LogReason::HandoffFailed,
                    &p.name,
                    &e,
                    None,
                );
            }
        }
    }
}
