//! The Redis engine: one multiplexed, auto-reconnecting connection per shard, owned by a
//! Tokio runtime that belongs to the limiter. Runtime and connections are created lazily and
//! re-created in a forked child (the pid is checked on every call), because prefork servers
//! (gunicorn) and Go programs host this library. Each shard has a circuit breaker: after
//! repeated failures it is skipped (no connect attempts, no waiting) and probed in the
//! background until it answers again.

use crate::algo::Outcome;
use crate::blocking::{BlockingConn, Target};
use crate::clock::{Clock, MonotonicClock};
use crate::config::ShardConfig;
use crate::error::{Error, Result};
use crate::events::{CircuitState, Event, Subscribers};
use crate::keys::{block_key, denial_key, events_key, state_key};
use crate::limit::{AutoBlock, Compiled, PolicyInner};
use crate::memory::{LayerReq, LayeredRaw, Raw};
use crate::metrics::Latency;
use crate::pipe::{next_tag, untag, CheckCall, Pipe, PipeConn};
use crate::resp::Reply;
use crate::scripts;
use arc_swap::ArcSwapOption;
use futures_util::FutureExt;
use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::{Handle, Runtime};

/// Consecutive failures that open a shard's circuit.
const FAILURES_TO_OPEN: u32 = 3;
/// First and longest back-off between probes of an open circuit (each wait is jittered
/// down to half of it). The longest is short because it is also how long a shard that
/// answers again may go on being skipped: a probe is one connection and a PING per
/// shard and process, a few per second at most (issue 13, defect 14).
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
/// Events queued for the Redis stream writer before new ones are dropped.
const STREAM_QUEUE: usize = 4096;
/// The event stream expires this long after its last event (7 days).
const EVENTS_STREAM_TTL_MS: u64 = 7 * 86_400_000;

/// The message of the error a caller gets when a connection attempt to its shard is
/// backing off after one failed (see [`RedisEngine::may_connect`]).
const RECONNECT_WAIT: &str = "not connecting yet: the last attempt failed, backing off";

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

