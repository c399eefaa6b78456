//! The pipelined connection of a standalone shard: every async call to the shard goes
//! over it (checks, and through [`PipeConn`] every other command the engine sends).
//!
//! Checks are the hot path of every event-loop binding. A writer task sends every command
//! queued since its last write in one write, a reader task frames and parses replies
//! under the limits of [`crate::transport::resp`] and hands each to the oldest waiting caller. Checks
//! get one more step: the writer sends the checks of a burst that use the same algorithm
//! as one call of that algorithm's batch script (`core/lua/main_batch.lua`), and the reader
//! hands each caller its own element of the array that call answers. Both tasks live on
//! the limiter's I/O runtime.
//!
//! Replies are matched to callers by order, so the connection is only as good as its
//! reply stream: any doubt about it closes the connection, fails every caller waiting on
//! it, and the next call connects again. Doubts are: an I/O error, a reply outside the
//! limits, a reply nobody asked for, and a caller whose deadline passed before its reply
//! came (a reply that is lost or late would otherwise shift every later reply onto the
//! wrong caller). Closing aborts both tasks, so the socket is closed at once and nothing
//! more is read or buffered for callers that are gone.

use crate::engine::redis::scripts::CheckScripts;
use crate::transport::batch::{pack_calls, split_batch, untag, CheckCall, MAX_BATCH, NOT_THEIRS};
use crate::transport::blocking::{expect_ok, Target};
use crate::transport::resp::{parse_frame, Framer, Reply, MAX_CHECK_REPLY, MAX_REPLY};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

type Sender = oneshot::Sender<io::Result<Reply>>;
/// A caller of any other command waits for the bytes of its reply (parsed by the redis
/// crate, see [`PipeConn`]).
type RawSender = oneshot::Sender<io::Result<Vec<u8>>>;

enum Request {
    Check {
        call: CheckCall,
        reply: Sender,
    },
    /// Any other command, packed.
    Command {
        packed: Vec<u8>,
        reply: RawSender,
    },
}

/// Who waits for the next reply: one caller, the callers of one batch call in order, or
/// the caller of another command.
enum Waiter {
    One(u64, Sender),
    Batch(Vec<(u64, Sender)>),
    Raw(RawSender),
}

impl Waiter {
    fn fail(self, e: &io::Error) {
        let err = || io::Error::new(e.kind(), e.to_string());
        match self {
            Waiter::One(_, s) => {
                let _ = s.send(Err(err()));
            }
            Waiter::Batch(senders) => {
                for (_, s) in senders {
                    let _ = s.send(Err(err()));
                }
            }
            Waiter::Raw(s) => {
                let _ = s.send(Err(err()));
            }
        }
    }

    /// The longest reply this waiter may get.
    fn max_reply(&self) -> usize {
        match self {
            Waiter::Raw(_) => MAX_REPLY,
            _ => MAX_CHECK_REPLY,
        }
    }

    /// Hands the framed reply `frame` to its caller(s). `Err`: the reply is not theirs
    /// (another call's tag): the stream is in doubt.
    fn answer_frame(self, frame: &[u8]) -> io::Result<()> {
        let not_theirs = || crate::transport::resp::protocol(NOT_THEIRS);
        let reply = match self {
            Waiter::Raw(s) => {
                let _ = s.send(Ok(frame.to_vec()));
                return Ok(());
            }
            Waiter::One(tag, s) => {
                let r = untag(parse_frame(frame)?, tag).map_err(|_| not_theirs())?;
                let _ = s.send(Ok(r));
                return Ok(());
            }
            Waiter::Batch(senders) => (parse_frame(frame)?, senders),
        };
        let (reply, senders) = reply;
        let replies = split_batch(reply, senders.iter().map(|(tag, _)| *tag))?;
        for (r, (_, s)) in replies.into_iter().zip(senders) {
            let _ = s.send(Ok(r));
        }
        Ok(())
    }
}

struct Shared {
    waiting: Mutex<VecDeque<Waiter>>,
    broken: AtomicBool,
    /// The writer and reader tasks, aborted when the connection breaks.
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Shared {
    /// Marks the connection broken, fails every caller still waiting on it and stops its
    /// tasks (which closes the socket).
    fn fail(&self, e: &io::Error) {
        if self.broken.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::debug!(error = %e, "shardlimit: closing a pipelined connection");
        let waiting = std::mem::take(&mut *self.waiting.lock());
        for w in waiting {
            w.fail(e);
        }
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
    }
}

/// One pipelined connection to a shard.
pub(crate) struct Pipe {
    tx: mpsc::UnboundedSender<Request>,
    shared: Arc<Shared>,
}

fn broken() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        "the connection to Redis broke",
    )
}

