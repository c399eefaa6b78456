//! # shardlimit
//!
//! Distributed rate limiting as a library: the algorithms, the Redis scripts and the
//! client-side shard routing that every shardlimit binding (C, Python, Node) shares.
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
//! per decision; see `docs/DESIGN.md` for the contracts.

mod algo;
mod blocking;
pub mod clock;
pub mod config;
mod cpus;
mod decision;
mod duration;
mod error;
pub mod events;
mod expiry;
mod ip;
pub mod keys;
mod limit;
mod limiter;
mod memory;
pub mod metrics;
mod pipe;
mod redis_engine;
mod resp;
pub mod routing;
pub mod scripts;
mod tls;

pub use clock::{Clock, ManualClock, MonotonicClock};
pub use config::{Config, ShardConfig};
pub use decision::{Decision, Source};
pub use duration::parse_duration_us;
pub use error::{Error, ErrorKind, Result};
pub use events::{CircuitState, Event, Subscriber};
pub use ip::{
    client_ip, client_ip_key, client_ip_with, ip_key, parse_peer, Cidr, TrustedProxies,
    DEFAULT_IPV6_PREFIX,
};
pub use limit::{Algorithm, AutoBlock, Limit, LocalAdmission, OnError, Policy, MAX_LIMIT};
pub use limiter::{
    latency_scale, BlockInfo, ConfigWatcher, Layer, Lease, Limiter, ReloadReport, ScaleHook,
    Spawner, BLOCK_CACHE_TTL, CLOSED_RETRY_AFTER, MAX_KEY_LEN,
};
pub use metrics::{MetricsSnapshot, PolicyMetrics};
pub use redis_engine::fork_generation;
pub use tls::TlsConfig;

/// The crate version, shared by every binding.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
