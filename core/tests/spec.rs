//! The files in `spec/` are the core's contract with every binding: `errors.json` is
//! generated from [`ErrorKind::ALL`], and `operations.json` lists every public operation of
//! [`shardlimit::Limiter`], found by reading the core's sources. Each binding's test suite
//! reads both files and fails when its own table or surface differs.
//!
//! After changing an error kind or a public `Limiter` method, regenerate `errors.json` with
//! `SHARDLIMIT_BLESS=1 cargo test -p shardlimit --test spec` and add the operation to
//! `operations.json` by hand (with its description and the languages it does not apply to).

use serde_json::{json, Value};
use shardlimit::ErrorKind;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn errors_json() -> Value {
    let kinds: Vec<Value> = ErrorKind::ALL
        .iter()
        .map(|k| {
            json!({
                "code": k.code(),
                "name": k.name(),
                "parent": k.parent().map(|p| p.name()),
                "backend": k.is_backend(),
                "description": k.description(),
            })
        })
        .collect();
    let retired: Vec<Value> = ErrorKind::RETIRED
        .iter()
        .map(|(code, name)| json!({ "code": code, "name": name }))
        .collect();
    json!({
        "//": "generated from shardlimit::ErrorKind by core/tests/spec.rs; do not edit",
        "kinds": kinds,
        "retired": retired,
    })
}

#[test]
fn errors_json_is_generated_from_the_core() {
    let path = root().join("spec/errors.json");
    let want = serde_json::to_string_pretty(&errors_json()).unwrap() + "\n";
    if std::env::var_os("SHARDLIMIT_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "spec/errors.json is out of date with ErrorKind: run \
         SHARDLIMIT_BLESS=1 cargo test -p shardlimit --test spec"
    );
}

#[test]
fn retired_codes_are_never_reused() {
    for (code, name) in ErrorKind::RETIRED {
        assert!(
            ErrorKind::ALL
                .iter()
                .all(|k| k.code() != *code && k.name() != *name),
            "retired code {code} ({name}) is in use again"
        );
    }
    let codes: BTreeSet<u32> = ErrorKind::ALL.iter().map(|k| k.code()).collect();
    assert_eq!(codes.len(), ErrorKind::ALL.len(), "two kinds share a code");
}

/// Names of the `pub fn`/`pub async fn` items directly inside every `impl Limiter {` block
/// of the core's sources (any file, any module).
fn limiter_methods() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root().join("core/src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let mut inside = false;
            // `blocking_twins! { ... twin => call(args) -> T; }` in core/src/limiter/blocking.rs
            // defines methods of `Limiter` too: one `pub fn twin` per entry
            let mut twins = false;
            for line in text.lines() {
                if line.starts_with("impl Limiter {") {
                    inside = true;
                    continue;
                }
                if line.starts_with("blocking_twins! {") {
                    twins = true;
                    continue;
                }
                if (inside || twins) && line.starts_with('}') {
                    (inside, twins) = (false, false);
                    continue;
                }
                if twins {
                    if let Some((twin, _)) = line.trim().split_once(" => ") {
                        out.insert(twin.to_string());
                    }
                    continue;
                }
                if !inside {
                    continue;
                }
                let rest = line
                    .strip_prefix("    pub async fn ")
                    .or_else(|| line.strip_prefix("    pub fn "));
                if let Some(rest) = rest {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    out.insert(name);
                }
            }
        }
    }
    out
}

#[test]
fn operations_json_lists_every_public_limiter_method() {
    let text = std::fs::read_to_string(root().join("spec/operations.json")).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let mut listed = BTreeSet::new();
    for op in doc["operations"].as_array().unwrap() {
        let name = op["name"].as_str().unwrap().to_string();
        assert!(
            op["description"].as_str().is_some_and(|d| !d.is_empty()),
            "operation `{name}` has no description"
        );
        // an operation's blocking twin is the same operation
        for twin in op["rust"].as_array().unwrap() {
            listed.insert(twin.as_str().unwrap().to_string());
        }
    }
    let found = limiter_methods();
    assert!(
        !found.is_empty(),
        "no `impl Limiter {{` block found in core/src"
    );
    let missing: Vec<_> = found.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&found).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "spec/operations.json differs from the public Limiter methods in core/src: \
         not listed {missing:?}, listed but gone {stale:?}"
    );
}

fn names_json() -> Value {
    let text = std::fs::read_to_string(root().join("spec/names.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// spec/names.json's Rust, C and C++ names: the functions exist in the core's sources, the
/// generated C header and the C++ wrapper; an event's fields start with its kind under
/// the one name, and the kinds are the core's.
#[test]
fn names_json_holds_for_rust_c_and_cpp() {
    let names = names_json();
    let header = std::fs::read_to_string(root().join("include/shardlimit.h")).unwrap();
    let hpp = std::fs::read_to_string(root().join("include/shardlimit.hpp")).unwrap();
    for thing in ["load_from_file", "metrics_text", "metrics_snapshot"] {
        let c = names[thing]["c"].as_str().unwrap();
        assert!(
            header.contains(&format!(" {c}(")),
            "{thing}: no {c} in the C header"
        );
        let mut cpp = vec![names[thing]["cpp"].as_str().unwrap().to_string()];
        for a in names[thing]["aliases"]["cpp"]
            .as_array()
            .into_iter()
            .flatten()
        {
            cpp.push(a.as_str().unwrap().to_string());
        }
        for n in cpp {
            let method = n.rsplit("::").next().unwrap();
            assert!(
                hpp.contains(&format!(" {method}(")),
                "{thing}: no {n} in shardlimit.hpp"
            );
        }
    }
    // Rust: the names compile
    let _: fn(&str) -> shardlimit::Result<shardlimit::Limiter> =
        |p| shardlimit::Limiter::from_config_file(p);
    let l = shardlimit::Limiter::memory();
    assert!(l.metrics().to_prometheus().contains("shardlimit_"));

    let e = shardlimit::Event::ReloadRejected {
        path: "shard-config.json".into(),
        error: shardlimit::Error::Internal("x".into()),
    };
    let field = names["event_kind_field"]["redis_stream"].as_str().unwrap();
    assert_eq!(e.fields()[0], (field, "reload_rejected".to_string()));
    let kinds: Vec<&str> = names["event_kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert!(kinds.contains(&e.kind()));
    let events = std::fs::read_to_string(root().join("core/src/events.rs")).unwrap();
    for k in &kinds {
        assert!(
            events.contains(&format!("=> \"{k}\"")),
            "event kind {k} is not the core's"
        );
    }
    assert_eq!(
        events.matches("{ .. } => \"").count(),
        kinds.len(),
        "every kind of the core is in spec/names.json"
    );
}
