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
//! URL. Only the replies the scripts give (integers, strings, arrays, errors) are parsed;
//! anything else is an error that drops the connection. TLS shards use the I/O runtime.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// A reply of Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Nil,
    Int(i64),
    Str(Vec<u8>),
    Array(Vec<Reply>),
    /// An error reply (`-ERR ...`, `-NOSCRIPT ...`).
    Error(String),
}

impl Reply {
    /// The server lost the script (restart, SCRIPT FLUSH): send it with EVAL.
    pub fn is_noscript(&self) -> bool {
        matches!(self, Reply::Error(e) if e.starts_with("NOSCRIPT"))
    }
}

/// The outcome of a handshake command (`what`: AUTH, SELECT), which answers +OK.
pub(crate) fn expect_ok(what: &str, reply: Reply) -> io::Result<()> {
    match reply {
        Reply::Str(s) if s == b"OK" => Ok(()),
        Reply::Error(e) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{what} failed: {e}"),
        )),
        other => Err(protocol(format!("{what}: unexpected reply {other:?}"))),
    }
}

/// Where a shard listens, and how to log in.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    endpoint: Endpoint,
    db: i64,
    username: Option<String>,
    password: Option<String>,
}

#[derive(Debug, Clone)]
enum Endpoint {
    Tcp(String, u16),
    #[cfg(unix)]
    Unix(std::path::PathBuf),
}

impl Target {
    /// The target of a client; `None` for TLS (which goes through the I/O runtime).
    pub fn of(client: &redis::Client) -> Option<Target> {
        let info = client.get_connection_info();
        let endpoint = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => Endpoint::Tcp(host.clone(), *port),
            #[cfg(unix)]
            redis::ConnectionAddr::Unix(path) => Endpoint::Unix(path.clone()),
            _ => return None,
        };
        let settings = info.redis_settings();
        Some(Target {
            endpoint,
            db: settings.db(),
            username: settings.username().map(str::to_string),
            password: settings.password().map(str::to_string),
        })
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
/// while it spins for async callers: `RtState::spin`.)
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

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "no reply within the deadline")
}

