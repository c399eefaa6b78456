use super::*;
use crate::engine::expiry::SWEEP_BUDGET;
use std::time::Duration;

const KEYS: usize = 200_000;

/// 200k keys blocked automatically: while they are blocked, a denial or a check costs
/// the same bounded work as with none; once the blocks (and the denial windows) have
/// ended, the state is reclaimed by the calls that come, with no scan of the map.
#[test]
fn auto_blocks_of_200k_keys_cost_bounded_work_per_call_and_are_reclaimed() {
    let m = MemoryEngine::default();
    let scope: Arc<str> = Arc::from("login");
    let c = Compiled {
        algorithm: Algorithm::FixedWindow,
        limit: 1,
        period_us: 3_600_000_000,
        period_den: 1,
        window_offset: WindowOffset::None,
    };
    let a = AutoBlock {
        after: 2,
        within: Duration::from_secs(10),
        duration: Duration::from_secs(60),
    };
    let check = |key: &str, now: u64| m.check(&scope, &c, key, now, 1, CallMode::Check, Some(&a));
    let keys: Vec<String> = (0..KEYS).map(|i| format!("user:{i}")).collect();
    let mut now = 1_000_000;
    for k in &keys {
        assert!(check(k, now).outcome.allowed);
        assert_eq!(check(k, now).blocked, BlockVerdict::Clear, "first denial");
    }
    assert_eq!(m.held(), (0, KEYS), "one denial counter per key");
    // a denial with 200k counters live: no scan (the old code retained over the whole
    // map on every denial past 100k entries)
    let before = m.visited();
    for k in &keys {
        assert_eq!(
            check(k, now).blocked,
            BlockVerdict::BlockedNow,
            "second denial blocks"
        );
    }
    assert_eq!(m.held(), (KEYS, 0));
    assert_eq!(
        m.visited(),
        before,
        "nothing is due yet: no entry was looked at"
    );
    // each call while everything is still blocked
    let before = m.visited();
    assert_eq!(check("user:7", now).blocked, BlockVerdict::Blocked);
    assert!(m.visited() - before <= SWEEP_BUDGET as u64);
    // the blocks end; every call after that reclaims a bounded number of them
    now += 61_000_000;
    let mut calls = 0;
    while m.held().0 > 0 {
        let before = m.visited();
        let r = check(&format!("other:{calls}"), now);
        assert!(r.outcome.allowed);
        assert!(
            m.visited() - before <= 2 * SWEEP_BUDGET as u64,
            "one call's work is bounded"
        );
        calls += 1;
        assert!(calls <= KEYS, "reclaimed at SWEEP_BUDGET per call");
    }
    assert!(calls <= KEYS / SWEEP_BUDGET + 1, "{calls} calls to reclaim");
    assert_eq!(m.held(), (0, 0));
    let r = check("user:1", now);
    assert_eq!(
        (r.outcome.allowed, r.blocked),
        (false, BlockVerdict::Clear),
        "denied by its window, no longer blocked"
    );
}

/// The shard index and the table's 7-bit tags (the hash's top bits) come
/// from different bits, so the entries of one shard carry every tag and a lookup
/// compares about one entry. (With the index from the top 6 bits, a shard's entries
/// had two tags.) And an entry stays small: the leases of a concurrency limit are
/// boxed, not stored inline in every state.
#[test]
fn a_shards_entries_carry_every_tag_and_stay_small() {
    let m = MemoryEngine::default();
    let mut tags = vec![std::collections::HashSet::new(); SHARDS];
    for i in 0..20_000 {
        let at = m.locate("p", &format!("user:{i}"));
        tags[at.shard].insert(at.hash >> 57);
    }
    for (shard, t) in tags.iter().enumerate() {
        assert!(t.len() >= 120, "shard {shard}: {} of 128 tags", t.len());
    }
    assert!(
        std::mem::size_of::<Entry>() <= 96,
        "{}",
        std::mem::size_of::<Entry>()
    );
    assert_eq!(std::mem::align_of::<Padded>(), 128);
}

#[test]
fn manual_blocks_expire_and_permanent_ones_stay() {
    let m = MemoryEngine::default();
    m.block("a", Some(100_000), 0, "r");
    m.block("b", None, 0, "forever");
    assert_eq!(m.blocked("a", 50_000), Some(("r".into(), Some(50_000))));
    for i in 0..4 {
        assert!(m.blocked(&format!("x{i}"), 10_000_000).is_none());
    }
    assert_eq!(m.held().0, 1, "the expired block was reclaimed");
    assert_eq!(m.blocked("b", u64::MAX - 1), Some(("forever".into(), None)));
    assert!(m.unblock("b"));
    assert_eq!(m.held().0, 0);
}
