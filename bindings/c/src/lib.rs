//! The C ABI of shardlimit. `include/shardlimit.h` is generated from this file by cbindgen
//! (`bindings/c/cbindgen.toml`), so the `///` comments below are the C documentation.
//!
//! The binding only converts types and errors; every decision is made by the core crate.
//! Rules kept by every function (see the header's preamble for the user-facing version):
//!
//! - it runs inside [`std::panic::catch_unwind`]: a panic becomes `SHARDLIMIT_ERR_INTERNAL`;
//! - out-parameters are written only when it returns `SHARDLIMIT_OK`;
//! - errors come back as an owned `shardlimit_error` through the last (nullable) argument,
//!   never through thread-local state, because Go moves goroutines between OS threads;
//! - every object it hands out is a handle: a token, never reused, naming a reference-
//!   counted object in a table of live objects (see "Handles" below), so a NULL, foreign or
//!   wrong-type pointer is INVALID_ARGUMENT, a freed handle is CLOSED (also while another
//!   thread frees it), and `_free` of any of them is a no-op; none is ever dereferenced.

#![allow(non_camel_case_types)]
// Every exported function takes raw pointers from C; their contracts are in the docs.
#![allow(clippy::missing_safety_doc)]

use parking_lot::RwLock;
use shardlimit::{
    BlockInfo, Decision, Error as CoreError, ErrorKind, Layer, Lease, Limit, Limiter, ManualClock,
    OnError, Policy, Source, MAX_KEY_LEN,
};
use std::any::Any;
use std::collections::BTreeMap;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

// `SHARDLIMIT_VERSION` (the string) is written by cbindgen.toml's `after_includes`, since
// cbindgen cannot export string constants; `tests::version_matches_the_core_and_the_header`
// keeps it, these numbers and the core's version equal.

/// The major part of `SHARDLIMIT_VERSION`.
pub const SHARDLIMIT_VERSION_MAJOR: u32 = 0;
/// The minor part of `SHARDLIMIT_VERSION`.
pub const SHARDLIMIT_VERSION_MINOR: u32 = 1;
/// The patch part of `SHARDLIMIT_VERSION`.
pub const SHARDLIMIT_VERSION_PATCH: u32 = 0;

/// Size of `shardlimit_decision.policy`: the longest policy name (128 bytes) plus its
/// terminating NUL.
pub const SHARDLIMIT_POLICY_NAME_CAP: usize = 129;

/// Size of `shardlimit_decision.quotas`: the most limits one policy may hold.
pub const SHARDLIMIT_MAX_LIMITS: usize = 16;

/// The result of every fallible function. The numbers are a stable public contract
/// shared with the core crate's `ErrorKind` codes (and so with the Python exception
/// classes and the Node `err.code` values), except the codes from 100 on, which only the
/// C ABI has: a retired number is never reused.
/// `shardlimit_result_name()` gives each code's stable snake_case name.
///
/// A denied check is not an error: it returns `SHARDLIMIT_OK` with `allowed == false`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shardlimit_result {
    /// Success; out-parameters were written.
    SHARDLIMIT_OK = 0,
    /// The configuration is invalid; the message names the offending field.
    SHARDLIMIT_ERR_CONFIG = 1,
    /// An argument is invalid: NULL where a value is required, not UTF-8, a NUL byte
    /// inside a key (usually a wrong length), an empty or too long key, a zero cost, a
    /// freed or foreign handle, an index out of range.
    SHARDLIMIT_ERR_INVALID_ARGUMENT = 2,
    /// A Redis shard could not be reached or the connection broke.
    SHARDLIMIT_ERR_CONNECTION = 3,
    /// A Redis shard did not answer within the configured deadline (`timeout_ms`).
    SHARDLIMIT_ERR_TIMEOUT = 4,
    /// Redis answered with an error while running a script or command.
    SHARDLIMIT_ERR_SCRIPT = 5,
    // 6 was SHARDLIMIT_ERR_ROUTING, retired unused; never reused.
    /// A named policy does not exist in the configuration.
    SHARDLIMIT_ERR_UNKNOWN_POLICY = 7,
    /// Reading a file (the configuration) failed.
    SHARDLIMIT_ERR_IO = 8,
    /// A bug in shardlimit (an invariant broke, or a panic was caught). Please report it.
    SHARDLIMIT_ERR_INTERNAL = 9,
    /// A shard's circuit breaker is open after repeated failures: it is skipped (no time
    /// spent) until a background probe sees it answer again.
    SHARDLIMIT_ERR_UNAVAILABLE = 10,
    /// More checks wait for a shard's connection in this process than its queue holds
    /// (`max_queue`): the check was refused, neither admitted nor sent to `on_error`.
    SHARDLIMIT_ERR_OVERLOADED = 11,
    /// The handle was freed (`shardlimit_limiter_free()` and the like): a use after free,
    /// or a call racing the free on another thread. Handles are never reused, so a freed
    /// handle always gives CLOSED, never another object's answer. Codes from 100 on belong
    /// to the C ABI (handles exist only here) and never collide with the core's kinds.
    SHARDLIMIT_ERR_CLOSED = 100,
    /// The call was cancelled (`shardlimit_pending_cancel()`) before it completed. The C
    /// ABI's own code, like CLOSED.
    SHARDLIMIT_ERR_CANCELLED = 101,
}

use shardlimit_result::*;

/// A failure of an ABI call: a result code and its message. Core errors convert with `?`;
/// CLOSED is the ABI's own.
#[derive(Debug, Clone)]
struct Error {
    code: shardlimit_result,
    message: String,
}

impl From<CoreError> for Error {
    fn from(e: CoreError) -> Error {
        Error {
            code: shardlimit_result::from_kind(e.kind()),
            message: e.to_string(),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl shardlimit_result {
    /// The C code of a core error kind. Kinds added to the core later map to INTERNAL
    /// until they get their own code here; `tests::result_codes_match_the_core` fails
    /// until they do.
    fn from_kind(kind: ErrorKind) -> shardlimit_result {
        match kind {
            ErrorKind::Config => SHARDLIMIT_ERR_CONFIG,
            ErrorKind::InvalidArgument => SHARDLIMIT_ERR_INVALID_ARGUMENT,
            ErrorKind::Connection => SHARDLIMIT_ERR_CONNECTION,
            ErrorKind::Timeout => SHARDLIMIT_ERR_TIMEOUT,
            ErrorKind::Script => SHARDLIMIT_ERR_SCRIPT,
            ErrorKind::UnknownPolicy => SHARDLIMIT_ERR_UNKNOWN_POLICY,
            ErrorKind::Io => SHARDLIMIT_ERR_IO,
            ErrorKind::Internal => SHARDLIMIT_ERR_INTERNAL,
            ErrorKind::Unavailable => SHARDLIMIT_ERR_UNAVAILABLE,
            ErrorKind::Overloaded => SHARDLIMIT_ERR_OVERLOADED,
            _ => SHARDLIMIT_ERR_INTERNAL,
        }
    }
}

/// Who made a decision (`shardlimit_decision.source`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shardlimit_source {
    /// A Redis shard ran the algorithm.
    SHARDLIMIT_SOURCE_REDIS = 1,
    /// The in-memory engine (no shards configured).
    SHARDLIMIT_SOURCE_MEMORY = 2,
    /// Admitted locally from units leased in advance from Redis.
    SHARDLIMIT_SOURCE_LOCAL = 3,
    /// The shard failed and the policy's `on_error` mode decided.
    SHARDLIMIT_SOURCE_FALLBACK = 4,
    /// The key is on the block list.
    SHARDLIMIT_SOURCE_BLOCK = 5,
}

use shardlimit_source::*;

fn source_to_c(s: Source) -> shardlimit_source {
    match s {
        Source::Redis => SHARDLIMIT_SOURCE_REDIS,
        Source::Memory => SHARDLIMIT_SOURCE_MEMORY,
        Source::Local => SHARDLIMIT_SOURCE_LOCAL,
        Source::Fallback => SHARDLIMIT_SOURCE_FALLBACK,
        Source::Block => SHARDLIMIT_SOURCE_BLOCK,
    }
}

fn source_from_c(code: u32) -> Option<Source> {
    [
        Source::Redis,
        Source::Memory,
        Source::Local,
        Source::Fallback,
        Source::Block,
    ]
    .into_iter()
    .find(|s| source_to_c(*s) as u32 == code)
}

/// The algorithm of an ad-hoc limit (`shardlimit_limit.algorithm`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shardlimit_algorithm {
    /// At most `limit` units per aligned window of `period_ms`.
    SHARDLIMIT_ALGORITHM_FIXED_WINDOW = 1,
    /// Two-counter estimate of a sliding window of `period_ms`.
    SHARDLIMIT_ALGORITHM_SLIDING_WINDOW = 2,
    /// Exact sliding window of `period_ms` (one log entry per admitted unit).
    SHARDLIMIT_ALGORITHM_SLIDING_LOG = 3,
    /// A bucket of `limit` tokens refilled at `rate_per_sec`.
    SHARDLIMIT_ALGORITHM_TOKEN_BUCKET = 4,
    /// A shaper: a queue of `limit` units drained at `rate_per_sec`.
    SHARDLIMIT_ALGORITHM_LEAKY_BUCKET = 5,
    /// At most `limit` units held at once; leases expire after `period_ms`.
    SHARDLIMIT_ALGORITHM_CONCURRENCY = 6,
}

/// What an ad-hoc policy does when its Redis shard fails (`shardlimit_limit.on_error`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shardlimit_on_error {
    /// The core's default (`open`).
    SHARDLIMIT_ON_ERROR_DEFAULT = 0,
    /// Allow the request.
    SHARDLIMIT_ON_ERROR_OPEN = 1,
    /// Deny the request.
    SHARDLIMIT_ON_ERROR_CLOSED = 2,
    /// Decide with an in-process limiter holding `limit / instances`.
    SHARDLIMIT_ON_ERROR_LOCAL = 3,
    /// Return the backend error to the caller, who decides.
    SHARDLIMIT_ON_ERROR_ERROR = 4,
}

