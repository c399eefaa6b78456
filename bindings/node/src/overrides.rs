//! Live per-key overrides.

use super::*;

/// Turns a core future into a Promise (see the module docs).
/// An override as JS sees it: `{ key, policy, limit: {...}, remainingMs: number | null }`,
/// and `limits: [{...}, ...]` when it holds several (`limit` is then the first).
pub(crate) fn override_js(info: &shardlimit::OverrideInfo) -> serde_json::Value {
    let v = info.to_json();
    let mut js = serde_json::json!({
        "key": v["key"],
        "policy": v["policy"],
        "limit": v["limit"],
        "remainingMs": v["remaining_ms"],
    });
    if let Some(all) = v.get("limits") {
        js["limits"] = all.clone();
    }
    js
}

#[napi]
impl NativeLimiter {
    /// Sets `key`'s live override of `policy` to `limit` (a rate string or a limit object
    /// in JSON text) for `ttlMs` milliseconds (null: until deleted).
    #[napi(catch_unwind, ts_return_type = "Promise<Override>")]
    pub fn set_override(
        &self,
        env: Env,
        key: String,
        policy: String,
        limit: String,
        ttl_ms: Option<f64>,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let ttl = match ttl_ms {
                    Some(ms) => Some(Duration::from_micros(units("ttl", ms * 1000.0)?)),
                    None => None,
                };
                me.set_override(&key, &policy, &limit, ttl).await
            },
            |_, info| Ok(override_js(&info)),
        )
    }

    /// `key`'s override of `policy`, or null.
    #[napi(catch_unwind, ts_return_type = "Promise<Override | null>")]
    pub fn get_override(&self, env: Env, key: String, policy: String) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move { me.get_override(&key, &policy).await },
            |_, info| Ok(info.as_ref().map(override_js)),
        )
    }

    /// One page of `policy`'s overrides: `{ overrides, cursor }`.
    #[napi(catch_unwind, ts_return_type = "Promise<OverridePage>")]
    pub fn list_overrides(
        &self,
        env: Env,
        policy: String,
        cursor: Option<String>,
        limit: u32,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                me.list_overrides(&policy, cursor.as_deref(), limit as usize)
                    .await
            },
            |_, page| {
                Ok(serde_json::json!({
                    "overrides": page.overrides.iter().map(override_js).collect::<Vec<_>>(),
                    "cursor": page.cursor,
                }))
            },
        )
    }

    /// Deletes `key`'s override of `policy`; true when it had one.
    #[napi(catch_unwind, ts_return_type = "Promise<boolean>")]
    pub fn delete_override(
        &self,
        env: Env,
        key: String,
        policy: String,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move { me.delete_override(&key, &policy).await },
            |_, b| Ok(b),
        )
    }
}
