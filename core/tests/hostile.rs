//! Hostile replies: a fake Redis on loopback that answers with deep, endless, lost, extra,
//! mistyped, out-of-range and truncated replies, against every path (async and blocking
//! checks, batches, layered checks, the block list). A real server cannot misbehave on
//! purpose, so this is the one place with a fake. Every call must end within its deadline
//! with a typed error (or its policy's fallback), nothing may panic or grow without bound,
//! and no caller may ever get a decision computed for another caller's key.

#[cfg(feature = "tls")]
mod support;

use shardlimit::{ErrorKind, Layer, Limiter, Policy, Source};
use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::read_command;

/// What the fake answers to a check (or a layered check) whose key holds `who-N-who`.
#[derive(Clone, Debug)]
enum Mode {
    /// allowed, with `remaining` = N: a reply that says whose it is
    Honest,
    /// `*1\r\n` nested this many times
    Deep(usize),
    /// a bulk string header of 2^40 bytes, then bytes for as long as the client reads
    EndlessBulk,
    /// an array of a billion elements, sent one by one for as long as the client reads
    EndlessArray,
    /// a bulk string's header, then a byte of it every 10 ms, for as long as the client reads
    Drip,
    /// no reply at all to the key with this N; honest replies to the others
    Lose(u64),
    /// an honest reply followed by a reply nobody asked for (a denial)
    Extra,
    /// this exact reply to every check (raw RESP)
    Fixed(&'static str),
    /// the first half of an honest reply, then the connection is closed
    Truncate,
    /// a batch's replies in the wrong order
    Swap,
    /// a batch's replies without the last one (single calls answered honestly)
    Short,
    /// a batch's replies and one more (an inline admission with the first check's tag)
    Long,
    /// the check of key N answered with WRONGTYPE, in its batch or alone; honest replies
    /// to the others
    WrongType(u64),
    /// what a Redis at `maxclients` does: an error on connect, before any command (written
    /// twice here, so that one always arrives when nobody waits), and no answer after it
    Refuse,
}

struct Fake {
    port: u16,
    mode: Arc<Mutex<Mode>>,
    /// bytes written by the fake on connections the client has not closed yet
    sent: Arc<AtomicU64>,
    /// connections the fake saw the client close
    closed: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    _accepting: support::Accepting,
}

fn scripts_by_sha() -> Vec<(String, &'static str)> {
    shardlimit::scripts::all()
        .into_iter()
        .map(|(name, _, sha)| (sha, name))
        .collect()
}

/// Batch calls in the compact layout (core/lua/main_batch.lua) the fakes were sent.
static COMPACT_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Checks the fakes answered inside a batch reply of the wrong length (`Mode::Short`,
/// `Mode::Long`: only one test uses them).
static SPOILED_CHECKS: AtomicUsize = AtomicUsize::new(0);

/// The N of `who-N-who` in a key.
fn who(key: &[u8]) -> Option<u64> {
    let s = String::from_utf8_lossy(key);
    let i = s.find("who-")?;
    let rest = &s[i + 4..];
    let j = rest.find("-who")?;
    rest[..j].parse().ok()
}

/// An honest check reply for key N, carrying the call's tag (core/lua/main_check.lua).
fn check_reply(n: u64, tag: &str) -> String {
    format!("*8\r\n:1\r\n:{n}\r\n:1000000\r\n:-1\r\n:0\r\n:0\r\n:1\r\n:{tag}\r\n")
}

impl Fake {
    fn start(mode: Mode) -> Fake {
        let mode = Arc::new(Mutex::new(mode));
        let sent = Arc::new(AtomicU64::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let accepting = support::Accepting::start({
            let (mode, sent, closed) = (mode.clone(), sent.clone(), closed.clone());
            move |s| serve(s, mode.clone(), sent.clone(), closed.clone())
        });
        Fake {
            port: accepting.port,
            mode,
            sent,
            closed,
            connections: accepting.connections.clone(),
            _accepting: accepting,
        }
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    fn limiter(&self, on_error: &str, timeout_ms: u64) -> Limiter {
        Limiter::from_json(&format!(
            r#"{{"timeout_ms": {timeout_ms}, "on_error": "{on_error}",
                "shards": [{{"name": "fake", "url": "redis://127.0.0.1:{}"}}],
                "policies": {{"p": {{"algorithm": "fixed_window", "limit": 1000, "window": "1h"}},
                              "q": {{"algorithm": "token_bucket", "capacity": 1000, "refill_per_sec": 1}},
                              "o": {{"algorithm": "fixed_window", "limit": 1000, "window": "1h", "overrides": true}}}}}}"#,
            self.port
        ))
        .unwrap()
    }
}

fn serve(s: TcpStream, mode: Arc<Mutex<Mode>>, sent: Arc<AtomicU64>, closed: Arc<AtomicUsize>) {
    let shas = scripts_by_sha();
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
    if matches!(*mode.lock().unwrap(), Mode::Refuse) {
        let refusal = "-ERR max number of clients reached\r\n";
        if !send(&mut w, refusal.repeat(2).as_bytes()) {
            return;
        }
    }
    while let Some(args) = read_command(&mut r) {
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        let reply = match name.as_str() {
            "PING" => "+PONG\r\n".to_string(),
            "EVALSHA" | "EVAL" => {
                let script = if name == "EVALSHA" {
                    let sha = String::from_utf8_lossy(&args[1]).to_string();
                    shas.iter().find(|(s, _)| *s == sha).map(|(_, n)| *n)
                } else {
                    let src = String::from_utf8_lossy(&args[1]).to_string();
                    shardlimit::scripts::all()
                        .into_iter()
                        .find(|(_, s, _)| *s == src)
                        .map(|(n, _, _)| n)
                }
                .unwrap_or("?");
                let nkeys: usize = String::from_utf8_lossy(&args[2]).parse().unwrap_or(0);
                let keys = &args[3..3 + nkeys];
                // keys per check: 3 a layer; a check's are as many as its policy uses
                // (core/lua/check.lua), the first its state key (namespace `s:`)
                let whos: Vec<u64> = if script.contains("layered") {
                    keys.iter().step_by(3).filter_map(|k| who(k)).collect()
                } else {
                    keys.iter()
                        .filter(|k| k.starts_with(b"sl:s:"))
                        .filter_map(|k| who(k))
                        .collect()
                };
                let argv = &args[3 + nkeys..];
                // each check's tag: the last argument of a single call; in a batch call
                // (core/lua/main_batch.lua) after each check's shape, cost, and its flags
                // and the values they name (n, x, g, o name one each), or in the compact
                // layout (the first argument "0") the arguments after the one shape
                // a compact batch's reply starts with the call's tag (its last argument),
                // and each check's carries its place in the call (1..=n) for a tag
                let mut head = None;
                let tags: Vec<String> = if script.contains("batch") {
                    let text = |i: usize| String::from_utf8_lossy(&argv[i]).to_string();
                    let s: usize = text(0).parse().unwrap_or(0);
                    let mut i = 1;
                    for _ in 0..s {
                        i += 1 + text(i).parse::<usize>().unwrap_or(0);
                    }
                    let mut tags = Vec::new();
                    if s == 0 {
                        COMPACT_CALLS.fetch_add(1, Ordering::AcqRel);
                        // the compact layout: one shape (its length, its values), then
                        // the call's tag
                        head = argv.last().map(|t| String::from_utf8_lossy(t).to_string());
                        tags.extend((1..=whos.len()).map(|p| p.to_string()));
                        i = argv.len();
                    }
                    while i < argv.len() {
                        i += 2; // its shape and cost
                        let f = text(i);
                        if f.starts_with(|c: char| c.is_ascii_alphabetic()) {
                            i += 1 + f.chars().filter(|c| "nxgo".contains(*c)).count();
                        }
                        tags.push(text(i));
                        i += 1;
                    }
                    tags
                } else if script.contains("shadow") {
                    // main_check.lua in shadow mode: the tag, then the shadow's three arguments
                    argv.len()
                        .checked_sub(4)
                        .and_then(|i| argv.get(i))
                        .map(|t| String::from_utf8_lossy(t).to_string())
                        .into_iter()
                        .collect()
                } else {
                    argv.last()
                        .map(|t| String::from_utf8_lossy(t).to_string())
                        .into_iter()
                        .collect()
                };
                let mode = mode.lock().unwrap().clone();
                // a batch reply of these replies
                let batch = |items: Vec<String>| match &head {
                    Some(h) => format!(
                        "*{}\r\n${}\r\n{h}\r\n{}",
                        items.len() + 1,
                        h.len(),
                        items.concat()
                    ),
                    None => format!("*{}\r\n{}", items.len(), items.concat()),
                };
                let honest = || {
                    if script.contains("layered") {
                        let mut out = format!("*{}\r\n:1\r\n:0\r\n:0\r\n", 3 + 5 * whos.len());
                        for n in &whos {
                            out.push_str(&format!(":1\r\n:{n}\r\n:1000000\r\n:-1\r\n:0\r\n"));
                        }
                        out
                    } else if script.contains("settle") {
                        // core/lua/main_settle.lua: a check's 7 values and the time (no tag:
                        // it goes over the redis crate's connection, never in a batch)
                        let n = whos.first().copied().unwrap_or(0);
                        format!("*8\r\n:1\r\n:{n}\r\n:1000000\r\n:-1\r\n:0\r\n:0\r\n:0\r\n:1800000000000000\r\n")
                    } else if script.contains("batch") {
                        batch(
                            whos.iter()
                                .zip(&tags)
                                .map(|(n, tag)| check_reply(*n, tag))
                                .collect(),
                        )
                    } else {
                        check_reply(whos.first().copied().unwrap_or(0), &tags[0])
                    }
                };
                match mode {
                    Mode::Honest => honest(),
                    Mode::Deep(n) => "*1\r\n".repeat(n),
                    Mode::EndlessBulk => {
                        if !send(&mut w, b"$1099511627776\r\n") {
                            return;
                        }
                        let chunk = vec![b'x'; 64 << 10];
                        while send(&mut w, &chunk) {}
                        return;
                    }
                    Mode::EndlessArray => {
                        if !send(&mut w, b"*1000000000\r\n") {
                            return;
                        }
                        let chunk = ":1\r\n".repeat(16 << 10);
                        while send(&mut w, chunk.as_bytes()) {}
                        return;
                    }
                    Mode::Drip => {
                        // (a bulk string under a check's bound: well framed to the end)
                        if !send(&mut w, b"$1000000\r\n") {
                            return;
                        }
                        while send(&mut w, b"x") {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        return;
                    }
                    Mode::Lose(n) if whos.contains(&n) => continue,
                    Mode::Refuse => continue,
                    Mode::Lose(_) => honest(),
                    // the extra one in the old format, and one with a tag of its own
                    Mode::Extra => format!(
                        "{}{}{}",
                        honest(),
                        "*7\r\n:0\r\n:0\r\n:1\r\n:1\r\n:0\r\n:0\r\n:0\r\n",
                        "*8\r\n:0\r\n:0\r\n:1\r\n:1\r\n:0\r\n:0\r\n:0\r\n:77\r\n"
                    ),
                    // `{tag}` stands for the call's tag
                    Mode::Fixed(r) => r.replace("{tag}", tags.first().map_or("0", |t| t)),
                    Mode::Swap => {
                        // a batch whose replies come in the wrong order: each reply says
                        // whose it is, and carries its own tag
                        let mut items: Vec<String> = whos
                            .iter()
                            .zip(&tags)
                            .map(|(n, t)| check_reply(*n, t))
                            .collect();
                        if script.contains("batch") && items.len() > 1 {
                            items.swap(0, 1);
                            batch(items)
                        } else {
                            honest()
                        }
                    }
                    Mode::Short | Mode::Long if script.contains("batch") => {
                        let mut items: Vec<String> = whos
                            .iter()
                            .zip(&tags)
                            .map(|(n, t)| check_reply(*n, t))
                            .collect();
                        SPOILED_CHECKS.fetch_add(whos.len(), Ordering::AcqRel);
                        if matches!(mode, Mode::Short) {
                            items.pop();
                        } else {
                            items.push(format!(":7\r\n:1000\r\n:{}\r\n", tags[0]));
                        }
                        batch(items)
                    }
                    Mode::Short | Mode::Long => honest(),
                    Mode::WrongType(bad) => {
                        let wrong = "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";
                        let items: Vec<String> = whos
                            .iter()
                            .zip(&tags)
                            .map(|(n, t)| {
                                if *n == bad {
                                    wrong.to_string()
                                } else {
                                    check_reply(*n, t)
                                }
                            })
                            .collect();
                        if script.contains("batch") {
                            batch(items)
                        } else {
                            items.concat()
                        }
                    }
                    Mode::Truncate => {
                        let h = honest();
                        let _ = send(&mut w, &h.as_bytes()[..h.len() / 2]);
                        return;
                    }
                }
            }
            "GET" => "$-1\r\n".to_string(),
            "PTTL" => ":-2\r\n".to_string(),
            _ => "+OK\r\n".to_string(),
        };
        if !send(&mut w, reply.as_bytes()) {
            return;
        }
    }
    closed.fetch_add(1, Ordering::AcqRel);
}

fn key(n: u64) -> String {
    format!("user:who-{n}-who")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Waits (bounded) until `f` holds.
fn eventually(what: &str, within: Duration, f: impl Fn() -> bool) {
    let end = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < end, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits (bounded) until the shard's circuit, opened by the failures a test provoked,
/// lets calls through again (its probe finds the server answering).
fn recovered(l: &Limiter, p: &Policy) {
    // both paths: a blocking check uses its own pooled connection, so its success says
    // nothing of the async path's connection, which may still be being replaced
    eventually("the circuit closes again", Duration::from_secs(5), || {
        let (l2, p2) = (l.clone(), p.clone());
        l.check_blocking(&key(999), p, 1).is_ok()
            && l.block_on(async move { l2.check(&key(998), &p2, 1).await })
                .is_ok()
    });
}

/// The decision of key `n`, checked to be its own (or a typed backend error).
fn own_or_backend_error(n: u64, r: shardlimit::Result<shardlimit::Decision>) -> bool {
    match r {
        Ok(d) => {
            assert_eq!(d.source, Source::Redis, "{d:?}");
            assert!(
                d.allowed,
                "key {n} got a denial nobody computed for it: {d:?}"
            );
            assert_eq!(d.remaining, n, "key {n} got another key's decision: {d:?}");
            true
        }
        Err(e) => {
            assert!(e.is_backend(), "key {n}: {e} is not a backend error");
            false
        }
    }
}

#[test]
fn an_honest_fake_is_decided_by_its_replies() {
    // the harness itself: every path gets the reply meant for its key
    let fake = Fake::start(Mode::Honest);
    let l = fake.limiter("error", 500);
    let p = l.policy("p").unwrap();
    let q = l.policy("q").unwrap();
    for n in 0..5 {
        assert!(own_or_backend_error(n, l.check_blocking(&key(n), &p, 1)));
    }
    let rt = rt();
    rt.block_on(async {
        let calls = (0..40).map(|n| {
            let (l, p) = (l.clone(), p.clone());
            tokio::spawn(async move { (n, l.check(&key(n), &p, 1).await) })
        });
        for c in calls {
            let (n, r) = c.await.unwrap();
            assert!(own_or_backend_error(n, r));
        }
    });
    let d = l
        .check_all_blocking(&[Layer::new(key(3), &p, 1), Layer::new(key(4), &q, 1)])
        .unwrap();
    assert!(d.allowed);
    assert_eq!(l.blocked_blocking(&key(1)).unwrap(), None);
}

#[test]
fn a_deep_reply_is_an_error_not_a_crash() {
    // 100,000 levels (400 KB) overflowed the stack of the old parser: SIGABRT even with
    // on_error open; 15,000 levels killed the shared I/O thread
    let fake = Fake::start(Mode::Deep(100_000));
    let l = fake.limiter("error", 500);
    let p = l.policy("p").unwrap();
    let q = l.policy("q").unwrap();
    let started = Instant::now();
    let e = l.check_blocking(&key(1), &p, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(e.to_string().contains("nested deeper"), "{e}");
    let e = rt().block_on(l.check(&key(2), &p, 1)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    let e = l
        .check_all_blocking(&[Layer::new(key(3), &p, 1), Layer::new(key(4), &q, 1)])
        .unwrap_err();
    assert!(e.is_backend(), "{e}");
    assert!(started.elapsed() < Duration::from_secs(2));
    // the same limiter decides again once the server behaves
    fake.set(Mode::Honest);
    recovered(&l, &p);
    assert!(own_or_backend_error(5, l.check_blocking(&key(5), &p, 1)));
    assert!(own_or_backend_error(
        6,
        rt().block_on(l.check(&key(6), &p, 1))
    ));
    // and with on_error open, a deep reply falls back instead of failing
    fake.set(Mode::Deep(100_000));
    let open = fake.limiter("open", 500);
    let p = open.policy("p").unwrap();
    let d = open.check_blocking(&key(7), &p, 1).unwrap();
    assert_eq!(d.source, Source::Fallback);
    let d = rt().block_on(open.check(&key(8), &p, 1)).unwrap();
    assert_eq!(d.source, Source::Fallback);
}

#[test]
fn an_endless_reply_is_cut_off_at_its_bound() {
    // a bulk header of 2^40 bytes followed by streamed data took the process to 2.96 GB
    // and an abort; now the header alone closes the connection
    for mode in [Mode::EndlessBulk, Mode::EndlessArray] {
        let fake = Fake::start(mode.clone());
        let l = fake.limiter("error", 300);
        let p = l.policy("p").unwrap();
        let started = Instant::now();
        let e = l.check_blocking(&key(1), &p, 1).unwrap_err();
        assert!(e.is_backend(), "{mode:?}: {e}");
        let e = rt().block_on(l.check(&key(2), &p, 1)).unwrap_err();
        assert!(e.is_backend(), "{mode:?}: {e}");
        assert!(started.elapsed() < Duration::from_millis(1500), "{mode:?}");
        // every connection it made (one or two: after a failed one, the next connect may
        // wait a back-off) was closed by the client, after at most the reply bound (1 MiB
        // for a check) plus what the sockets' buffers hold
        eventually(
            "the client closes its connections",
            Duration::from_secs(5),
            || {
                let made = fake.connections.load(Ordering::Acquire);
                made >= 1 && fake.closed.load(Ordering::Acquire) >= made
            },
        );
        let sent = fake.sent.load(Ordering::Acquire);
        assert!(
            sent < 16 << 20,
            "{mode:?}: {sent} bytes were sent before the close"
        );
    }
}

#[test]
fn a_reply_dripped_a_byte_at_a_time_fails_at_the_deadline() {
    // a byte every 10 ms kept a call waiting as long as bytes came (a check's 1 MiB bound
    // at 100 bytes a second: three hours); a byte is not a reply, and the deadline holds
    let fake = Fake::start(Mode::Drip);
    let l = fake.limiter("error", 100);
    let p = l.policy("p").unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    let calls = std::thread::spawn(move || {
        let started = Instant::now();
        let e = l.check_blocking(&key(1), &p, 1).unwrap_err();
        assert!(e.is_backend(), "blocking: {e}");
        assert!(e.to_string().contains("100 ms"), "blocking: {e}");
        let e = rt().block_on(l.check(&key(2), &p, 1)).unwrap_err();
        assert!(e.is_backend(), "async: {e}");
        assert!(e.to_string().contains("100 ms"), "async: {e}");
        let _ = done.send(started.elapsed());
    });
    // (the deadline is 100 ms each; the bound leaves room for a loaded machine, and is
    // far below what a drip could hold a call for)
    match finished.recv_timeout(Duration::from_secs(5)) {
        Ok(_) => calls.join().unwrap(),
        Err(_) if calls.is_finished() => calls.join().unwrap(), // its panic, as the failure
        Err(_) => panic!("a dripped reply held a call past 5 s against a 100 ms deadline"),
    }
    drop(fake);
}

#[test]
fn a_lost_reply_never_shifts_replies_onto_other_callers() {
    // after one lost reply, 20 of 24 callers got another key's decision (user:110 got
    // user:111's): the connection never resynchronised
    let fake = Fake::start(Mode::Lose(5));
    let l = fake.limiter("error", 300);
    let p = l.policy("p").unwrap();
    let rt = rt();
    for round in 0..3 {
        let (own, failed) = rt.block_on(async {
            let calls: Vec<_> = (0..24)
                .map(|n| {
                    let (l, p) = (l.clone(), p.clone());
                    tokio::spawn(async move { (n, l.check(&key(n), &p, 1).await) })
                })
                .collect();
            let (mut own, mut failed) = (0, 0);
            for c in calls {
                let (n, r) = c.await.unwrap();
                if own_or_backend_error(n, r) {
                    own += 1;
                } else {
                    failed += 1;
                }
            }
            (own, failed)
        });
        assert!(
            failed >= 1,
            "round {round}: the lost reply's caller must fail"
        );
        assert_eq!(own + failed, 24);
        // later calls on a fresh connection are all their own
        recovered(&l, &p);
        for n in 10..20 {
            assert!(
                own_or_backend_error(n, rt.block_on(l.check(&key(n), &p, 1))),
                "round {round}: key {n} failed after the connection was replaced"
            );
        }
    }
    // blocking callers: the lost reply times out, and the connection is not reused
    for n in [5, 6, 7, 5, 8] {
        let r = l.check_blocking(&key(n), &p, 1);
        if n == 5 {
            assert_eq!(r.unwrap_err().kind(), ErrorKind::Timeout);
        } else {
            assert!(own_or_backend_error(n, r), "key {n}");
        }
    }
    // (two timeouts in a row leave the circuit closed: it opens after three)
}

#[test]
fn a_reply_nobody_asked_for_is_never_taken_as_an_answer() {
    // on the blocking path, unsolicited replies were handed to the next caller: injected
    // denials
    let fake = Fake::start(Mode::Extra);
    let l = fake.limiter("error", 300);
    let p = l.policy("p").unwrap();
    for n in 0..20 {
        own_or_backend_error(n, l.check_blocking(&key(n), &p, 1));
    }
    let rt = rt();
    for n in 0..20 {
        own_or_backend_error(n, rt.block_on(l.check(&key(n), &p, 1)));
    }
    // (own_or_backend_error fails the test on any denial or another key's decision)
}

#[test]
fn a_reply_nobody_asked_for_leaves_the_async_path_working() {
    // An unsolicited reply after the last answer made the pipe's reader fail the connection
    // while it still held the waiters' lock (a match scrutinee's guard), deadlocking the I/O
    // thread: every later async call hung, even with an honest server again. The calls run
    // on a thread of their own so that a hang fails the test instead of hanging it.
    let fake = Fake::start(Mode::Extra);
    let l = fake.limiter("error", 300);
    let p = l.policy("p").unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    let calls = {
        let fake_mode = fake.mode.clone();
        std::thread::spawn(move || {
            let rt = rt();
            for n in 0..3 {
                own_or_backend_error(n, rt.block_on(l.check(&key(n), &p, 1)));
            }
            *fake_mode.lock().unwrap() = Mode::Honest;
            let end = Instant::now() + Duration::from_secs(5);
            while rt.block_on(l.check(&key(7), &p, 1)).is_err() {
                assert!(Instant::now() < end, "async checks never answered again");
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = done.send(());
        })
    };
    match finished.recv_timeout(Duration::from_secs(10)) {
        Ok(()) => calls.join().unwrap(),
        Err(_) if calls.is_finished() => calls.join().unwrap(), // its panic, as the failure
        Err(_) => panic!("an async check hung after a reply nobody asked for"),
    }
}

#[test]
fn bytes_on_connect_before_any_command_leave_the_async_path_working() {
    // A Redis at `maxclients` writes `-ERR max number of clients reached` as soon as it
    // accepts, before any command. The pipe's reader failed the connection on such bytes
    // while it still held the waiters' lock (the guard of a match scrutinee, taken again by
    // `fail`): the I/O thread deadlocked and every later async call hung. The fake writes
    // the refusal twice, so that whether or not the first call is waiting when it arrives,
    // bytes come that nobody waits for; the connection must then be closed (the fake sees
    // it), and the next calls, to an honest server, answered. A hang fails by timeout.
    let fake = Fake::start(Mode::Refuse);
    let l = fake.limiter("error", 300);
    let p = l.policy("p").unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    let calls = {
        let (mode, closed) = (fake.mode.clone(), fake.closed.clone());
        std::thread::spawn(move || {
            let rt = rt();
            let e = rt.block_on(l.check(&key(1), &p, 1)).unwrap_err();
            assert!(e.is_backend(), "{e:?}");
            eventually(
                "the refused connection is closed",
                Duration::from_secs(5),
                || closed.load(Ordering::Acquire) >= 1,
            );
            *mode.lock().unwrap() = Mode::Honest;
            let end = Instant::now() + Duration::from_secs(5);
            while rt.block_on(l.check(&key(7), &p, 1)).is_err() {
                assert!(Instant::now() < end, "async checks never answered again");
                std::thread::sleep(Duration::from_millis(5));
            }
            own_or_backend_error(8, rt.block_on(l.check(&key(8), &p, 1)));
            let _ = done.send(());
        })
    };
    match finished.recv_timeout(Duration::from_secs(15)) {
        Ok(()) => calls.join().unwrap(),
        Err(_) if calls.is_finished() => calls.join().unwrap(), // its panic, as the failure
        Err(_) => panic!("an async check hung after bytes that came before any command"),
    }
}

#[test]
fn mistyped_and_out_of_range_replies_are_script_errors() {
    // a deciding index beyond the layer count panicked (index out of bounds); remaining
    // above the limit and a 292,000-year delay were passed through as they came
    let cases: &[(&str, &'static str)] = &[
        (
            "a string for an integer",
            "*8\r\n:1\r\n$2\r\n10\r\n:1\r\n:-1\r\n:0\r\n:0\r\n:1\r\n:{tag}\r\n",
        ),
        (
            "remaining above the limit",
            "*8\r\n:1\r\n:1001\r\n:1\r\n:-1\r\n:0\r\n:0\r\n:1\r\n:{tag}\r\n",
        ),
        (
            "allowed neither 0 nor 1",
            "*8\r\n:7\r\n:1\r\n:1\r\n:-1\r\n:0\r\n:0\r\n:1\r\n:{tag}\r\n",
        ),
        (
            "a 292,000-year delay",
            "*8\r\n:1\r\n:1\r\n:1\r\n:-1\r\n:9223372036854775807\r\n:0\r\n:1\r\n:{tag}\r\n",
        ),
        (
            "a negative reset",
            "*8\r\n:1\r\n:1\r\n:-5\r\n:-1\r\n:0\r\n:0\r\n:1\r\n:{tag}\r\n",
        ),
        (
            "a block verdict of 5",
            "*8\r\n:0\r\n:0\r\n:1\r\n:1\r\n:0\r\n:5\r\n:0\r\n:{tag}\r\n",
        ),
        (
            "more units than asked for",
            "*8\r\n:1\r\n:1\r\n:1\r\n:-1\r\n:0\r\n:0\r\n:9\r\n:{tag}\r\n",
        ),
        ("too few values", "*2\r\n:1\r\n:{tag}\r\n"),
        // an admission in short ({remaining, reset_after}) is checked as the whole reply
        (
            "a short admission above the limit",
            "*3\r\n:1001\r\n:1\r\n:{tag}\r\n",
        ),
        (
            "a short admission with a negative reset",
            "*3\r\n:1\r\n:-5\r\n:{tag}\r\n",
        ),
        ("an integer for an array", ":1\r\n"),
        ("nil", "$-1\r\n"),
    ];
    let fake = Fake::start(Mode::Honest);
    let l = fake.limiter("error", 500);
    let p = l.policy("p").unwrap();
    let rt = rt();
    for (what, reply) in cases {
        fake.set(Mode::Fixed(reply));
        let e = l.check_blocking(&key(1), &p, 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Script, "{what}: {e}");
        let e = rt.block_on(l.check(&key(1), &p, 1)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Script, "{what}: {e}");
    }
    let q = l.policy("q").unwrap();
    let layers = [Layer::new(key(3), &p, 1), Layer::new(key(4), &q, 1)];
    let layered: &[(&str, &'static str)] = &[
        (
            "a deciding layer beyond the count",
            "*13\r\n:1\r\n:3\r\n:0\r\n:0\r\n:0\r\n:1\r\n:1\r\n:0\r\n:0\r\n:0\r\n:1\r\n:1\r\n:0\r\n",
        ),
        (
            "remaining above a layer's limit",
            "*13\r\n:1\r\n:0\r\n:0\r\n:1\r\n:5000\r\n:1\r\n:-1\r\n:0\r\n:1\r\n:1\r\n:1\r\n:-1\r\n:0\r\n",
        ),
        ("too few values", "*4\r\n:1\r\n:0\r\n:0\r\n:1\r\n"),
    ];
    for (what, reply) in layered {
        fake.set(Mode::Fixed(reply));
        let e = l.check_all_blocking(&layers).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Script, "{what}: {e}");
        let e = rt.block_on(l.check_all(&layers)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Script, "{what}: {e}");
    }
    // the limiter is fine afterwards
    fake.set(Mode::Honest);
    assert!(own_or_backend_error(9, l.check_blocking(&key(9), &p, 1)));
}

#[test]
fn a_truncated_reply_is_a_connection_error() {
    let fake = Fake::start(Mode::Truncate);
    let l = fake.limiter("error", 500);
    let p = l.policy("p").unwrap();
    let e = l.check_blocking(&key(1), &p, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    let e = rt().block_on(l.check(&key(2), &p, 1)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    fake.set(Mode::Honest);
    recovered(&l, &p);
    assert!(own_or_backend_error(3, l.check_blocking(&key(3), &p, 1)));
    assert!(own_or_backend_error(
        4,
        rt().block_on(l.check(&key(4), &p, 1))
    ));
}

#[test]
fn a_reply_carrying_another_calls_tag_is_never_taken() {
    // a batch answered out of order would give each caller the other's decision
    let fake = Fake::start(Mode::Swap);
    let l = fake.limiter("error", 300);
    let p = l.policy("p").unwrap();
    let rt = rt();
    for _ in 0..5 {
        rt.block_on(async {
            let calls: Vec<_> = (0..16)
                .map(|n| {
                    let (l, p) = (l.clone(), p.clone());
                    tokio::spawn(async move { (n, l.check(&key(n), &p, 1).await) })
                })
                .collect();
            for c in calls {
                let (n, r) = c.await.unwrap();
                // its own decision or an error, never the other's
                own_or_backend_error(n, r);
            }
        });
    }
    // a single call answered with a well-formed reply that carries another tag
    recovered(&l, &p);
    fake.set(Mode::Fixed(
        "*8\r\n:1\r\n:1\r\n:1\r\n:-1\r\n:0\r\n:0\r\n:1\r\n:12345\r\n",
    ));
    let e = l.check_blocking(&key(1), &p, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(e.to_string().contains("another call's tag"), "{e}");
    let e = rt.block_on(l.check(&key(1), &p, 1)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
}

/// A compact batch (plain checks of one policy, cost 1: their tags alone) answered with one
/// reply too few or too many gives each of its checks an error, never a decision; one
/// check's error reply in it is that check's alone, the others' decisions stand.
#[test]
fn a_compact_batch_reply_of_the_wrong_length_or_with_an_error_is_checked() {
    let before = COMPACT_CALLS.load(Ordering::Acquire);
    let fake = Fake::start(Mode::Short);
    let l = fake.limiter("error", 300);
    let p = l.policy("p").unwrap();
    let rt = rt();
    let burst = |keys: std::ops::Range<u64>| {
        rt.block_on(async {
            let calls: Vec<_> = keys
                .map(|n| {
                    let (l, p) = (l.clone(), p.clone());
                    tokio::spawn(async move { (n, l.check(&key(n), &p, 1).await) })
                })
                .collect();
            let mut out = Vec::new();
            for c in calls {
                out.push(c.await.unwrap());
            }
            out
        })
    };
    for mode in [Mode::Short, Mode::Long] {
        fake.set(mode.clone());
        // Whether a burst's checks share a batch call is the client's timing (a busy
        // machine may write each alone): bursts go until the fake has answered some
        // checks with a reply of the wrong length (bounded), and every one of those checks
        // must have failed, never been decided.
        let spoiled_before = SPOILED_CHECKS.load(Ordering::Acquire);
        let mut failed = 0;
        let mut bursts = 0;
        while SPOILED_CHECKS.load(Ordering::Acquire) == spoiled_before && bursts < 200 {
            bursts += 1;
            for (n, r) in burst(0..16) {
                if !own_or_backend_error(n, r) {
                    failed += 1;
                }
            }
        }
        let spoiled = SPOILED_CHECKS.load(Ordering::Acquire) - spoiled_before;
        assert!(
            spoiled >= 2,
            "{mode:?}: no burst went as a batch call in {bursts} bursts"
        );
        assert!(
            failed >= spoiled,
            "{mode:?}: {spoiled} checks were answered in a batch reply of the wrong length, \
             only {failed} failed"
        );
        fake.set(Mode::Honest);
        recovered(&l, &p);
    }
    fake.set(Mode::WrongType(3));
    for _ in 0..3 {
        for (n, r) in burst(0..16) {
            if n == 3 {
                let e = r.unwrap_err();
                assert!(e.to_string().contains("WRONGTYPE"), "{e}");
            } else {
                assert!(
                    own_or_backend_error(n, r),
                    "key {n} failed beside key 3's error"
                );
            }
        }
    }
    assert!(
        COMPACT_CALLS.load(Ordering::Acquire) > before,
        "no batch came in the compact layout"
    );
}

/// A shadow check (`main_check.lua` built in shadow mode, its own script call) is read by the same checks as
/// any check: its own decision from an honest reply, a script error for a reply our script
/// cannot give, and never a reply that carries another call's tag.
#[test]
fn shadow_check_replies_are_checked_like_any_check() {
    let fake = Fake::start(Mode::Honest);
    let l = fake.limiter("error", 500);
    let p = l.policy("p").unwrap();
    let rt = rt();
    for n in 0..3 {
        assert!(own_or_backend_error(
            n,
            l.check_shadow_blocking(&key(n), &p, 1)
        ));
        assert!(own_or_backend_error(
            n,
            rt.block_on(l.check_shadow(&key(n), &p, 1))
        ));
    }
    for reply in [
        "*8\r\n:1\r\n:1001\r\n:1\r\n:-1\r\n:0\r\n:0\r\n:1\r\n:{tag}\r\n",
        "*8\r\n:0\r\n:0\r\n:1\r\n:1\r\n:0\r\n:5\r\n:0\r\n:{tag}\r\n",
        "*3\r\n:1\r\n:1\r\n:{tag}\r\n",
    ] {
        fake.set(Mode::Fixed(reply));
        let e = l.check_shadow_blocking(&key(1), &p, 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Script, "{reply}: {e}");
    }
    // a well-formed reply with another call's tag
    fake.set(Mode::Fixed(
        "*8\r\n:1\r\n:5\r\n:1\r\n:-1\r\n:0\r\n:0\r\n:1\r\n:123456789\r\n",
    ));
    // the async shadow check goes over the pipelined connection: a reply with another
    // call's tag is refused and that connection closed (its stream is in doubt), as a
    // check's is; it used to be refused while the connection stayed in use
    let closed = fake.closed.load(Ordering::Acquire);
    let e = rt.block_on(l.check_shadow(&key(1), &p, 1)).unwrap_err();
    assert!(e.to_string().contains("another call's tag"), "{e}");
    let start = Instant::now();
    while fake.closed.load(Ordering::Acquire) == closed {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the connection that carried another call's tag stayed open"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let e = l.check_shadow_blocking(&key(1), &p, 1).unwrap_err();
    assert!(e.is_backend(), "{e}");
    fake.set(Mode::Honest);
    recovered(&l, &p);
    assert!(own_or_backend_error(
        7,
        l.check_shadow_blocking(&key(7), &p, 1)
    ));
}

/// The settle script's replies (charge, refund, reserve, settle) are checked like a check's:
/// a reply our script cannot give is a script error naming the shard, never a decision.
#[test]
fn implausible_settle_replies_are_script_errors() {
    let fake = Fake::start(Mode::Honest);
    let l = fake.limiter("error", 500);
    let p = l.policy("p").unwrap();
    let d = l.charge_blocking(&key(5), &p, 3).unwrap();
    assert_eq!(
        (d.allowed, d.remaining),
        (true, 5),
        "the honest fake answers key 5's number"
    );
    let (d, r) = l.reserve_blocking(&key(6), &p, 2).unwrap();
    let r = r.expect("an allowed reserve");
    assert_eq!((d.remaining, r.at_us), (6, 1_800_000_000_000_000));
    let cases: &[(&str, &'static str)] = &[
        (
            "seven values",
            "*7\r\n:1\r\n:1\r\n:1\r\n:-1\r\n:0\r\n:0\r\n:0\r\n",
        ),
        (
            "a negative time",
            "*8\r\n:1\r\n:1\r\n:1\r\n:-1\r\n:0\r\n:0\r\n:0\r\n:-1\r\n",
        ),
        (
            "a time past 2^53",
            "*8\r\n:1\r\n:1\r\n:1\r\n:-1\r\n:0\r\n:0\r\n:0\r\n:9007199254740993\r\n",
        ),
        (
            "remaining above the limit",
            "*8\r\n:1\r\n:1001\r\n:1\r\n:-1\r\n:0\r\n:0\r\n:0\r\n:1\r\n",
        ),
        (
            "a block verdict of 5",
            "*8\r\n:1\r\n:1\r\n:1\r\n:-1\r\n:0\r\n:5\r\n:0\r\n:1\r\n",
        ),
        (
            "more units than asked for",
            "*8\r\n:1\r\n:1\r\n:1\r\n:-1\r\n:0\r\n:0\r\n:99\r\n:1\r\n",
        ),
    ];
    for (what, reply) in cases {
        fake.set(Mode::Fixed(reply));
        for (op, e) in [
            ("charge", l.charge_blocking(&key(1), &p, 1).unwrap_err()),
            ("refund", l.refund_blocking(&key(1), &p, 1).unwrap_err()),
            ("reserve", l.reserve_blocking(&key(1), &p, 1).unwrap_err()),
            ("settle", l.settle_blocking(&r, 1).unwrap_err()),
        ] {
            assert_eq!(e.kind(), ErrorKind::Script, "{op}, {what}: {e}");
            assert!(
                e.to_string().contains("fake"),
                "{op}, {what}: names the shard: {e}"
            );
        }
    }
    // a charge, refund or settle never denies: a reply that says so is not ours
    fake.set(Mode::Fixed(
        "*8\r\n:0\r\n:0\r\n:1\r\n:1\r\n:0\r\n:0\r\n:0\r\n:1\r\n",
    ));
    let e = l.charge_blocking(&key(1), &p, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Script, "{e}");
    // while a reserve may be denied
    let (d, r) = l.reserve_blocking(&key(1), &p, 1).unwrap();
    assert!(!d.allowed && r.is_none());
    fake.set(Mode::Honest);
    assert!(l.charge_blocking(&key(9), &p, 1).unwrap().allowed);
}

/// An override entry in a check reply (`{'o', entry, 0}` then the tag, core/lua/check.lua).
fn override_reply(entry: &str) -> String {
    format!(
        "*4\r\n$1\r\no\r\n${}\r\n{entry}\r\n:0\r\n:{{tag}}\r\n",
        entry.len()
    )
}

#[test]
fn a_malformed_override_entry_is_an_error_naming_the_key() {
    let bad = [
        (
            "no version",
            "{\"algorithm\":\"fixed_window\",\"limit\":5,\"window\":\"1s\"}",
        ),
        (
            "version 0",
            "0 {\"algorithm\":\"fixed_window\",\"limit\":5,\"window\":\"1s\"}",
        ),
        (
            "a version with a sign",
            "+7 {\"algorithm\":\"fixed_window\",\"limit\":5,\"window\":\"1s\"}",
        ),
        ("not JSON", "7 {\"algorithm\":"),
        ("no algorithm", "7 {\"limit\":5,\"window\":\"1s\"}"),
        (
            "a limit of 0",
            "7 {\"algorithm\":\"fixed_window\",\"limit\":0,\"window\":\"1s\"}",
        ),
        (
            "a limit too large",
            "7 {\"algorithm\":\"fixed_window\",\"limit\":1e300,\"window\":\"1s\"}",
        ),
        (
            "an unknown field",
            "7 {\"algorithm\":\"fixed_window\",\"limit\":5,\"window\":\"1s\",\"x\":1}",
        ),
        (
            "a concurrency limit",
            "7 {\"algorithm\":\"concurrency\",\"max\":5,\"lease_ttl\":\"1s\"}",
        ),
        (
            "a negative window",
            "7 {\"algorithm\":\"fixed_window\",\"limit\":5,\"window\":-1}",
        ),
    ];
    let fake = Fake::start(Mode::Honest);
    let l = fake.limiter("error", 500);
    let o = l.policy("o").unwrap();
    let rt = rt();
    let k = key(1);
    for (what, entry) in bad {
        let reply: &'static str = Box::leak(override_reply(entry).into_boxed_str());
        fake.set(Mode::Fixed(reply));
        for e in [
            l.check_blocking(&k, &o, 1).unwrap_err(),
            rt.block_on(l.check(&k, &o, 1)).unwrap_err(),
        ] {
            assert_eq!(e.kind(), ErrorKind::Script, "{what}: {e}");
            let msg = e.to_string();
            assert!(
                msg.contains(&k) && msg.contains("override"),
                "{what}: {msg}"
            );
        }
    }
    // not a string where the entry belongs, a bare marker, no 0 before the tag
    for reply in [
        "*4\r\n$1\r\no\r\n:5\r\n:0\r\n:{tag}\r\n",
        "*2\r\n$1\r\no\r\n:{tag}\r\n",
        "*3\r\n$1\r\no\r\n$1\r\nx\r\n:{tag}\r\n",
    ] {
        fake.set(Mode::Fixed(reply));
        let e = l.check_blocking(&k, &o, 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Script, "{reply:?}: {e}");
    }
    // an override entry without its call's tag is never taken: the stream is in doubt
    let untagged =
        "*3\r\n$1\r\no\r\n$40\r\n7 {\"algorithm\":\"fixed_window\",\"limit\":5}\r\n:0\r\n";
    // (and the shape of an untagged entry alone, which the first version took)
    let bare = "*2\r\n$1\r\no\r\n$40\r\n7 {\"algorithm\":\"fixed_window\",\"limit\":5}\r\n";
    for reply in [untagged, bare] {
        fake.set(Mode::Fixed(reply));
        for e in [
            l.check_blocking(&k, &o, 1).unwrap_err(),
            rt.block_on(l.check(&k, &o, 1)).unwrap_err(),
        ] {
            assert!(e.is_backend(), "{e}");
            assert!(
                !e.to_string().contains("override"),
                "taken as an override: {e}"
            );
        }
    }
    fake.set(Mode::Honest);
    recovered(&l, &o);
    // with on_error open, the same entry is a fallback decision, never a wrong limit
    let open = fake.limiter("open", 500);
    let reply: &'static str = Box::leak(override_reply("7 {").into_boxed_str());
    fake.set(Mode::Fixed(reply));
    let d = open
        .check_blocking(&k, &open.policy("o").unwrap(), 1)
        .unwrap();
    assert_eq!(d.source, Source::Fallback, "{d:?}");
    fake.set(Mode::Honest);
    assert!(own_or_backend_error(9, l.check_blocking(&key(9), &o, 1)));
}

#[test]
fn a_server_that_always_finds_a_new_override_cannot_hold_a_check_forever() {
    // every reply claims another override: the check gives up after a bounded number of
    // tries with an error, on both paths
    let fake = Fake::start(Mode::Honest);
    let l = fake.limiter("error", 500);
    let o = l.policy("o").unwrap();
    let reply: &'static str = Box::leak(
        override_reply("7 {\"algorithm\":\"fixed_window\",\"limit\":5,\"window\":\"1s\"}")
            .into_boxed_str(),
    );
    fake.set(Mode::Fixed(reply));
    let rt = rt();
    let start = Instant::now();
    for e in [
        l.check_blocking(&key(2), &o, 1).unwrap_err(),
        rt.block_on(l.check(&key(2), &o, 1)).unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::Script, "{e}");
        assert!(e.to_string().contains("changed"), "{e}");
    }
    assert!(start.elapsed() < Duration::from_secs(5));
}

/// A layered check of a policy with overrides reads override entries in its script call:
/// an entry index the call did not send is a script error, and a server that always finds
/// a new override ends the layered check with an error after the bounded tries.
#[test]
fn layered_override_replies_are_checked_and_bounded() {
    let fake = Fake::start(Mode::Honest);
    let l = fake.limiter("error", 500);
    let (o, p) = (l.policy("o").unwrap(), l.policy("p").unwrap());
    let layers = [Layer::new(key(3), &o, 1), Layer::new(key(4), &p, 1)];
    let rt = rt();
    // one entry sent (the override layer's): index 2 is none, nor 0 (the tail's, not sent)
    for (reply, says) in [
        (
            "*3\r\n$1\r\no\r\n$0\r\n\r\n:2\r\n",
            "unexpected override entry",
        ),
        ("*3\r\n$1\r\no\r\n$0\r\n\r\n:0\r\n", "no override entry 0"),
    ] {
        fake.set(Mode::Fixed(reply));
        for e in [
            l.check_all_blocking(&layers).unwrap_err(),
            rt.block_on(l.check_all(&layers)).unwrap_err(),
        ] {
            assert_eq!(e.kind(), ErrorKind::Script, "{e}");
            assert!(e.to_string().contains(says), "{e}");
        }
    }
    let entry = "7 {\"algorithm\":\"fixed_window\",\"limit\":5,\"window\":\"1s\"}";
    let reply: &'static str = Box::leak(
        format!("*3\r\n$1\r\no\r\n${}\r\n{entry}\r\n:1\r\n", entry.len()).into_boxed_str(),
    );
    fake.set(Mode::Fixed(reply));
    let start = Instant::now();
    for e in [
        l.check_all_blocking(&layers).unwrap_err(),
        rt.block_on(l.check_all(&layers)).unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::Script, "{e}");
        assert!(e.to_string().contains("changed"), "{e}");
    }
    assert!(start.elapsed() < Duration::from_secs(5));
}

/// The multi-limit settle script's override answer (several limits in force under
/// overrides) is as untrusted as the rest of its reply: an entry that is not a bulk string
/// and a 0 is a script error naming the shard, never a retry or a decision.
#[test]
fn implausible_override_answers_of_the_multi_limit_settle_script_are_script_errors() {
    let fake = Fake::start(Mode::Honest);
    let l = Limiter::from_json(&format!(
        r#"{{"timeout_ms": 500, "on_error": "error",
            "shards": [{{"name": "fake", "url": "redis://127.0.0.1:{}"}}],
            "policies": {{"m": {{"rate": "10/second; 100/day", "overrides": true}}}}}}"#,
        fake.port
    ))
    .unwrap();
    let m = l.policy("m").unwrap();
    for reply in [
        "*3\r\n+o\r\n$3\r\nabc\r\n:0\r\n",
        "*3\r\n$1\r\no\r\n:5\r\n:0\r\n",
        "*3\r\n$1\r\no\r\n$3\r\nabc\r\n:1\r\n",
    ] {
        fake.set(Mode::Fixed(reply));
        let e = l.charge_blocking(&key(1), &m, 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Script, "{reply:?}: {e}");
        assert!(e.to_string().contains("fake"), "names the shard: {e}");
    }
}

/// The fake behind TLS: a TLS server on loopback (the test CA's server certificate) that
/// passes every connection's bytes through to the fake Redis, and the fake's bytes back.
/// What the fake sends, the client reads over TLS; what the client closes, the fake sees
/// closed (the proxy drops both sides together).
#[cfg(feature = "tls")]
struct TlsFront {
    port: u16,
    certs: support::TestCerts,
    _runtime: tokio::runtime::Runtime,
}

#[cfg(feature = "tls")]
impl TlsFront {
    fn start(fake: &Fake) -> TlsFront {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = support::TestCerts::generate("DNS:localhost,IP:127.0.0.1");
        let chain = CertificateDer::pem_file_iter(certs.path("server.crt"))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(certs.path("server.key")).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let upstream = fake.port;
        runtime.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut plain) =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        TlsFront {
            port,
            certs,
            _runtime: runtime,
        }
    }

    fn limiter(&self, on_error: &str, timeout_ms: u64) -> Limiter {
        tls_limiter(self.port, &self.certs.path("ca.crt"), on_error, timeout_ms)
    }
}

/// A limiter on a `rediss://` shard at `port` that trusts the CA `ca`.
#[cfg(feature = "tls")]
fn tls_limiter(port: u16, ca: &str, on_error: &str, timeout_ms: u64) -> Limiter {
    Limiter::from_json(&format!(
        r#"{{"timeout_ms": {timeout_ms}, "on_error": "{on_error}",
            "shards": [{{"name": "fake", "url": "rediss://127.0.0.1:{port}", "tls": {{"ca_file": "{ca}"}}}}],
            "policies": {{"p": {{"algorithm": "fixed_window", "limit": 1000, "window": "1h"}}}}}}"#
    ))
    .unwrap()
}

#[cfg(feature = "tls")]
#[test]
fn tls_replies_have_the_same_bounds_and_deadline() {
    let fake = Fake::start(Mode::Honest);
    let front = TlsFront::start(&fake);
    let rt = rt();
    // the harness: honest replies over TLS, on the blocking and the async path
    let l = front.limiter("error", 500);
    let p = l.policy("p").unwrap();
    assert!(own_or_backend_error(1, l.check_blocking(&key(1), &p, 1)));
    assert!(own_or_backend_error(
        2,
        rt.block_on(l.check(&key(2), &p, 1))
    ));

    // an oversized bulk length, and an endless array: cut off at the reply bound (over
    // TLS, the redis crate's connection took the process to 3 GB in 4 s)
    for mode in [Mode::EndlessBulk, Mode::EndlessArray] {
        fake.set(mode.clone());
        let (made, closed) = (
            fake.connections.load(Ordering::Acquire),
            fake.closed.load(Ordering::Acquire),
        );
        fake.sent.store(0, Ordering::Release);
        let l = front.limiter("error", 300);
        let p = l.policy("p").unwrap();
        let started = Instant::now();
        let e = l.check_blocking(&key(1), &p, 1).unwrap_err();
        assert!(e.is_backend(), "{mode:?}: {e}");
        let e = rt.block_on(l.check(&key(2), &p, 1)).unwrap_err();
        assert!(e.is_backend(), "{mode:?}: {e}");
        assert!(started.elapsed() < Duration::from_millis(1500), "{mode:?}");
        eventually(
            "the client closes its TLS connections",
            Duration::from_secs(5),
            || {
                let made = fake.connections.load(Ordering::Acquire) - made;
                made >= 1 && fake.closed.load(Ordering::Acquire) - closed >= made
            },
        );
        let sent = fake.sent.load(Ordering::Acquire);
        assert!(
            sent < 16 << 20,
            "{mode:?}: {sent} bytes were sent before the close"
        );
    }

    // garbage: a connection error, or the fallback
    fake.set(Mode::Fixed("garbage\r\n"));
    let l = front.limiter("error", 300);
    let p = l.policy("p").unwrap();
    let e = rt.block_on(l.check(&key(3), &p, 1)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    let open = front.limiter("open", 300);
    let po = open.policy("p").unwrap();
    let d = open.check_blocking(&key(3), &po, 1).unwrap();
    assert_eq!(d.source, Source::Fallback);

    // silence after the write: a timeout after timeout_ms (not before), or the fallback
    fake.set(Mode::Lose(4));
    let l = front.limiter("error", 200);
    let p = l.policy("p").unwrap();
    let started = Instant::now();
    let e = rt.block_on(l.check(&key(4), &p, 1)).unwrap_err();
    let waited = started.elapsed();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_millis(1500),
        "{waited:?}"
    );
    let open = front.limiter("open", 200);
    let d = open
        .check_blocking(&key(4), &open.policy("p").unwrap(), 1)
        .unwrap();
    assert_eq!(d.source, Source::Fallback);
    // the others' replies on that connection were their own
    assert!(own_or_backend_error(
        5,
        rt.block_on(l.check(&key(5), &p, 1))
    ));
}

#[cfg(feature = "tls")]
#[test]
fn a_tls_handshake_with_garbage_or_silence_fails_within_the_deadline() {
    let certs = support::TestCerts::generate("DNS:localhost,IP:127.0.0.1");
    let ca = certs.path("ca.crt");
    let rt = rt();
    // a server that speaks plain RESP where TLS was expected: its bytes are no TLS record
    let plain = Fake::start(Mode::Refuse);
    let l = tls_limiter(plain.port, &ca, "error", 300);
    let p = l.policy("p").unwrap();
    let e = rt.block_on(l.check(&key(1), &p, 1)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(e.to_string().contains("TLS handshake failed"), "{e}");
    assert!(e.to_string().contains("not answer in TLS"), "{e}");
    // a server that takes the connection and never answers the handshake
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let l = tls_limiter(port, &ca, "error", 200);
    let p = l.policy("p").unwrap();
    let started = Instant::now();
    let e = rt.block_on(l.check(&key(2), &p, 1)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(started.elapsed() < Duration::from_millis(1500));
    let open = tls_limiter(port, &ca, "open", 200);
    let d = open
        .check_blocking(&key(3), &open.policy("p").unwrap(), 1)
        .unwrap();
    assert_eq!(d.source, Source::Fallback);
    drop(silent);
}
