//! The call path to a shard: circuit gate, deadline, error mapping, latency and circuit
//! accounting, over the pipe, a blocking connection, or the redis crate.

use super::*;

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
    /// Runs `f` on shard `shard`'s connection, connecting first when it has none, all
    /// within `deadline` (a call's: now + `timeout`; [`RedisEngine::connect`]'s own).
    pub(super) async fn raw<T, F, Fut>(
        &self,
        st: &RtState,
        shard: usize,
        deadline: Instant,
        f: F,
    ) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let map = |e| map_redis_error(&self.shards[shard], self.timeout, e);
        if let Some(target) = &self.targets[shard] {
            // the pipelined connection: every command of `f` carries the deadline, and one
            // that outlives it closes the connection (its reply stream is in doubt)
            let pipe = self.pipe(st, shard, target, deadline).await?;
            let conn = Conn::Pipe(PipeConn {
                pipe,
                deadline,
                db: target.db(),
            });
            return f(conn).await.map_err(map);
        }
        let work = async {
            let conn = self.connection(st, shard, deadline).await?;
            f(conn).await.map_err(map)
        };
        match tokio::time::timeout_at(deadline.into(), work).await {
            Ok(r) => r,
            Err(_) => Err(self.timeout_error(shard)),
        }
    }

    /// Runs `f` with shard `shard`'s connection: fails fast while its circuit is open,
    /// records latency and feeds the circuit breaker.
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
        let deadline = start + self.timeout;
        let r = Box::pin(self.raw(&st, shard, deadline, f)).await;
        self.account(&st, shard, &b, start, &r);
        match &r {
            Err(e) if e.is_backend() => {
                self.forget_connection(&st, shard);
                self.refresh_topology_soon(&st);
            }
            Err(_) => {}
            // (the redis crate's connection reconnects by itself: any answer proves it)
            Ok(_) => self.connect_ok(shard),
        }
        r
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
        self.targets.iter().all(Option::is_some)
    }

    /// Sends one command on the calling thread over a blocking connection to shard
    /// `shard` (taken from the process's idle pool, or made) and returns its reply, under
    /// the same circuit, deadline, latency and failure accounting as
    /// [`RedisEngine::with_conn`]. No hand-off to the I/O runtime and back: the caller
    /// writes the command and reads the reply itself, which is what a synchronous caller (a
    /// Python thread, a C or Go call) waits for anyway. A connection that failed in any way
    /// is dropped, never reused; one that got an error reply is fine, one that got a reply
    /// carrying another call's `tag` is not (see `batch::untag`). `deadline` is the call's
    /// (a NOSCRIPT retry shares it with the try before).
    pub fn request_blocking(
        self: &Arc<Self>,
        shard: usize,
        packed: &[u8],
        deadline: Instant,
        tag: u64,
    ) -> Result<Reply> {
        let Some(target) = &self.targets[shard] else {
            return Err(Error::Internal(format!(
                "shard {} has no blocking connections (Cluster, Sentinel or TLS)",
                self.shards[shard].name
            )));
        };
        let st = self.state()?;
        self.gate(shard, &Breaker::Shard)?;
        let start = Instant::now();
        let left = deadline.saturating_duration_since(start);
        if left.is_zero() {
            let r = Err(self.timeout_error(shard));
            self.account(&st, shard, &Breaker::Shard, start, &r);
            return r;
        }
        let pooled = loop {
            let c = st.blocking[shard].lock().pop();
            match c {
                // dropped: it got bytes or an EOF while idle (see BlockingConn::quiet)
                Some(c) if !c.quiet() => continue,
                c => break c,
            }
        };
        let fresh = pooled.is_none();
        let conn = match pooled {
            Some(c) => Ok(c),
            None => self.may_connect(shard).and_then(|()| {
                BlockingConn::connect(target, left).map_err(|e| self.io_error(shard, e))
            }),
        };
        let r = conn.and_then(
            |mut c| match c.request(packed, deadline, self.blocking_spin()) {
                // the connection is dropped, never reused
                Err(e) => Err(self.io_error(shard, e)),
                Ok(Reply::Error(e)) if refused_reply(&e) => Err(self.refused(shard, &e)),
                Ok(reply) => {
                    // a reply with another call's tag: the connection is not reused
                    let reply = untag(reply, tag).map_err(|_| {
                        self.io_error(
                            shard,
                            crate::transport::resp::protocol(crate::transport::batch::NOT_THEIRS),
                        )
                    })?;
                    if fresh {
                        self.connect_ok(shard);
                    }
                    let mut idle = st.blocking[shard].lock();
                    if idle.len() < BLOCKING_IDLE_MAX {
                        idle.push(c);
                    }
                    Ok(reply)
                }
            },
        );
        self.account(&st, shard, &Breaker::Shard, start, &r);
        r
    }

    pub(super) fn io_error(&self, shard: usize, e: std::io::Error) -> Error {
        if e.kind() == std::io::ErrorKind::TimedOut {
            self.timeout_error(shard)
        } else {
            Error::Connection {
                shard: self.shards[shard].name.clone(),
                message: e.to_string(),
            }
        }
    }

    /// Sends one check script call over shard `shard`'s pipelined connection and
    /// returns its reply, under the same circuit, deadline, latency and failure accounting
    /// as [`RedisEngine::with_conn`]. `deadline` is the call's (a NOSCRIPT retry shares it
    /// with the try before).
    pub async fn request_pipelined(
        self: &Arc<Self>,
        shard: usize,
        call: CheckCall,
        deadline: Instant,
    ) -> Result<Reply> {
        let Some(target) = &self.targets[shard] else {
            return Err(Error::Internal(format!(
                "shard {} has no pipelined connection (Cluster, Sentinel or TLS)",
                self.shards[shard].name
            )));
        };
        let st = self.state()?;
        self.gate(shard, &Breaker::Shard)?;
        st.keep_timers(self.timeout);
        let _in_flight = st.spin(self.spin_wait());
        let start = Instant::now();
        let work = async {
            let pipe = self.pipe(&st, shard, target, deadline).await?;
            // the request keeps the deadline itself: one that outlives it closes the
            // connection (its reply stream is in doubt)
            pipe.request(call, deadline)
                .await
                .map_err(|e| self.io_error(shard, e))
        };
        // (no timeout around `work`: both of its steps keep the deadline themselves)
        let r = match work.await {
            // (a server that refuses a client closes its connection: the pipe breaks)
            Ok(Reply::Error(e)) if refused_reply(&e) => Err(self.refused(shard, &e)),
            Ok(reply) => {
                let slot = &st.pipes[shard];
                if slot.fresh.load(Ordering::Relaxed) && slot.fresh.swap(false, Ordering::AcqRel) {
                    self.connect_ok(shard);
                }
                Ok(reply)
            }
            Err(e) => Err(e),
        };
        self.account(&st, shard, &Breaker::Shard, start, &r);
        r
    }

    /// The error of a reply that carries another call's tag.
    pub(super) fn not_theirs(&self, shard: usize) -> Error {
        Error::Connection {
            shard: self.shards[shard].name.clone(),
            message: crate::transport::batch::NOT_THEIRS.into(),
        }
    }
}
