//! Client-side shard routing, a public contract shared by every language:
//!
//! `shard = jump_consistent_hash(xxh64(routing_key, seed 0), shards)`, where the routing key
//! is the part of the key between the first `{` and the next `}` when that part is
//! non-empty (Redis Cluster's hash-tag rule), otherwise the whole key, as UTF-8 bytes.

use twox_hash::XxHash64;

/// The bytes of `key` that decide its shard (Redis Cluster's hash-tag rule).
pub fn routing_key(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        let rest = &key[open + 1..];
        if let Some(close) = rest.find('}') {
            if close > 0 {
                return &rest[..close];
            }
        }
    }
    key
}

/// Jump consistent hash (Lamping & Veach, 2014): maps `key` to a bucket in
/// `0..buckets`, moving only ~1/(n+1) of keys when a bucket is added. `buckets` must be ≥ 1.
pub fn jump_consistent_hash(mut key: u64, buckets: u32) -> u32 {
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < buckets as i64 {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// xxh64 of the routing key with seed 0.
pub fn key_hash(key: &str) -> u64 {
    XxHash64::oneshot(0, routing_key(key).as_bytes())
}

/// The shard index of `key` among `shards` shards (`shards` ≥ 1).
pub fn shard_index(key: &str, shards: u32) -> u32 {
    jump_consistent_hash(key_hash(key), shards.max(1))
}

/// CRC16-XMODEM, the checksum Redis Cluster maps keys to slots with.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for b in data {
        crc ^= (*b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash tag shardlimit puts in braces in every Redis key it writes for `key`: its
/// routing key, with `}` written `%7D` (a routing key holds a `}` only when it is the whole
/// key), so that Redis reads back exactly this tag (docs/keys.md).
pub fn hash_tag(key: &str) -> std::borrow::Cow<'_, str> {
    let r = routing_key(key);
    if r.contains('}') {
        std::borrow::Cow::Owned(r.replace('}', "%7D"))
    } else {
        std::borrow::Cow::Borrowed(r)
    }
}

/// The Redis Cluster slot of every Redis key shardlimit writes for `key`: they all carry
/// the hash tag [`hash_tag`] of `key`.
pub fn cluster_slot(key: &str) -> u16 {
    crc16(hash_tag(key).as_bytes()) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn hash_tag_rule() {
        assert_eq!(routing_key("user:1"), "user:1");
        assert_eq!(routing_key("{tenant}:user:1"), "tenant");
        assert_eq!(routing_key("a{b}c{d}"), "b");
        assert_eq!(routing_key("a{}b{c}"), "a{}b{c}");
        assert_eq!(routing_key("a{b"), "a{b");
        assert_eq!(routing_key("a}b{c}"), "c");
    }
    #[test]
    fn xxh64_known_values() {
        // Reference values of XXH64 with seed 0 (xxHash's own test suite).
        assert_eq!(XxHash64::oneshot(0, b""), 0xEF46_DB37_51D8_E999);
        assert_eq!(XxHash64::oneshot(0, b"a"), 0xD24E_C4F1_A98C_6E5B);
    }
    #[test]
    fn cluster_slots_match_redis() {
        // CLUSTER KEYSLOT answers from Redis' documentation and test suite
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(cluster_slot("foo"), 12182);
        assert_eq!(
            cluster_slot("{user1000}.following"),
            cluster_slot("{user1000}.followers")
        );
    }

    #[test]
    fn jump_hash_properties() {
        for k in 0..1000u64 {
            assert_eq!(jump_consistent_hash(k, 1), 0);
            let a = jump_consistent_hash(k, 10);
            let b = jump_consistent_hash(k, 11);
            // a key either stays or moves to the new bucket, never between old ones
            assert!(b == a || b == 10);
        }
    }
}
