//! The configuration in force, the event stream and config-file watching: `config`,
//! `subscribe` and `watch_config` of the core's `Limiter`, and the shadow flag of an
//! ad-hoc policy.
//!
//! Events reach C as a plain struct the caller allocates (`shardlimit_event`), with typed
//! fields and fixed-size, NUL-terminated buffers, not as JSON: a C caller reads them
//! without a parser, Go and C++ copy them field by field, nothing in them needs freeing,
//! and two threads reading one subscription never share a buffer. (Python and Node get
//! the core's string fields as a dict or an object; here the numbers stay numbers.)
//!
//! One core subscriber per limiter fans events out to its subscriptions, so a
//! subscription freed is gone from the fan-out (nothing of it stays on the limiter), and
//! each subscription is a bounded queue: when it is full, later events are dropped and
//! counted (`shardlimit_subscription_dropped`), as the Rust side does for its stream.

use super::queue::{capacity_arg, fill, BoundedQueue, Fanout};
use super::*;
use parking_lot::Mutex;
use shardlimit::Event;
use std::sync::OnceLock;

/// The kind of an event (`shardlimit_event.kind`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shardlimit_event_kind {
    /// An event of a kind this version of the header does not know (`detail` holds its
    /// name).
    SHARDLIMIT_EVENT_OTHER = 0,
    /// A check was denied by its limit (`decision` is its decision).
    SHARDLIMIT_EVENT_DENIED = 1,
    /// A check met the block list (`auto_block` false), or a denial put the key on it
    /// (`auto_block` true); `retry_after_us` when the block expires.
    SHARDLIMIT_EVENT_BLOCKED = 2,
    /// A shard failed and the policy's `on_error` decided (`allowed`); `error_code` and
    /// `detail` (its message) say what failed.
    SHARDLIMIT_EVENT_FALLBACK = 3,
    /// A shard's circuit opened (`circuit_open`) or closed; `detail` is the shard's name.
    SHARDLIMIT_EVENT_CIRCUIT = 4,
    /// Shadow mode: the limit would have denied this check; it was allowed (`decision`).
    SHARDLIMIT_EVENT_SHADOW_DENIED = 5,
    /// An allowed check took the key's usage across its policy's `near_limit` fraction
    /// (`limit`, `remaining`).
    SHARDLIMIT_EVENT_NEAR_LIMIT = 6,
    /// The configuration was reloaded (`shardlimit_reload()`, `_reload_from_file()` or a
    /// watcher): `engine_changed`, and in `detail` the names of the policies added,
    /// removed or changed, comma-separated.
    SHARDLIMIT_EVENT_RELOADED = 7,
    /// A watcher saw its file change but the new configuration was refused (`error_code`,
    /// `detail` the reason); the old one stays in force.
    SHARDLIMIT_EVENT_RELOAD_REJECTED = 8,
}

/// Size of `shardlimit_event.key`: the longest key (1024 bytes) plus its NUL.
pub const SHARDLIMIT_KEY_CAP: usize = 1025;

/// Size of `shardlimit_event.detail`; longer texts are cut at a character boundary and
/// `detail_truncated` is set.
pub const SHARDLIMIT_EVENT_DETAIL_CAP: usize = 512;

/// The most events one subscription may hold (`shardlimit_subscribe()`'s `capacity`).
pub const SHARDLIMIT_MAX_EVENT_CAPACITY: usize = 65536;

/// One event, filled by `shardlimit_subscription_next()`: a plain struct the caller
/// allocates; nothing inside it needs freeing. Fields a kind does not use are zero.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct shardlimit_event {
    /// A `shardlimit_event_kind` value.
    pub kind: u32,
    /// Length in bytes of `policy`, without its NUL (0 for circuit and reload events).
    pub policy_len: usize,
    /// The policy, NUL-terminated.
    pub policy: [c_char; SHARDLIMIT_POLICY_NAME_CAP],
    /// Length in bytes of `key`, without its NUL (0 for circuit and reload events).
    pub key_len: usize,
    /// The key, NUL-terminated.
    pub key: [c_char; SHARDLIMIT_KEY_CAP],
    /// The limit (denied, shadow_denied, near_limit).
    pub limit: u64,
    /// Units left (denied, shadow_denied, near_limit).
    pub remaining: u64,
    /// True when `retry_after_us` is set (denied, blocked).
    pub has_retry_after: bool,
    /// Microseconds until the check could pass, or the block expires.
    pub retry_after_us: u64,
    /// Blocked: the denial put the key on the block list itself.
    pub auto_block: bool,
    /// Fallback: whether `on_error` allowed the request.
    pub allowed: bool,
    /// Circuit: true when it opened, false when it closed.
    pub circuit_open: bool,
    /// Reloaded: the shard list (or prefix, deadline) changed and new connections were made.
    pub engine_changed: bool,
    /// Fallback, reload_rejected: the `shardlimit_result` code of the error.
    pub error_code: u32,
    /// True when `decision` is set (denied, shadow_denied).
    pub has_decision: bool,
    /// The check's decision (when `has_decision`).
    pub decision: shardlimit_decision,
    /// Length in bytes of `detail`, without its NUL.
    pub detail_len: usize,
    /// The kind's text, NUL-terminated: the error message (fallback, reload_rejected), the
    /// shard (circuit), the policies that changed (reloaded), the kind's name (other).
    pub detail: [c_char; SHARDLIMIT_EVENT_DETAIL_CAP],
    /// True when `detail` was cut to fit.
    pub detail_truncated: bool,
}

