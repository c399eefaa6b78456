//! The connection of a standalone shard as a state machine with no I/O and no threads
//! (sans-I/O, as rustls and quinn-proto separate protocol from I/O). Every core transport
//! that speaks to a standalone shard drives it: the I/O runtime's pipe
//! ([`crate::transport::pipe`]) and the hosts' own event loops (Node's `net.Socket`, Python's
//! asyncio, Go's goroutines). The host moves the bytes and tells the machine what happened;
//! the machine says what to write, which call each reply answers, and when it must be told
//! the time again.
//!
//! What exists once, here: a burst's checks are packed by [`pack_calls`] (one batch script
//! call per algorithm, at most [`MAX_BATCH`] checks each), replies are framed by [`Framer`]
//! under the bounds of [`crate::transport::resp`], split by [`split_batch`] and taken only by
//! the call whose tag they carry ([`untag`]). A NOSCRIPT reply sends the check again as
//! EVAL of the source (which loads the script). The same doubts close the connection: a
//! reply outside the bounds, one nobody asked for, one carrying another call's tag, and a
//! silent shard. Then every call on it fails (the machine is [`SansIo::is_down`]: the host
//! closes its socket and connects again).
//!
//! # When a call fails for lack of an answer
//!
//! Only when the shard is failing, never because the host is busy:
//! - the connect and log-in (AUTH, SELECT) take longer than `timeout`, counted from
//!   [`SansIo::connecting`];
//! - the shard is *silent*: at least one request was handed out by
//!   [`SansIo::poll_transmit`] and no reply came back for `timeout`, counted from the later
//!   of the hand-out of the oldest request still unanswered and the last progress: a whole
//!   reply, or [`PROGRESS_BYTES`] of one. A healthy Redis working through a long pipeline
//!   keeps replying, so it is never silent; a server that drips a reply a byte at a time
//!   is (one byte does not hold a call for the 1 MiB its reply may take).
//!
//! A call still queued in the machine (submitted, not handed out yet) has no deadline: the
//! time it waits for the host to write is the host's, not the shard's. The queue is bounded
//! (`max_queue` calls submitted and not answered, per connection): a call beyond it is
//! refused at once with an [`Overloaded`] error, never queued.
//!
//! # The host's part, in order
//!
//! [`SansIo::connecting`] when it starts to connect (calls submitted before fail at once:
//! nobody is connecting), [`SansIo::connected`] when the socket is open (the machine logs in
//! first), then after any call [`SansIo::poll_transmit`] to get the bytes to write (write
//! them at once: the silence clock of those requests starts there), [`SansIo::handle_input`]
//! with every chunk read, [`SansIo::handle_timeout`] when [`SansIo::next_deadline`] is due,
//! and [`SansIo::handle_closed`] when the socket closed or failed.
//!
//! **Before [`SansIo::handle_timeout`], the host hands the machine every byte its socket
//! already holds** (a non-blocking read until it would block). A process starved of CPU
//! wakes late: its timer and the replies that came meanwhile are both due, and the replies
//! must win, or a healthy shard is declared silent because this process was slow. A host
//! that knows its socket holds bytes it cannot read yet says so with [`SansIo::heard`]
//! instead.

use crate::transport::batch::{
    is_compact, pack_calls, split_batch, untag, CheckCall, MAX_BATCH, NOT_THEIRS,
};
use crate::transport::resp::{parse_frame, protocol, Framer, Reply, MAX_CHECK_REPLY, MAX_REPLY};
use crate::transport::{expect_ok, Overloaded};
use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

/// A call's reply (or why there is none), for the call the host submitted as `id`. A
/// check's reply is parsed, its tag taken off; a command's ([`SansIo::submit_command`]) is
/// its whole frame, unparsed, as [`Reply::Str`] (the caller parses it).
#[derive(Debug)]
pub(crate) struct Completion {
    pub id: u64,
    pub reply: io::Result<Reply>,
}