/// A borrowed string: `len` bytes of UTF-8 at `ptr`, followed by a NUL byte that `len`
/// does not count (so `ptr` can also be used as a C string). The function that returns it
/// says how long it stays valid; never free it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct shardlimit_str {
    /// The first byte; never NULL in strings the library returns.
    pub ptr: *const c_char,
    /// The length in bytes, without the NUL.
    pub len: usize,
}

impl shardlimit_str {
    fn from_static(s: &'static std::ffi::CStr) -> shardlimit_str {
        shardlimit_str {
            ptr: s.as_ptr(),
            len: s.to_bytes().len(),
        }
    }
    fn from_cstring(s: &CString) -> shardlimit_str {
        shardlimit_str {
            ptr: s.as_ptr(),
            len: s.as_bytes().len(),
        }
    }
    const EMPTY: shardlimit_str = shardlimit_str {
        ptr: c"".as_ptr(),
        len: 0,
    };
}

/// An owned string: `len` bytes of UTF-8 at `ptr`, followed by a NUL byte that `len` does
/// not count. The caller owns it and must release it with `shardlimit_string_free()`.
#[repr(C)]
#[derive(Debug)]
pub struct shardlimit_string {
    /// The first byte; NULL for an empty (or already freed) struct.
    pub ptr: *mut c_char,
    /// The length in bytes, without the NUL.
    pub len: usize,
}

/// The outcome of one check: a plain struct the caller allocates (usually on the stack)
/// and the library fills. Nothing inside it needs freeing.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct shardlimit_decision {
    /// Whether the request may proceed. A denied check consumed nothing.
    pub allowed: bool,
    /// The effective limit (units per window, bucket capacity, or max concurrent).
    pub limit: u64,
    /// Units still available after this check.
    pub remaining: u64,
    /// Microseconds until the limit is back to its full budget with no further traffic.
    pub reset_after_us: u64,
    /// True when `retry_after_us` is set: the check was denied and can succeed later.
    /// False when allowed, and when the cost can never fit (cost > limit).
    pub has_retry_after: bool,
    /// When `has_retry_after`: microseconds until the same check would pass with no
    /// other traffic. 0 otherwise.
    pub retry_after_us: u64,
    /// Leaky bucket: microseconds the caller must wait before sending. 0 otherwise.
    pub delay_us: u64,
    /// The window the limit is measured over, in microseconds.
    pub window_us: u64,
    /// Who decided: a `shardlimit_source` value.
    pub source: u32,
    /// True when a Redis shard decided; `shard` is then its index.
    pub has_shard: bool,
    /// The index of the shard that decided (valid when `has_shard`).
    pub shard: u32,
    /// Length in bytes of `policy`, without its NUL.
    pub policy_len: usize,
    /// The policy that decided, NUL-terminated (for an ad-hoc limit, its generated name).
    pub policy: [c_char; SHARDLIMIT_POLICY_NAME_CAP],
    /// True for a layered check (`shardlimit_check_all()`); `layer` is then the index of
    /// the layer this decision describes: the one that denied, or the tightest when all
    /// allowed.
    pub has_layer: bool,
    /// The layer index (valid when `has_layer`).
    pub layer: u32,
    /// True for a multi-limit policy; `limit_index` is then the index of the limit this
    /// decision describes (the one that denied, or the tightest when all allowed), and
    /// `quotas[0..quota_count]` every limit in force, in the policy's order (what
    /// `RateLimit-Policy` lists: render headers with `shardlimit_decision_headers()`).
    pub has_limit_index: bool,
    /// The limit index (valid when `has_limit_index`).
    pub limit_index: u32,
    /// How many entries of `quotas` are set (0 for a policy of one limit).
    pub quota_count: u32,
    /// The limits of a multi-limit policy (the first `quota_count`).
    pub quotas: [shardlimit_quota; SHARDLIMIT_MAX_LIMITS],
    /// Shadow mode: the limit would have denied this check, but its policy (or the call,
    /// `shardlimit_check_shadow()`) is in shadow, so it was allowed (`allowed` is true,
    /// `has_retry_after` false) and consumed nothing. `remaining` is what the limit really
    /// has left.
    pub shadow_denied: bool,
}

/// One limit of a multi-limit policy as the headers describe it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct shardlimit_quota {
    /// The effective limit (units per window, or bucket capacity).
    pub limit: u64,
    /// The window it is measured over, in microseconds.
    pub window_us: u64,
}

/// One layer of `shardlimit_check_all()`: `cost` units of a policy for a key. The policy
/// is `policy` when it is not NULL, otherwise the configured policy named by
/// `policy_name_len` bytes at `policy_name`. Everything is borrowed for the call only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct shardlimit_layer {
    /// The key: `key_len` bytes of UTF-8.
    pub key: *const c_char,
    /// The length of `key` in bytes.
    pub key_len: usize,
    /// A policy object, or NULL to use `policy_name`.
    pub policy: *const shardlimit_policy,
    /// A configured policy's name (used when `policy` is NULL).
    pub policy_name: *const c_char,
    /// The length of `policy_name` in bytes.
    pub policy_name_len: usize,
    /// Units to take (>= 1).
    pub cost: u64,
}

/// A key's block-list entry, filled by `shardlimit_blocked()`.
#[repr(C)]
#[derive(Debug)]
pub struct shardlimit_block_info {
    /// Whether the key is blocked. When false, the other fields are zero/NULL.
    pub blocked: bool,
    /// True for a block without expiry (until `shardlimit_unblock()`).
    pub permanent: bool,
    /// Microseconds until the block expires (when not permanent).
    pub remaining_us: u64,
    /// The reason given to `shardlimit_block()`: owned by the caller, free it with
    /// `shardlimit_string_free(&info.reason)` (a no-op when `ptr` is NULL).
    pub reason: shardlimit_string,
}

/// The parameters of an ad-hoc limit, for `shardlimit_policy_new()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct shardlimit_limit {
    /// A `shardlimit_algorithm` value.
    pub algorithm: u32,
    /// Units per window (windows), capacity (buckets) or max held (concurrency).
    pub limit: u64,
    /// The window (fixed_window, sliding_window, sliding_log) or the lease TTL
    /// (concurrency), in whole milliseconds. Ignored by the buckets.
    pub period_ms: u64,
    /// Refill rate (token_bucket) or leak rate (leaky_bucket) in units per second.
    /// Ignored by the other algorithms.
    pub rate_per_sec: f64,
    /// A `shardlimit_on_error` value; 0 for the default.
    pub on_error: u32,
}

/// A rate limiter: a configuration, an engine (Redis shards or in-memory), and for Redis
/// its own I/O runtime and one connection per shard, created on first use and re-created
/// in a forked child. Thread-safe: one handle may be used from any number of threads at
/// once, and freed while they do (see `shardlimit_limiter_free()`). An opaque handle:
/// never dereference it. Create with a `shardlimit_limiter_new_*` function; the caller owns
/// it and frees it with `shardlimit_limiter_free()`.
pub struct shardlimit_limiter {
    limiter: Limiter,
    /// The subscriptions' fan-out (`events.rs`), made on the first `shardlimit_subscribe()`.
    fanout: events::FanoutCell,
    /// The log callback and log subscriptions (`logging.rs`), made on first use.
    logs: logging::LogFanoutCell,
}

/// A validated policy (a named limit). Immutable and thread-safe. From
/// `shardlimit_limiter_policy()` or `shardlimit_policy_new()`; an opaque handle the caller
/// owns and frees with `shardlimit_policy_free()` (a call using it on another thread then
/// finishes; later ones return CLOSED).
pub struct shardlimit_policy {
    policy: Policy,
    /// The name again, NUL-terminated for `shardlimit_policy_name()`.
    name: CString,
}

fn new_policy(policy: Policy) -> Result<*mut shardlimit_policy, Error> {
    let name = to_cstring(policy.name().to_string());
    register(shardlimit_policy { policy, name })
}

/// A held lease of a concurrency policy, from `shardlimit_acquire()`. Give it back with
/// `shardlimit_release()` (or let it expire after the policy's lease TTL), then free the
/// object with `shardlimit_lease_free()`. Freeing does not release the lease. An opaque
/// handle owned by the caller; thread-safe (releasing it twice is harmless).
pub struct shardlimit_lease {
    lease: Lease,
    policy: Policy,
}

/// A manual clock for deterministic tests: limiters created with it read time from it
/// instead of Redis `TIME` or the monotonic clock. Thread-safe. Free with
/// `shardlimit_clock_free()` (limiters using it keep their own reference). An opaque
/// handle owned by the caller.
pub struct shardlimit_clock {
    clock: Arc<ManualClock>,
}

