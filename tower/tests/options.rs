//! The layer's answer options on real responses (`tower::ServiceExt::oneshot`), on the
//! in-memory engine with an injected clock: which header set, `Retry-After` as seconds or
//! an HTTP date, custom 429 and 503 handlers, one set of headers per response, and the
//! decision handed to the service.

use http::{Request, Response, StatusCode};
use shardlimit::{Decision, Limit, Limiter, ManualClock, Policy, Source};
use shardlimit_tower::{Check, Error, HeaderSet, RateLimitLayer, RetryAfter};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tower::{service_fn, Layer as _, Service, ServiceExt};

const T0: u64 = 1_735_732_800_000_000; // 2025-01-01T12:00:00Z, on a minute boundary

fn limiter() -> (Limiter, Arc<ManualClock>) {
    let clock = ManualClock::new(T0);
    let l = Limiter::memory().with_clock(clock.clone()).unwrap();
    (l, clock)
}

fn req(path: &str) -> Request<String> {
    Request::builder().uri(path).body(String::new()).unwrap()
}

fn ok_service() -> impl Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static {
    service_fn(|_r: Request<String>| async { Ok::<_, Infallible>(Response::new("ok".into())) })
}

fn names(r: &Response<String>) -> Vec<String> {
    let mut n: Vec<String> = r.headers().keys().map(|k| k.to_string()).collect();
    n.sort();
    n
}

fn header<'a>(r: &'a Response<String>, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

type KeyFn = Box<dyn Fn(&Request<String>) -> Result<Check, Error> + Send + Sync>;

/// A layer over `login` (2 per minute for one key) with `configure` applied; the first two
/// requests are admitted, the third denied with 40 s to wait (20 s into the window).
async fn two_then_denied(
    configure: impl Fn(RateLimitLayer<KeyFn>) -> RateLimitLayer<KeyFn>,
) -> (Response<String>, Response<String>) {
    let (limiter, clock) = limiter();
    let login = Policy::new("login", Limit::fixed_window(2, Duration::from_secs(60))).unwrap();
    let key: KeyFn = Box::new(move |_r: &Request<String>| Ok(Check::new("user:1", &login)));
    let svc = configure(RateLimitLayer::new(limiter, key)).layer(ok_service());
    let allowed = svc.clone().oneshot(req("/")).await.unwrap();
    svc.clone().oneshot(req("/")).await.unwrap();
    clock.advance_us(20_000_000);
    let denied = svc.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    (allowed, denied)
}

#[tokio::test]
async fn header_sets_choose_the_fields_and_retry_after_always_goes_with_a_denial() {
    let all = [
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ];
    let (a, d) = two_then_denied(|l| l).await;
    assert_eq!(names(&a), all, "the default is both sets");
    let mut with_retry = all.to_vec();
    with_retry.push("retry-after");
    with_retry.insert(0, "content-type");
    with_retry.sort();
    assert_eq!(names(&d), with_retry);

    let (a, d) = two_then_denied(|l| l.headers(HeaderSet::Both)).await;
    assert_eq!(names(&a), all);
    assert_eq!(names(&d), with_retry);

    let (a, d) = two_then_denied(|l| l.headers(HeaderSet::Legacy)).await;
    assert_eq!(
        names(&a),
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset"
        ]
    );
    assert_eq!(
        names(&d),
        [
            "content-type",
            "retry-after",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset"
        ]
    );
    assert_eq!(header(&a, "x-ratelimit-remaining"), Some("1"));
    assert_eq!(header(&d, "retry-after"), Some("40"));

    let (a, d) = two_then_denied(|l| l.headers(HeaderSet::Standard)).await;
    assert_eq!(names(&a), ["ratelimit", "ratelimit-policy"]);
    assert_eq!(header(&a, "ratelimit"), Some("\"login\";r=1;t=60"));
    assert_eq!(
        names(&d),
        [
            "content-type",
            "ratelimit",
            "ratelimit-policy",
            "retry-after"
        ]
    );
    assert_eq!(header(&d, "ratelimit"), Some("\"login\";r=0;t=40"));

    let (a, d) = two_then_denied(|l| l.headers(HeaderSet::None)).await;
    assert_eq!(names(&a), Vec::<String>::new());
    assert_eq!(names(&d), ["content-type", "retry-after"]);
    assert_eq!(header(&d, "retry-after"), Some("40"));
}

