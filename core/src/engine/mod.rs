//! The two engines that decide: in memory ([`memory`], with the algorithms' arithmetic in
//! [`algo`]) and on Redis shards ([`redis`], running the scripts of `core/lua/`). For the
//! same (time, key, cost) sequence both give the same decisions.

pub(crate) mod algo;
pub(crate) mod exact;
pub(crate) mod expiry;
pub(crate) mod memory;
pub(crate) mod outcome;
pub(crate) mod redis;
pub(crate) mod settle;

/// What a check does with the units it decides on: the limiter's check, peek and acquire
/// as one value rather than a `peek` flag beside an optional lease id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallMode<'a> {
    /// Take them when allowed (a check).
    Check,
    /// Only look: nothing is taken, counted or reported (a peek).
    Peek,
    /// Take them under the lease with this id (an acquire of a concurrency policy).
    Acquire(&'a str),
}

impl<'a> CallMode<'a> {
    #[inline]
    pub(crate) fn is_peek(self) -> bool {
        self == CallMode::Peek
    }

    /// The lease the units are taken under, for an acquire.
    #[inline]
    pub(crate) fn lease(self) -> Option<&'a str> {
        match self {
            CallMode::Acquire(id) => Some(id),
            _ => None,
        }
    }
}
