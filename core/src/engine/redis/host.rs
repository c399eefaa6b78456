//! The engine's side of checks whose bytes the host moves (`transport/sansio.rs`,
//! `limiter/host.rs`): the same call building, circuit gate, error mapping, latency and
//! circuit accounting and reply checks as [`RedisEngine::check`] over the pipe.

use super::*;
use crate::transport::blocking::Target;

impl RedisEngine {
    /// Where shard `shard` listens and how to log in, when the host can move its bytes:
    /// a standalone Redis over plain TCP. `Err` names what is not.
    pub(crate) fn host_target(&self, shard: usize) -> Result<&Target> {
        let refuse = |what: &str| {
            Err(Error::config(
                format!("shards[{shard}]"),
                format!(
                    "the host transport moves the bytes of standalone Redis shards over plain \
                     TCP only; shard {} is {what}",
                    self.shards[shard].name
                ),
            ))
        };
        if self.cluster_nodes.is_some() {
            return refuse("a Redis Cluster");
        }
        match &self.targets[shard] {
            Some(t) if t.is_tls() => refuse("behind TLS"),
            Some(t) if t.tcp().is_some() => Ok(t),
            Some(_) => refuse("a Unix socket"),
            None => refuse("behind Sentinel"),
        }
    }

    /// The circuit's verdict before a check is sent (fails fast while it is open).
    pub(crate) fn host_gate(&self, shard: usize) -> Result<()> {
        self.gate(shard, &Breaker::Shard)
    }

    /// The script call of `req`, as the pipe sends it.
    pub(crate) fn host_call(&self, req: &CheckRequest<'_>) -> CheckCall {
        CheckCall::new(
            scripts::check_scripts(req.eff.algorithm),
            false,
            req.tag,
            |c| req.write(&self.prefix, c),
        )
    }

    /// What the check sent at `start` to shard `shard` got: its reply (or the I/O error
    /// instead), accounted for the circuit and latency, then read as a check's reply.
    pub(crate) fn host_finish(
        self: &Arc<Self>,
        shard: usize,
        start: Instant,
        reply: std::io::Result<Reply>,
        limit: u64,
        cost: u64,
    ) -> Result<Checked> {
        let st = self.state()?;
        let r = match reply {
            Ok(Reply::Error(e)) if call::refused_reply(&e) => Err(self.refused(shard, &e)),
            Ok(reply) => {
                self.connect_ok(shard);
                Ok(reply)
            }
            Err(e) => Err(self.io_error(shard, e)),
        };
        self.account(&st, shard, &Breaker::Shard, start, &r);
        // (the host transport carries checks in mode check only, as `host_call` writes them)
        check_script_reply(&self.shards[shard], r?, limit, cost, true)
    }
}