/// The details of a failure: its result code and a message naming what went wrong.
/// An opaque handle owned by the caller; free with `shardlimit_error_free()`. Readable
/// from any thread; its message is borrowed from it, so free it only when no thread still
/// reads the message.
pub struct shardlimit_error {
    code: shardlimit_result,
    message: CString,
}

/// The rate-limit HTTP headers of a decision, from `shardlimit_decision_headers()`.
/// An opaque handle owned by the caller; free with `shardlimit_headers_free()`, once no
/// thread still reads the strings borrowed from it. Readable from any thread.
pub struct shardlimit_headers {
    items: Vec<(CString, CString)>,
}

// ---------------------------------------------------------------------------------------
// Handles. A handle given to C is not the address of its object: it is a token naming one
// object for the life of the process, looked up in a table of live objects on every call.
// Tokens are never reused, so a freed handle stays recognisable as freed (CLOSED) and can
// never name an object created later, even one allocated where the old one was (the
// config-reload pattern: free a limiter, create its successor). Objects are reference
// counted: a call clones what it needs out of the table under a read lock and works on its
// own reference, so `_free` on another thread removes the table's reference without
// waiting, the call finishes with the object it started with, and later calls see CLOSED.
//
// A token is `HANDLE_BASE | id << TAG_BITS | tag`: the top half of the address space,
// where no user-space object (C heap, Go heap) can ever live on a 64-bit platform, so a
// token can never equal the address of a real object, and Go's garbage collector, which
// looks only at addresses inside its own heap, ignores it. Never dereference one.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    Limiter = 1,
    Policy = 2,
    Lease = 3,
    Clock = 4,
    Error = 5,
    Headers = 6,
    Pending = 7,
    Subscription = 8,
    Watcher = 9,
    LogSubscription = 10,
    Host = 11,
}

impl Tag {
    const ALL: [Tag; 11] = [
        Tag::Limiter,
        Tag::Policy,
        Tag::Lease,
        Tag::Clock,
        Tag::Error,
        Tag::Headers,
        Tag::Pending,
        Tag::Subscription,
        Tag::Watcher,
        Tag::LogSubscription,
        Tag::Host,
    ];
    fn c_name(self) -> &'static str {
        match self {
            Tag::Limiter => "shardlimit_limiter",
            Tag::Policy => "shardlimit_policy",
            Tag::Lease => "shardlimit_lease",
            Tag::Clock => "shardlimit_clock",
            Tag::Error => "shardlimit_error",
            Tag::Headers => "shardlimit_headers",
            Tag::Pending => "shardlimit_pending",
            Tag::Subscription => "shardlimit_subscription",
            Tag::Watcher => "shardlimit_watcher",
            Tag::LogSubscription => "shardlimit_log_subscription",
            Tag::Host => "shardlimit_host",
        }
    }
}

/// A type whose objects are handed to C as handles.
trait Object: Any + Send + Sync {
    const TAG: Tag;
}

impl Object for shardlimit_limiter {
    const TAG: Tag = Tag::Limiter;
}
impl Object for shardlimit_policy {
    const TAG: Tag = Tag::Policy;
}
impl Object for shardlimit_lease {
    const TAG: Tag = Tag::Lease;
}
impl Object for shardlimit_clock {
    const TAG: Tag = Tag::Clock;
}
impl Object for shardlimit_error {
    const TAG: Tag = Tag::Error;
}
impl Object for shardlimit_headers {
    const TAG: Tag = Tag::Headers;
}
impl Object for shardlimit_pending {
    const TAG: Tag = Tag::Pending;
}

const HANDLE_BASE: usize = 1 << (usize::BITS - 1);
const TAG_BITS: u32 = 4;
/// The last id a token can carry: 2^59 on 64-bit platforms, more than a process can use.
const MAX_ID: usize = (usize::MAX - HANDLE_BASE) >> TAG_BITS;

type Shared = Arc<dyn Any + Send + Sync>;

struct Handles {
    /// The id of the next handle; ids below it were issued, ids at or above were not.
    next: usize,
    /// Live objects by token. A B-tree rather than a hash map: its nodes are pointed to at
    /// their start, so leak checkers see objects never freed as reachable, not "possibly
    /// lost".
    live: BTreeMap<usize, Shared>,
}

static HANDLES: RwLock<Handles> = RwLock::new(Handles {
    next: 1,
    live: BTreeMap::new(),
});

/// Hands `v` to C: a new token, never issued before.
fn register<T: Object>(v: T) -> Result<*mut T, Error> {
    register_arc(Arc::new(v))
}

/// Hands an object the library keeps its own reference to (a pending call) to C.
fn register_arc<T: Object>(obj: Arc<T>) -> Result<*mut T, Error> {
    let obj: Shared = obj;
    let mut h = HANDLES.write();
    if h.next > MAX_ID {
        return Err(CoreError::Internal("no handle ids left in this process".to_string()).into());
    }
    let token = HANDLE_BASE | h.next << TAG_BITS | T::TAG as usize;
    h.next += 1;
    h.live.insert(token, obj);
    Ok(std::ptr::without_provenance_mut(token))
}

/// What a pointer from C names.
enum Found<T> {
    Live(Arc<T>),
    /// A handle of this type that was freed.
    Closed,
    /// A live or freed handle of another type.
    OtherType(Tag),
    /// NULL, or not a value this library ever returned.
    Foreign,
}

fn find<T: Object>(p: *const T) -> Found<T> {
    let token = p as usize;
    if token < HANDLE_BASE {
        return Found::Foreign;
    }
    let id = (token - HANDLE_BASE) >> TAG_BITS;
    let tag = token & ((1 << TAG_BITS) - 1);
    let h = HANDLES.read();
    if id == 0 || id >= h.next {
        return Found::Foreign;
    }
    let Some(tag) = Tag::ALL.into_iter().find(|t| *t as usize == tag) else {
        return Found::Foreign;
    };
    if tag != T::TAG {
        return Found::OtherType(tag);
    }
    match h.live.get(&token).map(|o| o.clone().downcast::<T>()) {
        Some(Ok(obj)) => Found::Live(obj),
        Some(Err(_)) => Found::Foreign,
        None => Found::Closed,
    }
}

/// The live object `p` names, or the error saying why there is none: INVALID_ARGUMENT for
/// NULL, a foreign pointer or a handle of another type, CLOSED for a freed handle.
fn live<T: Object>(what: &str, p: *const T) -> Result<Arc<T>, Error> {
    let name = T::TAG.c_name();
    match find(p) {
        Found::Live(obj) => Ok(obj),
        Found::Closed => Err(Error {
            code: SHARDLIMIT_ERR_CLOSED,
            message: format!("`{what}`: this {name} was freed ({name}_free) and cannot be used"),
        }),
        Found::OtherType(t) => Err(invalid(what, format!("is a {}, not a {name}", t.c_name()))),
        Found::Foreign if p.is_null() => Err(invalid(what, "is NULL")),
        Found::Foreign => Err(invalid(
            what,
            format!("is not a {name}: it was never returned by shardlimit"),
        )),
    }
}

/// Takes the table's reference to the object `p` names, if it is a live `T`: `_free`.
fn unregister<T: Object>(p: *mut T) -> Option<Shared> {
    if !matches!(find(p.cast_const()), Found::Live(_)) {
        return None;
    }
    HANDLES.write().live.remove(&(p as usize))
}

/// The addresses of the owned strings (`shardlimit_string`) not yet freed. A B-tree, for
/// the reason given on `Handles::live`.
static STRINGS: RwLock<BTreeMap<usize, ()>> = RwLock::new(BTreeMap::new());

// ---------------------------------------------------------------------------------------
// Argument conversion

fn invalid(what: &str, message: impl Into<String>) -> Error {
    CoreError::InvalidArgument {
        what: what.to_string(),
        message: message.into(),
    }
    .into()
}

unsafe fn bytes_arg<'a>(what: &str, ptr: *const c_char, len: usize) -> Result<&'a [u8], Error> {
    if ptr.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(invalid(what, format!("is NULL with length {len}")))
        };
    }
    if len > isize::MAX as usize {
        return Err(invalid(what, format!("has an impossible length {len}")));
    }
    Ok(std::slice::from_raw_parts(ptr.cast::<u8>(), len))
}

unsafe fn str_arg<'a>(what: &str, ptr: *const c_char, len: usize) -> Result<&'a str, Error> {
    let bytes = bytes_arg(what, ptr, len)?;
    let s = std::str::from_utf8(bytes).map_err(|e| {
        invalid(
            what,
            format!("is not valid UTF-8 (at byte {})", e.valid_up_to()),
        )
    })?;
    if let Some(i) = s.find('\0') {
        return Err(invalid(
            what,
            format!("contains a NUL byte at offset {i} of {len}: is the length right?"),
        ));
    }
    Ok(s)
}

/// A key: at most `MAX_KEY_LEN` bytes are ever read, so a wild length is an error rather
/// than a read past the caller's buffer.
unsafe fn key_arg<'a>(ptr: *const c_char, len: usize) -> Result<&'a str, Error> {
    if len > MAX_KEY_LEN {
        return Err(invalid(
            "key",
            format!("is {len} bytes long; the maximum is {MAX_KEY_LEN}"),
        ));
    }
    str_arg("key", ptr, len)
}

