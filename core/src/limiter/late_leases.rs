//! Leases an `acquire` may have been granted after it gave up.
//!
//! An acquire whose script call timed out or lost its connection falls back (or fails,
//! under `on_error: error`) and hands the caller no lease, but its script may have reached
//! Redis and run there, late: the slot is then held by a lease nobody will release, for
//! the policy's whole `lease_ttl`. The client knows the id it sent, so it releases that
//! lease itself, as soon as the shard answers again: a bounded list per shard, drained
//! by one task per shard on the I/O runtime, retried while the shard still fails, dropped
//! oldest-first (counted) when full, and forgotten once the lease would have expired.
//!
//! The release may reach Redis before the acquire it releases (it goes over whatever
//! connection answers, the acquire may still wait in the old one's socket): the release
//! script then finds no lease and leaves a tombstone for the lease TTL, and the acquire
//! that meets it grants nothing (`core/lua/concurrency.lua`).

use super::{Inner, Lease, Limiter};
use crate::error::Error;
use crate::policy::{Limit, Policy};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Releases waiting per shard at most; beyond, the oldest is dropped (and counted).
pub(super) const MAX_PER_SHARD: usize = 1024;

/// How long the drain waits after a release that failed before trying the next one.
const RETRY: Duration = Duration::from_millis(50);

/// A lease that may have been granted after its acquire fell back.
struct Orphan {
    policy: Policy,
    lease: Lease,
    /// after this, Redis has expired it anyway
    expires: Instant,
}

#[derive(Default)]
struct Shard {
    queue: VecDeque<Orphan>,
    /// the process whose task drains this queue (a forked child drains its own)
    drainer: Option<u32>,
}

/// The limiter's releases of late leases, and their counts.
#[derive(Default)]
pub(super) struct LateLeases {
    shards: Mutex<HashMap<usize, Shard>>,
    /// leases found held and released
    pub(super) released: AtomicU64,
    /// releases dropped because their shard's list was full
    pub(super) dropped: AtomicU64,
}

/// Whether a failed script call may have reached Redis and run there: a deadline that
/// passed, or a connection that broke (a refused one sent nothing, but cannot be told
/// apart). A circuit that is open sent nothing; an answer was an answer.
pub(super) fn may_have_run(e: &Error) -> bool {
    matches!(e, Error::Timeout { .. } | Error::Connection { .. })
}

impl LateLeases {
    /// Queues `orphan` on `shard`; true when no task drains that shard (start one).
    fn push(&self, shard: usize, orphan: Orphan) -> bool {
        let pid = std::process::id();
        let mut shards = self.shards.lock();
        let s = shards.entry(shard).or_default();
        if s.drainer.is_some_and(|p| p != pid) {
            // inherited over fork: the parent releases its own
            s.queue.clear();
            s.drainer = None;
        }
        self.bounded_push(shard, s, orphan, false);
        if s.drainer.is_none() {
            s.drainer = Some(pid);
            return true;
        }
        false
    }

    fn bounded_push(&self, shard: usize, s: &mut Shard, orphan: Orphan, front: bool) {
        if s.queue.len() >= MAX_PER_SHARD {
            // the oldest goes: it is the nearest to expiring by itself
            s.queue.pop_front();
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(
                    shard,
                    dropped = n,
                    "shardlimit: the list of late leases to release is full ({MAX_PER_SHARD}); the oldest will expire by their lease_ttl"
                );
            }
        }
        if front {
            s.queue.push_front(orphan);
        } else {
            s.queue.push_back(orphan);
        }
    }

    /// The next lease of `shard` to release (expired ones skipped), or `None`, and the
    /// shard's task ends.
    fn next(&self, shard: usize) -> Option<Orphan> {
        let mut shards = self.shards.lock();
        let s = shards.get_mut(&shard)?;
        let now = Instant::now();
        while let Some(o) = s.queue.pop_front() {
            if o.expires > now {
                return Some(o);
            }
        }
        s.drainer = None;
        None
    }

    /// Puts back a release that failed, to try again.
    fn retry(&self, shard: usize, orphan: Orphan) {
        let mut shards = self.shards.lock();
        let s = shards.entry(shard).or_default();
        self.bounded_push(shard, s, orphan, true);
    }

    /// Releases waiting, over every shard.
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.shards.lock().values().map(|s| s.queue.len()).sum()
    }
}