type StreamItem = (usize, Vec<(&'static str, String)>);

/// A connection to one shard: a standalone Redis (multiplexed, auto-reconnecting) or a
/// whole Redis Cluster (the redis crate routes by slot and follows MOVED/ASK).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// A standalone shard without TLS: its pipelined connection.
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
    Cluster(Box<ClusterClient>),
    /// A primary watched by Sentinels: resolved on connect, and again after a failure.
    Sentinel(Box<tokio::sync::Mutex<SentinelClient>>),
}

/// One shard's connection, made lazily; dropped and made again (Sentinel) when the
/// primary may have changed.
#[derive(Default)]
struct Slot {
    conn: ArcSwapOption<Conn>,
    connecting: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct PipeSlot {
    pipe: ArcSwapOption<Pipe>,
    connecting: tokio::sync::Mutex<()>,
    /// the pipe stored is new: no reply has shown yet that the server took it (a server
    /// at `maxclients` accepts the connection and answers its first command with an error)
    fresh: AtomicBool,
}

/// The runtime and connections of one process.
pub(crate) struct RtState {
    pid: u32,
    /// [`fork_generation`] when this state was made.
    generation: u64,
    handle: Handle,
    owner: Owner,
    conns: Vec<Slot>,
    /// Idle blocking connections per shard, for calls made on the caller's own thread.
    blocking: Vec<Mutex<Vec<BlockingConn>>>,
    /// The pipelined connection of each shard, for async checks.
    pipes: Vec<PipeSlot>,
    /// Futures handed over from other threads, not started yet (see [`RtState::submit`]).
    inbox: Arc<Inbox>,
    stream_tx: Option<tokio::sync::mpsc::Sender<StreamItem>>,
    timer_keeper: Arc<TimerKeeper>,
    io_spin: Arc<IoSpin>,
}

/// See [`RtState::spin`].
#[derive(Default)]
struct IoSpin {
    /// pipelined checks started and not finished
    in_flight: AtomicUsize,
    spinning: AtomicBool,
    /// `mono_us()` when the last check finished
    last_done: AtomicU64,
    /// how long the thread typically went without checks before one came (µs, a moving
    /// average over the checks that started with none in flight, each gap capped at
    /// twice `spin_wait`)
    idle_gap: AtomicU64,
}

/// Futures handed over to the I/O runtime from other threads ([`RtState::submit`]).
///
/// Waking the runtime's thread is a write to an eventfd that costs the caller 20-30 µs on
/// a VM (the wake-up's interrupt), paid on the event loop's thread for every burst. So
/// the caller wakes it only when it is parked: a current-thread runtime marks itself
/// parked in its `on_thread_park` hook, which then starts what the inbox holds, and the
/// spinning task of [`RtState::spin`] starts it too. (The multi-thread runtime is always
/// woken.)
pub(crate) struct Inbox {
    jobs: Mutex<Vec<Job>>,
    /// `jobs` is not empty (read without the lock)
    pending: AtomicBool,
    /// the runtime's thread is parked, or about to look at the inbox before parking
    parked: AtomicBool,
    /// false: park is not tracked (multi-thread runtime); always wake
    tracked: bool,
}

impl Inbox {
    fn new(tracked: bool) -> Arc<Inbox> {
        Arc::new(Inbox {
            jobs: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            parked: AtomicBool::new(true),
            tracked,
        })
    }

    /// Runs every job waiting, polled by one task: every job sends its command before the
    /// connection's driver runs (spawned as tasks of their own, a multi-thread runtime
    /// would run the driver each job wakes right after that job).
    async fn run(self: Arc<Self>) {
        let jobs = {
            let mut q = self.jobs.lock();
            self.pending.store(false, Ordering::SeqCst);
            std::mem::take(&mut *q)
        };
        let mut jobs: futures_util::stream::FuturesUnordered<Job> = jobs.into_iter().collect();
        while futures_util::StreamExt::next(&mut jobs).await.is_some() {}
    }

    /// On the runtime: starts the jobs waiting, if any.
    fn start(self: &Arc<Self>) {
        if self.pending.load(Ordering::Relaxed) && self.pending.swap(false, Ordering::SeqCst) {
            tokio::spawn(Arc::clone(self).run());
        }
    }

    /// The runtime's `on_thread_park` hook. (Paired with the caller in
    /// [`RtState::submit`]: the caller stores `pending` then loads `parked`, this stores
    /// `parked` then loads `pending`, all SeqCst, so one of the two sees the other.)
    fn before_park(self: &Arc<Self>) {
        self.parked.store(true, Ordering::SeqCst);
        if self.pending.swap(false, Ordering::SeqCst) {
            tokio::spawn(Arc::clone(self).run());
        }
    }

    fn after_unpark(&self) {
        self.parked.store(false, Ordering::SeqCst);
    }
}

/// How often the spinning I/O thread gives its CPU to other threads ready to run there.
const OS_YIELD_EVERY_US: u64 = 10;

/// One pipelined check in flight, for [`RtState::spin`]; counted out on drop (also when the
/// caller gives up).
struct InFlight(Arc<IoSpin>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.last_done.store(mono_us(), Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// See [`RtState::keep_timers`].
#[derive(Default)]
struct TimerKeeper {
    running: AtomicBool,
    /// a call came in since the keeper's last tick
    busy: AtomicBool,
}

/// Who runs the I/O runtime.
enum Owner {
    /// A multi-thread runtime with its own workers.
    Workers(Option<Runtime>),
    /// A current-thread runtime driven by one thread of ours, until `stop` is dropped.
    Thread {
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        thread: Option<std::thread::JoinHandle<()>>,
    },
}

/// A future handed to the I/O runtime.
pub(crate) type Job = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

impl RtState {
    /// Keeps one timer pending on the I/O runtime while calls keep coming, so that a call's
    /// deadline never is the runtime's earliest timer. Tokio wakes its driver (a write to
    /// an eventfd, and one more wake-up later) whenever a new timer is due before every
    /// pending one, which with no other timer pending was the first deadline of every
    /// burst: 0.38 wake-ups per check in the Node benchmark. The keeper ticks at half the
    /// timeout, at most once a second, and stops after a tick with no call, so an idle
    /// limiter does not wake at all.
    fn keep_timers(&self, timeout: Duration) {
        let k = &self.timer_keeper;
        if !k.busy.load(Ordering::Relaxed) {
            k.busy.store(true, Ordering::Relaxed);
        }
        if k.running.load(Ordering::Relaxed) || k.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let k = Arc::clone(k);
        let period = (timeout / 2).clamp(Duration::from_millis(1), Duration::from_secs(1));
        self.handle.spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                if !k.busy.swap(false, Ordering::AcqRel) {
                    break;
                }
            }
            // a call racing with this exit only costs one wake-up of the driver
            k.running.store(false, Ordering::Release);
        });
    }

    /// Counts a pipelined check in (until the guard drops) and keeps the I/O thread
    /// spinning instead of sleeping in epoll while checks are in flight, so that Redis's
    /// replies and the callers' next calls find it awake (every wake-up of a sleeping
    /// thread costs ~20-50 µs on a VM; a blocking caller spins on its socket for the same
    /// reason). With none in flight it goes on spinning for `spin_wait` only when calls
    /// have been coming back within `spin_wait` (a lone caller's next call, typically):
    /// at a slower pace it would spin for nothing. The spinning is a task that yields in a
    /// loop: the runtime then polls its driver without blocking and takes calls handed
    /// over from other threads at once; every 10 µs it also gives the CPU to any thread
    /// ready to run there. It takes a place among the spinning threads (half the CPUs).
    fn spin(&self, spin_wait: Duration) -> InFlight {
        let io = &self.io_spin;
        let wait = spin_wait.as_micros() as u64;
        let n = io.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        if n == 1 {
            // (capped, so that one pause of the caller's, a GC say, does not stop the
            // spinning of a caller that is otherwise quick)
            let gap = mono_us().saturating_sub(io.last_done.load(Ordering::Relaxed));
            let avg = io.idle_gap.load(Ordering::Relaxed);
            io.idle_gap
                .store((avg * 7 + gap.min(2 * wait)) / 8, Ordering::Relaxed);
        }
        let guard = InFlight(Arc::clone(io));
        if wait == 0
            || io.spinning.load(Ordering::Relaxed)
            || io.spinning.swap(true, Ordering::AcqRel)
        {
            return guard;
        }
        let Some(slot) = crate::blocking::SPINNING.take() else {
            io.spinning.store(false, Ordering::Release);
            return guard;
        };
        let io = Arc::clone(io);
        let inbox = Arc::clone(&self.inbox);
        self.handle.spawn(async move {
            let mut yielded = mono_us();
            loop {
                // calls handed over meanwhile: their callers did not wake this thread
                inbox.start();
                let now = mono_us();
                if io.in_flight.load(Ordering::Acquire) == 0 {
                    let idle = now.saturating_sub(io.last_done.load(Ordering::Relaxed));
                    let tail = if io.idle_gap.load(Ordering::Relaxed) <= wait {
                        wait
                    } else {
                        0
                    };
                    if idle > tail {
                        break;
                    }
                }
                if now - yielded >= OS_YIELD_EVERY_US {
                    // let a thread that is ready to run on this CPU have it: the event loop
                    // that just woke this thread may be queued behind it (it waited out
                    // the whole spin before, 100 µs, when the two shared a CPU)
                    std::thread::yield_now();
                    yielded = now;
                }
                tokio::task::yield_now().await;
            }
            drop(slot);
            // a check racing with this exit goes without spinning: it only waits longer
            io.spinning.store(false, Ordering::Release);
        });
        guard
    }

    /// The handle of the I/O runtime: spawn on it, or `block_on` from outside it.
    pub fn runtime(&self) -> &Handle {
        &self.handle
    }

    /// Starts `job` on the I/O runtime, from any thread. Jobs submitted while earlier ones
    /// wait to start are run together by one task: their commands are all queued on the
    /// connection before its driver runs, so a burst from an event loop (Node, asyncio)
    /// leaves in one write and costs the I/O thread one wake-up. (Spawned one by one from
    /// outside, each job would run alone and be written alone: the runtime runs the driver
    /// it woke before taking the next job from its injection queue.)
    ///
    /// The caller wakes the runtime's thread only when it is parked (see [`Inbox`]); an
    /// awake thread starts the jobs itself before it parks.
    pub fn submit(&self, job: Job) {
        let inbox = &self.inbox;
        let first = {
            let mut q = inbox.jobs.lock();
            q.push(job);
            q.len() == 1
        };
        if !first {
            return; // whoever queued the first job of this burst saw to it
        }
        inbox.pending.store(true, Ordering::SeqCst);
        if !inbox.tracked || inbox.parked.load(Ordering::SeqCst) {
            self.handle.spawn(Arc::clone(inbox).run());
        }
    }
}

impl Drop for RtState {
    fn drop(&mut self) {
        // never waits for tasks, so a limiter may be dropped inside an async context
        match &mut self.owner {
            Owner::Workers(rt) => {
                if let Some(rt) = rt.take() {
                    rt.shutdown_background();
                }
            }
            Owner::Thread { stop, thread } => {
                // the thread returns from block_on and drops the runtime at once (tasks are
                // dropped, not awaited); wait for that, unless this is that thread
                drop(stop.take());
                if let Some(t) = thread.take() {
                    if !is_current(&t) {
                        let _ = t.join();
                    }
                }
            }
        }
    }
}

/// True on the thread of `t`. (Not `std::thread::current()`: on a C thread that registers
/// a thread handle that is never given back.)
fn is_current(t: &std::thread::JoinHandle<()>) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::thread::JoinHandleExt;
        // SAFETY: pthread_self has no preconditions
        unsafe { libc::pthread_equal(t.as_pthread_t(), libc::pthread_self()) != 0 }
    }
    #[cfg(not(unix))]
    {
        t.thread().id() == std::thread::current().id()
    }
}

/// Starts the I/O runtime: by default one thread driving a current-thread runtime, where a
/// task that wakes the connection's driver queues it behind the other ready tasks, so a
/// burst of concurrent calls leaves in one write (a multi-thread runtime runs the woken
/// driver next, one write per command). `SHARDLIMIT_WORKER_THREADS=N` (N >= 1) asks for a
/// multi-thread runtime with N workers instead.
fn start_runtime(worker_threads: usize) -> std::io::Result<(Handle, Owner, Arc<Inbox>)> {
    if worker_threads >= 1 {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads)
            .thread_name("shardlimit-io")
            .enable_all()
            .build()?;
        return Ok((
            rt.handle().clone(),
            Owner::Workers(Some(rt)),
            Inbox::new(false),
        ));
    }
    let inbox = Inbox::new(true);
    let (parking, unparked) = (Arc::clone(&inbox), Arc::clone(&inbox));
    // built on its own thread, so that everything the runtime keeps of "its" thread is
    // that thread's and ends with it
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // (a parking_lot handshake: std's blocking channels register a thread handle for the
    // caller, which may be a C thread that never gives it back)
    let ready = Arc::new((Mutex::new(None), parking_lot::Condvar::new()));
    let ready_tx = Arc::clone(&ready);
    let send = move |r: std::io::Result<Handle>| {
        *ready_tx.0.lock() = Some(r);
        ready_tx.1.notify_one();
    };
    let thread = std::thread::Builder::new()
        .name("shardlimit-io".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .on_thread_park(move || parking.before_park())
                .on_thread_unpark(move || unparked.after_unpark())
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return send(Err(e)),
            };
            send(Ok(rt.handle().clone()));
            let _ = rt.block_on(stopped);
            rt.shutdown_background();
        })?;
    let handle = {
        let mut r = ready.0.lock();
        loop {
            if let Some(r) = r.take() {
                break r?;
            }
            ready.1.wait(&mut r);
        }
    };
    Ok((
        handle,
        Owner::Thread {
            stop: Some(stop),
            thread: Some(thread),
        },
        inbox,
    ))
}