/// A check submitted and not answered yet.
struct Call {
    id: u64,
    call: CheckCall,
}

/// A request submitted and not handed out yet.
enum Queued {
    Check(Call),
    /// any other command, packed, with the longest reply it may get
    Command(u64, Vec<u8>, usize),
}

/// What the next reply answers.
enum Expect {
    /// a handshake command (AUTH, SELECT): +OK
    Login(&'static str),
    One(Call),
    Batch(Vec<Call>),
    /// a command's: its frame, up to a length
    Command(u64, usize),
}

impl Expect {
    /// The longest reply it may get.
    fn max_reply(&self) -> usize {
        match self {
            Expect::Command(_, max) => *max,
            _ => MAX_CHECK_REPLY,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// no socket, and the host is not connecting
    Down,
    /// the host is connecting (calls wait)
    Connecting,
    /// connected, the handshake's replies are not all in (calls wait)
    LoggingIn,
    Ready,
}

/// One shard's connection, driven by the host.
pub(crate) struct SansIo {
    handshake: Vec<(&'static str, Vec<u8>)>,
    /// how long a connect may take, and a shard be silent
    timeout: Duration,
    /// the most calls submitted and not answered
    max_queue: usize,
    state: State,
    /// until when the connect and handshake may take
    connect_deadline: Option<Instant>,
    /// submitted, not handed out yet
    queued: VecDeque<Queued>,
    /// handed out, in the order their replies come, each with when it was handed out
    waiting: VecDeque<(Instant, Expect)>,
    /// calls submitted and not completed (queued or waiting)
    calls: usize,
    /// how many of `waiting`'s last entries the last transmit handed out, until the host
    /// says they are written ([`SansIo::written`])
    unwritten: usize,
    /// when the last progress came: a whole reply, or [`PROGRESS_BYTES`] of one
    last_input: Option<Instant>,
    /// bytes received since `last_input` that completed no reply
    unprogressed: usize,
    /// Why the connection last closed ([`SansIo::down_why`]), until it connects again.
    down_why: Option<String>,
    /// bytes read and not framed yet
    buf: Vec<u8>,
    framer: Framer,
    /// bytes to write
    out: Vec<u8>,
    scratch: (Vec<usize>, Vec<usize>),
}

fn broken(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, msg.to_string())
}

/// The same error for every call an error fails (io::Error is not Clone).
fn copy(e: &io::Error) -> io::Error {
    match e.get_ref().and_then(|i| i.downcast_ref::<Overloaded>()) {
        Some(o) => io::Error::other(o.clone()),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

/// How many bytes of a reply not yet whole count as progress: the silence of
/// [`SansIo::next_deadline`] starts again at a whole reply or at this many bytes, so a
/// reply dripped a byte at a time fails at the deadline, and one that never ends within
/// `timeout * MAX_REPLY / PROGRESS_BYTES` (16 deadlines for a check's 1 MiB).
pub(crate) const PROGRESS_BYTES: usize = 64 * 1024;

/// The error of a shard that sent no reply for `timeout` while requests were out.
pub(crate) fn silent(timeout: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "Redis sent nothing for {} ms while a request was waiting for its reply \
             (not a reply, nor {} KiB of one)",
            timeout.as_millis(),
            PROGRESS_BYTES / 1024
        ),
    )
}

fn connect_timed_out(timeout: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("connect timed out ({} ms)", timeout.as_millis()),
    )
}

impl SansIo {
    /// A connection that logs in with `handshake` (see `Target::handshake`), fails a
    /// connect or a silence longer than `timeout`, and takes at most `max_queue` calls at
    /// once.
    pub fn new(
        handshake: Vec<(&'static str, Vec<u8>)>,
        timeout: Duration,
        max_queue: usize,
    ) -> SansIo {
        SansIo {
            handshake,
            timeout,
            max_queue: max_queue.max(1),
            state: State::Down,
            connect_deadline: None,
            queued: VecDeque::new(),
            waiting: VecDeque::new(),
            calls: 0,
            unwritten: 0,
            last_input: None,
            unprogressed: 0,
            down_why: None,
            buf: Vec::new(),
            framer: Framer::default(),
            out: Vec::new(),
            scratch: (Vec::new(), Vec::new()),
        }
    }

    /// True when the connection is closed or must be: the host closes its socket (if it
    /// has one) and connects again.
    pub fn is_down(&self) -> bool {
        self.state == State::Down
    }

    /// Why the connection closed, while it is down (`None` before it ever connected): a
    /// call that finds it closed fails with the cause (a TLS alert the server sent after
    /// the handshake, say), not only with the fact.
    pub fn down_why(&self) -> Option<&str> {
        self.down_why.as_deref()
    }

    /// The host starts to connect, `now`: the connect and the log-in must be done within
    /// the timeout.
    pub fn connecting(&mut self, now: Instant) {
        if self.state == State::Down {
            self.state = State::Connecting;
            self.connect_deadline = Some(now + self.timeout);
            self.buf.clear();
            self.framer = Framer::default();
            self.out.clear();
            self.last_input = None;
            self.unprogressed = 0;
            self.down_why = None;
        } else if self.state == State::Connecting {
            // again before the socket is open: the host's connect starts only now (its
            // task waited for a busy event loop), and the connect's clock with it
            self.connect_deadline = Some(now + self.timeout);
        }
    }

    /// The host's socket is open: the log-in goes first.
    pub fn connected(&mut self) {
        if self.state != State::Connecting {
            return;
        }
        if self.handshake.is_empty() {
            self.state = State::Ready;
            self.connect_deadline = None;
            return;
        }
        self.state = State::LoggingIn;
        for (_, packed) in &self.handshake {
            self.out.extend_from_slice(packed);
        }
        // (handed out with the next transmit; the connect deadline covers them)
        let logins: Vec<&'static str> = self.handshake.iter().map(|(w, _)| *w).collect();
        let at = self.connect_deadline.unwrap_or_else(Instant::now);
        for what in logins {
            self.waiting.push_back((at, Expect::Login(what)));
        }
    }

    fn admit(&mut self) -> io::Result<()> {
        if self.state == State::Down {
            return Err(broken("not connected to Redis (reconnecting)"));
        }
        if self.calls >= self.max_queue {
            return Err(io::Error::other(Overloaded {
                max_queue: self.max_queue,
            }));
        }
        self.calls += 1;
        Ok(())
    }

    /// Queues a check, answered by a [`Completion`] with `id`. `Err` at once when no
    /// connection is made or being made, or when `max_queue` calls wait already
    /// ([`Overloaded`]).
    pub fn submit(&mut self, id: u64, call: CheckCall) -> io::Result<()> {
        self.admit()?;
        self.queued.push_back(Queued::Check(Call { id, call }));
        Ok(())
    }

    /// Queues any other command (packed), answered by a [`Completion`] with `id` whose
    /// reply is the command's frame (up to [`MAX_REPLY`] bytes). `Err` as
    /// [`SansIo::submit`].
    pub fn submit_command(&mut self, id: u64, packed: Vec<u8>) -> io::Result<()> {
        self.submit_bounded(id, packed, MAX_REPLY)
    }

    /// [`SansIo::submit_command`] for a command whose reply may be at most `max_reply`
    /// bytes (a script call sent as a command: a check's bound, [`MAX_CHECK_REPLY`]).
    pub fn submit_bounded(&mut self, id: u64, packed: Vec<u8>, max_reply: usize) -> io::Result<()> {
        self.admit()?;
        self.queued
            .push_back(Queued::Command(id, packed, max_reply.min(MAX_REPLY)));
        Ok(())
    }

    /// True when [`SansIo::poll_transmit`] has bytes to hand out: after a submit, and after
    /// an input that sends a check again (NOSCRIPT) or completes the log-in while checks
    /// wait. A host that writes only when it submitted asks this after every input.
    pub fn wants_transmit(&self) -> bool {
        !self.out.is_empty() || (self.state == State::Ready && !self.queued.is_empty())
    }

    /// The bytes to write now, if any: the log-in, or every request queued since the last
    /// write, a burst's checks of one algorithm packed into one batch call. The host writes
    /// them at once: their silence clock starts at `now`.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Vec<u8>> {
        if self.state == State::Ready && !self.queued.is_empty() {
            let before = self.waiting.len();
            self.pack(now);
            self.unwritten = self.waiting.len() - before;
        }
        if self.out.is_empty() {
            None
        } else {
            Some(std::mem::take(&mut self.out))
        }
    }