/// A subscription to a limiter's events, from `shardlimit_subscribe()`: a bounded queue
/// the caller drains with `shardlimit_subscription_next()`. An opaque handle owned by the
/// caller; free it with `shardlimit_subscription_free()`, which wakes any thread waiting
/// in `_next` (it returns CLOSED). Thread-safe.
pub struct shardlimit_subscription {
    queue: Arc<BoundedQueue<Event>>,
}

/// Watches a configuration file for `shardlimit_watch_config()`. An opaque handle owned by
/// the caller; `shardlimit_watcher_free()` stops watching.
pub struct shardlimit_watcher {
    watcher: Mutex<Option<shardlimit::ConfigWatcher>>,
}

impl Object for shardlimit_subscription {
    const TAG: Tag = Tag::Subscription;
}
impl Object for shardlimit_watcher {
    const TAG: Tag = Tag::Watcher;
}

/// Held only by the core subscriber: when the core limiter is gone (its last handle freed
/// and its last call returned), this drops and every subscription is closed.
struct Feed(Arc<Fanout<Event>>);

impl Drop for Feed {
    fn drop(&mut self) {
        self.0.close_all();
    }
}

/// The fan-out of a limiter handle, made (and subscribed to the core) on first use.
pub(crate) type FanoutCell = OnceLock<Arc<Fanout<Event>>>;

fn fanout(l: &shardlimit_limiter) -> Arc<Fanout<Event>> {
    l.fanout
        .get_or_init(|| {
            let f = Arc::new(Fanout::default());
            let feed = Feed(f.clone());
            l.limiter
                .subscribe(Arc::new(move |e: &Event| feed.0.emit(e)));
            f
        })
        .clone()
}

fn us(t: Duration) -> u64 {
    u64::try_from(t.as_micros()).unwrap_or(u64::MAX)
}

