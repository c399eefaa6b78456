//! Runnable Rust examples for shardlimit: the axum service (`shardlimit-example-axum`) and
//! the algorithm chart (`shardlimit-plot`, see [`chart`]).

pub mod chart;

use axum::routing::get;
use axum::{Json, Router};
use shardlimit::{Limiter, Policy};
use shardlimit_tower::{Check, IpKey, KeyFn, RateLimitLayer};

/// Every route limited per client IP by `policy`, except `/health`.
struct Keys(IpKey);

impl<B> KeyFn<B> for Keys {
    fn check_for(&self, req: &http::Request<B>) -> Result<Check, shardlimit_tower::Error> {
        if req.uri().path() == "/health" {
            return Ok(Check::Skip);
        }
        self.0.check_for(req)
    }
}

/// The example service: `GET /` and `GET /hello/{name}` limited per client IP, `GET
/// /health` unlimited. Serve it with `into_make_service_with_connect_info::<SocketAddr>()`
/// so the layer sees the peer address.
pub fn app<S: AsRef<str>>(
    limiter: Limiter,
    policy: Policy,
    trusted_proxies: &[S],
) -> shardlimit::Result<Router> {
    let key = Keys(IpKey::new(policy, trusted_proxies)?);
    Ok(Router::new()
        .route(
            "/",
            get(|| async { Json(serde_json::json!({ "ok": true })) }),
        )
        .route(
            "/hello/{name}",
            get(
                |axum::extract::Path(name): axum::extract::Path<String>| async move {
                    Json(serde_json::json!({ "hello": name }))
                },
            ),
        )
        .route("/health", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter, key)))
}
