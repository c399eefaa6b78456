//! Layered checks and their refunds (`core/lua/main_layered.lua`, `main_refund.lua`):
//! their arguments and replies.

use crate::config::ShardConfig;
use crate::engine::outcome::{LayerReq, LayeredRaw};
use crate::engine::redis::keys::{block_key, denial_key, override_key, state_key};
use crate::engine::redis::protocol::shadow_key;
use crate::engine::redis::scripts::ScriptId;
use crate::engine::redis::{
    auto_block_args, auto_block_reason, block_verdict, extra_arg, implausible, ints, outcome,
    override_entry, unexpected, Extra, OverrideArg, ScriptArgs, ScriptCall, Wire, SHADOW_MAX_KEYS,
    SHADOW_TTL,
};
use crate::error::Result;
use crate::transport::resp::Reply;

/// A layered check of layers that all live on one shard (`main_layered.lua`): each layer's
/// keys and arguments, the injected clock, and for one key's layers (a multi-limit
/// policy's limits) the tail: override versions and shadow counting.
pub(crate) struct LayeredRequest<'a> {
    pub layers: &'a [(LayerReq<'a>, &'a str)],
    pub now_us: Option<u64>,
    pub tail: Option<&'a LayeredTail<'a>>,
    /// the shard is a Redis Cluster: no shadow hash (it would live in another slot)
    pub cluster: bool,
}

impl ScriptCall for LayeredRequest<'_> {
    type Reply = LayeredChecked;

    fn wire(&self, prefix: &str) -> Wire<'_> {
        let mut a = ScriptArgs::default();
        a.arg(self.now_us.unwrap_or(0)).arg(self.layers.len());
        for (l, key_scope) in self.layers {
            let (after, within, dur) = auto_block_args(l.auto_block.as_ref());
            a.key(state_key(prefix, key_scope, l.key))
                .key(block_key(prefix, l.key))
                .key(denial_key(prefix, key_scope, l.key))
                .arg(l.compiled.algorithm.code())
                .arg(l.compiled.limit)
                .arg(l.compiled.period_us)
                .arg(l.cost)
                .arg(layer_extra(l))
                .arg(after)
                .arg(within)
                .arg(dur)
                .arg(auto_block_reason(after, &l.scope[..]));
        }
        if let Some(t) = self.tail {
            // core/lua/main_layered.lua's tail
            t.push_override(prefix, &mut a);
            a.arg(t.key)
                .arg(SHADOW_TTL.as_millis() as u64)
                .arg(SHADOW_MAX_KEYS);
            if t.shadow && !self.cluster {
                a.key(shadow_key(prefix, t.policy));
            }
            if !t.more.is_empty() {
                // the last M keys (each shares the slot of its user key's state)
                a.arg(t.more.len());
                for (ov, policy, key) in t.more {
                    a.arg(ov.as_more());
                    a.key(override_key(prefix, policy, key));
                }
            }
        }
        Wire::Script {
            id: ScriptId::Layered,
            args: a,
            tag: None,
        }
    }

    fn read(&self, sc: &ShardConfig, reply: Reply) -> Result<LayeredChecked> {
        let layers = self.layers;
        if let Some(t) = self.tail {
            if let Some((v, j)) = override_entry(sc, "layered", &reply, t.more.len())? {
                return Ok(LayeredChecked::Override(v, j));
            }
        }
        let r = ints(sc, "layered", &reply)?;
        if r.len() != 3 + 5 * layers.len() {
            return Err(implausible(
                sc,
                &r,
                &format!("not 3 + 5 x {} values", layers.len()),
            ));
        }
        let outcomes = (0..layers.len())
            .map(|i| outcome(&r[3 + 5 * i..8 + 5 * i], sc, layers[i].0.compiled.limit))
            .collect::<Result<Vec<_>>>()?;
        if r[0] < 0 {
            return Err(implausible(sc, &r, "a negative time"));
        }
        // the deciding layer, 1-based, 0 for none
        if r[1] < 0 || r[1] as usize > layers.len() {
            return Err(implausible(
                sc,
                &r,
                &format!("no layer {} of {}", r[1], layers.len()),
            ));
        }
        Ok(LayeredChecked::Decided(LayeredRaw {
            now: r[0] as u64,
            deciding: (r[1] as usize).checked_sub(1),
            blocked: block_verdict(sc, &r, r[2])?,
            outcomes,
        }))
    }
}

/// Gives back what a layered check admitted on one shard at `now` (`main_refund.lua`).
pub(crate) struct RefundRequest<'a> {
    pub layers: &'a [(LayerReq<'a>, &'a str)],
    pub now: u64,
}

impl ScriptCall for RefundRequest<'_> {
    type Reply = ();

    fn wire(&self, prefix: &str) -> Wire<'_> {
        let mut a = ScriptArgs::default();
        a.arg(self.now).arg(self.layers.len());
        for (l, key_scope) in self.layers {
            a.key(state_key(prefix, key_scope, l.key))
                .arg(l.compiled.algorithm.code())
                .arg(l.compiled.period_us)
                .arg(l.cost)
                .arg(layer_extra(l));
        }
        Wire::Script {
            id: ScriptId::Refund,
            args: a,
            tag: None,
        }
    }

    fn read(&self, sc: &ShardConfig, reply: Reply) -> Result<()> {
        match reply {
            Reply::Int(_) => Ok(()),
            other => Err(unexpected(sc, "refund", &other)),
        }
    }
}

/// A layer's 7th algorithm argument (see `CheckRequest::write`): the per-key window shift
/// or exact interval denominator of its limit, or "" (no layer is a concurrency limit, so
/// none takes a lease).
fn layer_extra(l: &LayerReq<'_>) -> Extra {
    extra_arg(&l.compiled, l.key)
}

/// The tail of a layered call of one key's layers (`core/lua/main_layered.lua`): the
/// override version compared first, and shadow counting.
pub(crate) struct LayeredTail<'a> {
    pub ov: OverrideArg,
    /// the policy whose override entry and shadow hash these are
    pub policy: &'a str,
    /// the user key
    pub key: &'a str,
    pub shadow: bool,
    /// a layered check of layers whose policies take overrides: each such (policy, user
    /// key)'s override version (never `Off`) compared in the same call; empty otherwise
    pub more: &'a [(OverrideArg, &'a str, &'a str)],
}

impl LayeredTail<'_> {
    /// The tail's override entry key and version argument, as the layered and the
    /// multi-limit settle scripts read them: with `Off` the key is never read (the key's
    /// block key, of the same slot, stands in). The entry shares the slot of the key's
    /// state (its hash tag is the key's).
    pub fn push_override(&self, prefix: &str, a: &mut ScriptArgs) {
        match self.ov {
            OverrideArg::Off => a.key(block_key(prefix, self.key)),
            _ => a.key(override_key(prefix, self.policy, self.key)),
        };
        a.arg(self.ov);
    }
}

/// What a layered script answered (as [`Checked`] for one check): the decision, or an
/// override entry that is not the one sent, with its index (0: the tail's `ov`, `j`: the
/// `j`-th of `more`).
pub(crate) enum LayeredChecked {
    Decided(LayeredRaw),
    Override(Vec<u8>, usize),
}
