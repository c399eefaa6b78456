//! Clients and connections: standalone and Sentinel clients, lazy connects with
//! back-off, the pipelined connection, Sentinel failover watching.

use super::*;

/// The longest answer a Sentinel may give to `SENTINEL get-master-addr-by-name` (a host and
/// a port).
pub(super) const SENTINEL_MAX_REPLY: usize = 4096;

/// How to ask a shard's Sentinels for its primary, and how to reach the primary.
pub(crate) struct SentinelAsk {
    /// (one caller asks at a time; the others wait for its answer)
    pub(super) one_at_a_time: tokio::sync::Mutex<()>,
    pub(super) spec: crate::config::SentinelSpec,
    pub(super) sentinel_tls: Option<crate::TlsConfig>,
    pub(super) tls: Option<crate::TlsConfig>,
}

impl SentinelAsk {
    /// Where Sentinel `n` is, as a pipe connects to it (its login, and `sentinel_tls`).
    fn sentinel(&self, n: usize) -> std::result::Result<Target, String> {
        let mut info = self.spec.node_info(n).map_err(|e| e.to_string())?;
        if let Some(t) = &self.sentinel_tls {
            let (host, port) = self.spec.nodes[n].clone();
            info = info.set_addr(redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure: t.insecure_skip_verify,
                tls_params: None,
            });
        }
        let client = redis::Client::open(info).map_err(|e| e.to_string())?;
        Target::of(&client, self.sentinel_tls.as_ref())?
            .ok_or_else(|| "a Sentinel address the client cannot use".to_string())
    }

    /// The client of the primary at `host:port`: its login and database, over TLS with
    /// the shard's `tls`.
    fn primary(&self, host: &str, port: u16) -> redis::RedisResult<redis::Client> {
        use redis::IntoConnectionInfo;
        let addr = match &self.tls {
            Some(t) => redis::ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: t.insecure_skip_verify,
                tls_params: None,
            },
            None => redis::ConnectionAddr::Tcp(host.to_string(), port),
        };
        let mut login = redis::RedisConnectionInfo::default().set_db(self.spec.db);
        if let Some(u) = &self.spec.username {
            login = login.set_username(u);
        }
        if let Some(p) = &self.spec.password {
            login = login.set_password(p);
        }
        redis::Client::open(addr.into_connection_info()?.set_redis_settings(login))
    }
}

/// The Sentinels of a shard and the primary's name there, for [`RedisEngine::watch_sentinels`].
#[derive(Clone)]
pub(super) struct SentinelWatch {
    /// How to reach and log in to each Sentinel
    pub(super) nodes: Vec<redis::ConnectionInfo>,
    pub(super) master: String,
}

/// The connection attempts of one shard: after one failed, the next waits a back-off
/// (doubling, jittered), and only one caller makes it; the others fail at once.
#[derive(Default)]
pub(super) struct Reconnect {
    /// monotonic µs before which no connection attempt is made; 0 = no back-off
    pub(super) next_at: AtomicU64,
    pub(super) backoff_us: AtomicU64,
}

/// `us` jittered down to between half and all of it (xorshift of the clock and `salt`:
/// processes that saw one failure at one moment spread their retries).
pub(super) fn jitter(us: u64, salt: u64) -> u64 {
    let mut x =
        mono_us() ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(std::process::id());
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    us / 2 + x % (us / 2 + 1)
}

/// The client of a `redis://` or `rediss://` shard, with its TLS settings.
pub(super) fn single_client(field: &str, s: &ShardConfig) -> Result<redis::Client> {
    let bad = |e: redis::RedisError| {
        let e = crate::config::scrub(&e.to_string(), &s.url);
        Error::config(field, format!("invalid Redis URL: {e}"))
    };
    #[cfg(feature = "tls")]
    if let (true, Some(t)) = (s.url.starts_with("rediss://"), &s.tls) {
        use redis::IntoConnectionInfo;
        let mut info = s.url.as_str().into_connection_info().map_err(bad)?;
        if t.insecure_skip_verify {
            if let redis::ConnectionAddr::TcpTls { host, port, .. } = info.addr().clone() {
                info = info.set_addr(redis::ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: true,
                    tls_params: None,
                });
            }
        }
        return match t.certificates() {
            Some(c) => redis::Client::build_with_tls(info, c),
            None => redis::Client::open(info),
        }
        .map_err(bad);
    }
    redis::Client::open(s.url.as_str()).map_err(bad)
}

