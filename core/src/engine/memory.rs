//! The in-memory engine: the same algorithms as the Redis scripts, in process.
//! Thread-safe (sharded mutexes) and bounded: state that has become equivalent to "never
//! seen" is swept out, amortised over inserts. It also keeps a block list and the denial
//! counters of automatic blocking, like the scripts do in Redis.

use crate::engine::algo::{self, State};
use crate::engine::expiry::{ExpiringMap, NEVER};
use crate::engine::outcome::{blocked_outcome, BlockVerdict, LayerReq, LayeredRaw, Outcome, Raw};
use crate::engine::CallMode;
use crate::policy::{Algorithm, AutoBlock, Compiled, WindowOffset};
use hashbrown::HashTable;
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

mod key;
use crate::key::hash::{self, scope_seed};
use key::EntryKey;

const SHARDS: usize = 32;
const MIN_SWEEP: usize = 1024;

/// (policy, key) of an automatic-blocking denial counter.
type DenialKey = (Arc<str>, String);

struct Entry {
    hash: u64,
    scope: Arc<str>,
    key: EntryKey,
    algorithm: Algorithm,
    state: Option<State>,
    expires_at: u64,
    /// the window placement the state was written under (its window indices depend on it)
    offset: WindowOffset,
}

impl Entry {
    /// The entry of (scope, key)? The full hash first (the table compares 7 of its bits),
    /// the key in place when short, the scope by pointer first (every check of one policy
    /// passes the same one).
    #[inline(always)]
    fn is(&self, hash: u64, scope: &Arc<str>, key: &str) -> bool {
        self.hash == hash
            && self.key.is(key)
            && (Arc::ptr_eq(&self.scope, scope) || *self.scope == **scope)
    }
}

struct Shard {
    table: HashTable<Entry>,
    next_sweep: usize,
}

impl Shard {
    /// Runs `f` on the state of (scope, key), creating or updating the entry as needed.
    /// (Inline: the check's lookup, decision and write in one function.)
    #[inline(always)]
    fn with_state<R>(
        &mut self,
        hash: u64,
        scope: &Arc<str>,
        key: &str,
        c: &Compiled,
        now: u64,
        f: impl FnOnce(&mut Option<State>) -> R,
    ) -> R {
        // (`iter_hash_mut`, not `find_mut`: find calls its comparison through a `dyn`
        // closure, out of line, once per candidate; and a loop, not `Iterator::find`,
        // which was not inlined)
        let mut found = None;
        for entry in self.table.iter_hash_mut(hash) {
            if entry.is(hash, scope, key) {
                found = Some(entry);
                break;
            }
        }
        // (one call of `f`, on the entry's state or a fresh one: its result then has one
        // source, and stays in registers rather than being merged in a stack slot)
        let mut fresh = None;
        let state = match found.as_deref_mut() {
            Some(entry) => {
                if entry.algorithm != c.algorithm || entry.offset != c.window_offset {
                    // the policy changed algorithm (or window placement, like another
                    // state key in Redis): old state means nothing now
                    entry.algorithm = c.algorithm;
                    entry.offset = c.window_offset;
                    entry.state = None;
                }
                &mut entry.state
            }
            None => &mut fresh,
        };
        let r = f(state);
        match found {
            Some(entry) => {
                if let Some(s) = &entry.state {
                    entry.expires_at = s.expires_at(c);
                }
            }
            None => {
                if let Some(state) = fresh {
                    self.insert(hash, scope, key, c, now, state);
                }
            }
        }
        r
    }

    /// Adds the entry of a key seen first (out of line: the check of a key already held
    /// stays small).
    #[inline(never)]
    fn insert(
        &mut self,
        hash: u64,
        scope: &Arc<str>,
        key: &str,
        c: &Compiled,
        now: u64,
        state: State,
    ) {
        if self.table.len() >= self.next_sweep {
            self.table.retain(|e| e.expires_at > now);
            self.next_sweep = (self.table.len() * 2).max(MIN_SWEEP);
        }
        let expires_at = state.expires_at(c);
        self.table.insert_unique(
            hash,
            Entry {
                hash,
                scope: scope.clone(),
                key: EntryKey::new(key),
                algorithm: c.algorithm,
                state: Some(state),
                expires_at,
                offset: c.window_offset,
            },
            |e| e.hash,
        );
    }
}