#[tokio::test]
async fn retry_after_as_an_http_date() {
    let (_a, d) = two_then_denied(|l| l.retry_after(RetryAfter::HttpDate)).await;
    let v = header(&d, "retry-after").unwrap();
    // IMF-fixdate: "Wed, 01 Jan 2025 12:00:40 GMT"
    assert!(v.ends_with(" GMT") && v.len() == 29, "{v}");
    let at = httpdate::parse_http_date(v).unwrap();
    let wall = SystemTime::now();
    let wait = at.duration_since(wall - Duration::from_secs(1)).unwrap();
    assert!(
        (Duration::from_secs(39)..=Duration::from_secs(42)).contains(&wait),
        "{v}: {wait:?} from now"
    );
    // the JSON body keeps delta seconds
    let b: serde_json::Value = serde_json::from_str(d.body()).unwrap();
    assert_eq!(b["retry_after"], 40);
    // seconds is the default
    let (_a, d) = two_then_denied(|l| l.retry_after(RetryAfter::Seconds)).await;
    assert_eq!(header(&d, "retry-after"), Some("40"));
}

#[tokio::test]
async fn a_custom_429_handler_answers_and_gets_the_headers_unless_it_sets_its_own() {
    // a JSON body of the user's, with the decision it was given; the layer adds the headers
    let (_a, d) = two_then_denied(|l| {
        l.on_limited(|d: &Decision| {
            let body = serde_json::json!({
                "code": "slow_down",
                "policy": &*d.policy,
                "retry_in": d.retry_after.map(|r| r.as_secs()),
            });
            let mut r = Response::new(body.to_string());
            *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            r
        })
    })
    .await;
    let b: serde_json::Value = serde_json::from_str(d.body()).unwrap();
    assert_eq!(
        b,
        serde_json::json!({"code": "slow_down", "policy": "login", "retry_in": 40})
    );
    assert_eq!(header(&d, "retry-after"), Some("40"));
    assert_eq!(header(&d, "ratelimit"), Some("\"login\";r=0;t=40"));
    assert_eq!(header(&d, "x-ratelimit-remaining"), Some("0"));

    // a handler with its own Retry-After: the layer adds no second set
    let (_a, d) = two_then_denied(|l| {
        l.headers(HeaderSet::Legacy).on_limited(|_d: &Decision| {
            let mut r = Response::new("come back later".to_string());
            *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            r.headers_mut()
                .insert("retry-after", http::HeaderValue::from_static("120"));
            r
        })
    })
    .await;
    assert_eq!(d.body(), "come back later");
    assert_eq!(names(&d), ["retry-after"]);
    assert_eq!(header(&d, "retry-after"), Some("120"));
}

#[tokio::test]
async fn the_admitted_request_carries_its_decision() {
    let (limiter, _clock) = limiter();
    let api = Policy::new("api", Limit::fixed_window(5, Duration::from_secs(60))).unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let inner = service_fn(move |r: Request<String>| {
        let s = s.clone();
        async move {
            let body = match r.extensions().get::<Decision>() {
                Some(d) => {
                    s.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(d.source, Source::Memory);
                    format!("{} left of {} ({})", d.remaining, d.limit, d.policy)
                }
                None => "no decision".to_string(),
            };
            Ok::<_, Infallible>(Response::new(body))
        }
    });
    let svc = RateLimitLayer::new(limiter, move |r: &Request<String>| {
        Ok(match r.uri().path() {
            "/health" => Check::Skip,
            _ => Check::new("tenant:1", &api).cost(2),
        })
    })
    .layer(inner);
    let r = svc.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(r.body(), "3 left of 5 (api)");
    let r = svc.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(r.body(), "1 left of 5 (api)");
    // a skipped request is not checked: no decision
    let r = svc.clone().oneshot(req("/health")).await.unwrap();
    assert_eq!(r.body(), "no decision");
    assert_eq!(seen.load(Ordering::SeqCst), 2);
}

