//! Passwords never appear in any output: config errors, `Debug`, or the errors of a limiter
//! built from the config (issue 14, "Secrets leak"). Every field that takes a password gets
//! URLs that are wrong in every way we know: bad ports, databases, schemes, hosts, logins.

mod support;

use shardlimit::config::Config;
use shardlimit::{Event, Limiter};
use std::sync::{Arc, Mutex};
use support::RedisServer;

/// Passwords with characters that URL parsers trip over (`/ ? # @ :`), raw and encoded.
const SECRETS: [(&str, &str); 4] = [
    ("s3cr3tpw", "s3cr3tpw"),
    ("pa/ss?wd", "pa/ss?wd"),
    ("p@ss:w#rd", "p%40ss%3Aw%23rd"),
    ("hunter2hunter2", "hunter2hunter2"),
];

/// URL shapes with `{u}` (user) and `{p}` (password) to fill in.
const SHAPES: [&str; 16] = [
    "redis://{u}:{p}@127.0.0.1:6379/abc",
    "redis://{u}:{p}@127.0.0.1:99999",
    "redis://{u}:{p}@127.0.0.1:port/0",
    "redis://{u}:{p}@127.0.0.1:6379/-1",
    "redis://:{p}@127.0.0.1:6379/999999999999999999999",
    "redis://{u}:{p}@[::1:6379/0",
    "redis://{u}:{p}@/0",
    "redis://{u}:{p}@bad host:6379",
    "rediss://{u}:{p}@127.0.0.1:6379/x",
    "http://{u}:{p}@127.0.0.1:6379",
    "redis:/{u}:{p}@127.0.0.1:6379",
    "{u}:{p}@127.0.0.1:6379",
    "redis+sentinel://{u}:{p}@127.0.0.1:26379/mymaster/abc",
    "redis+sentinel://:{p}@127.0.0.1:port/mymaster",
    "redis+sentinel://127.0.0.1:26379/mymaster?sentinel_password={p}&bogus=1",
    "redis+sentinel://{u}:{p}@/mymaster?sentinel_username={u}&sentinel_password={p}",
];

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// Every config text that carries `secret` (encoded as `enc` inside URLs).
fn configs(user: &str, enc: &str, secret: &str) -> Vec<String> {
    let mut out = Vec::new();
    for shape in SHAPES {
        let url = json_str(&shape.replace("{u}", user).replace("{p}", enc));
        out.push(format!(r#"{{"shards":[{{"name":"a","url":{url}}}]}}"#));
        out.push(format!(r#"{{"shards":[{{"name":"a","url":"redis://127.0.0.1:1"}},{{"name":"b","url":{url}}}]}}"#));
        out.push(format!(r#"{{"cluster":{{"nodes":[{url}]}}}}"#));
        out.push(format!(
            r#"{{"cluster":{{"nodes":["redis://127.0.0.1:7000",{url}]}}}}"#
        ));
        // the URL where an object or a list was expected
        out.push(format!(r#"{{"shards":[{url}]}}"#));
        out.push(format!(r#"{{"shards":{{"url":{url}}}}}"#));
        out.push(format!(r#"{{"cluster":{url}}}"#));
        out.push(format!(r#"{{"cluster":{{"nodes":[{{"url":{url}}}]}}}}"#));
        // valid, but with a bad field after it
        out.push(format!(
            r#"{{"shards":[{{"name":"a","url":{url}}}],"timeout_ms":-1}}"#
        ));
    }
    let pw = json_str(secret);
    for nodes in [
        r#"["127.0.0.1:26379"]"#,
        r#"["bad host:x"]"#,
        r#"[]"#,
        r#"[":"]"#,
    ] {
        for extra in [
            r#","db":-1"#,
            r#","db":"x""#,
            r#","master":"""#,
            r#","username":"bob""#,
            "",
        ] {
            out.push(format!(
                r#"{{"shards":[{{"name":"a","sentinel":{{"nodes":{nodes},"master":"m","password":{pw},"sentinel_password":{pw}{extra}}}}}]}}"#
            ));
        }
    }
    out
}

fn assert_clean(what: &str, text: &str, secret: &str, enc: &str) {
    for s in [secret, enc] {
        assert!(!text.contains(s), "{what} shows the password {s:?}: {text}");
    }
}

#[test]
fn no_output_ever_shows_a_password() {
    let mut checked = 0;
    for (secret, enc) in SECRETS {
        for user in ["bob", ""] {
            for text in configs(user, enc, secret) {
                let mut outputs = Vec::new();
                match Config::from_json(&text) {
                    Err(e) => {
                        outputs.push(("error", e.to_string()));
                        outputs.push(("error Debug", format!("{e:?}")));
                    }
                    Ok(cfg) => {
                        outputs.push(("Config Debug", format!("{cfg:?}")));
                        match Limiter::new(cfg) {
                            Err(e) => {
                                outputs.push(("Limiter error", e.to_string()));
                                outputs.push(("Limiter error Debug", format!("{e:?}")));
                            }
                            Ok(l) => outputs.push(("Limiter Debug", format!("{l:?}"))),
                        }
                    }
                }
                for (what, out) in outputs {
                    assert_clean(&format!("{what} of {text}"), &out, secret, enc);
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 1000, "{checked}");
}

#[test]
fn the_redacted_message_still_names_the_field() {
    let e = Config::from_json(
        r#"{"shards":[{"name":"a","url":"redis://bob:s3cr3tpw@127.0.0.1:6379/abc"}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("shards[0].url: invalid Redis URL"), "{e}");
    assert!(e.contains("***@127.0.0.1:6379/abc"), "{e}");
    let e = Config::from_json(r#"{"cluster":{"nodes":["redis://bob:s3cr3tpw@127.0.0.1:99999"]}}"#)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("cluster.nodes[0]: "), "{e}");
    assert!(!e.contains("s3cr3tpw"), "{e}");
}

#[test]
fn runtime_errors_events_and_metrics_never_show_a_password() {
    let server = RedisServer::start_with(
        support::free_port(),
        vec!["--requirepass".into(), "right-one".into()],
    );
    let dead = support::free_port();
    for secret in ["wr0ngs3cr3t", "p@ss/w?rd"] {
        let enc = secret
            .replace('@', "%40")
            .replace('/', "%2F")
            .replace('?', "%3F");
        for url in [
            format!("redis://:{enc}@127.0.0.1:{}", server.port),
            format!("redis://bob:{enc}@127.0.0.1:{}", server.port),
            format!("redis://:{enc}@127.0.0.1:{dead}"),
        ] {
            for on_error in ["open", "error"] {
                let text = format!(
                    r#"{{"timeout_ms":500,"shards":[{{"name":"s","url":{}}}],"on_error":"{on_error}",
                        "policies":{{"p":{{"algorithm":"fixed_window","limit":5,"window":"1m"}}}}}}"#,
                    serde_json::to_string(&url).unwrap()
                );
                let l = Limiter::from_json(&text).unwrap();
                let seen = Arc::new(Mutex::new(Vec::<String>::new()));
                let s2 = seen.clone();
                l.subscribe(Arc::new(move |e: &Event| {
                    s2.lock().unwrap().push(format!("{e:?}"))
                }));
                let mut out = vec![format!("{l:?}")];
                for _ in 0..4 {
                    out.push(format!("{:?}", l.check_named_blocking("p", "k", 1)));
                    if let Err(e) = l.check_named_blocking("p", "k", 1) {
                        out.push(e.to_string());
                    }
                }
                out.push(format!("{:?}", l.blocked_blocking("k")));
                out.push(l.metrics().to_prometheus());
                out.push(format!("{:?}", l.metrics()));
                out.extend(seen.lock().unwrap().iter().cloned());
                // the failure was reached and described (so there was something to leak)
                let all = out.join("\n");
                assert!(
                    all.contains("connection failed") || all.contains("Fallback"),
                    "{all}"
                );
                for o in out {
                    assert_clean(&format!("{url} ({on_error})"), &o, secret, &enc);
                }
            }
        }
    }
}
