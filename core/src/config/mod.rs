//! The central configuration: shards, policies and failure behaviour, loaded from a file,
//! a JSON string or `$SHARDLIMIT_CONFIG`. Every invalid field gets an error naming it.

use crate::error::{Error, Result};
use crate::policy::{Algorithm, OnError, Policy};
use crate::time::duration::duration_from_json;
use crate::tls::TlsConfig;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

mod plans;
mod policies;
mod sentinel;
mod shadow;
mod shard;
mod strict;

/// What a reload ([`Limiter::reload`](crate::Limiter::reload)) changed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReloadReport {
    /// True when the shard list (or prefix, deadline) changed and new connections were made.
    pub engine_changed: bool,
    /// True when moved keys are being carried over from their old shards.
    pub handoff: bool,
    pub policies_added: Vec<String>,
    pub policies_removed: Vec<String>,
    pub policies_changed: Vec<String>,
}

#[cfg(test)]
mod tests;

use policies::{on_error, policy};
pub(crate) use sentinel::SentinelSpec;
pub use shard::ShardConfig;
use shard::*;
pub(crate) use shard::{redact_url, scrub, validate_url};
pub use strict::parse_strict_json;
use strict::*;

/// The environment variable holding a config path or an inline JSON config.
pub const CONFIG_ENV: &str = "SHARDLIMIT_CONFIG";
/// The default Redis key prefix.
pub const DEFAULT_PREFIX: &str = "sl:";
/// The default per-call deadline: small enough for a request path.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// `reshard_handoff` of a config without policies (ad-hoc limits only).
pub const DEFAULT_RESHARD_HANDOFF: Duration = Duration::from_secs(600);
/// How long a blocking call may spin on its socket for the reply before sleeping, when
/// the process may use more than one CPU (see [`default_spin_wait`]).
pub const DEFAULT_SPIN_WAIT: Duration = Duration::from_micros(100);

/// `spin_wait` when the config does not set it: [`DEFAULT_SPIN_WAIT`], or 0 when the process
/// may use only one CPU (affinity or cgroup quota, read once): a spinner would take the CPU
/// that the thread it waits for needs.
pub fn default_spin_wait() -> Duration {
    if crate::transport::cpus::usable() > 1 {
        DEFAULT_SPIN_WAIT
    } else {
        Duration::ZERO
    }
}

/// The fields a config may have at its top level.
const TOP_LEVEL_FIELDS: &[&str] = &[
    "shards",
    "cluster",
    "key_prefix",
    "timeout_ms",
    "on_error",
    "instances",
    "policies",
    "events",
    "reshard_handoff",
    "spin_wait",
    "tls",
    "$schema",
    "description",
    "default_algorithm",
    "plans",
    "log_interval",
    "max_queue",
    // read by `shardlimit serve` (serve/src/gateway.rs), ignored here: one file configures
    // the libraries and the gateway
    "gateway",
];