impl Pipe {
    /// Connects, logs in and selects the database; spawns the connection's two tasks on
    /// the current runtime (call it on the limiter's I/O runtime).
    pub async fn connect(target: &Target, timeout: Duration) -> io::Result<Pipe> {
        let connect = async {
            match target.tcp() {
                Some((host, port)) => {
                    let s = tokio::net::TcpStream::connect((host, port)).await?;
                    s.set_nodelay(true)?;
                    let (r, w) = s.into_split();
                    Pipe::start(r, w, target).await
                }
                None => Pipe::connect_unix(target).await,
            }
        };
        tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))?
    }

    #[cfg(unix)]
    async fn connect_unix(target: &Target) -> io::Result<Pipe> {
        let path = target
            .unix()
            .ok_or_else(|| io::Error::other("no address"))?;
        let s = tokio::net::UnixStream::connect(path).await?;
        let (r, w) = s.into_split();
        Pipe::start(r, w, target).await
    }

    #[cfg(not(unix))]
    async fn connect_unix(_: &Target) -> io::Result<Pipe> {
        Err(io::Error::other("no address"))
    }

    async fn start<R, W>(mut r: R, mut w: W, target: &Target) -> io::Result<Pipe>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let mut buf = Vec::with_capacity(16 * 1024);
        let mut framer = Framer::default();
        for (what, packed) in target.handshake() {
            w.write_all(&packed).await?;
            let reply = loop {
                if let Some(used) = framer.next(&buf, MAX_CHECK_REPLY)? {
                    let reply = parse_frame(&buf[..used])?;
                    buf.drain(..used);
                    break reply;
                }
                if r.read_buf(&mut buf).await? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
            };
            expect_ok(what, reply)?;
        }
        if !buf.is_empty() {
            return Err(crate::transport::resp::protocol(
                "more bytes than the log-in asked for",
            ));
        }
        let shared = Arc::new(Shared {
            waiting: Mutex::new(VecDeque::new()),
            broken: AtomicBool::new(false),
            tasks: Mutex::new(Vec::with_capacity(2)),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = tokio::spawn(write_loop(w, rx, Arc::clone(&shared)));
        let reader = tokio::spawn(read_loop(r, buf, Arc::clone(&shared)));
        shared
            .tasks
            .lock()
            .extend([writer.abort_handle(), reader.abort_handle()]);
        if shared.broken.load(Ordering::Acquire) {
            // it broke before the handles were recorded
            writer.abort();
            reader.abort();
        }
        Ok(Pipe { tx, shared })
    }

    /// Closes the connection (its reply stream is in doubt: `why`), failing every caller
    /// waiting on it; the next call connects again.
    pub fn close(&self, why: &str) {
        self.shared
            .fail(&crate::transport::resp::protocol(why.to_string()));
    }

    /// True once an I/O error broke the connection: make a new one.
    pub fn is_broken(&self) -> bool {
        self.shared.broken.load(Ordering::Acquire)
    }

    /// Runs one check script call and waits for its reply until `deadline`. The call goes
    /// alone, or in a batch call with the burst's other checks of its algorithm; its reply
    /// is its own either way.
    pub async fn request(&self, call: CheckCall, deadline: Instant) -> io::Result<Reply> {
        let (reply, rx) = oneshot::channel();
        self.send(Request::Check { call, reply }, rx, deadline)
            .await
    }

    /// Sends one packed command (anything but a check) and waits for the bytes of its
    /// reply until `deadline`.
    pub async fn command(&self, packed: Vec<u8>, deadline: Instant) -> io::Result<Vec<u8>> {
        let (reply, rx) = oneshot::channel();
        self.send(Request::Command { packed, reply }, rx, deadline)
            .await
    }

    async fn send<T>(
        &self,
        request: Request,
        rx: oneshot::Receiver<io::Result<T>>,
        deadline: Instant,
    ) -> io::Result<T> {
        if self.is_broken() {
            return Err(broken());
        }
        self.tx.send(request).map_err(|_| broken())?;
        match tokio::time::timeout_at(deadline.into(), rx).await {
            Ok(r) => r.map_err(|_| broken())?,
            Err(_) => {
                // the reply may still come, or never: either way every later reply on this
                // connection could go to the wrong caller
                self.shared.fail(&io::Error::new(
                    io::ErrorKind::TimedOut,
                    "a reply did not come within its deadline",
                ));
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no reply within the deadline",
                ))
            }
        }
    }
}

/// A handle on a shard's pipelined connection that the redis crate's commands
/// run on (`query_async`): the plain commands the engine sends (block list, overrides,
/// shadow counts; script calls go through `RedisEngine::call` and `Pipe::command`). Each
/// command has the deadline of the call it belongs to.
#[derive(Clone)]
pub(crate) struct PipeConn {
    pub pipe: Arc<Pipe>,
    pub deadline: Instant,
    pub db: i64,
}

