//! The pipelined connection of a standalone shard on the I/O runtime: every async call to
//! the shard goes over it (checks, and through [`PipeConn`] every other command the engine
//! sends).
//!
//! It is the sans-I/O machine of [`crate::transport::sansio`] driven by two tasks, as quinn
//! drives quinn-proto: framing, tags, batching, the bounds on replies, the queue's bound and
//! the rule of when a shard is failing live there, once; this file only moves bytes and
//! wakes callers. A writer task writes what the machine hands out as soon as calls are
//! queued (a burst's checks of one algorithm go as one batch call); a reader task hands
//! every chunk it reads to the machine, wakes the callers its completions answer, and keeps
//! the machine's one timer (the connect's deadline, or the moment the shard will have been
//! silent for the timeout). When that timer fires, the reader first takes what the socket
//! already holds, without waiting: a runtime that woke late must not call a shard silent
//! whose replies are sitting in the socket. The stream may say "nothing" although the
//! socket holds bytes: tokio reads a socket only once its driver saw it ready, and bytes
//! that came after the driver last looked (the thread was preempted, or ran other tasks,
//! between that look and the timer) are not seen yet. So before the verdict the reader
//! also peeks at the socket itself, and bytes there put the verdict off (once: bytes that
//! stay unread are no answer).
//!
//! The stream is a TCP or Unix socket, or a tokio-rustls stream over TCP for a `rediss://`
//! shard (split into halves that share a lock, held only for one poll): the same bounds
//! and rule hold on each, since the machine sees only the plaintext.
//!
//! When the machine closes the connection (bytes it cannot trust, a silent shard, an I/O
//! error, a closed socket), every caller waiting on it fails, both tasks stop (which closes
//! the socket) and the next call connects again.

use crate::transport::blocking::Target;
use crate::transport::resp::{protocol, Reply};
use crate::transport::sansio::{Completion, SansIo};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{oneshot, Notify};
use tokio::task::AbortHandle;

type Sender = oneshot::Sender<io::Result<Reply>>;

/// The machine and the callers of its calls, by id.
struct Inner {
    conn: SansIo,
    /// (ids are this pipe's own counter: a fast hash is enough)
    callers: HashMap<u64, Sender, foldhash::fast::FixedState>,
    next_id: u64,
}

impl Inner {
    /// The callers of `done`'s completions, with their replies (woken once the lock is
    /// let go).
    fn take(&mut self, done: &mut Vec<Completion>, wake: &mut Vec<(Sender, io::Result<Reply>)>) {
        for c in done.drain(..) {
            if let Some(s) = self.callers.remove(&c.id) {
                wake.push((s, c.reply));
            }
        }
    }
}

struct Shared {
    inner: Mutex<Inner>,
    /// calls were queued: the writer has bytes to hand out
    write: Notify,
    /// the machine's deadline may be earlier than the reader's timer
    timer: Notify,
    broken: AtomicBool,
    /// The writer and reader tasks, aborted when the connection breaks.
    tasks: Mutex<Vec<AbortHandle>>,
    /// The socket under the stream, for [`Pipe::is_broken`]'s look at an idle connection.
    peek: Option<Peek>,
}

fn wake(wake: &mut Vec<(Sender, io::Result<Reply>)>) {
    for (s, r) in wake.drain(..) {
        let _ = s.send(r);
    }
}

impl Shared {
    /// Runs `f` on the machine, then wakes the callers it completed, and the writer when
    /// the machine has bytes to send (a check sent again after NOSCRIPT); if the machine
    /// closed the connection, marks it broken and stops its tasks. False when it is broken.
    fn drive(&self, f: impl FnOnce(&mut SansIo, &mut Vec<Completion>)) -> bool {
        let mut done = Vec::new();
        let mut woken = Vec::new();
        let (down, transmit) = {
            let mut inner = self.inner.lock();
            f(&mut inner.conn, &mut done);
            inner.take(&mut done, &mut woken);
            let down = inner.conn.is_down();
            if down {
                // before the lock goes: no caller finds this pipe whole and its machine down
                self.broken.store(true, Ordering::Release);
            }
            (down, inner.conn.wants_transmit())
        };
        wake(&mut woken);
        if transmit {
            self.write.notify_one();
        }
        if down {
            self.stop();
        }
        !down
    }

    fn stop(&self) {
        self.broken.store(true, Ordering::Release);
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
    }
}