/// A validated configuration. Its `Debug` shows URLs without their credentials.
#[derive(Clone)]
#[non_exhaustive]
pub struct Config {
    /// `None` runs on the in-memory engine (the embedded default), unless `cluster` is set.
    pub shards: Option<Vec<ShardConfig>>,
    /// Seed nodes of one Redis Cluster (`"cluster": {"nodes": [...]}`), instead of `shards`:
    /// the cluster routes keys by slot (MOVED/ASK, topology refresh and failover are the
    /// redis crate's), and every script's keys share one hash tag.
    pub cluster: Option<Vec<String>>,
    /// TLS settings of the cluster's `rediss://` nodes: `cluster.tls`, or the top-level one.
    pub cluster_tls: Option<TlsConfig>,
    /// The top-level `tls`: the default of every shard (and of `cluster`) without its own.
    pub tls: Option<TlsConfig>,
    pub key_prefix: String,
    pub timeout: Duration,
    /// The default failure mode of policies that do not set their own.
    pub on_error: OnError,
    /// How many service instances share the limits (for `on_error: local`).
    pub instances: u32,
    pub policies: BTreeMap<String, Policy>,
    /// Write events (denials, blocks, fallbacks, circuit changes) to a capped Redis Stream
    /// `<prefix>events` on each shard, trimmed to about this many entries. `None`: off.
    pub events_stream_maxlen: Option<u64>,
    /// After a reload changes the shard list, how long moved keys carry their state over
    /// from their old shard, as the config set it (`reshard_handoff`). `None`: the longest
    /// time any configured policy's state matters ([`Config::longest_window`]), or 10
    /// minutes without policies; [`Config::effective_reshard_handoff`] says which.
    pub reshard_handoff: Option<Duration>,
    /// How long a blocking call (`*_blocking`, Python sync, C, Go) may spin on its socket
    /// for the reply before sleeping in `read`; also how long the I/O thread keeps
    /// spinning after the last async check when calls have been coming back that fast
    /// (it spins while async checks are in flight), as the config set it (`spin_wait`, at
    /// most 10 ms; 0 never spins). `None`: [`default_spin_wait`] (100 µs, or 0 when the
    /// process may use one CPU only, where a blocking caller still spins while it gives way
    /// to every other ready thread); [`Config::effective_spin_wait`] says which. Spinning saves the wake-up of a sleeping thread, which costs
    /// tens of microseconds on virtual machines, for CPU: under sustained async load the
    /// I/O thread keeps a core busy (giving way to other ready threads every 10 µs). At
    /// most half the CPUs spin at once.
    pub spin_wait: Option<Duration>,
    /// The algorithm of rate strings that name none (`"login": "5/minute"`):
    /// `default_algorithm`, `fixed_window` unless set.
    pub default_algorithm: Algorithm,
    /// `plans`: by plan name, the replacement of each policy the plan changes (same name,
    /// other limits). [`Config::plan_policy`] resolves a (plan, policy) pair.
    pub plans: BTreeMap<String, BTreeMap<String, Policy>>,
    /// `log_interval`: at most one warning line per (reason, subject) per interval (a
    /// fallback per policy, a circuit opened per shard, ...), carrying how many were
    /// suppressed since the last; [`crate::DEFAULT_LOG_INTERVAL`] (10 s) unless set, from
    /// 1 ms to 1 day.
    pub log_interval: Duration,
    /// `max_queue`: how many calls one shard's connection holds at once, queued in this
    /// process or waiting for their reply ([`DEFAULT_MAX_QUEUE`] unless set, from 1 to
    /// 16,777,216). A call beyond it is refused at once with an `overloaded` error (never
    /// admitted, never `on_error`): the process sends more than the shard answers.
    pub max_queue: usize,
}

/// `max_queue` unless the config sets it: 20,000 concurrent checks in one process, and
/// more, are all decided.
pub const DEFAULT_MAX_QUEUE: usize = 65_536;

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cluster: Option<Vec<String>> = self
            .cluster
            .as_ref()
            .map(|n| n.iter().map(|u| redact_url(u)).collect());
        f.debug_struct("Config")
            .field("shards", &self.shards)
            .field("cluster", &cluster)
            .field("key_prefix", &self.key_prefix)
            .field("timeout", &self.timeout)
            .field("on_error", &self.on_error)
            .field("instances", &self.instances)
            .field("policies", &self.policies)
            .field("events_stream_maxlen", &self.events_stream_maxlen)
            .field("reshard_handoff", &self.effective_reshard_handoff())
            .field("spin_wait", &self.effective_spin_wait())
            .field("default_algorithm", &self.default_algorithm)
            .field("plans", &self.plans)
            .field("log_interval", &self.log_interval)
            .field("max_queue", &self.max_queue)
            .finish_non_exhaustive()
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            shards: None,
            cluster: None,
            cluster_tls: None,
            tls: None,
            key_prefix: DEFAULT_PREFIX.to_string(),
            timeout: DEFAULT_TIMEOUT,
            on_error: OnError::Open,
            instances: 1,
            policies: BTreeMap::new(),
            events_stream_maxlen: None,
            reshard_handoff: None,
            spin_wait: None,
            default_algorithm: Algorithm::FixedWindow,
            plans: BTreeMap::new(),
            log_interval: crate::log::DEFAULT_LOG_INTERVAL,
            max_queue: DEFAULT_MAX_QUEUE,
        }
    }
}