impl redis::aio::ConnectionLike for PipeConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        Box::pin(async move {
            let frame = self
                .pipe
                .command(cmd.get_packed_command(), self.deadline)
                .await?;
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
        Box::pin(async move {
            // the engine sends no pipelines; for completeness, one command at a time
            let mut out = Vec::with_capacity(count);
            for (i, c) in cmd.cmd_iter().enumerate() {
                let v = self.req_packed_command(c).await?;
                if i >= offset && out.len() < count {
                    out.push(v);
                }
            }
            Ok(out)
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

/// The checks of a burst that use one algorithm: its scripts, the calls, and their callers
/// with the tags their replies must carry.
type Group = (&'static CheckScripts, Vec<CheckCall>, Vec<(u64, Sender)>);

async fn write_loop<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<Request>,
    shared: Arc<Shared>,
) {
    let mut burst = Vec::with_capacity(64);
    let mut out = Vec::with_capacity(16 * 1024);
    // the burst's checks, by algorithm: (scripts, calls, their callers)
    let mut groups: Vec<Group> = Vec::new();
    let (mut firsts, mut shapes) = (Vec::new(), Vec::new());
    // ends when every Pipe clone is gone (dropping `w` ends the reader too) or on an error
    while rx.recv_many(&mut burst, 1024).await > 0 {
        out.clear();
        {
            // queue the callers before the bytes leave, so the reader always finds them
            let mut waiting = shared.waiting.lock();
            if shared.broken.load(Ordering::Acquire) {
                return; // the burst's callers see their senders dropped: broken
            }
            for request in burst.drain(..) {
                let (call, reply) = match request {
                    Request::Check { call, reply } => (call, reply),
                    Request::Command { packed, reply } => {
                        out.extend_from_slice(&packed);
                        waiting.push_back(Waiter::Raw(reply));
                        continue;
                    }
                };
                let g = match groups.iter().position(|g| std::ptr::eq(g.0, call.scripts)) {
                    Some(g) => g,
                    None => {
                        groups.push((call.scripts, Vec::new(), Vec::new()));
                        groups.len() - 1
                    }
                };
                groups[g].2.push((call.tag, reply));
                groups[g].1.push(call);
            }
            for (_, calls, mut senders) in groups.drain(..) {
                for chunk in calls.chunks(MAX_BATCH) {
                    pack_calls(&mut out, chunk, (&mut firsts, &mut shapes));
                    waiting.push_back(if chunk.len() == 1 {
                        let (tag, s) = senders.remove(0);
                        Waiter::One(tag, s)
                    } else {
                        Waiter::Batch(senders.drain(..chunk.len()).collect())
                    });
                }
            }
        }
        if let Err(e) = w.write_all(&out).await {
            shared.fail(&e);
            return;
        }
    }
}

async fn read_loop<R: AsyncRead + Unpin>(mut r: R, mut buf: Vec<u8>, shared: Arc<Shared>) {
    let mut framer = Framer::default();
    let mut pos = 0;
    loop {
        loop {
            // the bound of the reply in front: that of the caller waiting for it
            // (the guard must go before `fail`, which takes the same lock: as the scrutinee
            // of the match it lived through every arm, and bytes nobody asked for, such as a
            // server's `-ERR max number of clients reached` on connect, deadlocked the I/O
            // thread)
            let front = shared.waiting.lock().front().map(|w| w.max_reply());
            let max = match front {
                Some(max) => max,
                None if pos == buf.len() => break,
                None => {
                    shared.fail(&io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a reply nobody asked for",
                    ));
                    return;
                }
            };
            match framer.next(&buf[pos..], max) {
                Ok(Some(used)) => {
                    let frame = &buf[pos..pos + used];
                    pos += used;
                    // the front waiter is still there: only this task pops, and a failure
                    // (which takes them all) ends this task
                    let Some(w) = shared.waiting.lock().pop_front() else {
                        return;
                    };
                    if let Err(e) = w.answer_frame(frame) {
                        shared.fail(&e);
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    shared.fail(&e);
                    return;
                }
            }
        }
        buf.drain(..pos);
        pos = 0;
        if buf.is_empty() && buf.capacity() > 1 << 20 {
            buf.shrink_to(16 * 1024); // after a large reply
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        match r.read_buf(&mut buf).await {
            Ok(0) => {
                shared.fail(&io::ErrorKind::UnexpectedEof.into());
                return;
            }
            Ok(_) => {}
            Err(e) => {
                shared.fail(&e);
                return;
            }
        }
    }
}
