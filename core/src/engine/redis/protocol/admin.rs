//! The scripts besides checks and settles: releasing a lease (`release.lua`), resetting a
//! key (`reset.lua`) and a reshard handoff's dump and restore (`migrate_dump.lua`,
//! `migrate_restore.lua`): their arguments and replies.

use crate::config::ShardConfig;
use crate::engine::redis::keys::{block_key, state_key};
use crate::engine::redis::scripts::ScriptId;
use crate::engine::redis::{unexpected, ScriptArgs, ScriptCall, Wire};
use crate::error::Result;
use crate::policy::{Compiled, PolicyInner};
use crate::transport::resp::Reply;

/// Releases `units` of concurrency lease `lease` of `key` under `policy` (`release.lua`);
/// answers whether the lease was held.
pub(crate) struct ReleaseRequest<'a> {
    pub policy: &'a PolicyInner,
    pub key: &'a str,
    pub lease: &'a str,
    pub units: u64,
    pub now_us: Option<u64>,
    /// the lease of an acquire that gave up at its deadline: when it is not found (its
    /// acquire has not run yet), a tombstone is left for the lease TTL, and that acquire,
    /// if it runs later, grants nothing
    pub late: bool,
}

impl ScriptCall for ReleaseRequest<'_> {
    type Reply = bool;

    fn wire(&self, prefix: &str) -> Wire<'_> {
        let mut a = ScriptArgs::default();
        a.key(state_key(prefix, &self.policy.key_scope, self.key))
            .arg(self.lease)
            .arg(self.units)
            .arg(self.now_us.unwrap_or(0))
            // how long a tombstone lives (0: none)
            .arg(if self.late {
                self.policy.compiled.period_us
            } else {
                0
            });
        Wire::Script {
            id: ScriptId::Release,
            args: a,
            tag: None,
        }
    }

    fn read(&self, sc: &ShardConfig, reply: Reply) -> Result<bool> {
        match reply {
            Reply::Int(n @ (0 | 1)) => Ok(n == 1),
            other => Err(unexpected(sc, "release", &other)),
        }
    }
}

/// The window arguments of `reset.lua` and `migrate_dump.lua` for `key`: the window (µs;
/// 0 for an algorithm without windows) and the key's window offset.
fn window_args(c: &Compiled, key: &str) -> (u64, u64) {
    let window = if c.algorithm.is_windowed() {
        c.period_us
    } else {
        0
    };
    (window, c.shift_us(key))
}

/// Deletes `key`'s state for `policy` (`reset.lua`).
pub(crate) struct ResetRequest<'a> {
    pub policy: &'a PolicyInner,
    pub key: &'a str,
    pub now_us: Option<u64>,
}

impl ScriptCall for ResetRequest<'_> {
    type Reply = ();

    fn wire(&self, prefix: &str) -> Wire<'_> {
        let (window, shift) = window_args(&self.policy.compiled, self.key);
        let mut a = ScriptArgs::default();
        a.key(state_key(prefix, &self.policy.key_scope, self.key))
            .arg(self.now_us.unwrap_or(0))
            .arg(window)
            .arg(shift);
        Wire::Script {
            id: ScriptId::Reset,
            args: a,
            tag: None,
        }
    }

    fn read(&self, sc: &ShardConfig, reply: Reply) -> Result<()> {
        match reply {
            Reply::Int(_) => Ok(()),
            other => Err(unexpected(sc, "reset", &other)),
        }
    }
}

/// One Redis key's state, as a handoff moves it: (name, pttl in ms or 0, DUMP payload).
pub(crate) type Dumped = (String, i64, Vec<u8>);

/// Reads `key`'s state for `policy` and its block entry (`migrate_dump.lua`), for a
/// handoff: one [`Dumped`] per existing key.
pub(crate) struct DumpRequest<'a> {
    pub policy: &'a PolicyInner,
    pub key: &'a str,
    pub now_us: Option<u64>,
}

impl ScriptCall for DumpRequest<'_> {
    type Reply = Vec<Dumped>;

    fn wire(&self, prefix: &str) -> Wire<'_> {
        let (window, shift) = window_args(&self.policy.compiled, self.key);
        let mut a = ScriptArgs::default();
        a.key(state_key(prefix, &self.policy.key_scope, self.key))
            .key(block_key(prefix, self.key))
            .arg(self.now_us.unwrap_or(0))
            .arg(window)
            .arg(shift);
        Wire::Script {
            id: ScriptId::MigrateDump,
            args: a,
            tag: None,
        }
    }

    fn read(&self, sc: &ShardConfig, reply: Reply) -> Result<Vec<Dumped>> {
        let Reply::Array(items) = reply else {
            return Err(unexpected(sc, "migrate_dump", &reply));
        };
        // three keys at most (two windows and the block entry): more is not this script's
        if items.len() > 9 {
            return Err(unexpected(sc, "migrate_dump", &Reply::Array(items)));
        }
        let mut out = Vec::new();
        for t in items.chunks(3) {
            if let [Reply::Str(name), Reply::Int(ttl), Reply::Str(payload)] = t {
                out.push((
                    String::from_utf8_lossy(name).into_owned(),
                    *ttl,
                    payload.clone(),
                ));
            }
        }
        Ok(out)
    }
}

/// Writes state read by a [`DumpRequest`] where the shard has none yet
/// (`migrate_restore.lua`); answers how many keys it wrote.
pub(crate) struct RestoreRequest<'a> {
    /// never empty
    pub items: &'a [Dumped],
}

impl ScriptCall for RestoreRequest<'_> {
    type Reply = u64;

    fn wire(&self, _: &str) -> Wire<'_> {
        let mut a = ScriptArgs::default();
        for (name, ttl, payload) in self.items {
            a.key(name).arg(*ttl).arg(&payload[..]);
        }
        Wire::Script {
            id: ScriptId::MigrateRestore,
            args: a,
            tag: None,
        }
    }

    fn read(&self, sc: &ShardConfig, reply: Reply) -> Result<u64> {
        match reply {
            Reply::Int(n) => Ok(n.max(0) as u64),
            other => Err(unexpected(sc, "migrate_restore", &other)),
        }
    }
}
