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

use crate::transport::blocking::expect_ok;
use crate::transport::pipe::{pack_calls, split_batch, untag, CheckCall, MAX_BATCH, NOT_THEIRS};
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
mod tests {
    //! The machine driven with bytes alone: no socket, no thread, no clock but the one
    //! passed in.
    use super::*;
    use crate::engine::redis::scripts::check_scripts;
    use crate::engine::redis::{CheckRequest, Mode, OverrideArg};
    use crate::policy::{Limit, Policy};
    use std::time::Duration;

    fn policy() -> Policy {
        Policy::new("p", Limit::fixed_window(10, Duration::from_secs(60))).unwrap()
    }

    fn call(p: &Policy, key: &str, tag: u64) -> CheckCall {
        let req = CheckRequest {
            policy: &p.0,
            eff: &p.0.compiled,
            key,
            now_us: Some(1),
            cost: 1,
            mode: Mode::Check,
            lease: None,
            tag,
            ov: OverrideArg::Off,
        };
        CheckCall::new(check_scripts(p.0.compiled.algorithm), false, &req, "sl")
    }

    fn ready(handshake: Vec<(&'static str, Vec<u8>)>) -> SansIo {
        let mut c = SansIo::new(handshake);
        c.connecting(Instant::now() + Duration::from_secs(60));
        c.connected();
        c
    }

    /// A check's reply as the scripts give it: its values, then its tag.
    fn reply(values: &[i64], tag: u64) -> Vec<u8> {
        let mut out = format!("*{}\r\n", values.len() + 1).into_bytes();
        for v in values.iter().copied().chain([tag as i64]) {
            out.extend_from_slice(format!(":{v}\r\n").as_bytes());
        }
        out
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn nothing_is_accepted_while_nobody_connects() {
        let p = policy();
        let mut c = SansIo::new(Vec::new());
        let e = c.submit(1, call(&p, "k", 1), later()).unwrap_err();
        assert!(e.to_string().contains("not connected"), "{e}");
        assert!(c.is_down());
        assert_eq!(c.poll_transmit(), None);
    }

    #[test]
    fn logs_in_before_any_check_is_written_then_answers_by_tag() {
        let p = policy();
        let select = b"*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n".to_vec();
        let mut c = SansIo::new(vec![("SELECT", select.clone())]);
        c.connecting(later());
        c.submit(7, call(&p, "k", 70), later()).unwrap();
        assert_eq!(c.poll_transmit(), None, "nothing before the socket is open");
        c.connected();
        // a check on the wrong database would decide on another's state: it waits
        assert_eq!(c.poll_transmit().unwrap(), select);
        assert_eq!(c.poll_transmit(), None);
        let mut done = Vec::new();
        c.handle_input(b"+OK\r\n", &mut done);
        assert!(done.is_empty());
        let wire = c.poll_transmit().unwrap();
        let single = check_scripts(p.0.compiled.algorithm).single_sha;
        assert!(wire.starts_with(b"*21\r\n$7\r\nEVALSHA\r\n"), "{wire:?}");
        assert!(contains(&wire, single.as_bytes()));
        // the reply, a byte at a time
        for b in reply(&[1, 9, 5, -1, 0, 0, 1], 70) {
            c.handle_input(&[b], &mut done);
        }
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].id, 7);
        let want: Vec<Reply> = [1, 9, 5, -1, 0, 0, 1].map(Reply::Int).to_vec();
        assert_eq!(done[0].reply.as_ref().unwrap(), &Reply::Array(want));
        assert!(!c.is_down());
        assert_eq!(c.next_deadline(), None, "nothing waits");
    }

    #[test]
    fn a_failed_login_fails_the_waiting_checks_and_closes() {
        let p = policy();
        let mut c = SansIo::new(vec![("AUTH", b"*2\r\n$4\r\nAUTH\r\n$1\r\nx\r\n".to_vec())]);
        c.connecting(later());
        c.submit(1, call(&p, "k", 1), later()).unwrap();
        c.connected();
        c.poll_transmit().unwrap();
        let mut done = Vec::new();
        c.handle_input(b"-WRONGPASS invalid username-password pair\r\n", &mut done);
        assert!(c.is_down());
        let e = done[0].reply.as_ref().unwrap_err();
        assert!(e.to_string().contains("AUTH failed: WRONGPASS"), "{e}");
    }

