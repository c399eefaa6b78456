//! The Redis engine: one multiplexed, auto-reconnecting connection per shard, owned by a
//! Tokio runtime that belongs to the limiter. Runtime and connections are created lazily and
//! re-created in a forked child (the pid is checked on every call), because prefork servers
//! (gunicorn) and Go programs host this library. Each shard has a circuit breaker: after
//! repeated failures it is skipped (no connect attempts, no waiting) and probed in the
//! background until it answers again.

use crate::algo::Outcome;
use crate::blocking::{BlockingConn, Reply, Target};
use crate::clock::{Clock, MonotonicClock};
use crate::config::ShardConfig;
use crate::error::{Error, Result};
use crate::events::{CircuitState, Event, Subscribers};
use crate::keys::{block_key, denial_key, events_key, state_key};
use crate::limit::{AutoBlock, Compiled, PolicyInner};
use crate::memory::{LayerReq, LayeredRaw, Raw};
use crate::metrics::Latency;
use crate::pipe::{CheckCall, Pipe};
use crate::scripts;
use arc_swap::ArcSwapOption;
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
/// First and longest back-off between probes of an open circuit.
const BACKOFF_MIN_US: u64 = 200_000;
const BACKOFF_MAX_US: u64 = 5_000_000;
/// Idle blocking connections kept per shard: one per thread that waits on the shard at
/// the same moment, as a connection pool of a synchronous client would.
const BLOCKING_IDLE_MAX: usize = 64;
/// Events queued for the Redis stream writer before new ones are dropped.
const STREAM_QUEUE: usize = 4096;

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
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
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
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
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
    /// Monotonic µs until which the shard is skipped; 0 = closed.
    open_until: AtomicU64,
    backoff_us: AtomicU64,
    probing: AtomicBool,
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

