//! The scripts' arguments and replies: how a check call is built and how its reply is read
//! and checked (every value from Redis is untrusted).

use crate::config::ShardConfig;
use crate::engine::outcome::{BlockVerdict, Outcome, Raw};
use crate::engine::redis::keys::{block_key, denial_key, override_key, shadow_key, state_key};
use crate::engine::redis::scripts::ScriptId;
use crate::engine::redis::{SHADOW_MAX_KEYS, SHADOW_TTL};
use crate::error::{Error, Result};
use crate::policy::{Algorithm, AutoBlock, Compiled, PolicyInner};
use crate::transport::resp::Reply;

mod admin;
mod layered;
mod settle;
pub(crate) use admin::{DumpRequest, Dumped, ReleaseRequest, ResetRequest, RestoreRequest};
pub(crate) use layered::{LayeredChecked, LayeredRequest, LayeredTail, RefundRequest};
pub(crate) use settle::{MultiSettled, SettleCall, SettleMultiRequest, SettleRequest, Settled};

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

/// The retry_after of an acquire refused because its lease was released before it ran
/// (`concurrency.lua`'s tombstones): nothing was granted.
pub(super) const RELEASED_ALREADY: i64 = -2;

/// What an acquire refused by its lease's tombstone is to its caller. Only an acquire that
/// gave up at its deadline (its late lease released by the client) meets one, and nobody
/// waits for its reply; an id sent again after its release would be answered this way.
pub(super) fn released_already() -> Error {
    Error::InvalidArgument {
        what: "lease".into(),
        message: "the lease was released before its acquire ran; nothing was granted".into(),
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
    if r[0] == 0 && r[3] == RELEASED_ALREADY {
        return Err(released_already());
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

/// The block reason automatic blocking writes (`""` when the policy blocks nothing).
pub(super) fn auto_block_reason(after: u64, policy: &str) -> String {
    if after > 0 {
        format!("auto: policy {policy}")
    } else {
        String::new()
    }
}

/// An algorithm's 7th argument besides a lease id (see [`CheckRequest::write`]): the
/// per-key window shift or the exact interval's denominator, `""` for none.
pub(super) struct Extra(Option<u64>);

pub(super) fn extra_arg(eff: &Compiled, key: &str) -> Extra {
    Extra(eff.extra_arg(key))
}

impl redis::ToRedisArgs for Extra {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match self.0 {
            Some(x) => x.write_redis_args(out),
            None => "".write_redis_args(out),
        }
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

pub(crate) use crate::wire::{CheckPart, CheckSink};

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

impl OverrideArg {
    /// As one of a layered call's further versions (`LayeredTail::more`): the cached
    /// version, or `""` for none.
    pub fn as_more(self) -> OverrideArg {
        match self {
            OverrideArg::Cached(v) => OverrideArg::Cached(v),
            _ => OverrideArg::None,
        }
    }
}

/// What a check script answered: a decision, or the key's override entry when it is not
/// the one the call was made with (`""`: none); then nothing was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Checked {
    Decided(Raw),
    Override(Vec<u8>),
}

impl CheckRequest<'_> {
    /// Writes the call's keys and arguments after `numkeys`, in the layout of
    /// `core/lua/check.lua`: only what the policy and the call use (a feature the policy
    /// does not use costs no key and no argument), the tag last.
    pub fn write(&self, prefix: &str, out: &mut impl CheckSink) {
        let (p, eff) = (self.policy, self.eff);
        let (after, within, dur) = auto_block_args(p.auto_block.as_ref());
        let mut flags = [0u8; 8];
        let mut nf = 0;
        let mut flag = |c: u8| {
            flags[nf] = c;
            nf += 1;
        };
        if self.now_us.is_some() {
            flag(b'n');
        }
        // the algorithm's extra argument: a concurrency limit's lease id; for a per-key
        // window offset the key's shift, for an exact bucket interval its denominator;
        // none otherwise (an acquire on another algorithm has a lease id that its script
        // must not see)
        let extra = match (eff.algorithm, eff.extra_arg(self.key)) {
            (Algorithm::Concurrency, _) => {
                self.lease.filter(|l| !l.is_empty()).map(CheckExtra::Lease)
            }
            (_, Some(x)) => Some(CheckExtra::Int(x)),
            (_, None) => None,
        };
        if extra.is_some() {
            flag(b'x');
        }
        match self.mode {
            Mode::Check => {}
            Mode::Peek => flag(b'p'),
            Mode::Grant { .. } => flag(b'g'),
        }
        if self.ov != OverrideArg::Off {
            flag(b'o');
        }
        if after > 0 {
            flag(b'a');
        }
        out.arg(state_key(prefix, &p.key_scope, self.key).as_bytes());
        out.arg(block_key(prefix, self.key).as_bytes());
        if after > 0 {
            out.arg(denial_key(prefix, &p.key_scope, self.key).as_bytes());
        }
        if self.ov != OverrideArg::Off {
            out.arg(override_key(prefix, &p.name, self.key).as_bytes());
        }
        out.mark(CheckPart::Item);
        out.int(self.cost);
        if nf > 0 {
            out.arg(&flags[..nf]);
            if let Some(now) = self.now_us {
                out.int(now);
            }
            match extra {
                Some(CheckExtra::Lease(l)) => out.arg(l.as_bytes()),
                Some(CheckExtra::Int(x)) => out.int(x),
                None => {}
            }
            if let Mode::Grant { need } = self.mode {
                out.int(need);
            }
            match self.ov {
                OverrideArg::Off => {}
                OverrideArg::None => out.arg(b""),
                OverrideArg::Cached(v) => out.int(v),
            }
        }
        out.mark(CheckPart::Shape);
        out.int(eff.limit);
        out.int(eff.period_us);
        if after > 0 {
            out.int(after);
            out.int(within);
            out.int(dur);
            out.arg(auto_block_reason(after, &p.name).as_bytes());
        }
        out.mark(CheckPart::Tag);
        out.int(self.tag);
    }

    /// The call as a command: `EVALSHA <sha1> <numkeys> ...`, or with `eval` the whole
    /// source (`EVAL <script> <numkeys> ...`, after a NOSCRIPT reply).
    pub fn cmd(&self, prefix: &str, eval: bool) -> redis::Cmd {
        let mut a = ScriptArgs::default();
        self.write(prefix, &mut a);
        a.cmd(ScriptId::Check(self.eff.algorithm), eval)
    }
}

/// The extra argument of a check ([`CheckRequest::write`]).
enum CheckExtra<'a> {
    Lease(&'a str),
    Int(u64),
}

/// The [`Raw`] outcome of a check of `cost` units against `limit` in reply `r`.
pub(super) fn check_reply(sc: &ShardConfig, r: &[i64], limit: u64, cost: u64) -> Result<Raw> {
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

/// The error of a script reply of an unexpected shape (`what`: which script's), showing
/// a bounded part of it.
pub(super) fn unexpected(sc: &ShardConfig, what: &str, reply: &Reply) -> Error {
    Error::Script {
        shard: sc.name.clone(),
        message: match reply {
            Reply::Error(e) => e.chars().take(500).collect(),
            other => format!(
                "unexpected {what} reply {:?}",
                crate::transport::resp::Shown(other)
            ),
        },
    }
}

/// A script reply that is an override entry (`{'o', entry, j}`, `core/lua/check.lua`):
/// the entry (`""` or nil: none) and `j` (0: the call's own key; `1..=more`: the `j`-th of
/// a layered call's other keys). `Ok(None)`: not an entry. Only a reply of 3 values whose
/// first is the string `o` is one (a decision is all integers).
pub(super) fn override_entry(
    sc: &ShardConfig,
    what: &str,
    reply: &Reply,
    more: usize,
) -> Result<Option<(Vec<u8>, usize)>> {
    let Reply::Array(items) = reply else {
        return Ok(None);
    };
    if items.len() != 3 || !matches!(&items[0], Reply::Str(s) if s == b"o") {
        return Ok(None);
    }
    let bad = || Error::Script {
        shard: sc.name.clone(),
        message: format!(
            "unexpected override entry in a {what} reply: {:?}",
            crate::transport::resp::Shown(reply)
        ),
    };
    let entry = match &items[1] {
        Reply::Str(v) => v.clone(),
        Reply::Nil => Vec::new(),
        _ => return Err(bad()),
    };
    match &items[2] {
        Reply::Int(j) if (0..=more as i64).contains(j) => Ok(Some((entry, *j as usize))),
        _ => Err(bad()),
    }
}

/// The integers of a decision reply (`what`: which script's).
pub(super) fn ints(sc: &ShardConfig, what: &str, reply: &Reply) -> Result<Vec<i64>> {
    let Reply::Array(items) = reply else {
        return Err(unexpected(sc, what, reply));
    };
    items
        .iter()
        .map(|i| match i {
            Reply::Int(n) => Ok(*n),
            _ => Err(unexpected(sc, what, reply)),
        })
        .collect()
}

/// A check script's reply (its tag taken off): a decision, or the key's override entry.
/// `short`: the call may be answered in short (a check in mode check:
/// `core/lua/check_plain.lua`'s `{remaining, reset_after}` for an admission with no
/// retry, no delay and no block, of all `cost` units).
pub(super) fn check_script_reply(
    sc: &ShardConfig,
    reply: Reply,
    limit: u64,
    cost: u64,
    short: bool,
) -> Result<Checked> {
    // {'o', entry, 0} after its tag came off (core/lua/check.lua): without the tag the 0
    // would have been compared as one, so this shape is always the call's own
    if let Some((v, _)) = override_entry(sc, "script", &reply, 0)? {
        return Ok(Checked::Override(v));
    }
    let r = ints(sc, "script", &reply)?;
    if short && r.len() == 2 {
        // checked as the whole reply it stands for
        let whole = [1, r[0], r[1], -1, 0, 0, cost.min(i64::MAX as u64) as i64];
        return check_reply(sc, &whole, limit, cost).map(Checked::Decided);
    }
    check_reply(sc, &r, limit, cost).map(Checked::Decided)
}

/// The keys and arguments of one script call, in the order its script reads them; packed
/// into `EVALSHA`/`EVAL` by the redis crate's command encoder ([`ScriptArgs::cmd`]).
pub(crate) struct ScriptArgs {
    keys: redis::Cmd,
    args: redis::Cmd,
    /// a check's arguments written through [`CheckSink`]: the keys come first, then the
    /// arguments from [`CheckPart::Item`] on
    in_args: bool,
}

impl Default for ScriptArgs {
    fn default() -> Self {
        ScriptArgs {
            keys: redis::Cmd::new(),
            args: redis::Cmd::new(),
            in_args: false,
        }
    }
}

impl ScriptArgs {
    pub fn key(&mut self, k: impl redis::ToRedisArgs) -> &mut Self {
        self.keys.arg(k);
        self
    }

    pub fn arg(&mut self, a: impl redis::ToRedisArgs) -> &mut Self {
        self.args.arg(a);
        self
    }

    /// The first key (in a Cluster it picks the call's circuit: every key of a call shares
    /// its slot).
    pub fn first_key(&self) -> Option<String> {
        match self.keys.args_iter().next()? {
            redis::Arg::Simple(k) => Some(String::from_utf8_lossy(k).into_owned()),
            _ => None,
        }
    }

    /// The call as a command: `EVALSHA <sha1> <numkeys> <keys> <args>`, or with `eval` the
    /// whole source (`EVAL <script> ...`, after a NOSCRIPT reply, which loads it again).
    pub fn cmd(&self, id: ScriptId, eval: bool) -> redis::Cmd {
        let mut cmd = script_cmd(id, eval);
        cmd.arg(self.keys.args_iter().len());
        for a in self.keys.args_iter().chain(self.args.args_iter()) {
            if let redis::Arg::Simple(b) = a {
                cmd.arg(b);
            }
        }
        cmd
    }
}

impl CheckSink for ScriptArgs {
    fn arg(&mut self, a: &[u8]) {
        if self.in_args {
            self.args.arg(a);
        } else {
            self.keys.arg(a);
        }
    }
    fn mark(&mut self, part: CheckPart) {
        if part == CheckPart::Item {
            self.in_args = true;
        }
    }
}

/// `EVALSHA <sha1>` of script `id`, or `EVAL <source>`.
pub(super) fn script_cmd(id: ScriptId, eval: bool) -> redis::Cmd {
    if eval {
        let mut c = redis::cmd("EVAL");
        c.arg(id.source());
        c
    } else {
        let mut c = redis::cmd("EVALSHA");
        c.arg(id.script().get_hash());
        c
    }
}

/// What one script call puts on the wire.
pub(crate) enum Wire<'a> {
    /// A check: the pipelined connection may send it in one batch call with its burst's
    /// other checks of the algorithm ([`crate::transport::batch::pack_calls`]).
    Check(&'a CheckRequest<'a>),
    /// Any other script call; `tag`: the tag its reply echoes (a shadow check's).
    Script {
        id: ScriptId,
        args: ScriptArgs,
        tag: Option<u64>,
    },
}

impl Wire<'_> {
    /// The tag the reply must carry (checks), taken off before the reply is read.
    pub fn tag(&self) -> Option<u64> {
        match self {
            Wire::Check(req) => Some(req.tag),
            Wire::Script { tag, .. } => *tag,
        }
    }

    /// The call as one command (EVALSHA, or EVAL with `eval`).
    pub fn cmd(&self, prefix: &str, eval: bool) -> redis::Cmd {
        match self {
            Wire::Check(req) => req.cmd(prefix, eval),
            Wire::Script { id, args, .. } => args.cmd(*id, eval),
        }
    }

    /// In a Cluster, the Redis key whose slot's primary serves the call (see
    /// [`RedisEngine::breaker`]).
    pub fn slot_key(&self, prefix: &str) -> Option<String> {
        match self {
            Wire::Check(req) => Some(state_key(prefix, &req.policy.key_scope, req.key)),
            Wire::Script { args, .. } => args.first_key(),
        }
    }
}

/// One script call, typed: what goes on the wire ([`Wire`]) and how its reply is read.
/// Every script the engine runs is called through one of these (`RedisEngine::call`),
/// so this module is the one description of every script's arguments and reply.
pub(crate) trait ScriptCall: Sync {
    type Reply;
    /// The call's script, keys and arguments (`prefix`: the config's key prefix).
    fn wire(&self, prefix: &str) -> Wire<'_>;
    /// Reads the reply (its tag taken off), checking every value: the bytes are untrusted.
    fn read(&self, sc: &ShardConfig, reply: Reply) -> Result<Self::Reply>;
}

impl ScriptCall for CheckRequest<'_> {
    type Reply = Checked;
    fn wire(&self, _: &str) -> Wire<'_> {
        Wire::Check(self)
    }
    fn read(&self, sc: &ShardConfig, reply: Reply) -> Result<Checked> {
        check_script_reply(
            sc,
            reply,
            self.eff.limit,
            self.cost,
            self.mode == Mode::Check,
        )
    }
}

