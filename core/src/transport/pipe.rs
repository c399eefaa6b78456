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

use crate::engine::redis::protocol::{
    CheckPart, CheckSink, CHECK_ITEM_ARGS as ITEM_ARGS, CHECK_KEYS as KEYS,
    CHECK_SHAPE_ARGS as SHAPE_ARGS, CHECK_TAG_ARGS as TAG_ARGS,
};
use crate::engine::redis::scripts::CheckScripts;
use crate::engine::redis::CheckRequest;
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

/// The most checks one batch call carries: bounds how long one script call holds Redis.
pub(crate) const MAX_BATCH: usize = 128;

/// A number no other check call of this process carries at the same time (it wraps after
/// 2^53 calls; Lua numbers hold it exactly). The check scripts echo it as the last value of
/// their reply, so a reply is taken only by the call it answers: whatever goes wrong with
/// a reply stream, no caller gets a decision made for another.
pub(crate) fn next_tag() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) & ((1 << 53) - 1)
}

/// Why a reply with another call's tag is refused (and its connection closed).
pub(crate) const NOT_THEIRS: &str = "a reply carrying another call's tag";

/// What becomes of a check's reply, given the tag of its call: the tag is taken off a
/// reply that carries it (`Ok`); a reply that carries another call's tag is `Err` (the
/// stream it came on is in doubt). Replies without a tag at the end (error replies,
/// malformed ones) pass as they are, for the caller's checks of the reply to reject.
pub(crate) fn untag(reply: Reply, tag: u64) -> Result<Reply, Reply> {
    match reply {
        Reply::Array(mut items) => match items.last() {
            Some(Reply::Int(t)) if *t as u64 == tag && *t >= 0 => {
                items.pop();
                Ok(Reply::Array(items))
            }
            Some(Reply::Int(_)) => Err(Reply::Array(items)),
            _ => Ok(Reply::Array(items)),
        },
        other => Ok(other),
    }
}

/// One check script call, in parts the writer can put into a single or a batch call.
pub(crate) struct CheckCall {
    /// the check's algorithm's scripts
    pub(crate) scripts: &'static CheckScripts,
    /// the server lost the scripts (NOSCRIPT): send the source (EVAL), which loads it
    pub(crate) eval: bool,
    /// packed (`$<len>\r\n<arg>\r\n` each): the keys, the check's own arguments from
    /// `item_at`, its policy's from `shape_at`, its tag from `tag_at`
    packed: Vec<u8>,
    item_at: usize,
    shape_at: usize,
    tag_at: usize,
    /// the tag its reply must carry
    pub(crate) tag: u64,
}

impl CheckCall {
    /// The call of `req` ([`CheckRequest::write`] lays its arguments out).
    pub fn new(
        scripts: &'static CheckScripts,
        eval: bool,
        req: &CheckRequest<'_>,
        prefix: &str,
    ) -> CheckCall {
        let mut call = CheckCall {
            scripts,
            eval,
            packed: Vec::with_capacity(192),
            item_at: 0,
            shape_at: 0,
            tag_at: 0,
            tag: req.tag,
        };
        req.write(prefix, &mut call);
        call
    }

    fn shape(&self) -> &[u8] {
        &self.packed[self.shape_at..self.tag_at]
    }
}

impl CheckSink for CheckCall {
    fn arg(&mut self, a: &[u8]) {
        bulk(&mut self.packed, a);
    }
    fn mark(&mut self, part: CheckPart) {
        let at = self.packed.len();
        match part {
            CheckPart::Item => self.item_at = at,
            CheckPart::Shape => self.shape_at = at,
            CheckPart::Tag => self.tag_at = at,
        }
    }
}

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

