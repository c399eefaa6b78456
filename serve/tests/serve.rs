//! `shardlimit serve` end to end in one process: the HTTP API and Envoy's rate limit
//! service over real sockets, against a redis-server the test starts on a loopback port.
//! Every decision asserted here comes from Redis (`source` is checked, or the policies are
//! `on_error: error`), except where a failure is the point.

use serde_json::{json, Value};
use shardlimit_serve::proto::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use shardlimit_serve::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use shardlimit_serve::proto::rls::{RateLimitRequest, RateLimitResponse};
use shardlimit_serve::{Options, State};
use std::io::{Read, Write};
use std::net::TcpListener as StdListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Redis(Child, u16, #[allow(dead_code)] tempfile::TempDir);
impl Drop for Redis {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.id().to_string()])
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis() -> Redis {
    for _ in 0..10 {
        let port = StdListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if server_pid(port) == Some(child.id()) {
                return Redis(child, port, dir);
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("no free port for redis-server after 10 tries");
}

fn server_pid(port: u16) -> Option<u32> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "INFO", "server"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
}

fn config(port: u16, on_error: &str) -> Value {
    json!({
        "key_prefix": "t:",
        "timeout_ms": 2000,
        "on_error": on_error,
        "shards": [{"name": "a", "url": format!("redis://127.0.0.1:{port}")}],
        "policies": {
            "small": {"algorithm": "fixed_window", "limit": 2, "window": "1h"},
            "big": {"algorithm": "fixed_window", "limit": 10, "window": "1h"},
            "api": {"algorithm": "sliding_log", "limit": 3, "window": "1h"},
            "closed": {"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "closed"},
            "open": {"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "open"},
            "conc": {"algorithm": "concurrency", "max": 1, "lease_ttl": "30s"}
        },
        "plans": {"pro": {"api": {"algorithm": "sliding_log", "limit": 6, "window": "1h"}}},
        "gateway": {"domains": {"edge": {"rules": [
            {"name": "small", "match": [{"key": "generic_key", "value": "small"}, {"key": "user"}], "policy": "small", "key": "u:{user}"},
            {"name": "big", "match": [{"key": "generic_key", "value": "big"}, {"key": "user"}], "policy": "big", "key": "u:{user}"},
            {"name": "api", "match": [{"key": "api_key"}, {"key": "plan"}], "policy": "api", "key": "key:{api_key}", "plan_from": "plan"},
            {"name": "shadow", "match": [{"key": "generic_key", "value": "shadow"}], "policy": "small", "key": "shadowed", "shadow": true},
            {"name": "health", "match": [{"key": "generic_key", "value": "health*"}], "unlimited": true},
            {"name": "closed", "match": [{"key": "generic_key", "value": "closed"}], "policy": "closed", "key": "c"},
            {"name": "open", "match": [{"key": "generic_key", "value": "open"}], "policy": "open", "key": "o"}
        ]}}}
    })
}

struct Server {
    http: u16,
    grpc: u16,
    stop: tokio::sync::watch::Sender<bool>,
    state: Arc<State>,
    #[allow(dead_code)]
    file: tempfile::NamedTempFile,
}

async fn start(cfg: &Value) -> Server {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(cfg.to_string().as_bytes()).unwrap();
    let opts = Options {
        config: file.path().to_path_buf(),
        http: "127.0.0.1:0".into(),
        grpc: "127.0.0.1:0".into(),
        max_body: 4096,
        max_concurrency: 64,
        auth_deny_status: 403,
        deadline_margin_ms: 5,
        connect_timeout: Duration::from_secs(5),
        shutdown_grace: Duration::from_secs(5),
        log_format: "text".into(),
        log_level: tracing::Level::INFO,
        watch: None,
        socket_mode: 0o660,
    };
    let state = Arc::new(State::new(&opts).unwrap());
    state.limiter.connect(Duration::from_secs(5)).await.unwrap();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let h = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let g = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (http, grpc) = (
        h.local_addr().unwrap().port(),
        g.local_addr().unwrap().port(),
    );
    tokio::spawn(shardlimit_serve::http::serve(state.clone(), h, rx.clone()));
    tokio::spawn(shardlimit_serve::grpc::serve(state.clone(), g, rx));
    Server {
        http,
        grpc,
        stop,
        state,
        file,
    }
}

/// One HTTP/1.1 request on a fresh connection: (status, lower-case headers, body).
fn http(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, Vec<(String, String)>, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect();
    (status, headers, body.to_string())
}

async fn post(port: u16, path: &str, body: Value) -> (u16, Vec<(String, String)>, Value) {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        let (s, h, b) = http(port, "POST", &path, body.to_string().as_bytes());
        (s, h, serde_json::from_str(&b).unwrap_or(Value::Null))
    })
    .await
    .unwrap()
}

async fn raw(
    port: u16,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (u16, Vec<(String, String)>, String) {
    let (m, p) = (method.to_string(), path.to_string());
    tokio::task::spawn_blocking(move || http(port, &m, &p, &body))
        .await
        .unwrap()
}

fn header<'a>(h: &'a [(String, String)], k: &str) -> Option<&'a str> {
    h.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

async fn rls(
    port: u16,
    descriptors: Vec<RateLimitDescriptor>,
    timeout: Option<Duration>,
) -> Result<RateLimitResponse, tonic::Status> {
    let ch = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = RateLimitServiceClient::new(ch);
    let mut req = tonic::Request::new(RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: 0,
    });
    if let Some(t) = timeout {
        // as Envoy says it (it sends grpc-timeout too); a client-side timeout here would
        // race the answer on a loaded machine, and the answer's time is what is asserted
        req.metadata_mut().insert(
            "x-envoy-expected-rq-timeout-ms",
            t.as_millis().to_string().parse().unwrap(),
        );
    }
    c.should_rate_limit(req).await.map(|r| r.into_inner())
}

