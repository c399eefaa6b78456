//! The policy name a decision carries.

use std::fmt;
use std::num::NonZeroU64;
use std::sync::Arc;

/// Names up to this many bytes are held inline.
const INLINE: usize = 22;

/// The name of the policy that decided, as a [`super::Decision`] carries it: held in the
/// decision itself when it is short (up to 22 bytes: `login`, `api`, an ad-hoc limit's
/// short id), so a decision's name costs a copy of three words and no reference count
/// that every thread deciding for the policy would share (an `Arc` clone and its drop
/// were two atomic read-modify-writes per check); a longer name shares one allocation.
///
/// Reads as a `str` (`&*name`, `name.as_str()`, `Display`); compares equal to any name
/// with the same text, whichever way each is held.
#[derive(Clone)]
pub struct PolicyName(Repr);

enum Repr {
    Inline(Inline),
    Shared(Arc<str>),
}

/// An inline name as three words: its bytes from the first byte on, and its length + 1 in
/// the last byte (so the last word is never zero: the enum's tag lives in that niche, and
/// a `PolicyName` is three words). Words, not a tag, a length and 22 bytes: a decision is
/// built and then moved (out of its `Result`, into the caller's), and a name copied byte
/// field by byte field at odd offsets was read back as whole words, loads the CPU cannot
/// forward from such stores: each move of a decision waited for them (about a quarter of
/// a warm in-memory check).
#[derive(Clone, Copy)]
#[repr(C)]
struct Inline {
    words: [u64; 2],
    last: NonZeroU64,
}

impl Inline {
    /// The 24 bytes, in memory order.
    #[inline(always)]
    fn bytes(&self) -> &[u8; 24] {
        // SAFETY: `Inline` is `repr(C)`, three `u64`s: 24 initialised bytes, no padding,
        // and `[u8; 24]` has alignment 1
        unsafe { &*(self as *const Inline as *const [u8; 24]) }
    }

    fn new(b: &[u8]) -> Inline {
        debug_assert!(b.len() <= INLINE);
        let mut bytes = [0u8; 24];
        bytes[..b.len()].copy_from_slice(b);
        bytes[23] = b.len() as u8 + 1;
        let w = |at: usize| u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        Inline {
            words: [w(0), w(8)],
            last: NonZeroU64::new(w(16)).expect("the length byte is not zero"),
        }
    }
}

// a name is three words (the niche of `Inline::last` holds the tag)
const _: () = assert!(std::mem::size_of::<Repr>() == 24);

impl Clone for Repr {
    /// The three words copied as they are, after a shared name's count is raised: one
    /// copy whichever the name is, straight from the source to where the clone goes (a
    /// `match` that built either variant merged them in a stack slot first, and the
    /// decision read that slot back as wider loads than its stores, which the CPU cannot
    /// forward).
    #[inline(always)]
    fn clone(&self) -> Repr {
        if let Repr::Shared(s) = self {
            std::mem::forget(Arc::clone(s));
        }
        // SAFETY: an inline name owns nothing, and a shared one's count was raised for
        // this copy just above: a bitwise copy is a clone of either
        unsafe { std::ptr::read(self) }
    }
}

impl PolicyName {
    /// The name as a `str`.
    #[inline]
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Inline(i) => {
                let b = i.bytes();
                let len = usize::from(b[23] - 1);
                // SAFETY: the bytes are those of a `str`, up to `len` (see `From<&str>`)
                unsafe { std::str::from_utf8_unchecked(&b[..len]) }
            }
            Repr::Shared(s) => s,
        }
    }

    /// Whether the name is held in place (cloning it touches no shared memory).
    #[inline]
    pub(crate) fn is_inline(&self) -> bool {
        matches!(self.0, Repr::Inline(_))
    }
}

impl From<&str> for PolicyName {
    fn from(s: &str) -> PolicyName {
        let b = s.as_bytes();
        if b.len() <= INLINE {
            PolicyName(Repr::Inline(Inline::new(b)))
        } else {
            PolicyName(Repr::Shared(Arc::from(s)))
        }
    }
}

impl From<String> for PolicyName {
    fn from(s: String) -> PolicyName {
        PolicyName::from(s.as_str())
    }
}

impl From<&String> for PolicyName {
    fn from(s: &String) -> PolicyName {
        PolicyName::from(s.as_str())
    }
}

impl From<Arc<str>> for PolicyName {
    /// Short names are copied in place; a longer one keeps this `Arc`.
    fn from(s: Arc<str>) -> PolicyName {
        if s.len() <= INLINE {
            PolicyName::from(&*s)
        } else {
            PolicyName(Repr::Shared(s))
        }
    }
}

impl From<&Arc<str>> for PolicyName {
    fn from(s: &Arc<str>) -> PolicyName {
        PolicyName::from(s.clone())
    }
}

impl From<PolicyName> for String {
    fn from(n: PolicyName) -> String {
        n.as_str().to_string()
    }
}

impl From<PolicyName> for Arc<str> {
    fn from(n: PolicyName) -> Arc<str> {
        match n.0 {
            Repr::Shared(s) => s,
            Repr::Inline(_) => Arc::from(n.as_str()),
        }
    }
}

impl std::ops::Deref for PolicyName {
    type Target = str;
    #[inline]
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for PolicyName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl std::borrow::Borrow<str> for PolicyName {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq for PolicyName {
    fn eq(&self, other: &PolicyName) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for PolicyName {}

impl PartialEq<str> for PolicyName {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for PolicyName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for PolicyName {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl std::hash::Hash for PolicyName {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_str().hash(h)
    }
}

impl PartialOrd for PolicyName {
    fn partial_cmp(&self, other: &PolicyName) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PolicyName {
    fn cmp(&self, other: &PolicyName) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_inline_long_ones_shared_and_both_read_back() {
        let long = "p".repeat(INLINE + 1);
        let edge = "e".repeat(INLINE);
        for s in ["", "api", "é✓", edge.as_str(), long.as_str()] {
            let n = PolicyName::from(s);
            assert_eq!(n.as_str(), s);
            assert_eq!(n.is_inline(), s.len() <= INLINE);
            assert_eq!(n, PolicyName::from(Arc::<str>::from(s)));
            assert_eq!(n.clone(), n);
            assert_eq!(n.to_string(), s);
            assert_eq!(format!("{n:?}"), format!("{s:?}"));
            assert_eq!(&*Arc::<str>::from(n), s);
        }
        assert_ne!(PolicyName::from("ab"), PolicyName::from("ab\0"));
        // every inline length reads back as itself, after a clone too
        for n in 0..=INLINE + 1 {
            let s: String = (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
            let name = PolicyName::from(s.as_str());
            assert_eq!(name.clone().as_str(), s, "len {n}");
            assert_eq!(name.is_inline(), n <= INLINE);
        }
        assert_eq!(std::mem::size_of::<PolicyName>(), 24);
    }
}
