//! What the layer answers and which headers it sets: the header options, the 429 and 503
//! handlers, and the rule that a response carries one set of rate-limit headers.

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Response, StatusCode};
use shardlimit::{Decision, Source};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Which rate-limit headers a checked response carries (the names of the Go middleware's
/// `HeaderSet`; Python's `headers="both" | "x-ratelimit" | "ietf" | "none"`, Node's
/// `legacyHeaders` / `standardHeaders`). `Retry-After` goes with every denial whatever
/// the set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderSet {
    /// `X-RateLimit-*` and the IETF `RateLimit` / `RateLimit-Policy` fields (the default).
    #[default]
    Both,
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (a Unix timestamp), as GitHub and
    /// express-rate-limit send them.
    Legacy,
    /// The IETF draft's `RateLimit` and `RateLimit-Policy` fields (delta seconds).
    Standard,
    /// No rate-limit header (`Retry-After` still goes with a denial).
    None,
}

impl HeaderSet {
    fn legacy(self) -> bool {
        matches!(self, HeaderSet::Both | HeaderSet::Legacy)
    }
    fn standard(self) -> bool {
        matches!(self, HeaderSet::Both | HeaderSet::Standard)
    }
}

/// How `Retry-After` is written (RFC 9110 allows both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RetryAfter {
    /// Delta seconds, rounded up: `Retry-After: 40` (the default).
    #[default]
    Seconds,
    /// An HTTP date (IMF-fixdate) that many seconds from now:
    /// `Retry-After: Wed, 01 Jan 2025 12:00:40 GMT`.
    HttpDate,
}

pub(crate) type DecisionHandler = Arc<dyn Fn(&Decision) -> Response<String> + Send + Sync>;

/// The layer's answer options, shared by its clones.
#[derive(Clone, Default)]
pub(crate) struct Options {
    pub(crate) headers: HeaderSet,
    pub(crate) retry_after: RetryAfter,
    /// `Retry-After` (whole seconds) of a denial by the `on_error` fallback; `None`: the
    /// decision's.
    pub(crate) unavailable_retry_after: Option<u64>,
    pub(crate) on_limited: Option<DecisionHandler>,
    pub(crate) on_unavailable: Option<DecisionHandler>,
}

/// The headers of one decision, rendered once, and what the one-set rule compares.
pub(crate) struct Rendered {
    headers: Vec<(HeaderName, HeaderValue)>,
    shown: Shown,
}

/// Put in a response's extensions by the layer that set its rate-limit headers, so that an
/// outer layer on the same request (a router-wide layer around a per-route one) replaces
/// them only with a tighter decision's, and leaves alone headers the service set itself.
#[derive(Debug, Clone, Copy)]
struct Shown {
    allowed: bool,
    remaining: u64,
}

impl Shown {
    /// Whether `self` describes the request better than `shown`: a denial beats an
    /// admission, then the smaller remaining budget wins.
    fn tighter_than(self, shown: Shown) -> bool {
        if self.allowed != shown.allowed {
            return !self.allowed;
        }
        self.remaining < shown.remaining
    }
}

/// A denial by the `on_error` fallback: the limit could not be checked.
pub(crate) fn is_outage(d: &Decision) -> bool {
    !d.allowed && d.source == Source::Fallback
}

/// The lower-case name (as HTTP/2 requires) of a header the core renders: the known ones
/// without an allocation.
fn header_name(name: &str) -> Option<HeaderName> {
    Some(match name {
        "X-RateLimit-Limit" => HeaderName::from_static("x-ratelimit-limit"),
        "X-RateLimit-Remaining" => HeaderName::from_static("x-ratelimit-remaining"),
        "X-RateLimit-Reset" => HeaderName::from_static("x-ratelimit-reset"),
        "RateLimit" => HeaderName::from_static("ratelimit"),
        "RateLimit-Policy" => HeaderName::from_static("ratelimit-policy"),
        "Retry-After" => http::header::RETRY_AFTER,
        other => return HeaderName::from_bytes(other.as_bytes()).ok(),
    })
}

