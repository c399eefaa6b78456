//! Shards: their config, URL validation, Sentinel URLs, and the redaction of the
//! passwords URLs carry (no error, `Debug` or log line ever shows one).

use super::*;
use crate::error::{Error, Result};
use crate::tls::TlsConfig;
use serde_json::Value;

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
pub(super) const SENTINEL_URL_FORM: &str =
    "redis+sentinel://[[user]:password@]host:port[,host:port...]/master_name[/db]\
     [?sentinel_username=...&sentinel_password=...]";

/// Characters that stay as they are in the user and password parts of a URL.
pub(super) const USERINFO: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

pub(super) fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, USERINFO).to_string()
}

/// The `[user]:password@` part of a URL, encoded; empty without a password.
pub(super) fn login_part(user: Option<&str>, password: Option<&str>) -> String {
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
pub(super) fn url_secrets(url: &str) -> Vec<String> {
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

/// The `redis+sentinel://` URL of the structured form `{"nodes": ["host:port", ...],
/// "master": "name", "username"?, "password"?, "db"?, "sentinel_username"?,
/// "sentinel_password"?}`.
pub(super) fn sentinel_object_url(f: &str, sv: &Value) -> Result<String> {
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

pub(super) fn shards(v: &Value, default_tls: Option<&TlsConfig>) -> Result<Vec<ShardConfig>> {
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
