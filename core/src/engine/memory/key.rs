//! The key of an in-memory entry, held in the entry itself when it is short (most are:
//! `user:12345`, an IP address): a lookup then compares bytes already on the entry's cache
//! line instead of following a pointer to the heap and calling `memcmp` (the heap line and
//! the call were about a tenth of a check). Longer keys are boxed.

/// Keys up to this many bytes are stored inline.
pub(super) const INLINE: usize = 22;

pub(super) enum EntryKey {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<str>),
}

impl EntryKey {
    pub(super) fn new(key: &str) -> EntryKey {
        let b = key.as_bytes();
        if b.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..b.len()].copy_from_slice(b);
            EntryKey::Inline {
                len: b.len() as u8,
                bytes,
            }
        } else {
            EntryKey::Heap(key.into())
        }
    }

    /// Whether this is `key`. An inline key is compared as the same few (overlapping)
    /// words read from both at the same offsets, covering all `len` bytes: equal lengths
    /// and equal words are equal bytes. No copy, no call (padding the key into a buffer to
    /// compare whole arrays called `memcpy` for its variable length).
    #[inline]
    pub(super) fn is(&self, key: &str) -> bool {
        let b = key.as_bytes();
        match self {
            EntryKey::Inline { len, bytes } => {
                usize::from(*len) == b.len() && same_short(&bytes[..b.len()], b)
            }
            EntryKey::Heap(k) => k.as_bytes() == b,
        }
    }

    #[cfg(test)]
    pub(super) fn as_str(&self) -> &str {
        match self {
            EntryKey::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).expect("stored from a str")
            }
            EntryKey::Heap(k) => k,
        }
    }
}

/// `a == b` for two slices of one length of at most [`INLINE`] bytes, by loads at fixed
/// offsets (the first and last 8, 4, 2 or 1 bytes, and the middle 8 above 16 bytes).
#[inline(always)]
fn same_short(a: &[u8], b: &[u8]) -> bool {
    debug_assert!(a.len() == b.len() && a.len() <= INLINE);
    let n = a.len();
    #[inline(always)]
    fn w8(s: &[u8], at: usize) -> u64 {
        u64::from_ne_bytes(s[at..at + 8].try_into().expect("8 bytes"))
    }
    #[inline(always)]
    fn w4(s: &[u8], at: usize) -> u32 {
        u32::from_ne_bytes(s[at..at + 4].try_into().expect("4 bytes"))
    }
    #[inline(always)]
    fn w2(s: &[u8], at: usize) -> u16 {
        u16::from_ne_bytes(s[at..at + 2].try_into().expect("2 bytes"))
    }
    if n >= 8 {
        let ends = (w8(a, 0) ^ w8(b, 0)) | (w8(a, n - 8) ^ w8(b, n - 8));
        let mid = if n > 16 { w8(a, 8) ^ w8(b, 8) } else { 0 };
        ends | mid == 0
    } else if n >= 4 {
        (w4(a, 0) ^ w4(b, 0)) | (w4(a, n - 4) ^ w4(b, n - 4)) == 0
    } else if n >= 2 {
        (w2(a, 0) ^ w2(b, 0)) | (w2(a, n - 2) ^ w2(b, n - 2)) == 0
    } else {
        n == 0 || a[0] == b[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_and_heap_keys_match_exactly_their_own_bytes() {
        let long = "k".repeat(INLINE + 1);
        let edge = "e".repeat(INLINE);
        for k in ["a", "user:00001", "é✓", edge.as_str(), long.as_str()] {
            let e = EntryKey::new(k);
            assert_eq!(e.as_str(), k);
            assert!(e.is(k));
            assert_eq!(matches!(e, EntryKey::Inline { .. }), k.len() <= INLINE);
            // a prefix, an extension and one changed byte are other keys
            if let Some(prefix) = k.get(..k.len() - 1) {
                assert!(!e.is(prefix));
            }
            assert!(!e.is(&format!("{k}x")));
            let mut changed = k.as_bytes().to_vec();
            *changed.last_mut().unwrap() ^= 1;
            if let Ok(changed) = std::str::from_utf8(&changed) {
                assert!(!e.is(changed));
            }
        }
        // a key that is the inline one with its padding written out is not it (keys have
        // no NUL, but the comparison does not rely on that)
        assert!(!EntryKey::new("ab").is("ab\0"));
        assert!(!EntryKey::new("ab\0").is("ab"));
        assert!(!EntryKey::new(&edge).is(&long[..INLINE - 1]));
    }

    /// Every inline length, and one changed byte at every offset: the word loads cover
    /// every byte of every length.
    #[test]
    fn every_byte_of_every_inline_length_is_compared() {
        for n in 0..=INLINE {
            let k: String = (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
            let e = EntryKey::new(&k);
            assert!(e.is(&k), "len {n}");
            for at in 0..n {
                let mut other = k.clone().into_bytes();
                other[at] = b'Z';
                let other = String::from_utf8(other).unwrap();
                assert!(!e.is(&other), "len {n}, byte {at}");
            }
        }
    }
}
