//! The HTTP API: JSON decisions for sidecar callers, `/auth` for proxies, health, metrics.
//!
//! Every answer to bad input is a 4xx with `{"error": kind, "message": ...}` naming what is
//! wrong; a body larger than `--max-body` is a 413 before it is read whole.

use crate::State;
use axum::body::{to_bytes, Body};
use axum::extract::{Query, Request, State as St};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use serde_json::{json, Map, Value};
use shardlimit::{Decision, Error, ErrorKind, Layer, Lease, Reservation, Source};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

type S = Arc<State>;

/// An answer that is not a decision: a status and `{"error", "message"}`.
pub struct ApiError(pub StatusCode, pub &'static str, pub String);

impl ApiError {
    fn bad(msg: impl Into<String>) -> ApiError {
        ApiError(StatusCode::BAD_REQUEST, "invalid_argument", msg.into())
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let status = match e.kind() {
            ErrorKind::InvalidArgument | ErrorKind::UnknownPolicy | ErrorKind::Config => {
                StatusCode::BAD_REQUEST
            }
            ErrorKind::Connection
            | ErrorKind::Timeout
            | ErrorKind::Script
            | ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, e.kind().name(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.0, &json!({"error": self.1, "message": self.2}), &[])
    }
}

fn json_response(status: StatusCode, body: &Value, headers: &[(&'static str, String)]) -> Response {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert("content-type", HeaderValue::from_static("application/json"));
    for (k, v) in headers {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(*k, v);
        }
    }
    r
}

/// 200 allowed, 429 denied, 503 denied by a policy's `on_error` mode (the limit could not
/// be measured), with the decision's headers.
pub fn decision_status(d: &Decision) -> StatusCode {
    if d.allowed {
        StatusCode::OK
    } else if d.source == Source::Fallback {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::TOO_MANY_REQUESTS
    }
}

fn decision_response(d: &Decision, extra: Option<(&str, Value)>) -> Response {
    let mut body = d.to_json();
    if let (Some((k, v)), Some(o)) = (extra, body.as_object_mut()) {
        o.insert(k.to_string(), v);
    }
    json_response(decision_status(d), &body, &d.headers())
}

/// Reads the body as a JSON object, within the size limit.
async fn json_body(state: &State, req: Request) -> Result<Map<String, Value>, ApiError> {
    let too_large = || {
        ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "the body is larger than {} bytes (--max-body)",
                state.max_body
            ),
        )
    };
    if let Some(n) = req
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if n > state.max_body as u64 {
            return Err(too_large());
        }
    }
    let bytes = to_bytes(req.into_body(), state.max_body)
        .await
        .map_err(|_| too_large())?;
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))?;
    match v {
        Value::Object(o) => Ok(o),
        other => Err(ApiError::bad(format!(
            "the body must be a JSON object, got {}",
            kind_of(&other)
        ))),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn only(o: &Map<String, Value>, allowed: &[&str]) -> Result<(), ApiError> {
    for k in o.keys() {
        if !allowed.contains(&k.as_str()) {
            return Err(ApiError::bad(format!(
                "unknown field \"{k}\" (expected: {})",
                allowed.join(", ")
            )));
        }
    }
    Ok(())
}

fn string<'a>(o: &'a Map<String, Value>, f: &str) -> Result<&'a str, ApiError> {
    match o.get(f) {
        Some(Value::String(s)) => Ok(s),
        None => Err(ApiError::bad(format!("\"{f}\" is required"))),
        Some(v) => Err(ApiError::bad(format!(
            "\"{f}\" must be a string, got {}",
            kind_of(v)
        ))),
    }
}

fn uint(o: &Map<String, Value>, f: &str, default: Option<u64>) -> Result<u64, ApiError> {
    match o.get(f) {
        None => default.ok_or_else(|| ApiError::bad(format!("\"{f}\" is required"))),
        Some(v) => v.as_u64().ok_or_else(|| {
            ApiError::bad(format!("\"{f}\" must be a non-negative integer, got {v}"))
        }),
    }
}

