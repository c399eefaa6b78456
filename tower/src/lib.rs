//! # shardlimit-tower
//!
//! A [`tower`](https://docs.rs/tower) layer that rate limits HTTP requests with a
//! [`shardlimit::Limiter`]. A function of yours maps each request to what to check (a key
//! and a policy, several layers, or nothing); the layer asks the limiter, sets the
//! rate-limit headers of [`Decision::headers`] on every checked response, and answers
//! `429 Too Many Requests` with [`Decision::body`] as JSON when the check is denied.
//!
//! ```no_run
//! use shardlimit::{Limit, Limiter, Policy};
//! use shardlimit_tower::{IpKey, RateLimitLayer};
//! use std::time::Duration;
//!
//! let limiter = Limiter::from_env().unwrap();
//! let per_ip = Policy::new("per_ip", Limit::sliding_window(100, Duration::from_secs(60))).unwrap();
//! // the client address, trusting X-Forwarded-For only from our load balancers
//! let layer = RateLimitLayer::new(limiter, IpKey::new(per_ip, &["10.0.0.0/8"]).unwrap());
//! // axum: Router::new().route(...).layer(layer), served with
//! //       `into_make_service_with_connect_info::<SocketAddr>()`
//! # let _ = layer;
//! ```
//!
//! With a closure, name the request and result types so that Rust can infer the
//! closure's signature:
//!
//! ```
//! use http::Request;
//! use shardlimit::{Limit, Limiter, Policy};
//! use shardlimit_tower::{Check, Error, RateLimitLayer};
//! use std::time::Duration;
//!
//! let api = Policy::new("api", Limit::token_bucket(100, 10.0)).unwrap();
//! let layer = RateLimitLayer::new(Limiter::memory(), move |req: &Request<String>| -> Result<Check, Error> {
//!     Ok(match req.headers().get("x-api-key").and_then(|v| v.to_str().ok()) {
//!         Some(k) => Check::new(format!("key:{k}"), &api),
//!         None if req.uri().path() == "/health" => Check::Skip,
//!         None => Check::new("anonymous", &api),
//!     })
//! });
//! # let _ = layer;
//! ```
//!
//! The check is made before the request reaches your service. For a leaky-bucket policy
//! (a shaper) the request is held for the decision's `delay` before it is passed on; for a
//! concurrency policy the lease is released when your service has produced its response.
//!
//! ## Per route, headers and handlers
//!
//! In axum, put a layer on one route (`post(handler).layer(layer)`, or
//! `Router::route_layer` for the routes above it) for route-level limits; a router-wide
//! `.layer(...)` limits every request. The admitted request carries its [`Decision`] as a
//! request extension: `Extension(d): Extension<Decision>` in an axum handler, or
//! `req.extensions().get::<Decision>()`.
//!
//! ```
//! use http::{Request, Response, StatusCode};
//! use shardlimit::{Decision, Limit, Limiter, Policy};
//! use shardlimit_tower::{Check, Error, HeaderSet, RateLimitLayer, RetryAfter};
//! use std::time::Duration;
//!
//! let login = Policy::new("login", Limit::fixed_window(5, Duration::from_secs(60))).unwrap();
//! let layer = RateLimitLayer::new(Limiter::memory(), move |_req: &Request<String>| -> Result<Check, Error> {
//!     Ok(Check::new("user:42", &login))
//! })
//! .headers(HeaderSet::Standard)       // only the IETF RateLimit / RateLimit-Policy fields
//! .retry_after(RetryAfter::HttpDate)  // Retry-After: Wed, 01 Jan 2025 12:00:40 GMT
//! .on_limited(|d: &Decision| {
//!     let mut r = Response::new(format!(r#"{{"code":"slow_down","policy":"{}"}}"#, d.policy));
//!     *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
//!     r
//! });
//! # let _ = layer;
//! ```
//!
//! Every checked response carries one set of rate-limit headers: a response that already
//! has its own (`X-RateLimit-*`, `RateLimit`, `RateLimit-Policy` or `Retry-After`) gets none
//! added, and of two layers on one request the tighter decision's set is the one sent.

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use shardlimit::{client_ip_with, Algorithm, Decision, Layer, Limiter, Policy, TrustedProxies};
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