    /// Gives back the buffer of a [`SansIo::poll_transmit`] once it is written, so that the
    /// next hand-out reuses its memory instead of growing a new one. Optional.
    pub fn recycle(&mut self, mut buf: Vec<u8>) {
        // (a burst's large buffer is let go: the next may be one check)
        if self.out.is_empty() && buf.capacity() <= 64 * 1024 {
            buf.clear();
            self.out = buf;
        }
    }

    /// The bytes of the last [`SansIo::poll_transmit`] that handed out requests are written
    /// (or being written), `now`: the silence of those requests counts from then, not from
    /// the hand-out (packing a large burst, and writing it, take time that is the host's).
    /// Optional; it only ever moves their start later.
    pub fn written(&mut self, now: Instant) {
        let n = self.unwritten.min(self.waiting.len());
        let from = self.waiting.len() - n;
        for (at, _) in self.waiting.iter_mut().skip(from) {
            if *at < now {
                *at = now;
            }
        }
    }

    fn pack(&mut self, now: Instant) {
        // one check alone (sequential callers: every burst is one): no grouping to do
        if self.queued.len() == 1 && matches!(self.queued.front(), Some(Queued::Check(_))) {
            if let Some(Queued::Check(c)) = self.queued.pop_front() {
                let (firsts, shapes) = &mut self.scratch;
                pack_calls(
                    &mut self.out,
                    std::slice::from_ref(&c.call),
                    (firsts, shapes),
                );
                self.waiting.push_back((now, Expect::One(c)));
            }
            return;
        }
        // the burst's commands in their order; its checks by algorithm, in the order they
        // came
        let mut checks: Vec<Call> = Vec::with_capacity(self.queued.len());
        for q in std::mem::take(&mut self.queued) {
            match q {
                Queued::Check(c) => checks.push(c),
                Queued::Command(id, packed, max) => {
                    self.out.extend_from_slice(&packed);
                    self.waiting.push_back((now, Expect::Command(id, max)));
                }
            }
        }
        while !checks.is_empty() {
            let scripts = checks[0].call.scripts;
            let (group, rest): (Vec<Call>, Vec<Call>) = checks
                .into_iter()
                .partition(|c| std::ptr::eq(c.call.scripts, scripts));
            checks = rest;
            let mut group = group.into_iter().peekable();
            while group.peek().is_some() {
                let chunk: Vec<Call> = group.by_ref().take(MAX_BATCH).collect();
                self.pack_chunk(now, chunk);
            }
        }
    }

