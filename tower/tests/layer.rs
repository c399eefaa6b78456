//! Drives the layer with real requests through `tower::ServiceExt::oneshot`, on the
//! in-memory engine with an injected clock: every decision is deterministic.

use http::{Request, Response, StatusCode};
use shardlimit::{Layer, Limit, Limiter, ManualClock, Policy};
use shardlimit_tower::{Check, Error, IpKey, RateLimitLayer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::{service_fn, Layer as _, Service, ServiceExt};

const T0: u64 = 1_735_732_800_000_000; // 2025-01-01T12:00:00Z, on a minute boundary

fn limiter() -> (Limiter, Arc<ManualClock>) {
    let clock = ManualClock::new(T0);
    let l = Limiter::memory().with_clock(clock.clone()).unwrap();
    (l, clock)
}

/// An inner service that counts its calls and answers 200 "ok".
fn counting(
    calls: Arc<AtomicUsize>,
) -> impl Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static {
    service_fn(move |_req: Request<String>| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Infallible>(Response::new("ok".to_string()))
        }
    })
}

fn req(path: &str) -> Request<String> {
    Request::builder().uri(path).body(String::new()).unwrap()
}

fn header<'a>(r: &'a Response<String>, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

fn body_json(r: &Response<String>) -> serde_json::Value {
    serde_json::from_str(r.body()).unwrap()
}

#[tokio::test]
async fn allows_then_answers_429_with_headers_and_json_body() {
    let (limiter, clock) = limiter();
    let login = Policy::new("login", Limit::fixed_window(3, Duration::from_secs(60))).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(limiter, move |_r: &Request<String>| {
        Ok(Check::new("user:42", &login))
    });
    let svc = layer.layer(counting(calls.clone()));

    for remaining in ["2", "1", "0"] {
        let r = svc.clone().oneshot(req("/login")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.body(), "ok");
        assert_eq!(header(&r, "x-ratelimit-limit"), Some("3"));
        assert_eq!(header(&r, "x-ratelimit-remaining"), Some(remaining));
        // a Unix timestamp: the wall clock's now plus the 60 s left (the window is the
        // injected clock's), rounded up
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let reset: u64 = header(&r, "x-ratelimit-reset").unwrap().parse().unwrap();
        assert!(
            (wall + 60..=wall + 62).contains(&reset),
            "{reset} vs {wall}"
        );
        assert_eq!(header(&r, "ratelimit-policy"), Some("\"login\";q=3;w=60"));
        assert_eq!(
            header(&r, "ratelimit"),
            Some(format!("\"login\";r={remaining};t=60").as_str())
        );
        assert_eq!(header(&r, "retry-after"), None);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    clock.advance_us(20_000_000);
    let r = svc.clone().oneshot(req("/login")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "a denied request must not reach the service"
    );
    assert_eq!(header(&r, "content-type"), Some("application/json"));
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&r, "retry-after"), Some("40"));
    assert_eq!(header(&r, "ratelimit"), Some("\"login\";r=0;t=40"));
    let b = body_json(&r);
    assert_eq!(b["error"], "rate_limited");
    assert_eq!(b["policy"], "login");
    assert_eq!(b["limit"], 3);
    assert_eq!(b["remaining"], 0);
    assert_eq!(b["retry_after"], 40);
    assert!(b["message"]
        .as_str()
        .unwrap()
        .contains("retry in 40 seconds"));

    // the next window admits again
    clock.advance_us(40_000_000);
    let r = svc.clone().oneshot(req("/login")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"));
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn skip_passes_through_without_headers_and_cost_weighs() {
    let (limiter, _clock) = limiter();
    let api = Policy::new("api", Limit::fixed_window(10, Duration::from_secs(60))).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(limiter, move |r: &Request<String>| {
        Ok(match r.uri().path() {
            "/health" => Check::Skip,
            "/export" => Check::new("tenant:1", &api).cost(4),
            _ => Check::new("tenant:1", &api),
        })
    });
    let svc = layer.layer(counting(calls.clone()));
    for _ in 0..20 {
        let r = svc.clone().oneshot(req("/health")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert!(r.headers().get("x-ratelimit-limit").is_none());
    }
    let r = svc.clone().oneshot(req("/export")).await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("6"));
    let r = svc.clone().oneshot(req("/export")).await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"));
    // 4 units do not fit in 2: denied, and nothing consumed
    let r = svc.clone().oneshot(req("/export")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"));
    let r = svc.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("1"));
    assert_eq!(calls.load(Ordering::SeqCst), 23);
}

fn from_peer(peer: &str, xff: Option<&str>) -> Request<String> {
    let mut b = Request::builder().uri("/");
    if let Some(x) = xff {
        b = b.header("x-forwarded-for", x);
    }
    let mut r = b.body(String::new()).unwrap();
    r.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    r
}

#[tokio::test]
async fn ip_key_trusts_forwarded_for_only_from_trusted_proxies() {
    let (limiter, _clock) = limiter();
    let per_ip = Policy::new("per_ip", Limit::fixed_window(2, Duration::from_secs(60))).unwrap();
    let key = IpKey::new(per_ip, &["10.0.0.0/8"]).unwrap();
    assert_eq!(
        key.client_ip(&from_peer("10.1.2.3:5555", Some("6.6.6.6, 198.51.100.7")))
            .unwrap()
            .to_string(),
        "198.51.100.7"
    );
    let svc = RateLimitLayer::new(limiter, key).layer(counting(Arc::new(AtomicUsize::new(0))));
    let status = |r: Response<String>| r.status();

    // client 198.51.100.7 behind our proxy: two allowed, the third denied
    for want in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        let r = svc
            .clone()
            .oneshot(from_peer("10.1.2.3:5555", Some("198.51.100.7")))
            .await
            .unwrap();
        assert_eq!(status(r), want);
    }
    // another client behind the same proxy has its own budget
    let r = svc
        .clone()
        .oneshot(from_peer("10.1.2.3:5555", Some("198.51.100.8")))
        .await
        .unwrap();
    assert_eq!(status(r), StatusCode::OK);
    // an untrusted peer cannot pick a fresh key by sending the header: keyed by its address
    for (i, want) in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ]
    .into_iter()
    .enumerate()
    {
        let r = svc
            .clone()
            .oneshot(from_peer("203.0.113.9:1000", Some(&format!("1.1.1.{i}"))))
            .await
            .unwrap();
        assert_eq!(status(r), want, "request {i}");
    }
}

