//! Live per-key overrides: (policy, key) → a replacement limit, with an optional TTL.
//!
//! A policy takes overrides when its config says `"overrides": true` (a policy that does
//! not pays nothing per check: its check script reads no more keys). On Redis the entry
//! lives on the key's shard as the string `<version> <limit JSON>`
//! (`{prefix}o:{policy}:{T}K`, `docs/keys.md`); every check of such a policy sends the
//! version this process has cached for the key (none for most keys) and its script
//! compares it with the entry (`core/lua/check.lua`). When they differ nothing is decided:
//! the script returns the entry, the limiter caches it and checks again with it. So every
//! check is decided by the override in Redis at the time the script ran (there is no
//! staleness), and a change costs one extra round trip for each process's next check of
//! that key. The in-memory engine keeps its overrides in process.
//!
//! The override keeps the policy's name (keys, headers, metrics and events stay the
//! policy's); a limit of another algorithm keeps separate state (its key names carry the
//! algorithm's code). A concurrency policy takes only concurrency overrides, and no other
//! policy takes them.

use super::check::PolicyKey;
use super::override_retry::InForce;
use super::override_value::{limit_to_json, limits_from_json, limits_to_json, resolve_override};
use super::{Engine, Limiter};
use crate::engine::expiry::{ExpiringMap, NEVER};
use crate::engine::redis::OverrideArg;
use crate::error::{Error, Result};
use crate::key::validate_key;
use crate::policy::{Limit, Policy, PolicyInner};
use crate::routing::shard_index;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Overrides this process remembers from Redis, at most; beyond it a key's override is
/// used but not kept (its next check costs the extra round trip again, still exact).
pub const OVERRIDE_CACHE_MAX: usize = 100_000;
/// How long a remembered override is kept without being set again (exactness does not
/// depend on it: every check compares versions).
const OVERRIDE_CACHE_FOR: Duration = Duration::from_secs(600);
/// Overrides the in-memory engine holds, at most.
pub const MEMORY_OVERRIDES_MAX: usize = 1_000_000;
/// The longest override entry accepted from Redis.
const MAX_ENTRY_LEN: usize = 4096;
/// Checks in a row that may find the override changed again before one is decided.
const MAX_OVERRIDE_TRIES: usize = 8;

/// An override as stored and listed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct OverrideInfo {
    pub key: String,
    pub policy: String,
    /// The limit in force for the key instead of the policy's (the first, when the
    /// override holds several: see `limits`).
    pub limit: Limit,
    /// Time left; `None` until deleted.
    pub remaining: Option<Duration>,
    /// Every limit of the override, checked together (one for most overrides).
    pub limits: Vec<Limit>,
}

impl OverrideInfo {
    /// `{"key", "policy", "limit": {...}, "remaining_ms": n | null}`, and for an override
    /// of several limits `"limits": [{...}, ...]` (`limit` is then the first): the limits
    /// in the canonical form `set_override` accepts back (the CLI and the bindings print
    /// this).
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "key": self.key,
            "policy": self.policy,
            "limit": limit_to_json(&self.limit),
            "remaining_ms": self.remaining.map(|r| r.as_millis() as u64),
        });
        if self.limits.len() > 1 {
            v["limits"] = Value::Array(self.limits.iter().map(limit_to_json).collect());
        }
        v
    }

    fn new(key: &str, policy: &str, limits: Vec<Limit>, remaining: Option<Duration>) -> Self {
        OverrideInfo {
            key: key.to_string(),
            policy: policy.to_string(),
            limit: limits[0].clone(),
            remaining,
            limits,
        }
    }
}

/// One page of [`Limiter::list_overrides`]; `cursor` continues it (`None`: the last page).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct OverridePage {
    pub overrides: Vec<OverrideInfo>,
    pub cursor: Option<String>,
}

impl OverridePage {
    /// `{"overrides": [OverrideInfo::to_json...], "cursor": "..." | null}`.
    pub fn to_json(&self) -> Value {
        json!({
            "overrides": self.overrides.iter().map(OverrideInfo::to_json).collect::<Vec<_>>(),
            "cursor": self.cursor,
        })
    }
}

