//! The central configuration: shards, policies and failure behaviour, loaded from a file,
//! a JSON string or `$SHARDLIMIT_CONFIG`. Every invalid field gets an error naming it.

use crate::duration::duration_from_json;
use crate::error::{Error, Result};
use crate::limit::{
    validate_auto_block, validate_local, Algorithm, AutoBlock, Limit, LocalAdmission, OnError,
    Policy,
};
use crate::tls::TlsConfig;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::time::Duration;

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
    if crate::cpus::usable() > 1 {
        DEFAULT_SPIN_WAIT
    } else {
        Duration::ZERO
    }
}

/// One Redis shard.
#[derive(Clone, PartialEq, Eq)]
pub struct ShardConfig {
    pub name: String,
    /// `redis://[user:password@]host:port[/db]`, `rediss://...` for TLS, or
    /// `redis+sentinel://[[user]:password@]host1:26379,host2:26379/master_name[/db]
    /// [?sentinel_username=...&sentinel_password=...]` for a primary that Sentinels watch
    /// (the shard follows failover to the new primary).
    pub url: String,
    /// TLS settings of the connection to the server (for a Sentinel shard: to the primary,
    /// which is then reached over TLS): the shard's own `tls`, or the top-level one.
    /// `None` on a `rediss://` shard: verified against the built-in roots.
    pub tls: Option<TlsConfig>,
    /// Sentinel shards: TLS to the Sentinels themselves (`sentinel_tls`); `None`: plain TCP.
    pub sentinel_tls: Option<TlsConfig>,
}

impl ShardConfig {
    /// A shard without TLS settings of its own.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> ShardConfig {
        ShardConfig {
            name: name.into(),
            url: url.into(),
            tls: None,
            sentinel_tls: None,
        }
    }

    /// True when the connection to the server (the primary, for Sentinel) uses TLS.
    pub fn is_tls(&self) -> bool {
        self.url.starts_with("rediss://")
            || (self.url.starts_with("redis+sentinel://") && self.tls.is_some())
    }

    /// How this shard connects, for `config validate`: plain TCP, or TLS and how the server
    /// is verified (INSECURE when it is not).
    pub fn tls_mode(&self) -> String {
        let main = crate::tls::describe(self.is_tls(), self.tls.as_ref());
        if self.url.starts_with("redis+sentinel://") {
            format!(
                "primary: {main}; sentinels: {}",
                crate::tls::describe(self.sentinel_tls.is_some(), self.sentinel_tls.as_ref())
            )
        } else {
            main
        }
    }
}

impl std::fmt::Debug for ShardConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardConfig")
            .field("name", &self.name)
            .field("url", &redact_url(&self.url))
            .field("tls", &self.tls)
            .field("sentinel_tls", &self.sentinel_tls)
            .finish()
    }
}

/// A parsed `redis+sentinel://` URL: the Sentinels' URLs, the master name, and how to log
/// in to the primary.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// `redis://[user:password@]host:port` of each Sentinel (with the Sentinels' own
    /// credentials, when they have any).
    pub nodes: Vec<String>,
    pub master: String,
    /// The primary's (and its replicas') ACL user and password, and database.
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: i64,
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelUrl")
            .field("nodes", &self.nodes.len())
            .field("master", &self.master)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("db", &self.db)
            .finish()
    }
}

/// The form of a Sentinel URL, for error messages.
const SENTINEL_URL_FORM: &str =
    "redis+sentinel://[[user]:password@]host:port[,host:port...]/master_name[/db]\
     [?sentinel_username=...&sentinel_password=...]";

/// Characters that stay as they are in the user and password parts of a URL.
const USERINFO: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, USERINFO).to_string()
}

/// The `[user]:password@` part of a URL, encoded; empty without a password.
fn login_part(user: Option<&str>, password: Option<&str>) -> String {
    password
        .map(|p| format!("{}:{}@", user.map(encode).unwrap_or_default(), encode(p)))
        .unwrap_or_default()
}

/// `url` with its credentials (and query) replaced by `***`, for messages and logs.
/// Made for URLs that may be malformed: everything before the last `@` (after the scheme)
/// is a login, whatever characters it holds, and a query may hold Sentinel passwords.
pub(crate) fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (format!("{s}://"), r),
        None => (String::new(), url),
    };
    let rest = match rest.rfind('@') {
        Some(at) => format!("***@{}", &rest[at + 1..]),
        None => rest.to_string(),
    };
    let rest = match rest.split_once('?') {
        Some((r, _)) => format!("{r}?***"),
        None => rest,
    };
    format!("{scheme}{rest}")
}

