//! The block list: `block`, `unblock`, `blocked`.

use super::*;

#[napi]
impl NativeLimiter {
    /// Puts `key` on the block list for `ttlMs` milliseconds (null: until unblocked).
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn block(
        &self,
        env: Env,
        key: String,
        ttl_ms: Option<f64>,
        reason: String,
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
                me.block(&key, ttl, &reason).await
            },
            |_, ()| Ok(()),
        )
    }

    /// Removes `key` from the block list; true when it was blocked.
    #[napi(catch_unwind, ts_return_type = "Promise<boolean>")]
    pub fn unblock(&self, env: Env, key: String) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move { me.unblock(&key).await },
            |_, b| Ok(b),
        )
    }

    /// The block-list entry of `key`, or null.
    #[napi(catch_unwind, ts_return_type = "Promise<BlockInfo | null>")]
    pub fn blocked(&self, env: Env, key: String) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move { me.blocked(&key).await },
            |_, info| {
                // a JSON value, so that a permanent block has `remaining: null`
                Ok(info.map(
                    |b| serde_json::json!({ "reason": b.reason, "remaining": b.remaining.map(ms) }),
                ))
            },
        )
    }
}
