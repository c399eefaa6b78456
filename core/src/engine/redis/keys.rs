//! Redis key names: one layout for every key shardlimit writes, in which user keys, policy
//! names and the library's own namespaces cannot collide (`docs/keys.md`).
//!
//! ```text
//! state            {prefix}s:{policy}:{algo}:{T}K
//!                  {prefix}s:{policy}#{i}:{algo}:{T}K   (limit i > 0 of a multi-limit policy)
//! denial counter   {prefix}d:{policy}:{algo}:{T}K     (automatic blocking)
//! block entry      {prefix}b:{T}K                     (shared by every policy)
//! override         {prefix}o:{policy}:{T}K            (per-key overrides)
//! shadow counts    {prefix}h:{policy}                 (one hash per policy per shard)
//!                  {prefix}events                     (the event stream)
//! ```
//!
//! `{T}` is the key's hash tag: T is its routing key ([`routing::hash_tag`]), so every Redis
//! key one check touches lands in the Cluster slot of its routing key. K is empty when the
//! key is its own tag (T = key, the common case), else `=<byte length>:<key>`.
//!
//! Why this cannot collide: the prefix holds no braces and policy names no `:` or `#`
//! (both validated; `policy#i` scopes the limits after the first of a multi-limit policy,
//! so no scope of one policy is another's), and algorithm codes are fixed two-letter names, so the namespace letter and
//! the policy scope end at a known `:`, the first `{` is the tag's, T ends at the first `}`,
//! and K is either empty or length-prefixed. The scripts' own `:<window index>` suffixes
//! start with `:`, which K never does. So distinct (namespace, policy, algorithm, key) give
//! distinct names, with or without a suffix; the internal namespaces are one letter and a
//! `:` (or the whole word `events`), which no state, denial or block key can spell.

use crate::routing;

/// The namespace letters in use or reserved after the prefix (`o`: per-key overrides,
/// `h`: shadow counts).
pub const RESERVED_NAMESPACES: [&str; 5] = ["s", "d", "b", "o", "h"];

/// Appends `{T}K` for `key` (see the layout above).
fn tagged(out: &mut String, key: &str) {
    let tag = routing::hash_tag(key);
    out.push('{');
    out.push_str(&tag);
    out.push('}');
    if *tag != *key {
        out.push('=');
        out.push_str(itoa::Buffer::new().format(key.len()));
        out.push(':');
        out.push_str(key);
    }
}

/// One name: prefix, namespace (`x:`), the `policy:algo:` scope (if any), then `{T}K`.
fn key_name(prefix: &str, ns: &str, key_scope: &str, key: &str) -> String {
    let mut s =
        String::with_capacity(prefix.len() + ns.len() + key_scope.len() + 2 * key.len() + 12);
    s.push_str(prefix);
    s.push_str(ns);
    s.push_str(key_scope);
    tagged(&mut s, key);
    s
}

/// The Redis key holding `key`'s state for the policy whose scope is `key_scope`
/// (`name:algo:`, see `Policy`); windowed algorithms add `:<window index>`.
pub fn state_key(prefix: &str, key_scope: &str, key: &str) -> String {
    key_name(prefix, "s:", key_scope, key)
}

/// The block-list entry of `key` (shared by every policy).
pub fn block_key(prefix: &str, key: &str) -> String {
    key_name(prefix, "b:", "", key)
}

/// The denial counter of automatic blocking for (policy, key).
pub fn denial_key(prefix: &str, key_scope: &str, key: &str) -> String {
    key_name(prefix, "d:", key_scope, key)
}

/// The hash of shadow-mode denial counts of policy `policy` on one shard: field = user
/// key, value = count (field "" counts the keys beyond the hash's bound). The policy name
/// ends the name (no `:` and no `{` follow), so it cannot spell any other key.
pub fn shadow_key(prefix: &str, policy: &str) -> String {
    format!("{prefix}h:{policy}")
}

