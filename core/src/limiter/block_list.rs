//! The block list: blocking keys in every limiter sharing the shards, and the in-process cache of blocks.

use super::{validate_key, Engine, Limiter, BLOCK_CACHE_TTL};
use crate::error::{Error, Result};
use crate::routing::shard_index;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A block-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    pub reason: String,
    /// Time left; `None` for a permanent block.
    pub remaining: Option<Duration>,
}

impl Limiter {
    /// Puts `key` on the block list for `ttl` (`None`: until unblocked). Every limiter of
    /// every language sharing the shards sees it; checks of a blocked key are denied with
    /// `source = block` and the block's remaining time as `retry_after`.
    pub async fn block(&self, key: &str, ttl: Option<Duration>, reason: &str) -> Result<()> {
        validate_key(key)?;
        if let Some(t) = ttl {
            if t.is_zero() || t > Duration::from_micros(crate::policy::MAX_PERIOD_US) {
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

    pub(super) fn cached_block(&self, key: &str) -> Option<Option<u64>> {
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

    pub(super) fn cache_block(&self, key: &str, remaining_us: Option<u64>) {
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

    pub(super) fn uncache_block(&self, key: &str) {
        let mut c = self.inner.block_cache.lock();
        c.remove(key);
        self.inner.block_cache_len.store(c.len(), Ordering::Release);
    }
}
