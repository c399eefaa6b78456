//! Per-key window offsets (`"window_offset": "per_key"`): each key's fixed or sliding
//! windows start at its own deterministic offset, so a daily limit does not reset for every
//! key at the same instant. The function is a public contract, pinned by
//! `tests/vectors/precision.json` (`offsets`) and documented in `docs/guide.md`.

use twox_hash::XxHash64;

/// The seed of the offset hash ("window" in ASCII): distinct from routing's seed 0, so
/// that a key's offset says nothing about its shard.
pub const WINDOW_OFFSET_SEED: u64 = 0x7769_6e64_6f77;

/// Where a windowed policy's window boundaries fall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[non_exhaustive]
pub enum WindowOffset {
    /// Windows aligned to the epoch: every key's window resets at the same instant.
    #[default]
    None,
    /// Each key's windows start at [`window_offset_us`] past the aligned boundary.
    PerKey,
}

impl WindowOffset {
    /// The config name (`"none"`, `"per_key"`).
    pub fn name(self) -> &'static str {
        match self {
            WindowOffset::None => "none",
            WindowOffset::PerKey => "per_key",
        }
    }
    pub fn from_name(s: &str) -> Option<WindowOffset> {
        match s {
            "none" => Some(WindowOffset::None),
            "per_key" => Some(WindowOffset::PerKey),
            _ => None,
        }
    }
}

/// The offset (µs, in `[0, window_us)`) of `key`'s windows under `"per_key"`:
/// `xxh64(key as UTF-8, seed WINDOW_OFFSET_SEED) mod window_us`. Key `key`'s windows are
/// the intervals `[o + i·w, o + (i+1)·w)` of Unix time in µs, `o` this offset, `w` the
/// window. `window_us` must be at least 1.
pub fn window_offset_us(key: &str, window_us: u64) -> u64 {
    XxHash64::oneshot(WINDOW_OFFSET_SEED, key.as_bytes()) % window_us.max(1)
}

/// What both engines add to `now` before running a windowed algorithm so that its aligned
/// windows are the key's offset ones: `(w - o) mod w`. (Adding rather than subtracting
/// keeps every clock value, an injected one near 0 too, non-negative.)
#[inline]
pub(crate) fn shift_us(key: &str, window_us: u64) -> u64 {
    let o = window_offset_us(key, window_us);
    if o == 0 {
        0
    } else {
        window_us - o
    }
}
