//! The pipe's tests: the silence verdict against a runtime that has not seen the socket
//! ready, a stream that wakes itself, and an idle connection the server closed.

use super::*;
use std::io::{Read, Write};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::ReadBuf;

/// A read half whose runtime has not seen the socket ready: "not ready", with no
/// wake-up to come, until `until` (then the socket's bytes as they are). What tokio
/// answers when bytes came after its driver last looked at the socket.
struct Stale<R> {
    inner: R,
    until: Option<Instant>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Stale<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.until.is_none_or(|t| Instant::now() < t) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

/// A server on loopback that answers the first command it reads with +PONG at once,
/// then holds the connection open until the client closes it.
fn ponger() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 64];
        let _ = s.read(&mut buf);
        s.write_all(b"+PONG\r\n").unwrap();
        while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
    });
    port
}

/// A PING over a pipe whose reader is [`Stale`] until `hidden` after the start, with
/// or without a peek at the socket; its reply (the server's comes at once) and when.
fn ping_stale(hidden: Option<Duration>, peek: bool) -> (io::Result<Vec<u8>>, Duration) {
    let port = ponger();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let p = if peek { Peek::of(&s) } else { None };
        let (r, w) = s.into_split();
        let start = Instant::now();
        let r = Stale {
            inner: r,
            until: hidden.map(|h| start + h),
        };
        let mut conn = SansIo::new(Vec::new(), Duration::from_millis(50), 16);
        conn.connecting(start);
        let pipe = Pipe::start(r, w, conn, p);
        let reply = pipe.command(b"*1\r\n$4\r\nPING\r\n".to_vec()).await;
        (reply, start.elapsed())
    })
}

#[test]
fn a_verdict_waits_for_bytes_the_socket_holds_that_the_runtime_did_not_see() {
    // The reply is in the socket within a millisecond; the reader is told "not ready"
    // for 95 ms. The first verdict is due at 50 ms (later on a loaded machine, which
    // only makes it later than that): without the look at the socket, the shard was
    // called silent there. Put off, the next comes at 100 ms or later, after the 95.
    let (r, _) = ping_stale(Some(Duration::from_millis(95)), true);
    assert_eq!(r.unwrap(), b"+PONG\r\n");
    // put off once only: bytes that stay unread are no answer
    let (r, took) = ping_stale(None, true);
    let e = r.unwrap_err();
    assert!(e.to_string().contains("sent nothing"), "{e}");
    assert!(took >= Duration::from_millis(100), "{took:?}");
    // and without a peek (a stream with no socket under it), not put off at all
    let (r, _) = ping_stale(None, false);
    let e = r.unwrap_err();
    assert!(e.to_string().contains("sent nothing"), "{e}");
}

/// A stream that answers "not ready" and wakes its task at once `busy` times (the
/// other half of a split stream holding their lock), then gives its bytes.
struct Busy {
    busy: usize,
    bytes: &'static [u8],
}

impl AsyncRead for Busy {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.busy > 0 {
            self.busy -= 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        buf.put_slice(self.bytes);
        self.bytes = &[];
        Poll::Ready(Ok(()))
    }
}

#[test]
fn reading_now_asks_again_a_stream_that_woke_itself() {
    let mut buf = Vec::with_capacity(64);
    let mut r = Busy {
        busy: 3,
        bytes: b"+PONG\r\n",
    };
    assert!(matches!(read_now(&mut r, &mut buf), Some(Ok(7))));
    assert_eq!(buf, b"+PONG\r\n");
    // "not ready" with no wake-up: nothing there
    let mut r = Stale {
        inner: Busy {
            busy: 0,
            bytes: b"x",
        },
        until: None,
    };
    assert!(read_now(&mut r, &mut buf).is_none());
}

#[test]
fn an_idle_connection_the_server_closed_is_broken_before_its_reader_sees_it() {
    // a server that answers one PING, then closes the connection when told to
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (close, closing) = std::sync::mpsc::channel::<()>();
    let (closed, was_closed) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 64];
        let _ = s.read(&mut buf);
        s.write_all(b"+PONG\r\n").unwrap();
        closing.recv().unwrap();
        drop(s);
        closed.send(()).unwrap();
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let p = Peek::of(&s);
        let (r, w) = s.into_split();
        // one thread, which this test holds from the server's close on: the reader
        // task does not run again, as on a busy runtime
        let start = Instant::now();
        let mut conn = SansIo::new(Vec::new(), Duration::from_secs(5), 16);
        conn.connecting(start);
        let pipe = Pipe::start(r, w, conn, p);
        assert_eq!(
            pipe.command(b"*1\r\n$4\r\nPING\r\n".to_vec())
                .await
                .unwrap(),
            b"+PONG\r\n"
        );
        assert!(!pipe.is_broken(), "open and idle: whole");
        close.send(()).unwrap();
        was_closed.recv().unwrap();
        // the FIN reaches the socket within a moment; the reader task never ran since
        let deadline = Instant::now() + Duration::from_secs(5);
        while !pipe.is_broken() {
            assert!(
                Instant::now() < deadline,
                "an idle closed connection looked whole"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // and a call on it fails at once instead of being written to a closed socket
        let e = pipe
            .command(b"*1\r\n$4\r\nPING\r\n".to_vec())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
    });
}