/// The client of a Sentinel shard: the Sentinels (over TLS with `sentinel_tls`), and how to
/// log in to the primary they name (over TLS with `tls`).
pub(super) fn sentinel_client(
    field: &str,
    s: &ShardConfig,
    su: &crate::config::SentinelSpec,
) -> Result<SentinelClient> {
    let bad = |e: redis::RedisError| {
        let e = crate::config::scrub(&e.to_string(), &s.url);
        Error::config(field, format!("invalid sentinel configuration: {e}"))
    };
    let sentinels: Vec<redis::ConnectionAddr> = su
        .nodes
        .iter()
        .map(|(host, port)| match &s.sentinel_tls {
            Some(_) => redis::ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: false,
                tls_params: None,
            },
            None => redis::ConnectionAddr::Tcp(host.clone(), *port),
        })
        .collect();
    let mut b = redis::sentinel::SentinelClientBuilder::new(
        sentinels,
        &su.master,
        SentinelServerType::Master,
    )
    .map_err(bad)?
    .set_client_to_redis_db(su.db);
    // how to log in to the primary the Sentinels name, and to the Sentinels
    if let Some(u) = &su.username {
        b = b.set_client_to_redis_username(u);
    }
    if let Some(p) = &su.password {
        b = b.set_client_to_redis_password(p);
    }
    if let Some(u) = &su.sentinel_username {
        b = b.set_client_to_sentinel_username(u);
    }
    if let Some(p) = &su.sentinel_password {
        b = b.set_client_to_sentinel_password(p);
    }
    #[cfg(feature = "tls")]
    {
        if let Some(t) = &s.tls {
            b = b.set_client_to_redis_tls_mode(t.mode());
            if let Some(c) = t.certificates() {
                b = b.set_client_to_redis_certificates(c);
            }
        }
        if let Some(t) = &s.sentinel_tls {
            b = b.set_client_to_sentinel_tls_mode(t.mode());
            if let Some(c) = t.certificates() {
                b = b.set_client_to_sentinel_certificates(c);
            }
        }
    }
    b.build().map_err(bad)
}

/// The error of a connect to `shard` that panicked.
pub(super) fn connect_panic(shard: &ShardConfig, e: tokio::task::JoinError) -> Error {
    match e.try_into_panic() {
        Ok(p) => connect_panic_payload(shard, p.as_ref()),
        Err(e) => Error::Connection {
            shard: shard.name.clone(),
            message: format!("connect task failed: {e}"),
        },
    }
}

pub(super) fn connect_panic_payload(shard: &ShardConfig, p: &(dyn std::any::Any + Send)) -> Error {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    tracing::error!(shard = %shard.name, panic = %what, "shardlimit: connecting panicked");
    Error::Connection {
        shard: shard.name.clone(),
        message: format!("connecting panicked: {what}"),
    }
}