/// The secrets a URL may carry (its login, and Sentinel passwords in its query), raw and
/// percent-decoded: what [`scrub`] removes from messages that third-party code wrote.
fn url_secrets(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let mut raw = Vec::new();
    if let Some(at) = rest.rfind('@') {
        let login = &rest[..at];
        raw.push(login.to_string());
        if let Some((user, pass)) = login.split_once(':') {
            raw.push(pass.to_string());
            raw.push(user.to_string());
        }
    }
    if let Some((_, q)) = rest.split_once('?') {
        raw.push(q.to_string());
        for pair in q.split('&') {
            raw.push(pair.split_once('=').map_or(pair, |(_, v)| v).to_string());
        }
    }
    let mut all: Vec<String> = raw
        .iter()
        .flat_map(|s| {
            let d = percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned();
            [s.clone(), d]
        })
        .filter(|s| s.len() >= 2)
        .collect();
    // longest first, so that a password inside a login is replaced with the login
    all.sort_by_key(|s| std::cmp::Reverse(s.len()));
    all.dedup();
    all
}

/// `text` (e.g. the redis crate's message about `url`) with every secret of `url` replaced
/// by `***`.
pub(crate) fn scrub(text: &str, url: &str) -> String {
    let mut out = text.to_string();
    for secret in url_secrets(url) {
        out = out.replace(&secret, "***");
    }
    out
}

/// What a JSON value is, for messages about values that may hold secrets (URLs with
/// passwords), which are never echoed.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Parses `redis+sentinel://[[user]:password@]host:port[,host:port...]/master_name[/db]`,
/// with optional `sentinel_username` and `sentinel_password` query parameters for
/// Sentinels that require a login themselves. The user and password before `@` are the
/// primary's; all credentials are percent-encoded.
pub(crate) fn parse_sentinel_url(field: &str, url: &str) -> Result<SentinelUrl> {
    let bad = |m: &str| {
        Error::config(
            field,
            format!("{:?}: {m}; expected {SENTINEL_URL_FORM}", redact_url(url)),
        )
    };
    let decode = |what: &str, s: &str| -> Result<String> {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| bad(&format!("the {what} is not UTF-8 once percent-decoded")))
    };
    let rest = url
        .strip_prefix("redis+sentinel://")
        .ok_or_else(|| bad("not a sentinel URL"))?;
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = rest.split_once('/').ok_or_else(|| bad("no master name"))?;
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (mut username, mut password) = (None, None);
    if let Some(u) = userinfo {
        let (user, pass) = u
            .split_once(':')
            .ok_or_else(|| bad("credentials must be user:password@ or :password@"))?;
        if !user.is_empty() {
            username = Some(decode("user", user)?);
        }
        password = Some(decode("password", pass)?);
    }
    let path = path.trim_end_matches('/');
    let (master, db) = match path.split_once('/') {
        Some((m, d)) => {
            let db = d
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .ok_or_else(|| bad(&format!("bad database number {d:?}")))?;
            (m, db)
        }
        None => (path, 0),
    };
    if master.is_empty() {
        return Err(bad("bad master name"));
    }
    let (mut s_user, mut s_pass) = (None, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "sentinel_username" => s_user = Some(decode("sentinel_username", v)?),
            "sentinel_password" => s_pass = Some(decode("sentinel_password", v)?),
            _ => return Err(bad(&format!("unknown parameter {k:?}"))),
        }
    }
    if s_user.is_some() && s_pass.is_none() {
        return Err(bad("sentinel_username needs sentinel_password"));
    }
    let login = login_part(s_user.as_deref(), s_pass.as_deref());
    let mut nodes = Vec::new();
    for h in hosts.split(',') {
        if h.is_empty() {
            return Err(bad("empty sentinel address"));
        }
        let node = format!("redis://{login}{h}");
        redis::Client::open(node.as_str()).map_err(|e| {
            bad(&format!(
                "bad sentinel address {:?}: {}",
                redact_url(h),
                scrub(&scrub(&e.to_string(), &node), url)
            ))
        })?;
        nodes.push(node);
    }
    Ok(SentinelUrl {
        nodes,
        master: master.to_string(),
        username,
        password,
        db,
    })
}

/// A validated configuration. Its `Debug` shows URLs without their credentials.
#[derive(Clone)]
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
    /// from their old shard (`reshard_handoff`; by default the longest time any configured
    /// policy's state matters, [`Config::longest_window`], or 10 minutes without policies).
    pub reshard_handoff: Duration,
    /// True when the config set `reshard_handoff` itself.
    pub reshard_handoff_configured: bool,
    /// How long a blocking call (`*_blocking`, Python sync, C, Go) may spin on its socket
    /// for the reply before sleeping in `read`; also how long the I/O thread keeps
    /// spinning after the last async check when calls have been coming back that fast
    /// (it spins while async checks are in flight; `spin_wait`, default 100 µs, 0 when the
    /// process may use one CPU only, at most 10 ms; 0 never spins). Spinning saves the wake-up of a sleeping thread, which costs
    /// tens of microseconds on virtual machines, for CPU: under sustained async load the
    /// I/O thread keeps a core busy (giving way to other ready threads every 10 µs). At
    /// most half the CPUs spin at once.
    pub spin_wait: Duration,
}

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
            .field("reshard_handoff", &self.reshard_handoff)
            .field("spin_wait", &self.spin_wait)
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
            reshard_handoff: DEFAULT_RESHARD_HANDOFF,
            reshard_handoff_configured: false,
            spin_wait: default_spin_wait(),
        }
    }
}