/// One pipelined connection to a shard.
pub(crate) struct Pipe {
    shared: Arc<Shared>,
}

fn broken() -> io::Error {
    broken_because(None)
}

/// The error of a call that found its connection closed, with the closing's cause.
fn broken_because(why: Option<&str>) -> io::Error {
    let msg = match why {
        Some(why) => format!("the connection to Redis broke: {why}"),
        None => "the connection to Redis broke".to_string(),
    };
    io::Error::new(io::ErrorKind::ConnectionReset, msg)
}

impl Pipe {
    /// Connects within `timeout` and spawns the connection's two tasks on the current
    /// runtime (call it on the limiter's I/O runtime); the log-in (AUTH, SELECT) goes first
    /// on the connection, and must be done within `timeout` of the connect's start. Calls
    /// queue until it is, at most `max_queue` at once.
    pub async fn connect(target: &Target, timeout: Duration, max_queue: usize) -> io::Result<Pipe> {
        let mut conn = SansIo::new(target.handshake(), timeout, max_queue);
        conn.connecting(Instant::now());
        let timed_out = || io::Error::new(io::ErrorKind::TimedOut, "connect timed out");
        match target.tcp() {
            Some((host, port)) => {
                // the TCP connect and, for a TLS shard, the handshake, within the timeout
                let open = async {
                    let s = tokio::net::TcpStream::connect((host, port)).await?;
                    s.set_nodelay(true)?;
                    let peek = Peek::of(&s);
                    #[cfg(feature = "tls")]
                    if let Some(tls) = target.tls() {
                        let s = tls.handshake(s).await?;
                        // (a lock shared by the halves, held only for one poll)
                        let (r, w) = tokio::io::split(s);
                        return io::Result::Ok(Pipe::start(r, w, conn, peek));
                    }
                    let (r, w) = s.into_split();
                    Ok(Pipe::start(r, w, conn, peek))
                };
                tokio::time::timeout(timeout, open)
                    .await
                    .map_err(|_| timed_out())?
            }
            None => {
                let s = tokio::time::timeout(timeout, Pipe::connect_unix(target))
                    .await
                    .map_err(|_| timed_out())??;
                let peek = Peek::of(&s);
                let (r, w) = tokio::io::split(s);
                Ok(Pipe::start(r, w, conn, peek))
            }
        }
    }

    #[cfg(unix)]
    async fn connect_unix(target: &Target) -> io::Result<tokio::net::UnixStream> {
        let path = target
            .unix()
            .ok_or_else(|| io::Error::other("no address"))?;
        tokio::net::UnixStream::connect(path).await
    }

    #[cfg(not(unix))]
    async fn connect_unix(_: &Target) -> io::Result<tokio::io::DuplexStream> {
        Err(io::Error::other("no address"))
    }

