use super::*;

fn err(json: &str) -> String {
    Config::from_json(json).unwrap_err().to_string()
}

#[test]
fn parses_the_example() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../shard-config.json"))
            .unwrap();
    let cfg = Config::from_json(&text).unwrap();
    assert_eq!(cfg.shards.as_ref().unwrap().len(), 3);
    assert!(cfg.policies.contains_key("login"));
}

#[test]
fn sentinel_urls_carry_logins_for_the_primary_and_the_sentinels() {
    let su = SentinelSpec::from_url(
        "f",
        "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster",
    )
    .unwrap();
    assert_eq!(
        su.nodes,
        [
            ("10.0.0.1".to_string(), 26379),
            ("10.0.0.2".to_string(), 26379)
        ]
    );
    assert_eq!(
        (su.master.as_str(), su.username, su.password, su.db),
        ("mymaster", None, None, 0)
    );

    let su = SentinelSpec::from_url(
        "f",
        "redis+sentinel://app:p%40ss%3Aw%2Fd@h1:26379,h2:26379/mymaster/3\
         ?sentinel_username=watch&sentinel_password=s%26cret",
    )
    .unwrap();
    assert_eq!(su.username.as_deref(), Some("app"));
    assert_eq!(su.password.as_deref(), Some("p@ss:w/d"));
    assert_eq!((su.master.as_str(), su.db), ("mymaster", 3));
    assert_eq!(
        su.nodes,
        [("h1".to_string(), 26379), ("h2".to_string(), 26379)]
    );
    assert_eq!(
        (
            su.sentinel_username.as_deref(),
            su.sentinel_password.as_deref()
        ),
        (Some("watch"), Some("s&cret"))
    );
    let su = SentinelSpec::from_url("f", "redis+sentinel://:pw@h1:26379/m").unwrap();
    assert_eq!((su.username, su.password.as_deref()), (None, Some("pw")));

    // the structured form holds the same spec, every string as it is; the URL it shows
    // (every part encoded) reads back to it
    let cfg = Config::from_json(
        r#"{"shards":[{"name":"ha","sentinel":{"nodes":["h1:26379","h2:26379"],
           "master":"my/ma@st?er%2C,x","username":"app","password":"p@ss:w/d","db":3,
           "sentinel_username":"watch","sentinel_password":"s&cret"}}]}"#,
    )
    .unwrap();
    let shard = &cfg.shards.unwrap()[0];
    let spec = shard.sentinel.clone().unwrap();
    assert_eq!(
        (spec.username.as_deref(), spec.password.as_deref(), spec.db),
        (Some("app"), Some("p@ss:w/d"), 3)
    );
    assert_eq!(spec.master, "my/ma@st?er%2C,x");
    assert_eq!(spec.nodes[0], ("h1".to_string(), 26379));
    assert_eq!(SentinelSpec::from_url("f", &shard.url).unwrap(), spec);
    assert_eq!(
        ShardConfig::new("ha", shard.url.clone()).sentinel,
        Some(spec)
    );
}