impl Config {
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
        check_fields(
            obj,
            "",
            &[
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
            ],
        )?;
        let mut cfg = Config::default();
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
            cfg.key_prefix = p.to_string();
        }
        if let Some(v) = obj.get("timeout_ms") {
            let us = duration_from_json("timeout_ms", v)?;
            if !(1_000..=60_000_000).contains(&us) {
                return Err(Error::config(
                    "timeout_ms",
                    format!("must be between 1 ms and 60 s, got {} ms", us / 1000),
                ));
            }
            cfg.timeout = Duration::from_micros(us);
        }
        if let Some(v) = obj.get("on_error") {
            cfg.on_error = on_error("on_error", v)?;
        }
        if let Some(v) = obj.get("instances") {
            cfg.instances = match v.as_u64() {
                Some(n) if (1..=100_000).contains(&n) => n as u32,
                _ => {
                    return Err(Error::config(
                        "instances",
                        format!("expected an integer between 1 and 100000, got {v}"),
                    ))
                }
            };
        }
        if let Some(v) = obj.get("reshard_handoff") {
            cfg.reshard_handoff = Duration::from_micros(duration_from_json("reshard_handoff", v)?);
            cfg.reshard_handoff_configured = true;
        }
        if let Some(v) = obj.get("spin_wait") {
            let us = duration_from_json("spin_wait", v)?;
            if us > 10_000 {
                return Err(Error::config(
                    "spin_wait",
                    format!("must be at most 10 ms, got {us} µs"),
                ));
            }
            cfg.spin_wait = Duration::from_micros(us);
        }
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
                    Some(n) if (1..=10_000_000).contains(&n) => cfg.events_stream_maxlen = Some(n),
                    _ => {
                        return Err(Error::config(
                            "events.stream_maxlen",
                            format!("expected an integer between 1 and 10000000, got {m}"),
                        ))
                    }
                }
            }
        }
        if let Some(v) = obj.get("tls") {
            cfg.tls = Some(TlsConfig::from_json("tls", v)?);
        }
        if let Some(v) = obj.get("shards") {
            cfg.shards = Some(shards(v, cfg.tls.as_ref())?);
        }
        if let Some(v) = obj.get("cluster") {
            if cfg.shards.is_some() {
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
                None => cfg.tls.clone(),
            };
            if o.contains_key("tls") && !urls[0].starts_with("rediss://") {
                return Err(Error::config(
                    "cluster.tls",
                    "the nodes are redis:// (plain TCP); use rediss:// URLs for TLS",
                ));
            }
            cfg.cluster_tls = tls.filter(|_| urls[0].starts_with("rediss://"));
            cfg.cluster = Some(urls);
        }
        if let Some(v) = obj.get("policies") {
            let map = v.as_object().ok_or_else(|| {
                Error::config(
                    "policies",
                    format!("expected an object of named policies, got {v}"),
                )
            })?;
            for (name, p) in map {
                let policy = policy(name, p, cfg.on_error)?;
                cfg.policies.insert(name.clone(), policy);
            }
        }
        if !cfg.reshard_handoff_configured {
            if let Some((_, w)) = cfg.longest_window() {
                cfg.reshard_handoff = w;
            }
        }
        Ok(cfg)
    }

    /// The policy whose state matters longest, and for how long: its window
    /// (`fixed_window`, `sliding_log`), twice its window (`sliding_window`, which weighs
    /// the previous window in), the time to refill or drain a full bucket, or the lease TTL.
    /// The default `reshard_handoff`, so that no moved key starts with a fresh budget while
    /// its old state would still count.
    pub fn longest_window(&self) -> Option<(&str, Duration)> {
        self.policies
            .iter()
            .map(|(name, p)| {
                let c = &p.0.compiled;
                let us = match c.algorithm {
                    Algorithm::SlidingWindow => c.period_us.saturating_mul(2),
                    Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                        c.limit.saturating_mul(c.period_us)
                    }
                    _ => c.period_us,
                };
                (name.as_str(), Duration::from_micros(us))
            })
            .max_by_key(|(_, d)| *d)
    }
}

/// Parses JSON like `serde_json::from_str::<Value>`, but fails on a key that appears twice
/// in one object, naming its path (`policies.login`, `shards[1].url`): how configs are read.
pub fn parse_strict_json(text: &str) -> Result<Value> {
    use serde::de::DeserializeSeed;
    let duplicate = std::cell::RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = StrictValue {
        path: String::new(),
        duplicate: &duplicate,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|_| v));
    parsed.map_err(|e| match duplicate.take() {
        Some(path) => Error::config(
            path,
            format!(
                "duplicate key (line {}, column {}); each key may appear only once",
                e.line(),
                e.column()
            ),
        ),
        None => Error::config(
            "config",
            format!(
                "not valid JSON: {e} (line {}, column {})",
                e.line(),
                e.column()
            ),
        ),
    })
}

/// A JSON value at `path` whose objects may not repeat a key; the path of the first
/// repeated key goes to `duplicate`. serde_json's recursion limit still applies.
struct StrictValue<'a> {
    path: String,
    duplicate: &'a std::cell::RefCell<Option<String>>,
}

