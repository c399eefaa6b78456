//! A map whose entries expire, reclaimed a few at a time: every call that touches it also
//! removes at most [`SWEEP_BUDGET`] entries whose time has passed, taken from a queue
//! ordered by expiry. So no call ever scans the map (the cost of a call does not grow with
//! the number of entries) and expired entries go away while the map is used, even when
//! nothing new is inserted. Each entry has at most one live place in the queue; an entry
//! whose expiry moved later is queued again when its old place comes up, so every queued
//! item is handled once (O(1) amortised per insert or update).
//!
//! Used for the block lists, the automatic-blocking denial counters and the local
//! admission batches, so that none grows without bound or is scanned whole on a call.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// Queued items looked at per call, at most.
pub(crate) const SWEEP_BUDGET: usize = 16;
/// Expiry times are queued by bucket of 2^16 µs (65 ms): the queue holds one node per
/// bucket in use, however many entries expire in it.
const BUCKET_SHIFT: u32 = 16;
/// An entry that never expires.
pub(crate) const NEVER: u64 = u64::MAX;

struct Slot<V> {
    value: V,
    expires_at: u64,
    /// the bucket of this entry's live item in the queue (`None`: not queued)
    queued: Option<u64>,
}

pub(crate) struct ExpiringMap<K, V> {
    map: HashMap<K, Slot<V>>,
    queue: BTreeMap<u64, Vec<K>>,
    /// queued items looked at by sweeps, for tests (the work done is what they count)
    visited: u64,
}

impl<K, V> Default for ExpiringMap<K, V> {
    fn default() -> Self {
        ExpiringMap {
            map: HashMap::new(),
            queue: BTreeMap::new(),
            visited: 0,
        }
    }
}

fn bucket(t: u64) -> u64 {
    t >> BUCKET_SHIFT
}

impl<K: Hash + Eq + Clone, V> ExpiringMap<K, V> {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Queued items looked at by sweeps so far.
    #[cfg(test)]
    pub fn visited(&self) -> u64 {
        self.visited
    }

