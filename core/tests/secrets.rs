//! Passwords never appear in any output: config errors, `Debug`, or the errors of a limiter
//! built from the config. Every field that takes a password gets
//! URLs that are wrong in every way we know: bad ports, databases, schemes, hosts, logins.

mod support;

use shardlimit::config::Config;
use shardlimit::{Event, Limiter};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use support::RedisServer;

/// Every log line of this process (all threads: the limiter logs on its I/O thread too),
/// with its fields, as `tracing` hands them to a subscriber.
fn logs() -> &'static Mutex<Vec<String>> {
    static LOGS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        tracing::subscriber::set_global_default(Capture).expect("the only subscriber");
        Mutex::new(Vec::new())
    })
}

struct Capture;

struct Line<'a>(&'a mut String);

impl tracing::field::Visit for Line<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut line = String::from("span");
        span.record(&mut Line(&mut line));
        logs().lock().unwrap().push(line);
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut line = String::from("record");
        values.record(&mut Line(&mut line));
        logs().lock().unwrap().push(line);
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = event.metadata().level().to_string();
        event.record(&mut Line(&mut line));
        logs().lock().unwrap().push(line);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

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
    logs();
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
    for line in logs().lock().unwrap().iter() {
        for (secret, enc) in SECRETS {
            assert_clean("a log line", line, secret, enc);
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
fn runtime_errors_events_logs_and_metrics_never_show_a_password() {
    logs();
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
                out.push(format!(
                    "{:?}",
                    l.connect_blocking(Duration::from_millis(500))
                ));
                if let Err(e) = l.connect_blocking(Duration::from_millis(500)) {
                    out.push(e.to_string());
                }
                for _ in 0..4 {
                    out.push(format!("{:?}", l.check_by_name_blocking("k", "p", 1)));
                    if let Err(e) = l.check_by_name_blocking("k", "p", 1) {
                        out.push(e.to_string());
                    }
                }
                out.push(format!("{:?}", l.blocked_blocking("k")));
                out.push(l.metrics().to_prometheus());
                out.push(format!("{:?}", l.metrics()));
                out.extend(seen.lock().unwrap().iter().cloned());
                drop(l); // (its I/O thread has logged what it had to)
                out.extend(logs().lock().unwrap().iter().cloned());
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