/// The override entry of (policy, key): `<version> <limit JSON>` (`limiter/overrides.rs`).
/// The scope is the policy's name alone: an override may change the algorithm.
pub fn override_key(prefix: &str, policy: &str, key: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + policy.len() + 2 * key.len() + 16);
    s.push_str(prefix);
    s.push_str("o:");
    s.push_str(policy);
    s.push(':');
    tagged(&mut s, key);
    s
}

/// The pattern of every override entry of `policy` (SCAN MATCH): `*?[]\` cannot occur in
/// a prefix or policy name, so nothing needs escaping but the prefix's own characters.
pub fn override_pattern(prefix: &str, policy: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + policy.len() + 8);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            s.push('\\');
        }
        s.push(c);
    }
    s.push_str("o:");
    s.push_str(policy);
    s.push_str(":{*");
    s
}

/// The user key in the override entry name `name` of `policy`, the inverse of
/// [`override_key`]; `None` for a name it cannot have made.
pub fn override_user_key(prefix: &str, policy: &str, name: &str) -> Option<String> {
    let rest = name.strip_prefix(prefix)?.strip_prefix("o:")?;
    let rest = rest.strip_prefix(policy)?.strip_prefix(":{")?;
    let close = rest.find('}')?;
    let (tag, k) = (&rest[..close], &rest[close + 1..]);
    let key = if k.is_empty() {
        tag.to_string()
    } else {
        let k = k.strip_prefix('=')?;
        let colon = k.find(':')?;
        let len: usize = k[..colon].parse().ok()?;
        let key = &k[colon + 1..];
        if key.len() != len {
            return None;
        }
        key.to_string()
    };
    (override_key(prefix, policy, &key) == name).then_some(key)
}

/// The Redis stream events are written to (one per shard).
pub fn events_key(prefix: &str) -> String {
    format!("{prefix}events")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        assert_eq!(
            state_key("sl:", "api:tb:", "user:1"),
            "sl:s:api:tb:{user:1}"
        );
        assert_eq!(state_key("sl:", "api:tb:", "{u}"), "sl:s:api:tb:{u}=3:{u}");
        assert_eq!(
            state_key("sl:", "api:tb:", "{acme}:user:1"),
            "sl:s:api:tb:{acme}=13:{acme}:user:1"
        );
        assert_eq!(block_key("sl:", "user:1"), "sl:b:{user:1}");
        assert_eq!(denial_key("sl:", "api:tb:", "u"), "sl:d:api:tb:{u}");
        assert_eq!(events_key("sl:"), "sl:events");
        assert_eq!(override_key("sl:", "api", "user:1"), "sl:o:api:{user:1}");
        for k in [
            "user:1",
            "{u}",
            "{acme}:user:1",
            "a}b",
            "a%7Db",
            "{}x",
            "é{é}",
        ] {
            let name = override_key("sl:", "api", k);
            assert_eq!(
                override_user_key("sl:", "api", &name).as_deref(),
                Some(k),
                "{k}"
            );
            assert_eq!(override_user_key("sl:", "ap", &name), None);
        }
        assert_eq!(override_user_key("sl:", "api", "sl:o:api:{u}=2:u"), None);
        assert_eq!(override_pattern("sl:", "api"), "sl:o:api:{*");
        // a routing key holding `}` (no valid tag) is escaped inside the tag
        assert_eq!(block_key("sl:", "a}b"), "sl:b:{a%7Db}=3:a}b");
    }

    #[test]
    fn issue_reproductions_are_distinct() {
        // `u` and `{u}`: one routing key, two keys
        assert_ne!(
            state_key("sl:", "p:fw:", "u"),
            state_key("sl:", "p:fw:", "{u}")
        );
        assert_ne!(block_key("sl:", "u"), block_key("sl:", "{u}"));
        // a policy named `block` cannot reach the block list
        assert_ne!(
            state_key("sl:", "block:tb:", "victim"),
            block_key("sl:", "tb:{victim}")
        );
        // a fixed-window counter (`:<index>` suffix) of `u` is not the state of another key
        let suffixed = format!("{}:5", state_key("sl:", "p:fw:", "u"));
        for k in ["u:5", "{u}:5", "{u}", ":5"] {
            assert_ne!(suffixed, state_key("sl:", "p:fw:", k), "{k}");
        }
    }
}