/// An override in force: its version (as written in Redis) and the policy it makes.
#[derive(Debug)]
pub(super) struct Active {
    pub version: u64,
    pub policy: Policy,
    /// The in-memory engine's scope of its state: the policy's name, or for a limit of
    /// another algorithm `name:code:`, so that it keeps separate state as on Redis.
    pub memory_scope: Arc<str>,
}

impl Active {
    fn new(version: u64, _base: &Policy, policy: Policy) -> Active {
        // (`Policy::overridden` chose it: the policy's name, or for a limit of another
        // algorithm `name:code:`, so that it keeps separate state as on Redis)
        let memory_scope = policy.0.scope.clone();
        Active {
            version,
            policy,
            memory_scope,
        }
    }
}

/// The limiter's override state: what it remembers from Redis, and the in-memory
/// engine's store.
#[derive(Default)]
pub(super) struct OverrideState {
    cache: Mutex<ExpiringMap<PolicyKey, Arc<Active>>>,
    cache_len: AtomicUsize,
    store: Mutex<ExpiringMap<PolicyKey, Arc<Active>>>,
    store_len: AtomicUsize,
}

/// A fresh version: unique among the writers of one entry with overwhelming probability
/// (64 random bits), never 0.
fn new_version() -> u64 {
    use std::hash::BuildHasher;
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::collections::hash_map::RandomState::new()
        .hash_one((n, nanos, std::process::id()))
        .max(1)
}