fn event_to_c(e: &Event) -> Result<shardlimit_event, Error> {
    use shardlimit_event_kind::*;
    // SAFETY: every field is an integer, a bool, an array of them or a struct of them:
    // all-zero is a valid value of each
    let mut out: shardlimit_event = unsafe { std::mem::zeroed() };
    let policy_key = |policy: &str, key: &str, out: &mut shardlimit_event| {
        out.policy_len = fill(&mut out.policy, policy).0;
        out.key_len = fill(&mut out.key, key).0;
    };
    let mut detail = String::new();
    let code = |err: &CoreError| shardlimit_result::from_kind(err.kind()) as u32;
    match e {
        Event::Denied {
            policy,
            key,
            decision,
        }
        | Event::ShadowDenied {
            policy,
            key,
            decision,
        } => {
            out.kind = if matches!(e, Event::Denied { .. }) {
                SHARDLIMIT_EVENT_DENIED
            } else {
                SHARDLIMIT_EVENT_SHADOW_DENIED
            } as u32;
            policy_key(policy, key, &mut out);
            out.limit = decision.limit;
            out.remaining = decision.remaining;
            out.has_retry_after = decision.retry_after.is_some();
            out.retry_after_us = decision.retry_after.map_or(0, us);
            out.has_decision = true;
            out.decision = decision_to_c(decision)?;
        }
        Event::Blocked {
            policy,
            key,
            auto,
            retry_after,
        } => {
            out.kind = SHARDLIMIT_EVENT_BLOCKED as u32;
            policy_key(policy, key, &mut out);
            out.auto_block = *auto;
            out.has_retry_after = retry_after.is_some();
            out.retry_after_us = retry_after.map_or(0, us);
        }
        Event::Fallback {
            policy,
            key,
            error,
            allowed,
        } => {
            out.kind = SHARDLIMIT_EVENT_FALLBACK as u32;
            policy_key(policy, key, &mut out);
            out.allowed = *allowed;
            out.error_code = code(error);
            detail = error.to_string();
        }
        Event::Circuit { shard, state } => {
            out.kind = SHARDLIMIT_EVENT_CIRCUIT as u32;
            out.circuit_open = *state == shardlimit::CircuitState::Open;
            detail = shard.clone();
        }
        Event::NearLimit {
            policy,
            key,
            limit,
            remaining,
        } => {
            out.kind = SHARDLIMIT_EVENT_NEAR_LIMIT as u32;
            policy_key(policy, key, &mut out);
            out.limit = *limit;
            out.remaining = *remaining;
        }
        Event::Reloaded { report } => {
            out.kind = SHARDLIMIT_EVENT_RELOADED as u32;
            out.engine_changed = report.engine_changed;
            let mut names: Vec<&str> = report
                .policies_added
                .iter()
                .chain(&report.policies_removed)
                .chain(&report.policies_changed)
                .map(String::as_str)
                .collect();
            names.sort_unstable();
            detail = names.join(",");
        }
        Event::ReloadRejected { error, .. } => {
            out.kind = SHARDLIMIT_EVENT_RELOAD_REJECTED as u32;
            out.error_code = code(error);
            detail = error.to_string();
        }
        other => {
            out.kind = SHARDLIMIT_EVENT_OTHER as u32;
            detail = other.kind().to_string();
        }
    }
    let (n, cut) = fill(&mut out.detail, &detail);
    out.detail_len = n;
    out.detail_truncated = cut;
    Ok(out)
}

/// The stable name of a `shardlimit_event_kind` value, as the other languages spell it:
/// `"denied"`, `"blocked"`, `"fallback"`, `"circuit"`, `"shadow_denied"`, `"near_limit"`,
/// `"reloaded"`, `"reload_rejected"`, or `"unknown"`. Static, never freed. Thread-safe.
#[no_mangle]
pub extern "C" fn shardlimit_event_kind_name(kind: u32) -> shardlimit_str {
    use shardlimit_event_kind::*;
    quiet(shardlimit_str::EMPTY, || {
        let name: &'static std::ffi::CStr = match kind {
            k if k == SHARDLIMIT_EVENT_DENIED as u32 => c"denied",
            k if k == SHARDLIMIT_EVENT_BLOCKED as u32 => c"blocked",
            k if k == SHARDLIMIT_EVENT_FALLBACK as u32 => c"fallback",
            k if k == SHARDLIMIT_EVENT_CIRCUIT as u32 => c"circuit",
            k if k == SHARDLIMIT_EVENT_SHADOW_DENIED as u32 => c"shadow_denied",
            k if k == SHARDLIMIT_EVENT_NEAR_LIMIT as u32 => c"near_limit",
            k if k == SHARDLIMIT_EVENT_RELOADED as u32 => c"reloaded",
            k if k == SHARDLIMIT_EVENT_RELOAD_REJECTED as u32 => c"reload_rejected",
            _ => c"unknown",
        };
        shardlimit_str::from_static(name)
    })
}

/// Subscribes to the limiter's events: denials, blocks, fallbacks, circuit changes,
/// shadow denials, near-limit crossings and reloads, from the moment it returns. Events
/// wait in a queue of `capacity` events (0: 1024; at most
/// `SHARDLIMIT_MAX_EVENT_CAPACITY`) until `shardlimit_subscription_next()` takes them; when
/// it is full, later events are dropped and counted (`shardlimit_subscription_dropped()`),
/// so a slow reader never slows a check or grows without bound. Every subscription gets
/// every event. The subscription closes when it is freed, or when the limiter is gone
/// (its handle freed and its last call returned): `_next` then gives the events still
/// queued, then CLOSED. A subscription does not keep the limiter alive.
///
/// On success `*out` is a new subscription the caller owns (free with
/// `shardlimit_subscription_free()`). `err` may be NULL. Thread-safe.
/// Results: OK, INVALID_ARGUMENT (`capacity` too large, NULL `out`), CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_subscribe(
    limiter: *const shardlimit_limiter,
    capacity: usize,
    out: *mut *mut shardlimit_subscription,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = live("limiter", limiter)?;
        let capacity = capacity_arg(capacity, 1024, SHARDLIMIT_MAX_EVENT_CAPACITY, "events")?;
        let out = out_arg("out", out)?;
        let queue = fanout(&l).subscribe(capacity);
        out.write(register(shardlimit_subscription { queue })?);
        Ok(())
    })
}

