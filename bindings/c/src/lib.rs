//! The C ABI of shardlimit. `include/shardlimit.h` is generated from this crate's sources by
//! cbindgen (`bindings/c/cbindgen.toml`), so their `///` comments are the C documentation.
//! One module per object family, as rustls-ffi does: `limiter`, `policy`, `check`, `lease`,
//! `block`, `overrides`, `admin`, `events`, `logging`, `pending` (calls that complete later),
//! `host` (the host transport), `decision` (the decision struct and its rendering), `error`,
//! `strings`, `clock`; `handles` is the table behind every handle, `args` the conversion of
//! arguments, and `ptr` holds every read and write through a pointer the caller passed
//! (`unsafe_op_in_unsafe_fn` is denied: the few `unsafe` blocks are there, each with its
//! SAFETY note).
//!
//! The binding only converts types and errors; every decision is made by the core crate.
//! Rules kept by every function (see the header's preamble for the user-facing version):
//!
//! - it runs inside [`std::panic::catch_unwind`]: a panic becomes `SHARDLIMIT_ERR_INTERNAL`;
//! - out-parameters are written only when it returns `SHARDLIMIT_OK`;
//! - errors come back as an owned `shardlimit_error` through the last (nullable) argument,
//!   never through thread-local state, because Go moves goroutines between OS threads;
//! - every object it hands out is a handle: a token, never reused, naming a reference-
//!   counted object in a table of live objects (`handles.rs`), so a NULL, foreign or
//!   wrong-type pointer is INVALID_ARGUMENT, a freed handle is CLOSED (also while another
//!   thread frees it), and `_free` of any of them is a no-op; none is ever dereferenced.

#![deny(unsafe_op_in_unsafe_fn)]
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
// cbindgen cannot export string constants; `tests::errors::version_matches_the_core_and_the_header`
// keeps it, these numbers and the core's version equal.

/// The major part of `SHARDLIMIT_VERSION`.
pub const SHARDLIMIT_VERSION_MAJOR: u32 = 0;
/// The minor part of `SHARDLIMIT_VERSION`.
pub const SHARDLIMIT_VERSION_MINOR: u32 = 1;
/// The patch part of `SHARDLIMIT_VERSION`.
pub const SHARDLIMIT_VERSION_PATCH: u32 = 0;

/// The library's version, e.g. `"0.1.0"`: static, never freed. Compare with
/// `SHARDLIMIT_VERSION` to detect a header/library mismatch. Thread-safe.
#[no_mangle]
pub extern "C" fn shardlimit_version() -> shardlimit_str {
    static V: LazyLock<CString> =
        LazyLock::new(|| CString::new(shardlimit::VERSION).expect("no NUL"));
    quiet(shardlimit_str::EMPTY, || shardlimit_str::from_cstring(&V))
}

mod admin;
mod args;
mod block;
mod check;
mod client_ip;
mod clock;
mod decision;
mod error;
mod events;
mod handles;
mod host;
mod lease;
mod limiter;
mod logging;
mod notify;
mod overrides;
mod pending;
mod policy;
mod ptr;
mod queue;
mod strings;
pub use admin::*;
use args::*;
pub use block::*;
pub use check::*;
pub use client_ip::*;
pub use clock::*;
pub use decision::*;
pub use error::*;
pub use events::*;
use handles::*;
pub use lease::*;
pub use limiter::*;
pub use logging::*;
pub use notify::*;
pub use overrides::*;
pub use pending::*;
pub use policy::*;
use ptr::*;
use shardlimit_result::*;
use shardlimit_source::*;
pub use strings::*;

#[cfg(test)]
mod tests;
