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

/// What a settle script answered: the outcome and the time (µs, the script's clock) it was
/// decided at, or the key's override entry when it is not the one the call was made with
/// (`""`: none); then nothing was done.
#[derive(Debug)]
pub(crate) enum Settled {
    Done(Raw, u64),
    Override(Vec<u8>),
}

/// The largest time (µs) a script may answer: Lua's doubles hold integers exactly below 2^53.
const MAX_NOW_US: i64 = 1 << 53;

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
        let block = block_key(&self.prefix, key);
        inv.key(&skey)
            .key(&block)
            .key(denial_key(&self.prefix, &policy.key_scope, key));
        match ov {
            // never read: any key of the call's slot will do
            OverrideArg::Off => inv.key(&block),
            _ => inv.key(override_key(&self.prefix, &policy.name, key)),
        };
        inv.arg(op)
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
        // the algorithm's 7th argument, as a check passes it (`CheckRequest::write`)
        match eff.extra_arg(key) {
            Some(x) => inv.arg(x),
            None => inv.arg(""),
        };
        inv.arg(ov);
        let reply: redis::Value = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                inv.invoke_async(&mut conn).await
            })
            .await?;
        let sc = &self.shards[shard];
        let script_error = |message: String| Error::Script {
            shard: sc.name.clone(),
            message,
        };
        let items = match reply {
            redis::Value::Array(items) => items,
            other => return Err(script_error(format!("unexpected settle reply {other:?}"))),
        };
        if items.len() == 3 && matches!(&items[0], redis::Value::BulkString(s) if s == b"o") {
            return match (&items[1], &items[2]) {
                (redis::Value::BulkString(v), redis::Value::Int(0)) => {
                    Ok(Settled::Override(v.clone()))
                }
                (redis::Value::Nil, redis::Value::Int(0)) => Ok(Settled::Override(Vec::new())),
                other => Err(script_error(format!(
                    "unexpected override entry in a settle reply: {other:?}"
                ))),
            };
        }
        let r = items
            .iter()
            .map(|i| match i {
                redis::Value::Int(n) => Ok(*n),
                other => Err(script_error(format!("unexpected settle reply {other:?}"))),
            })
            .collect::<Result<Vec<i64>>>()?;
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
        Ok(Settled::Done(raw, now))
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
        let (op, at) = match limits.first().map(|l| l.2.args()) {
            Some((op, _, _, at)) => (op, at),
            None => return Ok(MultiSettled::Done(Vec::new())),
        };
        let mut inv = ScriptId::SettleMulti.script().prepare_invoke();
        inv.arg(op)
            .arg(now_us.unwrap_or(0))
            .arg(limits.len())
            .arg(at);
        for (scope, eff, op) in limits {
            let (_, units, actual, _) = op.args();
            inv.key(state_key(&self.prefix, scope, key))
                .arg(eff.algorithm.code())
                .arg(eff.limit)
                .arg(eff.period_us);
            // the algorithm's 7th argument, as a check passes it (`CheckRequest::write`)
            match eff.extra_arg(key) {
                Some(x) => inv.arg(x),
                None => inv.arg(""),
            };
            inv.arg(units).arg(actual);
        }
        if let Some(t) = tail {
            t.push_override(&self.prefix, &mut inv);
        }
        let skey = state_key(&self.prefix, limits[0].0, key);
        let at = self.at(&skey);
        let reply: redis::Value = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                inv.invoke_async(&mut conn).await
            })
            .await?;
        let sc = &self.shards[shard];
        let script_error = |message: String| Error::Script {
            shard: sc.name.clone(),
            message,
        };
        let items = match reply {
            redis::Value::Array(items) => items,
            other => return Err(script_error(format!("unexpected settle reply {other:?}"))),
        };
        if tail.is_some()
            && items.len() == 3
            && matches!(&items[0], redis::Value::BulkString(s) if s == b"o")
        {
            return match (&items[1], &items[2]) {
                (redis::Value::BulkString(v), redis::Value::Int(0)) => {
                    Ok(MultiSettled::Override(v.clone()))
                }
                other => Err(script_error(format!(
                    "unexpected override entry in a settle reply: {other:?}"
                ))),
            };
        }
        let r = items
            .iter()
            .map(|i| match i {
                redis::Value::Int(n) => Ok(*n),
                other => Err(script_error(format!("unexpected settle reply {other:?}"))),
            })
            .collect::<Result<Vec<i64>>>()?;
        if r.len() != 1 + 5 * limits.len() {
            return Err(implausible(
                sc,
                &r,
                &format!("not 1 + 5 x {} values", limits.len()),
            ));
        }
        if !(0..MAX_NOW_US).contains(&r[0]) {
            return Err(implausible(sc, &r, "a time out of range"));
        }
        let outcomes = (0..limits.len())
            .map(|i| outcome(&r[1 + 5 * i..6 + 5 * i], sc, limits[i].1.limit))
            .collect::<Result<Vec<_>>>()?;
        if outcomes.iter().any(|o| !o.allowed || o.retry_us.is_some()) {
            return Err(implausible(
                sc,
                &r,
                "a charge, refund or settle that denied",
            ));
        }
        Ok(MultiSettled::Done(outcomes))
    }
}

/// What the multi-limit settle script answered: each limit after the op, or the key's
/// override entry when it is not the one the call was made with (`""`: none); then
/// nothing was done.
#[derive(Debug)]
pub(crate) enum MultiSettled {
    Done(Vec<Outcome>),
    Override(Vec<u8>),
}