impl Config {
    /// How long moved keys carry their state over after a reshard: `reshard_handoff` when
    /// the config set it, else the longest time any policy's state matters, else 10 minutes.
    pub fn effective_reshard_handoff(&self) -> Duration {
        self.reshard_handoff.unwrap_or_else(|| {
            self.longest_window()
                .map_or(DEFAULT_RESHARD_HANDOFF, |(_, w)| w)
        })
    }

    /// `spin_wait` when the config set it, else [`default_spin_wait`].
    pub fn effective_spin_wait(&self) -> Duration {
        self.spin_wait.unwrap_or_else(default_spin_wait)
    }

    /// How the nodes of `cluster` connect (plain TCP, or TLS and how the server is
    /// verified), for `config validate`; `None` without `cluster`.
    pub fn cluster_tls_mode(&self) -> Option<String> {
        let nodes = self.cluster.as_ref()?;
        let tls = nodes.first().is_some_and(|n| n.starts_with("rediss://"));
        Some(crate::tls::describe(tls, self.cluster_tls.as_ref()))
    }

    /// Parses and validates a JSON config.
    /// Duplicate keys are rejected anywhere in the document (JSON parsers differ on which
    /// one wins, so two services could read one file differently).
    pub fn from_json(text: &str) -> Result<Config> {
        Config::from_value(&parse_strict_json(text)?)
    }