#[test]
fn bad_sentinel_configs_are_named_and_never_show_a_password() {
    for (url, why) in [
        ("redis+sentinel://h1:26379", "no master name"),
        ("redis+sentinel://h1:26379/", "bad master name"),
        ("redis+sentinel://h1:26379/m/x", "bad database number \"x\""),
        (
            "redis+sentinel://h1:26379/m/-1",
            "bad database number \"-1\"",
        ),
        ("redis+sentinel://h1:26379,,h2/m", "empty sentinel address"),
        ("redis+sentinel://secret@h1:26379/m", "credentials must be"),
        (
            "redis+sentinel://h1:26379/m?password=secret",
            "unknown parameter \"password\"",
        ),
        (
            "redis+sentinel://h1:26379/m?sentinel_username=secret",
            "sentinel_username needs sentinel_password",
        ),
        (
            "redis+sentinel://u:secret@h1:26379/m/x",
            "bad database number",
        ),
    ] {
        let e = SentinelSpec::from_url("shards[0].url", url)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("shards[0].url: "), "{e}");
        assert!(e.contains(why), "{url}: {e}");
        assert!(
            !e.contains("secret"),
            "{url}: the message shows the password: {e}"
        );
    }
    let e = err(
        r#"{"shards":[{"name":"ha","sentinel":{"nodes":["h1:26379"],"master":"m","username":"u"}}]}"#,
    );
    assert_eq!(e, "shards[0].sentinel.username: needs a password too");
    let e = err(
        r#"{"shards":[{"name":"ha","sentinel":{"nodes":["h1:26379"],"master":"m","db":-2,"password":"secret"}}]}"#,
    );
    assert_eq!(e, "shards[0].sentinel.db: expected a number >= 0");
    let e = err(
        r#"{"shards":[{"name":"ha","sentinel":{"nodes":["h1:26379"],"master":"m","pasword":"secret"}}]}"#,
    );
    assert!(
        e.starts_with("shards[0].sentinel.pasword: unknown field"),
        "{e}"
    );
    assert!(!e.contains("secret"), "{e}");
    let su = SentinelSpec::from_url("f", "redis+sentinel://u:secret@h1:26379/m").unwrap();
    assert!(!format!("{su:?}").contains("secret"));
    for url in [
        "redis://:secret@h:6379/2",
        "rediss://u:secret@h:6379",
        "redis+sentinel://:secret@h1,h2/m?sentinel_password=secret",
    ] {
        let shard = ShardConfig::new("s", url);
        let shown = format!("{shard:?}");
        assert!(
            !shown.contains("secret") && shown.contains("***@h"),
            "{shown}"
        );
    }
}