/// Policy names are at most 128 bytes (the core validates the rest).
unsafe fn policy_name_arg<'a>(ptr: *const c_char, len: usize) -> Result<&'a str, Error> {
    if len >= SHARDLIMIT_POLICY_NAME_CAP {
        return Err(CoreError::UnknownPolicy(format!(
            "<{len} bytes: longer than any policy name>"
        ))
        .into());
    }
    str_arg("policy", ptr, len)
}

fn out_arg<T>(what: &str, p: *mut T) -> Result<*mut T, Error> {
    if p.is_null() {
        Err(invalid(what, "is NULL; an output pointer is required"))
    } else if !p.is_aligned() {
        Err(invalid(what, "is not aligned for its type"))
    } else {
        Ok(p)
    }
}

fn limiter_arg(p: *const shardlimit_limiter) -> Result<Limiter, Error> {
    Ok(live("limiter", p)?.limiter.clone())
}

/// The limiter of a call that blocks its thread: refused inside a completion callback,
/// which runs on the limiter's I/O thread, where waiting for Redis would wait for itself.
fn blocking_limiter_arg(p: *const shardlimit_limiter) -> Result<Limiter, Error> {
    if pending::in_callback() {
        return Err(invalid(
            "limiter",
            "a blocking call from a completion callback (it runs on the library's I/O \
             thread, which would wait for itself): start the call with its _start \
             function instead",
        ));
    }
    limiter_arg(p)
}

fn policy_arg(p: *const shardlimit_policy) -> Result<Policy, Error> {
    Ok(live("policy", p)?.policy.clone())
}

/// An optional clock: NULL is none.
fn clock_arg(p: *const shardlimit_clock) -> Result<Option<Arc<ManualClock>>, Error> {
    if p.is_null() {
        return Ok(None);
    }
    Ok(Some(live("clock", p)?.clock.clone()))
}

/// The algorithm of a `shardlimit_algorithm` value.
fn algorithm_from_c(a: u32) -> Result<shardlimit::Algorithm, Error> {
    use shardlimit::Algorithm as A;
    use shardlimit_algorithm::*;
    Ok(match a {
        a if a == SHARDLIMIT_ALGORITHM_FIXED_WINDOW as u32 => A::FixedWindow,
        a if a == SHARDLIMIT_ALGORITHM_SLIDING_WINDOW as u32 => A::SlidingWindow,
        a if a == SHARDLIMIT_ALGORITHM_SLIDING_LOG as u32 => A::SlidingLog,
        a if a == SHARDLIMIT_ALGORITHM_TOKEN_BUCKET as u32 => A::TokenBucket,
        a if a == SHARDLIMIT_ALGORITHM_LEAKY_BUCKET as u32 => A::LeakyBucket,
        a if a == SHARDLIMIT_ALGORITHM_CONCURRENCY as u32 => A::Concurrency,
        a => {
            return Err(invalid(
                "algorithm",
                format!("{a} is not a shardlimit_algorithm"),
            ))
        }
    })
}

fn decision_to_c(d: &Decision) -> Result<shardlimit_decision, Error> {
    let name = d.policy.as_bytes();
    if name.len() >= SHARDLIMIT_POLICY_NAME_CAP {
        return Err(CoreError::Internal(format!(
            "policy name of {} bytes does not fit shardlimit_decision.policy",
            name.len()
        ))
        .into());
    }
    let mut policy = [0 as c_char; SHARDLIMIT_POLICY_NAME_CAP];
    for (dst, src) in policy.iter_mut().zip(name) {
        *dst = *src as c_char;
    }
    let us = |t: Duration| u64::try_from(t.as_micros()).unwrap_or(u64::MAX);
    let mut quotas = [shardlimit_quota::default(); SHARDLIMIT_MAX_LIMITS];
    for (dst, q) in quotas.iter_mut().zip(&d.quotas) {
        *dst = shardlimit_quota {
            limit: q.limit,
            window_us: us(q.window),
        };
    }
    Ok(shardlimit_decision {
        allowed: d.allowed,
        limit: d.limit,
        remaining: d.remaining,
        reset_after_us: us(d.reset_after),
        has_retry_after: d.retry_after.is_some(),
        retry_after_us: d.retry_after.map(us).unwrap_or(0),
        shadow_denied: d.shadow_denied,
        delay_us: us(d.delay),
        window_us: us(d.window),
        source: source_to_c(d.source) as u32,
        has_shard: d.shard.is_some(),
        shard: d.shard.unwrap_or(0),
        policy_len: name.len(),
        policy,
        has_layer: d.layer.is_some(),
        layer: d.layer.map_or(0, |l| u32::try_from(l).unwrap_or(u32::MAX)),
        has_limit_index: d.limit_index.is_some(),
        limit_index: d.limit_index.map_or(0, |l| l as u32),
        quota_count: d.quotas.len().min(SHARDLIMIT_MAX_LIMITS) as u32,
        quotas,
    })
}

unsafe fn decision_from_c(p: *const shardlimit_decision) -> Result<Decision, Error> {
    if p.is_null() {
        return Err(invalid("decision", "is NULL"));
    }
    if !p.is_aligned() {
        return Err(invalid("decision", "is not aligned for its type"));
    }
    let d = &*p;
    if d.policy_len >= SHARDLIMIT_POLICY_NAME_CAP {
        return Err(invalid(
            "decision.policy_len",
            format!(
                "is {}; at most {} fit",
                d.policy_len,
                SHARDLIMIT_POLICY_NAME_CAP - 1
            ),
        ));
    }
    let policy = str_arg("decision.policy", d.policy.as_ptr(), d.policy_len)?;
    let source = source_from_c(d.source).ok_or_else(|| {
        invalid(
            "decision.source",
            format!("{} is not a shardlimit_source", d.source),
        )
    })?;
    let count = d.quota_count as usize;
    if count > SHARDLIMIT_MAX_LIMITS {
        return Err(invalid(
            "decision.quota_count",
            format!("is {count}; at most {SHARDLIMIT_MAX_LIMITS}"),
        ));
    }
    if d.has_limit_index && d.limit_index as usize >= count.max(1) {
        return Err(invalid(
            "decision.limit_index",
            format!("is {}; the decision has {count} quotas", d.limit_index),
        ));
    }
    let quotas = d.quotas[..count]
        .iter()
        .map(|q| shardlimit::Quota {
            limit: q.limit,
            window: Duration::from_micros(q.window_us),
        })
        .collect();
    Ok(Decision {
        allowed: d.allowed,
        limit: d.limit,
        remaining: d.remaining,
        reset_after: Duration::from_micros(d.reset_after_us),
        retry_after: d
            .has_retry_after
            .then(|| Duration::from_micros(d.retry_after_us)),
        delay: Duration::from_micros(d.delay_us),
        policy: Arc::from(policy),
        source,
        shard: d.has_shard.then_some(d.shard),
        window: Duration::from_micros(d.window_us),
        layer: d.has_layer.then_some(d.layer as usize),
        shadow_denied: d.shadow_denied,
        limit_index: d.has_limit_index.then_some(d.limit_index as usize),
        quotas,
    })
}

fn owned_string(s: String) -> shardlimit_string {
    let c = to_cstring(s);
    let len = c.as_bytes().len();
    let ptr = c.into_raw();
    STRINGS.write().insert(ptr as usize, ());
    shardlimit_string { ptr, len }
}

/// NUL bytes cannot cross as C strings; they never appear in the core's messages, but a
/// message quoting user input could carry one.
fn to_cstring(s: String) -> CString {
    CString::new(s).unwrap_or_else(|e| {
        let cleaned: Vec<u8> = e
            .into_vec()
            .into_iter()
            .map(|b| if b == 0 { b'?' } else { b })
            .collect();
        CString::new(cleaned).expect("NUL bytes were replaced")
    })
}

// ---------------------------------------------------------------------------------------
// The panic guard every fallible entry point runs in.

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

/// Runs `f`, turning its error or panic into a result code and, when `err` is not NULL, an
/// owned `shardlimit_error`. `f` writes its out-parameters only as its last step, after
/// everything that can fail.
/// The body of every blocking call of the shape (limiter, key, policy, cost) -> decision
/// (`shardlimit_check`, `_check_shadow`, `_charge`, `_refund`): the arguments checked, the
/// call made on the calling thread, the decision written to `*out`.
#[allow(clippy::too_many_arguments)]
unsafe fn decide_blocking(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    cost: u64,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
    call: fn(&Limiter, &str, &Policy, u64) -> shardlimit::Result<Decision>,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Blocking, limiter, key, key_len, policy)?;
        let out = out_arg("out", out)?;
        let d = decision_to_c(&call(&l, key, &p, cost)?)?;
        out.write(d);
        Ok(())
    })
}

unsafe fn guard(
    err: *mut *mut shardlimit_error,
    f: impl FnOnce() -> Result<(), Error>,
) -> shardlimit_result {
    let (code, message) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return SHARDLIMIT_OK,
        Ok(Err(e)) => (e.code, e.message),
        Err(payload) => (
            SHARDLIMIT_ERR_INTERNAL,
            format!(
                "internal error (a bug in shardlimit): panic: {}",
                panic_message(&*payload)
            ),
        ),
    };
    if !err.is_null() && err.is_aligned() {
        let reported = catch_unwind(AssertUnwindSafe(|| {
            register(shardlimit_error {
                code,
                message: to_cstring(message),
            })
        }));
        if let Ok(Ok(e)) = reported {
            *err = e;
        }
    }
    code
}