/// A shard and its lock, alone on their cache lines: threads working on different shards
/// do not pull each other's lines back and forth, and a check touches one line for both.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

impl std::ops::Deref for Padded {
    type Target = Mutex<Shard>;
    #[inline]
    fn deref(&self) -> &Mutex<Shard> {
        &self.0
    }
}

/// Where the entry of a (scope, key) is: its hash and its shard.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Located {
    hash: u64,
    shard: usize,
}

impl Located {
    #[inline(always)]
    fn of(hash: u64) -> Located {
        Located {
            hash,
            shard: (hash >> 40) as usize % SHARDS,
        }
    }
}

pub(crate) struct MemoryEngine {
    shards: Box<[Padded]>,
    /// key → reason, expiring when the block ends
    blocks: Mutex<ExpiringMap<String, String>>,
    block_count: AtomicUsize,
    /// (policy, key) → denials for automatic blocking, expiring when the window ends
    denials: Mutex<ExpiringMap<DenialKey, u64>>,
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
                    Padded(Mutex::new(Shard {
                        table: HashTable::new(),
                        next_sweep: MIN_SWEEP,
                    }))
                })
                .collect(),
            blocks: Mutex::new(ExpiringMap::default()),
            block_count: AtomicUsize::new(0),
            denials: Mutex::new(ExpiringMap::default()),
        }
    }
}

impl MemoryEngine {
    /// The hash of (scope, key) and its shard. The shard comes from bits the shard's table
    /// does not use: the table places entries by the low bits and tells them apart by the
    /// top 7 (were the shard taken from the top 6, every entry of a shard would carry one
    /// of two top-7 tags, and a lookup would compare about half the entries of each group
    /// it probed, each a cache miss).
    #[inline]
    fn locate(&self, scope: &str, key: &str) -> Located {
        let (hash, _) = hash::hash_key(scope_seed(scope), key.as_bytes());
        Located::of(hash)
    }

    /// [`MemoryEngine::locate`] from the scope's seed ([`scope_seed`]), or `None` when
    /// `key` is not one a caller may pass (`crate::key::validate_key` says why): the key
    /// is read once for both.
    #[inline(always)]
    pub fn locate_valid(&self, seed: u64, key: &str) -> Option<Located> {
        let (hash, ok) = hash::hash_key(seed, key.as_bytes());
        ok.then(|| Located::of(hash))
    }

    /// Remaining block time of `key`: `Some(None)` permanent, `Some(Some(µs))`, or `None`.
    /// (The gate inline, the list looked at out of line: with nothing blocked, a check pays
    /// one load.)
    #[inline]
    fn block_ttl(&self, key: &str, now: u64) -> Option<Option<u64>> {
        if self.block_count.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.block_ttl_listed(key, now)
    }

    #[inline(never)]
    fn block_ttl_listed(&self, key: &str, now: u64) -> Option<Option<u64>> {
        let mut blocks = self.blocks.lock();
        blocks.sweep(now, |_| false);
        let r = match blocks.get(key).map(|(_, t)| t) {
            Some(NEVER) => Some(None),
            Some(t) if t > now => Some(Some(t - now)),
            Some(_) => {
                blocks.remove(key);
                None
            }
            None => None,
        };
        self.block_count.store(blocks.len(), Ordering::Release);
        r
    }

    /// Counts a denial for automatic blocking; true when it put the key on the block list.
    fn count_denial(&self, scope: &Arc<str>, key: &str, a: &AutoBlock, now: u64) -> bool {
        let mut d = self.denials.lock();
        d.sweep(now, |_| false);
        let dk = (scope.clone(), key.to_string());
        let n = match d.get(&dk) {
            Some((n, end)) if end > now => *n + 1,
            // none yet, or its window ended: a new window
            _ => {
                d.insert(dk.clone(), 0, now + a.within.as_micros() as u64);
                1
            }
        };
        if let Some(c) = d.get_mut(&dk) {
            *c = n;
        }
        if n >= a.after {
            d.remove(&dk);
            drop(d);
            self.block(
                key,
                Some(now + a.duration.as_micros() as u64),
                now,
                &format!("auto: policy {scope}"),
            );
            return true;
        }
        false
    }