async fn status_from<S>(svc: &S, peer: &str) -> StatusCode
where
    S: Service<Request<String>, Response = Response<String>> + Clone,
    S::Error: std::fmt::Debug,
{
    svc.clone()
        .oneshot(from_peer(peer, None))
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn ipv6_clients_are_keyed_by_their_network() {
    let (limiter, _clock) = limiter();
    let per_ip = Policy::new("per_ip", Limit::fixed_window(2, Duration::from_secs(60))).unwrap();
    let layer = |key: IpKey| {
        RateLimitLayer::new(limiter.clone(), key).layer(counting(Arc::new(AtomicUsize::new(0))))
    };
    // one client rotating through its /64: two allowed, then denied whatever the address
    let s = layer(IpKey::new(per_ip.clone(), &[] as &[&str]).unwrap());
    let mut got = Vec::new();
    for peer in [
        "[2001:db8:1:2::1]:1",
        "[2001:db8:1:2::2]:1",
        "[2001:db8:1:2:ffff::9]:1",
    ] {
        got.push(status_from(&s, peer).await);
    }
    assert_eq!(
        got,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // the next /64 is another client
    assert_eq!(status_from(&s, "[2001:db8:1:3::1]:1").await, StatusCode::OK);
    // with /56, the /64s of 2001:db8:1::/56 are one client
    let key = IpKey::new(per_ip, &[] as &[&str]).unwrap();
    let s = layer(key.with_ipv6_prefix(56).unwrap());
    let mut got = Vec::new();
    for peer in [
        "[2001:db8:1:4::1]:1",
        "[2001:db8:1:5::1]:1",
        "[2001:db8:1:ff::1]:1",
    ] {
        got.push(status_from(&s, peer).await);
    }
    assert_eq!(
        got,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

#[tokio::test]
async fn errors_become_json_responses_or_the_handler_s() {
    let (limiter, _clock) = limiter();
    let p = Policy::new("per_ip", Limit::fixed_window(2, Duration::from_secs(60))).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    // no peer address in the extensions: 500, kind "key"
    let svc = RateLimitLayer::new(
        limiter.clone(),
        IpKey::new(p.clone(), &[] as &[&str]).unwrap(),
    )
    .layer(counting(calls.clone()));
    let r = svc.oneshot(req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let b = body_json(&r);
    assert_eq!(b["error"], "rate_limiter_error");
    assert_eq!(b["kind"], "key");
    assert!(b["message"].as_str().unwrap().contains("connect_info"));

    // the core rejects an empty key: 500 with its stable kind name
    let p2 = p.clone();
    let svc = RateLimitLayer::new(limiter.clone(), move |_r: &Request<String>| {
        Ok(Check::new("", &p2))
    })
    .layer(counting(calls.clone()));
    let r = svc.oneshot(req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body_json(&r)["kind"], "invalid_argument");

    // a custom handler
    let svc = RateLimitLayer::new(limiter, move |_r: &Request<String>| {
        Err(Error::Key("no tenant".into()))
    })
    .on_error(|e| {
        let mut r = Response::new(format!("custom: {e}"));
        *r.status_mut() = StatusCode::BAD_REQUEST;
        r
    })
    .layer(counting(calls.clone()));
    let r = svc.oneshot(req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        r.body(),
        "custom: cannot derive a rate-limit key: no tenant"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn layered_check_denies_when_any_layer_denies_and_describes_it() {
    let (limiter, _clock) = limiter();
    let per_user =
        Policy::new("per_user", Limit::fixed_window(5, Duration::from_secs(60))).unwrap();
    let per_tenant = Policy::new(
        "per_tenant",
        Limit::fixed_window(3, Duration::from_secs(60)),
    )
    .unwrap();
    let layer = RateLimitLayer::new(limiter, move |r: &Request<String>| {
        let user = r.uri().path().trim_start_matches('/').to_string();
        Ok(Check::All(vec![
            Layer::new(format!("user:{user}"), &per_user, 1),
            Layer::new("tenant:acme", &per_tenant, 1),
        ]))
    });
    let svc = layer.layer(counting(Arc::new(AtomicUsize::new(0))));
    for (i, user) in ["a", "b", "c"].into_iter().enumerate() {
        let r = svc.clone().oneshot(req(&format!("/{user}"))).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        // the tightest layer (the tenant) is the one described
        assert_eq!(
            header(&r, "ratelimit-policy"),
            Some("\"per_tenant\";q=3;w=60")
        );
        assert_eq!(
            header(&r, "x-ratelimit-remaining"),
            Some((2 - i).to_string().as_str())
        );
    }
    let r = svc.clone().oneshot(req("/d")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body_json(&r)["policy"], "per_tenant");
}

#[tokio::test]
async fn concurrency_lease_is_held_while_the_service_runs_and_released_after() {
    let (limiter, _clock) = limiter();
    let reports = Policy::new("reports", Limit::concurrency(1, Duration::from_secs(30))).unwrap();
    let (entered_tx, mut entered_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let inner = service_fn(move |r: Request<String>| {
        let (entered_tx, g) = (entered_tx.clone(), g.clone());
        async move {
            if r.uri().path() == "/slow" {
                entered_tx.send(()).unwrap();
                g.acquire().await.unwrap().forget();
            }
            Ok::<_, Infallible>(Response::new("done".to_string()))
        }
    });
    let svc = RateLimitLayer::new(limiter, move |_r: &Request<String>| {
        Ok(Check::new("tenant:1", &reports))
    })
    .layer(inner);

    let slow = tokio::spawn(svc.clone().oneshot(req("/slow")));
    entered_rx.recv().await.unwrap(); // the slow request holds the only lease now
    let r = svc.clone().oneshot(req("/fast")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    gate.add_permits(1);
    let r = slow.await.unwrap().unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
    // released: the next request gets the lease
    for _ in 0..3 {
        let r = svc.clone().oneshot(req("/fast")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
}

#[tokio::test(start_paused = true)]
async fn leaky_bucket_holds_the_request_for_its_delay() {
    let (limiter, _clock) = limiter();
    // 2 per second: the third request in the same instant waits 1 s (paused tokio time)
    let upload = Policy::new("upload", Limit::leaky_bucket(10, 2.0)).unwrap();
    let svc = RateLimitLayer::new(limiter, move |_r: &Request<String>| {
        Ok(Check::new("u", &upload))
    })
    .layer(counting(Arc::new(AtomicUsize::new(0))));
    let mut waited = Vec::new();
    for _ in 0..3 {
        let start = tokio::time::Instant::now();
        let r = svc.clone().oneshot(req("/")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        waited.push(start.elapsed());
    }
    assert_eq!(
        waited,
        [
            Duration::ZERO,
            Duration::from_millis(500),
            Duration::from_secs(1)
        ]
    );
}

/// Shadow mode end to end: a request the limit would deny goes through (200, the service
/// is called), with no Retry-After, no remaining and no `RateLimit` field; it is counted.
/// Per policy and per call (`Check::shadow`), also in a layered check.
#[tokio::test]
async fn shadow_denied_requests_go_through_without_limited_headers() {
    let (limiter, _clock) = limiter();
    let login = Policy::new("login", Limit::fixed_window(1, Duration::from_secs(60)))
        .unwrap()
        .with_shadow(true)
        .unwrap();
    let api = Policy::new("api", Limit::fixed_window(1, Duration::from_secs(60))).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let (l2, api2) = (login.clone(), api.clone());
    let layer = RateLimitLayer::new(limiter.clone(), move |r: &Request<String>| {
        Ok(match r.uri().path() {
            "/login" => Check::new("user:1", &l2),
            "/api-shadow" => Check::new("user:1", &api2).shadow(),
            "/api" => Check::new("user:1", &api2),
            _ => Check::All(vec![
                Layer::new("user:2", &l2, 1),
                Layer::new("user:2", &api2, 1),
            ]),
        })
    });
    let svc = layer.layer(counting(calls.clone()));
    let r = svc.clone().oneshot(req("/login")).await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
    for path in ["/login", "/login"] {
        let r = svc.clone().oneshot(req(path)).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "retry-after"), None);
        assert_eq!(header(&r, "x-ratelimit-remaining"), None);
        assert_eq!(header(&r, "ratelimit"), None);
        assert_eq!(header(&r, "x-ratelimit-limit"), Some("1"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // per call: the enforcing policy denies, the shadow call of it goes through
    assert_eq!(
        svc.clone().oneshot(req("/api")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone().oneshot(req("/api")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let r = svc.clone().oneshot(req("/api-shadow")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "retry-after"), None);
    // layered: the enforced layer allows, the shadow layer reports; then the enforced
    // layer denies (429) whatever the shadow layer says
    let r = svc.clone().oneshot(req("/layers")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = svc.clone().oneshot(req("/layers")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "ratelimit-policy"), Some("\"api\";q=1;w=60"));
    assert_eq!(calls.load(Ordering::SeqCst), 6);
    let report = limiter.shadow_report("login", None).await.unwrap();
    assert_eq!(report.keys, vec![("user:1".to_string(), 2)]);
    let report = limiter.shadow_report("api", None).await.unwrap();
    assert_eq!(report.keys, vec![("user:1".to_string(), 1)]);
}

/// A denial by the `on_error` fallback (the limit could not be checked) is a 503 that names
/// the outage, never a 429 that blames the client.
#[tokio::test]
async fn a_denying_fallback_answers_503_not_429() {
    // a Redis that refuses connections (a port nothing listens on), on_error closed
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let limiter = Limiter::from_json(&format!(
        r#"{{"timeout_ms": 200, "on_error": "closed",
            "shards": [{{"name": "s0", "url": "redis://127.0.0.1:{port}"}}],
            "policies": {{"api": {{"algorithm": "fixed_window", "limit": 10, "window": "1m"}}}}}}"#
    ))
    .unwrap();
    let api = limiter.policy("api").unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(limiter, move |_r: &Request<String>| {
        Ok(Check::new("user:1", &api))
    });
    let svc = layer.layer(counting(calls.clone()));
    let r = svc.oneshot(req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let b = body_json(&r);
    assert_eq!(b["error"], "rate_limit_unavailable", "{b}");
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .contains("could not be checked"),
        "{b}"
    );
}
