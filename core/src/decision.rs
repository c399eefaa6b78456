//! The answer to a check, and how it renders as HTTP headers and a 429 body.

use std::fmt;

mod name;
pub use name::PolicyName;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Who made a decision. Deliberately not `#[non_exhaustive]`: every binding maps each
/// source to its own enum, and a new one must fail their build until they do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A Redis shard ran the algorithm.
    Redis,
    /// The in-memory engine (no shards configured).
    Memory,
    /// Admitted locally from units leased in advance from Redis.
    Local,
    /// The shard failed and the policy's `on_error` mode (`open`, `closed`) decided: the
    /// limit was not measured (see [`Decision::measured`]).
    Fallback,
    /// The key is on the block list.
    Block,
    /// The shard failed and the policy's `on_error: local` decided with this process's
    /// share of the limit: a real (local) decision, with its own remaining budget and
    /// `Retry-After`. A denial is a rate limit (429), not an outage.
    LocalFallback,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Redis => "redis",
            Source::Memory => "memory",
            Source::Local => "local",
            Source::Fallback => "fallback",
            Source::Block => "block",
            Source::LocalFallback => "local_fallback",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Whether the request may proceed. A denied check consumed nothing.
    pub allowed: bool,
    /// The effective limit (units per window, bucket capacity, or max concurrent).
    pub limit: u64,
    /// Units still available after this check.
    pub remaining: u64,
    /// Time until the limit is back to its full budget with no further traffic.
    pub reset_after: Duration,
    /// When denied: the earliest time the same check would pass with no other traffic.
    /// `None` when allowed, and when the cost can never fit (cost > limit).
    pub retry_after: Option<Duration>,
    /// Leaky bucket: how long the caller must wait before sending. Zero otherwise.
    pub delay: Duration,
    /// The policy that decided (for an ad-hoc limit, its [`crate::Limit::id`]).
    pub policy: PolicyName,
    /// Who decided.
    pub source: Source,
    /// The shard index that decided, when a Redis shard did.
    pub shard: Option<u32>,
    /// The window the limit is measured over (for `RateLimit-Policy`'s `w`).
    pub window: Duration,
    /// Layered checks: the index of the layer this decision describes (the one that denied,
    /// or the tightest when all allowed). `None` for single checks.
    pub layer: Option<usize>,
    /// Shadow mode: the limit would have denied this check, but the policy (or the call)
    /// is in shadow, so it was allowed and consumed nothing. `allowed` is true and
    /// `retry_after` is `None`; `remaining` is what the limit really has left (less than
    /// the cost). Its headers do not say the client is limited (see [`Decision::headers`]).
    pub shadow_denied: bool,
    /// A multi-limit policy: the index of the limit this decision describes (the one that
    /// denied, or the tightest when all allowed). `None` for a policy of one limit.
    pub limit_index: Option<usize>,
    /// A multi-limit policy: every limit in force (effective limit and window), in the
    /// policy's order, for `RateLimit-Policy`. Empty for a policy of one limit.
    pub quotas: Vec<Quota>,
    /// A layered check ([`crate::Limiter::check_all`]): each layer's own decision, in the
    /// caller's order (`allowed` is that layer's own verdict; when the check was denied,
    /// nothing was consumed and an admitting layer's `remaining` is what it still has).
    /// Empty for single checks, and when the layers were not decided one by one (a block,
    /// a fallback of `on_error`).
    pub layers: Vec<Decision>,
}

/// One limit of a multi-limit policy as the headers describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// The effective limit (units per window, or bucket capacity).
    pub limit: u64,
    /// The window it is measured over.
    pub window: Duration,
}

fn ceil_secs(d: Duration) -> u64 {
    let us = d.as_micros();
    us.div_ceil(1_000_000) as u64
}