mod response;
pub use response::{HeaderSet, RetryAfter};

/// What the layer checks for one request.
#[derive(Debug, Clone)]
pub enum Check {
    /// Pass the request through unchecked and without rate-limit headers (health checks,
    /// internal callers).
    Skip,
    /// `cost` units of `policy` for `key`.
    One {
        key: String,
        policy: Policy,
        cost: u64,
    },
    /// A layered check (IP, API key, tenant...): allowed only when every layer allows,
    /// see [`Limiter::check_all`]. The headers describe the layer that decided.
    All(Vec<Layer>),
}

impl Check {
    /// One unit of `policy` for `key`.
    pub fn new(key: impl Into<String>, policy: &Policy) -> Check {
        Check::One {
            key: key.into(),
            policy: policy.clone(),
            cost: 1,
        }
    }

    /// The same check with a weight (Stripe-style weighted requests). On [`Check::All`]
    /// it sets the cost of every layer; on [`Check::Skip`] it does nothing.
    pub fn cost(mut self, units: u64) -> Check {
        match &mut self {
            Check::One { cost, .. } => *cost = units,
            Check::All(layers) => layers.iter_mut().for_each(|l| l.cost = units),
            Check::Skip => {}
        }
        self
    }

    /// The same check in shadow mode (the per-call option, [`shardlimit::Limiter::check_shadow`]): a
    /// request the limit would deny goes through with no 429 and no headers that say it is
    /// limited (`decision.shadow_denied`; counted for `shadow_report`). On [`Check::All`]
    /// every layer is in shadow. Concurrency policies stay enforcing (a lease in shadow
    /// would hold nothing).
    pub fn shadow(mut self) -> Check {
        let shadowed = |p: &mut Policy| {
            if let Ok(s) = p.with_shadow(true) {
                *p = s;
            }
        };
        match &mut self {
            Check::One { policy, .. } => shadowed(policy),
            Check::All(layers) => layers.iter_mut().for_each(|l| shadowed(&mut l.policy)),
            Check::Skip => {}
        }
        self
    }
}

/// Why a request could not be checked.
#[derive(Debug, Clone)]
pub enum Error {
    /// The request could not be mapped to a key (for [`IpKey`]: no peer address).
    Key(String),
    /// The limiter returned an error: an invalid key or cost, or a backend failure of a
    /// policy with `on_error: error`. (`open`, `closed` and `local` policies decide by
    /// themselves and never get here.)
    Limiter(shardlimit::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Key(m) => write!(f, "cannot derive a rate-limit key: {m}"),
            Error::Limiter(e) => write!(f, "rate limiter: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<shardlimit::Error> for Error {
    fn from(e: shardlimit::Error) -> Error {
        Error::Limiter(e)
    }
}

impl Error {
    /// The default response: `503` when the backend failed, `500` otherwise, with a JSON
    /// body `{"error":"rate_limiter_error","kind","message"}` (`kind` is the core's stable
    /// error kind name, or `"key"`).
    pub fn to_response(&self) -> Response<String> {
        let (status, kind) = match self {
            Error::Key(_) => (StatusCode::INTERNAL_SERVER_ERROR, "key"),
            Error::Limiter(e) if e.is_backend() => {
                (StatusCode::SERVICE_UNAVAILABLE, e.kind().name())
            }
            Error::Limiter(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.kind().name()),
        };
        let body = serde_json::json!({
            "error": "rate_limiter_error",
            "kind": kind,
            "message": self.to_string(),
        });
        json_response(status, body.to_string())
    }
}

fn json_response(status: StatusCode, body: String) -> Response<String> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Maps a request to what to check. Implemented by closures
/// `Fn(&Request<B>) -> Result<Check, Error>` and by [`IpKey`].
pub trait KeyFn<B>: Send + Sync + 'static {
    fn check_for(&self, req: &Request<B>) -> Result<Check, Error>;
}

impl<B, F> KeyFn<B> for F
where
    F: Fn(&Request<B>) -> Result<Check, Error> + Send + Sync + 'static,
{
    fn check_for(&self, req: &Request<B>) -> Result<Check, Error> {
        self(req)
    }
}

/// Keys requests by client IP (`ip:<address>`, IPv6 clients by their /64:
/// [`shardlimit::ip_key`]), found with the core's trusted-proxy walk
/// ([`shardlimit::client_ip_with`]): the peer address unless it is a trusted proxy, then
/// `X-Forwarded-For` from the right up to the first untrusted hop, so a client cannot
/// choose its own key by sending the header.
///
/// The peer address is read from the request extensions: axum's `ConnectInfo<SocketAddr>`
/// (serve with `into_make_service_with_connect_info::<SocketAddr>()`; read with the crate
/// feature `axum`, on by default), or a [`SocketAddr`] (insert it yourself when serving
/// with hyper). A request with neither is an [`Error::Key`] whose message names which of
/// the two this build reads.
#[derive(Debug, Clone)]
pub struct IpKey {
    policy: Policy,
    trusted: TrustedProxies,
    cost: u64,
}

impl IpKey {
    /// `trusted_proxies` are CIDRs (`10.0.0.0/8`, `2001:db8::/32`) or bare addresses; an
    /// empty list trusts no one and keys by the peer address.
    pub fn new<S: AsRef<str>>(policy: Policy, trusted_proxies: &[S]) -> shardlimit::Result<IpKey> {
        Ok(IpKey {
            policy,
            trusted: TrustedProxies::parse(trusted_proxies)?,
            cost: 1,
        })
    }

