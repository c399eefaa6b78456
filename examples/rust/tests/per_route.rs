//! `shardlimit-tower` per route in axum: a layer on one route (`post(h).layer(...)`) with a
//! layered check (per IP and per account) and a skip, `Router::route_layer` over several
//! routes around it, routes added after it unlimited, and the decision read by the handler
//! with `Extension<Decision>`. Driven through the real router (`ServiceExt::oneshot`) on the
//! in-memory engine with an injected clock.

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::routing::{get, post};
use axum::{Extension, Router};
use http::{Response, StatusCode};
use shardlimit::{Decision, Layer, Limit, Limiter, ManualClock, Policy};
use shardlimit_tower::{Check, Error, HeaderSet, IpKey, RateLimitLayer};
use std::net::SocketAddr;
use std::time::Duration;
use tower::ServiceExt;

const T0: u64 = 1_735_732_800_000_000; // 2025-01-01T12:00:00Z, on a minute boundary

fn memory() -> Limiter {
    Limiter::memory().with_clock(ManualClock::new(T0)).unwrap()
}

/// The app of the test: `/login` limited per IP (3/min) and per account (2/min) in one
/// layered check, skipped for internal callers; `/login` and `/export` also under a per-API
/// key limit (`route_layer`, 4/min; a request without a key is not limited by it);
/// `/login-internal` under the same per-route layer as `/login`; `/health` unlimited.
fn app(limiter: Limiter) -> Router {
    let per_ip = Policy::new("login_ip", Limit::fixed_window(3, Duration::from_secs(60))).unwrap();
    let per_user = Policy::new(
        "login_user",
        Limit::fixed_window(2, Duration::from_secs(60)),
    )
    .unwrap();
    let per_key = Policy::new("api_key", Limit::fixed_window(4, Duration::from_secs(60))).unwrap();
    let ip = IpKey::new(per_ip.clone(), &["10.0.0.0/8"]).unwrap();
    let login_limits = RateLimitLayer::new(
        limiter.clone(),
        move |req: &Request| -> Result<Check, Error> {
            if req.headers().contains_key("x-internal") {
                return Ok(Check::Skip);
            }
            let mut layers = vec![Layer::new(ip.key(req)?, &per_ip, 1)];
            if let Some(user) = req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
                layers.push(Layer::new(format!("user:{user}"), &per_user, 1));
            }
            Ok(Check::All(layers))
        },
    );
    let key_limits = RateLimitLayer::new(limiter, move |req: &Request| -> Result<Check, Error> {
        Ok(
            match req.headers().get("x-api-key").and_then(|v| v.to_str().ok()) {
                Some(k) => Check::new(format!("key:{k}"), &per_key),
                None => Check::Skip,
            },
        )
    })
    .headers(HeaderSet::Legacy);
    Router::new()
        .route(
            "/login",
            post(|Extension(d): Extension<Decision>| async move {
                format!("{} {} left", d.policy, d.remaining)
            })
            .layer(login_limits.clone()),
        )
        .route(
            "/login-internal",
            post(|d: Option<Extension<Decision>>| async move { unchecked_or(d) })
                .layer(login_limits),
        )
        .route(
            "/export",
            get(|d: Option<Extension<Decision>>| async move { unchecked_or(d) }),
        )
        .route_layer(key_limits)
        .route("/health", get(|| async { "ok" }))
}

/// What a handler that may run unchecked (a skip) answers.
fn unchecked_or(d: Option<Extension<Decision>>) -> String {
    d.map_or("unchecked".to_string(), |Extension(d)| {
        format!("{} {} left", d.policy, d.remaining)
    })
}

struct Sent {
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
}