/// Runs an infallible function body, returning `fallback` if it panics.
fn quiet<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

// ---------------------------------------------------------------------------------------
// Version, result codes, errors

/// The library's version, e.g. `"0.1.0"`: static, never freed. Compare with
/// `SHARDLIMIT_VERSION` to detect a header/library mismatch. Thread-safe.
#[no_mangle]
pub extern "C" fn shardlimit_version() -> shardlimit_str {
    static V: LazyLock<CString> =
        LazyLock::new(|| CString::new(shardlimit::VERSION).expect("no NUL"));
    quiet(shardlimit_str::EMPTY, || shardlimit_str::from_cstring(&V))
}

/// The stable snake_case name of a result code: `"ok"`, `"config"`, `"invalid_argument"`,
/// `"connection"`, `"timeout"`, `"script"`, `"unknown_policy"`, `"io"`, `"internal"`,
/// `"unavailable"`, `"closed"`, `"cancelled"`, or `"unknown"` for a number that is not a
/// code. Static, never freed.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn shardlimit_result_name(code: u32) -> shardlimit_str {
    quiet(shardlimit_str::EMPTY, || {
        if code == SHARDLIMIT_OK as u32 {
            return shardlimit_str::from_static(c"ok");
        }
        if code == SHARDLIMIT_ERR_CLOSED as u32 {
            return shardlimit_str::from_static(c"closed");
        }
        if code == SHARDLIMIT_ERR_CANCELLED as u32 {
            return shardlimit_str::from_static(c"cancelled");
        }
        static NAMES: LazyLock<Vec<(u32, CString)>> = LazyLock::new(|| {
            ErrorKind::ALL
                .iter()
                .map(|k| (k.code(), CString::new(k.name()).expect("no NUL")))
                .collect()
        });
        NAMES
            .iter()
            .find(|(c, _)| *c == code)
            .map(|(_, n)| shardlimit_str::from_cstring(n))
            .unwrap_or(shardlimit_str::from_static(c"unknown"))
    })
}

/// True for the codes that mean "the backend (Redis) failed" rather than "the caller
/// made a mistake": CONNECTION, TIMEOUT, SCRIPT and UNAVAILABLE (`spec/errors.json`,
/// `"backend": true`). These are the failures a service may
/// choose to fail open on. Thread-safe.
#[no_mangle]
pub extern "C" fn shardlimit_result_is_backend(code: u32) -> bool {
    quiet(false, || {
        ErrorKind::ALL
            .iter()
            .any(|k| k.code() == code && k.is_backend())
    })
}

/// The code of the more general kind `code` is a special case of, or 0 when it has none
/// (or is not a code): `SHARDLIMIT_ERR_UNKNOWN_POLICY` is an `SHARDLIMIT_ERR_INVALID_ARGUMENT`
/// (the hierarchy of `spec/errors.json`), so a caller that handles invalid arguments
/// handles unknown policies too. Thread-safe.
#[no_mangle]
pub extern "C" fn shardlimit_result_parent(code: u32) -> u32 {
    quiet(0, || {
        ErrorKind::ALL
            .iter()
            .find(|k| k.code() == code)
            .and_then(|k| k.parent())
            .map_or(0, |p| p.code())
    })
}

/// The stable name of a `shardlimit_source` value: `"redis"`, `"memory"`, `"local"`,
/// `"fallback"`, `"block"`, or `"unknown"`. Static, never freed. Thread-safe.
#[no_mangle]
pub extern "C" fn shardlimit_source_name(source: u32) -> shardlimit_str {
    quiet(shardlimit_str::EMPTY, || {
        static NAMES: LazyLock<Vec<(u32, CString)>> = LazyLock::new(|| {
            (1..=16)
                .filter_map(source_from_c)
                .map(|s| {
                    (
                        source_to_c(s) as u32,
                        CString::new(s.name()).expect("no NUL"),
                    )
                })
                .collect()
        });
        NAMES
            .iter()
            .find(|(c, _)| *c == source)
            .map(|(_, n)| shardlimit_str::from_cstring(n))
            .unwrap_or(shardlimit_str::from_static(c"unknown"))
    })
}

/// The result code of an error. `SHARDLIMIT_ERR_CLOSED` when `err` was freed already,
/// `SHARDLIMIT_ERR_INVALID_ARGUMENT` when it is NULL or not an error. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_error_code(err: *const shardlimit_error) -> shardlimit_result {
    quiet(SHARDLIMIT_ERR_INVALID_ARGUMENT, || match live("err", err) {
        Ok(e) => e.code,
        Err(e) => e.code,
    })
}

/// The human-readable message of an error, naming the field or argument at fault (for
/// example `policies.login.window: expected a duration ...`). Borrowed from `err`: valid
/// until `shardlimit_error_free(err)`. An empty string when `err` is NULL or not a live
/// error. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_error_message(err: *const shardlimit_error) -> shardlimit_str {
    quiet(shardlimit_str::EMPTY, || {
        live("err", err).map_or(shardlimit_str::EMPTY, |e| {
            shardlimit_str::from_cstring(&e.message)
        })
    })
}

/// Frees an error from any function's `err` out-parameter. NULL, an error already freed
/// (a double free) or a pointer that is not an error is a no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_error_free(err: *mut shardlimit_error) {
    quiet((), || drop(unregister(err)))
}

/// Frees the bytes of an owned string and sets `s->ptr` to NULL and `s->len` to 0, so
/// freeing the same struct twice is harmless. `s == NULL`, `s->ptr == NULL`, or bytes
/// that are not (or no longer) an owned string of the library, is a no-op. A string is
/// real memory, not a handle: free it through one struct, not through copies of it.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_string_free(s: *mut shardlimit_string) {
    quiet((), || {
        if s.is_null() || !s.is_aligned() {
            return;
        }
        let ptr = (*s).ptr;
        if ptr.is_null() {
            return;
        }
        let ours = STRINGS.write().remove(&(ptr as usize)).is_some();
        if ours {
            drop(CString::from_raw(ptr));
        }
        (*s).ptr = std::ptr::null_mut();
        (*s).len = 0;
    })
}

// ---------------------------------------------------------------------------------------
// Clock

/// Creates a manual clock reading `start_us` microseconds (Unix time is a good start).
///
/// On success `*out` is a new clock the caller owns (free with `shardlimit_clock_free()`).
/// `err` may be NULL; otherwise on failure `*err` receives an error to free with
/// `shardlimit_error_free()`. Results: OK, INVALID_ARGUMENT (`out` is NULL), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_clock_new(
    start_us: u64,
    out: *mut *mut shardlimit_clock,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let out = out_arg("out", out)?;
        let c = register(shardlimit_clock {
            clock: ManualClock::new(start_us),
        })?;
        *out = c;
        Ok(())
    })
}

/// Sets the clock to `now_us` microseconds. Thread-safe.
/// Results: OK, INVALID_ARGUMENT (`clock` NULL or not live), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_clock_set_us(
    clock: *const shardlimit_clock,
    now_us: u64,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let c = clock_arg(clock)?.ok_or_else(|| invalid("clock", "is NULL"))?;
        c.set_us(now_us);
        Ok(())
    })
}

/// Moves the clock forward by `delta_us` microseconds. Thread-safe.
/// Results: OK, INVALID_ARGUMENT (`clock` NULL or not live), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_clock_advance_us(
    clock: *const shardlimit_clock,
    delta_us: u64,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let c = clock_arg(clock)?.ok_or_else(|| invalid("clock", "is NULL"))?;
        c.advance_us(delta_us);
        Ok(())
    })
}

/// Frees a clock. Limiters created with it keep working with it. NULL, or a clock
/// already freed, is a no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_clock_free(clock: *mut shardlimit_clock) {
    quiet((), || drop(unregister(clock)))
}

// ---------------------------------------------------------------------------------------
// Limiter

unsafe fn new_limiter(
    clock: *const shardlimit_clock,
    out: *mut *mut shardlimit_limiter,
    make: impl FnOnce() -> Result<Limiter, CoreError>,
) -> Result<(), Error> {
    let out = out_arg("out", out)?;
    let clock = clock_arg(clock)?;
    let mut limiter = make()?;
    if let Some(c) = clock {
        limiter = limiter.with_clock(c)?;
    }
    let l = shardlimit_limiter {
        limiter,
        fanout: Default::default(),
        logs: Default::default(),
    };
    logging::default_to_stderr(&l);
    *out = register(l)?;
    Ok(())
}