fn protocol(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// One blocking connection to a shard.
pub(crate) struct BlockingConn {
    stream: Stream,
    buf: Vec<u8>,
    /// Start of the unparsed bytes in `buf`.
    pos: usize,
    /// How long a read sleeps at most (the socket's read timeout).
    read_timeout: Duration,
}

impl BlockingConn {
    /// Connects, logs in and selects the database, all within `timeout`.
    pub fn connect(target: &Target, timeout: Duration) -> io::Result<BlockingConn> {
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
            pos: 0,
            read_timeout: timeout,
        };
        for (what, packed) in target.handshake() {
            expect_ok(what, conn.request(&packed, deadline, Duration::ZERO)?)?;
        }
        Ok(conn)
    }

    /// Sends one packed command and reads its reply: spinning on the socket for up to
    /// `spin` (when a spinning slot is free), then sleeping in `read`, never past
    /// `deadline`. Any `Err` leaves the connection unusable: drop it.
    pub fn request(
        &mut self,
        packed: &[u8],
        deadline: Instant,
        spin: Duration,
    ) -> io::Result<Reply> {
        self.stream.write_all(packed)?;
        let mut slot = None;
        #[cfg(unix)]
        let spin_until = if spin.is_zero() {
            None
        } else {
            slot = SPINNING.take();
            slot.as_ref().map(|_| Instant::now() + spin)
        };
        #[cfg(not(unix))]
        let _ = spin;
        loop {
            if let Some((reply, used)) = parse(&self.buf[self.pos..])? {
                self.pos += used;
                if self.pos == self.buf.len() {
                    self.buf.clear();
                    self.pos = 0;
                }
                return Ok(reply);
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
                        continue;
                    }
                    Ok(None) => {
                        self.buf.truncate(len);
                        if Instant::now() >= until {
                            slot = None; // done spinning: sleep in read from now on
                        } else {
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
            // sleep in read about as long as the deadline leaves (a retry's deadline is the
            // call's, and a pooled connection's timeout may be one a retry shortened); the
            // socket's timeout is set again only when it is off by over a millisecond,
            // which a call's first try never is
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.buf.truncate(len);
                return Err(timed_out());
            }
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
                Ok(n) => self.buf.truncate(len + n),
                Err(e) => {
                    self.buf.truncate(len);
                    match e.kind() {
                        // the socket's read timeout passed: the deadline too, or (the
                        // timeout being up to a millisecond short) read again
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                            if Instant::now() >= deadline {
                                return Err(timed_out());
                            }
                            continue;
                        }
                        io::ErrorKind::Interrupted => continue,
                        _ => return Err(e),
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(timed_out());
            }
        }
    }
}

/// Parses one reply from the front of `b`: `Ok(None)` when it is not complete yet.
pub(crate) fn parse(b: &[u8]) -> io::Result<Option<(Reply, usize)>> {
    fn line(b: &[u8]) -> Option<(&[u8], usize)> {
        let i = b.windows(2).position(|w| w == b"\r\n")?;
        Some((&b[..i], i + 2))
    }
    fn int(s: &[u8]) -> io::Result<i64> {
        std::str::from_utf8(s)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| protocol(format!("bad integer {:?}", String::from_utf8_lossy(s))))
    }
    let Some(&tag) = b.first() else {
        return Ok(None);
    };
    let Some((head, mut used)) = line(&b[1..]) else {
        return Ok(None);
    };
    used += 1;
    Ok(Some(match tag {
        b'+' => (Reply::Str(head.to_vec()), used),
        b'-' => (
            Reply::Error(String::from_utf8_lossy(head).into_owned()),
            used,
        ),
        b':' => (Reply::Int(int(head)?), used),
        b'$' => {
            let n = int(head)?;
            if n < 0 {
                return Ok(Some((Reply::Nil, used)));
            }
            let n = n as usize;
            if b.len() < used + n + 2 {
                return Ok(None);
            }
            if &b[used + n..used + n + 2] != b"\r\n" {
                return Err(protocol("bulk string without CRLF"));
            }
            (Reply::Str(b[used..used + n].to_vec()), used + n + 2)
        }
        b'*' => {
            let n = int(head)?;
            if n < 0 {
                return Ok(Some((Reply::Nil, used)));
            }
            let mut items = Vec::with_capacity((n as usize).min(64));
            for _ in 0..n {
                match parse(&b[used..])? {
                    Some((item, u)) => {
                        items.push(item);
                        used += u;
                    }
                    None => return Ok(None),
                }
            }
            (Reply::Array(items), used)
        }
        other => {
            return Err(protocol(format!(
                "unsupported reply type {:?}",
                other as char
            )))
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn parses_replies_and_waits_for_the_rest() {
        let full = b"*3\r\n:1\r\n$3\r\nabc\r\n*2\r\n:-5\r\n$-1\r\n+OK\r\n";
        let (r, used) = parse(full).unwrap().unwrap();
        assert_eq!(
            r,
            Reply::Array(vec![
                Reply::Int(1),
                Reply::Str(b"abc".to_vec()),
                Reply::Array(vec![Reply::Int(-5), Reply::Nil]),
            ])
        );
        assert_eq!(&full[used..], b"+OK\r\n");
        // every proper prefix is incomplete, never an error
        for cut in 0..used {
            assert_eq!(parse(&full[..cut]).unwrap(), None, "prefix of {cut} bytes");
        }
        assert_eq!(
            parse(b"-NOSCRIPT No matching script\r\n").unwrap(),
            Some((Reply::Error("NOSCRIPT No matching script".into()), 30))
        );
        assert!(parse(b":12x\r\n").is_err());
        assert!(parse(b"%1\r\n").is_err());
        assert!(parse(b"$3\r\nabcXY").is_err());
    }
}