fn policy(state: &State, o: &Map<String, Value>) -> Result<shardlimit::Policy, ApiError> {
    Ok(state.limiter.policy(string(o, "policy")?)?)
}

/// Holds one of the `--max-concurrency` permits for the request.
fn permit(state: &State) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    state.permits.clone().try_acquire_owned().map_err(|_| {
        state.metrics.overloaded.fetch_add(1, Ordering::Relaxed);
        ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "--max-concurrency requests in flight; retry".into(),
        )
    })
}

macro_rules! endpoint {
    ($name:ident, $path:literal, |$state:ident, $o:ident| $body:block) => {
        async fn $name(St($state): St<S>, req: Request) -> Response {
            let r: Result<Response, ApiError> = async {
                let _p = permit(&$state)?;
                let $o = json_body(&$state, req).await?;
                $body
            }
            .await;
            let resp = r.unwrap_or_else(IntoResponse::into_response);
            $state.metrics.http($path, resp.status().as_u16());
            resp
        }
    };
}

endpoint!(check, "/check", |state, o| {
    only(&o, &["policy", "key", "cost", "shadow"])?;
    let p = policy(&state, &o)?;
    let key = string(&o, "key")?;
    let cost = uint(&o, "cost", Some(1))?;
    let d = match o.get("shadow") {
        Some(Value::Bool(true)) => state.limiter.check_shadow(key, &p, cost).await?,
        None | Some(Value::Bool(false)) => state.limiter.check(key, &p, cost).await?,
        Some(v) => {
            return Err(ApiError::bad(format!(
                "\"shadow\" must be true or false, got {v}"
            )))
        }
    };
    Ok(decision_response(&d, None))
});

endpoint!(peek, "/peek", |state, o| {
    only(&o, &["policy", "key"])?;
    let p = policy(&state, &o)?;
    let d = state.limiter.peek(string(&o, "key")?, &p).await?;
    Ok(decision_response(&d, None))
});

endpoint!(check_all, "/check_all", |state, o| {
    only(&o, &["layers"])?;
    let arr = o
        .get("layers")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad("\"layers\" must be an array of {policy, key, cost}"))?;
    if arr.is_empty() || arr.len() > 64 {
        return Err(ApiError::bad("\"layers\" must hold 1 to 64 layers"));
    }
    let mut layers = Vec::with_capacity(arr.len());
    for (i, l) in arr.iter().enumerate() {
        let l = l
            .as_object()
            .ok_or_else(|| ApiError::bad(format!("layers[{i}] must be an object")))?;
        only(l, &["policy", "key", "cost"])
            .map_err(|e| ApiError::bad(format!("layers[{i}]: {}", e.2)))?;
        let p = policy(&state, l)?;
        layers.push(Layer::new(string(l, "key")?, &p, uint(l, "cost", Some(1))?));
    }
    let d = state.limiter.check_all(&layers).await?;
    Ok(decision_response(&d, None))
});

endpoint!(charge, "/charge", |state, o| {
    only(&o, &["policy", "key", "cost"])?;
    let p = policy(&state, &o)?;
    let d = state
        .limiter
        .charge(string(&o, "key")?, &p, uint(&o, "cost", Some(1))?)
        .await?;
    Ok(decision_response(&d, None))
});

endpoint!(refund, "/refund", |state, o| {
    only(&o, &["policy", "key", "cost"])?;
    let p = policy(&state, &o)?;
    let d = state
        .limiter
        .refund(string(&o, "key")?, &p, uint(&o, "cost", Some(1))?)
        .await?;
    Ok(decision_response(&d, None))
});

endpoint!(acquire, "/acquire", |state, o| {
    only(&o, &["policy", "key", "units"])?;
    let p = policy(&state, &o)?;
    let (d, lease) = state
        .limiter
        .acquire(string(&o, "key")?, &p, uint(&o, "units", Some(1))?)
        .await?;
    let lease = lease.map_or(
        Value::Null,
        |l| json!({"key": l.key, "policy": l.policy, "id": l.id, "units": l.units}),
    );
    Ok(decision_response(&d, Some(("lease", lease))))
});