impl<'a> StrictValue<'a> {
    fn child(&self, path: String) -> StrictValue<'a> {
        StrictValue {
            path,
            duplicate: self.duplicate,
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for StrictValue<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for StrictValue<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> std::result::Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> std::result::Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) =
            seq.next_element_seed(self.child(format!("{}[{}]", self.path, out.len())))?
        {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let path = if self.path.is_empty() {
                k.clone()
            } else {
                format!("{}.{k}", self.path)
            };
            if out.contains_key(&k) {
                *self.duplicate.borrow_mut() = Some(path);
                return Err(serde::de::Error::custom("duplicate key"));
            }
            let v = map.next_value_seed(self.child(path))?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

fn check_fields(obj: &Map<String, Value>, path: &str, known: &[&str]) -> Result<()> {
    for k in obj.keys() {
        if !known.contains(&k.as_str()) {
            return Err(Error::config(
                format!("{path}{k}"),
                format!("unknown field; expected one of: {}", known.join(", ")),
            ));
        }
    }
    Ok(())
}

fn on_error(field: &str, v: &Value) -> Result<OnError> {
    v.as_str().and_then(OnError::from_name).ok_or_else(|| {
        Error::config(
            field,
            format!("expected \"open\", \"closed\" or \"local\", got {v}"),
        )
    })
}

/// The `redis+sentinel://` URL of the structured form `{"nodes": ["host:port", ...],
/// "master": "name", "username"?, "password"?, "db"?, "sentinel_username"?,
/// "sentinel_password"?}`.
fn sentinel_object_url(f: &str, sv: &Value) -> Result<String> {
    let so = sv.as_object().ok_or_else(|| {
        Error::config(
            f,
            "expected {\"nodes\": [\"host:port\"], \"master\": \"name\"}",
        )
    })?;
    check_fields(
        so,
        &format!("{f}."),
        &[
            "nodes",
            "master",
            "username",
            "password",
            "db",
            "sentinel_username",
            "sentinel_password",
        ],
    )?;
    let nodes: Vec<&str> = so
        .get("nodes")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|n| n.trim_start_matches("redis://"))
                .collect()
        })
        .filter(|n: &Vec<&str>| !n.is_empty())
        .ok_or_else(|| {
            Error::config(
                format!("{f}.nodes"),
                "expected a non-empty list of \"host:port\"",
            )
        })?;
    let text = |k: &str| -> Result<Option<&str>> {
        match so.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(Error::config(format!("{f}.{k}"), "expected a string")),
        }
    };
    let master = text("master")?
        .filter(|m| !m.is_empty() && !m.contains(['/', '?', '@']))
        .ok_or_else(|| Error::config(format!("{f}.master"), "expected the master name"))?;
    let (username, password) = (text("username")?, text("password")?);
    if username.is_some() && password.is_none() {
        return Err(Error::config(
            format!("{f}.username"),
            "needs a password too",
        ));
    }
    let login = login_part(username, password);
    let db = match so.get("db") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_i64()
            .filter(|n| *n >= 0)
            .ok_or_else(|| Error::config(format!("{f}.db"), "expected a number >= 0"))?,
    };
    let mut query = Vec::new();
    for k in ["sentinel_username", "sentinel_password"] {
        if let Some(v) = text(k)? {
            query.push(format!("{k}={}", encode(v)));
        }
    }
    Ok(format!(
        "redis+sentinel://{login}{}/{master}{}{}",
        nodes.join(","),
        if db != 0 {
            format!("/{db}")
        } else {
            String::new()
        },
        if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        }
    ))
}