/// Creates a limiter from a JSON configuration (the format of `shard-config.json`):
/// `json_len` bytes of UTF-8 at `json` (the caller keeps ownership; it is not retained).
/// With `shards` the limiter decides on Redis, otherwise in memory. Does not connect:
/// connections are made on first use.
///
/// `clock` may be NULL (the normal case); otherwise decisions read time from it (tests).
/// On success `*out` is a new limiter the caller owns (free with
/// `shardlimit_limiter_free()`). `err` may be NULL; on failure `*err` receives an error
/// to free with `shardlimit_error_free()`.
/// Results: OK, CONFIG (the message names the field), INVALID_ARGUMENT, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_limiter_new_json(
    json: *const c_char,
    json_len: usize,
    clock: *const shardlimit_clock,
    out: *mut *mut shardlimit_limiter,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let text = bytes_arg("json", json, json_len)?;
        let text = std::str::from_utf8(text).map_err(|e| CoreError::Config {
            field: "config".to_string(),
            message: format!("not valid UTF-8 (at byte {})", e.valid_up_to()),
        })?;
        new_limiter(clock, out, || Limiter::from_json(text))
    })
}

/// Creates a limiter from a JSON configuration file at the path given by `path_len`
/// bytes at `path` (not NUL-terminated; not retained).
///
/// `clock` may be NULL. On success `*out` is a new limiter the caller owns (free with
/// `shardlimit_limiter_free()`). `err` may be NULL.
/// Results: OK, IO (cannot read the file), CONFIG, INVALID_ARGUMENT, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_limiter_new_file(
    path: *const c_char,
    path_len: usize,
    clock: *const shardlimit_clock,
    out: *mut *mut shardlimit_limiter,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let bytes = bytes_arg("path", path, path_len)?;
        if bytes.is_empty() {
            return Err(invalid("path", "is empty"));
        }
        if bytes.contains(&0) {
            return Err(invalid("path", "contains a NUL byte: is the length right?"));
        }
        #[cfg(unix)]
        let p = {
            use std::os::unix::ffi::OsStrExt;
            std::path::PathBuf::from(std::ffi::OsStr::from_bytes(bytes))
        };
        #[cfg(not(unix))]
        let p = std::path::PathBuf::from(str_arg("path", path, path_len)?);
        new_limiter(clock, out, || Limiter::from_config_file(&p))
    })
}

/// Creates a limiter on the in-memory engine with no named policies (use
/// `shardlimit_policy_new()` for its policies). Decisions are local to this process.
///
/// `clock` may be NULL. On success `*out` is a new limiter the caller owns (free with
/// `shardlimit_limiter_free()`). `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_limiter_new_memory(
    clock: *const shardlimit_clock,
    out: *mut *mut shardlimit_limiter,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || new_limiter(clock, out, || Ok(Limiter::memory())))
}

/// Creates a limiter from `$SHARDLIMIT_CONFIG` (a file path, or inline JSON starting
/// with `{`); the in-memory engine with no policies when it is unset or empty.
///
/// `clock` may be NULL. On success `*out` is a new limiter the caller owns (free with
/// `shardlimit_limiter_free()`). `err` may be NULL.
/// Results: OK, CONFIG, IO, INVALID_ARGUMENT, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_limiter_new_env(
    clock: *const shardlimit_clock,
    out: *mut *mut shardlimit_limiter,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || new_limiter(clock, out, Limiter::from_env))
}

/// Closes and frees a limiter. Safe while other threads use it: calls already in flight
/// finish normally with this limiter (their decisions are this limiter's), every later
/// call with the handle returns `SHARDLIMIT_ERR_CLOSED`; the runtime and connections are
/// shut down when the last call in flight returns. The handle is never given to another
/// limiter, so a limiter created right after (a config reload) can never answer for it.
/// Policies and leases obtained from it stay valid objects and must be freed separately.
/// NULL, a limiter already freed, or a pointer that is not a limiter, is a no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_limiter_free(limiter: *mut shardlimit_limiter) {
    quiet((), || drop(unregister(limiter)))
}

// ---------------------------------------------------------------------------------------
// Policies

/// Looks up the policy named by `name_len` bytes at `name` in the limiter's configuration.
///
/// On success `*out` is a new policy object the caller owns (free with
/// `shardlimit_policy_free()`); it stays valid after the limiter is freed. `err` may be
/// NULL. Thread-safe.
/// Results: OK, UNKNOWN_POLICY, INVALID_ARGUMENT, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_limiter_policy(
    limiter: *const shardlimit_limiter,
    name: *const c_char,
    name_len: usize,
    out: *mut *mut shardlimit_policy,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        let name = policy_name_arg(name, name_len)?;
        let out = out_arg("out", out)?;
        let policy = l.policy(name)?;
        *out = new_policy(policy)?;
        Ok(())
    })
}

/// Creates an ad-hoc policy named by `name_len` bytes at `name` (letters, digits,
/// `_ - .`, at most 128 bytes; it appears in Redis key names and headers) enforcing
/// `*limit` (read, not retained).
///
/// On success `*out` is a new policy the caller owns (free with
/// `shardlimit_policy_free()`). `err` may be NULL. Thread-safe.
/// Results: OK, CONFIG (a parameter is out of range; the message names it),
/// INVALID_ARGUMENT (NULL `limit` or `out`, unknown algorithm or on_error), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_policy_new(
    name: *const c_char,
    name_len: usize,
    limit: *const shardlimit_limit,
    out: *mut *mut shardlimit_policy,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let name = str_arg("name", name, name_len)?;
        if limit.is_null() || !limit.is_aligned() {
            return Err(invalid("limit", "is NULL or misaligned"));
        }
        let out = out_arg("out", out)?;
        let l = &*limit;
        let period = Duration::from_millis(l.period_ms);
        use shardlimit_algorithm::*;
        let lim = match l.algorithm {
            a if a == SHARDLIMIT_ALGORITHM_FIXED_WINDOW as u32 => {
                Limit::fixed_window(l.limit, period)
            }
            a if a == SHARDLIMIT_ALGORITHM_SLIDING_WINDOW as u32 => {
                Limit::sliding_window(l.limit, period)
            }
            a if a == SHARDLIMIT_ALGORITHM_SLIDING_LOG as u32 => {
                Limit::sliding_log(l.limit, period)
            }
            a if a == SHARDLIMIT_ALGORITHM_TOKEN_BUCKET as u32 => {
                Limit::token_bucket(l.limit, l.rate_per_sec)
            }
            a if a == SHARDLIMIT_ALGORITHM_LEAKY_BUCKET as u32 => {
                Limit::leaky_bucket(l.limit, l.rate_per_sec)
            }
            a if a == SHARDLIMIT_ALGORITHM_CONCURRENCY as u32 => {
                Limit::concurrency(l.limit, period)
            }
            a => {
                return Err(invalid(
                    "limit.algorithm",
                    format!("{a} is not a shardlimit_algorithm"),
                ))
            }
        };
        use shardlimit_on_error::*;
        let on_error = match l.on_error {
            e if e == SHARDLIMIT_ON_ERROR_DEFAULT as u32 => None,
            e if e == SHARDLIMIT_ON_ERROR_OPEN as u32 => Some(OnError::Open),
            e if e == SHARDLIMIT_ON_ERROR_CLOSED as u32 => Some(OnError::Closed),
            e if e == SHARDLIMIT_ON_ERROR_LOCAL as u32 => Some(OnError::Local),
            e if e == SHARDLIMIT_ON_ERROR_ERROR as u32 => Some(OnError::Error),
            e => {
                return Err(invalid(
                    "limit.on_error",
                    format!("{e} is not a shardlimit_on_error"),
                ))
            }
        };
        let mut policy = Policy::new(name, lim)?;
        if let Some(mode) = on_error {
            policy = policy.with_on_error(mode);
        }
        *out = new_policy(policy)?;
        Ok(())
    })
}

/// Creates a policy from a rate string: `rate_len` bytes of UTF-8 at `rate` in the
/// `limits` package's syntax (`"5/minute"`, `"10/second; 1000/day"`: several limits make
/// a multi-limit policy, checked together in one call), each limit of `algorithm` (a
/// `shardlimit_algorithm`, not CONCURRENCY). Named by `name_len` bytes at `name` (the rules
/// of `shardlimit_policy_new()`), or, when `name_len` is 0, after its limits.
///
/// On success `*out` is a new policy the caller owns (free with
/// `shardlimit_policy_free()`). `err` may be NULL. Thread-safe.
/// Results: OK, INVALID_ARGUMENT (a bad rate string: the message quotes the bad part;
/// NULL `out`, unknown algorithm), CONFIG (a limit out of range, or a bad name), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_policy_new_rate(
    name: *const c_char,
    name_len: usize,
    rate: *const c_char,
    rate_len: usize,
    algorithm: u32,
    out: *mut *mut shardlimit_policy,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let rate = str_arg("rate", rate, rate_len)?;
        let out = out_arg("out", out)?;
        let algorithm = algorithm_from_c(algorithm)?;
        let policy = if name_len == 0 {
            Policy::from_rate(rate, algorithm)?
        } else {
            let name = str_arg("name", name, name_len)?;
            let limits = shardlimit::parse_rate_as(rate, algorithm)?;
            Policy::multi(name, limits)?
        };
        *out = new_policy(policy)?;
        Ok(())
    })
}

