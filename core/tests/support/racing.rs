//! What checks racing an override change must show, on either engine.

use shardlimit::{Decision, Source};

/// Every check of `ds` (one key, racing a change of its override from `from` to `to`)
/// was decided by the old limit or the new one, never a mix, and on `source`: each
/// admitted unit took the counter one higher (every count from 1 up, once), the limit it
/// was decided with allowed that count, and as many were admitted as one of the two
/// limits allows at least and the other at most.
pub fn assert_decided_by_one_limit(ds: &[Decision], from: u64, to: u64, source: Source) {
    let mut counts = Vec::new();
    for d in ds {
        assert!(d.limit == from || d.limit == to, "{d:?}");
        assert_eq!(d.source, source);
        if d.allowed {
            let count = d.limit - d.remaining;
            assert!(count <= d.limit, "{d:?}");
            counts.push(count);
        } else {
            assert_eq!(d.remaining, 0, "{d:?}");
        }
    }
    counts.sort_unstable();
    let n = counts.len() as u64;
    assert_eq!(counts, (1..=n).collect::<Vec<_>>(), "each count once");
    assert!(n >= from.min(to) && n <= from.max(to), "{n} admitted");
}