/// The service answered its own 429 with its own rate-limit headers (it checked a limit of
/// its own): the layer leaves them alone rather than mixing a second, contradictory set in.
#[tokio::test]
async fn a_response_with_its_own_rate_limit_headers_gets_no_second_set() {
    let (limiter, _clock) = limiter();
    let api = Policy::new("api", Limit::fixed_window(10, Duration::from_secs(60))).unwrap();
    let inner = service_fn(|r: Request<String>| async move {
        let mut res = Response::new("ok".to_string());
        if r.uri().path() == "/own" {
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            let h = res.headers_mut();
            h.insert("x-ratelimit-limit", http::HeaderValue::from_static("3"));
            h.insert("x-ratelimit-remaining", http::HeaderValue::from_static("0"));
            h.insert("retry-after", http::HeaderValue::from_static("7"));
        }
        Ok::<_, Infallible>(res)
    });
    let svc = RateLimitLayer::new(limiter, move |_r: &Request<String>| {
        Ok(Check::new("u", &api))
    })
    .layer(inner);
    let r = svc.clone().oneshot(req("/own")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        names(&r),
        ["retry-after", "x-ratelimit-limit", "x-ratelimit-remaining"]
    );
    assert_eq!(header(&r, "x-ratelimit-limit"), Some("3"));
    assert_eq!(header(&r, "retry-after"), Some("7"));
    // the layer's own set on the other responses
    let r = svc.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-limit"), Some("10"));
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("8"));
}

/// Two layers on one request (a router-wide limit around a route's own): one set of
/// headers, the tighter decision's, whichever layer made it.
#[tokio::test]
async fn nested_layers_send_the_tighter_decision_s_headers_only() {
    let (limiter, _clock) = limiter();
    let wide = Policy::new("wide", Limit::fixed_window(3, Duration::from_secs(60))).unwrap();
    let route = Policy::new("route", Limit::fixed_window(10, Duration::from_secs(60))).unwrap();
    let inner_layer = RateLimitLayer::new(limiter.clone(), move |_r: &Request<String>| {
        Ok(Check::new("u", &route))
    });
    let outer_layer = RateLimitLayer::new(limiter.clone(), move |_r: &Request<String>| {
        Ok(Check::new("u", &wide))
    })
    .headers(HeaderSet::Standard);
    let svc = outer_layer.layer(inner_layer.layer(ok_service()));
    // the outer (wide: 3) is tighter than the route's 10: its set, and only the IETF
    // fields it asks for (the inner layer's X-RateLimit-* are gone)
    let r = svc.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(names(&r), ["ratelimit", "ratelimit-policy"]);
    assert_eq!(header(&r, "ratelimit-policy"), Some("\"wide\";q=3;w=60"));
    assert_eq!(header(&r, "ratelimit"), Some("\"wide\";r=2;t=60"));

    // a tight route inside a loose router-wide limit: the route's set stays
    let (limiter, _clock) = self::limiter();
    let wide = Policy::new("wide", Limit::fixed_window(100, Duration::from_secs(60))).unwrap();
    let route = Policy::new("route", Limit::fixed_window(1, Duration::from_secs(60))).unwrap();
    let inner_layer = RateLimitLayer::new(limiter.clone(), move |_r: &Request<String>| {
        Ok(Check::new("u", &route))
    });
    let outer_layer = RateLimitLayer::new(limiter, move |_r: &Request<String>| {
        Ok(Check::new("u", &wide))
    });
    let svc = outer_layer.layer(inner_layer.layer(ok_service()));
    let r = svc.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(header(&r, "ratelimit-policy"), Some("\"route\";q=1;w=60"));
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
    // denied by the route: its 429 and its Retry-After, not the outer admission's set
    let r = svc.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "ratelimit-policy"), Some("\"route\";q=1;w=60"));
    assert_eq!(header(&r, "retry-after"), Some("60"));
    assert_eq!(r.headers().get_all("ratelimit").iter().count(), 1);
}