impl RedisEngine {
    /// Shard `shard`'s connection through the redis crate (a Sentinel shard's plain
    /// commands), made when there is none. Its time limits are the crate's: a connect gets the config's
    /// timeout, and so does a command, counted by the crate from when the caller hands it
    /// over (which includes time queued in the crate's pipeline: it does not tell a busy
    /// process from a silent server as our own connections do).
    pub(super) async fn connection(&self, st: &RtState, shard: usize) -> Result<Conn> {
        let slot = &st.conns[shard];
        if let Some(c) = slot.conn.load_full() {
            return Ok((*c).clone());
        }
        let _one_at_a_time = slot.connecting.lock().await;
        if let Some(c) = slot.conn.load_full() {
            return Ok((*c).clone());
        }
        self.may_connect(shard)?;
        let map = |e| map_redis_error(&self.shards[shard], self.timeout, e);
        let timeout = self.timeout;
        let manager = move |client: redis::Client| {
            let cfg = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(10))
                .set_max_delay(Duration::from_millis(500));
            ConnectionManager::new_with_config(client, cfg)
        };
        // A panic while connecting (in the redis crate or rustls, say) is this shard failing
        // to connect: a `connection` error that follows the policy's `on_error`, never an
        // `internal` one that would bypass it.
        let join = |e: tokio::task::JoinError| connect_panic(&self.shards[shard], e);
        // connect inside our runtime, so the connection's driver tasks live there
        let conn = match &self.clients[shard] {
            Client::Single(client) => st
                .runtime()
                .spawn(manager((**client).clone()))
                .await
                .map_err(join)?
                .map(Conn::Single)
                .map_err(map)?,
            Client::Cluster => {
                return Err(Error::Internal(
                    "a Cluster's connections are its nodes' pipes".into(),
                ))
            }
            Client::Sentinel(_) => {
                let primary = self.sentinel_primary(shard).await?;
                st.runtime()
                    .spawn(manager(primary))
                    .await
                    .map_err(join)?
                    .map(Conn::Single)
                    .map_err(map)?
            }
        };
        slot.conn.store(Some(Arc::new(conn.clone())));
        Ok(conn)
    }

    /// After failure `e` on a Sentinel shard, forget the connection: the next call asks the
    /// Sentinels for the primary again (it may have failed over). A script's error says
    /// nothing of the primary: the pipe stays (closing it would fail the calls on it).
    pub(super) fn forget_connection(&self, st: &RtState, shard: usize, e: &Error) {
        if !matches!(self.clients[shard], Client::Sentinel(_)) {
            return;
        }
        st.conns[shard].conn.store(None);
        if matches!(
            e.kind(),
            crate::error::ErrorKind::Connection | crate::error::ErrorKind::Timeout
        ) {
            if let Some(p) = st.pipes[shard].pipe.swap(None) {
                p.close("the primary may have changed");
            }
        }
    }

    /// The primary the Sentinels of shard `shard` name now (within the timeout): each
    /// Sentinel in turn is asked `SENTINEL get-master-addr-by-name` over a pipe of ours
    /// (its reply bounded to [`SENTINEL_MAX_REPLY`], every byte checked), until one names
    /// it. (A Sentinel that names a primary that is a replica now: the calls there are
    /// refused with `READONLY`, a connection failure, and the Sentinels are asked again.)
    pub(super) async fn sentinel_primary(&self, shard: usize) -> Result<redis::Client> {
        let Client::Sentinel(ask) = &self.clients[shard] else {
            return Err(Error::Internal(format!(
                "shard {} is not behind Sentinels",
                self.shards[shard].name
            )));
        };
        let _one_at_a_time = ask.one_at_a_time.lock().await;
        let work = async {
            let mut why = String::from("no Sentinel is configured");
            for n in 0..ask.spec.nodes.len() {
                match self.ask_sentinel(ask, n).await {
                    Ok(primary) => return Ok(primary),
                    Err(e) => {
                        let (host, port) = &ask.spec.nodes[n];
                        why = format!("Sentinel {host}:{port}: {e}");
                    }
                }
            }
            Err(why)
        };
        let (host, port) = tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| self.timeout_error(shard))?
            .map_err(|why| Error::Connection {
                shard: self.shards[shard].name.clone(),
                message: format!("no Sentinel named the primary: {why}"),
            })?;
        let primary = ask.primary(&host, port).map_err(|e| Error::Connection {
            shard: self.shards[shard].name.clone(),
            message: format!("the Sentinels named a primary the client cannot use: {e}"),
        })?;
        tracing::debug!(shard = %self.shards[shard].name, primary = %format!("{host}:{port}"), "shardlimit: sentinel resolved the primary");
        Ok(primary)
    }

    /// Asks Sentinel `n` of `ask` where the primary is.
    async fn ask_sentinel(
        &self,
        ask: &SentinelAsk,
        n: usize,
    ) -> std::result::Result<(String, u16), String> {
        let target = ask.sentinel(n)?;
        let pipe = Pipe::connect(&target, self.timeout, 2)
            .await
            .map_err(|e| e.to_string())?;
        let question = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&ask.spec.master)
            .get_packed_command();
        let frame = pipe.command_bounded(question, SENTINEL_MAX_REPLY).await;
        pipe.close("the Sentinel answered");
        let reply = parse_frame(&frame.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        let malformed = || "a malformed answer".to_string();
        match reply {
            RespReply::Array(a) => match &a[..] {
                [RespReply::Str(host), RespReply::Str(port)] => {
                    let host = std::str::from_utf8(host)
                        .ok()
                        .filter(|h| super::cluster::plausible_host(h))
                        .ok_or_else(malformed)?;
                    let port = std::str::from_utf8(port)
                        .ok()
                        .and_then(|p| p.parse::<u16>().ok())
                        .filter(|p| *p != 0)
                        .ok_or_else(malformed)?;
                    Ok((host.to_string(), port))
                }
                _ => Err(malformed()),
            },
            RespReply::Nil => Err(format!(
                "it does not know the primary {:?}",
                ask.spec.master
            )),
            RespReply::Error(e) => Err(format!(
                "it refused: {}",
                e.chars().take(200).collect::<String>()
            )),
            _ => Err(malformed()),
        }
    }

    /// Where the primary of Sentinel shard `shard` is now, as the pipe connects to it (over
    /// TLS with the shard's `tls`).
    pub(super) async fn sentinel_target(&self, shard: usize) -> Result<Target> {
        // boxed as a trait object: asking the Sentinels is a deep future (the redis
        // crate's), and the type of a caller's future must stay shallow (downstream crates
        // that check it for `Send` overflow the compiler's recursion limit otherwise)
        let ask: std::pin::Pin<Box<dyn Future<Output = Result<redis::Client>> + Send + '_>> =
            Box::pin(self.sentinel_primary(shard));
        let primary = ask.await?;
        let field = format!("shards[{shard}].tls");
        match Target::of(&primary, self.shards[shard].tls.as_ref()) {
            Ok(Some(t)) => Ok(t),
            Ok(None) => Err(Error::Connection {
                shard: self.shards[shard].name.clone(),
                message: "the Sentinels named a primary at an address the client cannot use".into(),
            }),
            Err(e) => Err(Error::config(field, e)),
        }
    }

    /// The pipelined connection of shard `shard` and the database it selected: a
    /// standalone shard's ([`RedisEngine::pipe`]), or the one to the primary the Sentinels
    /// name (asked again once it broke or was forgotten). `None` for a Cluster.
    pub(super) async fn any_pipe(&self, st: &RtState, shard: usize) -> Result<Option<PipeConn>> {
        if let Some(target) = &self.targets[shard] {
            let pipe = self.pipe(st, shard, target).await?;
            return Ok(Some(PipeConn {
                pipe,
                db: target.db(),
            }));
        }
        if !matches!(self.clients[shard], Client::Sentinel(_)) {
            return Ok(None);
        }
        let slot = &st.pipes[shard];
        let found = |slot: &PipeSlot| {
            slot.pipe
                .load_full()
                .filter(|p| !p.is_broken())
                .map(|pipe| PipeConn {
                    pipe,
                    db: slot.db.load(Ordering::Acquire),
                })
        };
        if let Some(p) = found(slot) {
            return Ok(Some(p));
        }
        let _one_at_a_time = slot.connecting.lock().await;
        if let Some(p) = found(slot) {
            return Ok(Some(p));
        }
        self.may_connect(shard)?;
        let target = self.sentinel_target(shard).await?;
        let db = target.db();
        let pipe = self.connect_pipe(st, shard, target).await?;
        slot.db.store(db, Ordering::Release);
        slot.pipe.store(Some(Arc::clone(&pipe)));
        Ok(Some(PipeConn { pipe, db }))
    }

    /// Claims a connection attempt to shard `shard`: at once when no attempt failed
    /// lately; after a failure, one caller per back-off period, the others get
    /// [`RECONNECT_WAIT`] without connecting (at `maxclients` one process made 1031
    /// refused connections in 0.1 s before this).
    pub(super) fn may_connect(&self, shard: usize) -> Result<()> {
        let r = &self.reconnects[shard];
        let next = r.next_at.load(Ordering::Acquire);
        if next == 0 {
            return Ok(());
        }
        let now = mono_us();
        let wait = jitter(
            r.backoff_us.load(Ordering::Relaxed).max(RECONNECT_MIN_US),
            shard as u64,
        );
        if now >= next
            && r.next_at
                .compare_exchange(next, now + wait, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            return Ok(());
        }
        Err(Error::Connection {
            shard: self.shards[shard].name.clone(),
            message: RECONNECT_WAIT.to_string(),
        })
    }

    /// A connection attempt to `shard` failed (or the server refused the connection's
    /// first command): back off the next one, doubling up to [`RECONNECT_MAX_US`].
    pub(super) fn connect_failed(&self, shard: usize) {
        let r = &self.reconnects[shard];
        let b =
            (r.backoff_us.load(Ordering::Relaxed) * 2).clamp(RECONNECT_MIN_US, RECONNECT_MAX_US);
        r.backoff_us.store(b, Ordering::Relaxed);
        r.next_at
            .store(mono_us() + jitter(b, shard as u64), Ordering::Release);
    }

    /// A new connection to `shard` served a command: connect freely again.
    pub(super) fn connect_ok(&self, shard: usize) {
        let r = &self.reconnects[shard];
        if r.next_at.load(Ordering::Relaxed) != 0 {
            r.next_at.store(0, Ordering::Release);
            r.backoff_us.store(0, Ordering::Relaxed);
        }
    }

    /// The pipelined connection of shard `shard`, made (on the I/O runtime) when there is
    /// none or the last one broke. A connect and log-in get the config's timeout on the
    /// wire; a caller waits for another caller's connect without a deadline of its own
    /// (that connect has one).
    pub(super) async fn pipe(
        &self,
        st: &RtState,
        shard: usize,
        target: &Target,
    ) -> Result<Arc<Pipe>> {
        let slot = &st.pipes[shard];
        if let Some(p) = slot.pipe.load_full().filter(|p| !p.is_broken()) {
            return Ok(p);
        }
        let _one_at_a_time = slot.connecting.lock().await;
        if let Some(p) = slot.pipe.load_full().filter(|p| !p.is_broken()) {
            return Ok(p);
        }
        self.may_connect(shard)?;
        let pipe = self.connect_pipe(st, shard, target.clone()).await?;
        slot.pipe.store(Some(Arc::clone(&pipe)));
        Ok(pipe)
    }

    /// A new pipelined connection to `target` for shard `shard`, made on the I/O runtime
    /// (the pipe's tasks live there) within the config's timeout.
    async fn connect_pipe(&self, st: &RtState, shard: usize, target: Target) -> Result<Arc<Pipe>> {
        let (timeout, max_queue) = (self.timeout, self.max_queue());
        let pipe = st
            .runtime()
            .spawn(async move { Pipe::connect(&target, timeout, max_queue).await })
            .await
            .map_err(|e| connect_panic(&self.shards[shard], e))?
            .map_err(|e| self.io_error(shard, e))?;
        Ok(Arc::new(pipe))
    }

    /// Follows failovers of a shard behind Sentinels as Sentinel reports them: subscribed
    /// to `+switch-master` on one Sentinel after another, it drops the shard's connection
    /// when the primary switches, so the next call asks the Sentinels for the new one at
    /// once (calls followed only when the old primary failed them, then after the probe's
    /// back-off: 0.9-1 s after the switch). An open circuit closes half-open. Runs on the
    /// limiter's runtime, until the limiter is gone.
    pub(super) async fn watch_sentinels(me: std::sync::Weak<Self>, shard: usize, w: SentinelWatch) {
        let mut backoff = BACKOFF_MIN_US * 4;
        for node in w.nodes.iter().cycle() {
            let Some(timeout) = me.upgrade().map(|e| e.timeout) else {
                return;
            };
            if let Ok(Ok(mut sub)) = tokio::time::timeout(timeout, Watch::open(node)).await {
                backoff = BACKOFF_MIN_US * 4;
                // (until the Sentinel goes away or sends what a Sentinel does not)
                while let Ok(m) = sub.next().await {
                    let Some(payload) = switch_payload(&m) else {
                        continue;
                    };
                    // "<master name> <old ip> <old port> <new ip> <new port>"
                    if payload.split(' ').next() != Some(w.master.as_str()) {
                        continue;
                    }
                    let Some(e) = me.upgrade() else { return };
                    e.followed_switch(shard);
                }
            }
            // the Sentinel went away: the next one, after a back-off
            tokio::time::sleep(Duration::from_micros(jitter(backoff, shard as u64))).await;
            backoff = (backoff * 2).min(2_000_000);
        }
    }

    /// Sentinel switched shard `shard`'s primary: forget the connection to the old one.
    pub(super) fn followed_switch(&self, shard: usize) {
        tracing::info!(shard = %self.shards[shard].name, "shardlimit: sentinel switched the primary");
        if let Some(st) = self.state.load_full() {
            st.conns[shard].conn.store(None);
            if let Some(p) = st.pipes[shard].pipe.swap(None) {
                p.close("Sentinel switched the primary");
            }
        }
        self.connect_ok(shard);
        let c = &self.circuits[shard];
        if c.open_until.load(Ordering::Acquire) != 0 {
            c.failures.store(FAILURES_TO_OPEN - 1, Ordering::Relaxed);
            c.open_until.store(0, Ordering::Release);
            self.emit(Event::Circuit {
                shard: self.shards[shard].name.clone(),
                state: CircuitState::Closed,
            });
        }
    }
}

