//! The one typed description of a shard behind Redis Sentinel, built once at config time
//! from either form (a `redis+sentinel://` URL or the structured `sentinel` object) and
//! used by the engine as it is: nothing turns it into a URL to parse it again, so a master
//! name or a password holds any character.

use super::shard::{encode, login_part, redact_url, scrub, SENTINEL_URL_FORM};
use crate::config::check_fields;
use crate::error::{Error, Result};
use serde_json::Value;

/// A shard's Sentinels, the primary's name there, and how to log in to each side. TLS to
/// each side is the shard's `tls` (the primary) and `sentinel_tls` (the Sentinels).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelSpec {
    /// Each Sentinel's host and port.
    pub nodes: Vec<(String, u16)>,
    pub master: String,
    /// The primary's (and its replicas') ACL user and password, and database.
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: i64,
    /// The Sentinels' own login, when they require one.
    pub sentinel_username: Option<String>,
    pub sentinel_password: Option<String>,
}

impl std::fmt::Debug for SentinelSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hide = |p: &Option<String>| p.as_ref().map(|_| "<redacted>");
        f.debug_struct("SentinelSpec")
            .field("nodes", &self.nodes)
            .field("master", &self.master)
            .field("username", &self.username)
            .field("password", &hide(&self.password))
            .field("db", &self.db)
            .field("sentinel_username", &self.sentinel_username)
            .field("sentinel_password", &hide(&self.sentinel_password))
            .finish()
    }
}

/// `host[:port]` of one Sentinel as the redis crate reads an address; `Err` says why not.
fn node_addr(h: &str) -> std::result::Result<(String, u16), String> {
    use redis::IntoConnectionInfo;
    let info = format!("redis://{h}")
        .as_str()
        .into_connection_info()
        .map_err(|e| e.to_string())?;
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) if !host.is_empty() && !h.contains(['/', '?']) => {
            Ok((host.clone(), *port))
        }
        _ => Err("expected host:port".to_string()),
    }
}

impl SentinelSpec {
    /// Parses `redis+sentinel://[[user]:password@]host:port[,host:port...]/master_name[/db]`,
    /// with optional `sentinel_username` and `sentinel_password` query parameters for
    /// Sentinels that require a login themselves. The user and password before `@` are the
    /// primary's; credentials and the master name are percent-encoded.
    pub(crate) fn from_url(field: &str, url: &str) -> Result<SentinelSpec> {
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
        let master = decode("master name", master)?;
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
        let mut nodes = Vec::new();
        for h in hosts.split(',') {
            if h.is_empty() {
                return Err(bad("empty sentinel address"));
            }
            nodes.push(node_addr(h).map_err(|e| {
                bad(&format!(
                    "bad sentinel address {:?}: {}",
                    redact_url(h),
                    scrub(&e, url)
                ))
            })?);
        }
        Ok(SentinelSpec {
            nodes,
            master,
            username,
            password,
            db,
            sentinel_username: s_user,
            sentinel_password: s_pass,
        })
    }

    /// The structured form `{"nodes": ["host:port", ...], "master": "name", "username"?,
    /// "password"?, "db"?, "sentinel_username"?, "sentinel_password"?}`; every string is
    /// taken as it is (no URL encoding).
    pub(crate) fn from_json(f: &str, sv: &Value) -> Result<SentinelSpec> {
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
        let listed: Vec<&str> = so
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
        let text = |k: &str| -> Result<Option<String>> {
            match so.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(Error::config(format!("{f}.{k}"), "expected a string")),
            }
        };
        let master = text("master")?
            .filter(|m| !m.is_empty())
            .ok_or_else(|| Error::config(format!("{f}.master"), "expected the master name"))?;
        let (username, password) = (text("username")?, text("password")?);
        if username.is_some() && password.is_none() {
            return Err(Error::config(
                format!("{f}.username"),
                "needs a password too",
            ));
        }
        let db = match so.get("db") {
            None | Some(Value::Null) => 0,
            Some(v) => v
                .as_i64()
                .filter(|n| *n >= 0)
                .ok_or_else(|| Error::config(format!("{f}.db"), "expected a number >= 0"))?,
        };
        let (s_user, s_pass) = (text("sentinel_username")?, text("sentinel_password")?);
        if s_user.is_some() && s_pass.is_none() {
            return Err(Error::config(
                format!("{f}.sentinel_username"),
                "needs sentinel_password too",
            ));
        }
        let mut nodes = Vec::with_capacity(listed.len());
        for (i, h) in listed.iter().enumerate() {
            nodes.push(node_addr(h).map_err(|e| {
                Error::config(
                    format!("{f}.nodes[{i}]"),
                    format!("bad sentinel address {:?}: {e}", redact_url(h)),
                )
            })?);
        }
        Ok(SentinelSpec {
            nodes,
            master,
            username,
            password,
            db,
            sentinel_username: s_user,
            sentinel_password: s_pass,
        })
    }

    /// The `redis+sentinel://` URL of this spec, every part encoded: what a structured
    /// config shows as its shard's `url` ([`SentinelSpec::from_url`] reads it back).
    pub(crate) fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|(h, p)| {
                if h.contains(':') {
                    format!("[{h}]:{p}")
                } else {
                    format!("{h}:{p}")
                }
            })
            .collect();
        let mut query = Vec::new();
        if let Some(u) = &self.sentinel_username {
            query.push(format!("sentinel_username={}", encode(u)));
        }
        if let Some(p) = &self.sentinel_password {
            query.push(format!("sentinel_password={}", encode(p)));
        }
        format!(
            "redis+sentinel://{}{}/{}{}{}",
            login_part(self.username.as_deref(), self.password.as_deref()),
            hosts.join(","),
            encode(&self.master),
            if self.db != 0 {
                format!("/{}", self.db)
            } else {
                String::new()
            },
            if query.is_empty() {
                String::new()
            } else {
                format!("?{}", query.join("&"))
            }
        )
    }

    /// How to reach and log in to Sentinel `i` (plain TCP; the engine sets TLS).
    pub(crate) fn node_info(&self, i: usize) -> redis::RedisResult<redis::ConnectionInfo> {
        use redis::IntoConnectionInfo;
        let (host, port) = &self.nodes[i];
        let mut login = redis::RedisConnectionInfo::default();
        if let Some(u) = &self.sentinel_username {
            login = login.set_username(u);
        }
        if let Some(p) = &self.sentinel_password {
            login = login.set_password(p);
        }
        let addr = redis::ConnectionAddr::Tcp(host.clone(), *port);
        Ok(addr.into_connection_info()?.set_redis_settings(login))
    }
}