#[test]
fn errors_name_the_field() {
    assert_eq!(
        err(r#"{"policies":{"login":{"algorithm":"fixed_window","limit":5,"window":"abc"}}}"#),
        "policies.login.window: expected a duration like \"1m\", \"500ms\" or an integer of milliseconds, got \"abc\""
    );
    assert!(
        err(r#"{"policies":{"a":{"algorithm":"fixed_window","limit":0,"window":"1s"}}}"#)
            .starts_with("policies.a.limit: must be between 1")
    );
    assert!(
        err(r#"{"policies":{"a":{"algorithm":"fixed_window","limit":-5,"window":"1s"}}}"#)
            .starts_with("policies.a.limit: expected a positive integer")
    );
    assert!(
        err(r#"{"policies":{"a":{"algorithm":"fixed_window","limit":5,"window":"0s"}}}"#)
            .starts_with("policies.a.window: must be between 1ms")
    );
    assert!(err(r#"{"policies":{"a":{"algorithm":"token_bucket","capacity":9223372036854775808,"refill_per_sec":1}}}"#)
        .starts_with("policies.a.capacity: must be between 1"));
    assert!(err(r#"{"policies":{"a":{"algorithm":"magic","limit":5}}}"#)
        .starts_with("policies.a.algorithm: unknown algorithm \"magic\""));
    assert!(err(
        r#"{"policies":{"a":{"algorithm":"fixed_window","limit":5,"window":"1s","burst":3}}}"#
    )
    .starts_with("policies.a.burst: unknown field"));
    assert!(
        err(r#"{"policies":{"a":{"algorithm":"fixed_window","window":"1s"}}}"#)
            .starts_with("policies.a.limit: is required")
    );
    assert!(err(r#"{"shards":[]}"#).starts_with("shards: is empty"));
    assert!(err(r#"{"shards":[{"name":"a","url":"redis://127.0.0.1:1"},{"name":"a","url":"redis://127.0.0.1:2"}]}"#)
        .starts_with("shards[1].name: duplicate shard name"));
    assert!(err(r#"{"shards":[{"name":"a","url":"http://x"}]}"#)
        .starts_with("shards[0].url: expected a redis://"));
    assert!(err(r#"{"shardz":[]}"#).starts_with("shardz: unknown field"));
    assert!(err(r#"{"timeout_ms":0}"#).starts_with("timeout_ms: must be between"));
    assert!(err(r#"{"on_error":"maybe"}"#).starts_with("on_error: expected"));
    assert!(err(r#"{"key_prefix":"a{b}"}"#).starts_with("key_prefix: must be"));
    assert!(err("{not json").starts_with("config: not valid JSON"));
    assert!(err("[]").starts_with("config: expected a JSON object"));
}

#[test]
fn no_shards_means_memory() {
    let cfg = Config::from_json(
        r#"{"policies":{"a":{"algorithm":"sliding_log","limit":5,"window":60000}}}"#,
    )
    .unwrap();
    assert!(cfg.shards.is_none());
    assert_eq!(cfg.policies["a"].max(), 5);
}

#[test]
fn duplicate_keys_are_rejected_with_their_path() {
    let tb = r#"{"algorithm":"token_bucket","capacity":5,"refill_per_sec":1}"#;
    for (json, path) in [
        (r#"{"timeout_ms":10,"timeout_ms":20}"#.to_string(), "timeout_ms"),
        (format!(r#"{{"policies":{{"login":{tb},"login":{tb}}}}}"#), "policies.login"),
        (
            r#"{"policies":{"a":{"algorithm":"fixed_window","limit":1,"limit":2,"window":1}}}"#
                .to_string(),
            "policies.a.limit",
        ),
        (
            r#"{"shards":[{"name":"a","url":"redis://h:1"},{"name":"b","url":"redis://h:2","url":"redis://h:3"}]}"#
                .to_string(),
            "shards[1].url",
        ),
        (r#"{"x":[[{"k":1,"k":1}]]}"#.to_string(), "x[0][0].k"),
    ] {
        let e = err(&json);
        assert!(
            e.starts_with(&format!("{path}: duplicate key (line 1, column ")),
            "{json}: {e}"
        );
    }
    // distinct keys, and the same key in different objects, are fine
    Config::from_json(&format!(r#"{{"policies":{{"a":{tb},"b":{tb}}}}}"#)).unwrap();
    // bad JSON is still reported as such, trailing garbage too
    assert!(err(r#"{"a":1} x"#).starts_with("config: not valid JSON"));
    assert!(err(&"[".repeat(100_000)).starts_with("config: not valid JSON"));
}

#[test]
fn reshard_handoff_defaults_to_the_longest_window() {
    let cfg = |policies: &str, extra: &str| {
        Config::from_json(&format!(
            r#"{{"shards":[{{"name":"a","url":"redis://h:1"}}]{extra},"policies":{{{policies}}}}}"#
        ))
        .unwrap()
    };
    let fw = r#""fw":{"algorithm":"fixed_window","limit":5,"window":"1h"}"#;
    let sw = r#""sw":{"algorithm":"sliding_window","limit":5,"window":"40m"}"#;
    let tb = r#""tb":{"algorithm":"token_bucket","capacity":7200,"refill_per_sec":1}"#;
    let c = cfg(fw, "");
    assert_eq!(c.effective_reshard_handoff(), Duration::from_secs(3600));
    assert_eq!(c.reshard_handoff, None);
    // a sliding window weighs the previous window in: 2 × 40 min
    let c = cfg(&format!("{fw},{sw}"), "");
    assert_eq!(c.longest_window(), Some(("sw", Duration::from_secs(4800))));
    assert_eq!(c.effective_reshard_handoff(), Duration::from_secs(4800));
    // a bucket: the time to refill it completely
    assert_eq!(
        cfg(&format!("{fw},{tb}"), "").effective_reshard_handoff(),
        Duration::from_secs(7200)
    );
    // no policies: ten minutes; set explicitly: as set
    assert_eq!(
        cfg("", "").effective_reshard_handoff(),
        DEFAULT_RESHARD_HANDOFF
    );
    let c = cfg(fw, r#","reshard_handoff":"5m""#);
    assert_eq!(c.reshard_handoff, Some(Duration::from_secs(300)));
    assert_eq!(c.effective_reshard_handoff(), Duration::from_secs(300));
}

#[test]
fn redact_url_hides_every_login_form() {
    for (url, want) in [
        ("redis://bob:pw@h:1/2", "redis://***@h:1/2"),
        ("redis://bob:p/w@h:1", "redis://***@h:1"),
        ("redis://bob:p?w@h:1", "redis://***@h:1"),
        ("bob:pw@h:1", "***@h:1"),
        (
            "redis+sentinel://h:1/m?sentinel_password=pw",
            "redis+sentinel://h:1/m?***",
        ),
        ("redis://h:1", "redis://h:1"),
    ] {
        assert_eq!(redact_url(url), want, "{url}");
    }
    assert_eq!(
        scrub("bad URL p%40ss and p@ss", "redis://u:p%40ss@h"),
        "bad URL *** and ***"
    );
}