impl Decision {
    /// False for a fallback decision of `on_error: open` or `closed`: the shard could not be
    /// asked, so `remaining` and `reset_after` are not the limit's state (an `open`
    /// fallback reports 0 remaining). An `on_error: local` decision
    /// ([`Source::LocalFallback`]) measured this process's share of the limit: true.
    pub fn measured(&self) -> bool {
        self.source != Source::Fallback
    }

    /// The standard rate-limit response headers, in a stable order:
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (the Unix time,
    /// in whole seconds rounded up, at which the budget is full again: what GitHub and
    /// express-rate-limit send; the IETF `RateLimit` field's `t` keeps delta seconds),
    /// `RateLimit-Policy` and `RateLimit` (IETF
    /// draft-ietf-httpapi-ratelimit-headers structured fields), and `Retry-After` (seconds)
    /// when denied and a retry can succeed. A decision that did not measure the limit
    /// ([`Decision::measured`]) renders no remaining budget or reset time, only the
    /// limit, `RateLimit-Policy`, `X-RateLimit-Status: unmeasured` and `Retry-After` when
    /// denied.
    ///
    /// A multi-limit policy's `RateLimit-Policy` lists every limit (the draft's list of
    /// quota policies): the first named after the policy, limit `i > 0` `"policy#i"`;
    /// `RateLimit` and the `X-RateLimit-*` fields describe the deciding limit
    /// ([`Decision::limit_index`]).
    ///
    /// A shadow-denied decision ([`Decision::shadow_denied`]) renders only
    /// `X-RateLimit-Limit` and `RateLimit-Policy`: no remaining budget, no reset time and no
    /// `Retry-After`, so a client is never told it is limited by a limit in shadow.
    ///
    /// Every binding and middleware sends these values (`X-RateLimit-Reset` computed here,
    /// from the wall clock at the call): one meaning for each header in every language.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        self.headers_at(SystemTime::now())
    }

    /// [`Decision::headers`] rendered at `now` (the wall-clock time `X-RateLimit-Reset`
    /// counts from).
    pub fn headers_at(&self, now: SystemTime) -> Vec<(&'static str, String)> {
        let reset = ceil_secs(self.reset_after);
        let now_us = now
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros() as u64;
        let reset_at = now_us
            .saturating_add(self.reset_after.as_micros() as u64)
            .div_ceil(1_000_000);
        let (policy_field, item) = self.policy_field();
        if self.shadow_denied {
            return vec![
                ("X-RateLimit-Limit", self.limit.to_string()),
                ("RateLimit-Policy", policy_field),
            ];
        }
        if !self.measured() {
            let mut h = vec![
                ("X-RateLimit-Limit", self.limit.to_string()),
                ("RateLimit-Policy", policy_field),
                ("X-RateLimit-Status", "unmeasured".to_string()),
            ];
            if let Some(retry) = self.retry_after.filter(|_| !self.allowed) {
                h.push(("Retry-After", ceil_secs(retry).to_string()));
            }
            return h;
        }
        let mut h = vec![
            ("X-RateLimit-Limit", self.limit.to_string()),
            ("X-RateLimit-Remaining", self.remaining.to_string()),
            ("X-RateLimit-Reset", reset_at.to_string()),
            ("RateLimit-Policy", policy_field),
            (
                "RateLimit",
                format!("\"{item}\";r={};t={}", self.remaining, reset),
            ),
        ];
        if let Some(retry) = self.retry_after.filter(|_| !self.allowed) {
            h.push(("Retry-After", ceil_secs(retry).to_string()));
        }
        h
    }

