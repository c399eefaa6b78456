//! A pipelined connection for the async check path.
//!
//! Checks are the hot path of every event-loop binding. They go over this small RESP2
//! connection instead of the redis crate's multiplexed one: a writer task sends every
//! command queued since its last write in one write, a reader task parses replies with the
//! same parser as the blocking connections (`blocking::parse`) and hands each to the
//! oldest waiting caller. Both tasks live on the limiter's I/O runtime. Any I/O error
//! breaks the connection: every caller waiting on it gets the error, and the next check
//! connects again. A caller that gave up (deadline) leaves its slot in the queue, so later
//! replies still reach their own callers.

use crate::blocking::{expect_ok, parse, Reply, Target};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

type Waiter = oneshot::Sender<io::Result<Reply>>;

struct Request {
    packed: Vec<u8>,
    reply: Waiter,
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
            let _ = w.send(Err(io::Error::new(e.kind(), e.to_string())));
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

    /// Sends one packed command and waits for its reply.
    pub async fn request(&self, packed: Vec<u8>) -> io::Result<Reply> {
        if self.is_broken() {
            return Err(broken());
        }
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request { packed, reply })
            .map_err(|_| broken())?;
        rx.await.map_err(|_| broken())?
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<Request>,
    shared: Arc<Shared>,
) {
    let mut batch = Vec::with_capacity(64);
    let mut out = Vec::with_capacity(16 * 1024);
    // ends when every Pipe clone is gone (dropping `w` ends the reader too) or on an error
    while rx.recv_many(&mut batch, 1024).await > 0 {
        out.clear();
        {
            // queue the callers before the bytes leave, so the reader always finds them
            let mut waiting = shared.waiting.lock();
            if shared.broken.load(Ordering::Acquire) {
                return; // the batch's callers see their senders dropped: broken
            }
            for r in batch.drain(..) {
                out.extend_from_slice(&r.packed);
                waiting.push_back(r.reply);
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
                    let _ = w.send(Ok(reply)); // the caller may have given up: fine
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
