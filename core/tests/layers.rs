//! The core's modules are layered, and imports point down: a module may use its own layer
//! and the layers below, never one above. This test reads `core/src` and fails on an import
//! that points up (a `crate::…` path, a re-export of the crate root, or a `super::…` path
//! that leaves its top-level module), on a top-level module missing from `LAYERS`, and on an
//! entry of `ALLOWED` that no longer exists. Test modules (`#[cfg(test)] mod …`, `tests.rs`)
//! are not checked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// From the bottom up. Modules of one layer may use each other.
const LAYERS: &[&[&str]] = &[
    &["error"],
    // leaves: time, keys, TLS settings, addresses, log lines, shard routing, the decision
    // type and the metrics counters
    &[
        "time", "key", "tls", "ip", "log", "routing", "decision", "metrics",
    ],
    // policies and the rate strings they are written in (`Policy::from_rate` parses one,
    // a parsed rate is a list of limits)
    &["policy", "rate"],
    &["config"],
    &["events"],
    // the check's wire layout (argument order) and the script table: what both the
    // transports and the Redis engine speak
    &["wire"],
    // moving bytes to and from Redis
    &["transport"],
    // deciding: in memory and on Redis
    &["engine"],
    &["limiter"],
];

/// Imports that point up today, each with the reason it is still here. An entry that no
/// longer exists fails the test: drop it.
const ALLOWED: &[(&str, &str, &str)] = &[(
    "config",
    "transport",
    // `transport/cpus.rs` is a leaf (the CPUs this process may use) that belongs below
    // config, which reads it for `default_spin_wait`; it moves with the transport work.
    "config::default_spin_wait reads transport::cpus::usable",
)];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("core/src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without comments and without `#[cfg(test)]` modules.
fn code_of(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    for line in src.lines() {
        let line = match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    // drop `#[cfg(test)] mod name { … }` blocks by brace matching
    while let Some(at) = out.find("#[cfg(test)]") {
        let rest = &out[at..];
        let after_attr = rest["#[cfg(test)]".len()..].trim_start();
        if !after_attr.starts_with("mod ") {
            // a cfg(test) item that is not a module: blank the attribute, keep the item
            out.replace_range(at..at + "#[cfg(test)]".len(), "");
            continue;
        }
        let Some(open) = rest.find('{') else {
            break;
        };
        if rest[..open].contains(';') {
            // `#[cfg(test)] mod tests;`: the file is skipped by name
            let semi = rest.find(';').unwrap_or(rest.len());
            out.replace_range(at..at + semi + 1, "");
            continue;
        }
        let mut depth = 0usize;
        let mut end = rest.len();
        for (i, c) in rest[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.replace_range(at..at + end, "");
    }
    out
}

/// The identifiers following `prefix` in `code` (`crate::` → `engine`, `Limit`, …).
fn after(code: &str, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before_ok = i == 0 || {
            let c = rest[..i].chars().next_back().unwrap_or(' ');
            !(c.is_alphanumeric() || c == '_' || c == ':')
        };
        rest = &rest[i + prefix.len()..];
        if !before_ok {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            found.push(name);
        }
    }
    found
}

/// The names lib.rs re-exports at the crate root, with the top-level module of each.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let code = code_of(lib);
    for stmt in code.split(';') {
        let stmt = stmt.trim();
        let Some(path) = stmt.strip_prefix("pub use ") else {
            continue;
        };
        let module = path.split("::").next().unwrap_or("").trim().to_string();
        let names = match (path.find('{'), path.rfind('}')) {
            (Some(a), Some(b)) => path[a + 1..b].to_string(),
            _ => path.rsplit("::").next().unwrap_or("").to_string(),
        };
        for n in names.split(',') {
            let n = n.split(" as ").last().unwrap_or("").trim();
            if !n.is_empty() {
                map.insert(n.to_string(), module.clone());
            }
        }
    }
    map
}

#[test]
fn imports_point_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let reexports = root_reexports(&lib);

    let mut problems = Vec::new();
    let mut seen_allowed = BTreeSet::new();
    let mut modules = BTreeSet::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        if parts == ["lib"] || parts.last().is_some_and(|p| p == "tests") {
            continue;
        }
        let module = parts[0].clone();
        modules.insert(module.clone());
        let Some(from) = layer_of(&module) else {
            continue;
        };
        let code = code_of(&std::fs::read_to_string(file).expect("a source file"));

        let mut targets: BTreeSet<String> = BTreeSet::new();
        for name in after(&code, "crate::") {
            if name.starts_with(char::is_uppercase) {
                match reexports.get(&name) {
                    Some(m) => targets.insert(m.clone()),
                    None => targets.insert(format!("<crate::{name}>")),
                };
            } else {
                targets.insert(name);
            }
        }
        // `super::` paths that climb out of the top-level module: from a file at depth d
        // (src/a.rs is 1, src/a/mod.rs and src/a/b.rs are 2, …) the k-th super is the
        // crate root when k reaches its depth
        let depth = if parts.last().is_some_and(|p| p == "mod") {
            parts.len() - 1
        } else {
            parts.len()
        };
        for name in after(&code, &"super::".repeat(depth)) {
            targets.insert(name);
        }

        for target in targets {
            if target == module || target == "self" || target == "super" {
                continue;
            }
            let Some(to) = layer_of(&target) else {
                problems.push(format!(
                    "{}: uses `{target}`, which is in no layer of LAYERS",
                    rel.display()
                ));
                continue;
            };
            if to <= from {
                continue;
            }
            if ALLOWED
                .iter()
                .any(|(a, b, _)| *a == module.as_str() && *b == target.as_str())
            {
                seen_allowed.insert((module.clone(), target.clone()));
                continue;
            }
            problems.push(format!(
                "{}: `{module}` (layer {from}) imports `{target}` (layer {to}), which is above it",
                rel.display()
            ));
        }
    }
    for m in &modules {
        if layer_of(m).is_none() {
            problems.push(format!(
                "core/src/{m}: a top-level module in no layer: add it to LAYERS"
            ));
        }
    }
    for (a, b, why) in ALLOWED {
        if !seen_allowed.contains(&(a.to_string(), b.to_string())) {
            problems.push(format!(
                "ALLOWED lists {a} -> {b} ({why}), which no longer exists: drop the entry"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "imports that point up:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_checker_sees_an_import_that_points_up() {
    // the parsing this test relies on, on a made-up file of the `events` layer
    let code = code_of(
        "use crate::limiter::Limiter; // a comment naming crate::engine\n\
         fn f() -> crate::Decision { todo!() }\n\
         #[cfg(test)]\nmod tests { use crate::engine::x; }\n",
    );
    assert_eq!(after(&code, "crate::"), ["limiter", "Decision"]);
    let lib = "pub use decision::{Decision, Quota};\npub use limiter::Limiter;\n";
    let map = root_reexports(lib);
    assert_eq!(map.get("Decision").map(String::as_str), Some("decision"));
    assert_eq!(map.get("Limiter").map(String::as_str), Some("limiter"));
    assert!(layer_of("limiter") > layer_of("events"));
}