    /// Every request costs `units` instead of one.
    pub fn with_cost(mut self, units: u64) -> IpKey {
        self.cost = units;
        self
    }

    /// IPv6 clients share one key per network of `prefix` bits (default 64; 1 to 128), see
    /// [`shardlimit::ip_key`].
    pub fn with_ipv6_prefix(mut self, prefix: u8) -> shardlimit::Result<IpKey> {
        self.trusted = self.trusted.with_ipv6_prefix(prefix)?;
        Ok(self)
    }

    /// The client address of `req` (see the type's documentation).
    pub fn client_ip<B>(&self, req: &Request<B>) -> Result<IpAddr, Error> {
        let peer = peer_addr(req).ok_or_else(|| Error::Key(NO_PEER.into()))?;
        let xff: Vec<&str> = req
            .headers()
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let xff = (!xff.is_empty()).then(|| xff.join(","));
        Ok(client_ip_with(peer, xff.as_deref(), &self.trusted))
    }
}

/// Why [`IpKey`] found no peer address, naming what is missing in this build.
#[cfg(feature = "axum")]
const NO_PEER: &str = "no peer address in the request extensions: neither axum's \
     ConnectInfo<SocketAddr> (serve with into_make_service_with_connect_info::<SocketAddr>()) \
     nor a SocketAddr extension";
#[cfg(not(feature = "axum"))]
const NO_PEER: &str = "no peer address: shardlimit-tower was built without its \"axum\" \
     feature (default-features = false), so axum's ConnectInfo<SocketAddr> is not read; \
     enable the feature (shardlimit-tower = { features = [\"axum\"] }) or insert the peer's \
     SocketAddr as a request extension";

fn peer_addr<B>(req: &Request<B>) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(ci) = req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(ci.0.ip());
    }
    req.extensions().get::<SocketAddr>().map(|a| a.ip())
}

impl IpKey {
    /// The key this checks for `req`: `ip:<address>` (IPv6 clients by their network), for
    /// a layer of your own in a [`Check::All`] (per IP and per account).
    pub fn key<B>(&self, req: &Request<B>) -> Result<String, Error> {
        let ip = shardlimit::ip_key(self.client_ip(req)?, self.trusted.ipv6_prefix());
        Ok(format!("ip:{ip}"))
    }
}

impl<B> KeyFn<B> for IpKey {
    fn check_for(&self, req: &Request<B>) -> Result<Check, Error> {
        Ok(Check::new(self.key(req)?, &self.policy).cost(self.cost))
    }
}

type ErrorHandler = Arc<dyn Fn(&Error) -> Response<String> + Send + Sync>;

/// The layer: wraps a service in a [`RateLimit`].
pub struct RateLimitLayer<K> {
    limiter: Limiter,
    key: Arc<K>,
    on_error: ErrorHandler,
    options: Arc<response::Options>,
}

