//! The Redis engine: one multiplexed, auto-reconnecting connection per shard, owned by a
//! Tokio runtime that belongs to the limiter. Runtime and connections are created lazily and
//! re-created in a forked child (the pid is checked on every call), because prefork servers
//! (gunicorn) and Go programs host this library. Each shard has a circuit breaker: after
//! repeated failures it is skipped (no connect attempts, no waiting) and probed in the
//! background until it answers again.

use crate::config::ShardConfig;
use crate::engine::redis::keys::events_key;
use crate::error::{Error, Result};
use crate::events::{CircuitState, Event, Subscribers};
use crate::metrics::Latency;
use crate::transport::batch::{untag, CheckCall, NOT_THEIRS};
use crate::transport::blocking::{BlockingConn, Target};
use crate::transport::pipe::{Pipe, PipeConn};
use crate::transport::resp::Reply as RespReply;
use crate::transport::resp::{parse_frame, Reply};
use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelServerType};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod call;
mod circuit;
mod cluster;
mod commands;
mod connect;
mod host;
pub mod keys;
mod overrides;
pub(crate) mod protocol;
pub use crate::wire::scripts;
mod shadow;
pub use shadow::{SHADOW_MAX_KEYS, SHADOW_TTL};
mod settle;
pub(crate) use protocol::{MultiSettled, SettleCall, Settled};

mod stream;

use crate::transport::runtime::{fork_generation, mono_us, start_runtime, IoRuntime};
use call::map_redis_error;
use circuit::*;
use connect::*;
use protocol::*;
pub(crate) use protocol::{CheckRequest, Checked, LayeredChecked, LayeredTail, Mode, OverrideArg};
pub(crate) use stream::StreamItem;
use stream::*;

/// Consecutive failures that open a shard's circuit.
const FAILURES_TO_OPEN: u32 = 3;
/// First and longest back-off between probes of an open circuit (each wait is jittered
/// down to half of it). The longest is short because it is also how long a shard that
/// answers again may go on being skipped: a probe is one connection and a PING per
/// shard and process, a few per second at most.
const BACKOFF_MIN_US: u64 = 25_000;
const BACKOFF_MAX_US: u64 = 250_000;
/// First and longest back-off between connection attempts to a shard after one failed
/// (refused, reset, or refused in the handshake: `-ERR max number of clients reached`,
/// an AUTH error). Healthy shards are not gated at all.
const RECONNECT_MIN_US: u64 = 20_000;
const RECONNECT_MAX_US: u64 = 1_000_000;
/// Idle blocking connections kept per shard: one per thread that waits on the shard at
/// the same moment, as a connection pool of a synchronous client would.
const BLOCKING_IDLE_MAX: usize = 64;

/// The message of the error a caller gets when a connection attempt to its shard is
/// backing off after one failed (see [`RedisEngine::may_connect`]).
const RECONNECT_WAIT: &str = "not connecting yet: the last attempt failed, backing off";

/// A connection to one shard: a primary found through Sentinels, a whole Redis Cluster
/// (routed by slot over our pipes, see `cluster.rs`), or a standalone shard's pipe.
#[derive(Clone)]
pub(crate) enum Conn {
    /// A primary found through Sentinels (the redis crate's connection).
    Single(ConnectionManager),
    Cluster(cluster::ClusterConn),
    /// A standalone shard (TCP, TLS or a Unix socket): its pipelined connection.
    Pipe(PipeConn),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Pipe(c) => c.req_packed_command(cmd),
        }
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Pipe(c) => c.req_packed_commands(cmd, offset, count),
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Pipe(c) => c.get_db(),
        }
    }
}

enum Client {
    Single(Box<redis::Client>),
    /// A Redis Cluster: its nodes are in [`RedisEngine::cluster_nodes`].
    Cluster,
    /// A primary watched by Sentinels: resolved on connect, and again after a failure.
    Sentinel(Box<SentinelAsk>),
}

/// One shard's connection, made lazily; dropped and made again (Sentinel) when the
/// primary may have changed.
#[derive(Default)]
pub(crate) struct Slot {
    pub(crate) conn: ArcSwapOption<Conn>,
    pub(crate) connecting: tokio::sync::Mutex<()>,
}

#[derive(Default)]
pub(crate) struct PipeSlot {
    pub(crate) pipe: ArcSwapOption<Pipe>,
    pub(crate) connecting: tokio::sync::Mutex<()>,
    /// The database the pipe selected (a Sentinel shard's: its primary's target's).
    pub(crate) db: std::sync::atomic::AtomicI64,
}

