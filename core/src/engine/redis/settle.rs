//! Charge, refund, reserve and settle on Redis: one `main_settle.lua` call each.

use super::*;
use crate::engine::settle::SettleOp;

/// What a settle-script call does: an op of [`SettleOp`], or a reservation (a check that
/// also answers the time it was decided at).
#[derive(Debug, Clone, Copy)]
pub(crate) enum SettleCall {
    Op(SettleOp),
    Reserve(u64),
}

/// The largest time (µs) a script may answer: Lua's doubles hold integers exactly below 2^53.
const MAX_NOW_US: i64 = 1 << 53;

impl RedisEngine {
    /// Runs `call` for `key` under `policy` (limit `eff`) on `shard`: the outcome and the
    /// time (µs, the script's clock) it was decided at.
    #[allow(clippy::too_many_arguments)]
    pub async fn settle_call(
        self: &Arc<Self>,
        shard: usize,
        policy: &PolicyInner,
        eff: &Compiled,
        key: &str,
        call: SettleCall,
        now_us: Option<u64>,
    ) -> Result<(Raw, u64)> {
        let skey = state_key(&self.prefix, &policy.key_scope, key);
        let at = self.at(&skey);
        let (op, units, actual, recorded) = match call {
            SettleCall::Op(op) => op.args(),
            SettleCall::Reserve(cost) => ("reserve", cost, 0, 0),
        };
        let (after, within, dur) = match call {
            SettleCall::Reserve(_) => auto_block_args(policy.auto_block.as_ref()),
            SettleCall::Op(_) => (0, 0, 0),
        };
        let mut inv = ScriptId::Settle(eff.algorithm).script().prepare_invoke();
        inv.key(&skey)
            .key(block_key(&self.prefix, key))
            .key(denial_key(&self.prefix, &policy.key_scope, key))
            .arg(op)
            .arg(now_us.unwrap_or(0))
            .arg(eff.algorithm.code())
            .arg(eff.limit)
            .arg(eff.period_us)
            .arg(units)
            .arg(actual)
            .arg(recorded)
            .arg(after)
            .arg(within)
            .arg(dur)
            .arg(if after > 0 {
                format!("auto: policy {}", policy.name)
            } else {
                String::new()
            });
        let r: Vec<i64> = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                inv.invoke_async(&mut conn).await
            })
            .await?;
        let sc = &self.shards[shard];
        if r.len() != 8 {
            return Err(implausible(sc, &r, "not 8 values"));
        }
        if !(0..MAX_NOW_US).contains(&r[7]) {
            return Err(implausible(sc, &r, "a time out of range"));
        }
        let now = r[7] as u64;
        let granted_max = match call {
            SettleCall::Reserve(cost) => cost,
            SettleCall::Op(_) => 0,
        };
        let raw = self.check_reply(shard, &r[..7], eff.limit, granted_max)?;
        if matches!(call, SettleCall::Op(_))
            && (!raw.outcome.allowed || raw.blocked.is_blocked() || raw.outcome.retry_us.is_some())
        {
            return Err(implausible(
                sc,
                &r,
                "a charge, refund or settle that denied",
            ));
        }
        Ok((raw, now))
    }
}
