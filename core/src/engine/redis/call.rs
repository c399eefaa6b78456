//! The call path to a shard: [`RedisEngine::call`] (and its blocking twin) for every script
//! call: circuit gate, deadline, the NOSCRIPT retry, error mapping, latency and circuit
//! accounting, once, over the transports under it (the pipe, a Cluster node's pipe, or a
//! blocking connection); [`RedisEngine::with_conn`] for plain commands.

use super::*;
use crate::transport::resp::{MAX_CHECK_REPLY, MAX_REPLY};

/// One script call on shard `$shard`, the same on the async and the blocking path: the
/// circuit gate ([`RedisEngine::begin`]), one attempt as EVALSHA (`$send` with `$eval`
/// false, `$st` the runtime state), once more as EVAL when the server lost the script,
/// a refusal to serve as a connection failure, and the accounting ([`RedisEngine::finish`]).
/// (A macro, not a function: `$send` is `.await`ed on the async path.)
macro_rules! one_call {
    ($engine:expr, $shard:expr, $wire:expr, |$st:ident, $eval:ident| $send:expr) => {{
        let (st, b, start) = $engine.begin($shard, $wire)?;
        let mut r = {
            let ($st, $eval) = (&*st, false);
            $send
        };
        if lost_scripts(&r) {
            let ($st, $eval) = (&*st, true);
            r = $send;
        }
        $engine.finish(&st, $shard, &b, start, served($engine, $shard, r))
    }};
}

/// True for an error reply that says the server did not serve the command at all rather
/// than that the command failed: it refused the client (`maxclients`, AUTH), is loading,
/// is a replica now (a failover), or its cluster cannot serve the slot. These are backend
/// failures (`connection`), which feed the circuit and close the connection.
pub(super) fn refused_reply(e: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "ERR max number of clients",
        "NOAUTH",
        "WRONGPASS",
        "ERR invalid password",
        "ERR AUTH",
        "NOPERM",
        "LOADING",
        "READONLY",
        "MASTERDOWN",
        "CLUSTERDOWN",
        "TRYAGAIN",
        "BUSY ",
    ];
    PREFIXES.iter().any(|p| e.starts_with(p))
}

pub(super) fn map_redis_error(
    shard: &ShardConfig,
    timeout: Duration,
    e: redis::RedisError,
) -> Error {
    if e.is_timeout() {
        Error::Timeout {
            shard: shard.name.clone(),
            timeout_ms: timeout.as_millis() as u64,
        }
    } else if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || refused_kind(&e)
    {
        Error::Connection {
            shard: shard.name.clone(),
            message: e.to_string(),
        }
    } else {
        Error::Script {
            shard: shard.name.clone(),
            message: e.to_string(),
        }
    }
}

/// True for an error of the redis crate that says the command was not served (see
/// [`refused_reply`]): a Cluster that cannot serve the slot (`CLUSTERDOWN`, `TRYAGAIN`,
/// a `MOVED`/`ASK` it could not follow, to a dead node), a primary that is down or a
/// replica now, a server loading or refusing the client. Backend failures, not script
/// errors.
pub(super) fn refused_kind(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind as K, ServerErrorKind as S};
    match e.kind() {
        K::Server(
            S::ClusterDown
            | S::TryAgain
            | S::MasterDown
            | S::ReadOnly
            | S::BusyLoading
            | S::Moved
            | S::Ask,
        ) => true,
        K::AuthenticationFailed | K::ClusterConnectionNotFound => true,
        _ => refused_reply(&e.to_string()) || e.to_string().contains("max number of clients"),
    }
}