    /// The connection over an open stream (plain or TLS): `conn` is connecting. `peek`
    /// looks at the socket under the stream (it must stay open as long as `r` lives),
    /// which a silence verdict consults.
    pub(crate) fn start<R, W>(r: R, w: W, mut conn: SansIo, peek: Option<Peek>) -> Pipe
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        conn.connected();
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                conn,
                callers: HashMap::default(),
                next_id: 1,
            }),
            write: Notify::new(),
            timer: Notify::new(),
            broken: AtomicBool::new(false),
            tasks: Mutex::new(Vec::with_capacity(2)),
            peek,
        });
        // the log-in's bytes
        shared.write.notify_one();
        let writer = tokio::spawn(write_loop(w, Arc::clone(&shared)));
        let reader = tokio::spawn(read_loop(r, Arc::clone(&shared), peek));
        shared
            .tasks
            .lock()
            .extend([writer.abort_handle(), reader.abort_handle()]);
        if shared.broken.load(Ordering::Acquire) {
            // it broke before the handles were recorded
            writer.abort();
            reader.abort();
        }
        Pipe { shared }
    }

    /// Closes the connection (its reply stream is in doubt: `why`), failing every caller
    /// waiting on it; the next call connects again.
    pub fn close(&self, why: &str) {
        self.shared.drive(|c, done| c.close(why, done));
    }

    /// True once the connection closed: make a new one. An idle connection (no call
    /// waiting on it) whose socket already holds the server's end counts as closed too: a
    /// server that drops idle clients (its `timeout`, a proxy's, a restart) closes it
    /// between calls, and the reader task may not have run since (a busy runtime), so the
    /// next call would be written to a closed connection and fail. Nothing was sent on it
    /// since, so making a new one is safe. (A TLS server's end comes after its close
    /// alert's bytes, so on TLS this look does not see it.)
    pub fn is_broken(&self) -> bool {
        if self.shared.broken.load(Ordering::Acquire) {
            return true;
        }
        let Some(peek) = self.shared.peek else {
            return false;
        };
        let idle = self.shared.inner.lock().callers.is_empty();
        if idle && peek.at_end() {
            self.close("Redis closed the connection while it was idle");
            return true;
        }
        false
    }

    /// Runs one check script call and waits for its reply (see the machine for when a
    /// call fails for lack of one). The call goes alone, or in a batch call with the
    /// burst's other checks of its algorithm; its reply is its own either way.
    pub async fn request(&self, call: crate::transport::batch::CheckCall) -> io::Result<Reply> {
        self.send(|c, id| c.submit(id, call)).await
    }

    /// Sends one packed command (anything but a check) and waits for the bytes of its
    /// reply.
    pub async fn command(&self, packed: Vec<u8>) -> io::Result<Vec<u8>> {
        match self.send(|c, id| c.submit_command(id, packed)).await? {
            Reply::Str(frame) => Ok(frame),
            _ => Err(protocol("a command's reply is its frame")),
        }
    }

    /// [`Pipe::command`] for a command whose reply may be at most `max_reply` bytes.
    pub async fn command_bounded(&self, packed: Vec<u8>, max_reply: usize) -> io::Result<Vec<u8>> {
        match self
            .send(|c, id| c.submit_bounded(id, packed, max_reply))
            .await?
        {
            Reply::Str(frame) => Ok(frame),
            _ => Err(protocol("a command's reply is its frame")),
        }
    }

    /// `ASKING` and then `packed` (a Redis Cluster's `ASK` redirect), next to each other on
    /// the connection: the bytes of `packed`'s reply (at most `max_reply`), once `ASKING`
    /// was answered `+OK`.
    pub async fn command_asking(&self, packed: Vec<u8>, max_reply: usize) -> io::Result<Vec<u8>> {
        let (asked_tx, asked_rx) = oneshot::channel();
        let (tx, rx) = oneshot::channel();
        {
            let mut inner = self.shared.inner.lock();
            if self.shared.broken.load(Ordering::Acquire) || inner.conn.is_down() {
                return Err(broken_because(inner.conn.down_why()));
            }
            let (asking, id) = (inner.next_id, inner.next_id + 1);
            inner.next_id += 2;
            // (under one lock: nothing is queued between the two)
            inner
                .conn
                .submit_bounded(asking, b"*1\r\n$6\r\nASKING\r\n".to_vec(), 1024)?;
            if let Err(e) = inner.conn.submit_bounded(id, packed, max_reply) {
                // the ASKING goes alone; its answer is nobody's concern
                inner.callers.insert(asking, asked_tx);
                drop(inner);
                self.shared.write.notify_one();
                return Err(e);
            }
            inner.callers.insert(asking, asked_tx);
            inner.callers.insert(id, tx);
        }
        self.shared.write.notify_one();
        let asked = asked_rx.await.map_err(|_| broken())??;
        let reply = rx.await.map_err(|_| broken())??;
        match (asked, reply) {
            (Reply::Str(ok), Reply::Str(frame)) if ok == b"+OK\r\n" => Ok(frame),
            (Reply::Str(_), Reply::Str(_)) => Err(protocol("ASKING was not answered +OK")),
            _ => Err(protocol("a command's reply is its frame")),
        }
    }

    async fn send(
        &self,
        submit: impl FnOnce(&mut SansIo, u64) -> io::Result<()>,
    ) -> io::Result<Reply> {
        let (tx, rx) = oneshot::channel();
        {
            let mut inner = self.shared.inner.lock();
            if self.shared.broken.load(Ordering::Acquire) || inner.conn.is_down() {
                return Err(broken_because(inner.conn.down_why()));
            }
            let id = inner.next_id;
            inner.next_id += 1;
            submit(&mut inner.conn, id)?;
            inner.callers.insert(id, tx);
        }
        self.shared.write.notify_one();
        rx.await.map_err(|_| broken())?
    }
}