#[derive(Default)]
struct Circuit {
    failures: AtomicU32,
    /// Nonzero while open: the shard is skipped (monotonic µs when it opened).
    open_until: AtomicU64,
    backoff_us: AtomicU64,
    /// the probe task of an open circuit runs
    probing: AtomicBool,
}

/// Which circuit a call goes through: its shard's, or in a Redis Cluster the one of the
/// primary that owns the slot of the call's key (circuits follow what fails: one dead
/// primary must not take the other primaries' slots down with it).
#[derive(Clone)]
enum Breaker {
    Shard,
    Node(Arc<NodeCircuit>),
}

/// The circuit of one Cluster primary, by address.
struct NodeCircuit {
    host: String,
    port: u16,
    circuit: Circuit,
}

impl NodeCircuit {
    fn name(&self) -> String {
        format!("cluster/{}:{}", self.host, self.port)
    }
}

/// Which primary owns each slot, from `CLUSTER SLOTS`.
struct Topology {
    /// slot → index into `nodes`; `u16::MAX` when no primary owns it
    owners: Vec<u16>,
    nodes: Vec<Arc<NodeCircuit>>,
}

/// What a Cluster shard knows of its nodes: the slot map (read on connect, again after
/// failures and while a node's circuit is open) and one circuit per primary, kept over
/// refreshes of the map.
struct ClusterNodes {
    topology: ArcSwapOption<Topology>,
    circuits: Mutex<std::collections::HashMap<(String, u16), Arc<NodeCircuit>>>,
    refreshing: AtomicBool,
    /// monotonic µs of the last refresh
    refreshed_at: AtomicU64,
    /// how to connect to a node (the first seed's login and TLS settings)
    seed: redis::ConnectionInfo,
}

/// Slots, primaries and reply items of a `CLUSTER SLOTS` reply accepted at most (its
/// bytes are untrusted like every reply).
const CLUSTER_SLOTS: usize = 16384;
const CLUSTER_NODES_MAX: usize = 1000;

impl ClusterNodes {
    /// The slot map of a `CLUSTER SLOTS` reply; `None` when it is malformed.
    fn parse(&self, v: &redis::Value) -> Option<Topology> {
        use redis::Value as V;
        let V::Array(ranges) = v else { return None };
        if ranges.len() > CLUSTER_SLOTS {
            return None;
        }
        let text = |v: &V| match v {
            V::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_string),
            V::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let mut owners = vec![u16::MAX; CLUSTER_SLOTS];
        let mut nodes: Vec<Arc<NodeCircuit>> = Vec::new();
        let mut circuits = self.circuits.lock();
        for r in ranges {
            let V::Array(r) = r else { return None };
            let (Some(V::Int(start)), Some(V::Int(end)), Some(V::Array(primary))) =
                (r.first(), r.get(1), r.get(2))
            else {
                return None;
            };
            if !(0..CLUSTER_SLOTS as i64).contains(start)
                || !(*start..CLUSTER_SLOTS as i64).contains(end)
            {
                return None;
            }
            let host = primary.first().and_then(text)?;
            let port = match primary.get(1) {
                Some(V::Int(p)) => u16::try_from(*p).ok().filter(|p| *p != 0)?,
                _ => return None,
            };
            if host.is_empty() || host.len() > 255 {
                continue; // an unknown endpoint: its slots keep the shard's circuit
            }
            let at = match nodes.iter().position(|n| n.host == host && n.port == port) {
                Some(i) => i,
                None => {
                    if nodes.len() >= CLUSTER_NODES_MAX {
                        return None;
                    }
                    if circuits.len() >= 4 * CLUSTER_NODES_MAX {
                        circuits.clear(); // nodes come and go: forget the old ones
                    }
                    let n = circuits
                        .entry((host.clone(), port))
                        .or_insert_with(|| {
                            Arc::new(NodeCircuit {
                                host: host.clone(),
                                port,
                                circuit: Circuit::default(),
                            })
                        })
                        .clone();
                    nodes.push(n);
                    nodes.len() - 1
                }
            };
            for slot in *start..=*end {
                owners[slot as usize] = at as u16;
            }
        }
        Some(Topology { owners, nodes })
    }

    /// The circuit of the primary that owns the slot of `redis_key`, when known.
    fn breaker(&self, redis_key: &str) -> Breaker {
        let Some(t) = self.topology.load_full() else {
            return Breaker::Shard;
        };
        let slot = crate::routing::cluster_slot(redis_key) as usize;
        match t
            .owners
            .get(slot)
            .and_then(|i| t.nodes.get(usize::from(*i)))
        {
            Some(n) => Breaker::Node(Arc::clone(n)),
            None => Breaker::Shard,
        }
    }

    /// True when the map names `n` as the owner of a slot.
    fn owns_slots(&self, n: &NodeCircuit) -> bool {
        self.topology
            .load()
            .as_ref()
            .is_some_and(|t| t.nodes.iter().any(|m| m.host == n.host && m.port == n.port))
    }

    /// How to connect to node `host:port`: the seed's settings at another address.
    fn node_client(&self, host: &str, port: u16) -> redis::RedisResult<redis::Client> {
        let addr = match self.seed.addr() {
            redis::ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => redis::ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => redis::ConnectionAddr::Tcp(host.to_string(), port),
        };
        redis::Client::open(self.seed.clone().set_addr(addr))
    }
}

/// The Sentinels of a shard and the primary's name there, for [`RedisEngine::watch_sentinels`].
#[derive(Clone)]
struct SentinelWatch {
    /// `redis://[user:password@]host:port` of each Sentinel
    nodes: Vec<String>,
    master: String,
}

/// The connection attempts of one shard: after one failed, the next waits a back-off
/// (doubling, jittered), and only one caller makes it; the others fail at once.
#[derive(Default)]
struct Reconnect {
    /// monotonic µs before which no connection attempt is made; 0 = no back-off
    next_at: AtomicU64,
    backoff_us: AtomicU64,
}

/// `us` jittered down to between half and all of it (xorshift of the clock and `salt`:
/// processes that saw one failure at one moment spread their retries).
fn jitter(us: u64, salt: u64) -> u64 {
    let mut x =
        mono_us() ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(std::process::id());
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    us / 2 + x % (us / 2 + 1)
}