impl RedisEngine {
    /// Runs `f` on shard `shard`'s connection, connecting first when it has none. The
    /// time limits are the wire's: the pipe's (a connect, a silent shard: see
    /// `transport/sansio.rs`), a Cluster node's pipe's, or (a Sentinel shard's plain
    /// commands) the redis crate's connect and response timeouts.
    pub(super) async fn raw<T, F, Fut>(
        self: &Arc<Self>,
        st: &Arc<RtState>,
        shard: usize,
        redis_key: Option<&str>,
        f: F,
    ) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let map = |e| map_redis_error(&self.shards[shard], self.timeout, e);
        let conn = if self.cluster_nodes.is_some() {
            Conn::Cluster(self.cluster_conn(st, redis_key))
        } else {
            match self.any_pipe(st, shard).await? {
                Some(p) => Conn::Pipe(p),
                None => self.connection(st, shard).await?,
            }
        };
        f(conn).await.map_err(map)
    }

    /// Runs `f` with shard `shard`'s connection: fails fast while its circuit is open,
    /// records latency and feeds the circuit breaker. (Commands; scripts go through
    /// [`RedisEngine::call`].)
    pub async fn with_conn<T, F, Fut>(self: &Arc<Self>, shard: usize, f: F) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        self.with_conn_at(shard, None, f).await
    }

    /// [`RedisEngine::with_conn`] for a command on Redis key `redis_key`: in a Cluster it
    /// goes through the circuit of the primary that owns the key's slot.
    pub(super) async fn with_conn_at<T, F, Fut>(
        self: &Arc<Self>,
        shard: usize,
        redis_key: Option<&str>,
        f: F,
    ) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let st = self.state()?;
        let b = self.breaker(redis_key);
        self.gate(shard, &b)?;
        let start = Instant::now();
        // boxed: keeps the futures of callers shallow (deeply nested async fns overflow
        // the compiler's layout query depth in downstream crates)
        let r = Box::pin(self.raw(&st, shard, redis_key, f)).await;
        self.finish(&st, shard, &b, start, r)
    }

    /// Runs one script call on shard `shard`: the one call path of
    /// every script (checks, shadow checks, layered checks, refunds, settles, releases,
    /// resets, dump and restore). It fails fast while the circuit is open, sends the call
    /// as EVALSHA over the shard's transport (the pipelined connection, where a check may
    /// go in a batch call with its burst's others, or in a Cluster the pipe of the primary
    /// that owns the key's slot, alone) and, when the server lost the script (restart,
    /// SCRIPT FLUSH), once more as EVAL; it maps errors, takes
    /// the reply's tag off (a reply with another call's tag is refused), records latency,
    /// feeds the circuit, and reads the reply as the call's [`ScriptCall::read`] says.
    pub(super) async fn call<C: ScriptCall>(
        self: &Arc<Self>,
        shard: usize,
        call: &C,
    ) -> Result<C::Reply> {
        let wire = call.wire(&self.prefix);
        // boxed: keeps the futures of callers shallow (see `with_conn_at`)
        let reply = Box::pin(self.call_wire(shard, &wire)).await?;
        call.read(&self.shards[shard], reply)
    }

    /// [`RedisEngine::call`] on the calling thread, over a blocking connection (see
    /// [`RedisEngine::send_blocking`]): the same gate, retry, mapping and accounting.
    /// Only for shards that are [`RedisEngine::blocking_capable`].
    pub(super) fn call_blocking<C: ScriptCall>(
        self: &Arc<Self>,
        shard: usize,
        call: &C,
    ) -> Result<C::Reply> {
        let wire = call.wire(&self.prefix);
        let reply = one_call!(self, shard, &wire, |st, eval| self
            .send_blocking(st, shard, &wire, eval))?;
        call.read(&self.shards[shard], reply)
    }

    async fn call_wire(self: &Arc<Self>, shard: usize, wire: &Wire<'_>) -> Result<Reply> {
        one_call!(self, shard, wire, |st, eval| self
            .send(st, shard, wire, eval)
            .await)
    }

    /// The start of a script call: the runtime state, the circuit it goes through (in a
    /// Cluster, that of its key's primary) and its verdict, the start time.
    fn begin(
        self: &Arc<Self>,
        shard: usize,
        wire: &Wire<'_>,
    ) -> Result<(Arc<RtState>, Breaker, Instant)> {
        let st = self.state()?;
        let b = match &self.cluster_nodes {
            Some(_) => self.breaker(wire.slot_key(&self.prefix).as_deref()),
            None => Breaker::Shard,
        };
        self.gate(shard, &b)?;
        Ok((st, b, Instant::now()))
    }

    /// The end of every call to a shard: latency and the circuit accounted for; after a
    /// backend failure the connection is forgotten (Sentinel) and a Cluster's topology
    /// read again; an answer proves a new connection good.
    fn finish<T>(
        self: &Arc<Self>,
        st: &RtState,
        shard: usize,
        b: &Breaker,
        start: Instant,
        r: Result<T>,
    ) -> Result<T> {
        self.account(st, shard, b, start, &r);
        match &r {
            Err(e) if e.is_backend() => {
                self.forget_connection(st, shard, e);
                self.refresh_topology_soon();
            }
            Err(_) => {}
            Ok(_) => self.connect_ok(shard),
        }
        r
    }

    /// One attempt of `wire` on shard `shard`'s async transport (`eval`: as EVAL).
    async fn send(
        self: &Arc<Self>,
        st: &RtState,
        shard: usize,
        wire: &Wire<'_>,
        eval: bool,
    ) -> Result<Reply> {
        let io = |e| self.io_error(shard, e);
        if self.cluster_nodes.is_some() {
            // a Cluster: to the owner of the key's slot over its pipe, alone (a batch
            // call's keys would span slots), under a check's reply bound
            let slot = wire
                .slot_key(&self.prefix)
                .map(|k| crate::routing::cluster_slot(&k));
            let max_reply = match wire {
                Wire::Check(_) => MAX_CHECK_REPLY,
                Wire::Script { .. } => MAX_REPLY,
            };
            let packed = wire.cmd(&self.prefix, eval).get_packed_command();
            // boxed as a trait object: keeps the types of callers' futures shallow (see
            // `sentinel_target`)
            let command: cluster::Routed<'_> =
                Box::pin(self.cluster_command(st, slot, packed, max_reply));
            let (frame, pipe) = command.await.map_err(io)?;
            let reply = parse_frame(&frame).map_err(io)?;
            return self
                .untagged(shard, wire, reply)
                .inspect_err(|_| pipe.close(NOT_THEIRS));
        }
        let Some(PipeConn { pipe, .. }) = self.any_pipe(st, shard).await? else {
            return Err(Error::Internal(format!(
                "shard {} has no connection",
                self.shards[shard].name
            )));
        };
        match wire {
            Wire::Check(req) => {
                // the hot path: the pipe sends a burst's checks together and takes a reply
                // only if it carries the call's tag
                st.keep_timers(self.timeout);
                let _in_flight = st.spin(self.spin_wait());
                let call = CheckCall::new(
                    scripts::check_scripts(req.eff.algorithm),
                    eval,
                    req.tag,
                    |c| req.write(&self.prefix, c),
                );
                pipe.request(call).await.map_err(io)
            }
            Wire::Script { .. } => {
                let packed = wire.cmd(&self.prefix, eval).get_packed_command();
                let frame = pipe.command(packed).await.map_err(io)?;
                let reply = parse_frame(&frame).map_err(io)?;
                // another call's reply: the stream is in doubt, no later reply on it is
                // trusted
                self.untagged(shard, wire, reply)
                    .inspect_err(|_| pipe.close(NOT_THEIRS))
            }
        }
    }

    /// One attempt of `wire` on the calling thread over a blocking connection to shard
    /// `shard` (taken from the process's idle pool, or made): no hand-off to the I/O
    /// runtime and back, the caller writes the command and reads the reply itself, which
    /// is what a synchronous caller (a Python thread, a C or Go call) waits for anyway. A
    /// connection that failed in any way is dropped, never reused; one that got an error
    /// reply is fine, one that got a reply carrying another call's tag is not (see
    /// `batch::untag`).
    fn send_blocking(
        &self,
        st: &RtState,
        shard: usize,
        wire: &Wire<'_>,
        eval: bool,
    ) -> Result<Reply> {
        let Some(target) = self.targets[shard].as_ref().filter(|t| !t.is_tls()) else {
            return Err(Error::Internal(format!(
                "shard {} has no blocking connections (Cluster, Sentinel or TLS)",
                self.shards[shard].name
            )));
        };
        let pooled = loop {
            let c = st.blocking[shard].lock().pop();
            match c {
                // dropped: it got bytes or an EOF while idle (see BlockingConn::quiet)
                Some(c) if !c.quiet() => continue,
                c => break c,
            }
        };
        let mut c = match pooled {
            Some(c) => c,
            None => {
                self.may_connect(shard)?;
                BlockingConn::connect(target, self.timeout).map_err(|e| self.io_error(shard, e))?
            }
        };
        let packed = wire.cmd(&self.prefix, eval).get_packed_command();
        // on an error the connection is dropped, never reused
        let reply = c
            .request(&packed, self.timeout, self.blocking_spin())
            .map_err(|e| self.io_error(shard, e))?;
        // a reply with another call's tag: the connection is not reused
        let reply = self.untagged(shard, wire, reply)?;
        let mut idle = st.blocking[shard].lock();
        if idle.len() < BLOCKING_IDLE_MAX {
            idle.push(c);
        }
        Ok(reply)
    }

    /// Records a call to shard `shard` that started at `start`: its latency, and for its
    /// circuit a success (which ends a run of failures) or a backend failure; a
    /// connection failure also backs off the next connection attempt.
    pub(super) fn account<T>(
        self: &Arc<Self>,
        st: &RtState,
        shard: usize,
        b: &Breaker,
        start: Instant,
        r: &Result<T>,
    ) {
        self.latency.record(start.elapsed().as_micros() as u64);
        match r {
            Ok(_) => {
                let c = self.circuit(shard, b);
                if c.failures.load(Ordering::Relaxed) != 0 {
                    c.failures.store(0, Ordering::Relaxed);
                }
                if c.backoff_us.load(Ordering::Relaxed) != 0 {
                    c.backoff_us.store(0, Ordering::Relaxed);
                }
            }
            Err(e) if e.is_backend() => {
                // (a caller turned away while connecting backs off made no attempt: it
                // counts for the circuit, the shard cannot be used, not for the back-off)
                let turned_away =
                    matches!(e, Error::Connection { message, .. } if message == RECONNECT_WAIT);
                if e.kind() == crate::error::ErrorKind::Connection && !turned_away {
                    self.connect_failed(shard);
                }
                self.failed(st, shard, b, e)
            }
            Err(_) => {}
        }
    }

    /// The error of a command the server refused to serve ([`refused_reply`]).
    pub(super) fn refused(&self, shard: usize, e: &str) -> Error {
        let mut message = String::from("the server refused the command: ");
        // (untrusted bytes: keep it short)
        message.extend(e.chars().take(200));
        Error::Connection {
            shard: self.shards[shard].name.clone(),
            message,
        }
    }

    /// The error of a call to shard `shard` that outlived the deadline.
    pub(super) fn timeout_error(&self, shard: usize) -> Error {
        Error::Timeout {
            shard: self.shards[shard].name.clone(),
            timeout_ms: self.timeout.as_millis() as u64,
        }
    }

    /// True when blocking callers can talk to every shard on their own thread (each is one
    /// Redis server without TLS; Cluster, Sentinel and TLS shards use the I/O runtime).
    pub fn blocking_capable(&self) -> bool {
        self.targets
            .iter()
            .all(|t| t.as_ref().is_some_and(|t| !t.is_tls()))
    }

    pub(super) fn io_error(&self, shard: usize, e: std::io::Error) -> Error {
        if let Some(o) = crate::transport::overloaded(&e) {
            return Error::Overloaded {
                shard: self.shards[shard].name.clone(),
                max_queue: o.max_queue,
            };
        }
        if e.kind() == std::io::ErrorKind::TimedOut {
            self.timeout_error(shard)
        } else {
            Error::Connection {
                shard: self.shards[shard].name.clone(),
                message: e.to_string(),
            }
        }
    }

    /// `reply` without the tag `wire` carries (see `batch::untag`), or the error of a reply
    /// that carries another call's tag.
    fn untagged(&self, shard: usize, wire: &Wire<'_>, reply: Reply) -> Result<Reply> {
        match wire.tag() {
            Some(tag) => untag(reply, tag).map_err(|_| self.not_theirs(shard)),
            None => Ok(reply),
        }
    }

    /// The error of a reply that carries another call's tag.
    pub(super) fn not_theirs(&self, shard: usize) -> Error {
        Error::Connection {
            shard: self.shards[shard].name.clone(),
            message: crate::transport::batch::NOT_THEIRS.into(),
        }
    }
}

/// A call's reply, unless the server refused to serve the command ([`refused_reply`]):
/// then a connection failure.
fn served(e: &RedisEngine, shard: usize, r: Result<Reply>) -> Result<Reply> {
    match r {
        Ok(Reply::Error(m)) if refused_reply(&m) => Err(e.refused(shard, &m)),
        r => r,
    }
}

/// A call's result that says the server no longer holds the script (restart, SCRIPT
/// FLUSH): the call goes once more as EVAL, which loads it again.
fn lost_scripts(r: &Result<Reply>) -> bool {
    matches!(r, Ok(r) if r.is_noscript())
}