endpoint!(release, "/release", |state, o| {
    only(&o, &["lease"])?;
    let l = o
        .get("lease")
        .and_then(Value::as_object)
        .ok_or_else(|| ApiError::bad("\"lease\" must be the lease object /acquire returned"))?;
    let lease = Lease {
        key: string(l, "key")?.to_string(),
        policy: string(l, "policy")?.to_string(),
        id: string(l, "id")?.to_string(),
        units: uint(l, "units", None)?,
    };
    let released = state.limiter.release(&lease).await?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"released": released}),
        &[],
    ))
});

endpoint!(reserve, "/reserve", |state, o| {
    only(&o, &["policy", "key", "units"])?;
    let p = policy(&state, &o)?;
    let (d, r) = state
        .limiter
        .reserve(string(&o, "key")?, &p, uint(&o, "units", Some(1))?)
        .await?;
    let r = r.map_or(
        Value::Null,
        |r| json!({"key": r.key, "policy": r.policy, "units": r.units, "at_us": r.at_us}),
    );
    Ok(decision_response(&d, Some(("reservation", r))))
});

endpoint!(settle, "/settle", |state, o| {
    only(&o, &["reservation", "actual"])?;
    let r = o
        .get("reservation")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            ApiError::bad("\"reservation\" must be the reservation object /reserve returned")
        })?;
    let res = Reservation {
        key: string(r, "key")?.to_string(),
        policy: string(r, "policy")?.to_string(),
        units: uint(r, "units", None)?,
        at_us: uint(r, "at_us", None)?,
    };
    let d = state
        .limiter
        .settle(&res, uint(&o, "actual", None)?)
        .await?;
    Ok(decision_response(&d, None))
});

fn ttl(o: &Map<String, Value>) -> Result<Option<Duration>, ApiError> {
    match o.get("ttl") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => shardlimit::parse_duration_us("ttl", s)
            .map(|us| Some(Duration::from_micros(us)))
            .map_err(|e| ApiError::bad(e.to_string())),
        Some(v) => Err(ApiError::bad(format!(
            "\"ttl\" must be a duration string such as \"30d\", got {v}"
        ))),
    }
}

endpoint!(override_set, "/overrides/set", |state, o| {
    only(&o, &["policy", "key", "limit", "ttl"])?;
    let limit = match o.get("limit") {
        Some(Value::String(s)) => s.clone(),
        Some(v @ (Value::Object(_) | Value::Array(_))) => v.to_string(),
        _ => return Err(ApiError::bad("\"limit\" is required: a rate string, a plan name, or a limit object/array as in a config policy")),
    };
    let info = state
        .limiter
        .set_override(string(&o, "key")?, string(&o, "policy")?, &limit, ttl(&o)?)
        .await?;
    Ok(json_response(StatusCode::OK, &info.to_json(), &[]))
});

endpoint!(override_get, "/overrides/get", |state, o| {
    only(&o, &["policy", "key"])?;
    match state
        .limiter
        .get_override(string(&o, "key")?, string(&o, "policy")?)
        .await?
    {
        Some(info) => Ok(json_response(StatusCode::OK, &info.to_json(), &[])),
        None => Err(ApiError(
            StatusCode::NOT_FOUND,
            "not_found",
            "the key has no override".into(),
        )),
    }
});

endpoint!(override_delete, "/overrides/delete", |state, o| {
    only(&o, &["policy", "key"])?;
    let deleted = state
        .limiter
        .delete_override(string(&o, "key")?, string(&o, "policy")?)
        .await?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"deleted": deleted}),
        &[],
    ))
});