fn resp_header<'a>(r: &'a RateLimitResponse, k: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(k))
        .map(|h| h.value.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_decisions_and_bad_input() {
    let r = redis();
    let s = start(&config(r.1, "error")).await;
    let p = s.http;

    let (st, h, b) = post(p, "/check", json!({"policy": "small", "key": "h1"})).await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["source"], "redis");
    assert_eq!(b["remaining"], 1);
    assert_eq!(header(&h, "x-ratelimit-remaining"), Some("1"));
    assert!(header(&h, "ratelimit-policy").is_some());
    let (st, _, b) = post(p, "/peek", json!({"policy": "small", "key": "h1"})).await;
    assert_eq!((st, b["remaining"].as_u64()), (200, Some(1)));
    let (st, _, _) = post(p, "/check", json!({"policy": "small", "key": "h1"})).await;
    assert_eq!(st, 200);
    let (st, h, b) = post(p, "/check", json!({"policy": "small", "key": "h1"})).await;
    assert_eq!(st, 429, "{b}");
    assert_eq!(b["allowed"], false);
    assert!(header(&h, "retry-after").is_some());
    // refund one unit, then one check passes again
    let (st, _, b) = post(
        p,
        "/refund",
        json!({"policy": "small", "key": "h1", "cost": 1}),
    )
    .await;
    assert_eq!((st, b["remaining"].as_u64()), (200, Some(1)));
    let (st, _, _) = post(p, "/check", json!({"policy": "small", "key": "h1"})).await;
    assert_eq!(st, 200);
    // charge never denies; the key is in debt after
    let (st, _, b) = post(
        p,
        "/charge",
        json!({"policy": "small", "key": "h2", "cost": 3}),
    )
    .await;
    assert_eq!((st, b["allowed"].as_bool()), (200, Some(true)));
    let (st, _, _) = post(p, "/check", json!({"policy": "small", "key": "h2"})).await;
    assert_eq!(st, 429);
    // layered: the small layer denies, the big one consumes nothing
    post(
        p,
        "/check",
        json!({"policy": "small", "key": "h3", "cost": 2}),
    )
    .await;
    let (st, _, b) = post(
        p,
        "/check_all",
        json!({"layers": [{"policy": "big", "key": "h3"}, {"policy": "small", "key": "h3"}]}),
    )
    .await;
    assert_eq!((st, b["layer"].as_u64()), (429, Some(1)), "{b}");
    let (_, _, b) = post(p, "/peek", json!({"policy": "big", "key": "h3"})).await;
    assert_eq!(b["remaining"], 10);
    // acquire / release
    let (st, _, b) = post(p, "/acquire", json!({"policy": "conc", "key": "c1"})).await;
    assert_eq!(st, 200, "{b}");
    let lease = b["lease"].clone();
    let (st, _, _) = post(p, "/acquire", json!({"policy": "conc", "key": "c1"})).await;
    assert_eq!(st, 429);
    let (st, _, b) = post(p, "/release", json!({"lease": lease})).await;
    assert_eq!((st, b["released"].as_bool()), (200, Some(true)));
    // reserve / settle
    let (st, _, b) = post(
        p,
        "/reserve",
        json!({"policy": "big", "key": "r1", "units": 5}),
    )
    .await;
    assert_eq!((st, b["remaining"].as_u64()), (200, Some(5)), "{b}");
    let (st, _, b) = post(
        p,
        "/settle",
        json!({"reservation": b["reservation"], "actual": 2}),
    )
    .await;
    assert_eq!((st, b["remaining"].as_u64()), (200, Some(8)), "{b}");
    // overrides
    let (st, _, b) = post(
        p,
        "/overrides/set",
        json!({"policy": "api", "key": "o1", "limit": "pro"}),
    )
    .await;
    assert_eq!(st, 400, "api takes no overrides: {b}");
    assert_eq!(b["error"], "invalid_argument");

    // bad input: 4xx with a JSON error naming what is wrong, never 500
    let (st, _, b) = raw(p, "POST", "/check", b"{not json".to_vec()).await;
    assert_eq!(st, 400, "{b}");
    assert!(b.contains("not valid JSON"), "{b}");
    let (st, _, b) = post(p, "/check", json!({"policy": "nope", "key": "k"})).await;
    assert_eq!(
        (st, b["error"].as_str()),
        (400, Some("unknown_policy")),
        "{b}"
    );
    let (st, _, b) = post(
        p,
        "/check",
        json!({"policy": "small", "key": "k", "bogus": 1}),
    )
    .await;
    assert_eq!(st, 400);
    assert!(b["message"].as_str().unwrap().contains("bogus"));
    let (st, _, b) = post(
        p,
        "/check",
        json!({"policy": "small", "key": "x".repeat(2000)}),
    )
    .await;
    assert_eq!(
        (st, b["error"].as_str()),
        (400, Some("invalid_argument")),
        "{b}"
    );
    let (st, _, b) = post(
        p,
        "/check",
        json!({"policy": "small", "key": "k", "cost": -1}),
    )
    .await;
    assert_eq!(st, 400, "{b}");
    let (st, _, b) = post(p, "/check", json!([1, 2])).await;
    assert_eq!(st, 400, "{b}");
    let (st, _, b) = raw(p, "POST", "/check", vec![b' '; 10_000]).await;
    assert_eq!(st, 413, "{b}");
    assert!(b.contains("too_large"));
    let (st, _, b) = post(p, "/check", json!({"policy": "conc", "key": "k"})).await;
    assert_eq!(st, 400, "{b}");
    let (st, _, _) = raw(p, "GET", "/nope", vec![]).await;
    assert_eq!(st, 404);

    // the auth endpoint: 403 by default (nginx), deny_status=429 (Traefik, HAProxy)
    let (st, h, _) = raw(p, "GET", "/auth?policy=small&key=a1", vec![]).await;
    assert_eq!(st, 200);
    assert_eq!(header(&h, "x-ratelimit-remaining"), Some("1"));
    raw(p, "GET", "/auth?policy=small&key=a1", vec![]).await;
    let (st, h, b) = raw(p, "GET", "/auth?policy=small&key=a1", vec![]).await;
    assert_eq!(st, 403, "{b}");
    assert!(header(&h, "retry-after").is_some());
    assert!(b.contains("rate_limited"));
    let (st, _, _) = raw(
        p,
        "POST",
        "/auth?policy=small&key=a1&deny_status=429",
        vec![],
    )
    .await;
    assert_eq!(st, 429);
    let (st, _, b) = raw(p, "GET", "/auth?key=a1", vec![]).await;
    assert_eq!(st, 400, "{b}");
    // a key spliced into the URL cannot pick another policy
    let (st, _, b) = raw(p, "GET", "/auth?policy=small&key=a1&policy=big", vec![]).await;
    assert_eq!(st, 400, "{b}");
    assert!(b.contains("twice"), "{b}");

    let (st, _, b) = raw(p, "GET", "/healthz", vec![]).await;
    assert_eq!(st, 200, "{b}");
    let (st, _, _) = raw(p, "GET", "/readyz", vec![]).await;
    assert_eq!(st, 200);
    let (st, h, b) = raw(p, "GET", "/metrics", vec![]).await;
    assert_eq!(st, 200);
    assert!(header(&h, "content-type")
        .unwrap()
        .starts_with("text/plain"));
    assert!(
        b.contains("shardlimit_serve_http_requests_total{endpoint=\"/check\",status=\"429\"}"),
        "{b}"
    );
    assert!(
        b.contains("shardlimit_denied_total") || b.contains("policy=\"small\""),
        "{b}"
    );
    let _ = s.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_rls_layered_peek_refund_plans_shadow_unlimited() {
    let r = redis();
    let s = start(&config(r.1, "error")).await;
    let g = s.grpc;
    let small = |u: &str| desc(&[("generic_key", "small"), ("user", u)]);
    let big = |u: &str| desc(&[("generic_key", "big"), ("user", u)]);

    // two descriptors: one layered check
    let a = rls(g, vec![big("u1"), small("u1")], None).await.unwrap();
    assert_eq!(a.overall_code, 1);
    assert_eq!(a.statuses.len(), 2);
    assert_eq!(
        resp_header(&a, "x-ratelimit-remaining"),
        Some("1"),
        "the tightest layer"
    );
    // every descriptor's status is its own layer's: code, limit, remaining, reset
    let own = |r: &RateLimitResponse, i: usize| {
        let s = &r.statuses[i];
        let l = s.current_limit.as_ref().expect("current_limit");
        let reset = s.duration_until_reset.expect("duration_until_reset");
        (
            s.code,
            l.requests_per_unit,
            l.unit,
            s.limit_remaining,
            reset.seconds,
        )
    };
    let hour = 3; // rate_limit::Unit::Hour
    let (code, per, unit, left, reset) = own(&a, 0);
    assert_eq!(
        (code, per, unit, left),
        (1, 10, hour, 9),
        "big: 1 of 10 spent"
    );
    assert!(reset > 0 && reset <= 3600, "{reset}");
    let (code, per, unit, left, _) = own(&a, 1);
    assert_eq!(
        (code, per, unit, left),
        (1, 2, hour, 1),
        "small: 1 of 2 spent"
    );
    rls(g, vec![big("u1"), small("u1")], None).await.unwrap();
    let d = rls(g, vec![big("u1"), small("u1")], None).await.unwrap();
    assert_eq!(d.overall_code, 2, "the small layer denies");
    let (code, per, _, left, _) = own(&d, 1);
    assert_eq!((code, per, left), (2, 2, 0), "small: over the limit");
    let (code, per, _, left, reset) = own(&d, 0);
    assert_eq!(
        (code, per, left),
        (1, 10, 8),
        "big: its own OK, and what it still has (the denial consumed nothing)"
    );
    assert!(reset > 0 && reset <= 3600, "{reset}");
    assert!(resp_header(&d, "retry-after").is_some());
    let body: Value = serde_json::from_slice(&d.raw_body).unwrap();
    assert_eq!(body["error"], "rate_limited");
    assert_eq!(body["policy"], "small");
    // the denial consumed nothing in the big layer: 2 of 10 spent
    let mut peek = big("u1");
    peek.hits_addend = Some(0);
    let p = rls(g, vec![peek], None).await.unwrap();
    assert_eq!((p.overall_code, p.statuses[0].limit_remaining), (1, 8));
    // is_negative_hits gives a unit back to the small layer
    let mut back = small("u1");
    back.is_negative_hits = true;
    back.hits_addend = Some(1);
    let b = rls(g, vec![back], None).await.unwrap();
    assert_eq!(b.statuses[0].limit_remaining, 1);
    assert_eq!(
        rls(g, vec![big("u1"), small("u1")], None)
            .await
            .unwrap()
            .overall_code,
        1
    );
    // per-descriptor hits_addend is the cost
    let mut heavy = big("u2");
    heavy.hits_addend = Some(7);
    let h = rls(g, vec![heavy], None).await.unwrap();
    assert_eq!(h.statuses[0].limit_remaining, 3);

    // a plan chosen by a descriptor entry: pro has 6, the base 3, on the same key
    let api = |plan: &str| desc(&[("api_key", "k9"), ("plan", plan)]);
    let mut last = 0;
    for _ in 0..6 {
        last = rls(g, vec![api("pro")], None).await.unwrap().overall_code;
    }
    assert_eq!(last, 1);
    assert_eq!(
        rls(g, vec![api("pro")], None).await.unwrap().overall_code,
        2
    );
    assert_eq!(
        rls(g, vec![api("free")], None).await.unwrap().overall_code,
        2,
        "unknown plan: the base policy, same key"
    );

    // shadow: never denies, says so in the metrics
    for _ in 0..4 {
        let sh = rls(g, vec![desc(&[("generic_key", "shadow")])], None)
            .await
            .unwrap();
        assert_eq!(sh.overall_code, 1);
    }
    // unlimited and unmatched descriptors: OK without Redis
    let u = rls(
        g,
        vec![desc(&[("generic_key", "healthz")]), desc(&[("other", "x")])],
        None,
    )
    .await
    .unwrap();
    assert_eq!(u.overall_code, 1);
    assert_eq!(u.statuses[0].limit_remaining, u32::MAX);
    // bad input: INVALID_ARGUMENT, not a crash
    let long = desc(&[("generic_key", "small"), ("user", &"x".repeat(2000))]);
    let e = rls(g, vec![long], None).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let many: Vec<_> = (0..65).map(|i| small(&i.to_string())).collect();
    assert_eq!(
        rls(g, many, None).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );

    let (_, _, m) = raw(s.http, "GET", "/metrics", vec![]).await;
    assert!(
        m.contains("rule=\"shadow\",outcome=\"shadow_mode\"} 2"),
        "{m}"
    );
    assert!(
        m.contains("rule=\"small\",outcome=\"over_limit\"} 1"),
        "{m}"
    );
    let _ = s.stop.send(true);
}

/// Redis stopped (SIGSTOP): the call's 20 ms deadline (as Envoy sends it), not the
/// config's 2 s timeout, bounds the answer, and each policy's on_error mode decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_deadline_bounds_the_redis_call_and_on_error_decides() {
    let r = redis();
    let s = start(&config(r.1, "error")).await;
    let g = s.grpc;
    // warm: the connection is up and the scripts loaded
    rls(g, vec![desc(&[("generic_key", "open")])], None)
        .await
        .unwrap();
    assert!(Command::new("kill")
        .args(["-STOP", &r.0.id().to_string()])
        .status()
        .unwrap()
        .success());
    let t = Instant::now();
    let o = rls(
        g,
        vec![desc(&[("generic_key", "open")])],
        Some(Duration::from_millis(20)),
    )
    .await
    .unwrap();
    let took = t.elapsed();
    assert_eq!(o.overall_code, 1, "on_error: open allows");
    assert_eq!(resp_header(&o, "x-ratelimit-status"), Some("unmeasured"));
    assert!(
        took < Duration::from_millis(1000),
        "answered in {took:?}, not after the 2 s timeout"
    );
    let c = rls(
        g,
        vec![desc(&[("generic_key", "closed")])],
        Some(Duration::from_millis(20)),
    )
    .await
    .unwrap();
    assert_eq!(c.overall_code, 2, "on_error: closed denies");
    // on_error: error hands the decision to Envoy (failure_mode_deny)
    let e = rls(
        g,
        vec![desc(&[("generic_key", "small"), ("user", "z")])],
        Some(Duration::from_millis(20)),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e}");
    let _ = Command::new("kill")
        .args(["-CONT", &r.0.id().to_string()])
        .status();
    let _ = s.stop.send(true);
}

