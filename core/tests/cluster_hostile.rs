//! A hostile Redis Cluster node: a fake on loopback that says it owns every slot (`CLUSTER
//! SLOTS`) and then answers checks with an endless reply, a bulk string over the reply
//! bound, a `MOVED` to itself forever, or a slot map that never ends. A real server cannot
//! misbehave on purpose, so this is a fake (as in `hostile.rs`). Every call must end
//! within its deadline with a backend error (or its policy's fallback), the client must
//! close the connection after at most the reply bound, and nothing may grow without bound.

mod support;

use shardlimit::{Limiter, Source};
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::read_command;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// an honest check reply: allowed, `remaining` 7
    Honest,
    /// a bulk string header of 2^40 bytes, then bytes for as long as the client reads
    EndlessBulk,
    /// a bulk string of 2 MiB (over a check's 1 MiB bound), whole
    Oversized,
    /// `-MOVED <slot> 127.0.0.1:<its own port>` to every check, forever
    MovedToSelf,
    /// honest checks, and a `CLUSTER SLOTS` reply that never ends
    EndlessSlots,
}

struct Fake {
    port: u16,
    /// bytes written on connections the client has not closed yet
    sent: Arc<AtomicU64>,
    /// script calls received
    scripts: Arc<AtomicU64>,
    connections: Arc<AtomicUsize>,
    /// connections the fake saw the client close
    closed: Arc<AtomicUsize>,
    _accepting: support::Accepting,
}

impl Fake {
    fn start(mode: Mode) -> Fake {
        let (sent, scripts, closed) =
            <(Arc<AtomicU64>, Arc<AtomicU64>, Arc<AtomicUsize>)>::default();
        let accepting = support::Accepting::start({
            let (sent, scripts, closed) = (sent.clone(), scripts.clone(), closed.clone());
            move |s| {
                // (the fake names its own port in the slot map it sends)
                let port = s.local_addr().unwrap().port();
                serve(s, port, mode, sent.clone(), scripts.clone(), closed.clone())
            }
        });
        Fake {
            port: accepting.port,
            sent,
            scripts,
            connections: accepting.connections.clone(),
            closed,
            _accepting: accepting,
        }
    }

    fn limiter(&self, on_error: &str, timeout_ms: u64) -> Limiter {
        Limiter::from_json(&format!(
            r#"{{"timeout_ms": {timeout_ms}, "cluster": {{"nodes": ["redis://127.0.0.1:{}"]}},
                "policies": {{"p": {{"algorithm": "fixed_window", "limit": 1000, "window": "1h", "on_error": "{on_error}"}}}}}}"#,
            self.port
        ))
        .unwrap()
    }
}

fn serve(
    s: TcpStream,
    port: u16,
    mode: Mode,
    sent: Arc<AtomicU64>,
    scripts: Arc<AtomicU64>,
    closed: Arc<AtomicUsize>,
) {
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let send = |w: &mut TcpStream, b: &[u8]| -> bool {
        if w.write_all(b).is_err() {
            closed.fetch_add(1, Ordering::AcqRel);
            return false;
        }
        sent.fetch_add(b.len() as u64, Ordering::AcqRel);
        true
    };
    let endless = |w: &mut TcpStream| {
        if send(w, b"$1099511627776\r\n") {
            let chunk = vec![b'x'; 64 << 10];
            while send(w, &chunk) {}
        }
    };
    while let Some(args) = read_command(&mut r) {
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        let reply = match name.as_str() {
            "PING" => "+PONG\r\n".to_string(),
            "CLUSTER" if mode == Mode::EndlessSlots => return endless(&mut w),
            // every slot is this node's
            "CLUSTER" => {
                format!("*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:{port}\r\n")
            }
            "EVALSHA" | "EVAL" => {
                scripts.fetch_add(1, Ordering::AcqRel);
                // a single check's tag is its last argument (core/lua/check.lua)
                let tag = String::from_utf8_lossy(args.last().unwrap()).to_string();
                match mode {
                    Mode::Honest | Mode::EndlessSlots => {
                        format!("*8\r\n:1\r\n:7\r\n:1000000\r\n:-1\r\n:0\r\n:0\r\n:1\r\n:{tag}\r\n")
                    }
                    Mode::EndlessBulk => return endless(&mut w),
                    Mode::Oversized => format!("$2097152\r\n{}\r\n", "x".repeat(2 << 20)),
                    Mode::MovedToSelf => format!("-MOVED 1234 127.0.0.1:{port}\r\n"),
                }
            }
            _ => "+OK\r\n".to_string(),
        };
        if !send(&mut w, reply.as_bytes()) {
            return;
        }
    }
    closed.fetch_add(1, Ordering::AcqRel);
}