/// A handle on a shard's pipelined connection that the redis crate's commands
/// run on (`query_async`): the plain commands the engine sends (block list, overrides,
/// shadow counts; script calls go through `RedisEngine::call` and `Pipe::command`).
#[derive(Clone)]
pub(crate) struct PipeConn {
    pub pipe: Arc<Pipe>,
    pub db: i64,
}

impl redis::aio::ConnectionLike for PipeConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        Box::pin(async move {
            let frame = self.pipe.command(cmd.get_packed_command()).await?;
            // framed under our limits (depth, sizes) before the redis crate parses it
            redis::parse_redis_value(&frame)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(one_at_a_time(self, cmd, offset, count))
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

/// The redis crate's `req_packed_commands` for a connection that takes no pipelines (the
/// engine sends none; this is for completeness): `cmd`'s commands sent on `conn` one at a
/// time, the replies from `offset` on, at most `count`.
pub(crate) async fn one_at_a_time<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    cmd: &redis::Pipeline,
    offset: usize,
    count: usize,
) -> redis::RedisResult<Vec<redis::Value>> {
    let mut out = Vec::with_capacity(count);
    for (i, c) in cmd.cmd_iter().enumerate() {
        let v = conn.req_packed_command(c).await?;
        if i >= offset && out.len() < count {
            out.push(v);
        }
    }
    Ok(out)
}

async fn write_loop<W: AsyncWrite + Unpin>(mut w: W, shared: Arc<Shared>) {
    loop {
        shared.write.notified().await;
        loop {
            let bytes = {
                let mut inner = shared.inner.lock();
                if inner.conn.is_down() {
                    return;
                }
                let armed = inner.conn.next_deadline();
                let bytes = inner.conn.poll_transmit(Instant::now());
                // (packing a large burst takes a while: its silence starts once packed)
                inner.conn.written(Instant::now());
                if armed.is_none() && inner.conn.next_deadline().is_some() {
                    shared.timer.notify_one();
                }
                bytes
            };
            let Some(bytes) = bytes else { break };
            // unconstrained: a write put off because this task spent its cooperative
            // budget would leave requests counted as written that are not
            // (and flushed: a TLS stream may keep the last record in its buffer until then)
            let written = async {
                w.write_all(&bytes).await?;
                w.flush().await
            };
            if let Err(e) = tokio::task::unconstrained(written).await {
                let why = format!("writing to Redis failed: {e}");
                shared.drive(|c, done| c.handle_closed(&why, done));
                return;
            }
            // (and a large burst takes a while to write: from when it is all written)
            let mut inner = shared.inner.lock();
            inner.conn.written(Instant::now());
            inner.conn.recycle(bytes);
        }
    }
}

async fn read_loop<R: AsyncRead + Unpin>(mut r: R, shared: Arc<Shared>, peek: Option<Peek>) {
    let mut buf = Vec::with_capacity(16 * 1024);
    // the machine's timer, armed lazily: it may fire before the machine's deadline (which
    // moves later with every byte read), and is then armed again
    let far = || tokio::time::Instant::now() + Duration::from_secs(86_400);
    let sleep = tokio::time::sleep_until(far());
    tokio::pin!(sleep);
    let mut armed: Option<Instant> = None;
    // the last verdict was put off for bytes the socket held and the stream did not read
    // (once: bytes that stay unread after that are no answer)
    let mut put_off = false;
    loop {
        if armed.is_none() {
            armed = shared.inner.lock().conn.next_deadline();
            if let Some(d) = armed {
                sleep.as_mut().reset(d.into());
            }
        }
        buf.clear();
        tokio::select! {
            biased;
            r = r.read_buf(&mut buf) => {
                let now = Instant::now();
                match r {
                    Ok(0) => {
                        shared.drive(|c, done| c.handle_closed("Redis closed the connection", done));
                        return;
                    }
                    Ok(_) => {
                        put_off = false;
                        if !shared.drive(|c, done| c.handle_input(now, &buf, done)) {
                            return;
                        }
                    }
                    Err(e) => {
                        let why = format!("reading from Redis failed: {e}");
                        shared.drive(|c, done| c.handle_closed(&why, done));
                        return;
                    }
                }
                if buf.capacity() > 1 << 20 {
                    buf = Vec::with_capacity(16 * 1024); // after a large reply
                }
            }
            _ = &mut sleep, if armed.is_some() => {
                armed = None;
                sleep.as_mut().reset(far());
                // what the socket holds already came before now: it goes first
                let now = Instant::now();
                let mut closed = None;
                while buf.len() < 1 << 20 {
                    if buf.capacity() - buf.len() < 4096 {
                        buf.reserve(16 * 1024);
                    }
                    match read_now(&mut r, &mut buf) {
                        None => break,
                        Some(Ok(0)) => {
                            closed = Some("Redis closed the connection".to_string());
                            break;
                        }
                        Some(Ok(_)) => put_off = false,
                        Some(Err(e)) => {
                            closed = Some(format!("reading from Redis failed: {e}"));
                            break;
                        }
                    }
                }
                // Bytes in the socket that the stream said were not there: the runtime
                // has not seen the socket ready since they came (it looked, then this
                // thread was preempted or ran other tasks, then the timer was due). They
                // came before now: the shard is not silent. Read at the next turn.
                let unread = buf.is_empty()
                    && closed.is_none()
                    && !put_off
                    && peek.as_ref().is_some_and(Peek::holds_bytes);
                put_off |= unread;
                let alive = shared.drive(|c, done| {
                    c.handle_input(now, &buf, done);
                    match &closed {
                        Some(why) => c.handle_closed(why, done),
                        None if unread => c.heard(now),
                        None => c.handle_timeout(now, done),
                    }
                });
                if !alive {
                    return;
                }
            }
            _ = shared.timer.notified() => {
                armed = None;
            }
        }
    }
}

/// Reads what `r` holds now into `buf`, without waiting: `None` when it holds nothing.
/// Unconstrained by tokio's cooperative budget (a task that spent it would be told "not
/// ready" with the bytes there). A stream that answers "not ready" and wakes its task at
/// once is asked again: that answer meant "ask again" (the other half of a split stream
/// held their shared lock for a moment, tokio-rustls had more to process).
fn read_now<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> Option<io::Result<usize>> {
    struct Woken(AtomicBool);
    impl std::task::Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::Release);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.store(true, Ordering::Release);
        }
    }
    for _ in 0..64 {
        let woken = Arc::new(Woken(AtomicBool::new(false)));
        let waker = std::task::Waker::from(Arc::clone(&woken));
        let mut cx = std::task::Context::from_waker(&waker);
        let mut read = std::pin::pin!(tokio::task::unconstrained(r.read_buf(buf)));
        match read.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(r) => return Some(r),
            std::task::Poll::Pending if woken.0.load(Ordering::Acquire) => {
                std::thread::yield_now();
            }
            std::task::Poll::Pending => return None,
        }
    }
    None
}

