//! The table of live objects behind every handle given to C.

use super::*;

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
pub(crate) enum Tag {
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
    pub(crate) const ALL: [Tag; 11] = [
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
    pub(crate) fn c_name(self) -> &'static str {
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
pub(crate) trait Object: Any + Send + Sync {
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

pub(crate) const HANDLE_BASE: usize = 1 << (usize::BITS - 1);
pub(crate) const TAG_BITS: u32 = 4;
/// The last id a token can carry: 2^59 on 64-bit platforms, more than a process can use.
pub(crate) const MAX_ID: usize = (usize::MAX - HANDLE_BASE) >> TAG_BITS;

pub(crate) type Shared = Arc<dyn Any + Send + Sync>;

pub(crate) struct Handles {
    /// The id of the next handle; ids below it were issued, ids at or above were not.
    pub(crate) next: usize,
    /// Live objects by token. A B-tree rather than a hash map: its nodes are pointed to at
    /// their start, so leak checkers see objects never freed as reachable, not "possibly
    /// lost".
    pub(crate) live: BTreeMap<usize, Shared>,
}

pub(crate) static HANDLES: RwLock<Handles> = RwLock::new(Handles {
    next: 1,
    live: BTreeMap::new(),
});

/// Hands `v` to C: a new token, never issued before.
pub(crate) fn register<T: Object>(v: T) -> Result<*mut T, Error> {
    register_arc(Arc::new(v))
}

/// Hands an object the library keeps its own reference to (a pending call) to C.
pub(crate) fn register_arc<T: Object>(obj: Arc<T>) -> Result<*mut T, Error> {
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
pub(crate) enum Found<T> {
    Live(Arc<T>),
    /// A handle of this type that was freed.
    Closed,
    /// A live or freed handle of another type.
    OtherType(Tag),
    /// NULL, or not a value this library ever returned.
    Foreign,
}

pub(crate) fn find<T: Object>(p: *const T) -> Found<T> {
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
pub(crate) fn live<T: Object>(what: &str, p: *const T) -> Result<Arc<T>, Error> {
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
pub(crate) fn unregister<T: Object>(p: *mut T) -> Option<Shared> {
    if !matches!(find(p.cast_const()), Found::Live(_)) {
        return None;
    }
    HANDLES.write().live.remove(&(p as usize))
}
