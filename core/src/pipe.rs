//! A pipelined connection for the async check path.
//!
//! Checks are the hot path of every event-loop binding. They go over this small RESP2
//! connection instead of the redis crate's multiplexed one: a writer task sends every
//! command queued since its last write in one write, a reader task parses replies with the
//! same parser as the blocking connections (`blocking::parse`) and hands each to the
//! oldest waiting caller. Checks get one more step: the writer sends the checks of a burst
//! that use the same algorithm as one call of that algorithm's batch script
//! (`lua/main_batch.lua`), and the reader hands each caller its own element of the array
//! that call answers. Both tasks live on the limiter's I/O runtime. Any I/O error
//! breaks the connection: every caller waiting on it gets the error, and the next check
//! connects again. A caller that gave up (deadline) leaves its slot in the queue, so later
//! replies still reach their own callers.

use crate::blocking::{expect_ok, parse, Reply, Target};
use crate::scripts::CheckScripts;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

type Sender = oneshot::Sender<io::Result<Reply>>;

/// The most checks one batch call carries: bounds how long one script call holds Redis.
const MAX_BATCH: usize = 128;

/// A check's keys, its own arguments and its policy's arguments (lua/main_check.lua).
const KEYS: usize = 3;
const ITEM_ARGS: usize = 4;
const SHAPE_ARGS: usize = 8;

/// One check script call, in parts the writer can put into a single or a batch call.
pub(crate) struct CheckCall {
    /// the check's algorithm's scripts
    scripts: &'static CheckScripts,
    /// the server lost the scripts (NOSCRIPT): send the source (EVAL), which loads it
    eval: bool,
    /// packed (`$<len>\r\n<arg>\r\n` each): the keys, the check's own arguments from
    /// `item_at`, its policy's from `shape_at`
    packed: Vec<u8>,
    item_at: usize,
    shape_at: usize,
}

impl CheckCall {
    /// The call of `cmd`, a check's `EVALSHA <sha> 3 <keys> <item args> <shape args>` (the
    /// order of lua/main_check.lua).
    pub fn from_cmd(scripts: &'static CheckScripts, eval: bool, cmd: &redis::Cmd) -> CheckCall {
        let mut packed = Vec::with_capacity(cmd.args_iter().len() * 24);
        let (mut item_at, mut shape_at) = (0, 0);
        // after EVALSHA, the SHA1 and the number of keys
        for (i, a) in cmd.args_iter().skip(3).enumerate() {
            if i == KEYS {
                item_at = packed.len();
            } else if i == KEYS + ITEM_ARGS {
                shape_at = packed.len();
            }
            if let redis::Arg::Simple(a) = a {
                bulk(&mut packed, a);
            }
        }
        debug_assert_eq!(cmd.args_iter().len(), 3 + KEYS + ITEM_ARGS + SHAPE_ARGS);
        CheckCall {
            scripts,
            eval,
            packed,
            item_at,
            shape_at,
        }
    }

    fn shape(&self) -> &[u8] {
        &self.packed[self.shape_at..]
    }
}

struct Request {
    call: CheckCall,
    reply: Sender,
}

/// Who waits for the next reply: one caller, or the callers of one batch call in order.
enum Waiter {
    One(Sender),
    Batch(Vec<Sender>),
}

impl Waiter {
    fn fail(self, e: &io::Error) {
        let err = || Err(io::Error::new(e.kind(), e.to_string()));
        match self {
            Waiter::One(s) => {
                let _ = s.send(err());
            }
            Waiter::Batch(senders) => {
                for s in senders {
                    let _ = s.send(err());
                }
            }
        }
    }

    /// Hands the reply to its caller(s); the callers may have given up: fine.
    fn answer(self, reply: Reply) {
        match self {
            Waiter::One(s) => {
                let _ = s.send(Ok(reply));
            }
            Waiter::Batch(senders) => match reply {
                Reply::Array(items) if items.len() == senders.len() => {
                    for (s, r) in senders.into_iter().zip(items) {
                        let _ = s.send(Ok(r));
                    }
                }
                // the whole call failed (NOSCRIPT, OOM, ...): every check gets its error
                Reply::Error(e) => {
                    for s in senders {
                        let _ = s.send(Ok(Reply::Error(e.clone())));
                    }
                }
                other => {
                    let e = format!(
                        "a batch of {} checks got the reply {other:?}",
                        senders.len()
                    );
                    for s in senders {
                        let _ = s.send(Ok(Reply::Error(e.clone())));
                    }
                }
            },
        }
    }
}

