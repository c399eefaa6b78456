//! Property tests (bounded: a few seconds in all) of the config loader, the Redis key layout
//! and routing: no input makes the loader panic, distinct (namespace, policy, key) never
//! share a Redis key, every Redis key of one user key carries the tag of its Cluster slot,
//! and routing follows the shared vectors.

use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::Value;
use shardlimit::config::Config;
use shardlimit::keys::{
    block_key, denial_key, events_key, override_key, override_user_key, shadow_key, state_key,
};
use shardlimit::routing::{cluster_slot, hash_tag, routing_key, shard_index};
use std::collections::HashMap;

const CODES: [&str; 6] = ["fw", "sw", "sl", "tb", "lb", "cc"];

/// Keys made mostly of the characters that matter to the layout.
fn user_key() -> impl Strategy<Value = String> {
    vec(
        prop_oneof![
            Just('{'),
            Just('}'),
            Just(':'),
            Just('='),
            Just('%'),
            Just('a'),
            Just('b'),
            Just('1'),
            Just('3'),
            any::<char>(),
        ],
        1..12,
    )
    .prop_map(|c| c.into_iter().collect())
}

fn policy_name() -> impl Strategy<Value = String> {
    "[a-z0-9_.-]{1,6}"
}

/// The state scope of a policy, or of limit `i > 0` of a multi-limit policy (`name#i`).
fn policy_scope() -> impl Strategy<Value = String> {
    (policy_name(), proptest::option::of(1usize..16)).prop_map(|(name, i)| match i {
        Some(i) => format!("{name}#{i}"),
        None => name,
    })
}

/// Redis Cluster's rule: the bytes between the first `{` and the next `}` when non-empty.
fn redis_tag(name: &str) -> &str {
    if let Some(open) = name.find('{') {
        if let Some(close) = name[open + 1..].find('}') {
            if close > 0 {
                return &name[open + 1..open + 1 + close];
            }
        }
    }
    name
}

/// Every Redis key name the layout gives `(policy, code, key)`, with what it stands for.
fn names(prefix: &str, policy: &str, code: &str, key: &str) -> Vec<(String, String)> {
    let scope = format!("{policy}:{code}:");
    let state = state_key(prefix, &scope, key);
    let mut out = vec![
        (state.clone(), format!("state {scope} {key:?}")),
        (
            format!("{state}:7"),
            format!("state {scope} {key:?} window 7"),
        ),
        (
            format!("{state}:-1"),
            format!("state {scope} {key:?} window -1"),
        ),
        (
            denial_key(prefix, &scope, key),
            format!("denial {scope} {key:?}"),
        ),
        (block_key(prefix, key), format!("block {key:?}")),
        // one per (policy, key), whatever the algorithm
        (
            override_key(prefix, policy, key),
            format!("override {policy} {key:?}"),
        ),
    ];
    out.push((events_key(prefix), "events".into()));
    out.push((
        shadow_key(prefix, policy),
        format!("shadow counts {policy}"),
    ));
    out
}

