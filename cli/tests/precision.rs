//! `shardlimit` with per-key window offsets and exact bucket rates: `config validate` says
//! what each policy runs at, `check --limit` takes the field.

use std::process::{Command, Output};
use std::time::{SystemTime, UNIX_EPOCH};

fn sl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardlimit"))
        .args(args)
        .env_remove("SHARDLIMIT_CONFIG")
        .output()
        .unwrap()
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[test]
fn validate_shows_window_offsets_and_exact_intervals() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.json");
    std::fs::write(
        &f,
        r#"{"policies": {
            "daily": {"algorithm": "fixed_window", "limit": 5, "window": "1d", "window_offset": "per_key"},
            "fast": {"algorithm": "token_bucket", "capacity": 5, "refill_per_sec": 300000},
            "even": {"algorithm": "leaky_bucket", "capacity": 5, "leak_per_sec": 10}
        }}"#,
    )
    .unwrap();
    let o = sl(&["config", "validate", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(
            "daily: fixed_window limit=5 window=86400000ms, on_error open, window_offset per_key"
        ),
        "{out}"
    );
    assert!(out.contains("exactly 10/3 µs per unit"), "{out}");
    assert!(out.contains("exactly 100000 µs per unit"), "{out}");
    // refused with the reason, exit code 2
    std::fs::write(
        &f,
        r#"{"policies": {"p": {"algorithm": "token_bucket", "capacity": 5, "refill_per_sec": 1, "window_offset": "per_key"}}}"#,
    )
    .unwrap();
    let o = sl(&["config", "validate", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("policies.p.window_offset"), "{err}");
}

/// A daily limit placed per key: the decision's reset is the key's own boundary.
#[test]
fn check_with_a_per_key_window_resets_at_the_keys_offset() {
    let day = 86_400_000_000u64;
    for key in ["tenant:1", "tenant:2", "198.51.100.7"] {
        let before = now_us();
        let o = sl(&[
            "check",
            "--limit",
            r#"{"algorithm":"fixed_window","limit":5,"window":"1d","window_offset":"per_key"}"#,
            key,
        ]);
        let after = now_us();
        assert_eq!(o.status.code(), Some(0));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["allowed"], true);
        let reset = (v["reset_after_ms"].as_f64().unwrap() * 1000.0).round() as u64;
        let o = shardlimit::window_offset_us(key, day);
        // the check ran at some t in [before, after]; t + reset is the key's boundary
        let lag = (o + day - (before + reset) % day) % day;
        assert!(
            lag <= after - before,
            "{key}: reset {reset} µs is not at its offset"
        );
    }
    let o = sl(&[
        "check",
        "--limit",
        r#"{"algorithm":"fixed_window","limit":5,"window":"1d","window_offset":"weekly"}"#,
        "k",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--limit.window_offset"), "{err}");
}
