//! The `shardlimit` command end to end: outputs, exit codes and errors. Redis-backed cases
//! run against a redis-server the test starts on a loopback port.

#[path = "../../core/tests/support/mod.rs"]
mod support;

use std::process::{Command, Output};

fn sl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardlimit"))
        .args(args)
        .env_remove("SHARDLIMIT_CONFIG")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A redis-server on a free loopback port (the core's test support: a port another
/// process takes before the server binds it is retried on another).
fn redis() -> support::RedisServer {
    support::RedisServer::start()
}

#[test]
fn validate_reports_the_bad_field_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"policies":{"login":{"algorithm":"fixed_window","limit":5,"window":"abc"}}}"#,
    )
    .unwrap();
    let o = sl(&["config", "validate", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("policies.login.window: expected a duration like \"1m\""),
        "{err}"
    );
    let good = sl(&[
        "config",
        "validate",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../shard-config.json"),
    ]);
    assert_eq!(good.status.code(), Some(0));
    assert!(stdout(&good).contains("3 shard(s), 6 policies"));
    let missing = sl(&["config", "validate", "/nonexistent.json"]);
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn validate_shows_the_tls_mode_of_every_shard() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let certs = dir.path().join("certs");
    let gen = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/tls/gen-certs.sh");
    let st = Command::new("sh").arg(gen).arg(&certs).status().unwrap();
    assert!(st.success());
    std::fs::copy(certs.join("ca.crt"), &ca).unwrap();
    let cfg = dir.path().join("tls.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"tls": {{"ca_file": {ca:?}}},
                "shards": [{{"name": "plain", "url": "redis://127.0.0.1:6379"}},
                           {{"name": "ok", "url": "rediss://127.0.0.1:6380"}},
                           {{"name": "skip", "url": "rediss://127.0.0.1:6381",
                             "tls": {{"insecure_skip_verify": true}}}}]}}"#
        ),
    )
    .unwrap();
    let o = sl(&["config", "validate", cfg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let out = stdout(&o);
    assert!(out.contains("shard plain: plain TCP (no TLS)"), "{out}");
    assert!(
        out.contains(&format!("shard ok: TLS, verified against ca_file {ca:?}")),
        "{out}"
    );
    assert!(out.contains("shard skip: TLS, INSECURE"), "{out}");
    // a CA file that cannot be read: exit 2 and the field
    std::fs::remove_file(&ca).unwrap();
    let o = sl(&["config", "validate", cfg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tls.ca_file: cannot read"), "{err}");
}

#[test]
fn validate_describes_cluster_configs_and_the_reshard_handoff() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let policies = r#""policies":{"a":{"algorithm":"fixed_window","limit":5,"window":"10m"},
        "b":{"algorithm":"sliding_log","limit":5,"window":"2h"}}"#;
    let cluster = write(
        "cluster.json",
        &format!(
            r#"{{"cluster":{{"nodes":["redis://127.0.0.1:7000","redis://127.0.0.1:7001"]}},{policies}}}"#
        ),
    );
    let out = stdout(&sl(&["config", "validate", &cluster]));
    assert!(
        out.contains("ok: Redis Cluster (2 seed node(s)), 2 policies"),
        "{out}"
    );
    assert!(!out.contains("in-memory"), "{out}");
    assert!(
        out.contains("reshard_handoff: 2h (default: the longest window among the policies, b)"),
        "{out}"
    );
    let set = write(
        "set.json",
        &format!(
            r#"{{"shards":[{{"name":"a","url":"redis://127.0.0.1:1"}}],"reshard_handoff":"90s",{policies}}}"#
        ),
    );
    let out = stdout(&sl(&["config", "validate", &set]));
    assert!(
        out.contains("reshard_handoff: 90s (set in the config)"),
        "{out}"
    );
}

#[test]
fn validate_never_prints_a_password() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        r#"{"shards":[{"name":"a","url":"redis://bob:s3cr3tpw@127.0.0.1:6379/abc"}]}"#,
        r#"{"shards":[{"name":"a","url":"redis://bob:s3cr3tpw@127.0.0.1:99999"}]}"#,
        r#"{"shards":[{"name":"a","url":"http://bob:s3cr3tpw@127.0.0.1:6379"}]}"#,
        r#"{"shards":["redis://bob:s3cr3tpw@127.0.0.1:6379"]}"#,
        r#"{"cluster":{"nodes":["redis://bob:s3cr3tpw@127.0.0.1:6379/abc"]}}"#,
        r#"{"cluster":{"nodes":["redis://bob:s3cr3tpw@bad host:1"]}}"#,
        r#"{"shards":[{"name":"a","url":"redis+sentinel://:s3cr3tpw@h:1/m/x"}]}"#,
        r#"{"shards":[{"name":"a","url":"redis+sentinel://h:1/m?sentinel_password=s3cr3tpw&x=1"}]}"#,
        r#"{"shards":[{"name":"a","sentinel":{"nodes":["h:1"],"master":"m","password":"s3cr3tpw","db":-1}}]}"#,
        r#"{"shards":[{"name":"a","url":"redis://bob:s3cr3tpw@127.0.0.1:6379"}],"shards":[]}"#,
        r#"{"shards":[{"name":"a","url":"redis://bob:s3cr3tpw@127.0.0.1:6379"}]}"#,
        r#"{"cluster":{"nodes":["redis://bob:s3cr3tpw@127.0.0.1:7000"]}}"#,
    ];
    for (i, text) in cases.iter().enumerate() {
        let p = dir.path().join(format!("c{i}.json"));
        std::fs::write(&p, text).unwrap();
        for cmd in [&["config", "validate"][..], &["route", "--config"][..]] {
            let mut args = cmd.to_vec();
            args.push(p.to_str().unwrap());
            if cmd[0] == "route" {
                args.push("user:1");
            }
            let o = sl(&args);
            let all = format!("{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
            assert!(!all.contains("s3cr3tpw"), "{args:?} on {text}: {all}");
            assert!(!all.is_empty(), "{args:?}");
        }
    }
}

