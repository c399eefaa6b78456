//! Charge, refund, reserve and settle on Redis: one `main_settle.lua` call each (the
//! arguments and replies: `protocol/settle.rs`).

use super::*;
use crate::engine::settle::SettleOp;

impl RedisEngine {
    /// Runs `call` for `key` under `policy` (limit `eff`) on `shard`, with the override the
    /// client holds (`ov`, as a check's).
    #[allow(clippy::too_many_arguments)]
    pub async fn settle_call(
        self: &Arc<Self>,
        shard: usize,
        policy: &PolicyInner,
        eff: &Compiled,
        key: &str,
        call: SettleCall,
        now_us: Option<u64>,
        ov: OverrideArg,
    ) -> Result<Settled> {
        let req = SettleRequest {
            policy,
            eff,
            key,
            call,
            now_us,
            ov,
        };
        self.call(shard, &req).await
    }

    /// Runs `op` in every limit (state key scope, limit in force, the op for it) of a
    /// multi-limit policy for `key` on `shard`, in one script call: each limit after it;
    /// with `tail` (a policy with overrides, `main_layered.lua`'s protocol): the key's
    /// override version compared first, its entry answered when it is not the one sent.
    pub async fn settle_multi(
        self: &Arc<Self>,
        shard: usize,
        key: &str,
        limits: &[(&str, Compiled, SettleOp)],
        now_us: Option<u64>,
        tail: Option<&LayeredTail<'_>>,
    ) -> Result<MultiSettled> {
        if limits.is_empty() {
            return Ok(MultiSettled::Done(Vec::new()));
        }
        let req = SettleMultiRequest {
            key,
            limits,
            now_us,
            tail,
        };
        self.call(shard, &req).await
    }
}