    /// The value of `k` and when it expires (expired or not: the caller compares).
    pub fn get<Q>(&self, k: &Q) -> Option<(&V, u64)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get(k).map(|s| (&s.value, s.expires_at))
    }

    pub fn get_mut<Q>(&mut self, k: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get_mut(k).map(|s| &mut s.value)
    }

    pub fn remove<Q>(&mut self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // its queued item, if any, is found stale when it comes up
        self.map.remove(k).map(|s| s.value)
    }

    /// The value of `k`, inserted from `f` (expiring at `expires_at`) when absent.
    pub fn get_or_insert_with(&mut self, k: K, expires_at: u64, f: impl FnOnce() -> V) -> &mut V {
        if !self.map.contains_key(&k) {
            self.insert(k.clone(), f(), expires_at);
        }
        match self.map.get_mut(&k) {
            Some(s) => &mut s.value,
            None => unreachable!("inserted above"),
        }
    }

    /// Every entry with its expiry (µs), expired or not, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V, u64)> {
        self.map.iter().map(|(k, s)| (k, &s.value, s.expires_at))
    }

    /// Inserts or replaces `k`, expiring at `expires_at` (µs, [`NEVER`]).
    pub fn insert(&mut self, k: K, value: V, expires_at: u64) {
        let queued = self.map.get(&k).and_then(|s| s.queued);
        self.map.insert(
            k.clone(),
            Slot {
                value,
                expires_at,
                queued,
            },
        );
        self.queue_if_needed(k, expires_at);
    }

    /// Moves `k`'s expiry to `expires_at`; false when `k` is absent.
    pub fn set_expiry<Q>(&mut self, k: &Q, expires_at: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self.map.get_mut(k) {
            Some(s) => {
                s.expires_at = expires_at;
                self.queue_if_needed(k.to_owned(), expires_at);
                true
            }
            None => false,
        }
    }

    /// Queues `k` at `expires_at` unless an earlier (or the same) bucket holds it already:
    /// that item re-queues it when it comes up.
    fn queue_if_needed(&mut self, k: K, expires_at: u64) {
        if expires_at == NEVER {
            return;
        }
        let b = bucket(expires_at);
        let Some(s) = self.map.get_mut(&k) else {
            return;
        };
        if matches!(s.queued, Some(q) if q <= b) {
            return;
        }
        s.queued = Some(b);
        self.queue.entry(b).or_default().push(k);
    }

    /// Removes up to [`SWEEP_BUDGET`] entries expired at `now` for which `keep` is false
    /// (an entry kept is looked at again one bucket later). Call it once per operation.
    pub fn sweep(&mut self, now: u64, keep: impl Fn(&V) -> bool) {
        for _ in 0..SWEEP_BUDGET {
            let Some(mut first) = self.queue.first_entry() else {
                return;
            };
            let b = *first.key();
            // a bucket is due once all of it lies before `now`
            if b >= bucket(now) {
                return;
            }
            let Some(k) = first.get_mut().pop() else {
                first.remove();
                continue;
            };
            if first.get().is_empty() {
                first.remove();
            }
            self.visited += 1;
            let Some(s) = self.map.get_mut(&k) else {
                continue; // removed since
            };
            if s.queued != Some(b) {
                continue; // queued again in an earlier bucket: a stale item
            }
            s.queued = None;
            let at = if s.expires_at > now {
                s.expires_at // moved later: queue it at its time
            } else if keep(&s.value) {
                now + (1 << BUCKET_SHIFT)
            } else {
                self.map.remove(&k);
                continue;
            };
            if at != NEVER {
                let nb = bucket(at);
                s.queued = Some(nb);
                self.queue.entry(nb).or_default().push(k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1000;

    #[test]
    fn expired_entries_are_reclaimed_a_few_per_call() {
        let mut m: ExpiringMap<u32, ()> = ExpiringMap::default();
        for i in 0..1000 {
            m.insert(i, (), 100 * MS);
        }
        m.insert(5000, (), NEVER);
        m.sweep(50 * MS, |_| false);
        assert_eq!(m.len(), 1001, "nothing is due yet");
        assert_eq!(m.visited(), 0);
        m.sweep(300 * MS, |_| false);
        assert_eq!(m.len(), 1001 - SWEEP_BUDGET);
        assert_eq!(m.visited(), SWEEP_BUDGET as u64);
        for _ in 0..1000 {
            m.sweep(300 * MS, |_| false);
        }
        assert_eq!(m.len(), 1, "only the entry that never expires is left");
        assert_eq!(m.visited(), 1000);
        assert!(m.queue.is_empty());
    }

    #[test]
    fn an_entry_moved_later_or_kept_stays_and_is_queued_once() {
        let mut m: ExpiringMap<String, u32> = ExpiringMap::default();
        m.insert("a".into(), 1, 100 * MS);
        for i in 0..100 {
            // a hot key whose expiry moves on: one queued item, not one per update
            m.set_expiry("a", (200 + i) * MS);
        }
        assert_eq!(m.queue.values().map(Vec::len).sum::<usize>(), 1);
        m.sweep(250 * MS, |_| false);
        assert_eq!(m.get("a").map(|(v, _)| *v), Some(1));
        m.sweep(400 * MS, |_| false);
        assert!(m.get("a").is_none());
        m.insert("b".into(), 2, 100 * MS);
        m.sweep(400 * MS, |v| *v == 2);
        assert!(m.get("b").is_some(), "kept by the predicate");
        m.set_expiry("b", 50 * MS);
        m.sweep(400 * MS, |_| false);
        m.sweep(600 * MS, |_| false);
        assert!(m.get("b").is_none());
        m.insert("c".into(), 3, 100 * MS);
        m.remove("c");
        m.insert("c".into(), 4, NEVER);
        m.sweep(10_000 * MS, |_| false);
        assert_eq!(
            m.get("c").map(|(v, _)| *v),
            Some(4),
            "re-inserted, never expires"
        );
    }
}
