//! The scripts' arguments and replies: how a check call is built and how its reply is read
//! and checked (every value from Redis is untrusted).

use super::*;
use crate::policy::Algorithm;

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

/// The longest duration a script reply can carry: twice a bucket's span (a bucket in debt,
/// see `core/lua/settle.lua`, is filled to at most twice its capacity) plus the longest
/// window (block TTLs are shorter). Anything longer is not a reply of our scripts.
pub(super) const MAX_REPLY_US: i64 =
    (2 * crate::policy::MAX_BUCKET_SPAN_US + crate::policy::MAX_PERIOD_US) as i64;

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
/// A block verdict of a reply (the scripts' 0, 1, 2).
pub(super) fn block_verdict(shard: &ShardConfig, r: &[i64], v: i64) -> Result<BlockVerdict> {
    match v {
        0 => Ok(BlockVerdict::Clear),
        1 => Ok(BlockVerdict::Blocked),
        2 => Ok(BlockVerdict::BlockedNow),
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

/// The layout of a check call (`core/lua/main_check.lua`): after `numkeys`, its keys, its
/// own arguments, its policy's (which a batch call, `main_batch.lua`, sends once per
/// distinct set) and its tag. [`CheckRequest::write`] is the one place that writes them;
/// the pipe regroups a burst's calls by these counts.
pub(crate) const CHECK_KEYS: usize = 4;
pub(crate) const CHECK_ITEM_ARGS: usize = 5;
pub(crate) const CHECK_SHAPE_ARGS: usize = 8;
pub(crate) const CHECK_TAG_ARGS: usize = 1;

/// Where the groups of a check call's arguments begin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CheckPart {
    Item,
    Shape,
    Tag,
}

/// What a check call's arguments are written to: a `redis::Cmd`, or the pipe's packed call.
pub(crate) trait CheckSink {
    fn arg(&mut self, a: &[u8]);
    /// The next argument is the first of `part`.
    fn mark(&mut self, _part: CheckPart) {}
    fn int(&mut self, v: u64) {
        self.arg(itoa::Buffer::new().format(v).as_bytes());
    }
}

impl CheckSink for redis::Cmd {
    fn arg(&mut self, a: &[u8]) {
        redis::Cmd::arg(self, a);
    }
}

/// One check script call, typed; strings exist only in [`CheckRequest::write`].
pub(crate) struct CheckRequest<'a> {
    pub policy: &'a PolicyInner,
    pub eff: &'a Compiled,
    pub key: &'a str,
    /// the injected clock (µs), or `None` for the server's `TIME`
    pub now_us: Option<u64>,
    pub cost: u64,
    pub mode: Mode,
    pub lease: Option<&'a str>,
    /// echoed as the last value of the reply (see `transport::batch::untag`)
    pub tag: u64,
    /// the override the check was decided with (`limiter/overrides.rs`)
    pub ov: OverrideArg,
}

/// What a check tells its script about the key's override: the policy takes none (the
/// script reads nothing more), or the version the client holds (none, or one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OverrideArg {
    Off,
    None,
    Cached(u64),
}

/// As a script argument (the scripts' one rule): `"-"` the policy takes no overrides,
/// `""` none is cached, else the cached version.
impl redis::ToRedisArgs for OverrideArg {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match self {
            OverrideArg::Off => "-".write_redis_args(out),
            OverrideArg::None => "".write_redis_args(out),
            OverrideArg::Cached(v) => v.write_redis_args(out),
        }
    }
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
    pub fn push_override(&self, prefix: &str, inv: &mut redis::ScriptInvocation<'_>) {
        match self.ov {
            OverrideArg::Off => inv.key(block_key(prefix, self.key)),
            _ => inv.key(override_key(prefix, self.policy, self.key)),
        };
        inv.arg(self.ov);
    }
}

/// What a layered script answered (as [`Checked`] for one check): the decision, or an
/// override entry that is not the one sent, with its index (0: the tail's `ov`, `j`: the
/// `j`-th of `more`).
pub(crate) enum LayeredChecked {
    Decided(LayeredRaw),
    Override(Vec<u8>, usize),
}