/// A change of the file reloads the policies and the gateway together; a broken file is
/// refused and the config in force stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_reloads_policies_and_gateway() {
    let r = redis();
    let mut cfg = config(r.1, "error");
    let s = start(&cfg).await;
    // (the watcher stops when its sender goes: keep it)
    let (_keep, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(shardlimit_serve::watch_file(
        s.state.clone(),
        Duration::from_millis(20),
        rx,
    ));
    let path = s.file.path().to_path_buf();
    let only_new = |entries: &[(&str, &str)]| desc(entries);
    // no rule for "fresh" yet: not limited
    let d = rls(s.grpc, vec![only_new(&[("generic_key", "fresh")])], None)
        .await
        .unwrap();
    assert_eq!(d.statuses[0].current_limit, None);
    cfg["policies"]["small"]["limit"] = json!(3);
    cfg["gateway"]["domains"]["edge"]["rules"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "fresh", "match": [{"key": "generic_key", "value": "fresh"}], "policy": "small", "key": "f"}));
    std::fs::write(&path, cfg.to_string()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = rls(s.grpc, vec![only_new(&[("generic_key", "fresh")])], None)
            .await
            .unwrap();
        if let Some(l) = &d.statuses[0].current_limit {
            assert_eq!(l.name, "fresh");
            break;
        }
        assert!(Instant::now() < deadline, "the change was not picked up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, _, b) = post(s.http, "/peek", json!({"policy": "small", "key": "w"})).await;
    assert_eq!(b["limit"], 3, "{b}");
    // broken: refused, the config in force stays
    std::fs::write(&path, "{\"policies\": {\"small\": \"nope\"}}").unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, _, b) = post(s.http, "/peek", json!({"policy": "small", "key": "w"})).await;
    assert_eq!(b["limit"], 3, "{b}");
    let _ = s.stop.send(true);
}

