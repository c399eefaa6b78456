//! The scripts' arguments and replies: how a check call is built and how its reply is read
//! and checked (every value from Redis is untrusted).

use super::*;

/// How a check script runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Check,
    Peek,
    /// Admit between `need` and `cost` units, as many as are available (local admission).
    Grant {
        need: u64,
    },
}

/// The longest duration a script reply can carry: a bucket's span plus the longest window
/// (block TTLs are shorter). Anything longer is not a reply of our scripts.
pub(super) const MAX_REPLY_US: i64 =
    (crate::policy::MAX_BUCKET_SPAN_US + crate::policy::MAX_PERIOD_US) as i64;

/// An error for a script reply that our scripts cannot have given: every value read from
/// Redis is checked before it becomes part of a decision.
pub(super) fn implausible(shard: &ShardConfig, r: &[i64], why: &str) -> Error {
    let shown = &r[..r.len().min(12)];
    let more = if r.len() > shown.len() { " ..." } else { "" };
    Error::Script {
        shard: shard.name.clone(),
        message: format!("implausible script reply {shown:?}{more}: {why}"),
    }
}

/// The outcome in `r` (allowed, remaining, reset_after, retry_after, delay), checked
/// against the limit it was computed for.
pub(super) fn outcome(r: &[i64], shard: &ShardConfig, limit: u64) -> Result<Outcome> {
    if r.len() < 5 {
        return Err(implausible(shard, r, "fewer than 5 values"));
    }
    if !(0..=1).contains(&r[0]) {
        return Err(implausible(shard, r, "allowed is neither 0 nor 1"));
    }
    if r[1] < 0 || r[1] as u64 > limit {
        return Err(implausible(
            shard,
            r,
            &format!("remaining outside 0..={limit}"),
        ));
    }
    let span = |v: i64| (0..=MAX_REPLY_US).contains(&v);
    if !span(r[2]) || !span(r[4]) || !(r[3] == -1 || span(r[3])) {
        return Err(implausible(shard, r, "a duration out of range"));
    }
    Ok(Outcome {
        allowed: r[0] == 1,
        remaining: r[1] as u64,
        reset_us: r[2] as u64,
        retry_us: (r[3] >= 0).then_some(r[3] as u64),
        delay_us: r[4] as u64,
    })
}

/// A block verdict of a reply: 0 not blocked, 1 blocked, 2 blocked by this denial.
pub(super) fn block_verdict(shard: &ShardConfig, r: &[i64], v: i64) -> Result<u8> {
    match v {
        0..=2 => Ok(v as u8),
        _ => Err(implausible(
            shard,
            r,
            "a block verdict other than 0, 1 or 2",
        )),
    }
}

pub(super) fn auto_block_args(a: Option<&AutoBlock>) -> (u64, u64, u64) {
    match a {
        Some(a) => (
            a.after,
            a.within.as_millis() as u64,
            a.duration.as_millis() as u64,
        ),
        None => (0, 0, 0),
    }
}

impl RedisEngine {
    /// The script call of one check: `EVALSHA <sha1> ...`, or with `eval` the whole
    /// source (`EVAL <script> ...`, after a NOSCRIPT reply).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_cmd(
        &self,
        eval: bool,
        policy: &PolicyInner,
        eff: &Compiled,
        key: &str,
        now_us: Option<u64>,
        cost: u64,
        mode: Mode,
        lease_id: &str,
        tag: u64,
    ) -> redis::Cmd {
        let (after, within, dur) = auto_block_args(policy.auto_block.as_ref());
        let (mode_s, need) = match mode {
            Mode::Check => ("check", 0),
            Mode::Peek => ("peek", 0),
            Mode::Grant { need } => ("grant", need),
        };
        let mut cmd = if eval {
            let mut c = redis::cmd("EVAL");
            c.arg(scripts::source_for_algorithm(eff.algorithm));
            c
        } else {
            let mut c = redis::cmd("EVALSHA");
            c.arg(scripts::for_algorithm(eff.algorithm).get_hash());
            c
        };
        // the order of core/lua/main_check.lua: keys, the check's own arguments (CHECK_ITEM_ARGS),
        // then its policy's (CHECK_SHAPE_ARGS), which a batch call sends once per policy
        cmd.arg(3)
            .arg(state_key(&self.prefix, &policy.key_scope, key))
            .arg(block_key(&self.prefix, key))
            .arg(denial_key(&self.prefix, &policy.key_scope, key))
            .arg(now_us.unwrap_or(0))
            .arg(cost)
            .arg(lease_id)
            .arg(need)
            .arg(eff.algorithm.code())
            .arg(eff.limit)
            .arg(eff.period_us)
            .arg(mode_s);
        if after > 0 {
            cmd.arg(after)
                .arg(within)
                .arg(dur)
                .arg(format!("auto: policy {}", policy.name));
        } else {
            cmd.arg(0).arg(0).arg(0).arg("");
        }
        cmd.arg(tag);
        cmd
    }

    /// The [`Raw`] outcome of a check of `cost` units against `limit` in reply `r`.
    pub(super) fn check_reply(
        &self,
        shard: usize,
        r: &[i64],
        limit: u64,
        cost: u64,
    ) -> Result<Raw> {
        let sc = &self.shards[shard];
        if r.len() != 7 {
            return Err(implausible(sc, r, "not 7 values"));
        }
        let o = outcome(r, sc, limit)?;
        let granted = r[6];
        if granted < 0 || granted as u64 > cost || (granted > 0 && !o.allowed) {
            return Err(implausible(
                sc,
                r,
                &format!("{granted} units admitted of {cost}"),
            ));
        }
        Ok(Raw {
            outcome: o,
            blocked: block_verdict(sc, r, r[5])?,
            granted: granted as u64,
        })
    }

    /// The [`Raw`] outcome of a check script's reply.
    pub(super) fn script_reply(
        &self,
        shard: usize,
        reply: Reply,
        limit: u64,
        cost: u64,
    ) -> Result<Raw> {
        let script_error = |message: String| Error::Script {
            shard: self.shards[shard].name.clone(),
            message,
        };
        let r = match reply {
            Reply::Array(items) => items
                .iter()
                .map(|i| match i {
                    Reply::Int(n) => Ok(*n),
                    other => Err(script_error(format!("unexpected script reply {other:?}"))),
                })
                .collect::<Result<Vec<i64>>>()?,
            Reply::Error(e) => return Err(script_error(e)),
            other => return Err(script_error(format!("unexpected script reply {other:?}"))),
        };
        self.check_reply(shard, &r, limit, cost)
    }
}
