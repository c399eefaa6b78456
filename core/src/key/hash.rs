//! The hash of the in-memory engine's entry of a (scope, key), and the key's validity, in
//! one pass over the key (here, below the policies, which keep their scope's seed). The
//! scope is hashed into a seed (once per policy on the direct check path,
//! `PolicyInner::memory_seed`), and the key's bytes are read as the same few words that
//! both hash it and tell whether it holds a NUL. (Validating the key and hashing the pair
//! were two passes over it and a hash of the scope, about a tenth of a check.)

use crate::key::MAX_KEY_LEN;

const K0: u64 = 0x243f_6a88_85a3_08d3;
const K1: u64 = 0x1319_8a2e_0370_7344;
const K2: u64 = 0xa409_3822_299f_31d0;
const K3: u64 = 0x082e_fa98_ec4e_6c89;

/// The 128-bit product of `a` and `b`, its halves folded (foldhash's and wyhash's mixer).
#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

#[inline(always)]
fn w8(s: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(s[at..at + 8].try_into().expect("8 bytes"))
}

#[inline(always)]
fn w4(s: &[u8], at: usize) -> u64 {
    u64::from(u32::from_le_bytes(
        s[at..at + 4].try_into().expect("4 bytes"),
    ))
}

/// Non-zero when some byte of `v` is zero (exact: a byte whose `byte - 1` borrows while
/// its top bit was clear; a borrow it passes on cannot make a later byte look zero unless
/// an earlier byte is zero).
#[inline(always)]
fn zero_byte(v: u64) -> u64 {
    const LO: u64 = u64::from_ne_bytes([0x01; 8]);
    const HI: u64 = u64::from_ne_bytes([0x80; 8]);
    v.wrapping_sub(LO) & !v & HI
}

/// [`zero_byte`] of the low 4 bytes of `v` (the rest zero).
#[inline(always)]
fn zero_byte4(v: u64) -> u64 {
    zero_byte(v | 0xffff_ffff_0000_0000)
}

/// The seed of `scope`: what [`hash_key`] starts from for the keys of that scope.
pub(crate) fn scope_seed(scope: &str) -> u64 {
    let (mut s, b) = (K0 ^ scope.len() as u64, scope.as_bytes());
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        s = fold(s ^ w8(c, 0), K1);
    }
    let mut last = [0u8; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    fold(s ^ u64::from_le_bytes(last), K2)
}

/// The hash of `key` under the scope whose seed is `seed`, and whether `key` is one a
/// caller may pass (`crate::key::validate_key`: not empty, at most
/// [`MAX_KEY_LEN`] bytes, no NUL). Every byte of the key is read once, into both.
#[inline(always)]
pub(crate) fn hash_key(seed: u64, key: &[u8]) -> (u64, bool) {
    let n = key.len();
    let (a, b, nul) = if n >= 8 {
        if n > 16 {
            return hash_long(seed, key);
        }
        let (a, b) = (w8(key, 0), w8(key, n - 8));
        (a, b, zero_byte(a) | zero_byte(b))
    } else if n >= 4 {
        let (a, b) = (w4(key, 0), w4(key, n - 4));
        (a, b, zero_byte4(a) | zero_byte4(b))
    } else if n > 0 {
        let (x, y, z) = (key[0], key[n / 2], key[n - 1]);
        let a = (u64::from(x) << 16) | (u64::from(y) << 8) | u64::from(z);
        (a, 0, u64::from(x == 0 || y == 0 || z == 0))
    } else {
        (0, 0, 1)
    };
    // (the length goes in after the words: xored into a word, it could cancel a
    // difference in that word's low byte between keys of two lengths)
    let h = fold(a ^ seed ^ K1, b ^ K2);
    (fold(h ^ n as u64, seed ^ K3), nul == 0)
}

/// [`hash_key`] of a key longer than 16 bytes: 16 bytes at a time, then its last 16.
#[inline(never)]
fn hash_long(seed: u64, key: &[u8]) -> (u64, bool) {
    let n = key.len();
    let (mut s, mut nul) = (seed ^ K0, 0);
    let mut at = 0;
    while at + 16 < n {
        let (a, b) = (w8(key, at), w8(key, at + 8));
        nul |= zero_byte(a) | zero_byte(b);
        s = fold(a ^ s ^ K1, b ^ K2);
        at += 16;
    }
    let (a, b) = (w8(key, n - 16), w8(key, n - 8));
    nul |= zero_byte(a) | zero_byte(b);
    let h = fold(a ^ s ^ K1, b ^ K2);
    (fold(h ^ n as u64, seed ^ K3), nul == 0 && n <= MAX_KEY_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Valid exactly when `validate_key` accepts: every length up to past the limit, a NUL
    /// at every offset, bytes with their top bit set (a borrow never fakes a NUL).
    #[test]
    fn validity_is_the_key_rule_at_every_length_and_offset() {
        for n in (0..=64).chain([MAX_KEY_LEN - 1, MAX_KEY_LEN, MAX_KEY_LEN + 1]) {
            for fill in [0x01u8, 0x80, 0xff, b'k'] {
                let clean = vec![fill; n];
                let key = std::str::from_utf8(&clean).ok();
                let (_, ok) = hash_key(7, &clean);
                let want = match key {
                    Some(k) => crate::key::validate_key(k).is_ok(),
                    None => n > 0 && n <= MAX_KEY_LEN, // (not UTF-8: only the rule's bytes)
                };
                assert_eq!(ok, want, "len {n} fill {fill:#x}");
                for at in 0..n.min(64) {
                    let mut b = clean.clone();
                    b[at] = 0;
                    assert!(!hash_key(7, &b).1, "len {n} NUL at {at}");
                }
            }
        }
    }

    /// Keys differing in one byte, and scopes differing in one byte, hash apart; the bits
    /// the shards and the table use are spread.
    #[test]
    fn one_byte_apart_hashes_apart() {
        let mut seen = std::collections::HashSet::new();
        for scope in ["fw", "fx", "fw#1", "a-much-longer-policy-name"] {
            let seed = scope_seed(scope);
            for n in 1..=40usize {
                for i in 0..64u8 {
                    let mut k = vec![b'k'; n];
                    k[usize::from(i) % n] = b'0' + i;
                    assert!(seen.insert((hash_key(seed, &k).0, scope, k.clone())));
                }
            }
        }
        let hashes: std::collections::HashSet<u64> = seen.iter().map(|(h, ..)| *h).collect();
        assert_eq!(
            hashes.len(),
            seen.len(),
            "no collision among {}",
            seen.len()
        );
        assert_ne!(scope_seed("ab"), scope_seed("ab\0"));
    }
}
