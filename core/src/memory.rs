//! The in-memory engine: the same algorithms as the Redis scripts, in process.
//! Thread-safe (sharded mutexes) and bounded: state that has become equivalent to "never
//! seen" is swept out, amortised over inserts.

use crate::algo::{self, Outcome, State};
use crate::limit::{Algorithm, PolicyInner};
use hashbrown::HashTable;
use parking_lot::Mutex;
use std::hash::BuildHasher;
use std::sync::Arc;

const SHARDS: usize = 32;
const MIN_SWEEP: usize = 1024;

struct Entry {
    hash: u64,
    scope: Arc<str>,
    key: Box<str>,
    algorithm: Algorithm,
    state: Option<State>,
    expires_at: u64,
}

struct Shard {
    table: HashTable<Entry>,
    next_sweep: usize,
}

pub(crate) struct MemoryEngine {
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::FixedState,
}

impl std::fmt::Debug for MemoryEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryEngine")
            .field("keys", &self.len())
            .finish()
    }
}

impl Default for MemoryEngine {
    fn default() -> Self {
        MemoryEngine {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        table: HashTable::new(),
                        next_sweep: MIN_SWEEP,
                    })
                })
                .collect(),
            hasher: foldhash::fast::FixedState::with_seed(0x5eed_1e55),
        }
    }
}

impl MemoryEngine {
    #[inline]
    fn locate(&self, scope: &str, key: &str) -> (u64, &Mutex<Shard>) {
        let hash = self.hasher.hash_one((scope, key));
        (hash, &self.shards[(hash >> 58) as usize % SHARDS])
    }

    /// Runs one check of `policy` on `key` at `now` (µs).
    pub fn check(
        &self,
        policy: &PolicyInner,
        key: &str,
        now: u64,
        cost: u64,
        peek: bool,
        lease_id: &str,
    ) -> Outcome {
        let c = &policy.compiled;
        let (hash, shard) = self.locate(&policy.name, key);
        let mut guard = shard.lock();
        let shard = &mut *guard;
        let eq = |e: &Entry| *e.scope == *policy.name && *e.key == *key;
        if let Some(entry) = shard.table.find_mut(hash, eq) {
            if entry.algorithm != c.algorithm {
                // the policy changed algorithm: old state means nothing now
                entry.algorithm = c.algorithm;
                entry.state = None;
            }
            let out = algo::decide(c, &mut entry.state, now, cost, peek, lease_id);
            if let Some(s) = &entry.state {
                entry.expires_at = s.expires_at(c);
            }
            return out;
        }
        let mut state = None;
        let out = algo::decide(c, &mut state, now, cost, peek, lease_id);
        if let Some(state) = state {
            if shard.table.len() >= shard.next_sweep {
                shard.table.retain(|e| e.expires_at > now);
                shard.next_sweep = (shard.table.len() * 2).max(MIN_SWEEP);
            }
            let expires_at = state.expires_at(c);
            shard.table.insert_unique(
                hash,
                Entry {
                    hash,
                    scope: policy.name.clone(),
                    key: key.into(),
                    algorithm: c.algorithm,
                    state: Some(state),
                    expires_at,
                },
                |e| e.hash,
            );
        }
        out
    }

    /// Releases a concurrency lease; true when it was held.
    pub fn release(&self, policy: &PolicyInner, key: &str, lease_id: &str) -> bool {
        let (hash, shard) = self.locate(&policy.name, key);
        let mut shard = shard.lock();
        match shard
            .table
            .find_mut(hash, |e| *e.scope == *policy.name && *e.key == *key)
        {
            Some(e) => algo::release(&mut e.state, lease_id),
            None => false,
        }
    }

    /// Forgets `key`'s state for `policy`.
    pub fn reset(&self, policy: &PolicyInner, key: &str) -> bool {
        let (hash, shard) = self.locate(&policy.name, key);
        let mut shard = shard.lock();
        match shard
            .table
            .find_entry(hash, |e| *e.scope == *policy.name && *e.key == *key)
        {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// Number of keys held (live or not yet swept).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().table.len()).sum()
    }
}