/// True for an error reply that says the server did not serve the command at all rather
/// than that the command failed: it refused the client (`maxclients`, AUTH), is loading,
/// is a replica now (a failover), or its cluster cannot serve the slot. These are backend
/// failures (`connection`), which feed the circuit and close the connection.
fn refused_reply(e: &str) -> bool {
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

pub(crate) struct RedisEngine {
    pub shards: Vec<ShardConfig>,
    clients: Vec<Client>,
    /// Per shard, where blocking callers connect themselves (`None`: TLS, Cluster or
    /// Sentinel, which go through the I/O runtime).
    targets: Vec<Option<Target>>,
    /// How long a blocking caller may spin on its socket before sleeping, and the I/O
    /// thread after the last async check (config `spin_wait`, µs; a reload that keeps the
    /// engine sets it anew).
    spin_wait_us: AtomicU64,
    pub timeout: Duration,
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
}

impl std::fmt::Debug for RedisEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisEngine")
            .field("shards", &self.shards)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The client of a `redis://` or `rediss://` shard, with its TLS settings.
fn single_client(field: &str, s: &ShardConfig) -> Result<redis::Client> {
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
fn sentinel_client(field: &str, s: &ShardConfig) -> Result<SentinelClient> {
    use redis::IntoConnectionInfo;
    let bad = |e: redis::RedisError| {
        let e = crate::config::scrub(&e.to_string(), &s.url);
        Error::config(field, format!("invalid sentinel configuration: {e}"))
    };
    let su = crate::config::parse_sentinel_url(field, &s.url)?;
    let mut sentinels = Vec::with_capacity(su.nodes.len());
    let (mut s_user, mut s_pass) = (None, None);
    for node in &su.nodes {
        let info = node.as_str().into_connection_info().map_err(bad)?;
        s_user = info.redis_settings().username().map(str::to_string);
        s_pass = info.redis_settings().password().map(str::to_string);
        sentinels.push(match (info.addr(), &s.sentinel_tls) {
            (redis::ConnectionAddr::Tcp(host, port), Some(_)) => redis::ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: false,
                tls_params: None,
            },
            (addr, _) => addr.clone(),
        });
    }
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
    if let Some(u) = &s_user {
        b = b.set_client_to_sentinel_username(u);
    }
    if let Some(p) = &s_pass {
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
fn connect_panic(shard: &ShardConfig, e: tokio::task::JoinError) -> Error {
    match e.try_into_panic() {
        Ok(p) => connect_panic_payload(shard, p.as_ref()),
        Err(e) => Error::Connection {
            shard: shard.name.clone(),
            message: format!("connect task failed: {e}"),
        },
    }
}

fn connect_panic_payload(shard: &ShardConfig, p: &(dyn std::any::Any + Send)) -> Error {
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

fn map_redis_error(shard: &ShardConfig, timeout: Duration, e: redis::RedisError) -> Error {
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
fn refused_kind(e: &redis::RedisError) -> bool {
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

/// Forks this process has seen: bumped in the child of every `fork()` by a `pthread_atfork`
/// handler. Checking it costs an atomic load per call, where comparing process ids would
/// cost a `getpid` system call.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// A number that changes in the child of every `fork()` made after the first call: state
/// tied to this process (threads, sockets, event-loop registrations) that was recorded with
/// another value was inherited from a parent. An atomic load, unlike `getpid()`, which is
/// a system call. Bindings use it to notice they run in a forked child.
pub fn fork_generation() -> u64 {
    #[cfg(unix)]
    {
        static HOOK: std::sync::Once = std::sync::Once::new();
        extern "C" fn in_child() {
            FORKS.fetch_add(1, Ordering::AcqRel);
            // the child has only the thread that forked: no other holds a place
            crate::blocking::forget_places_in_child();
        }
        HOOK.call_once(|| {
            // SAFETY: registers a handler that only touches an atomic (async-signal-safe).
            unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        });
    }
    FORKS.load(Ordering::Acquire)
}

fn mono_us() -> u64 {
    MonotonicClock.now_us()
}

/// The longest duration a script reply can carry: a bucket's span plus the longest window
/// (block TTLs are shorter). Anything longer is not a reply of our scripts.
const MAX_REPLY_US: i64 = (crate::limit::MAX_BUCKET_SPAN_US + crate::limit::MAX_PERIOD_US) as i64;

/// An error for a script reply that our scripts cannot have given: every value read from
/// Redis is checked before it becomes part of a decision.
fn implausible(shard: &ShardConfig, r: &[i64], why: &str) -> Error {
    let shown = &r[..r.len().min(12)];
    let more = if r.len() > shown.len() { " ..." } else { "" };
    Error::Script {
        shard: shard.name.clone(),
        message: format!("implausible script reply {shown:?}{more}: {why}"),
    }
}

/// The outcome in `r` (allowed, remaining, reset_after, retry_after, delay), checked
/// against the limit it was computed for.
fn outcome(r: &[i64], shard: &ShardConfig, limit: u64) -> Result<Outcome> {
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
fn block_verdict(shard: &ShardConfig, r: &[i64], v: i64) -> Result<u8> {
    match v {
        0..=2 => Ok(v as u8),
        _ => Err(implausible(
            shard,
            r,
            "a block verdict other than 0, 1 or 2",
        )),
    }
}

fn auto_block_args(a: Option<&AutoBlock>) -> (u64, u64, u64) {
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
    /// The config's `spin_wait`.
    pub fn spin_wait(&self) -> Duration {
        Duration::from_micros(self.spin_wait_us.load(Ordering::Relaxed))
    }

    /// Sets `spin_wait` (at build time, and on a reload that keeps this engine).
    pub fn set_spin_wait(&self, d: Duration) {
        self.spin_wait_us
            .store(d.as_micros() as u64, Ordering::Relaxed);
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
                if s.url.starts_with("redis+sentinel://") {
                    let client = sentinel_client(&field, s)?;
                    // the watch of +switch-master (plain TCP to the Sentinels; with
                    // `sentinel_tls` the switch is followed when a call fails instead)
                    if s.sentinel_tls.is_none() {
                        let su = crate::config::parse_sentinel_url(&field, &s.url)?;
                        watch[i] = Some(SentinelWatch {
                            nodes: su.nodes.clone(),
                            master: su.master.clone(),
                        });
                    }
                    return Ok(Client::Sentinel(Box::new(tokio::sync::Mutex::new(client))));
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
        #[allow(unused_mut)]
        let mut builder = ClusterClient::builder(nodes.iter().map(String::as_str))
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(2)
            .min_retry_wait(10)
            .max_retry_wait(200);
        #[cfg(feature = "tls")]
        if nodes.iter().any(|n| n.starts_with("rediss://")) {
            crate::tls::ensure_crypto_provider();
            if let Some(t) = &tls {
                if let Some(c) = t.certificates() {
                    builder = builder.certs(c);
                }
                builder = builder.tls(t.mode());
            }
        }
        let client = builder.build().map_err(|e| {
            let e = nodes
                .iter()
                .fold(e.to_string(), |e, n| crate::config::scrub(&e, n));
            Error::config("cluster.nodes", format!("invalid cluster: {e}"))
        })?;
        let mut shard = ShardConfig::new("cluster", nodes.join(","));
        shard.tls = tls;
        RedisEngine::build(
            vec![shard],
            vec![Client::Cluster(Box::new(client))],
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
            .map(|c| match c {
                Client::Single(c) => Target::of(c),
                _ => None,
            })
            .collect();
        let cluster_nodes = match (clients.first(), shards.first()) {
            (Some(Client::Cluster(_)), Some(shard)) => {
                let first = shard.url.split(',').next().unwrap_or_default();
                let seed = redis::IntoConnectionInfo::into_connection_info(first).map_err(|e| {
                    Error::config("cluster.nodes", format!("invalid node URL: {e}"))
                })?;
                Some(ClusterNodes {
                    topology: ArcSwapOption::empty(),
                    circuits: Mutex::default(),
                    refreshing: AtomicBool::new(false),
                    refreshed_at: AtomicU64::new(0),
                    seed,
                })
            }
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
            prefix,
            worker_threads,
            state: ArcSwapOption::empty(),
            init: Mutex::new(()),
            subscribers,
            stream_maxlen,
            latency: Latency::default(),
            events_dropped: AtomicU64::new(0),
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
            pid,
            generation,
            handle,
            owner,
            conns: self.shards.iter().map(|_| Slot::default()).collect(),
            blocking: self.shards.iter().map(|_| Mutex::default()).collect(),
            pipes: self.shards.iter().map(|_| PipeSlot::default()).collect(),
            inbox,
            stream_tx,
            timer_keeper: Arc::default(),
            io_spin: Arc::default(),
        });
        self.state.store(Some(st.clone()));
        Ok(st)
    }

    /// True when the one shard is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.clients.first(), Some(Client::Cluster(_)))
    }

    async fn connection(&self, st: &RtState, shard: usize) -> Result<Conn> {
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
        let manager = |client: redis::Client| {
            let cfg = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(self.timeout))
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
            Client::Cluster(client) => {
                let client = client.clone();
                st.runtime()
                    .spawn(async move { client.get_async_connection().await })
                    .await
                    .map_err(join)?
                    .map(Conn::Cluster)
                    .map_err(map)?
            }
            Client::Sentinel(sentinel) => {
                // ask the Sentinels which server is the primary now
                let mut sentinel = sentinel.lock().await;
                let primary = std::panic::AssertUnwindSafe(sentinel.async_get_client())
                    .catch_unwind()
                    .await
                    .map_err(|p| connect_panic_payload(&self.shards[shard], p.as_ref()))?
                    .map_err(map)?;
                drop(sentinel);
                tracing::debug!(shard = %self.shards[shard].name, primary = ?primary.get_connection_info().addr(), "shardlimit: sentinel resolved the primary");
                st.runtime()
                    .spawn(manager(primary))
                    .await
                    .map_err(join)?
                    .map(Conn::Single)
                    .map_err(map)?
            }
        };
        slot.conn.store(Some(Arc::new(conn.clone())));
        if let Conn::Cluster(c) = &conn {
            // which primary owns which slot, for their circuits (best effort: until it is
            // known, the whole Cluster's circuit applies)
            self.refresh_topology(c.clone()).await;
        }
        Ok(conn)
    }

    /// Reads the Cluster's slot map (`CLUSTER SLOTS`) over `conn`, within the timeout.
    async fn refresh_topology(&self, mut conn: ClusterConnection) {
        let Some(cn) = &self.cluster_nodes else {
            return;
        };
        if cn.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let r = tokio::time::timeout(
            self.timeout,
            redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async::<redis::Value>(&mut conn),
        )
        .await;
        match r {
            Ok(Ok(v)) => match cn.parse(&v) {
                Some(t) => cn.topology.store(Some(Arc::new(t))),
                None => tracing::warn!("shardlimit: malformed CLUSTER SLOTS reply ignored"),
            },
            Ok(Err(e)) => tracing::debug!(error = %e, "shardlimit: CLUSTER SLOTS failed"),
            Err(_) => tracing::debug!("shardlimit: CLUSTER SLOTS timed out"),
        }
        cn.refreshed_at.store(mono_us(), Ordering::Relaxed);
        cn.refreshing.store(false, Ordering::Release);
    }

    /// After a failure in a Cluster: reads the slot map again in the background (at most
    /// every 200 ms), so keys of slots that moved (a failover) follow their new owner.
    fn refresh_topology_soon(self: &Arc<Self>, st: &RtState) {
        let Some(cn) = &self.cluster_nodes else {
            return;
        };
        if mono_us().saturating_sub(cn.refreshed_at.load(Ordering::Relaxed)) < 200_000 {
            return;
        }
        let Some(conn) = st.conns[0].conn.load_full() else {
            return;
        };
        if let Conn::Cluster(c) = &*conn {
            let (me, c) = (Arc::clone(self), c.clone());
            st.runtime()
                .spawn(async move { me.refresh_topology(c).await });
        }
    }

    /// The circuit a call on `shard` for Redis key `redis_key` goes through.
    fn breaker(&self, redis_key: Option<&str>) -> Breaker {
        match (&self.cluster_nodes, redis_key) {
            (Some(cn), Some(k)) => cn.breaker(k),
            _ => Breaker::Shard,
        }
    }

    /// In a Cluster, the Redis key that picks a command's circuit (see
    /// [`RedisEngine::with_conn_at`]); `None` otherwise.
    fn at(&self, redis_key: &str) -> Option<String> {
        self.cluster_nodes.as_ref().map(|_| redis_key.to_string())
    }

    /// [`RedisEngine::at`] of a layered call (its keys share one slot).
    fn layers_at(&self, layers: &[(LayerReq<'_>, &str)]) -> Option<String> {
        let (l, key_scope) = layers.first().filter(|_| self.cluster_nodes.is_some())?;
        Some(state_key(&self.prefix, key_scope, l.key))
    }

    fn circuit<'a>(&'a self, shard: usize, b: &'a Breaker) -> &'a Circuit {
        match b {
            Breaker::Shard => &self.circuits[shard],
            Breaker::Node(n) => &n.circuit,
        }
    }

    fn breaker_name(&self, shard: usize, b: &Breaker) -> String {
        match b {
            Breaker::Shard => self.shards[shard].name.clone(),
            Breaker::Node(n) => n.name(),
        }
    }

    /// After a failure on a Sentinel shard, forget the connection: the next call asks the
    /// Sentinels for the primary again (it may have failed over).
    fn forget_connection(&self, st: &RtState, shard: usize) {
        if matches!(self.clients[shard], Client::Sentinel(_)) {
            st.conns[shard].conn.store(None);
        }
    }

    /// Runs `f` on shard `shard`'s connection under the deadline, through its circuit.
    async fn raw<T, F, Fut>(&self, st: &RtState, shard: usize, f: F) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let deadline = Instant::now() + self.timeout;
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
            let conn = self.connection(st, shard).await?;
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
    async fn with_conn_at<T, F, Fut>(
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
        let r = Box::pin(self.raw(&st, shard, f)).await;
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
    fn account<T>(
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

    /// Claims a connection attempt to shard `shard`: at once when no attempt failed
    /// lately; after a failure, one caller per back-off period, the others get
    /// [`RECONNECT_WAIT`] without connecting (at `maxclients` one process made 1031
    /// refused connections in 0.1 s before this).
    fn may_connect(&self, shard: usize) -> Result<()> {
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
    fn connect_failed(&self, shard: usize) {
        let r = &self.reconnects[shard];
        let b =
            (r.backoff_us.load(Ordering::Relaxed) * 2).clamp(RECONNECT_MIN_US, RECONNECT_MAX_US);
        r.backoff_us.store(b, Ordering::Relaxed);
        r.next_at
            .store(mono_us() + jitter(b, shard as u64), Ordering::Release);
    }

    /// A new connection to `shard` served a command: connect freely again.
    fn connect_ok(&self, shard: usize) {
        let r = &self.reconnects[shard];
        if r.next_at.load(Ordering::Relaxed) != 0 {
            r.next_at.store(0, Ordering::Release);
            r.backoff_us.store(0, Ordering::Relaxed);
        }
    }

    /// The error of a command the server refused to serve ([`refused_reply`]).
    fn refused(&self, shard: usize, e: &str) -> Error {
        let mut message = String::from("the server refused the command: ");
        // (untrusted bytes: keep it short)
        message.extend(e.chars().take(200));
        Error::Connection {
            shard: self.shards[shard].name.clone(),
            message,
        }
    }

    /// The error of a call to shard `shard` that outlived the deadline.
    fn timeout_error(&self, shard: usize) -> Error {
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
    /// carrying another call's `tag` is not (see `pipe::untag`). `deadline` is the call's
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
            |mut c| match c.request(packed, deadline, self.spin_wait()) {
                // the connection is dropped, never reused
                Err(e) => Err(self.io_error(shard, e)),
                Ok(Reply::Error(e)) if refused_reply(&e) => Err(self.refused(shard, &e)),
                Ok(reply) => {
                    // a reply with another call's tag: the connection is not reused
                    let reply = untag(reply, tag).map_err(|_| {
                        self.io_error(shard, crate::resp::protocol(crate::pipe::NOT_THEIRS))
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

    fn io_error(&self, shard: usize, e: std::io::Error) -> Error {
        if e.kind() == std::io::ErrorKind::TimedOut {
            self.timeout_error(shard)
        } else {
            Error::Connection {
                shard: self.shards[shard].name.clone(),
                message: e.to_string(),
            }
        }
    }

    /// The pipelined connection of shard `shard`, made (on the I/O runtime) when there is
    /// none or the last one broke.
    /// The wait for another caller's connect and the connect itself end at `deadline`; a
    /// pipe that is there is handed out with no timer.
    async fn pipe(
        &self,
        st: &RtState,
        shard: usize,
        target: &Target,
        deadline: Instant,
    ) -> Result<Arc<Pipe>> {
        let slot = &st.pipes[shard];
        if let Some(p) = slot.pipe.load_full().filter(|p| !p.is_broken()) {
            return Ok(p);
        }
        tokio::time::timeout_at(deadline.into(), self.connect_pipe(st, shard, target))
            .await
            .unwrap_or_else(|_| Err(self.timeout_error(shard)))
    }

    async fn connect_pipe(&self, st: &RtState, shard: usize, target: &Target) -> Result<Arc<Pipe>> {
        let slot = &st.pipes[shard];
        let _one_at_a_time = slot.connecting.lock().await;
        if let Some(p) = slot.pipe.load_full().filter(|p| !p.is_broken()) {
            return Ok(p);
        }
        self.may_connect(shard)?;
        let (target, timeout) = (target.clone(), self.timeout);
        let pipe = st
            .runtime()
            .spawn(async move { Pipe::connect(&target, timeout).await })
            .await
            .map_err(|e| connect_panic(&self.shards[shard], e))?
            .map_err(|e| self.io_error(shard, e))?;
        let pipe = Arc::new(pipe);
        slot.fresh.store(true, Ordering::Release);
        slot.pipe.store(Some(Arc::clone(&pipe)));
        Ok(pipe)
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

    fn gate(&self, shard: usize, b: &Breaker) -> Result<()> {
        if self.circuit(shard, b).open_until.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        Err(Error::Unavailable {
            shard: self.breaker_name(shard, b),
        })
    }

    /// Counts a backend failure of `shard` (through circuit `b`); the last of
    /// [`FAILURES_TO_OPEN`] in a row opens the circuit and starts its probe. (Right after
    /// a probe closed it, one failure is enough: the first calls are the trial.)
    fn failed(self: &Arc<Self>, st: &RtState, shard: usize, b: &Breaker, e: &Error) {
        let c = self.circuit(shard, b);
        let n = c.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= FAILURES_TO_OPEN
            && c.open_until
                .compare_exchange(0, mono_us().max(1), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            if c.backoff_us.load(Ordering::Relaxed) == 0 {
                c.backoff_us.store(BACKOFF_MIN_US, Ordering::Relaxed);
            }
            let name = self.breaker_name(shard, b);
            tracing::warn!(shard = %name, error = %e, "shardlimit: circuit opened after {n} consecutive failures");
            self.emit(Event::Circuit {
                shard: name,
                state: CircuitState::Open,
            });
            if !c.probing.swap(true, Ordering::AcqRel) {
                let me = Arc::downgrade(self);
                st.runtime().spawn(RedisEngine::probe(me, shard, b.clone()));
            }
        }
    }

    /// Probes an open circuit until the shard answers: a new connection and a PING after
    /// each back-off (jittered, doubling up to [`BACKOFF_MAX_US`]), so a shard that
    /// answers again is used again within that back-off, whether calls come or not.
    /// The circuit closes half-open: the next failure opens it again at once. Ends when
    /// the limiter is gone. A Cluster node's probe reads the slot map first: once the
    /// node owns no slot (its replica took over), nothing routes to it and it closes.
    async fn probe(me: std::sync::Weak<Self>, shard: usize, b: Breaker) {
        loop {
            let backoff = match me.upgrade() {
                Some(e) => e
                    .circuit(shard, &b)
                    .backoff_us
                    .load(Ordering::Relaxed)
                    .clamp(BACKOFF_MIN_US, BACKOFF_MAX_US),
                None => return,
            };
            tokio::time::sleep(Duration::from_micros(jitter(backoff, shard as u64))).await;
            let Some(e) = me.upgrade() else { return };
            let ok = match &b {
                Breaker::Shard => e.ping_new_connection(shard).await,
                Breaker::Node(n) => e.probe_node(n).await,
            };
            let c = e.circuit(shard, &b);
            if !ok {
                c.backoff_us
                    .store((backoff * 2).min(BACKOFF_MAX_US), Ordering::Relaxed);
                tracing::debug!(shard = %e.breaker_name(shard, &b), backoff_ms = backoff / 1000, "shardlimit: probe failed");
                continue;
            }
            if let (Breaker::Shard, Ok(st)) = (&b, e.state()) {
                e.connect_ok(shard);
                // connections idle since before the outage are likely dead: the trial
                // calls must not fail on them
                st.blocking[shard].lock().clear();
                if matches!(e.clients[shard], Client::Single(_)) {
                    st.conns[shard].conn.store(None);
                }
            }
            c.failures.store(FAILURES_TO_OPEN - 1, Ordering::Relaxed);
            // (before closing: a failure right after the close starts a new probe)
            c.probing.store(false, Ordering::Release);
            c.open_until.store(0, Ordering::Release);
            let name = e.breaker_name(shard, &b);
            tracing::info!(shard = %name, "shardlimit: shard answers again, circuit closed");
            e.emit(Event::Circuit {
                shard: name,
                state: CircuitState::Closed,
            });
            return;
        }
    }

    /// One probe of Cluster node `n`: the slot map again, then a PING on a new
    /// connection to the node when it still owns slots.
    async fn probe_node(self: &Arc<Self>, n: &NodeCircuit) -> bool {
        let Some(cn) = &self.cluster_nodes else {
            return true;
        };
        if let Ok(st) = self.state() {
            if let Some(conn) = st.conns[0].conn.load_full() {
                if let Conn::Cluster(c) = &*conn {
                    self.refresh_topology(c.clone()).await;
                }
            }
        }
        if !cn.owns_slots(n) {
            return true;
        }
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let work = async {
            let client = cn.node_client(&n.host, n.port)?;
            let mut c = client
                .get_multiplexed_async_connection_with_config(&cfg)
                .await?;
            redis::cmd("PING").query_async::<String>(&mut c).await
        };
        matches!(
            tokio::time::timeout(self.timeout, work).await,
            Ok(Ok(pong)) if pong == "PONG"
        )
    }

    /// Follows failovers of a shard behind Sentinels as Sentinel reports them: subscribed
    /// to `+switch-master` on one Sentinel after another, it drops the shard's connection
    /// when the primary switches, so the next call asks the Sentinels for the new one at
    /// once (calls followed only when the old primary failed them, then after the probe's
    /// back-off: 0.9-1 s after the switch). An open circuit closes half-open. Runs on the
    /// limiter's runtime, until the limiter is gone.
    async fn watch_sentinels(me: std::sync::Weak<Self>, shard: usize, w: SentinelWatch) {
        use futures_util::StreamExt;
        let mut backoff = BACKOFF_MIN_US * 4;
        for url in w.nodes.iter().cycle() {
            let Some(timeout) = me.upgrade().map(|e| e.timeout) else {
                return;
            };
            let subscribed = async {
                let client = redis::Client::open(url.as_str())?;
                let mut ps = client.get_async_pubsub().await?;
                ps.subscribe("+switch-master").await?;
                redis::RedisResult::Ok(ps)
            };
            if let Ok(Ok(ps)) = tokio::time::timeout(timeout, subscribed).await {
                backoff = BACKOFF_MIN_US * 4;
                let mut messages = ps.into_on_message();
                while let Some(m) = messages.next().await {
                    // "<master name> <old ip> <old port> <new ip> <new port>"
                    let Ok(payload) = m.get_payload::<String>() else {
                        continue;
                    };
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
    fn followed_switch(&self, shard: usize) {
        tracing::info!(shard = %self.shards[shard].name, "shardlimit: sentinel switched the primary");
        if let Some(st) = self.state.load_full() {
            st.conns[shard].conn.store(None);
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

    /// True when shard `shard` takes a new connection and answers PING within the
    /// timeout. (A new connection: the shard's own may be broken, and a server at
    /// `maxclients` still answers on the connections it has.) A Sentinel shard asks the
    /// Sentinels for the primary first and, when it answers, forgets the connection it
    /// had, so the next call goes to the primary found.
    async fn ping_new_connection(self: &Arc<Self>, shard: usize) -> bool {
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let ping = |mut c: redis::aio::MultiplexedConnection| async move {
            redis::cmd("PING").query_async::<String>(&mut c).await
        };
        let work = async {
            match &self.clients[shard] {
                Client::Single(client) => {
                    let c = client
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await?;
                    ping(c).await
                }
                Client::Cluster(client) => {
                    let mut c = client.get_async_connection().await?;
                    redis::cmd("PING").query_async::<String>(&mut c).await
                }
                Client::Sentinel(sentinel) => {
                    let primary = sentinel.lock().await.async_get_client().await?;
                    let c = primary
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await?;
                    ping(c).await
                }
            }
        };
        let ok = matches!(
            tokio::time::timeout(self.timeout, work).await,
            Ok(Ok(pong)) if pong == "PONG"
        );
        if ok && matches!(self.clients[shard], Client::Sentinel(_)) {
            if let Ok(st) = self.state() {
                st.conns[shard].conn.store(None);
            }
        }
        ok
    }

    /// True while shard `shard`'s circuit is open.
    pub fn circuit_open(&self, shard: usize) -> bool {
        self.circuits[shard].open_until.load(Ordering::Acquire) != 0
    }

    fn emit(&self, e: Event) {
        if self.subscribers.active() {
            self.subscribers.emit(&e);
        }
    }

    /// Queues an event for the Redis stream of `shard` (when configured); never waits.
    pub fn stream(self: &Arc<Self>, shard: usize, e: &Event) {
        if self.stream_maxlen.is_none() {
            return;
        }
        let Ok(st) = self.state() else { return };
        if let Some(tx) = &st.stream_tx {
            if tx.try_send((shard, e.fields())).is_err() {
                self.events_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    async fn stream_writer(
        self: Arc<Self>,
        mut rx: tokio::sync::mpsc::Receiver<StreamItem>,
        maxlen: u64,
    ) {
        let key = events_key(&self.prefix);
        while let Some((shard, fields)) = rx.recv().await {
            if self.circuit_open(shard) {
                self.events_dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let Ok(st) = self.state() else { return };
            let key = key.clone();
            let r = self
                .raw(&st, shard, |mut conn| async move {
                    let mut cmd = redis::cmd("XADD");
                    cmd.arg(&key).arg("MAXLEN").arg("~").arg(maxlen).arg("*");
                    for (k, v) in fields {
                        cmd.arg(k).arg(v);
                    }
                    cmd.query_async::<String>(&mut conn).await?;
                    // trimmed by length above, and gone a while after the last event, so a
                    // stream that is turned off does not stay forever
                    redis::cmd("PEXPIRE")
                        .arg(&key)
                        .arg(EVENTS_STREAM_TTL_MS)
                        .query_async::<i64>(&mut conn)
                        .await
                        .map(|_| String::new())
                })
                .await;
            if r.is_err() {
                self.events_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The script call of one check: `EVALSHA <sha1> ...`, or with `eval` the whole
    /// source (`EVAL <script> ...`, after a NOSCRIPT reply).
    #[allow(clippy::too_many_arguments)]
    fn check_cmd(
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
    fn check_reply(&self, shard: usize, r: &[i64], limit: u64, cost: u64) -> Result<Raw> {
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

    /// Runs one check script.
    #[allow(clippy::too_many_arguments)]
    pub async fn check(
        self: &Arc<Self>,
        shard: usize,
        policy: &PolicyInner,
        eff: &Compiled,
        key: &str,
        now_us: Option<u64>,
        cost: u64,
        mode: Mode,
        lease_id: &str,
    ) -> Result<Raw> {
        let tag = next_tag();
        let cmd = self.check_cmd(false, policy, eff, key, now_us, cost, mode, lease_id, tag);
        if self.targets[shard].is_some() {
            // the hot path: the pipelined connection, which sends a burst's checks together
            // (and takes a reply only if it carries the call's tag)
            let scripts = scripts::check_scripts(eff.algorithm);
            let call = |eval| CheckCall::from_cmd(scripts, eval, &cmd, tag);
            // one deadline for the call, retry included
            let deadline = Instant::now() + self.timeout;
            let mut reply = Box::pin(self.request_pipelined(shard, call(false), deadline)).await?;
            if reply.is_noscript() {
                // the server lost its scripts (restart, SCRIPT FLUSH): EVAL loads it again
                reply = Box::pin(self.request_pipelined(shard, call(true), deadline)).await?;
            }
            return self.script_reply(shard, reply, eff.limit, cost);
        }
        let at = self
            .cluster_nodes
            .as_ref()
            .map(|_| state_key(&self.prefix, &policy.key_scope, key));
        let r: Vec<i64> = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                match cmd.query_async(&mut conn).await {
                    Err(e)
                        if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        // the server lost its scripts (restart, SCRIPT FLUSH): EVAL loads it again
                        self.check_cmd(true, policy, eff, key, now_us, cost, mode, lease_id, tag)
                            .query_async(&mut conn)
                            .await
                    }
                    r => r,
                }
            })
            .await?;
        // the rule of `untag` for a reply of integers: the last one is the call's tag
        let mut r = r;
        match r.last() {
            Some(&t) if t >= 0 && t as u64 == tag => {
                r.pop();
            }
            Some(_) => return Err(self.not_theirs(shard)),
            None => {}
        }
        self.check_reply(shard, &r, eff.limit, cost)
    }

    /// The error of a reply that carries another call's tag.
    fn not_theirs(&self, shard: usize) -> Error {
        Error::Connection {
            shard: self.shards[shard].name.clone(),
            message: crate::pipe::NOT_THEIRS.into(),
        }
    }

    /// [`RedisEngine::check`] on the calling thread, over a blocking connection (see
    /// [`RedisEngine::request_blocking`]).
    #[allow(clippy::too_many_arguments)]
    pub fn check_blocking(
        self: &Arc<Self>,
        shard: usize,
        policy: &PolicyInner,
        eff: &Compiled,
        key: &str,
        now_us: Option<u64>,
        cost: u64,
        mode: Mode,
        lease_id: &str,
    ) -> Result<Raw> {
        let tag = next_tag();
        let cmd = self.check_cmd(false, policy, eff, key, now_us, cost, mode, lease_id, tag);
        // one deadline for the call, retry included
        let deadline = Instant::now() + self.timeout;
        let mut reply = self.request_blocking(shard, &cmd.get_packed_command(), deadline, tag)?;
        if reply.is_noscript() {
            // the server lost its scripts (restart, SCRIPT FLUSH): EVAL loads it again
            let cmd = self.check_cmd(true, policy, eff, key, now_us, cost, mode, lease_id, tag);
            reply = self.request_blocking(shard, &cmd.get_packed_command(), deadline, tag)?;
        }
        self.script_reply(shard, reply, eff.limit, cost)
    }

    /// The [`Raw`] outcome of a check script's reply.
    fn script_reply(&self, shard: usize, reply: Reply, limit: u64, cost: u64) -> Result<Raw> {
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

    /// A layered check of layers that all live on shard `shard`, atomic in one script call.
    pub async fn check_layers(
        self: &Arc<Self>,
        shard: usize,
        layers: &[(LayerReq<'_>, &str)],
        now_us: Option<u64>,
    ) -> Result<LayeredRaw> {
        let mut inv = scripts::layered().prepare_invoke();
        inv.arg(now_us.unwrap_or(0)).arg(layers.len());
        for (l, key_scope) in layers {
            let (after, within, dur) = auto_block_args(l.auto_block.as_ref());
            inv.key(state_key(&self.prefix, key_scope, l.key))
                .key(block_key(&self.prefix, l.key))
                .key(denial_key(&self.prefix, key_scope, l.key))
                .arg(l.compiled.algorithm.code())
                .arg(l.compiled.limit)
                .arg(l.compiled.period_us)
                .arg(l.cost)
                .arg(l.lease)
                .arg(after)
                .arg(within)
                .arg(dur)
                .arg(if after > 0 {
                    format!("auto: policy {}", l.scope)
                } else {
                    String::new()
                });
        }
        let at = self.layers_at(layers);
        let r: Vec<i64> = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                inv.invoke_async(&mut conn).await
            })
            .await?;
        let sc = &self.shards[shard];
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
        Ok(LayeredRaw {
            now: r[0] as u64,
            deciding: r[1] as usize,
            blocked: block_verdict(sc, &r, r[2])?,
            outcomes,
        })
    }

    /// Gives back what a layered check admitted on `shard` at `now`.
    pub async fn refund(
        self: &Arc<Self>,
        shard: usize,
        layers: &[(LayerReq<'_>, &str)],
        now: u64,
    ) -> Result<()> {
        let mut inv = scripts::refund().prepare_invoke();
        inv.arg(now).arg(layers.len());
        for (l, key_scope) in layers {
            inv.key(state_key(&self.prefix, key_scope, l.key))
                .arg(l.compiled.algorithm.code())
                .arg(l.compiled.period_us)
                .arg(l.cost)
                .arg(l.lease);
        }
        let at = self.layers_at(layers);
        let _: i64 = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                inv.invoke_async(&mut conn).await
            })
            .await?;
        Ok(())
    }

    /// Releases `units` of concurrency lease `lease_id`; true when it was held.
    pub async fn release(
        self: &Arc<Self>,
        policy: &PolicyInner,
        key: &str,
        shard: usize,
        lease_id: &str,
        units: u64,
        now_us: Option<u64>,
    ) -> Result<bool> {
        let rkey = state_key(&self.prefix, &policy.key_scope, key);
        let at = self.at(&rkey);
        let removed: i64 = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                scripts::release()
                    .key(rkey)
                    .arg(lease_id)
                    .arg(units)
                    .arg(now_us.unwrap_or(0))
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(removed == 1)
    }

    /// Deletes `key`'s state for `policy`.
    pub async fn reset(
        self: &Arc<Self>,
        policy: &PolicyInner,
        key: &str,
        shard: usize,
        now_us: Option<u64>,
    ) -> Result<()> {
        let c = &policy.compiled;
        let rkey = state_key(&self.prefix, &policy.key_scope, key);
        let window = if c.algorithm.is_windowed() {
            c.period_us
        } else {
            0
        };
        let at = self.at(&rkey);
        let _: i64 = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                scripts::reset()
                    .key(rkey)
                    .arg(now_us.unwrap_or(0))
                    .arg(window)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(())
    }

    /// Reads `key`'s state for `policy` (and its block entry) on `shard`, for a handoff:
    /// (name, pttl in ms or 0, DUMP payload) per existing key.
    pub async fn dump_state(
        self: &Arc<Self>,
        shard: usize,
        policy: &PolicyInner,
        key: &str,
        now_us: Option<u64>,
    ) -> Result<Vec<(String, i64, Vec<u8>)>> {
        let c = &policy.compiled;
        let window = if c.algorithm.is_windowed() {
            c.period_us
        } else {
            0
        };
        let (skey, bkey) = (
            state_key(&self.prefix, &policy.key_scope, key),
            block_key(&self.prefix, key),
        );
        let v: Vec<redis::Value> = self
            .with_conn(shard, |mut conn| async move {
                scripts::migrate_dump()
                    .key(skey)
                    .key(bkey)
                    .arg(now_us.unwrap_or(0))
                    .arg(window)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        let mut out = Vec::new();
        for t in v.chunks(3) {
            if let [redis::Value::BulkString(name), redis::Value::Int(ttl), redis::Value::BulkString(payload)] =
                t
            {
                out.push((
                    String::from_utf8_lossy(name).into_owned(),
                    *ttl,
                    payload.clone(),
                ));
            }
        }
        Ok(out)
    }

    /// Writes state read by [`RedisEngine::dump_state`] on `shard` where it has none yet.
    pub async fn restore_state(
        self: &Arc<Self>,
        shard: usize,
        items: Vec<(String, i64, Vec<u8>)>,
    ) -> Result<u64> {
        if items.is_empty() {
            return Ok(0);
        }
        let mut inv = scripts::migrate_restore().prepare_invoke();
        for (name, ttl, payload) in items {
            inv.key(name).arg(ttl).arg(payload);
        }
        let n: i64 = self
            .with_conn(shard, |mut conn| async move {
                inv.invoke_async(&mut conn).await
            })
            .await?;
        Ok(n.max(0) as u64)
    }

    /// Puts `key` on the block list of its shard (`ttl` None = permanent).
    pub async fn block(
        self: &Arc<Self>,
        shard: usize,
        key: &str,
        ttl: Option<Duration>,
        reason: &str,
    ) -> Result<()> {
        let bkey = block_key(&self.prefix, key);
        let at = self.at(&bkey);
        let reason = reason.to_string();
        self.with_conn_at(shard, at.as_deref(), |mut conn| async move {
            let mut cmd = redis::cmd("SET");
            cmd.arg(bkey).arg(reason);
            if let Some(t) = ttl {
                cmd.arg("PX").arg(t.as_millis().max(1) as u64);
            }
            cmd.query_async::<()>(&mut conn).await
        })
        .await
    }

    pub async fn unblock(self: &Arc<Self>, shard: usize, key: &str) -> Result<bool> {
        let bkey = block_key(&self.prefix, key);
        let at = self.at(&bkey);
        let n: i64 = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                redis::cmd("DEL").arg(bkey).query_async(&mut conn).await
            })
            .await?;
        Ok(n > 0)
    }

    /// (reason, remaining time or None when permanent) when `key` is blocked.
    pub async fn blocked(
        self: &Arc<Self>,
        shard: usize,
        key: &str,
    ) -> Result<Option<(String, Option<Duration>)>> {
        let bkey = block_key(&self.prefix, key);
        let at = self.at(&bkey);
        let (reason, ttl): (Option<String>, i64) = self
            .with_conn_at(shard, at.as_deref(), |mut conn| async move {
                redis::pipe()
                    .cmd("GET")
                    .arg(&bkey)
                    .cmd("PTTL")
                    .arg(&bkey)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(match (reason, ttl) {
            (Some(r), -1) => Some((r, None)),
            (Some(r), t) if t >= 0 => Some((r, Some(Duration::from_millis(t as u64)))),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tls_tests {
    use super::*;

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
