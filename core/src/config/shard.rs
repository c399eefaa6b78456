//! Shards: their config, URL validation, and the redaction of the
//! passwords URLs carry (no error, `Debug` or log line ever shows one).

use super::sentinel::SentinelSpec;
use crate::config::{check_fields, kind};
use crate::error::{Error, Result};
use crate::tls::TlsConfig;
use serde_json::Value;

/// One Redis shard.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
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
    /// Sentinel shards: the Sentinels, master name, db and logins, from either config form
    /// (the `url` of a structured config only shows them).
    pub(crate) sentinel: Option<SentinelSpec>,
}

impl ShardConfig {
    /// A shard without TLS settings of its own.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> ShardConfig {
        let url = url.into();
        ShardConfig {
            name: name.into(),
            sentinel: SentinelSpec::from_url("url", &url).ok(),
            url,
            tls: None,
            sentinel_tls: None,
        }
    }

    /// The Sentinel spec of a Sentinel shard (`None` for any other): the one the config
    /// (or [`ShardConfig::new`]) built, used as it is. A shard whose `url` was set to a
    /// Sentinel URL by hand, or is not a valid one, has it read from the URL here.
    pub(crate) fn sentinel_spec(
        &self,
        field: &str,
    ) -> Result<Option<std::borrow::Cow<'_, SentinelSpec>>> {
        use std::borrow::Cow;
        match &self.sentinel {
            Some(spec) => Ok(Some(Cow::Borrowed(spec))),
            None if self.url.starts_with("redis+sentinel://") => {
                SentinelSpec::from_url(field, &self.url).map(|s| Some(Cow::Owned(s)))
            }
            None => Ok(None),
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
        let mut spec = None;
        let url = match (obj.get("url"), obj.get("sentinel")) {
            (Some(_), Some(_)) => {
                return Err(Error::config(
                    &field,
                    "give either `url` or `sentinel`, not both",
                ));
            }
            (None, Some(sv)) => {
                let sp = SentinelSpec::from_json(&format!("{field}.sentinel"), sv)?;
                let url = sp.url();
                spec = Some(sp);
                url
            }
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
        if spec.is_none() {
            if url.starts_with("redis+sentinel://") {
                spec = Some(SentinelSpec::from_url(&format!("{field}.url"), url)?);
            } else {
                validate_url(&format!("{field}.url"), url)?;
            }
        }
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
            sentinel: spec,
        });
    }
    Ok(out)
}

/// Checks a shard URL without connecting.
pub(crate) fn validate_url(field: &str, url: &str) -> Result<()> {
    if url.starts_with("redis+sentinel://") {
        return SentinelSpec::from_url(field, url).map(|_| ());
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