    fn pack_chunk(&mut self, now: Instant, mut chunk: Vec<Call>) {
        // pack_calls takes the calls themselves: lend them and take them back
        let mut calls: Vec<CheckCall> = Vec::with_capacity(chunk.len());
        let mut ids = Vec::with_capacity(chunk.len());
        for c in chunk.drain(..) {
            ids.push(c.id);
            calls.push(c.call);
        }
        let (firsts, shapes) = &mut self.scratch;
        pack_calls(&mut self.out, &calls, (firsts, shapes));
        let mut sent: Vec<Call> = calls
            .into_iter()
            .zip(ids)
            .map(|(call, id)| Call { id, call })
            .collect();
        self.waiting.push_back((
            now,
            if sent.len() == 1 {
                Expect::One(sent.pop().expect("one call"))
            } else {
                Expect::Batch(sent)
            },
        ));
    }

    /// Bytes the host read at `now`. Completions of the calls they answer go to `done`.
    /// Bytes that cannot be trusted close the connection ([`SansIo::is_down`]) and fail
    /// every call.
    pub fn handle_input(&mut self, now: Instant, bytes: &[u8], done: &mut Vec<Completion>) {
        if !matches!(self.state, State::LoggingIn | State::Ready) {
            return; // (a socket the machine gave up: nothing of it is read)
        }
        self.unprogressed = self.unprogressed.saturating_add(bytes.len());
        // (the buffer is taken out while its frames are answered, so no frame is copied)
        let mut buf = std::mem::take(&mut self.buf);
        buf.extend_from_slice(bytes);
        let mut pos = 0;
        while pos < buf.len() {
            let Some((_, front)) = self.waiting.front() else {
                let e = protocol("a reply nobody asked for");
                return self.fail(&e, done);
            };
            match self.framer.next(&buf[pos..], front.max_reply()) {
                Ok(Some(used)) => {
                    let frame = &buf[pos..pos + used];
                    pos += used;
                    let (at, expect) = self.waiting.pop_front().expect("a waiting call");
                    // a whole reply: progress
                    self.last_input = Some(now);
                    self.unprogressed = 0;
                    if let Err(e) = self.answer(at, expect, frame, done) {
                        return self.fail(&e, done);
                    }
                }
                Ok(None) => break,
                Err(e) => return self.fail(&e, done),
            }
        }
        buf.drain(..pos);
        if self.unprogressed >= PROGRESS_BYTES {
            self.last_input = Some(now);
            self.unprogressed = 0;
        }
        if buf.is_empty() && buf.capacity() > 1 << 20 {
            buf.shrink_to(16 * 1024); // after a large reply
        }
        self.buf = buf;
    }