/// The reply of one batch call, split into the replies of its checks (whose tags are
/// `tags`, in order): each element is untagged, and only if every one is its check's are
/// they handed out (`Err`: the stream is in doubt). A reply that is not an array of one
/// element per check (NOSCRIPT, OOM, anything else) becomes each check's error reply.
pub(crate) fn split_batch(
    reply: Reply,
    tags: impl ExactSizeIterator<Item = u64>,
) -> io::Result<Vec<Reply>> {
    let not_theirs = || crate::transport::resp::protocol(NOT_THEIRS);
    let n = tags.len();
    Ok(match reply {
        Reply::Array(items) if items.len() == n => {
            // every element must be its caller's before any is handed out
            let mut out = Vec::with_capacity(n);
            for (r, tag) in items.into_iter().zip(tags) {
                out.push(untag(r, tag).map_err(|_| not_theirs())?);
            }
            out
        }
        // the whole call failed (NOSCRIPT, OOM, ...): every check gets its error
        Reply::Error(e) => vec![Reply::Error(e); n],
        other => {
            let e = format!(
                "a batch of {n} checks got the reply {:?}",
                crate::transport::resp::Shown(&other)
            );
            vec![Reply::Error(e); n]
        }
    })
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

/// A handle on a shard's pipelined connection that the redis crate's commands and scripts
/// run on (`query_async`, `invoke_async`): what the engine sends besides checks. Each
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

fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(itoa::Buffer::new().format(b.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

fn header(out: &mut Vec<u8>, items: usize) {
    out.push(b'*');
    out.extend_from_slice(itoa::Buffer::new().format(items).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends the script call of `calls` (all of one algorithm) to `out`: EVALSHA of the
/// single script for one check, of the batch script for several, with each distinct
/// policy argument set sent once (core/lua/main_batch.lua); EVAL of the source when one of them
/// saw NOSCRIPT.
pub(crate) fn pack_calls(
    out: &mut Vec<u8>,
    calls: &[CheckCall],
    scratch: (&mut Vec<usize>, &mut Vec<usize>),
) {
    let first = &calls[0];
    let eval = calls.iter().any(|c| c.eval);
    let (op, script): (&[u8], &str) = match (calls.len() > 1, eval) {
        (false, false) => (b"EVALSHA", first.scripts.single_sha),
        (false, true) => (b"EVAL", first.scripts.single_src),
        (true, false) => (b"EVALSHA", first.scripts.batch_sha),
        (true, true) => (b"EVAL", first.scripts.batch_src),
    };
    if calls.len() == 1 {
        header(out, 3 + KEYS + ITEM_ARGS + SHAPE_ARGS + TAG_ARGS);
        bulk(out, op);
        bulk(out, script.as_bytes());
        bulk(out, itoa::Buffer::new().format(KEYS).as_bytes());
        out.extend_from_slice(&first.packed);
        return;
    }
    // the first call of each distinct policy argument set, and each call's set (1..=S)
    let (firsts, shapes) = scratch;
    firsts.clear();
    shapes.clear();
    for (i, c) in calls.iter().enumerate() {
        let k = match firsts.iter().position(|&j| calls[j].shape() == c.shape()) {
            Some(k) => k,
            None => {
                firsts.push(i);
                firsts.len() - 1
            }
        };
        shapes.push(k + 1);
    }
    let n = calls.len();
    header(
        out,
        3 + KEYS * n + 1 + SHAPE_ARGS * firsts.len() + (ITEM_ARGS + 1 + TAG_ARGS) * n,
    );
    bulk(out, op);
    bulk(out, script.as_bytes());
    bulk(out, itoa::Buffer::new().format(KEYS * n).as_bytes());
    for c in calls {
        out.extend_from_slice(&c.packed[..c.item_at]);
    }
    bulk(out, itoa::Buffer::new().format(firsts.len()).as_bytes());
    for &j in firsts.iter() {
        out.extend_from_slice(calls[j].shape());
    }
    for (c, shape) in calls.iter().zip(shapes.iter()) {
        out.extend_from_slice(&c.packed[c.item_at..c.shape_at]);
        bulk(out, itoa::Buffer::new().format(*shape).as_bytes());
        out.extend_from_slice(&c.packed[c.tag_at..]);
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