/// For proxies: `policy`, `key`, `cost` from the query string, else from the
/// `X-Shardlimit-Policy`, `X-Shardlimit-Key`, `X-Shardlimit-Cost` headers. 200 with the
/// headers when allowed; when denied, `deny_status` (query) or `--auth-deny-status`, with
/// the headers and the JSON body of a 429.
async fn auth(
    St(state): St<S>,
    Query(pairs): Query<Vec<(String, String)>>,
    headers: HeaderMap,
) -> Response {
    let r: Result<Response, ApiError> = async {
        let _p = permit(&state)?;
        // a parameter given twice is refused: a key spliced unescaped into the URL (say
        // "a&policy=free") must not choose another policy
        let mut q: HashMap<String, String> = HashMap::new();
        for (k, v) in pairs {
            if q.insert(k.clone(), v).is_some() {
                return Err(ApiError::bad(format!(
                    "\"{k}\" is given twice in the query (pass the key in X-Shardlimit-Key, or escape it)"
                )));
            }
        }
        let get = |name: &str| -> Option<String> {
            q.get(name).cloned().or_else(|| {
                headers
                    .get(format!("x-shardlimit-{name}"))
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            })
        };
        let pname = get("policy").ok_or_else(|| {
            ApiError::bad("\"policy\" is required (query or X-Shardlimit-Policy)")
        })?;
        let key = get("key")
            .ok_or_else(|| ApiError::bad("\"key\" is required (query or X-Shardlimit-Key)"))?;
        let cost = match get("cost") {
            None => 1,
            Some(c) => c.parse::<u64>().map_err(|_| {
                ApiError::bad(format!(
                    "\"cost\" must be a non-negative integer, got \"{c}\""
                ))
            })?,
        };
        let deny = match q.get("deny_status") {
            None => state.auth_deny_status,
            Some(s) => s
                .parse::<u16>()
                .ok()
                .filter(|s| (400..=599).contains(s))
                .ok_or_else(|| {
                    ApiError::bad(format!(
                        "\"deny_status\" must be a 4xx or 5xx status, got \"{s}\""
                    ))
                })?,
        };
        let p = state.limiter.policy(&pname)?;
        let d = state.limiter.check(&key, &p, cost).await?;
        if d.allowed {
            let mut r = json_response(StatusCode::OK, &Value::Null, &d.headers());
            *r.body_mut() = Body::empty();
            r.headers_mut().remove("content-type");
            Ok(r)
        } else {
            Ok(json_response(
                StatusCode::from_u16(deny).unwrap_or(StatusCode::FORBIDDEN),
                &d.body(),
                &d.headers(),
            ))
        }
    }
    .await;
    let resp = r.unwrap_or_else(IntoResponse::into_response);
    state.metrics.http("/auth", resp.status().as_u16());
    resp
}

async fn healthz(St(state): St<S>) -> Response {
    state.metrics.http("/healthz", 200);
    json_response(
        StatusCode::OK,
        &json!({"status": "ok", "config_generation": state.limiter.config_generation()}),
        &[],
    )
}

/// Ready when every shard answers (connects and has the scripts) within one second.
async fn readyz(St(state): St<S>) -> Response {
    let r = match state.limiter.connect(Duration::from_secs(1)).await {
        Ok(()) => json_response(StatusCode::OK, &json!({"status": "ready"}), &[]),
        Err(e) => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "unavailable", "error": e.kind().name(), "message": e.to_string()}),
            &[],
        ),
    };
    state.metrics.http("/readyz", r.status().as_u16());
    r
}

async fn metrics(St(state): St<S>) -> Response {
    state.metrics.http("/metrics", 200);
    let mut text = state.limiter.metrics().to_prometheus();
    text.push_str(&state.metrics.to_prometheus());
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

async fn not_found() -> Response {
    ApiError(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint; see docs/serve.md".into(),
    )
    .into_response()
}

pub fn router(state: S) -> Router {
    Router::new()
        .route("/check", post(check))
        .route("/peek", post(peek))
        .route("/check_all", post(check_all))
        .route("/charge", post(charge))
        .route("/refund", post(refund))
        .route("/acquire", post(acquire))
        .route("/release", post(release))
        .route("/reserve", post(reserve))
        .route("/settle", post(settle))
        .route("/overrides/set", post(override_set))
        .route("/overrides/get", post(override_get))
        .route("/overrides/delete", post(override_delete))
        .route("/auth", any(auth))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

/// Serves until `stop` turns true, then finishes the requests in flight.
pub async fn serve<L>(state: S, listener: L, mut stop: watch::Receiver<bool>)
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let app = router(state);
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!(error = %e, "HTTP server failed");
    }
}