/// The socket under a pipe's stream, looked at without reading from it: whether the kernel
/// holds bytes for it (which the stream reports only once its runtime saw the socket ready).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peek {
    #[cfg(unix)]
    fd: std::os::unix::io::RawFd,
}

impl Peek {
    /// The peek of `s`'s socket (`None` where it cannot be done).
    #[cfg(unix)]
    pub(crate) fn of<S: std::os::unix::io::AsRawFd>(s: &S) -> Option<Peek> {
        Some(Peek { fd: s.as_raw_fd() })
    }

    #[cfg(not(unix))]
    pub(crate) fn of<S>(_: &S) -> Option<Peek> {
        None
    }

    /// True when the socket's next read is its end: the peer closed it and nothing it
    /// sent is left unread.
    fn at_end(&self) -> bool {
        self.peek_one() == 0
    }

    /// True when the socket holds bytes not read yet, or its end (read at the next turn).
    fn holds_bytes(&self) -> bool {
        self.peek_one() >= 0
    }

    /// `recv` of one byte without taking it or waiting: 1 a byte is there, 0 the end,
    /// negative nothing yet (or an error, or no socket to look at).
    fn peek_one(&self) -> isize {
        #[cfg(unix)]
        {
            let mut probe = [0u8; 1];
            // SAFETY: `probe` is valid for one byte. The fd is open while the stream whose
            // socket it is lives: the reader holds its read half, and `Pipe::is_broken`
            // looks only while the connection is not broken (if it broke since and the
            // number was reused, a peek consumes nothing: at worst a broken connection is
            // closed again).
            unsafe {
                libc::recv(
                    self.fd,
                    probe.as_mut_ptr().cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            }
        }
        #[cfg(not(unix))]
        -1
    }
}

#[cfg(test)]
mod tests;
