//! Charge, refund, reserve and settle (`core/lua/main_settle.lua`, `main_settle_multi.lua`):
//! their arguments and replies.

use crate::config::ShardConfig;
use crate::engine::outcome::{Outcome, Raw};
use crate::engine::redis::keys::{block_key, denial_key, override_key, state_key};
use crate::engine::redis::scripts::ScriptId;
use crate::engine::redis::{
    auto_block_args, auto_block_reason, check_reply, extra_arg, implausible, ints, outcome,
    override_entry, LayeredTail, OverrideArg, ScriptArgs, ScriptCall, Wire,
};
use crate::engine::settle::SettleOp;
use crate::error::Result;
use crate::policy::{Compiled, PolicyInner};
use crate::transport::resp::Reply;

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

/// What the multi-limit settle script answered: each limit after the op, or the key's
/// override entry when it is not the one the call was made with (`""`: none); then
/// nothing was done.
#[derive(Debug)]
pub(crate) enum MultiSettled {
    Done(Vec<Outcome>),
    Override(Vec<u8>),
}

/// The largest time (µs) a script may answer: Lua's doubles hold integers exactly below 2^53.
const MAX_NOW_US: i64 = 1 << 53;

/// One `main_settle.lua` call: `call` for `key` under `policy` (limit `eff`), with the
/// override the client holds (`ov`, as a check's).
pub(crate) struct SettleRequest<'a> {
    pub policy: &'a PolicyInner,
    pub eff: &'a Compiled,
    pub key: &'a str,
    pub call: SettleCall,
    pub now_us: Option<u64>,
    pub ov: OverrideArg,
}

impl ScriptCall for SettleRequest<'_> {
    type Reply = Settled;

    fn wire(&self, prefix: &str) -> Wire<'_> {
        let (policy, eff, key) = (self.policy, self.eff, self.key);
        let (op, units, actual, recorded) = match self.call {
            SettleCall::Op(op) => op.args(),
            SettleCall::Reserve(cost) => ("reserve", cost, 0, 0),
        };
        let (after, within, dur) = match self.call {
            SettleCall::Reserve(_) => auto_block_args(policy.auto_block.as_ref()),
            SettleCall::Op(_) => (0, 0, 0),
        };
        let mut a = ScriptArgs::default();
        let block = block_key(prefix, key);
        a.key(state_key(prefix, &policy.key_scope, key))
            .key(&block)
            .key(denial_key(prefix, &policy.key_scope, key));
        match self.ov {
            // never read: any key of the call's slot will do
            OverrideArg::Off => a.key(&block),
            _ => a.key(override_key(prefix, &policy.name, key)),
        };
        a.arg(op)
            .arg(self.now_us.unwrap_or(0))
            .arg(eff.algorithm.code())
            .arg(eff.limit)
            .arg(eff.period_us)
            .arg(units)
            .arg(actual)
            .arg(recorded)
            .arg(after)
            .arg(within)
            .arg(dur)
            .arg(auto_block_reason(after, &policy.name));
        // the algorithm's 7th argument, as a check passes it (`CheckRequest::write`)
        a.arg(extra_arg(eff, key)).arg(self.ov);
        Wire::Script {
            id: ScriptId::Settle(eff.algorithm),
            args: a,
            tag: None,
        }
    }

    fn read(&self, sc: &ShardConfig, reply: Reply) -> Result<Settled> {
        if let Some((v, _)) = override_entry(sc, "settle", &reply, 0)? {
            return Ok(Settled::Override(v));
        }
        let r = ints(sc, "settle", &reply)?;
        if r.len() != 8 {
            return Err(implausible(sc, &r, "not 8 values"));
        }
        if !(0..MAX_NOW_US).contains(&r[7]) {
            return Err(implausible(sc, &r, "a time out of range"));
        }
        let now = r[7] as u64;
        let granted_max = match self.call {
            SettleCall::Reserve(cost) => cost,
            SettleCall::Op(_) => 0,
        };
        let raw = check_reply(sc, &r[..7], self.eff.limit, granted_max)?;
        if matches!(self.call, SettleCall::Op(_))
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
}

/// One `main_settle_multi.lua` call: an op in every limit (state key scope, limit in force,
/// the op for it) of a multi-limit policy for `key`; with `tail` (a policy with overrides,
/// `main_layered.lua`'s protocol) the key's override version compared first.
pub(crate) struct SettleMultiRequest<'a> {
    pub key: &'a str,
    /// never empty
    pub limits: &'a [(&'a str, Compiled, SettleOp)],
    pub now_us: Option<u64>,
    pub tail: Option<&'a LayeredTail<'a>>,
}

impl ScriptCall for SettleMultiRequest<'_> {
    type Reply = MultiSettled;

    fn wire(&self, prefix: &str) -> Wire<'_> {
        let (op, at) = match self.limits.first().map(|l| l.2.args()) {
            Some((op, _, _, at)) => (op, at),
            None => ("charge", 0),
        };
        let mut a = ScriptArgs::default();
        a.arg(op)
            .arg(self.now_us.unwrap_or(0))
            .arg(self.limits.len())
            .arg(at);
        for (scope, eff, op) in self.limits {
            let (_, units, actual, _) = op.args();
            a.key(state_key(prefix, scope, self.key))
                .arg(eff.algorithm.code())
                .arg(eff.limit)
                .arg(eff.period_us)
                // the algorithm's 7th argument, as a check passes it (`CheckRequest::write`)
                .arg(extra_arg(eff, self.key))
                .arg(units)
                .arg(actual);
        }
        if let Some(t) = self.tail {
            t.push_override(prefix, &mut a);
        }
        Wire::Script {
            id: ScriptId::SettleMulti,
            args: a,
            tag: None,
        }
    }

    fn read(&self, sc: &ShardConfig, reply: Reply) -> Result<MultiSettled> {
        let limits = self.limits;
        if self.tail.is_some() {
            if let Some((v, _)) = override_entry(sc, "settle", &reply, 0)? {
                return Ok(MultiSettled::Override(v));
            }
        }
        let r = ints(sc, "settle", &reply)?;
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