impl<K> Clone for RateLimitLayer<K> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            on_error: self.on_error.clone(),
            options: self.options.clone(),
        }
    }
}

impl<K> fmt::Debug for RateLimitLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .field("headers", &self.options.headers)
            .field("retry_after", &self.options.retry_after)
            .finish_non_exhaustive()
    }
}

impl<K> RateLimitLayer<K> {
    /// Checks every request with `limiter` as `key` says (a closure or [`IpKey`]).
    pub fn new(limiter: Limiter, key: K) -> Self {
        RateLimitLayer {
            limiter,
            key: Arc::new(key),
            on_error: Arc::new(Error::to_response),
            options: Arc::default(),
        }
    }

    /// Which rate-limit headers checked responses carry (default [`HeaderSet::Both`]).
    pub fn headers(mut self, set: HeaderSet) -> Self {
        Arc::make_mut(&mut self.options).headers = set;
        self
    }

    /// How `Retry-After` is written: delta seconds (the default) or an HTTP date.
    pub fn retry_after(mut self, format: RetryAfter) -> Self {
        Arc::make_mut(&mut self.options).retry_after = format;
        self
    }

    /// Replaces the `429` answered when the limit denies (default: [`too_many_requests`]'s
    /// status and JSON body), for a body of your own:
    ///
    /// ```
    /// # use shardlimit::Limiter;
    /// # use shardlimit_tower::{Check, RateLimitLayer};
    /// # let layer = RateLimitLayer::new(Limiter::memory(), |_: &http::Request<String>| -> Result<Check, shardlimit_tower::Error> { Ok(Check::Skip) });
    /// let layer = layer.on_limited(|d: &shardlimit::Decision| {
    ///     let body = serde_json::json!({ "code": "slow_down", "retry_in": d.retry_after.map(|r| r.as_secs()) });
    ///     let mut r = http::Response::new(body.to_string());
    ///     *r.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
    ///     r
    /// });
    /// ```
    ///
    /// The layer adds the rate-limit headers to the handler's response unless it has its
    /// own (any `X-RateLimit-*`, `RateLimit`, `RateLimit-Policy` or `Retry-After`): one set
    /// per response.
    pub fn on_limited(
        mut self,
        handler: impl Fn(&Decision) -> Response<String> + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.options).on_limited = Some(Arc::new(handler));
        self
    }

    /// Replaces the `503` answered when the `on_error` fallback denied because the limit
    /// could not be checked (`on_error: closed`; the decision's `source` is `Fallback`).
    /// An `on_error: local` denial is a real decision of this process's share
    /// (`Source::LocalFallback`): a 429 like any other, through
    /// [`RateLimitLayer::on_limited`]. Default: [`unavailable`]'s status and body. The
    /// headers are added as for [`RateLimitLayer::on_limited`]. (A check that failed with an
    /// error, `on_error: error`, goes to [`RateLimitLayer::on_error`] instead.)
    pub fn on_unavailable(
        mut self,
        handler: impl Fn(&Decision) -> Response<String> + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.options).on_unavailable = Some(Arc::new(handler));
        self
    }

    /// The `Retry-After` of a denial by the `on_error` fallback, rounded up to whole
    /// seconds (default: the decision's, one second for `closed`). The decision the 503
    /// handler and body see carries it as its `retry_after`.
    pub fn unavailable_retry_after(mut self, wait: Duration) -> Self {
        let secs = wait.as_micros().div_ceil(1_000_000) as u64;
        Arc::make_mut(&mut self.options).unavailable_retry_after = Some(secs);
        self
    }

    /// Replaces the response given when a request cannot be checked (default:
    /// [`Error::to_response`]). To fail open on such errors, prefer `on_error: open` in the
    /// policy: the core then decides and this handler is not called.
    pub fn on_error(
        mut self,
        handler: impl Fn(&Error) -> Response<String> + Send + Sync + 'static,
    ) -> Self {
        self.on_error = Arc::new(handler);
        self
    }
}