impl Sent {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

async fn send(app: &Router, method: &str, path: &str, headers: &[(&str, &str)]) -> Sent {
    let mut b = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let mut req = b.body(Body::empty()).unwrap();
    let peer: SocketAddr = "203.0.113.5:40000".parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(peer));
    let res: Response<Body> = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    Sent {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

#[tokio::test]
async fn a_route_layer_with_layered_checks_and_a_skip() {
    let app = app(memory());
    // per account: 2 for ada, then ada is denied while the IP still has budget
    let ada = [("x-user", "ada")];
    let r = send(&app, "POST", "/login", &ada).await;
    assert_eq!(r.status, StatusCode::OK);
    // the handler got the decision that describes the tightest layer (ada's: 1 left)
    assert_eq!(r.body, "login_user 1 left");
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"login_user\";q=2;w=60")
    );
    let r = send(&app, "POST", "/login", &ada).await;
    assert_eq!(r.body, "login_user 0 left");
    let r = send(&app, "POST", "/login", &ada).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"login_user\";q=2;w=60")
    );
    assert_eq!(r.header("retry-after"), Some("60"));
    let b: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(b["policy"], "login_user");
    // the denial consumed nothing of the IP's layer: one more anonymous request fits...
    let r = send(&app, "POST", "/login", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "login_ip 0 left");
    // ...and then the IP is out, for every account
    let r = send(&app, "POST", "/login", &[("x-user", "bob")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("ratelimit-policy"), Some("\"login_ip\";q=3;w=60"));
    // an internal caller is skipped: no check, no headers, no decision for the handler
    let r = send(&app, "POST", "/login-internal", &[("x-internal", "1")]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body, "unchecked");
    assert_eq!(r.header("x-ratelimit-limit"), None);
    // the same layer on another route shares the budget: this IP is out there too
    let r = send(&app, "POST", "/login-internal", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // routes added after route_layer and other routes' limits are not touched
    for _ in 0..10 {
        let r = send(&app, "GET", "/health", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("x-ratelimit-limit"), None);
    }
}

#[tokio::test]
async fn route_layer_over_several_routes_skips_without_a_key_and_sends_one_set() {
    let app = app(memory());
    // no API key: route_layer's check is skipped, the handler sees no decision
    let r = send(&app, "GET", "/export", &[]).await;
    assert_eq!(r.body, "unchecked");
    assert_eq!(r.header("x-ratelimit-limit"), None);
    // with a key: 4 per minute across /export and /login
    let key = [("x-api-key", "k1")];
    for left in ["3", "2"] {
        let r = send(&app, "GET", "/export", &key).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, format!("api_key {left} left"));
        assert_eq!(r.header("x-ratelimit-remaining"), Some(left));
        assert_eq!(r.header("ratelimit"), None, "Legacy: no IETF fields");
    }
    // /login under both layers: one set of headers, the tighter decision's (the IP
    // layer's 2 left against the key's 1 left)
    let r = send(&app, "POST", "/login", &key).await;
    assert_eq!(r.status, StatusCode::OK);
    // and the handler sees that decision
    assert_eq!(r.body, "api_key 1 left");
    assert_eq!(r.header("x-ratelimit-limit"), Some("4"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(r.header("ratelimit"), None);
    assert_eq!(r.headers.get_all("x-ratelimit-remaining").iter().count(), 1);
    let r = send(&app, "POST", "/login", &key).await;
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    // the key is out: denied by route_layer before the route's own layer runs, so the IP
    // keeps its last unit
    let r = send(&app, "POST", "/login", &key).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("x-ratelimit-limit"), Some("4"));
    let r = send(&app, "POST", "/login", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "login_ip 0 left");
}

/// The per-route snippet of docs/features.md ("HTTP services in Rust"), read from there; the copy
/// below is the same code, with the limiter built from the same `login` policy on the
/// in-memory engine instead of `shard-config.json`'s Redis shards, and the router driven
/// with `oneshot` instead of `axum::serve`. The test fails when either changes alone.
#[tokio::test]
async fn readme_tower_per_route_snippet_runs() -> Result<(), Box<dyn std::error::Error>> {
    const SNIPPET: &str = r####"use axum::extract::Request;
use axum::routing::{get, post};
use axum::{Extension, Router};
use shardlimit::{Decision, Layer, Limiter};
use shardlimit_tower::{Check, Error, IpKey, RateLimitLayer};
use std::net::SocketAddr;

let limiter = Limiter::from_config_file("shard-config.json")?;
let login = limiter.policy("login")?;
let ip = IpKey::new(login.clone(), &["10.0.0.0/8"])?; // X-Forwarded-For only from these proxies
let login_limits = RateLimitLayer::new(limiter.clone(), move |req: &Request| -> Result<Check, Error> {
    if req.headers().contains_key("x-internal-token") {
        return Ok(Check::Skip); // not limited, no headers
    }
    let mut layers = vec![Layer::new(ip.key(req)?, &login, 1)]; // per client IP...
    if let Some(user) = req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
        layers.push(Layer::new(format!("user:{user}"), &login, 1)); // ...and per account
    }
    Ok(Check::All(layers)) // all must allow; a denial consumes nothing
});
let app = Router::new()
    .route("/login", post(|d: Option<Extension<Decision>>| async move {
        d.map_or("internal".to_string(), |Extension(d)| format!("{} left", d.remaining))
    }).layer(login_limits)) // this route only
    .route("/health", get(|| async { "ok" }));
axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
"####;
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/features.md"
    ))?;
    assert!(
        page.contains(&format!("```rust\n{SNIPPET}```")),
        "the tower snippet of docs/features.md differs from this test's copy"
    );

    // the copy; shard-config.json's login policy: fixed_window, 5 per minute
    let limiter = Limiter::from_json(
        r#"{"policies": {"login": {"algorithm": "fixed_window", "limit": 5, "window": "1m"}}}"#,
    )?
    .with_clock(ManualClock::new(T0))?;
    let login = limiter.policy("login")?;
    let ip = IpKey::new(login.clone(), &["10.0.0.0/8"])?; // X-Forwarded-For only from these proxies
    let login_limits = RateLimitLayer::new(
        limiter.clone(),
        move |req: &Request| -> Result<Check, Error> {
            if req.headers().contains_key("x-internal-token") {
                return Ok(Check::Skip); // not limited, no headers
            }
            let mut layers = vec![Layer::new(ip.key(req)?, &login, 1)]; // per client IP...
            if let Some(user) = req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
                layers.push(Layer::new(format!("user:{user}"), &login, 1)); // ...and per account
            }
            Ok(Check::All(layers)) // all must allow; a denial consumes nothing
        },
    );
    let app = Router::new()
        .route(
            "/login",
            post(|d: Option<Extension<Decision>>| async move {
                d.map_or("internal".to_string(), |Extension(d)| {
                    format!("{} left", d.remaining)
                })
            })
            .layer(login_limits),
        ) // this route only
        .route("/health", get(|| async { "ok" }));

    // ada from 203.0.113.5: 5 per minute per account and per IP
    for left in (0..5).rev() {
        let r = send(&app, "POST", "/login", &[("x-user", "ada")]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, format!("{left} left"));
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(left.to_string().as_str())
        );
    }
    let r = send(&app, "POST", "/login", &[("x-user", "bob")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "the IP is out");
    assert_eq!(r.header("retry-after"), Some("60"));
    let r = send(&app, "POST", "/login", &[("x-internal-token", "t")]).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "internal"));
    assert_eq!(r.header("x-ratelimit-limit"), None);
    let r = send(&app, "GET", "/health", &[]).await;
    assert_eq!(
        (r.status, r.header("x-ratelimit-limit")),
        (StatusCode::OK, None)
    );
    Ok(())
}