/// Looks up the policy named by `name_len` bytes at `name` as plan `plan_len` bytes at
/// `plan` of the limiter's configuration has it: the plan's limits under the policy's
/// name (same keys and headers), or the policy itself when the plan does not list it.
/// Check under a plan by passing `*out` to `shardlimit_check()`.
///
/// On success `*out` is a new policy the caller owns (free with
/// `shardlimit_policy_free()`). `err` may be NULL. Thread-safe.
/// Results: OK, UNKNOWN_POLICY, INVALID_ARGUMENT (no such plan), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_plan_policy(
    limiter: *const shardlimit_limiter,
    plan: *const c_char,
    plan_len: usize,
    name: *const c_char,
    name_len: usize,
    out: *mut *mut shardlimit_policy,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        let plan = str_arg("plan", plan, plan_len)?;
        let name = policy_name_arg(name, name_len)?;
        let out = out_arg("out", out)?;
        *out = new_policy(l.plan_policy(plan, name)?)?;
        Ok(())
    })
}

/// The policy's name. Borrowed from `policy`: valid until `shardlimit_policy_free()`.
/// An empty string when `policy` is NULL or not live. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_policy_name(
    policy: *const shardlimit_policy,
) -> shardlimit_str {
    quiet(shardlimit_str::EMPTY, || {
        live("policy", policy).map_or(shardlimit_str::EMPTY, |p| {
            shardlimit_str::from_cstring(&p.name)
        })
    })
}

/// Frees a policy object. NULL, or a policy already freed, is a no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_policy_free(policy: *mut shardlimit_policy) {
    quiet((), || drop(unregister(policy)))
}

// ---------------------------------------------------------------------------------------
// Checks

/// Checks `cost` units (≥ 1) of `policy` for the key given by `key_len` bytes of UTF-8 at
/// `key` (1 to 1024 bytes, no NUL; not retained). A denied check consumes nothing and is
/// not an error: it returns OK with `out->allowed == false`. A cost larger than the limit
/// is denied with `has_retry_after == false`. On a concurrency policy this takes a lease
/// that frees itself after the policy's lease TTL (use `shardlimit_acquire()` to release
/// early).
///
/// Blocks the calling thread for at most the configured deadline (`timeout_ms`).
/// Thread-safe. On success `*out` (caller-allocated) is filled; nothing is allocated.
/// `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_check(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    cost: u64,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    decide_blocking(
        limiter,
        key,
        key_len,
        policy,
        cost,
        out,
        err,
        Limiter::check_blocking,
    )
}

/// `shardlimit_check()` with the policy named by `policy_len` bytes at `policy` in the
/// limiter's configuration.
///
/// Blocks the calling thread for at most the configured deadline. Thread-safe. On success
/// `*out` (caller-allocated) is filled; nothing is allocated. `err` may be NULL.
/// Results: OK, UNKNOWN_POLICY, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE,
/// INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_check_named(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const c_char,
    policy_len: usize,
    cost: u64,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, policy) =
            named_args(Form::Blocking, limiter, key, key_len, policy, policy_len)?;
        let out = out_arg("out", out)?;
        let d = decision_to_c(&l.check_by_name_blocking(key, policy, cost)?)?;
        out.write(d);
        Ok(())
    })
}

/// The state of `key` under `policy` without consuming anything: `out->allowed` says
/// whether a check of one unit would pass now, `out->remaining` how many units are free.
///
/// Blocks for at most the configured deadline. Thread-safe. On success `*out` is filled.
/// `err` may be NULL. Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT,
/// UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_peek(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Blocking, limiter, key, key_len, policy)?;
        let out = out_arg("out", out)?;
        let d = decision_to_c(&l.peek_blocking(key, &p)?)?;
        out.write(d);
        Ok(())
    })
}

/// Acquires `units` (≥ 1) of a concurrency policy for `key`.
///
/// On success `*out` is filled and `*out_lease` is set: to a new lease the caller owns
/// when `out->allowed` (give it back with `shardlimit_release()`, then free it with
/// `shardlimit_lease_free()`), or to NULL when denied. Blocks for at most the configured
/// deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_acquire(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    units: u64,
    out: *mut shardlimit_decision,
    out_lease: *mut *mut shardlimit_lease,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Blocking, limiter, key, key_len, policy)?;
        let out = out_arg("out", out)?;
        let out_lease = out_arg("out_lease", out_lease)?;
        let (d, lease) = l.acquire_blocking(key, &p, units)?;
        let d = decision_to_c(&d)?;
        let lease = match lease {
            Some(lease) => register(shardlimit_lease { lease, policy: p })?,
            None => std::ptr::null_mut(),
        };
        out.write(d);
        *out_lease = lease;
        Ok(())
    })
}

/// Gives back a lease from `shardlimit_acquire()`. On success `*out_released` is true when
/// the lease was still held, false when it had already been released or had expired. The
/// lease object stays owned by the caller (free it with `shardlimit_lease_free()`).
/// `out_released` may be NULL. Blocks for at most the configured deadline. Thread-safe.
/// `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_release(
    limiter: *const shardlimit_limiter,
    lease: *const shardlimit_lease,
    out_released: *mut bool,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = blocking_limiter_arg(limiter)?;
        let held = live("lease", lease)?;
        let (lease, policy) = (held.lease.clone(), held.policy.clone());
        if !out_released.is_null() && !out_released.is_aligned() {
            return Err(invalid("out_released", "is not aligned for its type"));
        }
        let me = l.clone();
        let released = l.block_on(async move { me.release_with(&policy, &lease).await })?;
        if !out_released.is_null() {
            *out_released = released;
        }
        Ok(())
    })
}

/// Frees a lease object without releasing the lease (it expires after the policy's lease
/// TTL unless `shardlimit_release()` was called). NULL, or a lease already freed, is a
/// no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_lease_free(lease: *mut shardlimit_lease) {
    quiet((), || drop(unregister(lease)))
}

/// Connects to every shard and loads the scripts within `timeout_ms` (its own budget, not
/// a call's deadline), so that the first calls after start-up do not spend their deadline
/// on a TCP connect. Blocks for at most `timeout_ms`. Nothing to do in memory. Thread-safe.
/// `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT (a zero timeout), CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE,
/// CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_connect(
    limiter: *const shardlimit_limiter,
    timeout_ms: u64,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = blocking_limiter_arg(limiter)?;
        Ok(l.connect_blocking(std::time::Duration::from_millis(timeout_ms))?)
    })
}

/// Forgets `key`'s state under `policy`: its full budget is back.
/// Blocks for at most the configured deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_reset(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Blocking, limiter, key, key_len, policy)?;
        Ok(l.reset_blocking(key, &p)?)
    })
}

/// The most layers read from the caller's array; the core's own limit (64) is the one
/// that applies, this only bounds what a wrong `count` can make the library read.
const MAX_LAYERS_READ: usize = 1024;

/// The layers of a layered check, read from the caller's array (borrowed for the call).
unsafe fn layers_arg(
    l: &Limiter,
    layers: *const shardlimit_layer,
    count: usize,
) -> Result<Vec<Layer>, Error> {
    if count > MAX_LAYERS_READ {
        return Err(invalid(
            "count",
            format!("{count} layers; at most 64 are allowed"),
        ));
    }
    if count > 0 && (layers.is_null() || !layers.is_aligned()) {
        return Err(invalid("layers", "is NULL or misaligned"));
    }
    let raw: &[shardlimit_layer] = if count == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(layers, count)
    };
    let mut built = Vec::with_capacity(raw.len());
    for (i, x) in raw.iter().enumerate() {
        let key = key_arg(x.key, x.key_len)
            .map_err(|e| invalid(&format!("layers[{i}].key"), e.to_string()))?;
        let policy = if x.policy.is_null() {
            l.policy(policy_name_arg(x.policy_name, x.policy_name_len)?)?
        } else {
            policy_arg(x.policy)?
        };
        built.push(Layer::new(key, &policy, x.cost));
    }
    Ok(built)
}

/// A layered check: `count` layers (IP, API key, tenant, global...) checked at once.
/// Allowed only if every layer allows; when any layer denies, no layer consumes. The
/// decision describes the layer that denied (the longest retry) or, when all allowed, the
/// one with the fewest units left; `out->layer` is its index. At most 64 layers.
///
/// `layers` (and everything it points to) is borrowed for the call only. Blocks for at
/// most the configured deadline. Thread-safe. On success `*out` is filled; nothing is
/// allocated. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, UNKNOWN_POLICY, CONNECTION, TIMEOUT, SCRIPT,
/// UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_check_all(
    limiter: *const shardlimit_limiter,
    layers: *const shardlimit_layer,
    count: usize,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = blocking_limiter_arg(limiter)?;
        let built = layers_arg(&l, layers, count)?;
        let out = out_arg("out", out)?;
        let d = decision_to_c(&l.check_all_blocking(&built)?)?;
        out.write(d);
        Ok(())
    })
}

/// Puts `key` on the block list for `ttl_ms` milliseconds (0: until unblocked), with a
/// `reason` (`reason_len` bytes of UTF-8, at most 1024; may be NULL with length 0). Every
/// limiter of every language sharing the shards sees it: checks of a blocked key are
/// denied with `source == SHARDLIMIT_SOURCE_BLOCK`.
///
/// Blocks for at most the configured deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_block(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    ttl_ms: u64,
    reason: *const c_char,
    reason_len: usize,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = blocking_limiter_arg(limiter)?;
        let key = key_arg(key, key_len)?;
        if reason_len > 1024 {
            return Err(invalid("reason", "at most 1024 bytes"));
        }
        let reason = str_arg("reason", reason, reason_len)?;
        let ttl = (ttl_ms > 0).then(|| Duration::from_millis(ttl_ms));
        Ok(l.block_blocking(key, ttl, reason)?)
    })
}