/// One check in shadow mode (`main_check.lua`'s shadow build): the check's keys, the
/// policy's shadow hash (none in a Redis Cluster, where it would live in another slot than
/// the key), the check's arguments, then the user key and the hash's TTL and bound.
pub(crate) struct ShadowRequest<'a> {
    pub req: &'a CheckRequest<'a>,
    pub cluster: bool,
}

impl ScriptCall for ShadowRequest<'_> {
    type Reply = Checked;

    fn wire(&self, prefix: &str) -> Wire<'_> {
        let req = self.req;
        let mut a = ScriptArgs::default();
        req.write(prefix, &mut a);
        if !self.cluster {
            a.key(shadow_key(prefix, &req.policy.name));
        }
        a.arg(req.key)
            .arg(SHADOW_TTL.as_millis() as u64)
            .arg(SHADOW_MAX_KEYS);
        Wire::Script {
            id: ScriptId::Shadow(req.eff.algorithm),
            args: a,
            tag: Some(req.tag),
        }
    }

    fn read(&self, sc: &ShardConfig, reply: Reply) -> Result<Checked> {
        check_script_reply(sc, reply, self.req.eff.limit, self.req.cost, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acquire_refused_by_its_tombstone_is_an_error_naming_the_lease() {
        let sc = ShardConfig::new("s0", "redis://127.0.0.1:1");
        let e = check_reply(&sc, &[0, 5, 0, RELEASED_ALREADY, 0, 0, 0], 5, 1).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { what, .. } if what == "lease"),
            "{e:?}"
        );
        assert!(!e.is_backend(), "not a failure of the shard");
        // anything else below -1 is still no reply of ours, and granted with it neither
        for r in [[0, 5, 0, -3, 0, 0, 0], [1, 5, 0, RELEASED_ALREADY, 0, 0, 1]] {
            let e = check_reply(&sc, &r, 5, 1).unwrap_err();
            assert!(matches!(e, Error::Script { .. }), "{r:?}: {e:?}");
        }
    }
}