/// One HTTP/1.1 request over a Unix socket: (status, body).
fn unix_http(path: &std::path::Path, method: &str, target: &str, body: &str) -> (u16, String) {
    let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

async fn rls_unix(
    path: &std::path::Path,
    descriptors: Vec<RateLimitDescriptor>,
) -> Result<RateLimitResponse, tonic::Status> {
    let path = path.to_path_buf();
    let ch = tonic::transport::Endpoint::from_static("http://uds")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .unwrap();
    let mut c = RateLimitServiceClient::new(ch);
    c.should_rate_limit(RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: 0,
    })
    .await
    .map(|r| r.into_inner())
}

/// The service binary with its gRPC and HTTP servers on Unix sockets: their mode, one
/// budget over both, a stale socket replaced, a live socket or a file that is not a socket
/// refused (and left alone), the sockets removed at SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_sockets_mode_stale_live_and_cleanup() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let r = redis();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, config(r.1, "error").to_string()).unwrap();
    let (g, h) = (dir.path().join("rls.sock"), dir.path().join("http.sock"));
    let serve = |grpc: &std::path::Path, http: &str| {
        Command::new(env!("CARGO_BIN_EXE_shardlimit-serve"))
            .arg("--config")
            .arg(&cfg)
            .arg("--grpc")
            .arg(format!("unix:{}", grpc.display()))
            .args(["--http", http, "--socket-mode", "600"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let refused = |child: Child| {
        let out = child.wait_with_output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // a socket left by a service that died (nothing listens on it)
    drop(std::os::unix::net::UnixListener::bind(&g).unwrap());
    assert!(std::fs::symlink_metadata(&g)
        .unwrap()
        .file_type()
        .is_socket());
    let mut a = serve(&g, &format!("unix:{}", h.display()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&g).is_err()
        || std::os::unix::net::UnixStream::connect(&h).is_err()
    {
        assert!(a.try_wait().unwrap().is_none(), "the service exited");
        assert!(Instant::now() < deadline, "the sockets did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in [&g, &h] {
        let m = std::fs::symlink_metadata(p).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.permissions().mode() & 0o777, 0o600, "{}", p.display());
    }
    // one budget over both sockets: small allows 2 for u:x1
    let hp = h.clone();
    let (st, body) = tokio::task::spawn_blocking(move || {
        unix_http(&hp, "POST", "/check", r#"{"policy":"small","key":"u:x1"}"#)
    })
    .await
    .unwrap();
    assert_eq!(st, 200, "{body}");
    let one = desc(&[("generic_key", "small"), ("user", "x1")]);
    let d = rls_unix(&g, vec![one.clone()]).await.unwrap();
    assert_eq!((d.overall_code, d.statuses[0].limit_remaining), (1, 0));
    assert_eq!(rls_unix(&g, vec![one]).await.unwrap().overall_code, 2);

    // a second service on the live sockets: refused, the first one unharmed
    let (code, err) = refused(serve(&g, "off"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("another process is listening"), "{err}");
    assert!(std::os::unix::net::UnixStream::connect(&g).is_ok());
    // a path that is not a socket: refused and kept
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "keep").unwrap();
    let (code, err) = refused(serve(&file, "off"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");

    // SIGTERM: exits 0 and removes its sockets
    Command::new("kill")
        .args(["-TERM", &a.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = a.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    assert!(!g.exists() && !h.exists(), "the sockets were left behind");
}

/// Two shards: a call whose descriptors' keys live on different shards is denied by one;
/// the other shard's part was admitted and given back, and its status says what it still
/// has (not what it had while its units were taken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_across_shards_after_a_denial() {
    let (ra, rb) = (redis(), redis());
    let mut cfg = config(ra.1, "error");
    cfg["shards"] = json!([
        {"name": "a", "url": format!("redis://127.0.0.1:{}", ra.1)},
        {"name": "b", "url": format!("redis://127.0.0.1:{}", rb.1)}
    ]);
    let s = start(&cfg).await;
    let g = s.grpc;
    let user_on = |shard: u32| {
        (0..1000)
            .map(|i| format!("s{i}"))
            .find(|u| shardlimit::routing::shard_index(&format!("u:{u}"), 2) == shard)
            .unwrap()
    };
    let (ua, ub) = (user_on(0), user_on(1));
    let call = || {
        vec![
            desc(&[("generic_key", "big"), ("user", &ua)]),
            desc(&[("generic_key", "small"), ("user", &ub)]),
        ]
    };
    for left in [9, 8] {
        let r = rls(g, call(), None).await.unwrap();
        assert_eq!(r.overall_code, 1);
        assert_eq!(r.statuses[0].limit_remaining, left);
    }
    let d = rls(g, call(), None).await.unwrap();
    assert_eq!(d.overall_code, 2, "small (shard b) denies");
    assert_eq!((d.statuses[1].code, d.statuses[1].limit_remaining), (2, 0));
    assert_eq!(
        (d.statuses[0].code, d.statuses[0].limit_remaining),
        (1, 8),
        "big (shard a): admitted, given back, and reported as it is"
    );
    let mut peek = desc(&[("generic_key", "big"), ("user", &ua)]);
    peek.hits_addend = Some(0);
    let p = rls(g, vec![peek], None).await.unwrap();
    assert_eq!(p.statuses[0].limit_remaining, 8, "the unit was given back");
    let _ = s.stop.send(true);
}
