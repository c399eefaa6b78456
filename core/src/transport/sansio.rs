//! The connection of a standalone shard as a state machine with no I/O and no threads
//! (sans-I/O, as rustls and quinn-proto separate protocol from I/O): the host moves the
//! bytes on its own event loop (Node's `net.Socket` on libuv) and tells the machine what
//! happened; the machine says what to write, which call each reply answers, and when the
//! next deadline is.
//!
//! It is the pipe of [`crate::transport::pipe`] without its two tasks, and shares its
//! parts: a burst's checks are packed by [`pack_calls`] (one batch script call per
//! algorithm, at most [`MAX_BATCH`] checks each), replies are framed by [`Framer`] under
//! the same bounds, split by [`split_batch`] and taken only by the call whose tag they
//! carry ([`untag`]). The same doubts close the connection: a reply outside the limits,
//! one nobody asked for, one carrying another call's tag, and a call whose deadline
//! passed before its reply came. Then every call waiting on it fails (the machine is
//! [`SansIo::is_down`]: the host closes its socket and connects again). A NOSCRIPT reply
//! sends the check again as EVAL of the source (which loads the script), within the
//! call's deadline.
//!
//! The host's part, in order: [`SansIo::connecting`] when it starts to connect (checks
//! submitted until then fail at once: nobody is connecting), [`SansIo::connected`] when
//! the socket is open (the machine logs in first: AUTH, SELECT), then after any call
//! [`SansIo::poll_transmit`] to get the bytes to write, [`SansIo::handle_input`] with
//! every chunk read, [`SansIo::handle_timeout`] when [`SansIo::next_deadline`] is due,
//! and [`SansIo::handle_closed`] when the socket closed or failed.

use crate::transport::batch::{pack_calls, split_batch, untag, CheckCall, MAX_BATCH, NOT_THEIRS};
use crate::transport::blocking::expect_ok;
use crate::transport::resp::{parse_frame, protocol, Framer, Reply, MAX_CHECK_REPLY};
use std::collections::VecDeque;
use std::io;
use std::time::Instant;

/// A call's reply (or why there is none), for the call the host submitted as `id`.
#[derive(Debug)]
pub(crate) struct Completion {
    pub id: u64,
    pub reply: io::Result<Reply>,
}

/// A check submitted and not answered yet.
struct Call {
    id: u64,
    call: CheckCall,
    deadline: Instant,
}