    /// Runs one check (or a peek) of `c` for (scope, key) at `now` (µs).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn check(
        &self,
        scope: &Arc<str>,
        c: &Compiled,
        key: &str,
        now: u64,
        cost: u64,
        mode: CallMode<'_>,
        auto_block: Option<&AutoBlock>,
    ) -> Raw {
        let at = self.locate(scope, key);
        self.check_at(at, scope, c, key, now, cost, mode, auto_block)
    }

    /// [`MemoryEngine::check`] of (scope, key) located already.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn check_at(
        &self,
        at: Located,
        scope: &Arc<str>,
        c: &Compiled,
        key: &str,
        now: u64,
        cost: u64,
        mode: CallMode<'_>,
        auto_block: Option<&AutoBlock>,
    ) -> Raw {
        let peek = mode.is_peek();
        if let Some(ttl) = self.block_ttl(key, now) {
            return Raw {
                outcome: blocked_outcome(ttl),
                blocked: BlockVerdict::Blocked,
                granted: 0,
            };
        }
        let Located { hash, shard } = at;
        let outcome = self.shards[shard].lock().with_state(
            hash,
            scope,
            key,
            c,
            now,
            #[inline(always)]
            |s| {
                // (windows placed per key run on the key's shifted clock; their expiry
                // is then up to one window late, never early)
                algo::decide(c, s, now + c.shift_us(key), cost, peek, mode.lease())
            },
        );
        let mut blocked = BlockVerdict::Clear;
        if !outcome.allowed && !peek {
            if let Some(a) = auto_block {
                if self.count_denial(scope, key, a, now) {
                    blocked = BlockVerdict::BlockedNow;
                }
            }
        }
        let granted = if outcome.allowed && !peek { cost } else { 0 };
        Raw {
            outcome,
            blocked,
            granted,
        }
    }

    /// A layered check, atomic: every involved shard is locked (in index order) while all
    /// layers are first evaluated without writing, then all consume if all allow.
    pub fn check_layers(&self, layers: &[LayerReq<'_>], now: u64) -> LayeredRaw {
        let mut out = LayeredRaw {
            now,
            deciding: None,
            blocked: BlockVerdict::Clear,
            outcomes: Vec::with_capacity(layers.len()),
        };
        for (i, l) in layers.iter().enumerate() {
            if let Some(ttl) = self.block_ttl(l.key, now) {
                out.deciding = Some(i);
                out.blocked = BlockVerdict::Blocked;
                out.outcomes = layers.iter().map(|_| blocked_outcome(None)).collect();
                out.outcomes[i] = blocked_outcome(ttl);
                return out;
            }
        }
        let located: Vec<(u64, usize)> = layers
            .iter()
            .map(|l| {
                let at = self.locate(l.scope, l.key);
                (at.hash, at.shard)
            })
            .collect();
        let mut order: Vec<usize> = located.iter().map(|(_, s)| *s).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|s| (*s, self.shards[*s].lock())).collect();
        fn pick<'g, 'm>(
            guards: &'g mut [(usize, MutexGuard<'m, Shard>)],
            s: usize,
        ) -> &'g mut Shard {
            let g = guards
                .iter_mut()
                .find(|(id, _)| *id == s)
                .expect("shard locked");
            &mut g.1
        }
        for (i, l) in layers.iter().enumerate() {
            let o = pick(&mut guards, located[i].1).with_state(
                located[i].0,
                l.scope,
                l.key,
                &l.compiled,
                now,
                |s| {
                    algo::decide(
                        &l.compiled,
                        s,
                        now + l.compiled.shift_us(l.key),
                        l.cost,
                        true,
                        None, // no layer is a concurrency limit
                    )
                },
            );
            if !o.allowed && out.deciding.is_none() {
                out.deciding = Some(i);
            }
            out.outcomes.push(o);
        }
        if out.deciding.is_none() {
            for (i, l) in layers.iter().enumerate() {
                out.outcomes[i] = pick(&mut guards, located[i].1).with_state(
                    located[i].0,
                    l.scope,
                    l.key,
                    &l.compiled,
                    now,
                    |s| {
                        let at = now + l.compiled.shift_us(l.key);
                        algo::decide(&l.compiled, s, at, l.cost, false, None)
                    },
                );
            }
        }
        drop(guards);
        if let Some(d) = out.deciding {
            let l = &layers[d];
            if let Some(a) = &l.auto_block {
                if self.count_denial(l.scope, l.key, a, now) {
                    out.blocked = BlockVerdict::BlockedNow;
                }
            }
        }
        out
    }

    /// Releases a concurrency lease of `units` units; true when it was held at `now`.
    pub fn release(
        &self,
        scope: &Arc<str>,
        key: &str,
        lease_id: &str,
        units: u64,
        now: u64,
    ) -> bool {
        let Located { hash, shard } = self.locate(scope, key);
        let mut shard = self.shards[shard].lock();
        match shard.table.find_mut(hash, |e| e.is(hash, scope, key)) {
            Some(e) => algo::release(&mut e.state, lease_id, units, now),
            None => false,
        }
    }

    /// Charges, refunds or settles `key`'s units for `scope` at `now` (see
    /// [`crate::engine::settle`]): the outcome describes the key after it.
    pub fn settle(
        &self,
        scope: &Arc<str>,
        c: &Compiled,
        key: &str,
        now: u64,
        op: crate::engine::settle::SettleOp,
    ) -> Outcome {
        let Located { hash, shard } = self.locate(scope, key);
        self.shards[shard]
            .lock()
            .with_state(hash, scope, key, c, now, |s| {
                // (a window placed per key runs on the key's shifted clock, as a check)
                let shift = c.shift_us(key);
                crate::engine::settle::apply(c, s, now + shift, op.shifted(shift))
            })
    }

    /// Forgets `key`'s state for `scope`.
    pub fn reset(&self, scope: &Arc<str>, key: &str) -> bool {
        let Located { hash, shard } = self.locate(scope, key);
        let mut shard = self.shards[shard].lock();
        match shard.table.find_entry(hash, |e| e.is(hash, scope, key)) {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// Puts `key` on the block list until `expires_at` (µs; `None` = permanent).
    pub fn block(&self, key: &str, expires_at: Option<u64>, now: u64, reason: &str) {
        let mut b = self.blocks.lock();
        b.sweep(now, |_| false);
        b.insert(
            key.to_string(),
            reason.to_string(),
            expires_at.map_or(NEVER, |t| t.min(NEVER - 1)),
        );
        self.block_count.store(b.len(), Ordering::Release);
    }

    pub fn unblock(&self, key: &str) -> bool {
        let mut b = self.blocks.lock();
        let was = b.remove(key).is_some();
        self.block_count.store(b.len(), Ordering::Release);
        was
    }

    /// (reason, remaining µs or None when permanent) when `key` is blocked at `now`.
    pub fn blocked(&self, key: &str, now: u64) -> Option<(String, Option<u64>)> {
        let ttl = self.block_ttl(key, now)?;
        let reason = self.blocks.lock().get(key).map(|(r, _)| r.clone())?;
        Some((reason, ttl))
    }

    /// Number of keys held (live or not yet swept).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().table.len()).sum()
    }

    /// (block-list entries, denial counters) held, expired or not yet reclaimed.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        (self.blocks.lock().len(), self.denials.lock().len())
    }

    /// Queued expiry items looked at so far (block list + denial counters).
    #[cfg(test)]
    fn visited(&self) -> u64 {
        self.blocks.lock().visited() + self.denials.lock().visited()
    }
}

#[cfg(test)]
mod tests;
