//! Events: denials, blocks, fallbacks, circuit changes, shadow denials and near-limit
//! crossings, delivered to subscriber callbacks and optionally to a capped Redis Stream per
//! shard. Never emitted for an allowed request decided normally, but for the one whose check
//! crosses its policy's `near_limit` fraction.

use crate::decision::Decision;
use crate::error::Error;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A shard's circuit breaker state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CircuitState {
    /// Failing: calls to the shard are skipped until a background probe succeeds.
    Open,
    /// Healthy again.
    Closed,
}

/// Something worth telling a dashboard, an alert or a billing job.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Event {
    /// A check was denied by its limit.
    Denied {
        policy: Arc<str>,
        key: String,
        decision: Decision,
    },
    /// A check met the block list (`auto` false), or a denial put the key on it (`auto` true).
    Blocked {
        policy: Arc<str>,
        key: String,
        auto: bool,
        retry_after: Option<Duration>,
    },
    /// A shard failed and the policy's `on_error` mode decided.
    Fallback {
        policy: Arc<str>,
        key: String,
        error: Error,
        allowed: bool,
    },
    /// A shard's circuit opened or closed.
    Circuit { shard: String, state: CircuitState },
    /// Shadow mode: the limit would have denied this check; it was allowed
    /// (`decision.shadow_denied`).
    ShadowDenied {
        policy: Arc<str>,
        key: String,
        decision: Decision,
    },
    /// An allowed check took the key's usage across the policy's `near_limit` fraction of
    /// its limit (once per crossing, not on every check above it).
    NearLimit {
        policy: Arc<str>,
        key: String,
        limit: u64,
        remaining: u64,
    },
    /// The config was reloaded (`Limiter::reload`, `reload_from_file`, or a
    /// `watch_config` watcher seeing its file change): `report` says what changed.
    Reloaded { report: crate::config::ReloadReport },
    /// A `watch_config` watcher saw its file change but the new config was rejected
    /// (`error` says why); the old config stays in force.
    ReloadRejected { path: String, error: Error },
}

impl Event {
    /// `denied`, `blocked`, `fallback`, `circuit`, `shadow_denied`, `near_limit`,
    /// `reloaded` or `reload_rejected`.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Denied { .. } => "denied",
            Event::Blocked { .. } => "blocked",
            Event::Fallback { .. } => "fallback",
            Event::Circuit { .. } => "circuit",
            Event::ShadowDenied { .. } => "shadow_denied",
            Event::NearLimit { .. } => "near_limit",
            Event::Reloaded { .. } => "reloaded",
            Event::ReloadRejected { .. } => "reload_rejected",
        }
    }

    /// Field/value pairs, as written to the Redis stream: first `kind` (the name every
    /// binding gives it: Node's `e.kind`, Python's `e["kind"]`, Go's `Event.Kind`, C's
    /// `shardlimit_event.kind`; spec/names.json), then the kind's fields.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut f = vec![("kind", self.kind().to_string())];
        match self {
            Event::Denied {
                policy,
                key,
                decision,
            } => {
                f.push(("policy", policy.to_string()));
                f.push(("key", key.clone()));
                f.push(("limit", decision.limit.to_string()));
                if let Some(r) = decision.retry_after {
                    f.push(("retry_after_ms", r.as_millis().to_string()));
                }
            }
            Event::Blocked {
                policy,
                key,
                auto,
                retry_after,
            } => {
                f.push(("policy", policy.to_string()));
                f.push(("key", key.clone()));
                f.push(("auto", auto.to_string()));
                if let Some(r) = retry_after {
                    f.push(("retry_after_ms", r.as_millis().to_string()));
                }
            }
            Event::Fallback {
                policy,
                key,
                error,
                allowed,
            } => {
                f.push(("policy", policy.to_string()));
                f.push(("key", key.clone()));
                f.push(("error", error.to_string()));
                f.push(("allowed", allowed.to_string()));
            }
            Event::Circuit { shard, state } => {
                f.push(("shard", shard.clone()));
                f.push(("state", format!("{state:?}").to_lowercase()));
            }
            Event::ShadowDenied {
                policy,
                key,
                decision,
            } => {
                f.push(("policy", policy.to_string()));
                f.push(("key", key.clone()));
                f.push(("limit", decision.limit.to_string()));
                f.push(("remaining", decision.remaining.to_string()));
            }
            Event::NearLimit {
                policy,
                key,
                limit,
                remaining,
            } => {
                f.push(("policy", policy.to_string()));
                f.push(("key", key.clone()));
                f.push(("limit", limit.to_string()));
                f.push(("remaining", remaining.to_string()));
            }
            Event::Reloaded { report } => {
                f.push(("engine_changed", report.engine_changed.to_string()));
                f.push(("handoff", report.handoff.to_string()));
                f.push(("policies_added", report.policies_added.join(",")));
                f.push(("policies_removed", report.policies_removed.join(",")));
                f.push(("policies_changed", report.policies_changed.join(",")));
            }
            Event::ReloadRejected { path, error } => {
                f.push(("path", path.clone()));
                f.push(("error", error.to_string()));
            }
        }
        f
    }
}

/// A subscriber callback. Called on the thread that made the decision: keep it short.
pub type Subscriber = Arc<dyn Fn(&Event) + Send + Sync>;

#[derive(Default)]
pub(crate) struct Subscribers {
    any: AtomicBool,
    list: RwLock<Vec<Subscriber>>,
    /// The rate-limited lines and the log sink (shared with the engine like the events).
    pub(crate) log: crate::log::Logs,
}

impl std::fmt::Debug for Subscribers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Subscribers({})", self.list.read().len())
    }
}

impl Subscribers {
    pub fn add(&self, s: Subscriber) {
        self.list.write().push(s);
        self.any.store(true, Ordering::Release);
    }
    #[inline]
    pub fn active(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }
    pub fn emit(&self, e: &Event) {
        for s in self.list.read().iter() {
            // a panicking subscriber must not take the check down with it
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s(e)));
        }
    }
}