/// The runtime and connections of one process: made on first use, and again in a forked
/// child (whose parent's threads and sockets are not its own).
pub(crate) struct RtState {
    /// (first: dropped first, so the runtime stops before its connections go)
    pub(crate) io: IoRuntime,
    pub(crate) conns: Vec<Slot>,
    /// Idle blocking connections per shard, for calls made on the caller's own thread.
    pub(crate) blocking: Vec<Mutex<Vec<BlockingConn>>>,
    /// The pipelined connection of each shard, for async calls.
    pub(crate) pipes: Vec<PipeSlot>,
    /// A Cluster's pipes, one per node.
    pub(crate) nodes: cluster::NodePipes,
    pub(crate) stream_tx: Option<tokio::sync::mpsc::Sender<StreamItem>>,
}

impl std::ops::Deref for RtState {
    type Target = IoRuntime;
    fn deref(&self) -> &IoRuntime {
        &self.io
    }
}

pub(crate) struct RedisEngine {
    pub shards: Vec<ShardConfig>,
    clients: Vec<Client>,
    /// Per standalone shard, where its pipe connects, and blocking callers (but to a TLS
    /// shard) connect themselves (`None`: Cluster or Sentinel, whose pipes connect to
    /// the nodes the slot map or the Sentinels name, on the I/O runtime).
    targets: Vec<Option<Target>>,
    /// How long a blocking caller may spin on its socket before sleeping, and the I/O
    /// thread after the last async check (config `spin_wait`, µs; a reload that keeps the
    /// engine sets it anew).
    spin_wait_us: AtomicU64,
    pub timeout: Duration,
    /// How many calls one connection holds at once (config `max_queue`).
    max_queue: AtomicUsize,
    prefix: String,
    worker_threads: usize,
    state: ArcSwapOption<RtState>,
    init: Mutex<()>,
    circuits: Vec<Circuit>,
    reconnects: Vec<Reconnect>,
    /// A Cluster shard's nodes and their circuits (`None`: not a Cluster).
    cluster_nodes: Option<ClusterNodes>,
    /// Per shard behind Sentinels: whom to ask for `+switch-master`.
    sentinel_watch: Vec<Option<SentinelWatch>>,
    subscribers: Arc<Subscribers>,
    stream_maxlen: Option<u64>,
    pub latency: Latency,
    pub events_dropped: AtomicU64,
    /// The config set `spin_wait` itself (see [`RedisEngine::blocking_spin`]).
    spin_configured: AtomicBool,
}