fn is_rate_header(name: &HeaderName) -> bool {
    let n = name.as_str(); // lower case
    n.starts_with("x-ratelimit-")
        || n == "ratelimit"
        || n == "ratelimit-policy"
        || n == "retry-after"
}

impl Options {
    /// The decision a denial is answered with: a fallback's `Retry-After` replaced by
    /// [`Options::unavailable_retry_after`] when set, so that the headers, the body and a
    /// custom handler all see the same wait.
    pub(crate) fn outage(&self, mut d: Decision) -> Decision {
        if let Some(secs) = self.unavailable_retry_after {
            d.retry_after = Some(Duration::from_secs(secs));
        }
        d
    }

    /// The response to a denied decision (its headers not set yet): the custom handler's,
    /// or 429 with [`Decision::body`], or for a fallback's denial 503 (see
    /// [`crate::unavailable`]).
    pub(crate) fn denial(&self, d: &Decision) -> Response<String> {
        if is_outage(d) {
            match &self.on_unavailable {
                Some(h) => h(d),
                None => crate::unavailable_body(d),
            }
        } else {
            match &self.on_limited {
                Some(h) => h(d),
                None => crate::json_response(StatusCode::TOO_MANY_REQUESTS, d.body().to_string()),
            }
        }
    }

    /// The headers of `d` as the options ask, the core's values rendered at `now`
    /// (`X-RateLimit-Reset` a Unix timestamp, the IETF `RateLimit` field delta seconds, as
    /// in every binding), `Retry-After` in seconds or as an HTTP date.
    pub(crate) fn render(&self, d: &Decision, now: SystemTime) -> Rendered {
        let mut headers = Vec::with_capacity(6);
        for (name, value) in d.headers_at(now) {
            let value = match name {
                "Retry-After" => match self.retry_after {
                    RetryAfter::Seconds => value,
                    RetryAfter::HttpDate => {
                        // the core renders whole seconds
                        let secs = value.parse::<u64>().unwrap_or(0);
                        httpdate::fmt_http_date(now + Duration::from_secs(secs))
                    }
                },
                "RateLimit" | "RateLimit-Policy" if !self.headers.standard() => continue,
                n if n.starts_with("X-RateLimit-") && !self.headers.legacy() => continue,
                _ => value,
            };
            // the core renders ASCII names, digits and quoted policy names; the value's
            // String becomes the header's bytes without a copy
            if let (Some(n), Ok(v)) = (header_name(name), HeaderValue::try_from(value)) {
                headers.push((n, v));
            }
        }
        Rendered {
            headers,
            shown: Shown {
                allowed: d.allowed,
                remaining: d.remaining,
            },
        }
    }
}

/// Hands `d` to the service as a request extension, unless an outer layer on the same
/// request put a tighter decision there: the handler sees the decision whose headers the
/// response carries.
pub(crate) fn hand_over<B>(req: &mut http::Request<B>, d: Decision) {
    let shown = |d: &Decision| Shown {
        allowed: d.allowed,
        remaining: d.remaining,
    };
    if let Some(prev) = req.extensions().get::<Decision>() {
        if !shown(&d).tighter_than(shown(prev)) {
            return;
        }
    }
    req.extensions_mut().insert(d);
}

/// Sets `r`'s headers on `res` unless it already carries a set: its own (a handler that
/// answered its own 429, with its own `Retry-After`), or an inner layer's for a decision at
/// least as tight. One set of rate-limit headers per response.
pub(crate) fn apply<B>(res: &mut Response<B>, r: Rendered) {
    match res.extensions().get::<Shown>() {
        Some(prev) if !r.shown.tighter_than(*prev) => return,
        Some(_) => remove_rate_headers(res.headers_mut()),
        None if res.headers().keys().any(is_rate_header) => return,
        None => {}
    }
    let h = res.headers_mut();
    for (n, v) in r.headers {
        h.insert(n, v);
    }
    res.extensions_mut().insert(r.shown);
}

fn remove_rate_headers(h: &mut HeaderMap) {
    let names: Vec<HeaderName> = h.keys().filter(|n| is_rate_header(n)).cloned().collect();
    for n in names {
        h.remove(&n);
    }
}