fn eventually(what: &str, within: Duration, f: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The fake is believed when it is honest: a check is decided by its reply (so the tests
/// below fail for what the fake does wrong, not for a fake nobody listens to). A slot map
/// that never ends is cut off at its bound and ignored: the configured node is used.
#[test]
fn an_honest_fake_node_is_decided_by_its_replies() {
    for mode in [Mode::Honest, Mode::EndlessSlots] {
        let fake = Fake::start(mode);
        let l = fake.limiter("error", 300);
        let p = l.policy("p").unwrap();
        let t = Instant::now();
        let d = l.check_blocking("k", &p, 1).unwrap();
        assert_eq!((d.source, d.remaining), (Source::Redis, 7), "{mode:?}");
        let d = rt().block_on(l.check("k", &p, 1)).unwrap();
        assert_eq!((d.source, d.remaining), (Source::Redis, 7), "{mode:?}");
        assert!(t.elapsed() < Duration::from_millis(1500), "{mode:?}");
        eprintln!(
            "{mode:?}: {:?}, {} bytes sent, {} connections",
            t.elapsed(),
            fake.sent.load(Ordering::Acquire),
            fake.connections.load(Ordering::Acquire)
        );
        // the slot map was cut off at the bound of a command's reply (64 MiB) plus what
        // the sockets hold
        assert!(
            fake.sent.load(Ordering::Acquire) < 80 << 20,
            "{mode:?}: {} bytes sent",
            fake.sent.load(Ordering::Acquire)
        );
    }
}

/// An endless reply and a reply over the bound end in a backend error within the
/// deadline, the connection closed after at most the bound (1 MiB for a check) plus what
/// the sockets hold; with `on_error: open`, in the fallback.
#[test]
fn endless_and_oversized_replies_are_cut_off_at_the_bound() {
    for mode in [Mode::EndlessBulk, Mode::Oversized] {
        let fake = Fake::start(mode);
        let l = fake.limiter("error", 300);
        let p = l.policy("p").unwrap();
        let t = Instant::now();
        let e = l.check_blocking("k1", &p, 1).unwrap_err();
        assert!(e.is_backend(), "{mode:?}: {e}");
        let e = rt().block_on(l.check("k2", &p, 1)).unwrap_err();
        assert!(e.is_backend(), "{mode:?}: {e}");
        assert!(t.elapsed() < Duration::from_millis(1500), "{mode:?}");
        let l = fake.limiter("open", 300);
        let d = l.check_blocking("k3", &l.policy("p").unwrap(), 1).unwrap();
        assert_eq!((d.allowed, d.source), (true, Source::Fallback), "{mode:?}");
        eventually(
            "the client closes its connections",
            Duration::from_secs(5),
            || {
                let made = fake.connections.load(Ordering::Acquire);
                made >= 1 && fake.closed.load(Ordering::Acquire) >= made
            },
        );
        let sent = fake.sent.load(Ordering::Acquire);
        eprintln!("{mode:?}: {:?}, {sent} bytes sent", t.elapsed());
        assert!(
            sent < 16 << 20,
            "{mode:?}: {sent} bytes were sent before the close"
        );
    }
}

/// A node that answers `MOVED` to itself forever: each check follows at most 5 redirects
/// and fails as a backend error (a node that cannot serve its slot), fast; with `on_error:
/// open`, the fallback decides.
#[test]
fn a_node_that_redirects_forever_is_a_backend_error() {
    let fake = Fake::start(Mode::MovedToSelf);
    let l = fake.limiter("error", 300);
    let p = l.policy("p").unwrap();
    let t = Instant::now();
    let e = l.check_blocking("k1", &p, 1).unwrap_err();
    assert!(e.is_backend(), "{e}");
    assert!(e.to_string().contains("redirected"), "{e}");
    let scripts = fake.scripts.load(Ordering::Acquire);
    assert_eq!(scripts, 6, "the first attempt and 5 redirects");
    let e = rt().block_on(l.check("k2", &p, 1)).unwrap_err();
    assert!(e.is_backend(), "{e}");
    assert!(t.elapsed() < Duration::from_millis(1500));
    let l = fake.limiter("open", 300);
    let d = l.check_blocking("k3", &l.policy("p").unwrap(), 1).unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Fallback));
}