struct Shared {
    waiting: Mutex<VecDeque<Waiter>>,
    broken: AtomicBool,
}

impl Shared {
    /// Marks the connection broken and fails every caller still waiting on it.
    fn fail(&self, e: &io::Error) {
        self.broken.store(true, Ordering::Release);
        let waiting = std::mem::take(&mut *self.waiting.lock());
        for w in waiting {
            w.fail(e);
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
        for (what, packed) in target.handshake() {
            w.write_all(&packed).await?;
            let reply = loop {
                if let Some((reply, used)) = parse(&buf)? {
                    buf.drain(..used);
                    break reply;
                }
                if r.read_buf(&mut buf).await? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
            };
            expect_ok(what, reply)?;
        }
        let shared = Arc::new(Shared {
            waiting: Mutex::new(VecDeque::new()),
            broken: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(w, rx, Arc::clone(&shared)));
        tokio::spawn(read_loop(r, buf, Arc::clone(&shared)));
        Ok(Pipe { tx, shared })
    }

    /// True once an I/O error broke the connection: make a new one.
    pub fn is_broken(&self) -> bool {
        self.shared.broken.load(Ordering::Acquire)
    }

    /// Runs one check script call and waits for its reply. The call goes alone, or in a
    /// batch call with the burst's other checks of its algorithm; its reply is its own
    /// either way.
    pub async fn request(&self, call: CheckCall) -> io::Result<Reply> {
        if self.is_broken() {
            return Err(broken());
        }
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request { call, reply })
            .map_err(|_| broken())?;
        rx.await.map_err(|_| broken())?
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
/// policy argument set sent once (lua/main_batch.lua); EVAL of the source when one of them
/// saw NOSCRIPT.
fn pack_calls(out: &mut Vec<u8>, calls: &[CheckCall], scratch: (&mut Vec<usize>, &mut Vec<usize>)) {
    let first = &calls[0];
    let eval = calls.iter().any(|c| c.eval);
    let (op, script): (&[u8], &str) = match (calls.len() > 1, eval) {
        (false, false) => (b"EVALSHA", first.scripts.single_sha),
        (false, true) => (b"EVAL", first.scripts.single_src),
        (true, false) => (b"EVALSHA", first.scripts.batch_sha),
        (true, true) => (b"EVAL", first.scripts.batch_src),
    };
    if calls.len() == 1 {
        header(out, 3 + KEYS + ITEM_ARGS + SHAPE_ARGS);
        bulk(out, op);
        bulk(out, script.as_bytes());
        bulk(out, b"3");
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
        3 + KEYS * n + 1 + SHAPE_ARGS * firsts.len() + (ITEM_ARGS + 1) * n,
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
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<Request>,
    shared: Arc<Shared>,
) {
    let mut burst = Vec::with_capacity(64);
    let mut out = Vec::with_capacity(16 * 1024);
    // the burst's checks, by algorithm: (scripts, calls, their callers)
    let mut groups: Vec<(&'static CheckScripts, Vec<CheckCall>, Vec<Sender>)> = Vec::new();
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
            for Request { call, reply } in burst.drain(..) {
                let g = match groups.iter().position(|g| std::ptr::eq(g.0, call.scripts)) {
                    Some(g) => g,
                    None => {
                        groups.push((call.scripts, Vec::new(), Vec::new()));
                        groups.len() - 1
                    }
                };
                groups[g].1.push(call);
                groups[g].2.push(reply);
            }
            for (_, calls, mut senders) in groups.drain(..) {
                for chunk in calls.chunks(MAX_BATCH) {
                    pack_calls(&mut out, chunk, (&mut firsts, &mut shapes));
                    waiting.push_back(if chunk.len() == 1 {
                        Waiter::One(senders.remove(0))
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
    let mut pos = 0;
    loop {
        loop {
            match parse(&buf[pos..]) {
                Ok(Some((reply, used))) => {
                    pos += used;
                    let Some(w) = shared.waiting.lock().pop_front() else {
                        shared.fail(&io::Error::new(
                            io::ErrorKind::InvalidData,
                            "a reply nobody asked for",
                        ));
                        return;
                    };
                    w.answer(reply);
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