fn dead_redis_limiter() -> Limiter {
    // a Redis that refuses connections (a port nothing listens on), on_error closed
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    Limiter::from_json(&format!(
        r#"{{"timeout_ms": 200, "on_error": "closed",
            "shards": [{{"name": "s0", "url": "redis://127.0.0.1:{port}"}}],
            "policies": {{"api": {{"algorithm": "fixed_window", "limit": 10, "window": "1m"}}}}}}"#
    ))
    .unwrap()
}

#[tokio::test]
async fn a_custom_503_handler_and_its_retry_after() {
    let limiter = dead_redis_limiter();
    let api = limiter.policy("api").unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let inner = service_fn(move |_r: Request<String>| {
        c.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new("ok".to_string())) }
    });
    let a2 = api.clone();
    let layer = RateLimitLayer::new(limiter.clone(), move |_r: &Request<String>| {
        Ok(Check::new("user:1", &a2))
    })
    .unavailable_retry_after(Duration::from_millis(29_500))
    .on_limited(|_d: &Decision| panic!("an outage is not a 429"))
    .on_unavailable(|d: &Decision| {
        assert_eq!(d.source, Source::Fallback);
        let body = serde_json::json!({
            "code": "try_later",
            "retry_in": d.retry_after.map(|r| r.as_secs()),
        });
        let mut r = Response::new(body.to_string());
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        r
    });
    let r = layer.layer(inner.clone()).oneshot(req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let b: serde_json::Value = serde_json::from_str(r.body()).unwrap();
    assert_eq!(b, serde_json::json!({"code": "try_later", "retry_in": 30}));
    assert_eq!(header(&r, "retry-after"), Some("30"));
    assert_eq!(header(&r, "x-ratelimit-status"), Some("unmeasured"));

    // the default 503 with the configured Retry-After in its header and body
    let layer = RateLimitLayer::new(limiter, move |_r: &Request<String>| {
        Ok(Check::new("user:1", &api))
    })
    .unavailable_retry_after(Duration::from_secs(5));
    let r = layer.layer(inner).oneshot(req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&r, "retry-after"), Some("5"));
    let b: serde_json::Value = serde_json::from_str(r.body()).unwrap();
    assert_eq!(b["error"], "rate_limit_unavailable");
    assert_eq!(b["retry_after"], 5);
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .contains("retry in 5 seconds"),
        "{b}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// `on_error: local` decides with this process's share of the limit: a real (local)
/// decision, so a denial is a 429 with its own Retry-After and budget headers, never the
/// 503 of an outage.
#[tokio::test]
async fn a_local_fallback_denial_is_a_429_with_its_own_headers() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let limiter = Limiter::from_json(&format!(
        r#"{{"timeout_ms": 200, "on_error": "local", "instances": 1,
            "shards": [{{"name": "s0", "url": "redis://127.0.0.1:{port}"}}],
            "policies": {{"api": {{"algorithm": "fixed_window", "limit": 2, "window": "1m"}}}}}}"#
    ))
    .unwrap();
    let api = limiter.policy("api").unwrap();
    let layer = RateLimitLayer::new(limiter, move |_r: &Request<String>| {
        Ok(Check::new("user:1", &api))
    })
    .on_unavailable(|_d: &Decision| panic!("a local decision is not an outage"));
    let svc = layer.layer(ok_service());
    for left in ["1", "0"] {
        let r = svc.clone().oneshot(req("/")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "x-ratelimit-remaining"), Some(left));
    }
    let r = svc.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
    assert!(header(&r, "x-ratelimit-status").is_none());
    let b: serde_json::Value = serde_json::from_str(r.body()).unwrap();
    assert_eq!(b["error"], "rate_limited");
}