impl Limiter {
    /// An acquire on `shard` of Redis failed with `e` after sending lease `id`: when the
    /// script may have run, the lease is released once the shard answers.
    pub(super) fn late_lease(
        &self,
        policy: &Policy,
        key: &str,
        id: &str,
        units: u64,
        shard: u32,
        e: &Error,
    ) {
        if !may_have_run(e) {
            return;
        }
        let Limit::Concurrency { lease_ttl, .. } = policy.limit() else {
            return;
        };
        let orphan = Orphan {
            policy: policy.clone(),
            lease: Lease {
                key: key.to_string(),
                policy: policy.name().to_string(),
                id: id.to_string(),
                units,
            },
            expires: Instant::now() + *lease_ttl,
        };
        let shard = shard as usize;
        if !self.inner.late.push(shard, orphan) {
            return; // its task will get to it
        }
        let runtime = match &self.view().engine {
            super::Engine::Redis(r) => r.state().map(|s| s.runtime().clone()),
            super::Engine::Memory(_) => return,
        };
        match runtime {
            Ok(rt) => {
                rt.spawn(drain(Arc::downgrade(&self.inner), shard));
            }
            Err(_) => {
                // no runtime to release on: the leases expire by their TTL
                while self.inner.late.next(shard).is_some() {}
            }
        }
    }
}

/// Releases `shard`'s late leases one by one, waiting [`RETRY`] after each failure, until
/// none is left or the limiter is gone.
async fn drain(inner: Weak<Inner>, shard: usize) {
    loop {
        let Some(inner) = inner.upgrade() else { return };
        let l = Limiter { inner };
        let Some(o) = l.inner.late.next(shard) else {
            return;
        };
        match l.release_lease(&o.policy, &o.lease, true).await {
            Ok(held) => {
                if held {
                    l.inner.late.released.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        policy = %o.lease.policy,
                        "shardlimit: released a lease granted after its acquire fell back"
                    );
                }
            }
            Err(e) if e.is_backend() => {
                l.inner.late.retry(shard, o);
                drop(l); // (the limiter may go while this waits)
                tokio::time::sleep(RETRY).await;
            }
            // it cannot be released (a policy reloaded into another algorithm): dropped
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Limit;

    fn orphan(n: usize, ttl: Duration) -> Orphan {
        let policy = Policy::new("pool", Limit::concurrency(5, Duration::from_secs(60))).unwrap();
        Orphan {
            policy,
            lease: Lease {
                key: format!("k{n}"),
                policy: "pool".into(),
                id: format!("{n:017x}"),
                units: 1,
            },
            expires: Instant::now() + ttl,
        }
    }

    #[test]
    fn a_full_list_drops_its_oldest_and_counts_it() {
        let late = LateLeases::default();
        assert!(late.push(0, orphan(0, Duration::from_secs(60))));
        for n in 1..MAX_PER_SHARD + 10 {
            assert!(
                !late.push(0, orphan(n, Duration::from_secs(60))),
                "one drain per shard"
            );
        }
        assert_eq!(late.pending(), MAX_PER_SHARD);
        assert_eq!(late.dropped.load(Ordering::Relaxed), 10);
        // another shard has its own list and its own drain
        assert!(late.push(1, orphan(0, Duration::from_secs(60))));
        assert_eq!(
            late.next(0).unwrap().lease.key,
            "k10",
            "the oldest ten went"
        );
        // a failed release goes back first; on a full list the oldest goes again
        late.push(0, orphan(9999, Duration::from_secs(60)));
        late.retry(0, orphan(10, Duration::from_secs(60)));
        assert_eq!(late.dropped.load(Ordering::Relaxed), 11);
        assert_eq!(late.next(0).unwrap().lease.key, "k10");
    }

    #[test]
    fn expired_leases_are_not_released_and_an_empty_list_ends_its_drain() {
        let late = LateLeases::default();
        assert!(late.push(0, orphan(0, Duration::ZERO)));
        assert!(!late.push(0, orphan(1, Duration::from_secs(60))));
        assert_eq!(late.next(0).unwrap().lease.key, "k1");
        assert!(late.next(0).is_none());
        assert!(
            late.push(0, orphan(2, Duration::from_secs(60))),
            "a new drain"
        );
    }
}