impl<S, K> tower_layer::Layer<S> for RateLimitLayer<K> {
    type Service = RateLimit<S, K>;
    fn layer(&self, inner: S) -> RateLimit<S, K> {
        RateLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service made by [`RateLimitLayer`].
pub struct RateLimit<S, K> {
    inner: S,
    layer: RateLimitLayer<K>,
}

impl<S: Clone, K> Clone for RateLimit<S, K> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for RateLimit<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

/// Sets the headers of `d` on `headers`, replacing any the service set itself.
/// The core's values ([`Decision::headers`]): `X-RateLimit-Reset` a Unix timestamp
/// (seconds, rounded up), as GitHub, express-rate-limit and every binding send it; the
/// IETF `RateLimit` field keeps delta seconds.
pub fn set_headers(headers: &mut http::HeaderMap, d: &Decision) {
    for (name, value) in d.headers() {
        // the core renders ASCII names, digits and quoted policy names; from_bytes
        // lowercases the name as HTTP/2 requires
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            headers.insert(n, v);
        }
    }
}

/// The `429 Too Many Requests` response for a denied decision: the headers and the
/// JSON body of [`Decision::body`].
pub fn too_many_requests(d: &Decision) -> Response<String> {
    let mut r = json_response(StatusCode::TOO_MANY_REQUESTS, d.body().to_string());
    set_headers(r.headers_mut(), d);
    r
}

/// The response to a denial by the `on_error: closed` fallback: `503` with the decision's headers and a JSON body whose `error` is
/// `rate_limit_unavailable`. The limit could not be checked, so the client is not told it
/// was rate limited (a 429 would blame it).
pub fn unavailable(d: &Decision) -> Response<String> {
    let mut r = unavailable_body(d);
    set_headers(r.headers_mut(), d);
    r
}

/// [`unavailable`] without its headers.
fn unavailable_body(d: &Decision) -> Response<String> {
    let mut body = d.body();
    body["error"] = "rate_limit_unavailable".into();
    json_response(StatusCode::SERVICE_UNAVAILABLE, body.to_string())
}

impl<S, K, B, ResBody> tower_service::Service<Request<B>> for RateLimit<S, K>
where
    S: tower_service::Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    K: KeyFn<B>,
    B: Send + 'static,
    S::Error: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // the clone that was driven to readiness serves this request
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let check = self.layer.key.check_for(&req);
        let limiter = self.layer.limiter.clone();
        let on_error = self.layer.on_error.clone();
        let options = self.layer.options.clone();
        Box::pin(async move {
            let check = match check {
                Ok(Check::Skip) => return inner.call(req).await,
                Ok(c) => c,
                Err(e) => return Ok(on_error(&e).map(ResBody::from)),
            };
            let mut lease = None;
            let decided = match &check {
                Check::One { key, policy, cost }
                    if policy.algorithm() == Algorithm::Concurrency =>
                {
                    limiter.acquire(key, policy, *cost).await.map(|(d, l)| {
                        lease = l.map(|l| (l, policy.clone()));
                        d
                    })
                }
                Check::One { key, policy, cost } => limiter.check(key, policy, *cost).await,
                Check::All(layers) => limiter.check_all(layers).await,
                Check::Skip => unreachable!("handled above"),
            };
            let d = match decided {
                Ok(d) => d,
                Err(e) => return Ok(on_error(&Error::Limiter(e)).map(ResBody::from)),
            };
            if !d.allowed {
                let d = if response::is_outage(&d) {
                    options.outage(d)
                } else {
                    d
                };
                let mut res = options.denial(&d);
                response::apply(&mut res, options.render(&d, std::time::SystemTime::now()));
                return Ok(res.map(ResBody::from));
            }
            // rendered at the decision (X-RateLimit-Reset counts from it); the decision
            // itself goes to the service, for its handler
            let rendered = options.render(&d, std::time::SystemTime::now());
            let delay = d.delay;
            let mut req = req;
            response::hand_over(&mut req, d);
            if !delay.is_zero() {
                // a shaper (leaky bucket) admitted the request for later: hold it until then
                tokio::time::sleep(delay).await;
            }
            let res = inner.call(req).await;
            if let Some((lease, policy)) = lease {
                // the lease frees itself after its TTL if this fails; nothing else to do
                let _ = limiter.release_with(&policy, &lease).await;
            }
            let mut res = res?;
            response::apply(&mut res, rendered);
            Ok(res)
        })
    }
}