/// Arbitrary JSON made with the config's own field names, so that it gets past the
/// top-level checks and into every validator.
fn json() -> impl Strategy<Value = Value> {
    let words = prop_oneof![
        Just("shards"),
        Just("cluster"),
        Just("nodes"),
        Just("name"),
        Just("url"),
        Just("sentinel"),
        Just("master"),
        Just("password"),
        Just("db"),
        Just("policies"),
        Just("algorithm"),
        Just("limit"),
        Just("window"),
        Just("capacity"),
        Just("refill_per_sec"),
        Just("leak_per_sec"),
        Just("max"),
        Just("lease_ttl"),
        Just("on_error"),
        Just("auto_block"),
        Just("local_admission"),
        Just("shadow"),
        Just("near_limit"),
        Just("key_prefix"),
        Just("timeout_ms"),
        Just("reshard_handoff"),
        Just("events"),
        Just("stream_maxlen"),
        Just("spin_wait"),
        Just("instances"),
        Just("fixed_window"),
        Just("token_bucket"),
        Just("sliding_log"),
        Just("concurrency"),
        Just("1h"),
        Just("redis://127.0.0.1:1"),
        Just("redis+sentinel://h:1/m"),
        Just("x"),
    ]
    .prop_map(str::to_string);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop_oneof![0u64..10, Just(u64::MAX), Just(1 << 53)].prop_map(Value::from),
        words.clone().prop_map(Value::String),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 48, 6, move |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            vec((words.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn config_loader_never_panics_on_bytes(bytes in vec(any::<u8>(), 0..256)) {
        let _ = Config::from_json(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn config_loader_never_panics_on_json(v in json(), policies in json()) {
        let _ = Config::from_value(&v);
        let _ = Config::from_json(&v.to_string());
        // the same under a valid top level, so the nested validators run
        let doc = serde_json::json!({"policies": {"p": v.clone(), "q": policies}});
        let _ = Config::from_json(&doc.to_string());
        let doc = serde_json::json!({"shards": [v.clone()]});
        let _ = Config::from_json(&doc.to_string());
        let doc = serde_json::json!({"shards": [{"name": "a", "sentinel": v}]});
        let _ = Config::from_json(&doc.to_string());
    }

    #[test]
    fn distinct_pairs_give_distinct_redis_keys(
        pairs in vec((policy_scope(), 0..CODES.len(), user_key()), 1..24),
        prefix in prop_oneof![Just(""), Just("sl:"), Just("app1:")],
    ) {
        let mut seen: HashMap<String, String> = HashMap::new();
        for (policy, code, key) in &pairs {
            for (name, what) in names(prefix, policy, CODES[*code], key) {
                if let Some(other) = seen.insert(name.clone(), what.clone()) {
                    prop_assert_eq!(&other, &what, "one Redis key {:?} for two things", name);
                }
            }
        }
    }

    #[test]
    fn an_override_entry_name_gives_its_key_back(policy in policy_name(), key in user_key()) {
        let name = override_key("sl:", &policy, &key);
        prop_assert_eq!(override_user_key("sl:", &policy, &name), Some(key.clone()));
        // and no other policy's listing claims it
        let other = format!("{policy}x");
        prop_assert_eq!(override_user_key("sl:", &other, &name), None);
    }

    #[test]
    fn every_redis_key_of_a_key_is_in_its_slot(policy in policy_name(), key in user_key()) {
        let tag = hash_tag(&key);
        prop_assert!(!tag.is_empty() && !tag.contains('}'), "tag {:?}", tag);
        let slot = cluster_slot(&key);
        for (name, what) in names("sl:", &policy, "tb", &key) {
            // one per shard, not per key (and not written on a Cluster)
            if what == "events" || what.starts_with("shadow counts") {
                continue;
            }
            prop_assert_eq!(redis_tag(&name), &*tag, "{}", name);
            prop_assert_eq!(cluster_slot(&format!("{{{}}}", redis_tag(&name))), slot);
        }
    }

    #[test]
    fn routing_follows_the_vectors(
        case in 0usize..64,
        before in "[a-z:]{0,6}",
        after in "[a-z:{}]{0,6}",
    ) {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/vectors/routing.json"
        )).unwrap()).unwrap();
        let cases = doc["cases"].as_array().unwrap();
        let c = &cases[case % cases.len()];
        let rk = c["routing_key"].as_str().unwrap();
        // a key whose tag is this routing key routes like it
        prop_assume!(!rk.is_empty() && !rk.contains('}'));
        let key = format!("{before}{{{rk}}}{after}");
        prop_assert_eq!(routing_key(&key), rk);
        for (n, want) in c["shard_for"].as_array().unwrap().iter().enumerate() {
            prop_assert_eq!(shard_index(&key, n as u32 + 1) as u64, want.as_u64().unwrap());
        }
    }
}