#[test]
fn route_prints_key_index_shard() {
    let o = sl(&[
        "route",
        "--config",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../shard-config.json"),
        "user:12345",
        "{tenant:acme}:user:1",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let vectors: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/vectors/routing.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let want = |key: &str| {
        let case = vectors["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["key"] == key)
            .unwrap();
        case["shard_for"][2].as_u64().unwrap()
    };
    let names = ["shard-a", "shard-b", "shard-c"];
    let expected = format!(
        "user:12345\t{}\t{}\n{{tenant:acme}}:user:1\t{}\t{}\n",
        want("user:12345"),
        names[want("user:12345") as usize],
        want("{tenant:acme}:user:1"),
        names[want("{tenant:acme}:user:1") as usize]
    );
    assert_eq!(stdout(&o), expected);
}

#[test]
fn check_exit_codes_and_json_on_redis() {
    let r = redis();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.json");
    std::fs::write(
        &cfg,
        format!(
            // a deadline a loaded machine keeps (the default 50 ms is not what this tests:
            // each call is a fresh process that connects and loads the scripts)
            r#"{{"timeout_ms":2000,"shards":[{{"name":"only","url":"redis://127.0.0.1:{}"}}],
            "policies":{{"login":{{"algorithm":"fixed_window","limit":2,"window":"1h"}},
                         "ip":{{"algorithm":"token_bucket","capacity":10,"refill_per_sec":1}}}}}}"#,
            r.port
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    for (i, want) in [(0, 0), (1, 0), (2, 1)] {
        let o = sl(&["check", "--config", c, "--policy", "login", "user:1"]);
        assert_eq!(
            o.status.code(),
            Some(want),
            "attempt {i}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let d: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(d["source"], "redis");
        assert_eq!(d["shard"]["name"], "only");
        assert_eq!(d["limit"], 2);
        if want == 1 {
            assert!(d["retry_after_ms"].as_f64().unwrap() > 0.0);
        } else {
            assert!(d["retry_after_ms"].is_null());
        }
    }
    // layered: the login layer denies, the ip layer is not consumed
    let o = sl(&[
        "check-all",
        "--config",
        c,
        "--layer",
        "ip:1=ip",
        "--layer",
        "user:1=login",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let d: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (d["policy"].as_str(), d["layer"].as_u64()),
        (Some("login"), Some(1))
    );
    let o = sl(&["peek", "--config", c, "--policy", "ip", "ip:1"]);
    let d: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(d["remaining"], 10);
    // block list from the shell
    assert_eq!(
        sl(&["block", "--config", c, "--ttl", "1m", "--reason", "test", "user:9"])
            .status
            .code(),
        Some(0)
    );
    let o = sl(&["check", "--config", c, "--policy", "ip", "user:9"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("\"source\":\"block\""));
    assert_eq!(
        sl(&["blocked", "--config", c, "user:9"]).status.code(),
        Some(0)
    );
    assert_eq!(
        sl(&["unblock", "--config", c, "user:9"]).status.code(),
        Some(0)
    );
    assert_eq!(
        sl(&["blocked", "--config", c, "user:9"]).status.code(),
        Some(1)
    );
    // bench with --json
    let o = sl(&[
        "bench",
        "--config",
        c,
        "--policy",
        "ip",
        "--concurrency",
        "8",
        "--requests",
        "200",
        "--keys",
        "4",
        "--json",
    ]);
    let b: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        b["allowed"].as_u64().unwrap() + b["denied"].as_u64().unwrap(),
        200
    );
    assert!(
        b["allowed"].as_u64().unwrap() >= 40 && b["allowed"].as_u64().unwrap() <= 60,
        "{b}"
    );
    assert!(b["decisions_per_sec"].as_f64().unwrap() > 0.0);
}

#[test]
fn memory_engine_without_config_and_bad_input() {
    let lim = r#"{"algorithm":"sliding_log","limit":1,"window":"1h"}"#;
    let o = sl(&["check", "--limit", lim, "k"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("\"source\":\"memory\""));
    let o = sl(&[
        "check",
        "--limit",
        r#"{"algorithm":"sliding_log","limit":0,"window":"1h"}"#,
        "k",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--limit.limit"));
    let o = sl(&[
        "check",
        "--limit",
        r#"{"algorithm":"sliding_log","limit":5,"limit":500,"window":"1h"}"#,
        "k",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--limit.limit: duplicate key"), "{err}");
    let o = sl(&["check", "--limit", "{not json", "k"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--limit: not valid JSON"));
    let o = sl(&["check", "k"]);
    assert_eq!(o.status.code(), Some(2));
    let o = sl(&["check", "--limit", lim, ""]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("key"));
    let o = sl(&[
        "client-ip",
        "--peer",
        "10.0.0.5:80",
        "--xff",
        "6.6.6.6, 198.51.100.7",
        "--trusted",
        "10.0.0.0/8",
    ]);
    assert_eq!(stdout(&o).trim(), "198.51.100.7");
    let key = |args: &[&str]| stdout(&sl(&[&["client-ip", "--key"][..], args].concat()));
    assert_eq!(
        key(&["--peer", "[2001:db8:1:2::77]:443"]).trim(),
        "2001:db8:1:2::/64"
    );
    let k = key(&["--peer", "2001:db8:1:2ff::1%eth0", "--ipv6-prefix", "56"]);
    assert_eq!(k.trim(), "2001:db8:1:200::/56");
    assert_eq!(
        key(&["--peer", "::ffff:198.51.100.7"]).trim(),
        "198.51.100.7"
    );
    let o = sl(&["client-ip", "--key", "--peer", "::1", "--ipv6-prefix", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("ipv6_prefix"));
}

#[test]
fn config_diff_shows_the_moving_fraction() {
    let dir = tempfile::tempdir().unwrap();
    let base =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../shard-config.json"))
            .unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(&base).unwrap();
    cfg["shards"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "shard-d", "url": "redis://127.0.0.1:6394"}));
    cfg["policies"]["extra"] =
        serde_json::json!({"algorithm": "fixed_window", "limit": 3, "window": "1s"});
    let new = dir.path().join("four.json");
    std::fs::write(&new, cfg.to_string()).unwrap();
    let o = sl(&[
        "config",
        "diff",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../shard-config.json"),
        new.to_str().unwrap(),
        "--sample",
        "20000",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(out.contains("shards: 3 -> 4"), "{out}");
    // jump hash moves about 1/4 of keys to the fourth shard
    let pct: f64 = out
        .split('(')
        .nth(1)
        .unwrap()
        .split('%')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((22.0..28.0).contains(&pct), "{out}");
    assert!(out.contains("policies added: [\"extra\"]"), "{out}");
}

#[test]
fn multi_limit_policies_plans_and_rate_strings() {
    let r = redis();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"shards":[{{"name":"only","url":"redis://127.0.0.1:{}"}}],
            "policies":{{"api":"2/hour; 3/day", "login":{{"algorithm":"sliding_log","rate":"5/minute"}}}},
            "plans":{{"pro":{{"api":"100/hour"}}}}}}"#,
            r.port
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let o = sl(&["config", "validate", c]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(
        out.contains(
            "api: fixed_window limit=2 window=3600000ms; fixed_window limit=3 window=86400000ms"
        ),
        "{out}"
    );
    assert!(
        out.contains("plan pro:") && out.contains("api: fixed_window limit=100"),
        "{out}"
    );
    assert!(
        out.contains("login: sliding_log limit=5 window=60000ms"),
        "{out}"
    );
    for want in [0, 0, 1] {
        let o = sl(&["check", "--config", c, "--policy", "api", "t:1"]);
        assert_eq!(
            o.status.code(),
            Some(want),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let d: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(d["limit_index"], 0, "{d}");
        assert_eq!(d["quotas"][1]["limit"], 3);
    }
    // under the plan: the same key, the same per-hour state (2 used of 100)
    let o = sl(&[
        "check", "--config", c, "--policy", "api", "--plan", "pro", "t:1",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let d: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (d["limit"].as_u64(), d["remaining"].as_u64()),
        (Some(100), Some(97))
    );
    let o = sl(&[
        "check", "--config", c, "--policy", "api", "--plan", "gold", "t:1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("gold"));
    // an ad-hoc rate string, one limit or several
    for want in [0, 1] {
        let o = sl(&["check", "--config", c, "--limit", "1/minute", "adhoc"]);
        assert_eq!(o.status.code(), Some(want));
    }
    let o = sl(&[
        "check",
        "--config",
        c,
        "--limit",
        "5/second; 1/hour",
        "adhoc2",
    ]);
    let d: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (d["limit_index"].as_u64(), d["remaining"].as_u64()),
        (Some(1), Some(0))
    );
    let o = sl(&["check", "--config", c, "--limit", "5/fortnight", "k"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--limit") && err.contains("fortnight"),
        "{err}"
    );
    // a bad rate in a config file names the field
    std::fs::write(&cfg, r#"{"policies":{"login":"5/fortnight"}}"#).unwrap();
    let o = sl(&["config", "validate", c]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("policies.login") && err.contains("fortnight"),
        "{err}"
    );
}

/// Shadow mode from the shell: a policy in shadow (and `--shadow` on an enforcing one)
/// exits 0 with `"shadow_denied": true`, and `shadow-report` reads the counts that
/// separate processes wrote to Redis, summed over both shards.
#[test]
fn shadow_checks_exit_0_and_shadow_report_reads_redis() {
    let (a, b) = (redis(), redis());
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"shards":[{{"name":"a","url":"redis://127.0.0.1:{}"}},{{"name":"b","url":"redis://127.0.0.1:{}"}}],
            "policies":{{"new":{{"algorithm":"fixed_window","limit":1,"window":"1h","shadow":true}},
                         "old":{{"algorithm":"fixed_window","limit":1,"window":"1h"}}}}}}"#,
            a.port, b.port
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let keys = ["user:1", "user:2", "user:3", "user:4", "user:5", "user:6"];
    for (i, k) in keys.iter().enumerate() {
        for attempt in 0..=(i % 3) {
            let o = sl(&["check", "--config", c, "--policy", "new", k]);
            assert_eq!(
                o.status.code(),
                Some(0),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
            let d: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
            assert_eq!(d["allowed"], true);
            assert_eq!(d["shadow_denied"], attempt > 0, "{d}");
        }
    }
    let o = sl(&["shadow-report", "--config", c, "--policy", "new"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(r["policy"], "new");
    assert_eq!(r["total"], 6); // 0+1+2 twice
    assert_eq!(r["untracked"], 0);
    let ks = r["keys"].as_array().unwrap();
    assert_eq!(ks.len(), 4);
    assert_eq!(ks[0], serde_json::json!({"key": "user:3", "count": 2}));
    assert_eq!(ks[1], serde_json::json!({"key": "user:6", "count": 2}));
    let o = sl(&[
        "shadow-report",
        "--config",
        c,
        "--policy",
        "new",
        "--top",
        "1",
    ]);
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (r["total"].as_u64(), r["keys"].as_array().unwrap().len()),
        (Some(6), 1)
    );
    // the per-call option on an enforcing policy
    assert_eq!(
        sl(&["check", "--config", c, "--policy", "old", "k"])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(
        sl(&["check", "--config", c, "--policy", "old", "k"])
            .status
            .code(),
        Some(1)
    );
    let o = sl(&["check", "--config", c, "--policy", "old", "--shadow", "k"]);
    assert_eq!(o.status.code(), Some(0));
    let d: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (d["allowed"].as_bool(), d["shadow_denied"].as_bool()),
        (Some(true), Some(true))
    );
    let o = sl(&["shadow-report", "--config", c, "--policy", "old"]);
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(r["keys"], serde_json::json!([{"key": "k", "count": 1}]));
    // a bad policy name is an error naming it, exit 2
    let o = sl(&["shadow-report", "--config", c, "--policy", "a:b"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("policy"));
}

/// `charge` and `refund` take check's flags and print its JSON: a charge into debt denies
/// the next check until the window ends, a refund gives units back (never above the limit).
#[test]
fn charge_and_refund_on_redis_and_in_memory() {
    let r = redis();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"shards":[{{"name":"only","url":"redis://127.0.0.1:{}"}}], "timeout_ms": 5000,
            "policies":{{"tokens":{{"algorithm":"fixed_window","limit":10,"window":"1h"}}}}}}"#,
            r.port
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let json = |o: &Output| -> serde_json::Value {
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_str(&stdout(o)).unwrap()
    };
    let d = json(&sl(&[
        "charge", "--config", c, "--policy", "tokens", "--cost", "14", "t:1",
    ]));
    assert_eq!(
        (d["allowed"].as_bool(), d["remaining"].as_u64()),
        (Some(true), Some(0))
    );
    assert_eq!(d["source"], "redis");
    let o = sl(&["check", "--config", c, "--policy", "tokens", "t:1"]);
    assert_eq!(o.status.code(), Some(1), "in debt: denied");
    // 14 used: 5 back leave 9 used, one unit free
    let d = json(&sl(&[
        "refund", "--config", c, "--policy", "tokens", "--cost", "5", "t:1",
    ]));
    assert_eq!(d["remaining"], 1);
    assert_eq!(
        sl(&["check", "--config", c, "--policy", "tokens", "t:1"])
            .status
            .code(),
        Some(0)
    );
    let d = json(&sl(&[
        "refund", "--config", c, "--policy", "tokens", "--cost", "99", "t:1",
    ]));
    assert_eq!(d["remaining"], 10, "never above the limit");
    // bad input: exit 2 with the field named
    let o = sl(&[
        "charge", "--config", c, "--policy", "tokens", "--cost", "0", "t:1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cost"));
    let lim = r#"{"algorithm":"concurrency","max":2,"lease_ttl":"1s"}"#;
    let o = sl(&["charge", "--limit", lim, "k"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("acquire and release"));
    // the in-memory engine (one process: the charge is there for its own decision)
    let lim = r#"{"algorithm":"token_bucket","capacity":5,"refill_per_sec":1}"#;
    let d = json(&sl(&["charge", "--limit", lim, "--cost", "7", "k"]));
    assert_eq!(
        (d["remaining"].as_u64(), d["source"].as_str()),
        (Some(0), Some("memory"))
    );
}

#[test]
fn override_set_get_list_delete_on_redis() {
    let r = redis();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"timeout_ms":2000,"shards":[{{"name":"only","url":"redis://127.0.0.1:{}"}}],
            "policies":{{"api":{{"algorithm":"fixed_window","limit":2,"window":"1h","overrides":true}},
                         "login":{{"algorithm":"fixed_window","limit":2,"window":"1h"}}}}}}"#,
            r.port
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let json = |o: &Output| -> serde_json::Value {
        serde_json::from_str(&stdout(o)).unwrap_or_else(|e| {
            panic!(
                "{e}: {:?} {}",
                stdout(o),
                String::from_utf8_lossy(&o.stderr)
            )
        })
    };
    // no override yet: get exits 1
    let o = sl(&["override", "get", "--config", c, "--policy", "api", "acme"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(json(&o)["limit"], serde_json::Value::Null);
    // set: the next check (another process) is decided by it
    let o = sl(&[
        "override",
        "set",
        "--config",
        c,
        "--policy",
        "api",
        "--ttl",
        "1h",
        "acme",
        "100/minute",
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v = json(&o);
    assert_eq!(
        v["limit"],
        serde_json::json!({"algorithm": "fixed_window", "limit": 100, "window": "60000ms"})
    );
    assert_eq!(v["remaining_ms"], 3_600_000);
    let o = sl(&["check", "--config", c, "--policy", "api", "acme"]);
    let d = json(&o);
    assert_eq!(
        (d["limit"].as_u64(), d["policy"].as_str()),
        (Some(100), Some("api"))
    );
    let o = sl(&["override", "get", "--config", c, "--policy", "api", "acme"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(json(&o)["limit"]["limit"], 100);
    // a limit object in JSON; list prints one object a line
    let o = sl(&[
        "override",
        "set",
        "--config",
        c,
        "--policy",
        "api",
        "globex",
        r#"{"algorithm": "token_bucket", "capacity": 5, "refill_per_sec": 2}"#,
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = sl(&[
        "override", "list", "--config", c, "--policy", "api", "--page", "1",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let mut keys: Vec<String> = stdout(&o)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["key"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    keys.sort();
    assert_eq!(keys, ["acme", "globex"]);
    // delete: exit 0, then 1; the check is the policy's again
    for want in [0, 1] {
        let o = sl(&[
            "override", "delete", "--config", c, "--policy", "api", "acme",
        ]);
        assert_eq!(o.status.code(), Some(want));
        assert_eq!(json(&o)["deleted"], want == 0);
    }
    let d = json(&sl(&["check", "--config", c, "--policy", "api", "acme"]));
    assert_eq!(d["limit"], 2);
    // an override of several limits: every one is listed, the next check uses them all
    let o = json(&sl(&[
        "override",
        "set",
        "--config",
        c,
        "--policy",
        "api",
        "acme",
        "3/hour; 5/day",
    ]));
    assert_eq!(o["limits"].as_array().map(Vec::len), Some(2), "{o}");
    let d = json(&sl(&["check", "--config", c, "--policy", "api", "acme"]));
    assert_eq!(
        (d["limit"].as_u64(), d["remaining"].as_u64()),
        (Some(3), Some(2)),
        "{d}"
    );
    // charge and refund act on all of them (the decision describes the tightest)
    for (op, left) in [("charge", 0), ("refund", 2)] {
        let d = json(&sl(&[
            op, "--config", c, "--policy", "api", "--cost", "2", "acme",
        ]));
        assert_eq!(
            (d["limit"].as_u64(), d["remaining"].as_u64()),
            (Some(3), Some(left)),
            "{op}: {d}"
        );
    }
    // bad input: exit 2 and the error names what is wrong
    for (args, want) in [
        (
            vec!["set", "--policy", "login", "k", "5/minute"],
            "takes no per-key overrides",
        ),
        (
            vec!["set", "--policy", "api", "k", "[]"],
            "an array of 1 to 16",
        ),
        (
            vec!["set", "--policy", "api", "k", "gold"],
            "nor a plan of the config",
        ),
        (
            vec!["set", "--policy", "api", "--ttl", "soon", "k", "5/minute"],
            "--ttl",
        ),
    ] {
        let mut a = vec!["override"];
        a.push(args[0]);
        a.extend(["--config", c]);
        a.extend(&args[1..]);
        let o = sl(&a);
        assert_eq!(o.status.code(), Some(2), "{a:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{a:?}: {err}");
    }
}

/// `charge` and `refund` on a multi-limit policy (every limit charged: the hour's goes into
/// debt, the decision names it with `limit_index`) and on an exact-rate bucket of
/// 300,000/s (`tq` state: charged exactly, nothing refused).
#[test]
fn charge_and_refund_on_multi_limit_and_exact_rate_policies() {
    let r = redis();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"shards":[{{"name":"only","url":"redis://127.0.0.1:{}"}}], "timeout_ms": 5000,
            "policies":{{"plan":"5/hour; 100/day",
              "llm":{{"algorithm":"token_bucket","capacity":30000000,"refill_per_sec":300000}}}}}}"#,
            r.port
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let json = |o: &Output| -> serde_json::Value {
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_str(&stdout(o)).unwrap()
    };
    let d = json(&sl(&[
        "charge", "--config", c, "--policy", "plan", "--cost", "7", "t:1",
    ]));
    assert_eq!(
        (d["remaining"].as_u64(), d["limit"].as_u64()),
        (Some(0), Some(5))
    );
    assert_eq!(d["limit_index"], 0, "{d}");
    let o = sl(&["check", "--config", c, "--policy", "plan", "t:1"]);
    assert_eq!(o.status.code(), Some(1), "the hour is in debt: denied");
    // 3 back in both: the hour has 1 left (the day 96)
    let d = json(&sl(&[
        "refund", "--config", c, "--policy", "plan", "--cost", "3", "t:1",
    ]));
    assert_eq!(
        (d["remaining"].as_u64(), d["limit_index"].as_u64()),
        (Some(1), Some(0))
    );
    // 300,000/s with room for 100 s: a charge of 20 million leaves 10 million, plus what
    // refilled (0.3 a µs) while the CLI ran
    let d = json(&sl(&[
        "charge", "--config", c, "--policy", "llm", "--cost", "20000000", "t:1",
    ]));
    let left = d["remaining"].as_u64().unwrap();
    assert!((10_000_000..10_000_000 + 3_000_000).contains(&left), "{d}");
    let d = json(&sl(&[
        "refund", "--config", c, "--policy", "llm", "--cost", "1000000", "t:1",
    ]));
    let after = d["remaining"].as_u64().unwrap();
    assert!(
        after >= left + 1_000_000 && after < left + 1_000_000 + 3_000_000,
        "{d}"
    );
}

#[test]
fn check_all_refuses_a_concurrency_layer_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.json");
    std::fs::write(
        &cfg,
        r#"{"policies":{"ip":{"algorithm":"fixed_window","limit":5,"window":"1m"},
            "uploads":{"algorithm":"concurrency","max":2,"lease_ttl":"30s"}}}"#,
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let o = sl(&[
        "check-all",
        "--config",
        c,
        "--layer",
        "k=ip",
        "--layer",
        "k=uploads",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(
            "`layers[1]`: policy \"uploads\" is a concurrency policy: acquire() it and release the lease"
        ),
        "{err}"
    );
}

#[test]
fn fallbacks_are_one_warning_line_on_stderr() {
    // nothing listens on the port: every check falls back to on_error
    let port = support::free_port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"log_interval":"1h","shards":[{{"name":"only","url":"redis://127.0.0.1:{port}"}}],
            "policies":{{"api":{{"rate":"10/minute","on_error":"open"}}}}}}"#
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let o = sl(&[
        "bench",
        "--config",
        c,
        "--policy",
        "api",
        "--requests",
        "1000",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("fell back")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("warn: shardlimit: policy `api` fell back to on_error and allowed"),
        "{err}"
    );
    assert_eq!(
        err.lines()
            .filter(|l| l.contains("circuit of shard `only` opened"))
            .count(),
        1,
        "{err}"
    );
    // stdout is still the command's output alone
    assert!(!stdout(&o).contains("fell back"));
}
