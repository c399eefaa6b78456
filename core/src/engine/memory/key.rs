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

    /// Whether this is `key`. An inline key is compared whole as three words (the bytes
    /// past its length are zero, and `key` is padded with zeros the same way), with no call.
    #[inline]
    pub(super) fn is(&self, key: &str) -> bool {
        let b = key.as_bytes();
        match self {
            EntryKey::Inline { len, bytes } => {
                if usize::from(*len) != b.len() {
                    return false;
                }
                let mut padded = [0u8; INLINE];
                padded[..b.len()].copy_from_slice(b);
                padded == *bytes
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
}