    /// `RateLimit-Policy`'s value, and the name of the item `RateLimit` refers to.
    fn policy_field(&self) -> (String, String) {
        let item = |i: usize| match i {
            0 => self.policy.to_string(),
            i => format!("{}#{i}", self.policy),
        };
        if self.quotas.is_empty() {
            let window = ceil_secs(self.window).max(1);
            let field = format!("\"{}\";q={};w={}", self.policy, self.limit, window);
            return (field, self.policy.to_string());
        }
        let field = self
            .quotas
            .iter()
            .enumerate()
            .map(|(i, q)| {
                format!(
                    "\"{}\";q={};w={}",
                    item(i),
                    q.limit,
                    ceil_secs(q.window).max(1)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        (field, item(self.limit_index.unwrap_or(0)))
    }

    /// The JSON body of a 429 response:
    /// `{"error":"rate_limited","policy","limit","remaining","retry_after","message"}` with
    /// `retry_after` in whole seconds (null when the request can never fit). When the
    /// limit was not measured ([`Decision::measured`]) `remaining` is null and the message
    /// says the limit could not be checked.
    pub fn body(&self) -> serde_json::Value {
        let retry = self.retry_after.map(ceil_secs);
        let message = match retry {
            _ if !self.measured() => format!(
                "The rate limit of policy \"{}\" could not be checked; the request is refused{}.",
                self.policy,
                match retry {
                    Some(s) => format!(": retry in {s} second{}", if s == 1 { "" } else { "s" }),
                    None => String::new(),
                }
            ),
            Some(s) => format!(
                "Rate limit exceeded for policy \"{}\": retry in {s} second{}.",
                self.policy,
                if s == 1 { "" } else { "s" }
            ),
            None if self.source == Source::Block => {
                format!("Blocked by policy \"{}\".", self.policy)
            }
            None => format!(
                "Rate limit exceeded for policy \"{}\": the request costs more than the limit allows.",
                self.policy
            ),
        };
        serde_json::json!({
            "error": "rate_limited",
            "policy": &*self.policy,
            "limit": self.limit,
            "remaining": if self.measured() { Some(self.remaining) } else { None },
            "retry_after": retry,
            "message": message,
        })
    }

    /// The decision as one JSON object with durations in milliseconds, as the CLI prints it
    /// and as the bindings' test vectors compare it.
    pub fn to_json(&self) -> serde_json::Value {
        let ms = |d: Duration| d.as_micros() as f64 / 1000.0;
        let mut v = serde_json::json!({
            "allowed": self.allowed,
            "limit": self.limit,
            "remaining": self.remaining,
            "reset_after_ms": ms(self.reset_after),
            "retry_after_ms": self.retry_after.map(ms),
            "delay_ms": ms(self.delay),
            "policy": &*self.policy,
            "source": self.source.name(),
            "shard": self.shard,
            "layer": self.layer,
            "shadow_denied": self.shadow_denied,
        });
        if !self.quotas.is_empty() {
            // multi-limit policies only: which limit decided, and every limit in force
            v["limit_index"] = self.limit_index.into();
            v["quotas"] = self
                .quotas
                .iter()
                .map(|q| serde_json::json!({"limit": q.limit, "window_ms": ms(q.window)}))
                .collect();
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn d(allowed: bool, retry: Option<u64>) -> Decision {
        Decision {
            allowed,
            limit: 100,
            remaining: if allowed { 42 } else { 0 },
            reset_after: Duration::from_millis(30_500),
            retry_after: retry.map(Duration::from_millis),
            delay: Duration::ZERO,
            policy: PolicyName::from("api"),
            source: Source::Redis,
            shard: Some(1),
            window: Duration::from_secs(60),
            layer: None,
            limit_index: None,
            quotas: Vec::new(),
            shadow_denied: false,
            layers: Vec::new(),
        }
    }
    #[test]
    fn multi_limit_headers_list_every_window() {
        let mut dec = d(false, Some(1_000));
        dec.remaining = 0;
        dec.limit = 1000;
        dec.window = Duration::from_secs(86_400);
        dec.limit_index = Some(1);
        dec.quotas = vec![
            Quota {
                limit: 10,
                window: Duration::from_secs(1),
            },
            Quota {
                limit: 1000,
                window: Duration::from_secs(86_400),
            },
        ];
        let h = dec.headers();
        assert!(h.contains(&(
            "RateLimit-Policy",
            "\"api\";q=10;w=1, \"api#1\";q=1000;w=86400".to_string()
        )));
        assert!(h.contains(&("RateLimit", "\"api#1\";r=0;t=31".to_string())));
        assert!(h.contains(&("X-RateLimit-Limit", "1000".to_string())));
        let j = dec.to_json();
        assert_eq!(j["limit_index"], 1);
        assert_eq!(j["quotas"][1]["window_ms"], 86_400_000.0);
        assert!(d(true, None).to_json().get("quotas").is_none());
    }
    #[test]
    fn headers_when_allowed() {
        // at 2025-01-01T12:00:00.5Z a decision that resets in 30.5 s resets at 12:00:31, a Unix
        // time (RateLimit keeps delta seconds, rounded up)
        let now = UNIX_EPOCH + Duration::from_millis(1_735_732_800_500);
        let h = d(true, None).headers_at(now);
        assert_eq!(
            h,
            vec![
                ("X-RateLimit-Limit", "100".to_string()),
                ("X-RateLimit-Remaining", "42".to_string()),
                ("X-RateLimit-Reset", "1735732831".to_string()),
                ("RateLimit-Policy", "\"api\";q=100;w=60".to_string()),
                ("RateLimit", "\"api\";r=42;t=31".to_string()),
            ]
        );
    }
    #[test]
    fn headers_and_body_when_denied() {
        let dec = d(false, Some(1_001));
        let h = dec.headers();
        assert_eq!(h.last().unwrap(), &("Retry-After", "2".to_string()));
        let b = dec.body();
        assert_eq!(b["retry_after"], 2);
        assert_eq!(b["error"], "rate_limited");
        assert_eq!(b["policy"], "api");
        assert!(b["message"]
            .as_str()
            .unwrap()
            .contains("retry in 2 seconds"));
        let never = d(false, None);
        assert!(never.headers().iter().all(|(k, _)| *k != "Retry-After"));
        assert!(never.body()["retry_after"].is_null());
    }

    /// A fallback decision renders no invented budget (an `open` fallback said
    /// `X-RateLimit-Remaining: 99`) and says the limit was not measured.
    #[test]
    fn fallback_headers_say_the_limit_was_not_measured() {
        let mut open = d(true, None);
        open.source = Source::Fallback;
        assert!(!open.measured());
        assert_eq!(
            open.headers(),
            vec![
                ("X-RateLimit-Limit", "100".to_string()),
                ("RateLimit-Policy", "\"api\";q=100;w=60".to_string()),
                ("X-RateLimit-Status", "unmeasured".to_string()),
            ]
        );
        let mut closed = d(false, Some(1_000));
        closed.source = Source::Fallback;
        let h = closed.headers();
        assert_eq!(h.last().unwrap(), &("Retry-After", "1".to_string()));
        assert!(h
            .iter()
            .all(|(k, _)| !k.contains("Remaining") && !k.contains("Reset") && *k != "RateLimit"));
        let b = closed.body();
        assert!(b["remaining"].is_null());
        assert!(
            b["message"]
                .as_str()
                .unwrap()
                .contains("could not be checked"),
            "{b}"
        );
        assert!(d(true, None).measured());
    }

    /// A shadow-denied decision is allowed, and its headers never tell the client it is
    /// limited: no remaining, no reset, no Retry-After.
    #[test]
    fn shadow_denied_headers_do_not_say_limited() {
        let mut s = d(true, None);
        s.remaining = 0;
        s.shadow_denied = true;
        assert_eq!(
            s.headers(),
            vec![
                ("X-RateLimit-Limit", "100".to_string()),
                ("RateLimit-Policy", "\"api\";q=100;w=60".to_string()),
            ]
        );
        assert_eq!(s.to_json()["shadow_denied"], true);
        assert_eq!(d(true, None).to_json()["shadow_denied"], false);
    }
}
