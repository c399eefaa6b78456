//! Keys: the longest accepted and the rule every binding shares (tests/vectors/keys.json).
//! Below the engines and the limiter, which both check keys.

use crate::error::{Error, Result};

pub(crate) mod hash;

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// A key a caller passed: not empty, at most [`MAX_KEY_LEN`] bytes, no NUL.
pub(crate) fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("key", "must not be empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::invalid(
            "key",
            format!("is {} bytes long; the maximum is {MAX_KEY_LEN}", key.len()),
        ));
    }
    // The rule every binding shares (tests/vectors/keys.json): UTF-8 (the type), no NUL.
    // A NUL would let `a\0b` under one scope collide with composite keys built of parts.
    if has_nul(key.as_bytes()) {
        let at = key.bytes().position(|b| b == 0).unwrap_or(0);
        return Err(Error::invalid(
            "key",
            format!("contains a NUL byte at offset {at}; keys are UTF-8 text without NUL"),
        ));
    }
    Ok(())
}

/// Whether `b` holds a zero byte: eight bytes at a time (a zero byte is one whose
/// `byte - 1` borrows while its top bit was clear), the bytes left over as the last eight
/// (overlapping words already read), and a key shorter than a word byte by byte (the byte
/// loop was about a tenth of the instructions of a memory check).
#[inline]
fn has_nul(b: &[u8]) -> bool {
    const LO: u64 = u64::from_ne_bytes([0x01; 8]);
    const HI: u64 = u64::from_ne_bytes([0x80; 8]);
    let zero_in = |w: &[u8]| {
        let v = u64::from_ne_bytes(w.try_into().expect("8 bytes"));
        v.wrapping_sub(LO) & !v & HI != 0
    };
    let mut words = b.chunks_exact(8);
    for w in &mut words {
        if zero_in(w) {
            return true;
        }
    }
    match words.remainder() {
        [] => false,
        _ if b.len() >= 8 => zero_in(&b[b.len() - 8..]),
        rest => rest.contains(&0),
    }
}

#[cfg(test)]
mod tests {
    use super::has_nul;

    #[test]
    fn a_nul_is_found_at_every_offset_and_no_other_byte_is_one() {
        for len in 0..=40usize {
            // every non-zero byte value, high bits included (UTF-8 continuation bytes)
            let clean: Vec<u8> = (0..len).map(|i| (i * 37 % 255 + 1) as u8).collect();
            assert!(!has_nul(&clean), "len {len}");
            assert!(!has_nul(&vec![0x80; len]) && !has_nul(&vec![0xff; len]));
            assert!(!has_nul(&vec![0x01; len]), "0x01 borrows into no NUL");
            for at in 0..len {
                let mut b = clean.clone();
                b[at] = 0;
                assert!(has_nul(&b), "len {len} NUL at {at}");
            }
        }
        assert!(!has_nul("é✓ user:00001 — ünïcödé".as_bytes()));
    }
}