/// Takes the oldest queued event, waiting up to `timeout_us` microseconds for one
/// (`UINT64_MAX`: no limit; 0: do not wait). On OK, `*out_got` says whether an event came
/// and, when it did, `*out` holds it (left untouched otherwise). CLOSED once the
/// subscription is freed (also while this waits: it wakes) or the limiter is gone and
/// every queued event was taken. Inside a completion callback it never waits. `err` may
/// be NULL. Thread-safe: several threads may take events from one subscription.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_subscription_next(
    subscription: *const shardlimit_subscription,
    timeout_us: u64,
    out_got: *mut bool,
    out: *mut shardlimit_event,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let sub = live("subscription", subscription)?;
        let out_got = out_arg("out_got", out_got)?;
        let out = out_arg("out", out)?;
        sub.queue.next_into(timeout_us, out_got, out, event_to_c)
    })
}

/// How many events this subscription dropped because its queue was full. 0 for NULL or
/// a handle that is not a live subscription. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_subscription_dropped(
    subscription: *const shardlimit_subscription,
) -> u64 {
    quiet(0, || {
        live("subscription", subscription).map_or(0, |s| s.queue.dropped())
    })
}

/// Ends a subscription and frees it: no more events are queued, queued ones are
/// discarded, and a thread waiting in `shardlimit_subscription_next()` wakes with CLOSED.
/// NULL, a second free, or a pointer that is not a subscription is a no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_subscription_free(subscription: *mut shardlimit_subscription) {
    quiet((), || {
        if let Some(obj) = unregister(subscription) {
            if let Ok(s) = obj.downcast::<shardlimit_subscription>() {
                s.queue.close_and_discard();
            }
        }
    })
}

/// Registers `callback` (see `shardlimit_notify_callback`) to be called with `user` when
/// the subscription goes from empty to holding an event and when it closes, so that a
/// host drains it from its own event loop (`shardlimit_subscription_next()` with a timeout
/// of 0, until no event comes) instead of a thread waiting in `_next`. When events are
/// queued already, or the subscription is closed, it is called once before this returns.
/// Once per subscription. `callback` and `user` must be usable from any thread until the
/// subscription is freed. `err` may be NULL. Thread-safe.
/// Results: OK, INVALID_ARGUMENT (NULL `callback`, one set already), CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_subscription_set_notify(
    subscription: *const shardlimit_subscription,
    callback: notify::shardlimit_notify_callback,
    user: *mut std::ffi::c_void,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        live("subscription", subscription)?
            .queue
            .set_notify(callback, user)
    })
}

/// Watches the configuration file at the path given by `path_len` bytes at `path`,
/// checking its modification time every `every_ms` milliseconds (1 to 3600000), and
/// reloads the limiter when it changes; a bad new file is refused (a
/// `SHARDLIMIT_EVENT_RELOAD_REJECTED` event says why) and the old configuration stays.
/// Each reload is a `SHARDLIMIT_EVENT_RELOADED` event: wait for it on a subscription to
/// know the next check uses the new file. Watches until the watcher is freed, or the
/// limiter is gone.
///
/// On success `*out` is a new watcher the caller owns (free with
/// `shardlimit_watcher_free()`). `err` may be NULL. Thread-safe.
/// Results: OK, INVALID_ARGUMENT (an empty path, `every_ms` out of range), CLOSED,
/// INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_watch_config(
    limiter: *const shardlimit_limiter,
    path: *const c_char,
    path_len: usize,
    every_ms: u64,
    out: *mut *mut shardlimit_watcher,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        let p = admin::path_arg(path, path_len)?;
        if !(1..=3_600_000).contains(&every_ms) {
            return Err(invalid(
                "every_ms",
                format!("is {every_ms}; from 1 to 3600000 milliseconds"),
            ));
        }
        let out = out_arg("out", out)?;
        let w = l.watch_config(p, Duration::from_millis(every_ms));
        out.write(register(shardlimit_watcher {
            watcher: Mutex::new(Some(w)),
        })?);
        Ok(())
    })
}