/// What a check script answered: a decision, or the key's override entry when it is not
/// the one the call was made with (`""`: none); then nothing was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Checked {
    Decided(Raw),
    Override(Vec<u8>),
}

impl CheckRequest<'_> {
    /// Writes the call's arguments after `numkeys`, in the order of `main_check.lua`.
    pub fn write(&self, prefix: &str, out: &mut impl CheckSink) {
        let (p, eff) = (self.policy, self.eff);
        out.arg(state_key(prefix, &p.key_scope, self.key).as_bytes());
        let block = block_key(prefix, self.key);
        out.arg(block.as_bytes());
        out.arg(denial_key(prefix, &p.key_scope, self.key).as_bytes());
        match self.ov {
            // never read: any key of the call's slot will do
            OverrideArg::Off => out.arg(block.as_bytes()),
            _ => out.arg(override_key(prefix, &p.name, self.key).as_bytes()),
        }
        let (mode, need) = match self.mode {
            Mode::Check => ("check", 0),
            Mode::Peek => ("peek", 0),
            Mode::Grant { need } => ("grant", need),
        };
        out.mark(CheckPart::Item);
        out.int(self.now_us.unwrap_or(0)); // 0: the script reads TIME
        out.int(self.cost);
        // the algorithm's 7th argument: a concurrency limit's lease id; for a per-key window
        // offset the key's shift, for an exact bucket interval its denominator; "" otherwise
        // (an acquire on another algorithm has a lease id that its script must not see)
        match (eff.algorithm, eff.extra_arg(self.key)) {
            (Algorithm::Concurrency, _) => out.arg(self.lease.unwrap_or("").as_bytes()),
            (_, Some(extra)) => out.int(extra),
            (_, None) => out.arg(b""),
        }
        out.int(need);
        match self.ov {
            OverrideArg::Off => out.arg(b"-"),
            OverrideArg::None => out.arg(b""),
            OverrideArg::Cached(v) => out.int(v),
        }
        out.mark(CheckPart::Shape);
        out.arg(eff.algorithm.code().as_bytes());
        out.int(eff.limit);
        out.int(eff.period_us);
        out.arg(mode.as_bytes());
        let (after, within, dur) = auto_block_args(p.auto_block.as_ref());
        out.int(after);
        out.int(within);
        out.int(dur);
        if after > 0 {
            out.arg(format!("auto: policy {}", p.name).as_bytes());
        } else {
            out.arg(b"");
        }
        out.mark(CheckPart::Tag);
        out.int(self.tag);
    }

    /// The call as a command: `EVALSHA <sha1> 3 ...`, or with `eval` the whole source
    /// (`EVAL <script> 3 ...`, after a NOSCRIPT reply).
    pub fn cmd(&self, prefix: &str, eval: bool) -> redis::Cmd {
        let id = ScriptId::Check(self.eff.algorithm);
        let mut cmd = if eval {
            let mut c = redis::cmd("EVAL");
            c.arg(id.source());
            c
        } else {
            let mut c = redis::cmd("EVALSHA");
            c.arg(id.script().get_hash());
            c
        };
        cmd.arg(CHECK_KEYS);
        self.write(prefix, &mut cmd);
        cmd
    }
}

impl RedisEngine {
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
    ) -> Result<Checked> {
        let script_error = |message: String| Error::Script {
            shard: self.shards[shard].name.clone(),
            message,
        };
        let r = match reply {
            // {'o', entry, 0} after its tag came off (core/lua/check.lua): without the tag
            // the 0 would have been compared as one, so this shape is always the call's own
            Reply::Array(items)
                if items.len() == 3 && matches!(&items[0], Reply::Str(s) if s == b"o") =>
            {
                let mut items = items.into_iter().skip(1);
                return match (items.next(), items.next()) {
                    (Some(Reply::Str(v)), Some(Reply::Int(0))) => Ok(Checked::Override(v)),
                    other => Err(script_error(format!(
                        "unexpected override entry in a script reply: {other:?}"
                    ))),
                };
            }
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
            .map(Checked::Decided)
    }
}
