//! A warm in-memory check allocates nothing. A counting global allocator counts
//! the allocations of the calling thread (so the test harness's other threads do not
//! count) while checks of keys that already have state run.

use shardlimit::{Limit, Limiter, Policy};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

#[path = "../benches/fixtures/memory_policies.rs"]
mod fixtures;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

#[test]
fn a_warm_memory_check_allocates_nothing() {
    let limiter = Limiter::memory();
    // the benchmark's policies (`benches/memory.rs`): what is measured is what is checked
    let policies = fixtures::memory_policies().map(|(_, p)| p);
    let keys: Vec<String> = (0..100).map(|i| format!("user:{i:05}")).collect();
    // warm: each (policy, key) gets its state, each policy its counters
    for p in &policies {
        for k in &keys {
            assert!(limiter.check_blocking(k, p, 1).unwrap().allowed);
        }
    }
    let before = allocs();
    let mut allowed = 0;
    for _ in 0..20 {
        for p in &policies {
            for k in &keys {
                allowed += u64::from(limiter.check_blocking(k, p, 1).unwrap().allowed);
            }
        }
    }
    let made = allocs() - before;
    assert_eq!(
        allowed,
        20 * 5 * 100,
        "every check allowed (5 policies, 100 keys)"
    );
    assert_eq!(made, 0, "{made} allocations in 10,000 warm checks");
    // the counting is real: a check of a new key allocates its entry (a key this long is
    // boxed; a short one is held in the entry, which the table may have room for)
    let before = allocs();
    assert!(
        limiter
            .check_blocking("a-new-key-longer-than-22-bytes", &policies[0], 1)
            .unwrap()
            .allowed
    );
    assert!(
        allocs() > before,
        "the allocator counts this thread's allocations"
    );
}

/// A binding's ad-hoc check makes its policy per call: the check itself (counters found by
/// name, the decision's name) allocates nothing beyond the policy, once the key is warm.
#[test]
fn a_check_of_a_policy_made_for_the_call_allocates_nothing_more() {
    let limiter = Limiter::memory();
    let limit = Limit::fixed_window(1_000_000, Duration::from_secs(3600));
    let fresh = || Policy::try_from(limit.clone()).unwrap();
    assert!(limiter.check_blocking("k", &fresh(), 1).unwrap().allowed);
    for _ in 0..100 {
        let p = fresh();
        let before = allocs();
        let d = limiter.check_blocking("k", &p, 1).unwrap();
        assert!(d.allowed);
        assert_eq!(allocs() - before, 0, "the check allocated");
        assert_eq!(&*d.policy, limit.id());
    }
}