    fn answer(
        &mut self,
        at: Instant,
        expect: Expect,
        frame: &[u8],
        done: &mut Vec<Completion>,
    ) -> io::Result<()> {
        if let Expect::Command(id, _) = expect {
            self.calls -= 1;
            done.push(Completion {
                id,
                reply: Ok(Reply::Str(frame.to_vec())),
            });
            return Ok(());
        }
        let reply = parse_frame(frame);
        match expect {
            Expect::Login(what) => {
                expect_ok(what, reply?)?;
                if !self.waiting.iter().any(|w| matches!(w.1, Expect::Login(_))) {
                    self.state = State::Ready;
                    self.connect_deadline = None;
                }
            }
            Expect::One(call) => {
                let r = match reply
                    .and_then(|r| untag(r, call.call.tag).map_err(|_| protocol(NOT_THEIRS)))
                {
                    Ok(r) => r,
                    Err(e) => {
                        // (the call is failed with the rest: put it back among them)
                        self.waiting.push_front((at, Expect::One(call)));
                        return Err(e);
                    }
                };
                if let Some(again) = self.complete(call, r, done) {
                    self.queued.push_front(Queued::Check(again));
                }
            }
            Expect::Batch(calls) => {
                let compact = is_compact(calls.iter().map(|c| &c.call));
                let split =
                    reply.and_then(|r| split_batch(r, calls.iter().map(|c| c.call.tag), compact));
                match split {
                    Ok(replies) => {
                        let again: Vec<Call> = calls
                            .into_iter()
                            .zip(replies)
                            .filter_map(|(call, r)| self.complete(call, r, done))
                            .collect();
                        // sent again first, in their order
                        for c in again.into_iter().rev() {
                            self.queued.push_front(Queued::Check(c));
                        }
                    }
                    Err(e) => {
                        self.waiting.push_front((at, Expect::Batch(calls)));
                        return Err(e);
                    }
                }
            }
            Expect::Command(..) => unreachable!("answered above"),
        }
        Ok(())
    }