/// The longest message the `+switch-master` watch takes: a switch names the primary and
/// two addresses. A longer one closes the subscription (the next Sentinel is asked after a
/// back-off), so a Sentinel cannot make the watch hold more than this and one read.
pub(super) const WATCH_MAX_MESSAGE: usize = 4096;

/// A subscription to `+switch-master` on one Sentinel over plain TCP, its messages framed
/// under [`WATCH_MAX_MESSAGE`] (the bytes are untrusted as every reply).
pub(super) struct Watch {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
    framer: crate::transport::resp::Framer,
}

impl Watch {
    /// Connects to Sentinel `node`, logs in (its `sentinel_username`/`sentinel_password`)
    /// and subscribes.
    pub(super) async fn open(node: &redis::ConnectionInfo) -> std::io::Result<Watch> {
        use crate::transport::resp::{protocol, Shown};
        use tokio::io::AsyncWriteExt;
        let redis::ConnectionAddr::Tcp(host, port) = node.addr() else {
            return Err(std::io::Error::other(
                "a Sentinel is watched over plain TCP only",
            ));
        };
        let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
        stream.set_nodelay(true)?;
        let mut w = Watch {
            stream,
            buf: Vec::with_capacity(512),
            framer: Default::default(),
        };
        let settings = node.redis_settings();
        let mut out = Vec::new();
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
            out.extend(auth.get_packed_command());
        }
        out.extend(
            redis::cmd("SUBSCRIBE")
                .arg("+switch-master")
                .get_packed_command(),
        );
        w.stream.write_all(&out).await?;
        if settings.password().is_some() {
            crate::transport::expect_ok("AUTH", w.next().await?)?;
        }
        match w.next().await? {
            Reply::Array(a) if matches!(a.first(), Some(Reply::Str(k)) if k == b"subscribe") => {
                Ok(w)
            }
            other => Err(protocol(format!(
                "SUBSCRIBE was answered {:?}",
                Shown(&other)
            ))),
        }
    }

    /// The next message (or reply), at most [`WATCH_MAX_MESSAGE`] bytes; `Err` when the
    /// Sentinel closed the connection or sent something that is not RESP within the bound.
    pub(super) async fn next(&mut self) -> std::io::Result<Reply> {
        use tokio::io::AsyncReadExt;
        loop {
            if !self.buf.is_empty() {
                if let Some(n) = self.framer.next(&self.buf, WATCH_MAX_MESSAGE)? {
                    let reply = parse_frame(&self.buf[..n]);
                    self.buf.drain(..n);
                    return reply;
                }
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the Sentinel closed the connection",
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// The payload of a `+switch-master` message (`message`, the channel, the payload), if
/// `m` is one.
pub(super) fn switch_payload(m: &Reply) -> Option<&str> {
    let Reply::Array(m) = m else { return None };
    match &m[..] {
        [Reply::Str(kind), Reply::Str(channel), Reply::Str(payload)]
            if kind == b"message" && channel == b"+switch-master" =>
        {
            std::str::from_utf8(payload).ok()
        }
        _ => None,
    }
}

/// The time a connect started now may take to end by `deadline` (at least 1 ms).
pub(super) fn connect_timeout(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}
