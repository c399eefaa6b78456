//! # shardlimit
//!
//! Distributed rate limiting as a library: the algorithms, the Redis scripts and the
//! client-side shard routing that every shardlimit binding (C, C++, Go, Python, Node) shares.
//!
//! ```
//! use shardlimit::{Limiter, Limit, Policy};
//! use std::time::Duration;
//!
//! let limiter = Limiter::memory();
//! let login = Policy::new("login", Limit::fixed_window(5, Duration::from_secs(60))).unwrap();
//! let d = limiter.check_blocking("user:42", &login, 1).unwrap();
//! assert!(d.allowed);
//! assert_eq!(d.remaining, 4);
//! ```
//!
//! With a config that lists Redis `shards`, the same calls run on Redis, one round trip
//! per decision.
//!
//! The contracts (model, time, routing, failure, trust), the map of the modules below and
//! the checklist for adding an operation end to end are in `docs/DESIGN.md` at the root of
//! the repository: `limiter/` is the public API, `engine/` decides (in memory or with the
//! scripts on Redis, `engine/redis/protocol.rs` describing every script call), `transport/`
//! moves the bytes, `policy/`, `config/` and `time/` hold what a check is made against.

pub mod config;
mod decision;
mod engine;
mod error;
pub mod events;
mod ip;
mod key;
mod limiter;
pub mod log;
pub mod metrics;
mod policy;
mod rate;
pub mod routing;
mod time;
mod tls;
mod transport;
mod wire;

pub use engine::redis::{keys, scripts};
pub use time::clock;

pub use clock::{Clock, ManualClock, MonotonicClock};
pub use config::{Config, ReloadReport, ShardConfig};
pub use decision::{Decision, PolicyName, Quota, Source};
pub use error::{Error, ErrorKind, Result};
pub use events::{CircuitState, Event, Subscriber};
pub use ip::{
    client_ip, client_ip_key, client_ip_with, ip_key, parse_peer, Cidr, TrustedProxies,
    DEFAULT_IPV6_PREFIX,
};
pub use key::MAX_KEY_LEN;
pub use limiter::ShadowReport;
pub use limiter::{
    latency_scale, BlockInfo, ConfigWatcher, Layer, Lease, Limiter, Reservation, ScaleHook,
    BLOCK_CACHE_TTL, CLOSED_RETRY_AFTER,
};
pub use limiter::{resolve_override, OverrideInfo, OverridePage, OVERRIDE_CACHE_MAX};
pub use log::{LogLevel, LogReason, LogRecord, LogSink, DEFAULT_LOG_INTERVAL, LOG_KEYS_MAX};
pub use metrics::{MetricsSnapshot, PolicyMetrics};
pub use policy::{window_offset_us, WindowOffset, WINDOW_OFFSET_SEED};
pub use policy::{Algorithm, AutoBlock, Limit, LocalAdmission, OnError, Policy, MAX_LIMIT};
pub use rate::{parse_rate, parse_rate_as};
pub use time::duration::parse_duration_us;
pub use tls::TlsConfig;

// What the bindings (C, Python, Node, Go) build on: the host transport's state machine, the
// I/O runtime's spawner and fork detection. Public because the bindings are other crates;
// hidden from the documentation because they are not for applications and may change in
// any release.
#[doc(hidden)]
pub use limiter::{HostChecks, HostStep, Spawner};
#[doc(hidden)]
pub use transport::runtime::fork_generation;

/// The crate version, shared by every binding.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
