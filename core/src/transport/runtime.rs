//! The I/O runtime a limiter owns: one thread (or workers), the inbox of handed-over
//! calls, the spinning that keeps it awake during bursts, and fork detection.

use crate::time::clock::{Clock, MonotonicClock};
use parking_lot::Mutex;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::{Handle, Runtime};

/// The I/O runtime of one process (the engine keeps its connections beside it).
pub(crate) struct IoRuntime {
    pub(crate) pid: u32,
    /// [`fork_generation`] when this runtime was made.
    pub(crate) generation: u64,
    pub(crate) handle: Handle,
    pub(crate) owner: Owner,
    /// Futures handed over from other threads, not started yet (see [`IoRuntime::submit`]).
    pub(crate) inbox: Arc<Inbox>,
    pub(crate) timer_keeper: Arc<TimerKeeper>,
    pub(crate) io_spin: Arc<IoSpin>,
}

/// See [`IoRuntime::spin`].
#[derive(Default)]
pub(crate) struct IoSpin {
    /// pipelined checks started and not finished
    pub(crate) in_flight: AtomicUsize,
    pub(crate) spinning: AtomicBool,
    /// `mono_us()` when the last check finished
    pub(crate) last_done: AtomicU64,
    /// how long the thread typically went without checks before one came (µs, a moving
    /// average over the checks that started with none in flight, each gap capped at
    /// twice `spin_wait`)
    pub(crate) idle_gap: AtomicU64,
}

/// Futures handed over to the I/O runtime from other threads ([`IoRuntime::submit`]).
///
/// Waking the runtime's thread is a write to an eventfd that costs the caller 20-30 µs on
/// a VM (the wake-up's interrupt), paid on the event loop's thread for every burst. So
/// the caller wakes it only when it is parked: a current-thread runtime marks itself
/// parked in its `on_thread_park` hook, which then starts what the inbox holds, and the
/// spinning task of [`IoRuntime::spin`] starts it too. (The multi-thread runtime is always
/// woken.)
pub(crate) struct Inbox {
    pub(crate) jobs: Mutex<Vec<Job>>,
    /// `jobs` is not empty (read without the lock)
    pub(crate) pending: AtomicBool,
    /// the runtime's thread is parked, or about to look at the inbox before parking
    pub(crate) parked: AtomicBool,
    /// false: park is not tracked (multi-thread runtime); always wake
    pub(crate) tracked: bool,
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
    /// [`IoRuntime::submit`]: the caller stores `pending` then loads `parked`, this stores
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
pub(crate) const OS_YIELD_EVERY_US: u64 = 10;

/// One pipelined check in flight, for [`IoRuntime::spin`]; counted out on drop (also when the
/// caller gives up).
pub(crate) struct InFlight(Arc<IoSpin>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.last_done.store(mono_us(), Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// See [`IoRuntime::keep_timers`].
#[derive(Default)]
pub(crate) struct TimerKeeper {
    pub(crate) running: AtomicBool,
    /// a call came in since the keeper's last tick
    pub(crate) busy: AtomicBool,
}

/// Who runs the I/O runtime.
pub(crate) enum Owner {
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

impl IoRuntime {
    /// Keeps one timer pending on the I/O runtime while calls keep coming, so that a call's
    /// deadline never is the runtime's earliest timer. Tokio wakes its driver (a write to
    /// an eventfd, and one more wake-up later) whenever a new timer is due before every
    /// pending one, which with no other timer pending was the first deadline of every
    /// burst: 0.38 wake-ups per check in the Node benchmark. The keeper ticks at half the
    /// timeout, at most once a second, and stops after a tick with no call, so an idle
    /// limiter does not wake at all.
    pub(crate) fn keep_timers(&self, timeout: Duration) {
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
    pub(crate) fn spin(&self, spin_wait: Duration) -> InFlight {
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
        let Some(slot) = crate::transport::blocking::SPINNING.take() else {
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

impl Drop for IoRuntime {
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
pub(crate) fn is_current(t: &std::thread::JoinHandle<()>) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::thread::JoinHandleExt;
        // (std's RawPthread is an integer; libc's pthread_t is a pointer on musl: the cast
        // is the identity on glibc, and lets the static musl build of `make dist` compile)
        #[allow(clippy::unnecessary_cast)]
        let own = t.as_pthread_t() as libc::pthread_t;
        // SAFETY: pthread_self has no preconditions
        unsafe { libc::pthread_equal(own, libc::pthread_self()) != 0 }
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
pub(crate) fn start_runtime(worker_threads: usize) -> std::io::Result<(Handle, Owner, Arc<Inbox>)> {
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

/// Forks this process has seen: bumped in the child of every `fork()` by a `pthread_atfork`
/// handler. Checking it costs an atomic load per call, where comparing process ids would
/// cost a `getpid` system call.
pub(crate) static FORKS: AtomicU64 = AtomicU64::new(0);

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
            crate::transport::blocking::forget_places_in_child();
        }
        HOOK.call_once(|| {
            // SAFETY: registers a handler that only touches an atomic (async-signal-safe).
            unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        });
    }
    FORKS.load(Ordering::Acquire)
}

pub(crate) fn mono_us() -> u64 {
    MonotonicClock.now_us()
}