fn shards(v: &Value, default_tls: Option<&TlsConfig>) -> Result<Vec<ShardConfig>> {
    let list = v.as_array().ok_or_else(|| {
        Error::config(
            "shards",
            format!("expected a list of {{name, url}}, got {}", kind(v)),
        )
    })?;
    if list.is_empty() {
        return Err(Error::config(
            "shards",
            "is empty; list at least one shard, or leave `shards` out to use the in-memory engine",
        ));
    }
    let mut out: Vec<ShardConfig> = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let field = format!("shards[{i}]");
        let obj = s.as_object().ok_or_else(|| {
            Error::config(
                &field,
                format!("expected an object {{name, url}}, got {}", kind(s)),
            )
        })?;
        check_fields(
            obj,
            &format!("{field}."),
            &["name", "url", "sentinel", "tls", "sentinel_tls"],
        )?;
        let name = match obj.get("name").and_then(Value::as_str) {
            Some(n) if !n.trim().is_empty() => n.to_string(),
            _ => {
                return Err(Error::config(
                    format!("{field}.name"),
                    "expected a non-empty string",
                ))
            }
        };
        let url = match (obj.get("url"), obj.get("sentinel")) {
            (Some(_), Some(_)) => {
                return Err(Error::config(
                    &field,
                    "give either `url` or `sentinel`, not both",
                ));
            }
            (None, Some(sv)) => sentinel_object_url(&format!("{field}.sentinel"), sv)?,
            (Some(u), None) => u
                .as_str()
                .ok_or_else(|| {
                    Error::config(
                        format!("{field}.url"),
                        "expected a redis://, rediss:// or redis+sentinel:// URL",
                    )
                })?
                .to_string(),
            (None, None) => {
                return Err(Error::config(
                    format!("{field}.url"),
                    "expected a redis://, rediss:// or redis+sentinel:// URL",
                ));
            }
        };
        let url = url.as_str();
        validate_url(&format!("{field}.url"), url)?;
        if out.iter().any(|o| o.name == name) {
            return Err(Error::config(
                format!("{field}.name"),
                format!("duplicate shard name {name:?}"),
            ));
        }
        let sentinel = url.starts_with("redis+sentinel://");
        let own_tls = obj
            .get("tls")
            .map(|t| TlsConfig::from_json(&format!("{field}.tls"), t))
            .transpose()?;
        if own_tls.is_some() && url.starts_with("redis://") {
            return Err(Error::config(
                format!("{field}.tls"),
                "the URL is redis:// (plain TCP); use rediss:// for TLS",
            ));
        }
        let sentinel_tls = obj
            .get("sentinel_tls")
            .map(|t| TlsConfig::from_json(&format!("{field}.sentinel_tls"), t))
            .transpose()?;
        if sentinel_tls.is_some() && !sentinel {
            return Err(Error::config(
                format!("{field}.sentinel_tls"),
                "only a Sentinel shard has Sentinels to talk to; use `tls`",
            ));
        }
        // the top-level `tls` applies to every TLS connection without settings of its own:
        // rediss:// shards, and the primaries of Sentinel shards
        let tls = own_tls.or_else(|| {
            default_tls
                .filter(|_| !url.starts_with("redis://"))
                .cloned()
        });
        if let (true, Some(t)) = (sentinel, &tls) {
            if t.insecure_skip_verify && t.cert_file.is_some() {
                // the redis crate sends no client certificate to a Sentinel-managed
                // primary it does not verify: say so rather than fail at the handshake
                let whose = if obj.contains_key("tls") {
                    format!("{field}.tls")
                } else {
                    "tls".to_string()
                };
                return Err(Error::config(
                    format!("{whose}.cert_file"),
                    format!("{field} is a Sentinel shard, whose primary cannot combine a client certificate with insecure_skip_verify"),
                ));
            }
        }
        out.push(ShardConfig {
            name,
            url: url.to_string(),
            tls,
            sentinel_tls,
        });
    }
    Ok(out)
}

/// Checks a shard URL without connecting.
pub(crate) fn validate_url(field: &str, url: &str) -> Result<()> {
    if url.starts_with("redis+sentinel://") {
        return parse_sentinel_url(field, url).map(|_| ());
    }
    if url.starts_with("rediss://") && !cfg!(feature = "tls") {
        return Err(Error::config(
            field,
            "rediss:// needs TLS support, and this build has none (the `tls` feature is off)",
        ));
    }
    if url.contains('#') {
        return Err(Error::config(
            field,
            "a URL fragment (#insecure) is not accepted; to skip certificate verification, \
             set `\"tls\": {\"insecure_skip_verify\": true}`, which `config validate` reports",
        ));
    }
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err(Error::config(
            field,
            format!(
                "expected a redis:// or rediss:// URL, got {:?}",
                redact_url(url)
            ),
        ));
    }
    redis::Client::open(url).map(|_| ()).map_err(|e| {
        Error::config(
            field,
            format!(
                "invalid Redis URL {:?}: {}",
                redact_url(url),
                scrub(&e.to_string(), url)
            ),
        )
    })
}

fn count(field: String, v: Option<&Value>) -> Result<u64> {
    match v {
        Some(v) => v
            .as_u64()
            .ok_or_else(|| Error::config(&field, format!("expected a positive integer, got {v}"))),
        None => Err(Error::config(field, "is required")),
    }
}

fn dur(field: String, v: Option<&Value>) -> Result<Duration> {
    match v {
        Some(v) => duration_from_json(&field, v).map(Duration::from_micros),
        None => Err(Error::config(field, "is required")),
    }
}

fn rate(field: String, v: Option<&Value>) -> Result<f64> {
    match v {
        Some(v) => v
            .as_f64()
            .ok_or_else(|| Error::config(&field, format!("expected a positive number, got {v}"))),
        None => Err(Error::config(field, "is required")),
    }
}