/// Stops watching and frees the watcher: returns once the watching thread has ended
/// (within one `every_ms`), so no reload starts after it. NULL, a second free, or a
/// pointer that is not a watcher is a no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_watcher_free(watcher: *mut shardlimit_watcher) {
    quiet((), || {
        if let Some(obj) = unregister(watcher) {
            if let Ok(w) = obj.downcast::<shardlimit_watcher>() {
                drop(w.watcher.lock().take());
            }
        }
    })
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn limit_json(l: &Limit) -> serde_json::Value {
    let mut v = match l {
        Limit::FixedWindow { limit, window }
        | Limit::SlidingWindow { limit, window }
        | Limit::SlidingLog { limit, window } => {
            serde_json::json!({ "limit": limit, "window_ms": ms(*window) })
        }
        Limit::TokenBucket {
            capacity,
            refill_per_sec,
        } => serde_json::json!({ "capacity": capacity, "refill_per_sec": refill_per_sec }),
        Limit::LeakyBucket {
            capacity,
            leak_per_sec,
        } => serde_json::json!({ "capacity": capacity, "leak_per_sec": leak_per_sec }),
        Limit::Concurrency { max, lease_ttl } => {
            serde_json::json!({ "max": max, "lease_ttl_ms": ms(*lease_ttl) })
        }
    };
    v["algorithm"] = l.algorithm().name().into();
    v
}

fn policy_json(p: &Policy) -> serde_json::Value {
    serde_json::json!({
        "name": p.name(),
        "max": p.max(),
        "on_error": p.on_error().name(),
        "shadow": p.shadow(),
        "overrides": p.overrides(),
        "limits": p.limits().iter().map(limit_json).collect::<Vec<_>>(),
    })
}

/// The configuration in force (after the last reload), as JSON text: `engine`
/// (`"redis"` or `"memory"`), `shards` (their names: never their URLs, which may carry
/// passwords), `cluster` (the number of seed nodes, or null), `key_prefix`, `timeout_ms`,
/// `on_error`, `instances`, and `policies`: an array of `{name, max, on_error, shadow,
/// overrides, limits: [{algorithm, limit and window_ms | capacity and refill_per_sec |
/// capacity and leak_per_sec | max and lease_ttl_ms}]}` sorted by name. On success
/// `*out` is an owned string (free with `shardlimit_string_free()`). `err` may be NULL.
/// Thread-safe.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_config_json(
    limiter: *const shardlimit_limiter,
    out: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        let out = out_arg("out", out)?;
        let c = l.config();
        let shards: Vec<&str> = c.shards.iter().flatten().map(|s| s.name.as_str()).collect();
        let mut policies: Vec<&Policy> = c.policies.values().collect();
        policies.sort_by(|a, b| a.name().cmp(b.name()));
        let v = serde_json::json!({
            "engine": if l.is_redis() { "redis" } else { "memory" },
            "shards": shards,
            "cluster": c.cluster.as_ref().map(|n| n.len()),
            "key_prefix": c.key_prefix,
            "timeout_ms": ms(c.timeout),
            "on_error": c.on_error.name(),
            "instances": c.instances,
            "policies": policies.into_iter().map(policy_json).collect::<Vec<_>>(),
        });
        out.write(owned_string(v.to_string()));
        Ok(())
    })
}

/// A copy of `policy` in shadow mode (`shadow` true) or not (false): in shadow, a check
/// the limit would deny is allowed, consumes nothing and is reported
/// (`decision.shadow_denied`, a `SHARDLIMIT_EVENT_SHADOW_DENIED` event, the shadow
/// report). The equivalent of `"shadow": true` in the configuration, for ad-hoc policies.
///
/// On success `*out` is a new policy the caller owns (free with
/// `shardlimit_policy_free()`); `policy` is unchanged. `err` may be NULL. Thread-safe.
/// Results: OK, INVALID_ARGUMENT (a concurrency policy cannot run in shadow), CLOSED,
/// INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_policy_with_shadow(
    policy: *const shardlimit_policy,
    shadow: bool,
    out: *mut *mut shardlimit_policy,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let p = policy_arg(policy)?;
        let out = out_arg("out", out)?;
        out.write(new_policy(p.with_shadow(shadow)?)?);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_circuit_event_reaches_c_with_its_shard() {
        let e = Event::Circuit {
            shard: "s0".to_string(),
            state: shardlimit::CircuitState::Open,
        };
        let c = event_to_c(&e).unwrap();
        assert_eq!(
            c.kind,
            shardlimit_event_kind::SHARDLIMIT_EVENT_CIRCUIT as u32
        );
        assert!(c.circuit_open);
        assert_eq!(c.detail_len, 2);
    }
}