fn outcome(r: &[i64], shard: &ShardConfig) -> Result<Outcome> {
    if r.len() < 5 || r[0] < 0 || r[1] < 0 || r[2] < 0 || r[4] < 0 {
        return Err(Error::Script {
            shard: shard.name.clone(),
            message: format!("unexpected script reply {r:?}"),
        });
    }
    Ok(Outcome {
        allowed: r[0] == 1,
        remaining: r[1] as u64,
        reset_us: r[2] as u64,
        retry_us: (r[3] >= 0).then_some(r[3] as u64),
        delay_us: r[4] as u64,
    })
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
        let clients = shards
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let field = format!("shards[{i}].url");
                if s.url.starts_with("redis+sentinel://") {
                    let su = crate::config::parse_sentinel_url(&field, &s.url)?;
                    let nodes: Vec<&str> = su.nodes.iter().map(String::as_str).collect();
                    // how to log in to the primary the Sentinels name
                    let mut login = redis::RedisConnectionInfo::default().set_db(su.db);
                    if let Some(u) = &su.username {
                        login = login.set_username(u);
                    }
                    if let Some(p) = &su.password {
                        login = login.set_password(p);
                    }
                    let info = redis::sentinel::SentinelNodeConnectionInfo::default()
                        .set_redis_connection_info(login);
                    let client = SentinelClient::build(
                        nodes,
                        su.master,
                        Some(info),
                        SentinelServerType::Master,
                    )
                    .map_err(|e| {
                        Error::config(
                            &field,
                            format!(
                                "invalid sentinel configuration: {}",
                                crate::config::scrub(&e.to_string(), &s.url)
                            ),
                        )
                    })?;
                    return Ok(Client::Sentinel(Box::new(tokio::sync::Mutex::new(client))));
                }
                redis::Client::open(s.url.as_str())
                    .map(|c| Client::Single(Box::new(c)))
                    .map_err(|e| {
                        let e = crate::config::scrub(&e.to_string(), &s.url);
                        Error::config(field, format!("invalid Redis URL: {e}"))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        RedisEngine::build(shards, clients, prefix, timeout, subscribers, stream_maxlen)
    }

    /// One logical shard that is a whole Redis Cluster, from its seed nodes.
    pub fn cluster(
        nodes: Vec<String>,
        prefix: String,
        timeout: Duration,
        subscribers: Arc<Subscribers>,
        stream_maxlen: Option<u64>,
    ) -> Result<RedisEngine> {
        let client = ClusterClient::builder(nodes.iter().map(String::as_str))
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(2)
            .min_retry_wait(10)
            .max_retry_wait(200)
            .build()
            .map_err(|e| {
                let e = nodes
                    .iter()
                    .fold(e.to_string(), |e, n| crate::config::scrub(&e, n));
                Error::config("cluster.nodes", format!("invalid cluster: {e}"))
            })?;
        let shard = ShardConfig {
            name: "cluster".to_string(),
            url: nodes.join(","),
        };
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
        Ok(RedisEngine {
            targets,
            spin_wait_us: AtomicU64::new(crate::config::DEFAULT_SPIN_WAIT.as_micros() as u64),
            circuits: shards.iter().map(|_| Circuit::default()).collect(),
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
        }
        let (handle, owner, inbox) = start_runtime(self.worker_threads)
            .map_err(|e| Error::Internal(format!("cannot start the I/O runtime: {e}")))?;
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
        let map = |e| map_redis_error(&self.shards[shard], self.timeout, e);
        let manager = |client: redis::Client| {
            let cfg = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(10))
                .set_max_delay(Duration::from_millis(500));
            ConnectionManager::new_with_config(client, cfg)
        };
        let join = |e: tokio::task::JoinError| Error::Internal(format!("connect task failed: {e}"));
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
                let primary = sentinel
                    .lock()
                    .await
                    .async_get_client()
                    .await
                    .map_err(map)?;
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
        Ok(conn)
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
        let work = async {
            let conn = self.connection(st, shard).await?;
            f(conn)
                .await
                .map_err(|e| map_redis_error(&self.shards[shard], self.timeout, e))
        };
        match tokio::time::timeout(self.timeout, work).await {
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
        let st = self.state()?;
        self.gate(&st, shard)?;
        let start = Instant::now();
        // boxed: keeps the futures of callers shallow (deeply nested async fns overflow
        // the compiler's layout query depth in downstream crates)
        let r = Box::pin(self.raw(&st, shard, f)).await;
        self.account(shard, start, &r);
        if matches!(&r, Err(e) if e.is_backend()) {
            self.forget_connection(&st, shard);
        }
        r
    }

    /// Records a call to shard `shard` that started at `start`: its latency, and for its
    /// circuit a success (which ends a run of failures) or a backend failure.
    fn account<T>(&self, shard: usize, start: Instant, r: &Result<T>) {
        self.latency.record(start.elapsed().as_micros() as u64);
        match r {
            Ok(_) => {
                let c = &self.circuits[shard];
                if c.failures.load(Ordering::Relaxed) != 0 {
                    c.failures.store(0, Ordering::Relaxed);
                }
            }
            Err(e) if e.is_backend() => self.failed(shard, e),
            Err(_) => {}
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
    /// is dropped, never reused; one that got an error reply is fine. `deadline` is the
    /// call's (a NOSCRIPT retry shares it with the try before).
    pub fn request_blocking(
        self: &Arc<Self>,
        shard: usize,
        packed: &[u8],
        deadline: Instant,
    ) -> Result<Reply> {
        let Some(target) = &self.targets[shard] else {
            return Err(Error::Internal(format!(
                "shard {} has no blocking connections (Cluster, Sentinel or TLS)",
                self.shards[shard].name
            )));
        };
        let st = self.state()?;
        self.gate(&st, shard)?;
        let start = Instant::now();
        let left = deadline.saturating_duration_since(start);
        if left.is_zero() {
            let r = Err(self.timeout_error(shard));
            self.account(shard, start, &r);
            return r;
        }
        let pooled = st.blocking[shard].lock().pop();
        let r = match pooled {
            Some(c) => Ok(c),
            None => BlockingConn::connect(target, left),
        }
        .and_then(|mut c| {
            let reply = c.request(packed, deadline, self.spin_wait())?;
            Ok((reply, c))
        });
        let r = r
            .map(|(reply, conn)| {
                let mut idle = st.blocking[shard].lock();
                if idle.len() < BLOCKING_IDLE_MAX {
                    idle.push(conn);
                }
                reply
            })
            .map_err(|e| self.io_error(shard, e));
        self.account(shard, start, &r);
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
    async fn pipe(&self, st: &RtState, shard: usize, target: &Target) -> Result<Arc<Pipe>> {
        let slot = &st.pipes[shard];
        if let Some(p) = slot.pipe.load_full().filter(|p| !p.is_broken()) {
            return Ok(p);
        }
        let _one_at_a_time = slot.connecting.lock().await;
        if let Some(p) = slot.pipe.load_full().filter(|p| !p.is_broken()) {
            return Ok(p);
        }
        let (target, timeout) = (target.clone(), self.timeout);
        let pipe = st
            .runtime()
            .spawn(async move { Pipe::connect(&target, timeout).await })
            .await
            .map_err(|e| Error::Internal(format!("connect task failed: {e}")))?
            .map_err(|e| self.io_error(shard, e))?;
        let pipe = Arc::new(pipe);
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
        self.gate(&st, shard)?;
        st.keep_timers(self.timeout);
        let _in_flight = st.spin(self.spin_wait());
        let start = Instant::now();
        let work = async {
            let pipe = self.pipe(&st, shard, target).await?;
            pipe.request(call)
                .await
                .map_err(|e| self.io_error(shard, e))
        };
        let r = tokio::time::timeout_at(deadline.into(), work)
            .await
            .unwrap_or_else(|_| Err(self.timeout_error(shard)));
        self.account(shard, start, &r);
        r
    }

    fn gate(self: &Arc<Self>, st: &RtState, shard: usize) -> Result<()> {
        let c = &self.circuits[shard];
        let until = c.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Ok(());
        }
        let now = mono_us();
        if now >= until && !c.probing.swap(true, Ordering::AcqRel) {
            let me = Arc::clone(self);
            st.runtime().spawn(async move { me.probe(shard).await });
        }
        Err(Error::Unavailable {
            shard: self.shards[shard].name.clone(),
        })
    }

    fn failed(&self, shard: usize, e: &Error) {
        let c = &self.circuits[shard];
        let n = c.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= FAILURES_TO_OPEN
            && c.open_until
                .compare_exchange(
                    0,
                    mono_us() + BACKOFF_MIN_US,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            c.backoff_us.store(BACKOFF_MIN_US, Ordering::Relaxed);
            tracing::warn!(shard = %self.shards[shard].name, error = %e, "shardlimit: circuit opened after {n} consecutive failures");
            self.emit(Event::Circuit {
                shard: self.shards[shard].name.clone(),
                state: CircuitState::Open,
            });
        }
    }

    /// One background PING of an open shard: closes the circuit when it answers, or backs
    /// off further.
    async fn probe(self: Arc<Self>, shard: usize) {
        let Ok(st) = self.state() else { return };
        let ok = self
            .raw(&st, shard, |mut conn| async move {
                redis::cmd("PING").query_async::<String>(&mut conn).await
            })
            .await
            .is_ok();
        let c = &self.circuits[shard];
        if ok {
            c.failures.store(0, Ordering::Relaxed);
            c.open_until.store(0, Ordering::Release);
            tracing::info!(shard = %self.shards[shard].name, "shardlimit: shard answers again, circuit closed");
            self.emit(Event::Circuit {
                shard: self.shards[shard].name.clone(),
                state: CircuitState::Closed,
            });
        } else {
            let backoff =
                (c.backoff_us.load(Ordering::Relaxed) * 2).clamp(BACKOFF_MIN_US, BACKOFF_MAX_US);
            c.backoff_us.store(backoff, Ordering::Relaxed);
            c.open_until.store(mono_us() + backoff, Ordering::Release);
            tracing::debug!(shard = %self.shards[shard].name, backoff_ms = backoff / 1000, "shardlimit: probe failed");
        }
        c.probing.store(false, Ordering::Release);
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
                    cmd.query_async::<String>(&mut conn).await
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
        // the order of lua/main_check.lua: keys, the check's own arguments (CHECK_ITEM_ARGS),
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
        cmd
    }

    fn check_reply(&self, shard: usize, r: &[i64]) -> Result<Raw> {
        let o = outcome(r, &self.shards[shard])?;
        Ok(Raw {
            outcome: o,
            blocked: r.get(5).copied().unwrap_or(0).clamp(0, 2) as u8,
            granted: r.get(6).copied().unwrap_or(0).max(0) as u64,
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
        let cmd = self.check_cmd(false, policy, eff, key, now_us, cost, mode, lease_id);
        if self.targets[shard].is_some() {
            // the hot path: the pipelined connection, which sends a burst's checks together
            let scripts = scripts::check_scripts(eff.algorithm);
            let call = |eval| CheckCall::from_cmd(scripts, eval, &cmd);
            // one deadline for the call, retry included
            let deadline = Instant::now() + self.timeout;
            let mut reply = Box::pin(self.request_pipelined(shard, call(false), deadline)).await?;
            if reply.is_noscript() {
                // the server lost its scripts (restart, SCRIPT FLUSH): EVAL loads it again
                reply = Box::pin(self.request_pipelined(shard, call(true), deadline)).await?;
            }
            return self.script_reply(shard, reply);
        }
        let r: Vec<i64> = self
            .with_conn(shard, |mut conn| async move {
                match cmd.query_async(&mut conn).await {
                    Err(e)
                        if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        // the server lost its scripts (restart, SCRIPT FLUSH): EVAL loads it again
                        self.check_cmd(true, policy, eff, key, now_us, cost, mode, lease_id)
                            .query_async(&mut conn)
                            .await
                    }
                    r => r,
                }
            })
            .await?;
        self.check_reply(shard, &r)
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
        let cmd = self.check_cmd(false, policy, eff, key, now_us, cost, mode, lease_id);
        // one deadline for the call, retry included
        let deadline = Instant::now() + self.timeout;
        let mut reply = self.request_blocking(shard, &cmd.get_packed_command(), deadline)?;
        if reply.is_noscript() {
            // the server lost its scripts (restart, SCRIPT FLUSH): EVAL loads it again
            let cmd = self.check_cmd(true, policy, eff, key, now_us, cost, mode, lease_id);
            reply = self.request_blocking(shard, &cmd.get_packed_command(), deadline)?;
        }
        self.script_reply(shard, reply)
    }

    /// The [`Raw`] outcome of a check script's reply.
    fn script_reply(&self, shard: usize, reply: Reply) -> Result<Raw> {
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
        self.check_reply(shard, &r)
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
        let r: Vec<i64> = self
            .with_conn(shard, |mut conn| async move {
                inv.invoke_async(&mut conn).await
            })
            .await?;
        if r.len() != 3 + 5 * layers.len() {
            return Err(Error::Script {
                shard: self.shards[shard].name.clone(),
                message: format!("unexpected layered reply {r:?}"),
            });
        }
        let outcomes = (0..layers.len())
            .map(|i| outcome(&r[3 + 5 * i..8 + 5 * i], &self.shards[shard]))
            .collect::<Result<Vec<_>>>()?;
        Ok(LayeredRaw {
            now: r[0].max(0) as u64,
            deciding: r[1].max(0) as usize,
            blocked: r[2].clamp(0, 2) as u8,
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
        let _: i64 = self
            .with_conn(shard, |mut conn| async move {
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
    ) -> Result<bool> {
        let rkey = state_key(&self.prefix, &policy.key_scope, key);
        let members: Vec<String> = (1..=units).map(|i| format!("{lease_id}:{i}")).collect();
        let removed: i64 = self
            .with_conn(shard, |mut conn| async move {
                redis::cmd("ZREM")
                    .arg(rkey)
                    .arg(members)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(removed > 0)
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
        let _: i64 = self
            .with_conn(shard, |mut conn| async move {
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
        let reason = reason.to_string();
        self.with_conn(shard, |mut conn| async move {
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
        let n: i64 = self
            .with_conn(shard, |mut conn| async move {
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
        let (reason, ttl): (Option<String>, i64) = self
            .with_conn(shard, |mut conn| async move {
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