    /// A check's own reply: its completion, or after NOSCRIPT the check to send once more,
    /// as EVAL of the source.
    fn complete(
        &mut self,
        mut call: Call,
        reply: Reply,
        done: &mut Vec<Completion>,
    ) -> Option<Call> {
        if reply.is_noscript() && !call.call.eval {
            call.call.eval = true;
            return Some(call);
        }
        self.calls -= 1;
        done.push(Completion {
            id: call.id,
            reply: Ok(reply),
        });
        None
    }

    /// Closes the connection: every call waiting or queued fails with `e`.
    fn fail(&mut self, e: &io::Error, done: &mut Vec<Completion>) {
        tracing::debug!(error = %e, "shardlimit: closing a connection");
        self.state = State::Down;
        self.down_why = Some(e.to_string());
        self.unwritten = 0;
        self.connect_deadline = None;
        self.last_input = None;
        self.unprogressed = 0;
        self.buf.clear();
        self.out.clear();
        self.framer = Framer::default();
        let mut failed = |id| {
            done.push(Completion {
                id,
                reply: Err(copy(e)),
            })
        };
        for (_, w) in self.waiting.drain(..) {
            match w {
                Expect::Login(_) => {}
                Expect::One(c) => failed(c.id),
                Expect::Batch(cs) => cs.into_iter().for_each(|c| failed(c.id)),
                Expect::Command(id, _) => failed(id),
            }
        }
        for q in self.queued.drain(..) {
            match q {
                Queued::Check(c) => failed(c.id),
                Queued::Command(id, ..) => failed(id),
            }
        }
        self.calls = 0;
    }

    /// The host's socket holds bytes it could not read yet (its runtime has not seen the
    /// socket ready since they came), `now`: they came before now, so the shard is not
    /// silent; they go to [`SansIo::handle_input`] once read.
    pub fn heard(&mut self, now: Instant) {
        if matches!(self.state, State::LoggingIn | State::Ready) {
            self.last_input = Some(now);
        }
    }

    /// The host's socket closed or failed (`why`): every call fails.
    pub fn handle_closed(&mut self, why: &str, done: &mut Vec<Completion>) {
        if self.state != State::Down || !self.queued.is_empty() {
            self.fail(&broken(why), done);
        }
    }

    /// Closes the connection at the host's word (`why`: its reply stream is in doubt):
    /// every call fails.
    pub fn close(&mut self, why: &str, done: &mut Vec<Completion>) {
        self.fail(&protocol(why.to_string()), done);
    }

    /// When the shard is silent since, if it is waited on: the later of the hand-out of
    /// the oldest request unanswered and the last byte received.
    fn silent_since(&self) -> Option<Instant> {
        if self.state != State::Ready {
            return None;
        }
        let (oldest, _) = self.waiting.front()?;
        Some(match self.last_input {
            Some(t) if t > *oldest => t,
            _ => *oldest,
        })
    }

    /// When [`SansIo::handle_timeout`] is due next: the connect's deadline, or the moment
    /// the shard will have been silent for the timeout. `None` when nothing is waited on
    /// (calls queued and not handed out have no deadline).
    pub fn next_deadline(&self) -> Option<Instant> {
        let silent = self.silent_since().map(|t| t + self.timeout);
        match (self.connect_deadline, silent) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Time is `now`. A connect and log-in not done within the timeout, or a shard silent
    /// for the timeout, closes the connection and fails every call on it (a reply may still
    /// come, or never: either way every later reply could go to the wrong call).
    ///
    /// The host first hands the machine, through [`SansIo::handle_input`], every byte its
    /// socket already holds: those bytes came before `now`, and end the silence.
    pub fn handle_timeout(&mut self, now: Instant, done: &mut Vec<Completion>) {
        if self.connect_deadline.is_some_and(|d| d <= now) {
            return self.fail(&connect_timed_out(self.timeout), done);
        }
        if self.silent_since().is_some_and(|t| t + self.timeout <= now) {
            self.fail(&silent(self.timeout), done);
        }
    }
}

#[cfg(test)]
mod tests;