fn policy(name: &str, v: &Value, default_on_error: OnError) -> Result<Policy> {
    let field = format!("policies.{name}");
    let obj = v
        .as_object()
        .ok_or_else(|| Error::config(&field, format!("expected an object, got {v}")))?;
    let algo_name = obj
        .get("algorithm")
        .ok_or_else(|| Error::config(format!("{field}.algorithm"), "is required"))?;
    let algorithm = algo_name
        .as_str()
        .and_then(Algorithm::from_name)
        .ok_or_else(|| {
            Error::config(
                format!("{field}.algorithm"),
                format!(
                    "unknown algorithm {algo_name}; expected one of: {}",
                    Algorithm::ALL
                        .iter()
                        .map(|a| a.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })?;
    let f = |k: &str| format!("{field}.{k}");
    let (params, limit) = match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => {
            let limit = count(f("limit"), obj.get("limit"))?;
            let window = dur(f("window"), obj.get("window"))?;
            let l = match algorithm {
                Algorithm::FixedWindow => Limit::fixed_window(limit, window),
                Algorithm::SlidingWindow => Limit::sliding_window(limit, window),
                _ => Limit::sliding_log(limit, window),
            };
            (["limit", "window"], l)
        }
        Algorithm::TokenBucket => (
            ["capacity", "refill_per_sec"],
            Limit::token_bucket(
                count(f("capacity"), obj.get("capacity"))?,
                rate(f("refill_per_sec"), obj.get("refill_per_sec"))?,
            ),
        ),
        Algorithm::LeakyBucket => (
            ["capacity", "leak_per_sec"],
            Limit::leaky_bucket(
                count(f("capacity"), obj.get("capacity"))?,
                rate(f("leak_per_sec"), obj.get("leak_per_sec"))?,
            ),
        ),
        Algorithm::Concurrency => (
            ["max", "lease_ttl"],
            Limit::concurrency(
                count(f("max"), obj.get("max"))?,
                dur(f("lease_ttl"), obj.get("lease_ttl"))?,
            ),
        ),
    };
    let mut known = vec![
        "algorithm",
        "on_error",
        "description",
        "auto_block",
        "local_admission",
    ];
    known.extend(params);
    check_fields(obj, &format!("{field}."), &known)?;
    let on_error = match obj.get("on_error") {
        Some(v) => on_error(&f("on_error"), v)?,
        None => default_on_error,
    };
    let mut policy = Policy::build(name, limit, on_error, &field)?;
    if let Some(v) = obj.get("auto_block") {
        let f = format!("{field}.auto_block");
        let o = v.as_object().ok_or_else(|| {
            Error::config(
                &f,
                format!("expected {{\"after\": N, \"within\": \"1m\", \"for\": \"15m\"}}, got {v}"),
            )
        })?;
        check_fields(o, &format!("{f}."), &["after", "within", "for"])?;
        let a = AutoBlock {
            after: count(format!("{f}.after"), o.get("after"))?,
            within: dur(format!("{f}.within"), o.get("within"))?,
            duration: dur(format!("{f}.for"), o.get("for"))?,
        };
        validate_auto_block(&f, &a)?;
        policy = policy.with_auto_block(a)?;
    }
    if let Some(v) = obj.get("local_admission") {
        let f = format!("{field}.local_admission");
        let o = v.as_object().ok_or_else(|| {
            Error::config(
                &f,
                format!("expected {{\"max_batch\": N, \"max_hold\": \"1s\"}}, got {v}"),
            )
        })?;
        check_fields(o, &format!("{f}."), &["max_batch", "max_hold"])?;
        let l = LocalAdmission {
            max_batch: match o.get("max_batch") {
                Some(_) => count(format!("{f}.max_batch"), o.get("max_batch"))?,
                None => 100,
            },
            max_hold: match o.get("max_hold") {
                Some(_) => dur(format!("{f}.max_hold"), o.get("max_hold"))?,
                None => Duration::from_secs(1),
            },
        };
        validate_local(&f, policy.algorithm(), &l)?;
        policy = policy.with_local_admission(l)?;
    }
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> String {
        Config::from_json(json).unwrap_err().to_string()
    }

    #[test]
    fn parses_the_example() {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../shard-config.json"))
                .unwrap();
        let cfg = Config::from_json(&text).unwrap();
        assert_eq!(cfg.shards.as_ref().unwrap().len(), 3);
        assert!(cfg.policies.contains_key("login"));
    }

    #[test]
    fn sentinel_urls_carry_logins_for_the_primary_and_the_sentinels() {
        let su = parse_sentinel_url(
            "f",
            "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster",
        )
        .unwrap();
        assert_eq!(
            su.nodes,
            ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"]
        );
        assert_eq!(
            (su.master.as_str(), su.username, su.password, su.db),
            ("mymaster", None, None, 0)
        );

        let su = parse_sentinel_url(
            "f",
            "redis+sentinel://app:p%40ss%3Aw%2Fd@h1:26379,h2:26379/mymaster/3\
             ?sentinel_username=watch&sentinel_password=s%26cret",
        )
        .unwrap();
        assert_eq!(su.username.as_deref(), Some("app"));
        assert_eq!(su.password.as_deref(), Some("p@ss:w/d"));
        assert_eq!((su.master.as_str(), su.db), ("mymaster", 3));
        assert_eq!(
            su.nodes,
            [
                "redis://watch:s%26cret@h1:26379",
                "redis://watch:s%26cret@h2:26379"
            ]
        );
        let su = parse_sentinel_url("f", "redis+sentinel://:pw@h1:26379/m").unwrap();
        assert_eq!((su.username, su.password.as_deref()), (None, Some("pw")));

        // the structured form means the same URL, with every part encoded
        let cfg = Config::from_json(
            r#"{"shards":[{"name":"ha","sentinel":{"nodes":["h1:26379","h2:26379"],
               "master":"mymaster","username":"app","password":"p@ss:w/d","db":3,
               "sentinel_username":"watch","sentinel_password":"s&cret"}}]}"#,
        )
        .unwrap();
        let url = &cfg.shards.unwrap()[0].url;
        let su2 = parse_sentinel_url("f", url).unwrap();
        assert_eq!(
            (su2.username.as_deref(), su2.password.as_deref(), su2.db),
            (Some("app"), Some("p@ss:w/d"), 3)
        );
        assert_eq!(su2.nodes[0], "redis://watch:s%26cret@h1:26379");
    }

    #[test]
    fn bad_sentinel_configs_are_named_and_never_show_a_password() {
        for (url, why) in [
            ("redis+sentinel://h1:26379", "no master name"),
            ("redis+sentinel://h1:26379/", "bad master name"),
            ("redis+sentinel://h1:26379/m/x", "bad database number \"x\""),
            (
                "redis+sentinel://h1:26379/m/-1",
                "bad database number \"-1\"",
            ),
            ("redis+sentinel://h1:26379,,h2/m", "empty sentinel address"),
            ("redis+sentinel://secret@h1:26379/m", "credentials must be"),
            (
                "redis+sentinel://h1:26379/m?password=secret",
                "unknown parameter \"password\"",
            ),
            (
                "redis+sentinel://h1:26379/m?sentinel_username=secret",
                "sentinel_username needs sentinel_password",
            ),
            (
                "redis+sentinel://u:secret@h1:26379/m/x",
                "bad database number",
            ),
        ] {
            let e = parse_sentinel_url("shards[0].url", url)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("shards[0].url: "), "{e}");
            assert!(e.contains(why), "{url}: {e}");
            assert!(
                !e.contains("secret"),
                "{url}: the message shows the password: {e}"
            );
        }
        let e = err(
            r#"{"shards":[{"name":"ha","sentinel":{"nodes":["h1:26379"],"master":"m","username":"u"}}]}"#,
        );
        assert_eq!(e, "shards[0].sentinel.username: needs a password too");
        let e = err(
            r#"{"shards":[{"name":"ha","sentinel":{"nodes":["h1:26379"],"master":"m","db":-2,"password":"secret"}}]}"#,
        );
        assert_eq!(e, "shards[0].sentinel.db: expected a number >= 0");
        let e = err(
            r#"{"shards":[{"name":"ha","sentinel":{"nodes":["h1:26379"],"master":"m","pasword":"secret"}}]}"#,
        );
        assert!(
            e.starts_with("shards[0].sentinel.pasword: unknown field"),
            "{e}"
        );
        assert!(!e.contains("secret"), "{e}");
        let su = parse_sentinel_url("f", "redis+sentinel://u:secret@h1:26379/m").unwrap();
        assert!(!format!("{su:?}").contains("secret"));
        for url in [
            "redis://:secret@h:6379/2",
            "rediss://u:secret@h:6379",
            "redis+sentinel://:secret@h1,h2/m?sentinel_password=secret",
        ] {
            let shard = ShardConfig::new("s", url);
            let shown = format!("{shard:?}");
            assert!(
                !shown.contains("secret") && shown.contains("***@h"),
                "{shown}"
            );
        }
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(
            err(r#"{"policies":{"login":{"algorithm":"fixed_window","limit":5,"window":"abc"}}}"#),
            "policies.login.window: expected a duration like \"1m\", \"500ms\" or an integer of milliseconds, got \"abc\""
        );
        assert!(
            err(r#"{"policies":{"a":{"algorithm":"fixed_window","limit":0,"window":"1s"}}}"#)
                .starts_with("policies.a.limit: must be between 1")
        );
        assert!(
            err(r#"{"policies":{"a":{"algorithm":"fixed_window","limit":-5,"window":"1s"}}}"#)
                .starts_with("policies.a.limit: expected a positive integer")
        );
        assert!(
            err(r#"{"policies":{"a":{"algorithm":"fixed_window","limit":5,"window":"0s"}}}"#)
                .starts_with("policies.a.window: must be between 1ms")
        );
        assert!(err(r#"{"policies":{"a":{"algorithm":"token_bucket","capacity":9223372036854775808,"refill_per_sec":1}}}"#)
            .starts_with("policies.a.capacity: must be between 1"));
        assert!(err(r#"{"policies":{"a":{"algorithm":"magic","limit":5}}}"#)
            .starts_with("policies.a.algorithm: unknown algorithm \"magic\""));
        assert!(err(
            r#"{"policies":{"a":{"algorithm":"fixed_window","limit":5,"window":"1s","burst":3}}}"#
        )
        .starts_with("policies.a.burst: unknown field"));
        assert!(
            err(r#"{"policies":{"a":{"algorithm":"fixed_window","window":"1s"}}}"#)
                .starts_with("policies.a.limit: is required")
        );
        assert!(err(r#"{"shards":[]}"#).starts_with("shards: is empty"));
        assert!(err(r#"{"shards":[{"name":"a","url":"redis://127.0.0.1:1"},{"name":"a","url":"redis://127.0.0.1:2"}]}"#)
            .starts_with("shards[1].name: duplicate shard name"));
        assert!(err(r#"{"shards":[{"name":"a","url":"http://x"}]}"#)
            .starts_with("shards[0].url: expected a redis://"));
        assert!(err(r#"{"shardz":[]}"#).starts_with("shardz: unknown field"));
        assert!(err(r#"{"timeout_ms":0}"#).starts_with("timeout_ms: must be between"));
        assert!(err(r#"{"on_error":"maybe"}"#).starts_with("on_error: expected"));
        assert!(err(r#"{"key_prefix":"a{b}"}"#).starts_with("key_prefix: must be"));
        assert!(err("{not json").starts_with("config: not valid JSON"));
        assert!(err("[]").starts_with("config: expected a JSON object"));
    }

    #[test]
    fn no_shards_means_memory() {
        let cfg = Config::from_json(
            r#"{"policies":{"a":{"algorithm":"sliding_log","limit":5,"window":60000}}}"#,
        )
        .unwrap();
        assert!(cfg.shards.is_none());
        assert_eq!(cfg.policies["a"].max(), 5);
    }

    #[test]
    fn duplicate_keys_are_rejected_with_their_path() {
        let tb = r#"{"algorithm":"token_bucket","capacity":5,"refill_per_sec":1}"#;
        for (json, path) in [
            (r#"{"timeout_ms":10,"timeout_ms":20}"#.to_string(), "timeout_ms"),
            (format!(r#"{{"policies":{{"login":{tb},"login":{tb}}}}}"#), "policies.login"),
            (
                r#"{"policies":{"a":{"algorithm":"fixed_window","limit":1,"limit":2,"window":1}}}"#
                    .to_string(),
                "policies.a.limit",
            ),
            (
                r#"{"shards":[{"name":"a","url":"redis://h:1"},{"name":"b","url":"redis://h:2","url":"redis://h:3"}]}"#
                    .to_string(),
                "shards[1].url",
            ),
            (r#"{"x":[[{"k":1,"k":1}]]}"#.to_string(), "x[0][0].k"),
        ] {
            let e = err(&json);
            assert!(
                e.starts_with(&format!("{path}: duplicate key (line 1, column ")),
                "{json}: {e}"
            );
        }
        // distinct keys, and the same key in different objects, are fine
        Config::from_json(&format!(r#"{{"policies":{{"a":{tb},"b":{tb}}}}}"#)).unwrap();
        // bad JSON is still reported as such, trailing garbage too
        assert!(err(r#"{"a":1} x"#).starts_with("config: not valid JSON"));
        assert!(err(&"[".repeat(100_000)).starts_with("config: not valid JSON"));
    }

    #[test]
    fn reshard_handoff_defaults_to_the_longest_window() {
        let cfg = |policies: &str, extra: &str| {
            Config::from_json(&format!(
                r#"{{"shards":[{{"name":"a","url":"redis://h:1"}}]{extra},"policies":{{{policies}}}}}"#
            ))
            .unwrap()
        };
        let fw = r#""fw":{"algorithm":"fixed_window","limit":5,"window":"1h"}"#;
        let sw = r#""sw":{"algorithm":"sliding_window","limit":5,"window":"40m"}"#;
        let tb = r#""tb":{"algorithm":"token_bucket","capacity":7200,"refill_per_sec":1}"#;
        let c = cfg(fw, "");
        assert_eq!(c.reshard_handoff, Duration::from_secs(3600));
        assert!(!c.reshard_handoff_configured);
        // a sliding window weighs the previous window in: 2 × 40 min
        let c = cfg(&format!("{fw},{sw}"), "");
        assert_eq!(c.longest_window(), Some(("sw", Duration::from_secs(4800))));
        assert_eq!(c.reshard_handoff, Duration::from_secs(4800));
        // a bucket: the time to refill it completely
        assert_eq!(
            cfg(&format!("{fw},{tb}"), "").reshard_handoff,
            Duration::from_secs(7200)
        );
        // no policies: ten minutes; set explicitly: as set
        assert_eq!(cfg("", "").reshard_handoff, DEFAULT_RESHARD_HANDOFF);
        let c = cfg(fw, r#","reshard_handoff":"5m""#);
        assert_eq!(c.reshard_handoff, Duration::from_secs(300));
        assert!(c.reshard_handoff_configured);
    }

    #[test]
    fn redact_url_hides_every_login_form() {
        for (url, want) in [
            ("redis://bob:pw@h:1/2", "redis://***@h:1/2"),
            ("redis://bob:p/w@h:1", "redis://***@h:1"),
            ("redis://bob:p?w@h:1", "redis://***@h:1"),
            ("bob:pw@h:1", "***@h:1"),
            (
                "redis+sentinel://h:1/m?sentinel_password=pw",
                "redis+sentinel://h:1/m?***",
            ),
            ("redis://h:1", "redis://h:1"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
        assert_eq!(
            scrub("bad URL p%40ss and p@ss", "redis://u:p%40ss@h"),
            "bad URL *** and ***"
        );
    }
}