impl std::fmt::Debug for RedisEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisEngine")
            .field("shards", &self.shards)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RedisEngine {
    /// The config's `spin_wait`.
    pub fn spin_wait(&self) -> Duration {
        Duration::from_micros(self.spin_wait_us.load(Ordering::Relaxed))
    }

    /// Sets the config's `spin_wait` (at build time, and on a reload that keeps this
    /// engine); `None`: the default, with which blocking callers on one CPU spin yielding
    /// (see [`crate::transport::cpus::blocking_spin`]).
    pub fn set_spin_wait(&self, d: Option<Duration>) {
        let wait = d.unwrap_or_else(crate::config::default_spin_wait);
        self.spin_wait_us
            .store(wait.as_micros() as u64, Ordering::Relaxed);
        self.spin_configured.store(d.is_some(), Ordering::Relaxed);
    }

    /// The config's `max_queue`: how many calls one connection holds at once.
    pub fn max_queue(&self) -> usize {
        self.max_queue.load(Ordering::Relaxed)
    }

    /// Sets `max_queue` (at build time, and on a reload that keeps this engine; a
    /// connection made before keeps the bound it was made with).
    pub fn set_max_queue(&self, n: usize) {
        self.max_queue.store(n, Ordering::Relaxed);
    }

    /// How blocking callers spin on their socket.
    pub(crate) fn blocking_spin(&self) -> crate::transport::cpus::Spin {
        crate::transport::cpus::blocking_spin(
            self.spin_wait(),
            self.spin_configured.load(Ordering::Relaxed),
            crate::transport::cpus::usable(),
        )
    }

    pub fn new(
        shards: Vec<ShardConfig>,
        prefix: String,
        timeout: Duration,
        subscribers: Arc<Subscribers>,
        stream_maxlen: Option<u64>,
    ) -> Result<RedisEngine> {
        let mut watch = vec![None; shards.len()];
        let clients = shards
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let field = format!("shards[{i}].url");
                if let Some(su) = s.sentinel_spec(&field)? {
                    // (the redis crate's builder checks the settings as it always did)
                    sentinel_client(&field, s, &su)?;
                    // the watch of +switch-master (plain TCP to the Sentinels; with
                    // `sentinel_tls` the switch is followed when a call fails instead)
                    if s.sentinel_tls.is_none() {
                        let nodes = (0..su.nodes.len()).map(|n| su.node_info(n));
                        watch[i] = Some(SentinelWatch {
                            nodes: nodes.collect::<redis::RedisResult<_>>().map_err(|e| {
                                Error::config(&field, format!("invalid sentinel address: {e}"))
                            })?,
                            master: su.master.clone(),
                        });
                    }
                    return Ok(Client::Sentinel(Box::new(SentinelAsk {
                        one_at_a_time: tokio::sync::Mutex::new(()),
                        spec: su.into_owned(),
                        sentinel_tls: s.sentinel_tls.clone(),
                        tls: s.tls.clone(),
                    })));
                }
                single_client(&field, s).map(|c| Client::Single(Box::new(c)))
            })
            .collect::<Result<Vec<_>>>()?;
        #[cfg(feature = "tls")]
        if shards
            .iter()
            .any(|s| s.is_tls() || s.sentinel_tls.is_some())
        {
            crate::tls::ensure_crypto_provider();
        }
        let mut engine =
            RedisEngine::build(shards, clients, prefix, timeout, subscribers, stream_maxlen)?;
        engine.sentinel_watch = watch;
        Ok(engine)
    }

    /// One logical shard that is a whole Redis Cluster, from its seed nodes.
    pub fn cluster(
        nodes: Vec<String>,
        tls: Option<crate::TlsConfig>,
        prefix: String,
        timeout: Duration,
        subscribers: Arc<Subscribers>,
        stream_maxlen: Option<u64>,
    ) -> Result<RedisEngine> {
        #[cfg(feature = "tls")]
        if nodes.iter().any(|n| n.starts_with("rediss://")) {
            crate::tls::ensure_crypto_provider();
        }
        let mut shard = ShardConfig::new("cluster", nodes.join(","));
        shard.tls = tls;
        RedisEngine::build(
            vec![shard],
            vec![Client::Cluster],
            prefix,
            timeout,
            subscribers,
            stream_maxlen,
        )
    }

    fn build(
        shards: Vec<ShardConfig>,
        clients: Vec<Client>,
        prefix: String,
        timeout: Duration,
        subscribers: Arc<Subscribers>,
        stream_maxlen: Option<u64>,
    ) -> Result<RedisEngine> {
        let worker_threads = std::env::var("SHARDLIMIT_WORKER_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| (1..=64).contains(n))
            .unwrap_or(0);
        let targets = clients
            .iter()
            .zip(&shards)
            .enumerate()
            .map(|(i, (c, s))| match c {
                Client::Single(c) => Target::of(c, s.tls.as_ref()).map_err(|e| {
                    let field = if s.tls.is_some() {
                        format!("shards[{i}].tls")
                    } else {
                        format!("shards[{i}].url")
                    };
                    Error::config(field, e)
                }),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        let cluster_nodes = match (clients.first(), shards.first()) {
            (Some(Client::Cluster), Some(shard)) => Some(cluster_nodes(shard)?),
            _ => None,
        };
        Ok(RedisEngine {
            targets,
            spin_wait_us: AtomicU64::new(crate::config::default_spin_wait().as_micros() as u64),
            circuits: shards.iter().map(|_| Circuit::default()).collect(),
            reconnects: shards.iter().map(|_| Reconnect::default()).collect(),
            cluster_nodes,
            sentinel_watch: Vec::new(),
            shards,
            clients,
            timeout,
            max_queue: AtomicUsize::new(crate::config::DEFAULT_MAX_QUEUE),
            prefix,
            worker_threads,
            state: ArcSwapOption::empty(),
            init: Mutex::new(()),
            subscribers,
            stream_maxlen,
            latency: Latency::default(),
            events_dropped: AtomicU64::new(0),
            spin_configured: AtomicBool::new(false),
        })
    }

    /// The runtime state of this process, created on first use and again after a fork.
    pub fn state(self: &Arc<Self>) -> Result<Arc<RtState>> {
        let generation = fork_generation();
        if let Some(s) = self.state.load_full() {
            if s.generation == generation {
                return Ok(s);
            }
        }
        let _guard = self.init.lock();
        let pid = std::process::id();
        let current = self.state.load_full();
        if let Some(s) = current {
            if s.generation == generation && s.pid == pid {
                return Ok(s);
            }
            // Inherited through fork(): its threads do not exist in this process, so it
            // can neither run nor be shut down. Leak it on purpose.
            std::mem::forget(s);
            tracing::info!(
                pid,
                "shardlimit: fork detected, re-creating runtime and connections"
            );
            for c in &self.circuits {
                c.failures.store(0, Ordering::Relaxed);
                c.open_until.store(0, Ordering::Relaxed);
                c.probing.store(false, Ordering::Relaxed);
            }
            for r in &self.reconnects {
                r.next_at.store(0, Ordering::Relaxed);
                r.backoff_us.store(0, Ordering::Relaxed);
            }
        }
        let (handle, owner, inbox) = start_runtime(self.worker_threads)
            .map_err(|e| Error::Internal(format!("cannot start the I/O runtime: {e}")))?;
        for (shard, w) in self.sentinel_watch.iter().enumerate() {
            if let Some(w) = w {
                handle.spawn(RedisEngine::watch_sentinels(
                    Arc::downgrade(self),
                    shard,
                    w.clone(),
                ));
            }
        }
        let stream_tx = self.stream_maxlen.map(|maxlen| {
            let (tx, rx) = tokio::sync::mpsc::channel(STREAM_QUEUE);
            handle.spawn(Arc::clone(self).stream_writer(rx, maxlen));
            tx
        });
        let st = Arc::new(RtState {
            io: IoRuntime {
                pid,
                generation,
                handle,
                owner,
                inbox,
                timer_keeper: Arc::default(),
                io_spin: Arc::default(),
            },
            conns: self.shards.iter().map(|_| Slot::default()).collect(),
            blocking: self.shards.iter().map(|_| Mutex::default()).collect(),
            pipes: self.shards.iter().map(|_| PipeSlot::default()).collect(),
            nodes: cluster::NodePipes::default(),
            stream_tx,
        });
        self.state.store(Some(st.clone()));
        Ok(st)
    }

    /// True when the one shard is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.clients.first(), Some(Client::Cluster))
    }
}

/// What a Cluster shard knows of its nodes before it reads the slot map: the configured
/// nodes (`shard.url`, comma-separated), each a `redis://` or `rediss://` TCP address, and
/// how to log in to every node (the first one's settings).
fn cluster_nodes(shard: &ShardConfig) -> Result<ClusterNodes> {
    let mut seeds = Vec::new();
    let mut first = None;
    for (i, url) in shard.url.split(',').enumerate() {
        let field = format!("cluster.nodes[{i}]");
        let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| {
            let e = crate::config::scrub(&e.to_string(), url);
            Error::config(&field, format!("invalid node URL: {e}"))
        })?;
        let node = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port)
            | redis::ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port),
            _ => {
                return Err(Error::config(
                    field,
                    "a Cluster node is a redis:// or rediss:// TCP address",
                ))
            }
        };
        seeds.push(node);
        first.get_or_insert(info);
    }
    let seed = first.ok_or_else(|| Error::config("cluster.nodes", "no nodes"))?;
    let nodes = ClusterNodes {
        topology: ArcSwapOption::empty(),
        circuits: Mutex::default(),
        refreshed_at: AtomicU64::new(0),
        seed,
        tls: shard.tls.clone(),
        seeds,
    };
    // the TLS settings are checked now, not at the first call
    if let Some((host, port)) = nodes.seeds.first() {
        nodes
            .target(host, *port)
            .map_err(|e| Error::config("cluster.tls", e))?;
    }
    Ok(nodes)
}

#[cfg(test)]
mod tls_tests {
    use super::*;
    use futures_util::FutureExt;

    /// A connect that panics (in the redis crate or rustls) is a `connection` error, which
    /// follows the policy's `on_error`, and never an `internal` one, which would bypass it.
    #[test]
    fn a_panicking_connect_is_a_connection_error() {
        let shard = ShardConfig::new("s0", "rediss://127.0.0.1:1");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let join = rt.block_on(async {
            tokio::spawn(async { panic!("no crypto provider") })
                .await
                .unwrap_err()
        });
        let e = connect_panic(&shard, join);
        assert_eq!(e.kind(), crate::ErrorKind::Connection, "{e}");
        assert!(e.to_string().contains("no crypto provider"), "{e}");
        assert!(e.is_backend());
        let e = rt.block_on(async {
            std::panic::AssertUnwindSafe(async { panic!("{}", String::from("owned")) })
                .catch_unwind()
                .await
                .map_err(|p| connect_panic_payload(&shard, p.as_ref()))
                .unwrap_err()
        });
        assert_eq!(e.kind(), crate::ErrorKind::Connection, "{e}");
        assert!(e.to_string().contains("owned"), "{e}");
    }
}