/// Why an override entry read from Redis is not one shardlimit writes.
fn decode(base: &Policy, bytes: &[u8]) -> std::result::Result<(u64, Policy), String> {
    if bytes.len() > MAX_ENTRY_LEN {
        return Err(format!(
            "{} bytes long (at most {MAX_ENTRY_LEN})",
            bytes.len()
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
    let (version, json) = text
        .split_once(' ')
        .ok_or_else(|| "no `<version> <limit>`".to_string())?;
    let v: u64 = version
        .parse()
        .ok()
        .filter(|v| *v != 0 && !version.starts_with('0') && !version.starts_with('+'))
        .ok_or_else(|| format!("version {version:?} is not a positive integer"))?;
    let j: Value = serde_json::from_str(json).map_err(|e| format!("limit not JSON: {e}"))?;
    let stored = j
        .as_array()
        .map_or(std::slice::from_ref(&j), |a| a.as_slice());
    if stored.iter().any(|l| l.get("algorithm").is_none()) {
        return Err("limit without an algorithm".into());
    }
    let limits = limits_from_json("limit", &j, base.algorithm()).map_err(|e| e.to_string())?;
    let policy = base.overridden(limits).map_err(|e| e.to_string())?;
    Ok((v, policy))
}

fn check_ttl(ttl: Option<Duration>) -> Result<()> {
    if let Some(t) = ttl {
        if t < Duration::from_millis(1) || t > Duration::from_micros(crate::policy::MAX_PERIOD_US) {
            return Err(Error::invalid(
                "ttl",
                "must be between 1ms and 366 days (or none for an override until deleted)",
            ));
        }
    }
    Ok(())
}

fn remaining(ttl_ms: i64) -> Option<Duration> {
    (ttl_ms >= 0).then(|| Duration::from_millis(ttl_ms as u64))
}

/// A list cursor: the shard and its SCAN cursor (Redis), or the last key listed (memory).
fn parse_cursor(c: &str) -> Result<(usize, u64)> {
    let bad = || {
        Error::invalid(
            "cursor",
            format!("{c:?} is not a cursor list_overrides returned"),
        )
    };
    let (s, n) = c
        .strip_prefix("r:")
        .and_then(|r| r.split_once(':'))
        .ok_or_else(bad)?;
    Ok((s.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?))
}

impl Limiter {
    /// The config's policy `name`, which must take overrides.
    fn override_policy(&self, name: &str) -> Result<Policy> {
        let p = self.policy(name)?;
        if !p.0.overrides {
            return Err(Error::invalid(
                "policy",
                format!(
                    "policy {name} takes no per-key overrides: set \"overrides\": true in its config"
                ),
            ));
        }
        Ok(p)
    }

    /// Sets `key`'s override of `policy` (a config policy with `"overrides": true`) to
    /// `limit`: a rate string (`"100/minute"`, in the policy's algorithm) or a limit
    /// object in JSON as in a config policy. For `ttl` (`None`: until deleted). Every
    /// limiter of every language sharing the shards decides the key's next check with it.
    pub async fn set_override(
        &self,
        key: &str,
        policy: &str,
        limit: &str,
        ttl: Option<Duration>,
    ) -> Result<OverrideInfo> {
        validate_key(key)?;
        check_ttl(ttl)?;
        let base = self.override_policy(policy)?;
        let view = self.view();
        let limits = resolve_override(&view.config, &base, limit)?;
        let policy = base.overridden(limits.clone())?;
        let version = new_version();
        let active = Arc::new(Active::new(version, &base, policy));
        let pk = PolicyKey::new(&base.0.name, key);
        let now = self.now();
        match &view.engine {
            Engine::Memory(_) => {
                let st = &self.inner.overrides;
                let mut m = st.store.lock();
                m.sweep(now, |_| false);
                if m.len() >= MEMORY_OVERRIDES_MAX && m.get(&pk).is_none() {
                    return Err(Error::invalid(
                        "key",
                        format!(
                            "the in-memory engine holds {MEMORY_OVERRIDES_MAX} overrides already"
                        ),
                    ));
                }
                let until = ttl.map_or(NEVER, |t| now + t.as_micros() as u64);
                m.insert(pk, active, until);
                st.store_len.store(m.len(), Ordering::Release);
            }
            Engine::Redis(r) => {
                let shard = shard_index(key, r.shards.len() as u32) as usize;
                let value = format!("{version} {}", limits_to_json(&limits));
                r.set_override(shard, &base.0.name, key, value, ttl).await?;
                self.cache_override(pk, Some(active));
            }
        }
        Ok(OverrideInfo::new(key, &base.0.name, limits, ttl))
    }

    /// `key`'s override of `policy`, if it has one.
    pub async fn get_override(&self, key: &str, policy: &str) -> Result<Option<OverrideInfo>> {
        validate_key(key)?;
        let base = self.override_policy(policy)?;
        let info =
            |limits: Vec<Limit>, remaining| OverrideInfo::new(key, &base.0.name, limits, remaining);
        match &self.view().engine {
            Engine::Memory(_) => {
                let now = self.now();
                Ok(self.memory_override(&base.0, key, now).map(|(a, until)| {
                    info(
                        a.policy.limits(),
                        (until != NEVER).then(|| Duration::from_micros(until - now)),
                    )
                }))
            }
            Engine::Redis(r) => {
                let shard = shard_index(key, r.shards.len() as u32) as usize;
                let Some((bytes, ttl)) = r.get_override(shard, &base.0.name, key).await? else {
                    return Ok(None);
                };
                let (_, p) = decode(&base, &bytes).map_err(|why| {
                    self.malformed(r.shards[shard].name.clone(), &base, key, &why)
                })?;
                Ok(Some(info(p.limits(), remaining(ttl))))
            }
        }
    }

    /// Deletes `key`'s override of `policy`; true when it had one. Its next check, in
    /// every limiter, is decided by the policy's own limit.
    pub async fn delete_override(&self, key: &str, policy: &str) -> Result<bool> {
        validate_key(key)?;
        let base = self.override_policy(policy)?;
        let pk = PolicyKey::new(&base.0.name, key);
        match &self.view().engine {
            Engine::Memory(_) => {
                let st = &self.inner.overrides;
                let mut m = st.store.lock();
                let now = self.now();
                let had = m.get(&pk).is_some_and(|(_, until)| until > now);
                m.remove(&pk);
                st.store_len.store(m.len(), Ordering::Release);
                Ok(had)
            }
            Engine::Redis(r) => {
                let shard = shard_index(key, r.shards.len() as u32) as usize;
                let had = r.delete_override(shard, &base.0.name, key).await?;
                self.cache_override(pk, None);
                Ok(had)
            }
        }
    }

    /// One page of `policy`'s overrides, about `limit` of them (1 to 10000), on every
    /// shard: pass the page's `cursor` to get the next (`None` first and at the end).
    /// Memory stays bounded by the page; an override set or deleted while listing may or
    /// may not be listed (SCAN's guarantee). Not on a Redis Cluster yet.
    pub async fn list_overrides(
        &self,
        policy: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<OverridePage> {
        if limit == 0 || limit > 10_000 {
            return Err(Error::invalid(
                "limit",
                format!("must be between 1 and 10000, got {limit}"),
            ));
        }
        let base = self.override_policy(policy)?;
        let name = base.0.name.to_string();
        match &self.view().engine {
            Engine::Memory(_) => {
                let after = match cursor {
                    None => None,
                    Some(c) => Some(c.strip_prefix("k:").ok_or_else(|| {
                        Error::invalid(
                            "cursor",
                            format!("{c:?} is not a cursor list_overrides returned"),
                        )
                    })?),
                };
                let now = self.now();
                let mut all: Vec<(String, Vec<Limit>, u64)> = {
                    let m = self.inner.overrides.store.lock();
                    m.iter()
                        .filter(|(k, _, until)| {
                            *until > now
                                && k.policy_name() == name
                                && after.is_none_or(|a| k.key_name() > a)
                        })
                        .map(|(k, a, until)| (k.key_name().to_string(), a.policy.limits(), until))
                        .collect()
                };
                all.sort_by(|a, b| a.0.cmp(&b.0));
                let more = all.len() > limit;
                all.truncate(limit);
                let cursor = more.then(|| format!("k:{}", all[all.len() - 1].0));
                let overrides = all
                    .into_iter()
                    .map(|(key, limits, until)| {
                        let left = (until != NEVER).then(|| Duration::from_micros(until - now));
                        OverrideInfo::new(&key, &name, limits, left)
                    })
                    .collect();
                Ok(OverridePage { overrides, cursor })
            }
            Engine::Redis(r) => {
                let (mut shard, mut scan) = match cursor {
                    None => (0, 0),
                    Some(c) => parse_cursor(c)?,
                };
                if shard >= r.shards.len() {
                    return Err(Error::invalid("cursor", format!("no shard {shard}")));
                }
                let mut overrides = Vec::new();
                loop {
                    let (next, items) = r.scan_overrides(shard, &name, scan).await?;
                    for (key, bytes, ttl) in items {
                        let (_, p) = decode(&base, &bytes).map_err(|why| {
                            self.malformed(r.shards[shard].name.clone(), &base, &key, &why)
                        })?;
                        overrides.push(OverrideInfo::new(&key, &name, p.limits(), remaining(ttl)));
                    }
                    scan = next;
                    if scan == 0 {
                        shard += 1;
                        if shard == r.shards.len() {
                            return Ok(OverridePage {
                                overrides,
                                cursor: None,
                            });
                        }
                    }
                    if overrides.len() >= limit {
                        return Ok(OverridePage {
                            overrides,
                            cursor: Some(format!("r:{shard}:{scan}")),
                        });
                    }
                }
            }
        }
    }

    /// The policy `key`'s override of `base` makes, if it has one (read from Redis).
    pub(super) async fn override_in_force(
        &self,
        key: &str,
        base: &Policy,
    ) -> Result<Option<Policy>> {
        match &self.view().engine {
            Engine::Memory(_) => {
                let now = self.now();
                let ov = self.memory_override(&base.0, key, now);
                Ok(ov.map(|(a, _)| a.policy.clone()))
            }
            Engine::Redis(r) => {
                let shard = shard_index(key, r.shards.len() as u32) as usize;
                let Some((bytes, _)) = r.get_override(shard, &base.0.name, key).await? else {
                    return Ok(None);
                };
                let (_, p) = decode(base, &bytes)
                    .map_err(|why| self.malformed(r.shards[shard].name.clone(), base, key, &why))?;
                Ok(Some(p))
            }
        }
    }

    fn malformed(&self, shard: String, base: &Policy, key: &str, why: &str) -> Error {
        Error::Script {
            shard,
            message: format!(
                "malformed override entry of key {key:?} under policy {}: {why}",
                base.0.name
            ),
        }
    }

    /// What a Redis check of `policy` tells its script, and the override it decides with.
    #[inline]
    pub(super) fn override_arg(&self, p: &PolicyInner, key: &str) -> InForce {
        if !p.overrides {
            return InForce {
                ov: OverrideArg::Off,
                active: None,
            };
        }
        let st = &self.inner.overrides;
        if st.cache_len.load(Ordering::Acquire) == 0 {
            return InForce::NONE;
        }
        let now = self.now();
        let mut c = st.cache.lock();
        c.sweep(now, |_| false);
        let hit = c
            .get(&PolicyKey::new(&p.name, key))
            .filter(|(_, until)| *until > now)
            .map(|(a, _)| a.clone());
        st.cache_len.store(c.len(), Ordering::Release);
        match hit {
            Some(a) => InForce {
                ov: OverrideArg::Cached(a.version),
                active: Some(a),
            },
            None => InForce::NONE,
        }
    }

    /// The override entry a check script returned (it differed from the one sent): the
    /// override to check again with (`None`: the key has none now), remembered.
    pub(super) fn learn_override(
        &self,
        base: &Policy,
        key: &str,
        shard: &str,
        bytes: &[u8],
    ) -> Result<InForce> {
        let pk = PolicyKey::new(&base.0.name, key);
        if bytes.is_empty() {
            self.cache_override(pk, None);
            return Ok(InForce::NONE);
        }
        let (version, policy) = decode(base, bytes)
            .map_err(|why| self.malformed(shard.to_string(), base, key, &why))?;
        let a = Arc::new(Active::new(version, base, policy));
        self.cache_override(pk, Some(a.clone()));
        Ok(InForce {
            ov: OverrideArg::Cached(version),
            active: Some(a),
        })
    }

    fn cache_override(&self, pk: PolicyKey, a: Option<Arc<Active>>) {
        let st = &self.inner.overrides;
        let now = self.now();
        let mut c = st.cache.lock();
        c.sweep(now, |_| false);
        match a {
            Some(a) if c.len() < OVERRIDE_CACHE_MAX || c.get(&pk).is_some() => {
                c.insert(pk, a, now + OVERRIDE_CACHE_FOR.as_micros() as u64)
            }
            _ => {
                c.remove(&pk);
            }
        }
        st.cache_len.store(c.len(), Ordering::Release);
    }

    /// The in-memory engine's override of (policy, key) and when it ends ([`NEVER`]).
    pub(super) fn memory_override(
        &self,
        p: &PolicyInner,
        key: &str,
        now: u64,
    ) -> Option<(Arc<Active>, u64)> {
        let st = &self.inner.overrides;
        if !p.overrides || st.store_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut m = st.store.lock();
        m.sweep(now, |_| false);
        let pk = PolicyKey::new(&p.name, key);
        let r = match m.get(&pk) {
            Some((a, until)) if until > now => Some((a.clone(), until)),
            Some(_) => {
                m.remove(&pk);
                None
            }
            None => None,
        };
        st.store_len.store(m.len(), Ordering::Release);
        r
    }

    /// Checks in a row that found the override changed: an error past the bound.
    pub(super) fn override_churn(tries: usize, shard: &str, key: &str) -> Result<()> {
        if tries >= MAX_OVERRIDE_TRIES {
            return Err(Error::Script {
                shard: shard.to_string(),
                message: format!(
                    "the override of key {key:?} changed {tries} times during one check"
                ),
            });
        }
        Ok(())
    }
}