/// What the next reply answers.
enum Expect {
    /// a handshake command (AUTH, SELECT): +OK
    Login(&'static str),
    One(Call),
    Batch(Vec<Call>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// no socket, and the host is not connecting
    Down,
    /// the host is connecting (checks wait)
    Connecting,
    /// connected, the handshake's replies are not all in (checks wait)
    LoggingIn,
    Ready,
}

/// One shard's connection, driven by the host.
pub(crate) struct SansIo {
    handshake: Vec<(&'static str, Vec<u8>)>,
    state: State,
    /// until when the connect and handshake may take
    connect_deadline: Option<Instant>,
    /// submitted, not written yet
    queued: VecDeque<Call>,
    /// written, in the order their replies come
    waiting: VecDeque<Expect>,
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
    io::Error::new(e.kind(), e.to_string())
}

impl SansIo {
    /// A connection that logs in with `handshake` (see `Target::handshake`).
    pub fn new(handshake: Vec<(&'static str, Vec<u8>)>) -> SansIo {
        SansIo {
            handshake,
            state: State::Down,
            connect_deadline: None,
            queued: VecDeque::new(),
            waiting: VecDeque::new(),
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

    /// The host starts to connect; the connect and the log-in must be done by `deadline`.
    pub fn connecting(&mut self, deadline: Instant) {
        if self.state == State::Down {
            self.state = State::Connecting;
            self.connect_deadline = Some(deadline);
            self.buf.clear();
            self.framer = Framer::default();
            self.out.clear();
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
        for (what, packed) in &self.handshake {
            self.out.extend_from_slice(packed);
            self.waiting.push_back(Expect::Login(what));
        }
    }

    /// Queues a check, answered by a [`Completion`] with `id` by `deadline` at the latest.
    /// `Err` at once when no connection is made or being made.
    pub fn submit(&mut self, id: u64, call: CheckCall, deadline: Instant) -> io::Result<()> {
        if self.state == State::Down {
            return Err(broken("not connected to Redis (reconnecting)"));
        }
        self.queued.push_back(Call { id, call, deadline });
        Ok(())
    }

    /// The bytes to write now, if any: the log-in, or every check queued since the last
    /// write, a burst's checks of one algorithm packed into one batch call.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        if self.state == State::Ready && !self.queued.is_empty() {
            self.pack();
        }
        if self.out.is_empty() {
            None
        } else {
            Some(std::mem::take(&mut self.out))
        }
    }

    fn pack(&mut self) {
        // the burst's checks, by algorithm, in the order they came (as the pipe's writer)
        let mut calls: Vec<Call> = self.queued.drain(..).collect();
        while !calls.is_empty() {
            let scripts = calls[0].call.scripts;
            let (group, rest): (Vec<Call>, Vec<Call>) = calls
                .into_iter()
                .partition(|c| std::ptr::eq(c.call.scripts, scripts));
            calls = rest;
            let mut group = group.into_iter().peekable();
            while group.peek().is_some() {
                let chunk: Vec<Call> = group.by_ref().take(MAX_BATCH).collect();
                self.pack_chunk(chunk);
            }
        }
    }

    fn pack_chunk(&mut self, mut chunk: Vec<Call>) {
        // pack_calls takes the calls themselves: lend them and take them back
        let mut calls: Vec<CheckCall> = Vec::with_capacity(chunk.len());
        let mut meta = Vec::with_capacity(chunk.len());
        for c in chunk.drain(..) {
            meta.push((c.id, c.deadline));
            calls.push(c.call);
        }
        let (firsts, shapes) = &mut self.scratch;
        pack_calls(&mut self.out, &calls, (firsts, shapes));
        let mut sent: Vec<Call> = calls
            .into_iter()
            .zip(meta)
            .map(|(call, (id, deadline))| Call { id, call, deadline })
            .collect();
        self.waiting.push_back(if sent.len() == 1 {
            Expect::One(sent.pop().expect("one call"))
        } else {
            Expect::Batch(sent)
        });
    }

    /// Bytes the host read. Completions of the calls they answer go to `done`. Bytes that
    /// cannot be trusted close the connection ([`SansIo::is_down`]) and fail every call.
    pub fn handle_input(&mut self, bytes: &[u8], done: &mut Vec<Completion>) {
        if !matches!(self.state, State::LoggingIn | State::Ready) {
            return; // (a socket the machine gave up: nothing of it is read)
        }
        // (the buffer is taken out while its frames are answered, so no frame is copied)
        let mut buf = std::mem::take(&mut self.buf);
        buf.extend_from_slice(bytes);
        let mut pos = 0;
        while pos < buf.len() {
            if self.waiting.is_empty() {
                let e = protocol("a reply nobody asked for");
                return self.fail(&e, done);
            }
            match self.framer.next(&buf[pos..], MAX_CHECK_REPLY) {
                Ok(Some(used)) => {
                    let frame = &buf[pos..pos + used];
                    pos += used;
                    let expect = self.waiting.pop_front().expect("a waiting call");
                    if let Err(e) = self.answer(expect, frame, done) {
                        return self.fail(&e, done);
                    }
                }
                Ok(None) => break,
                Err(e) => return self.fail(&e, done),
            }
        }
        buf.drain(..pos);
        if buf.is_empty() && buf.capacity() > 1 << 20 {
            buf.shrink_to(16 * 1024); // after a large reply
        }
        self.buf = buf;
    }

    fn answer(
        &mut self,
        expect: Expect,
        frame: &[u8],
        done: &mut Vec<Completion>,
    ) -> io::Result<()> {
        let reply = parse_frame(frame);
        match expect {
            Expect::Login(what) => {
                expect_ok(what, reply?)?;
                if !self.waiting.iter().any(|w| matches!(w, Expect::Login(_))) {
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
                        self.waiting.push_front(Expect::One(call));
                        return Err(e);
                    }
                };
                if let Some(again) = complete(call, r, done) {
                    self.queued.push_front(again);
                }
            }
            Expect::Batch(calls) => {
                let split = reply.and_then(|r| split_batch(r, calls.iter().map(|c| c.call.tag)));
                match split {
                    Ok(replies) => {
                        let again: Vec<Call> = calls
                            .into_iter()
                            .zip(replies)
                            .filter_map(|(call, r)| complete(call, r, done))
                            .collect();
                        // sent again first, in their order
                        for c in again.into_iter().rev() {
                            self.queued.push_front(c);
                        }
                    }
                    Err(e) => {
                        self.waiting.push_front(Expect::Batch(calls));
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// Closes the connection: every call waiting or queued fails with `e`.
    fn fail(&mut self, e: &io::Error, done: &mut Vec<Completion>) {
        tracing::debug!(error = %e, "shardlimit: closing a host-driven connection");
        self.state = State::Down;
        self.connect_deadline = None;
        self.buf.clear();
        self.out.clear();
        self.framer = Framer::default();
        for w in self.waiting.drain(..) {
            let calls = match w {
                Expect::Login(_) => continue,
                Expect::One(c) => vec![c],
                Expect::Batch(cs) => cs,
            };
            for c in calls {
                done.push(Completion {
                    id: c.id,
                    reply: Err(copy(e)),
                });
            }
        }
        for c in self.queued.drain(..) {
            done.push(Completion {
                id: c.id,
                reply: Err(copy(e)),
            });
        }
    }

    /// The host's socket closed or failed (`why`): every call fails.
    pub fn handle_closed(&mut self, why: &str, done: &mut Vec<Completion>) {
        if self.state != State::Down || !self.queued.is_empty() {
            self.fail(&broken(why), done);
        }
    }

    /// The earliest deadline of a call or of the connect: call
    /// [`SansIo::handle_timeout`] then.
    pub fn next_deadline(&self) -> Option<Instant> {
        let waiting = self.waiting.iter().flat_map(|w| match w {
            Expect::Login(_) => None,
            Expect::One(c) => Some(c.deadline),
            Expect::Batch(cs) => cs.iter().map(|c| c.deadline).min(),
        });
        self.queued
            .iter()
            .map(|c| c.deadline)
            .chain(waiting)
            .chain(self.connect_deadline)
            .min()
    }

    /// Time is `now`: a call sent and not answered by its deadline closes the connection
    /// (its reply may still come, or never: either way every later reply could go to the
    /// wrong call), and fails every call on it; a connect not done by its deadline too. A
    /// call not sent yet fails alone.
    pub fn handle_timeout(&mut self, now: Instant, done: &mut Vec<Completion>) {
        if self.connect_deadline.is_some_and(|d| d <= now) {
            let e = io::Error::new(io::ErrorKind::TimedOut, "connect timed out");
            return self.fail(&e, done);
        }
        let late = self.waiting.iter().any(|w| match w {
            Expect::Login(_) => false,
            Expect::One(c) => c.deadline <= now,
            Expect::Batch(cs) => cs.iter().any(|c| c.deadline <= now),
        });
        if late {
            let e = io::Error::new(io::ErrorKind::TimedOut, "no reply within the deadline");
            return self.fail(&e, done);
        }
        if self.queued.iter().any(|c| c.deadline <= now) {
            let mut keep = VecDeque::with_capacity(self.queued.len());
            for c in self.queued.drain(..) {
                if c.deadline <= now {
                    done.push(Completion {
                        id: c.id,
                        reply: Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "no reply within the deadline",
                        )),
                    });
                } else {
                    keep.push_back(c);
                }
            }
            self.queued = keep;
        }
    }
}

/// A check's own reply: its completion, or after NOSCRIPT the check to send once more,
/// as EVAL of the source.
fn complete(mut call: Call, reply: Reply, done: &mut Vec<Completion>) -> Option<Call> {
    if reply.is_noscript() && !call.call.eval {
        call.call.eval = true;
        return Some(call);
    }
    done.push(Completion {
        id: call.id,
        reply: Ok(reply),
    });
    None
}

#[cfg(test)]
mod tests;