/// Removes `key` from the block list. On success `*out_was_blocked` (may be NULL) says
/// whether it was blocked. Other processes notice within about a second (their block
/// cache). Blocks for at most the configured deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_unblock(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    out_was_blocked: *mut bool,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = blocking_limiter_arg(limiter)?;
        let key = key_arg(key, key_len)?;
        if !out_was_blocked.is_null() && !out_was_blocked.is_aligned() {
            return Err(invalid("out_was_blocked", "is not aligned for its type"));
        }
        let was = l.unblock_blocking(key)?;
        if !out_was_blocked.is_null() {
            *out_was_blocked = was;
        }
        Ok(())
    })
}

/// The block-list entry of `key`. On success `*out` is filled; when `out->blocked`,
/// `out->reason` is an owned string the caller frees with `shardlimit_string_free()`.
/// Blocks for at most the configured deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_blocked(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    out: *mut shardlimit_block_info,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = blocking_limiter_arg(limiter)?;
        let key = key_arg(key, key_len)?;
        let out = out_arg("out", out)?;
        let info = block_info_to_c(l.blocked_blocking(key)?);
        out.write(info);
        Ok(())
    })
}

fn block_info_to_c(info: Option<BlockInfo>) -> shardlimit_block_info {
    match info {
        None => shardlimit_block_info {
            blocked: false,
            permanent: false,
            remaining_us: 0,
            reason: shardlimit_string {
                ptr: std::ptr::null_mut(),
                len: 0,
            },
        },
        Some(BlockInfo { reason, remaining }) => shardlimit_block_info {
            blocked: true,
            permanent: remaining.is_none(),
            remaining_us: remaining.map_or(0, |r| u64::try_from(r.as_micros()).unwrap_or(u64::MAX)),
            reason: owned_string(reason),
        },
    }
}

/// The client's IP address for rate limiting: the peer itself unless it is one of the
/// trusted proxies; then the `X-Forwarded-For` entries from the right, skipping trusted
/// proxies, up to the first untrusted one (entries a client prepended are never
/// reached). `peer` is the socket's remote address with or without a port (`1.2.3.4`,
/// `1.2.3.4:5678`, `[::1]:80`); `xff` the raw header (several headers joined with `,`), or
/// NULL when absent; `trusted` an array of `trusted_count` CIDRs (`10.0.0.0/8`, a bare
/// address), may be NULL when the count is 0. All borrowed for the call only.
///
/// On success `*out` is the address as text, an owned string the caller frees with
/// `shardlimit_string_free()`. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT (a peer that is not an address, a bad CIDR), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_client_ip(
    peer: *const c_char,
    peer_len: usize,
    xff: *const c_char,
    xff_len: usize,
    trusted: *const shardlimit_str,
    trusted_count: usize,
    out: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (peer, xff, cidrs) =
            client_ip_args(peer, peer_len, xff, xff_len, trusted, trusted_count)?;
        let out = out_arg("out", out)?;
        let ip = shardlimit::client_ip(peer, xff, &cidrs)?;
        out.write(owned_string(ip.to_string()));
        Ok(())
    })
}

/// The rate-limit key of the client that `shardlimit_client_ip()` finds (same arguments):
/// an IPv4 address (or an IPv4-mapped IPv6 one) as the IPv4 address, an IPv6 address as its
/// network of `ipv6_prefix` bits (`2001:db8:1:2::/64`; 1 to 128, 64 in every binding's
/// default), so that one client cannot get a fresh budget per address of its network. The
/// rule lives in the core: every language gives the same key.
///
/// On success `*out` is the key, an owned string the caller frees with
/// `shardlimit_string_free()`. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT (a peer that is not an address, a bad CIDR, a prefix
/// outside 1..=128), INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_client_ip_key(
    peer: *const c_char,
    peer_len: usize,
    xff: *const c_char,
    xff_len: usize,
    trusted: *const shardlimit_str,
    trusted_count: usize,
    ipv6_prefix: u8,
    out: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (peer, xff, cidrs) =
            client_ip_args(peer, peer_len, xff, xff_len, trusted, trusted_count)?;
        let out = out_arg("out", out)?;
        let key = shardlimit::client_ip_key(peer, xff, &cidrs, ipv6_prefix)?;
        out.write(owned_string(key));
        Ok(())
    })
}

/// The borrowed arguments of `shardlimit_client_ip()` and `shardlimit_client_ip_key()`.
unsafe fn client_ip_args<'a>(
    peer: *const c_char,
    peer_len: usize,
    xff: *const c_char,
    xff_len: usize,
    trusted: *const shardlimit_str,
    trusted_count: usize,
) -> Result<(&'a str, Option<&'a str>, Vec<&'a str>), Error> {
    let peer = str_arg("peer", peer, peer_len)?;
    let xff = if xff.is_null() {
        None
    } else {
        Some(str_arg("xff", xff, xff_len)?)
    };
    if trusted_count > MAX_LAYERS_READ {
        return Err(invalid(
            "trusted_count",
            format!("{trusted_count} is implausible"),
        ));
    }
    if trusted_count > 0 && (trusted.is_null() || !trusted.is_aligned()) {
        return Err(invalid("trusted", "is NULL or misaligned"));
    }
    let raw: &[shardlimit_str] = if trusted_count == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(trusted, trusted_count)
    };
    let cidrs = raw
        .iter()
        .enumerate()
        .map(|(i, s)| str_arg(&format!("trusted[{i}]"), s.ptr, s.len))
        .collect::<Result<Vec<&str>, Error>>()?;
    Ok((peer, xff, cidrs))
}

// ---------------------------------------------------------------------------------------
// Rendering a decision

/// Renders the standard rate-limit response headers of `*decision` (as filled by a check),
/// in a stable order: `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`,
/// `RateLimit-Policy`, `RateLimit`, and `Retry-After` when denied and a retry can succeed.
///
/// On success `*out` is a new header list the caller owns: read it with
/// `shardlimit_headers_len()` / `shardlimit_headers_get()`, free it with
/// `shardlimit_headers_free()`. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT (NULL pointers, or a decision struct not filled by a
/// check), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_decision_headers(
    decision: *const shardlimit_decision,
    out: *mut *mut shardlimit_headers,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let d = decision_from_c(decision)?;
        let out = out_arg("out", out)?;
        let items = d
            .headers()
            .into_iter()
            .map(|(k, v)| (to_cstring(k.to_string()), to_cstring(v)))
            .collect();
        *out = register(shardlimit_headers { items })?;
        Ok(())
    })
}

/// The number of headers in `headers`; 0 when it is NULL or not live. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_headers_len(headers: *const shardlimit_headers) -> usize {
    quiet(0, || live("headers", headers).map_or(0, |h| h.items.len()))
}

/// The name and value of header number `index` (from 0). On success `*out_name` and
/// `*out_value` are set to strings borrowed from `headers`, valid until
/// `shardlimit_headers_free()`. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT (NULL or freed `headers`, NULL outputs, index out of
/// range), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_headers_get(
    headers: *const shardlimit_headers,
    index: usize,
    out_name: *mut shardlimit_str,
    out_value: *mut shardlimit_str,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let out_name = out_arg("out_name", out_name)?;
        let out_value = out_arg("out_value", out_value)?;
        let h = live("headers", headers)?;
        let (name, value) = h
            .items
            .get(index)
            .map(|(k, v)| {
                (
                    shardlimit_str::from_cstring(k),
                    shardlimit_str::from_cstring(v),
                )
            })
            .ok_or_else(|| invalid("index", format!("{index} is out of range")))?;
        *out_name = name;
        *out_value = value;
        Ok(())
    })
}

/// Frees a header list. NULL, or a list already freed, is a no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_headers_free(headers: *mut shardlimit_headers) {
    quiet((), || drop(unregister(headers)))
}

/// Renders the JSON body of a 429 response for `*decision`:
/// `{"error":"rate_limited","policy":...,"limit":...,"remaining":...,"retry_after":...,
/// "message":...}` with `retry_after` in whole seconds (null when the request can never
/// fit).
///
/// On success `*out` is a new string the caller owns; free it with
/// `shardlimit_string_free()`. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_decision_body(
    decision: *const shardlimit_decision,
    out: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let d = decision_from_c(decision)?;
        let out = out_arg("out", out)?;
        out.write(owned_string(d.body().to_string()));
        Ok(())
    })
}

/// Renders `*decision` as one JSON object with durations in milliseconds (the form the
/// CLI prints and the shared test vectors use).
///
/// On success `*out` is a new string the caller owns; free it with
/// `shardlimit_string_free()`. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_decision_to_json(
    decision: *const shardlimit_decision,
    out: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let d = decision_from_c(decision)?;
        let out = out_arg("out", out)?;
        out.write(owned_string(d.to_json().to_string()));
        Ok(())
    })
}

mod admin;
mod args;
mod events;
mod host;
mod logging;
mod notify;
mod overrides;
mod pending;
mod queue;
pub use admin::*;
use args::{keyed_args, named_args, Form};
pub use events::*;
pub use logging::*;
pub use notify::*;
pub use overrides::*;
pub use pending::*;

#[cfg(test)]
mod tests;