    /// Reads, parses and validates a JSON config file.
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Config> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
            path: path.display().to_string(),
            message: format!("cannot read config: {e}"),
        })?;
        Config::from_json(&text).map_err(|e| match e {
            Error::Config { field, message } => Error::Config {
                field: format!("{}: {field}", path.display()),
                message,
            },
            other => other,
        })
    }

    /// The config named by `$SHARDLIMIT_CONFIG` (a path, or inline JSON starting with `{`),
    /// or `None` when the variable is unset or empty.
    pub fn from_env() -> Result<Option<Config>> {
        match std::env::var(CONFIG_ENV) {
            Ok(v) if v.trim().starts_with('{') => Config::from_json(&v).map(Some),
            Ok(v) if !v.trim().is_empty() => Config::from_file(v.trim()).map(Some),
            _ => Ok(None),
        }
    }

    /// Validates an already parsed JSON value.
    pub fn from_value(value: &Value) -> Result<Config> {
        let obj = value
            .as_object()
            .ok_or_else(|| Error::config("config", "expected a JSON object"))?;
        check_fields(obj, "", TOP_LEVEL_FIELDS)?;
        let mut cfg = Config::default();
        cfg.read_settings(obj)?;
        cfg.read_timings(obj)?;
        cfg.read_events(obj)?;
        cfg.read_backend(obj)?;
        cfg.read_policies(obj)?;
        Ok(cfg)
    }

    /// `key_prefix`, `timeout_ms`, `on_error`, `instances`.
    fn read_settings(&mut self, obj: &serde_json::Map<String, Value>) -> Result<()> {
        if let Some(v) = obj.get("key_prefix") {
            let p = v.as_str().ok_or_else(|| {
                Error::config("key_prefix", format!("expected a string, got {v}"))
            })?;
            if p.len() > 64 || p.contains(['{', '}']) {
                return Err(Error::config(
                    "key_prefix",
                    "must be at most 64 characters without '{' or '}' (they would break hash tags)",
                ));
            }
            self.key_prefix = p.to_string();
        }
        if let Some(v) = obj.get("timeout_ms") {
            let us = duration_from_json("timeout_ms", v)?;
            if !(1_000..=60_000_000).contains(&us) {
                return Err(Error::config(
                    "timeout_ms",
                    format!("must be between 1 ms and 60 s, got {} ms", us / 1000),
                ));
            }
            self.timeout = Duration::from_micros(us);
        }
        if let Some(v) = obj.get("on_error") {
            self.on_error = on_error("on_error", v)?;
        }
        if let Some(v) = obj.get("instances") {
            self.instances = match v.as_u64() {
                Some(n) if (1..=100_000).contains(&n) => n as u32,
                _ => {
                    return Err(Error::config(
                        "instances",
                        format!("expected an integer between 1 and 100000, got {v}"),
                    ))
                }
            };
        }
        Ok(())
    }

    /// `reshard_handoff`, `spin_wait`, `log_interval`.
    fn read_timings(&mut self, obj: &serde_json::Map<String, Value>) -> Result<()> {
        if let Some(v) = obj.get("reshard_handoff") {
            self.reshard_handoff = Some(Duration::from_micros(duration_from_json(
                "reshard_handoff",
                v,
            )?));
        }
        if let Some(v) = obj.get("spin_wait") {
            let us = duration_from_json("spin_wait", v)?;
            if us > 10_000 {
                return Err(Error::config(
                    "spin_wait",
                    format!("must be at most 10 ms, got {us} µs"),
                ));
            }
            self.spin_wait = Some(Duration::from_micros(us));
        }
        if let Some(v) = obj.get("max_queue") {
            self.max_queue = match v.as_u64() {
                Some(n) if (1..=1 << 24).contains(&n) => n as usize,
                _ => {
                    return Err(Error::config(
                        "max_queue",
                        format!("expected an integer between 1 and 16777216, got {v}"),
                    ))
                }
            };
        }
        if let Some(v) = obj.get("log_interval") {
            let us = duration_from_json("log_interval", v)?;
            if !(1_000..=86_400_000_000).contains(&us) {
                return Err(Error::config(
                    "log_interval",
                    format!("must be between 1 ms and 1 day, got {us} µs"),
                ));
            }
            self.log_interval = Duration::from_micros(us);
        }
        Ok(())
    }

    /// `events`: `{"stream_maxlen": N}`.
    fn read_events(&mut self, obj: &serde_json::Map<String, Value>) -> Result<()> {
        if let Some(v) = obj.get("events") {
            let o = v.as_object().ok_or_else(|| {
                Error::config(
                    "events",
                    format!("expected {{\"stream_maxlen\": N}}, got {v}"),
                )
            })?;
            check_fields(o, "events.", &["stream_maxlen"])?;
            if let Some(m) = o.get("stream_maxlen") {
                match m.as_u64() {
                    Some(n) if (1..=10_000_000).contains(&n) => self.events_stream_maxlen = Some(n),
                    _ => {
                        return Err(Error::config(
                            "events.stream_maxlen",
                            format!("expected an integer between 1 and 10000000, got {m}"),
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    /// Where the shards are: `tls`, then `shards` or `cluster`.
    fn read_backend(&mut self, obj: &serde_json::Map<String, Value>) -> Result<()> {
        if let Some(v) = obj.get("tls") {
            self.tls = Some(TlsConfig::from_json("tls", v)?);
        }
        if let Some(v) = obj.get("shards") {
            self.shards = Some(shards(v, self.tls.as_ref())?);
        }
        if let Some(v) = obj.get("cluster") {
            if self.shards.is_some() {
                return Err(Error::config(
                    "cluster",
                    "use either `shards` (client-side routing) or `cluster`, not both",
                ));
            }
            let o = v.as_object().ok_or_else(|| {
                Error::config(
                    "cluster",
                    format!(
                        "expected {{\"nodes\": [\"redis://host:port\", ...]}}, got {}",
                        kind(v)
                    ),
                )
            })?;
            check_fields(o, "cluster.", &["nodes", "tls"])?;
            let nodes = o
                .get("nodes")
                .and_then(Value::as_array)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    Error::config(
                        "cluster.nodes",
                        "expected a non-empty list of redis:// URLs",
                    )
                })?;
            let mut urls: Vec<String> = Vec::new();
            for (i, n) in nodes.iter().enumerate() {
                let f = format!("cluster.nodes[{i}]");
                let url = n.as_str().ok_or_else(|| {
                    Error::config(&f, format!("expected a redis:// URL, got {}", kind(n)))
                })?;
                validate_url(&f, url)?;
                if url.starts_with("redis+sentinel://") {
                    return Err(Error::config(&f, "expected a redis:// or rediss:// URL"));
                }
                if urls
                    .first()
                    .is_some_and(|u| u.starts_with("rediss://") != url.starts_with("rediss://"))
                {
                    return Err(Error::config(
                        &f,
                        "every node must use the same scheme (all redis:// or all rediss://)",
                    ));
                }
                urls.push(url.to_string());
            }
            let tls = match o.get("tls") {
                Some(t) => Some(TlsConfig::from_json("cluster.tls", t)?),
                None => self.tls.clone(),
            };
            if o.contains_key("tls") && !urls[0].starts_with("rediss://") {
                return Err(Error::config(
                    "cluster.tls",
                    "the nodes are redis:// (plain TCP); use rediss:// URLs for TLS",
                ));
            }
            self.cluster_tls = tls.filter(|_| urls[0].starts_with("rediss://"));
            self.cluster = Some(urls);
        }
        Ok(())
    }

    /// `default_algorithm`, `policies`, then the `plans` over them.
    fn read_policies(&mut self, obj: &serde_json::Map<String, Value>) -> Result<()> {
        if let Some(v) = obj.get("default_algorithm") {
            self.default_algorithm = plans::default_algorithm(v)?;
        }
        if let Some(v) = obj.get("policies") {
            let map = v.as_object().ok_or_else(|| {
                Error::config(
                    "policies",
                    format!("expected an object of named policies, got {v}"),
                )
            })?;
            for (name, p) in map {
                let policy = policy(name, p, self.on_error, self.default_algorithm)?;
                self.policies.insert(name.clone(), policy);
            }
        }
        if let Some(v) = obj.get("plans") {
            self.plans = plans::plans(v, &self.policies, self.default_algorithm)?;
        }
        Ok(())
    }

    /// The policy whose state matters longest, and for how long: its window
    /// (`fixed_window`, `sliding_log`), twice its window (`sliding_window`, which weighs
    /// the previous window in), the time to refill or drain a full bucket, or the lease TTL.
    /// The default `reshard_handoff`, so that no moved key starts with a fresh budget while
    /// its old state would still count.
    pub fn longest_window(&self) -> Option<(&str, Duration)> {
        // every limit of a multi-limit policy, and the policies of every plan, count
        let in_plans = self.plans.values().flat_map(|p| p.iter());
        self.policies
            .iter()
            .chain(in_plans)
            .flat_map(|(name, p)| {
                let parts = p.parts().map_or(std::slice::from_ref(p), |parts| parts);
                parts.iter().map(move |part| {
                    let c = &part.0.compiled;
                    let us = match c.algorithm {
                        Algorithm::SlidingWindow => c.period_us.saturating_mul(2),
                        Algorithm::TokenBucket | Algorithm::LeakyBucket => c.window_us(),
                        _ => c.period_us,
                    };
                    (name.as_str(), Duration::from_micros(us))
                })
            })
            .max_by_key(|(_, d)| *d)
    }
}
