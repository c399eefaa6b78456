//! Blocking connections, for callers that wait on their own thread: the `*_blocking` API,
//! and through it Python's sync calls, C, C++ and Go.
//!
//! A blocking caller has nothing else to do until Redis answers, so it writes the command
//! and reads the reply itself: no hand-off to the I/O runtime and back (two thread wake-ups
//! per call). It may also spin briefly on the socket before sleeping in `read`: a loopback
//! round trip takes tens of microseconds, and on virtual machines waking a sleeping thread
//! can cost as much again. Spinning is bounded in time (`spin_wait` in the config, default
//! 100 µs) and in the number of threads spinning at once (half the CPUs, at least one);
//! other callers sleep in `read` straight away.
//!
//! The protocol is RESP2 over TCP or a Unix socket, with AUTH and SELECT from the shard's
//! URL, framed and parsed under the limits of [`crate::transport::resp`]; anything else is an error
//! that drops the connection. So is every doubt about the reply stream: a timeout, bytes
//! after a reply, or bytes (or EOF) that arrived while the connection sat idle in the pool
//! (those are found before a command is written, and that connection is replaced, so a
//! call never reads an answer meant for nobody). TLS shards use the I/O runtime (the pipe,
//! over a tokio-rustls stream).

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

pub(crate) use crate::transport::cpus::Spin;
#[cfg(unix)]
use crate::transport::cpus::YIELD_RAN_OTHERS;
use crate::transport::expect_ok;
use crate::transport::resp::{parse_frame, protocol, Framer, Reply, MAX_REPLY};
use crate::transport::sansio::{silent, PROGRESS_BYTES};

/// Where a shard listens, how to log in, and over TLS how to speak it.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    endpoint: Endpoint,
    db: i64,
    username: Option<String>,
    password: Option<String>,
    /// `rediss://`: the pipe speaks TLS over the TCP connection (blocking connections
    /// do not: a TLS shard's blocking callers go through the I/O runtime)
    #[cfg(feature = "tls")]
    tls: Option<crate::tls::TlsConnect>,
}

#[derive(Debug, Clone)]
enum Endpoint {
    Tcp(String, u16),
    #[cfg(unix)]
    Unix(std::path::PathBuf),
}

impl Target {
    /// The target of a client (a standalone shard); `tls`: the shard's TLS settings, for a
    /// `rediss://` URL. `Ok(None)` for an address the core does not connect to itself;
    /// `Err` says what is wrong with the TLS settings.
    pub fn of(
        client: &redis::Client,
        #[allow(unused_variables)] tls: Option<&crate::TlsConfig>,
    ) -> Result<Option<Target>, String> {
        let info = client.get_connection_info();
        #[cfg(feature = "tls")]
        let mut secure = None;
        let endpoint = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => Endpoint::Tcp(host.clone(), *port),
            #[cfg(feature = "tls")]
            redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => {
                secure = Some(crate::tls::TlsConnect::new(host, tls, *insecure)?);
                Endpoint::Tcp(host.clone(), *port)
            }
            #[cfg(unix)]
            redis::ConnectionAddr::Unix(path) => Endpoint::Unix(path.clone()),
            _ => return Ok(None),
        };
        let settings = info.redis_settings();
        Ok(Some(Target {
            endpoint,
            db: settings.db(),
            username: settings.username().map(str::to_string),
            password: settings.password().map(str::to_string),
            #[cfg(feature = "tls")]
            tls: secure,
        }))
    }

    /// True for a `rediss://` shard: only the pipe connects to it (over TLS).
    pub fn is_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// How to speak TLS to the shard, for a `rediss://` one.
    #[cfg(feature = "tls")]
    pub fn tls(&self) -> Option<&crate::tls::TlsConnect> {
        self.tls.as_ref()
    }

    /// The database the connection selects.
    pub fn db(&self) -> i64 {
        self.db
    }

    /// Host and port of a TCP target.
    pub fn tcp(&self) -> Option<(&str, u16)> {
        match &self.endpoint {
            Endpoint::Tcp(host, port) => Some((host.as_str(), *port)),
            #[cfg(unix)]
            Endpoint::Unix(_) => None,
        }
    }

    /// The socket path of a Unix-socket target.
    #[cfg(unix)]
    pub fn unix(&self) -> Option<&std::path::Path> {
        match &self.endpoint {
            Endpoint::Unix(p) => Some(p),
            Endpoint::Tcp(..) => None,
        }
    }

    /// The commands a new connection sends first, each answered by +OK: AUTH when the URL
    /// has a password, SELECT when it names a database other than 0.
    pub fn handshake(&self) -> Vec<(&'static str, Vec<u8>)> {
        let mut out = Vec::new();
        if let Some(password) = &self.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &self.username {
                auth.arg(user);
            }
            auth.arg(password);
            out.push(("AUTH", auth.get_packed_command()));
        }
        if self.db != 0 {
            out.push((
                "SELECT",
                redis::cmd("SELECT").arg(self.db).get_packed_command(),
            ));
        }
        out
    }
}

enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixStream),
}

impl Stream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(t)?;
        match self {
            Stream::Tcp(s) => s.set_write_timeout(Some(t)),
            #[cfg(unix)]
            Stream::Unix(s) => s.set_write_timeout(Some(t)),
        }
    }

    fn set_read_timeout(&self, t: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(Some(t)),
            #[cfg(unix)]
            Stream::Unix(s) => s.set_read_timeout(Some(t)),
        }
    }

    #[cfg(unix)]
    fn fd(&self) -> std::os::unix::io::RawFd {
        use std::os::unix::io::AsRawFd;
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }

    /// Reads what is there without waiting: `Ok(None)` when nothing is.
    #[cfg(unix)]
    fn read_now(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: `buf` is valid for writes of its length; the fd is open while self lives.
        let n = unsafe {
            libc::recv(
                self.fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A number of places shared by the threads of the process: taken while a thread does
/// something only so many should do at once, given back when its [`Place`] drops.
pub(crate) struct Places {
    taken: AtomicUsize,
    max: LazyLock<usize>,
}

/// A place taken from [`Places`], given back on drop.
pub(crate) struct Place(&'static Places);

impl Places {
    pub(crate) fn take(&'static self) -> Option<Place> {
        let max = *self.max;
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Place(self))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.taken.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Threads spinning on a socket: at most half the CPUs. (The I/O thread takes a place too
/// while it spins for async callers: `IoRuntime::spin`.)
pub(crate) static SPINNING: Places = Places {
    taken: AtomicUsize::new(0),
    max: LazyLock::new(|| std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))),
};

/// Blocking calls that write and read their own connection: at most one per CPU
/// (`SHARDLIMIT_OWN_IO_MAX` overrides). A few such callers get the lowest latency (no
/// thread hand-off); many of them (64 goroutines on 2 cores) each pay their own syscalls
/// and wake-ups for one command, where the I/O thread would send their commands together.
/// So a blocking call that finds no place hands its check to the I/O runtime instead.
pub(crate) static OWN_IO: Places = Places {
    taken: AtomicUsize::new(0),
    max: LazyLock::new(|| {
        std::env::var("SHARDLIMIT_OWN_IO_MAX")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }),
};

/// In a forked child (only the forking thread, which holds no place, lives on): the
/// places of the parent's other threads are free. Async-signal-safe (atomic stores).
pub(crate) fn forget_places_in_child() {
    SPINNING.taken.store(0, Ordering::Release);
    OWN_IO.taken.store(0, Ordering::Release);
}

/// How far past its deadline a blocking read may sleep, at most, before the socket's read
/// timeout is set again.
const READ_TIMEOUT_SLACK: Duration = Duration::from_millis(1);

/// Gives way to any other thread ready to run on this CPU (`sched_yield`); true when one
/// ran meanwhile: the CPU is wanted, so a yielding spinner stops. On Linux, any switch
/// away from this thread since `switches` (its count of context switches, from
/// [`switches`]) says so, however short: two spinners on one CPU (gunicorn's workers are
/// processes, each with its own spinning place) hand the CPU back and forth in a few
/// microseconds a yield, so a yield's duration alone would let them spin each other's
/// whole `spin_wait` away. Elsewhere, a yield that took over [`YIELD_RAN_OTHERS`].
#[cfg(unix)]
fn ran_others(before: Instant, switches: Option<i64>) -> bool {
    // SAFETY: sched_yield takes no arguments and cannot fail on Linux.
    unsafe { libc::sched_yield() };
    before.elapsed() > YIELD_RAN_OTHERS || (switches.is_some() && self::switches() != switches)
}

/// A yielding spinner that found other threads wanting its CPU skips the spin for its
/// thread's next blocking calls: 1 after the first such spin, then twice as many after
/// each one that follows, up to 64 (`MAX_SKIPS`); a spin that gets its reply resets that.
/// A thread among busy ones (gunicorn's workers on one CPU) then pays no look at the
/// socket, yield and switch for nothing on almost every call, while a lone caller whose
/// spin a passing thread interrupts now and then loses one spin, not 64.
#[cfg(unix)]
struct YieldSkips;

#[cfg(unix)]
thread_local! {
    /// (calls left to skip, the skip after the next spin that finds others running)
    static SKIPS: std::cell::Cell<(u32, u32)> = const { std::cell::Cell::new((0, 0)) };
}

#[cfg(unix)]
impl YieldSkips {
    const MAX_SKIPS: u32 = 64;

    /// True when this call is one of those that do not spin.
    fn skip(&self) -> bool {
        SKIPS.with(|s| {
            let (left, next) = s.get();
            if left > 0 {
                s.set((left - 1, next));
            }
            left > 0
        })
    }

    /// The spin found others running.
    fn ran_others(&self) {
        SKIPS.with(|s| {
            let (_, next) = s.get();
            let skip = next.clamp(1, Self::MAX_SKIPS);
            s.set((skip, (skip * 2).min(Self::MAX_SKIPS)));
        });
    }

    /// The reply came while spinning.
    fn answered(&self) {
        SKIPS.with(|s| s.set((0, 0)));
    }
}

#[cfg(unix)]
const YIELD_SKIPS: YieldSkips = YieldSkips;

/// How many times this thread has been switched away from the CPU, voluntarily or not
/// (`getrusage(RUSAGE_THREAD)`); `None` where that is not known.
#[cfg(unix)]
fn switches() -> Option<i64> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getrusage writes one rusage into the zeroed struct it is given.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } == 0 {
            return Some(ru.ru_nvcsw as i64 + ru.ru_nivcsw as i64);
        }
        None
    }
    #[cfg(not(target_os = "linux"))]
    None
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connect timed out")
}

/// One blocking connection to a shard.
pub(crate) struct BlockingConn {
    stream: Stream,
    buf: Vec<u8>,
    /// Where the reply being read ends, once known.
    framer: Framer,
    /// How long a read sleeps at most (the socket's read timeout).
    read_timeout: Duration,
}

impl BlockingConn {
    /// Connects, logs in and selects the database, all within `timeout`.
    pub fn connect(target: &Target, timeout: Duration) -> io::Result<BlockingConn> {
        if target.is_tls() {
            return Err(io::Error::other(
                "a TLS shard has no blocking connections (its calls go through the I/O runtime)",
            ));
        }
        let deadline = Instant::now() + timeout;
        let stream = match &target.endpoint {
            Endpoint::Tcp(host, port) => {
                let mut last = None;
                let mut found = None;
                for addr in (host.as_str(), *port).to_socket_addrs()? {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    match TcpStream::connect_timeout(&addr, left) {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                let s = found.ok_or_else(|| last.unwrap_or_else(timed_out))?;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
            #[cfg(unix)]
            Endpoint::Unix(path) => Stream::Unix(std::os::unix::net::UnixStream::connect(path)?),
        };
        // a read never waits longer than the whole deadline
        stream.set_timeouts(timeout)?;
        let mut conn = BlockingConn {
            stream,
            buf: Vec::with_capacity(512),
            framer: Framer::default(),
            read_timeout: timeout,
        };
        for (what, packed) in target.handshake() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out());
            }
            expect_ok(what, conn.request(&packed, left, Spin::OFF)?)?;
        }
        Ok(conn)
    }

    /// True when nothing arrived while the connection was idle: no bytes (a reply nobody
    /// asked for) and no end of stream (the server closed it, e.g. its idle `timeout`).
    /// Such a connection is dropped before anything is sent on it, so the call goes on
    /// over a fresh one within its deadline.
    pub fn quiet(&self) -> bool {
        #[cfg(unix)]
        {
            let mut probe = [0u8; 1];
            matches!(self.stream.read_now(&mut probe), Ok(None))
        }
        #[cfg(not(unix))]
        true
    }

    /// Sends one packed command and reads its reply: spinning on the socket as `spin` says
    /// (when a spinning slot is free), then sleeping in `read`. It fails when the shard is
    /// silent: no reply for `timeout` since the write or the last [`PROGRESS_BYTES`] of
    /// it that came (a reply that keeps coming is not late, one dripped a byte at a time
    /// is); before that verdict, what the socket already holds is read without waiting (a thread that woke late after its
    /// read timed out must not call a shard silent whose reply sits in the socket). Any
    /// `Err` leaves the connection unusable: drop it.
    pub fn request(&mut self, packed: &[u8], timeout: Duration, spin: Spin) -> io::Result<Reply> {
        self.stream.write_all(packed)?;
        let mut since = Instant::now();
        // bytes since `since` (progress resets it: PROGRESS_BYTES of the reply)
        let mut unprogressed = 0usize;
        #[cfg(unix)]
        let mut slot = None;
        #[cfg(unix)]
        let spin_until = if spin.wait.is_zero() || (spin.yielding && YIELD_SKIPS.skip()) {
            None
        } else {
            slot = SPINNING.take();
            slot.as_ref().map(|_| Instant::now() + spin.wait)
        };
        // (a yielding spinner's context switches so far: see `ran_others`)
        #[cfg(unix)]
        let switched = if spin.yielding && spin_until.is_some() {
            switches()
        } else {
            None
        };
        #[cfg(not(unix))]
        let _ = spin;
        loop {
            if let Some(used) = self.framer.next(&self.buf, MAX_REPLY)? {
                if used != self.buf.len() {
                    // bytes after the reply: nobody asked for them, so which reply was
                    // this one's is in doubt
                    return Err(protocol("more bytes than the one reply asked for"));
                }
                let reply = parse_frame(&self.buf[..used]);
                self.buf.clear();
                if self.buf.capacity() > 64 << 10 {
                    self.buf.shrink_to(4096);
                }
                return reply;
            }
            let len = self.buf.len();
            self.buf.resize(len + 4096, 0);
            #[cfg(unix)]
            if let Some(until) = spin_until.filter(|_| slot.is_some()) {
                match self.stream.read_now(&mut self.buf[len..]) {
                    Ok(Some(n)) => {
                        self.buf.truncate(len + n);
                        if n == 0 {
                            return Err(io::ErrorKind::UnexpectedEof.into());
                        }
                        if spin.yielding {
                            YIELD_SKIPS.answered();
                        }
                        progress(&mut since, &mut unprogressed, n);
                        continue;
                    }
                    Ok(None) => {
                        self.buf.truncate(len);
                        let now = Instant::now();
                        if now >= until {
                            slot = None; // done spinning: sleep in read from now on
                        } else if spin.yielding && ran_others(now, switched) {
                            slot = None;
                            YIELD_SKIPS.ran_others();
                        } else if !spin.yielding {
                            std::hint::spin_loop();
                        }
                        continue;
                    }
                    Err(e) => {
                        self.buf.truncate(len);
                        return Err(e);
                    }
                }
            }
            let left = (since + timeout).saturating_duration_since(Instant::now());
            if left.is_zero() {
                // silent for the timeout, unless the socket holds bytes already
                #[cfg(unix)]
                match self.stream.read_now(&mut self.buf[len..]) {
                    Ok(Some(0)) => {
                        self.buf.truncate(len);
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    Ok(Some(n)) => {
                        // (read on until the socket is empty or the reply whole: bytes
                        // read at the verdict count as progress only by the rule)
                        self.buf.truncate(len + n);
                        progress(&mut since, &mut unprogressed, n);
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.buf.truncate(len);
                        return Err(e);
                    }
                }
                self.buf.truncate(len);
                return Err(silent(timeout));
            }
            // sleep in read about as long as the silence may last; the socket's timeout is
            // set again only when it is off by over a millisecond
            if self.read_timeout > left + READ_TIMEOUT_SLACK
                || self.read_timeout + READ_TIMEOUT_SLACK < left
            {
                if let Err(e) = self.stream.set_read_timeout(left) {
                    self.buf.truncate(len);
                    return Err(e);
                }
                self.read_timeout = left;
            }
            let r = self.stream.read(&mut self.buf[len..]);
            match r {
                Ok(0) => {
                    self.buf.truncate(len);
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                Ok(n) => {
                    self.buf.truncate(len + n);
                    progress(&mut since, &mut unprogressed, n);
                }
                Err(e) => {
                    self.buf.truncate(len);
                    match e.kind() {
                        // the socket's read timeout passed: the loop looks again
                        io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted => continue,
                        _ => return Err(e),
                    }
                }
            }
        }
    }
}

/// `n` more bytes of a reply not yet whole came: the silence starts again (`since`) once
/// [`PROGRESS_BYTES`] of them have come since it last did.
fn progress(since: &mut Instant, unprogressed: &mut usize, n: usize) {
    *unprogressed += n;
    if *unprogressed >= PROGRESS_BYTES {
        *since = Instant::now();
        *unprogressed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread that sleeps is switched out, and its count of switches says so (the
    /// signal that stops a yielding spinner).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_switch_of_the_thread_is_counted() {
        let before = switches().expect("getrusage(RUSAGE_THREAD) answers on Linux");
        std::thread::sleep(Duration::from_millis(2));
        assert!(switches().unwrap() > before);
    }

    /// A yielding spinner that found others running skips the spin for 1, 2, 4... up to
    /// 64 of its thread's next calls, and from 1 again once a spin got its reply. Per
    /// thread.
    #[cfg(unix)]
    #[test]
    fn a_spinner_that_found_others_running_skips_its_next_calls() {
        std::thread::spawn(|| {
            let skipped = || {
                let mut n = 0;
                while YIELD_SKIPS.skip() {
                    n += 1;
                }
                n
            };
            assert_eq!(skipped(), 0, "a new thread spins");
            let mut seen = Vec::new();
            for _ in 0..8 {
                YIELD_SKIPS.ran_others();
                seen.push(skipped());
            }
            assert_eq!(seen, [1, 2, 4, 8, 16, 32, 64, 64]);
            YIELD_SKIPS.ran_others();
            std::thread::spawn(|| assert!(!YIELD_SKIPS.skip(), "another thread still spins"))
                .join()
                .unwrap();
            YIELD_SKIPS.answered();
            assert_eq!(
                skipped(),
                0,
                "a spin that got its reply: every call spins again"
            );
            YIELD_SKIPS.ran_others();
            assert_eq!(skipped(), 1);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn at_most_as_many_own_io_callers_as_places() {
        // (no other test of this binary makes blocking calls)
        let max = *OWN_IO.max;
        let held: Vec<Place> = (0..max).map(|_| OWN_IO.take().unwrap()).collect();
        assert!(OWN_IO.take().is_none(), "a place beyond {max}");
        drop(held);
        let again = OWN_IO.take();
        assert!(again.is_some());
        drop(again);
        assert_eq!(OWN_IO.taken.load(Ordering::Acquire), 0);
    }
}