    #[test]
    fn a_burst_is_one_batch_call_and_each_check_gets_its_own_element() {
        let p = policy();
        let mut c = ready(Vec::new());
        for i in 1..=3 {
            c.submit(i, call(&p, &format!("k{i}"), 100 + i), later())
                .unwrap();
        }
        let wire = c.poll_transmit().unwrap();
        let batch = check_scripts(p.0.compiled.algorithm).batch_sha;
        assert!(contains(&wire, batch.as_bytes()), "one batch call");
        assert_eq!(
            wire.iter().filter(|&&b| b == b'*').count(),
            1,
            "one command"
        );
        // the three replies in one array, cut in two anywhere
        let mut full = b"*3\r\n".to_vec();
        for i in 1..=3u64 {
            full.extend(reply(&[1, 10 - i as i64, 5, -1, 0, 0, 1], 100 + i));
        }
        for cut in [1, 5, full.len() / 2, full.len() - 1] {
            let mut c2 = ready(Vec::new());
            for i in 1..=3 {
                c2.submit(i, call(&p, &format!("k{i}"), 100 + i), later())
                    .unwrap();
            }
            c2.poll_transmit().unwrap();
            let mut done = Vec::new();
            c2.handle_input(&full[..cut], &mut done);
            assert!(done.is_empty(), "cut {cut}");
            c2.handle_input(&full[cut..], &mut done);
            let got: Vec<(u64, i64)> = done
                .iter()
                .map(|d| match d.reply.as_ref().unwrap() {
                    Reply::Array(v) => (
                        d.id,
                        match v[1] {
                            Reply::Int(n) => n,
                            _ => panic!(),
                        },
                    ),
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(got, vec![(1, 9), (2, 8), (3, 7)], "cut {cut}");
        }
    }

    #[test]
    fn a_reply_with_another_calls_tag_fails_every_call_and_closes() {
        let p = policy();
        let mut c = ready(Vec::new());
        c.submit(1, call(&p, "a", 11), later()).unwrap();
        c.submit(2, call(&p, "b", 12), later()).unwrap();
        c.poll_transmit().unwrap();
        c.submit(3, call(&p, "c", 13), later()).unwrap(); // queued, not sent
                                                          // the batch's elements swapped: neither may take the other's decision
        let mut swapped = b"*2\r\n".to_vec();
        swapped.extend(reply(&[1, 1, 5, -1, 0, 0, 1], 12));
        swapped.extend(reply(&[1, 2, 5, -1, 0, 0, 1], 11));
        let mut done = Vec::new();
        c.handle_input(&swapped, &mut done);
        assert!(c.is_down());
        let mut ids: Vec<u64> = done.iter().map(|d| d.id).collect();
        ids.sort();
        assert_eq!(ids, vec![1, 2, 3]);
        for d in &done {
            let e = d.reply.as_ref().unwrap_err();
            assert!(e.to_string().contains("another call's tag"), "{e}");
        }
        // and nothing more is read from that socket
        c.handle_input(&reply(&[1], 13), &mut done);
        assert_eq!(done.len(), 3);
    }

    #[test]
    fn bytes_nobody_asked_for_and_hostile_framing_close_the_connection() {
        let p = policy();
        let deep = b"*1\r\n".repeat(100_000);
        let bulk = b"$1099511627776\r\n".to_vec();
        for (what, bytes, says) in [
            (
                "unasked",
                b"-ERR max number of clients reached\r\n".to_vec(),
                "nobody asked",
            ),
            ("deep", deep, "nested deeper"),
            ("huge bulk", bulk, "over the bound"),
            ("bad type", b"%1\r\n".to_vec(), "unknown type"),
        ] {
            let mut c = ready(Vec::new());
            if what != "unasked" {
                c.submit(1, call(&p, "k", 5), later()).unwrap();
                c.poll_transmit().unwrap();
            }
            let mut done = Vec::new();
            c.handle_input(&bytes, &mut done);
            assert!(c.is_down(), "{what}");
            if what != "unasked" {
                let e = done[0].reply.as_ref().unwrap_err();
                assert!(e.to_string().contains(says), "{what}: {e}");
            }
        }
    }

    #[test]
    fn noscript_sends_the_source_and_the_check_completes() {
        let p = policy();
        let mut c = ready(Vec::new());
        c.submit(1, call(&p, "a", 21), later()).unwrap();
        c.submit(2, call(&p, "b", 22), later()).unwrap();
        c.poll_transmit().unwrap();
        let mut done = Vec::new();
        c.handle_input(b"-NOSCRIPT No matching script.\r\n", &mut done);
        assert!(done.is_empty(), "retried, not failed");
        let wire = c.poll_transmit().unwrap();
        assert!(wire.starts_with(b"*"), "{wire:?}");
        assert!(contains(&wire, b"$4\r\nEVAL\r\n"), "EVAL of the source");
        let src = check_scripts(p.0.compiled.algorithm).batch_src;
        assert!(contains(&wire, src.as_bytes()));
        let mut full = b"*2\r\n".to_vec();
        full.extend(reply(&[1, 9, 5, -1, 0, 0, 1], 21));
        full.extend(reply(&[1, 8, 5, -1, 0, 0, 1], 22));
        c.handle_input(&full, &mut done);
        assert_eq!(done.len(), 2);
        assert!(done.iter().all(|d| d.reply.is_ok()));
        // a second NOSCRIPT is the check's answer (a script error), not a loop
        c.submit(3, call(&p, "c", 23), later()).unwrap();
        c.poll_transmit().unwrap();
        c.handle_input(b"-NOSCRIPT No matching script.\r\n", &mut done);
        c.poll_transmit().unwrap();
        c.handle_input(b"-NOSCRIPT No matching script.\r\n", &mut done);
        assert!(done[2].reply.as_ref().unwrap().is_noscript());
    }

    #[test]
    fn a_late_reply_closes_the_connection_and_an_unsent_check_fails_alone() {
        let p = policy();
        let t0 = Instant::now();
        let mut c = ready(Vec::new());
        c.submit(1, call(&p, "a", 31), t0 + Duration::from_millis(50))
            .unwrap();
        c.poll_transmit().unwrap();
        c.submit(2, call(&p, "b", 32), t0 + Duration::from_millis(80))
            .unwrap();
        assert_eq!(c.next_deadline(), Some(t0 + Duration::from_millis(50)));
        let mut done = Vec::new();
        c.handle_timeout(t0 + Duration::from_millis(49), &mut done);
        assert!(done.is_empty() && !c.is_down());
        c.handle_timeout(t0 + Duration::from_millis(50), &mut done);
        assert!(c.is_down());
        assert_eq!(done.len(), 2);
        for d in &done {
            let e = d.reply.as_ref().unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        }
        // a check that was never written fails alone: the stream is not in doubt
        let mut c = ready(Vec::new());
        c.submit(3, call(&p, "c", 33), t0).unwrap();
        c.submit(4, call(&p, "d", 34), t0 + Duration::from_secs(5))
            .unwrap();
        let mut done = Vec::new();
        c.handle_timeout(t0 + Duration::from_millis(1), &mut done);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].id, 3);
        assert!(!c.is_down());
        // a connect that does not finish by its deadline
        let mut c = SansIo::new(Vec::new());
        c.connecting(t0 + Duration::from_millis(10));
        c.submit(5, call(&p, "e", 35), t0 + Duration::from_secs(5))
            .unwrap();
        c.handle_timeout(t0 + Duration::from_millis(10), &mut done);
        assert!(c.is_down());
        assert!(done[1]
            .reply
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("connect timed out"));
    }

    #[test]
    fn a_closed_socket_fails_every_call_and_a_new_one_starts_clean() {
        let p = policy();
        let mut c = ready(Vec::new());
        c.submit(1, call(&p, "a", 41), later()).unwrap();
        c.poll_transmit().unwrap();
        let mut done = Vec::new();
        // half a reply, then the socket closes
        let r = reply(&[1, 9, 5, -1, 0, 0, 1], 41);
        c.handle_input(&r[..7], &mut done);
        c.handle_closed("the connection to Redis broke", &mut done);
        assert!(c.is_down());
        assert!(done[0].reply.is_err());
        // the next connection does not see the old half reply
        c.connecting(later());
        c.connected();
        c.submit(2, call(&p, "b", 42), later()).unwrap();
        c.poll_transmit().unwrap();
        c.handle_input(&reply(&[1, 8, 5, -1, 0, 0, 1], 42), &mut done);
        assert_eq!(done.len(), 2);
        assert_eq!(done[1].id, 2);
        assert!(done[1].reply.is_ok());
    }
}
