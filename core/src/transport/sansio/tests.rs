//! The machine driven with bytes alone: no socket, no thread, no clock but the one
//! passed in.
use super::*;
use crate::policy::{Limit, Policy};
use crate::wire::scripts::check_scripts;
use crate::wire::{CheckPart, CheckSink};
use std::time::Duration;

fn policy() -> Policy {
    Policy::new("p", Limit::fixed_window(10, Duration::from_secs(60))).unwrap()
}

/// A check call of `p` for `key` in the layout of [`crate::wire`], a plain check's (the
/// engine's arguments do not matter to the machine: it regroups them by the marks alone).
fn call(p: &Policy, key: &str, tag: u64) -> CheckCall {
    CheckCall::new(check_scripts(p.0.compiled.algorithm), false, tag, |c| {
        for k in 0..2 {
            c.arg(format!("sl:{key}:{k}").as_bytes());
        }
        c.mark(CheckPart::Item);
        c.int(1);
        c.mark(CheckPart::Shape);
        for v in 0..2 {
            c.int(10 + v as u64);
        }
        c.mark(CheckPart::Tag);
        c.int(tag);
    })
}

fn ready(handshake: Vec<(&'static str, Vec<u8>)>) -> SansIo {
    let mut c = SansIo::new(handshake, T, Q);
    c.connecting(Instant::now());
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

/// A compact batch's reply (plain checks of one policy, cost 1: transport/batch.rs): the
/// call's tag (its first check's), then each check's values with its place in the call.
fn compact_reply(call_tag: u64, replies: &[&[i64]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n:{call_tag}\r\n", replies.len() + 1).into_bytes();
    for (p, values) in replies.iter().enumerate() {
        out.extend(reply(values, p as u64 + 1));
    }
    out
}

/// The timeout, and the queue's bound, of the machines here.
const T: Duration = Duration::from_millis(50);
const Q: usize = 65_536;

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn nothing_is_accepted_while_nobody_connects() {
    let p = policy();
    let mut c = SansIo::new(Vec::new(), T, Q);
    let e = c.submit(1, call(&p, "k", 1)).unwrap_err();
    assert!(e.to_string().contains("not connected"), "{e}");
    assert!(c.is_down());
    assert_eq!(c.poll_transmit(Instant::now()), None);
}

#[test]
fn logs_in_before_any_check_is_written_then_answers_by_tag() {
    let p = policy();
    let select = b"*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n".to_vec();
    let mut c = SansIo::new(vec![("SELECT", select.clone())], T, Q);
    c.connecting(Instant::now());
    c.submit(7, call(&p, "k", 70)).unwrap();
    assert_eq!(
        c.poll_transmit(Instant::now()),
        None,
        "nothing before the socket is open"
    );
    c.connected();
    // a check on the wrong database would decide on another's state: it waits
    assert_eq!(c.poll_transmit(Instant::now()).unwrap(), select);
    assert_eq!(c.poll_transmit(Instant::now()), None);
    let mut done = Vec::new();
    c.handle_input(Instant::now(), b"+OK\r\n", &mut done);
    assert!(done.is_empty());
    let wire = c.poll_transmit(Instant::now()).unwrap();
    let single = check_scripts(p.0.compiled.algorithm).single_sha;
    assert!(wire.starts_with(b"*9\r\n$7\r\nEVALSHA\r\n"), "{wire:?}");
    assert!(contains(&wire, single.as_bytes()));
    // the reply, a byte at a time
    for b in reply(&[1, 9, 5, -1, 0, 0, 1], 70) {
        c.handle_input(Instant::now(), &[b], &mut done);
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
    let mut c = SansIo::new(
        vec![("AUTH", b"*2\r\n$4\r\nAUTH\r\n$1\r\nx\r\n".to_vec())],
        T,
        Q,
    );
    c.connecting(Instant::now());
    c.submit(1, call(&p, "k", 1)).unwrap();
    c.connected();
    c.poll_transmit(Instant::now()).unwrap();
    let mut done = Vec::new();
    c.handle_input(
        Instant::now(),
        b"-WRONGPASS invalid username-password pair\r\n",
        &mut done,
    );
    assert!(c.is_down());
    let e = done[0].reply.as_ref().unwrap_err();
    assert!(e.to_string().contains("AUTH failed: WRONGPASS"), "{e}");
}

#[test]
fn a_burst_is_one_batch_call_and_each_check_gets_its_own_element() {
    let p = policy();
    let mut c = ready(Vec::new());
    for i in 1..=3 {
        c.submit(i, call(&p, &format!("k{i}"), 100 + i)).unwrap();
    }
    let wire = c.poll_transmit(Instant::now()).unwrap();
    let batch = check_scripts(p.0.compiled.algorithm).batch_sha;
    assert!(contains(&wire, batch.as_bytes()), "one batch call");
    assert_eq!(
        wire.iter().filter(|&&b| b == b'*').count(),
        1,
        "one command"
    );
    // the three replies in one array, cut in two anywhere
    let full = compact_reply(
        101,
        &[
            &[1, 9, 5, -1, 0, 0, 1],
            &[1, 8, 5, -1, 0, 0, 1],
            &[1, 7, 5, -1, 0, 0, 1],
        ],
    );
    for cut in [1, 5, full.len() / 2, full.len() - 1] {
        let mut c2 = ready(Vec::new());
        for i in 1..=3 {
            c2.submit(i, call(&p, &format!("k{i}"), 100 + i)).unwrap();
        }
        c2.poll_transmit(Instant::now()).unwrap();
        let mut done = Vec::new();
        c2.handle_input(Instant::now(), &full[..cut], &mut done);
        assert!(done.is_empty(), "cut {cut}");
        c2.handle_input(Instant::now(), &full[cut..], &mut done);
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
    c.submit(1, call(&p, "a", 11)).unwrap();
    c.submit(2, call(&p, "b", 12)).unwrap();
    c.poll_transmit(Instant::now()).unwrap();
    c.submit(3, call(&p, "c", 13)).unwrap(); // queued, not sent
                                             // the batch's elements swapped: neither may take the other's decision
                                             // (a compact batch: each check's reply carries its place in the call)
    let mut swapped = b"*3\r\n:11\r\n".to_vec();
    swapped.extend(reply(&[1, 1, 5, -1, 0, 0, 1], 2));
    swapped.extend(reply(&[1, 2, 5, -1, 0, 0, 1], 1));
    let mut done = Vec::new();
    c.handle_input(Instant::now(), &swapped, &mut done);
    assert!(c.is_down());
    let mut ids: Vec<u64> = done.iter().map(|d| d.id).collect();
    ids.sort();
    assert_eq!(ids, vec![1, 2, 3]);
    for d in &done {
        let e = d.reply.as_ref().unwrap_err();
        assert!(e.to_string().contains("another call's tag"), "{e}");
    }
    // and nothing more is read from that socket
    c.handle_input(Instant::now(), &reply(&[1], 13), &mut done);
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
            c.submit(1, call(&p, "k", 5)).unwrap();
            c.poll_transmit(Instant::now()).unwrap();
        }
        let mut done = Vec::new();
        c.handle_input(Instant::now(), &bytes, &mut done);
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
    c.submit(1, call(&p, "a", 21)).unwrap();
    c.submit(2, call(&p, "b", 22)).unwrap();
    c.poll_transmit(Instant::now()).unwrap();
    let mut done = Vec::new();
    c.handle_input(
        Instant::now(),
        b"-NOSCRIPT No matching script.\r\n",
        &mut done,
    );
    assert!(done.is_empty(), "retried, not failed");
    let wire = c.poll_transmit(Instant::now()).unwrap();
    assert!(wire.starts_with(b"*"), "{wire:?}");
    assert!(contains(&wire, b"$4\r\nEVAL\r\n"), "EVAL of the source");
    let src = check_scripts(p.0.compiled.algorithm).batch_src;
    assert!(contains(&wire, src.as_bytes()));
    let full = compact_reply(21, &[&[1, 9, 5, -1, 0, 0, 1], &[1, 8, 5, -1, 0, 0, 1]]);
    c.handle_input(Instant::now(), &full, &mut done);
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|d| d.reply.is_ok()));
    // a second NOSCRIPT is the check's answer (a script error), not a loop
    c.submit(3, call(&p, "c", 23)).unwrap();
    c.poll_transmit(Instant::now()).unwrap();
    c.handle_input(
        Instant::now(),
        b"-NOSCRIPT No matching script.\r\n",
        &mut done,
    );
    c.poll_transmit(Instant::now()).unwrap();
    c.handle_input(
        Instant::now(),
        b"-NOSCRIPT No matching script.\r\n",
        &mut done,
    );
    assert!(done[2].reply.as_ref().unwrap().is_noscript());
}

#[test]
fn a_silent_shard_closes_the_connection_a_queued_check_never_times_out() {
    let p = policy();
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut c = ready(Vec::new());
    // submitted long before it is written: time queued in the host is not the shard's
    c.submit(1, call(&p, "a", 31)).unwrap();
    assert_eq!(c.next_deadline(), None, "nothing is out: no deadline");
    let mut done = Vec::new();
    c.handle_timeout(t0 + ms(500), &mut done);
    assert!(done.is_empty() && !c.is_down());
    // written at t0+500: silent from there
    let t1 = t0 + ms(500);
    c.poll_transmit(t1).unwrap();
    c.submit(2, call(&p, "b", 32)).unwrap();
    c.poll_transmit(t1 + ms(30)).unwrap();
    assert_eq!(
        c.next_deadline(),
        Some(t1 + T),
        "from the oldest request's write"
    );
    // the first reply whole at t1+40 moves the silence's start; a byte of the next does not
    c.handle_input(t1 + ms(40), &reply(&[1, 9, 5, -1, 0, 0, 1], 31), &mut done);
    assert_eq!(done.len(), 1);
    assert!(done.remove(0).reply.is_ok());
    c.handle_input(t1 + ms(45), b"*", &mut done);
    assert_eq!(c.next_deadline(), Some(t1 + ms(40) + T));
    c.handle_timeout(t1 + T, &mut done);
    assert!(done.is_empty() && !c.is_down(), "the shard is replying");
    c.handle_timeout(t1 + ms(40) + T, &mut done);
    assert!(c.is_down());
    assert_eq!(done.len(), 1);
    for d in &done {
        let e = d.reply.as_ref().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("sent nothing for 50 ms"), "{e}");
    }
    // a connect that does not finish within the timeout
    let mut c = SansIo::new(Vec::new(), T, Q);
    c.connecting(t0);
    c.submit(5, call(&p, "e", 35)).unwrap();
    let mut done = Vec::new();
    c.handle_timeout(t0 + T, &mut done);
    assert!(c.is_down());
    assert!(done[0]
        .reply
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("connect timed out"));
}

#[test]
fn a_long_pipeline_that_keeps_replying_is_never_silent() {
    // 10,000 checks out at once, answered one every 10 ms for 100 s: not one fails
    let p = policy();
    let t0 = Instant::now();
    let mut c = ready(Vec::new());
    let n = 2_000u64;
    for i in 0..n {
        c.submit(i, call(&p, "k", 1000 + i)).unwrap();
        // one write per check: each its own reply
        c.poll_transmit(t0).unwrap();
    }
    let mut done = Vec::new();
    for i in 0..n {
        let now = t0 + Duration::from_millis(10 * (i + 1));
        c.handle_timeout(now, &mut done);
        assert!(!c.is_down(), "declared silent at reply {i}");
        c.handle_input(now, &reply(&[1, 1, 5, -1, 0, 0, 1], 1000 + i), &mut done);
    }
    assert_eq!(done.len(), n as usize);
    assert!(done.iter().all(|d| d.reply.is_ok()));
    assert_eq!(c.next_deadline(), None);
}

#[test]
fn a_reply_dripped_a_byte_at_a_time_is_silence_one_that_flows_is_not() {
    let p = policy();
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    // a byte every 10 ms of a reply that never ends: failed at the deadline of its write
    let mut c = ready(Vec::new());
    c.submit(1, call(&p, "a", 41)).unwrap();
    c.poll_transmit(t0).unwrap();
    let mut done = Vec::new();
    let mut drip = b"*1\r\n$1048000\r\n".to_vec();
    drip.resize(40, b'x');
    for (i, byte) in drip.iter().enumerate().take(4) {
        let now = t0 + ms(10 * (i as u64 + 1));
        c.handle_input(now, &[*byte], &mut done);
        assert_eq!(
            c.next_deadline(),
            Some(t0 + T),
            "byte {i} moved the deadline"
        );
    }
    c.handle_timeout(t0 + T, &mut done);
    assert!(
        c.is_down(),
        "a dripped reply held the call past its deadline"
    );
    assert_eq!(done.len(), 1);
    assert!(done[0].reply.as_ref().unwrap_err().kind() == io::ErrorKind::TimedOut);

    // a large command reply that comes in 64 KiB pieces 40 ms apart (over 50 ms in all)
    // is progress: it completes
    let mut c = ready(Vec::new());
    c.submit_command(2, b"*1\r\n$4\r\nPING\r\n".to_vec())
        .unwrap();
    c.poll_transmit(t0).unwrap();
    let body = vec![b'y'; 4 * PROGRESS_BYTES];
    let mut whole = format!("${}\r\n", body.len()).into_bytes();
    whole.extend_from_slice(&body);
    whole.extend_from_slice(b"\r\n");
    let mut done = Vec::new();
    for (i, piece) in whole.chunks(PROGRESS_BYTES).enumerate() {
        let now = t0 + ms(40 * (i as u64 + 1));
        c.handle_timeout(now, &mut done);
        assert!(!c.is_down(), "declared silent at piece {i}");
        c.handle_input(now, piece, &mut done);
    }
    assert_eq!(done.len(), 1);
    assert!(done[0].reply.is_ok(), "{:?}", done[0].reply);
}

#[test]
fn a_full_queue_refuses_a_check_as_overloaded_and_takes_it_again_once_answered() {
    let p = policy();
    let mut c = SansIo::new(Vec::new(), T, 2);
    c.connecting(Instant::now());
    c.connected();
    c.submit(1, call(&p, "a", 51)).unwrap();
    c.submit(2, call(&p, "b", 52)).unwrap();
    let e = c.submit(3, call(&p, "c", 53)).unwrap_err();
    let o = crate::transport::overloaded(&e).expect("an Overloaded error");
    assert_eq!(o.max_queue, 2);
    assert!(!c.is_down(), "the connection is fine");
    // written and waiting still count
    c.poll_transmit(Instant::now()).unwrap();
    assert!(c.submit(3, call(&p, "c", 53)).is_err());
    let full = compact_reply(51, &[&[1, 9, 5, -1, 0, 0, 1], &[1, 8, 5, -1, 0, 0, 1]]);
    let mut done = Vec::new();
    c.handle_input(Instant::now(), &full, &mut done);
    assert_eq!(done.len(), 2);
    c.submit(3, call(&p, "c", 53)).unwrap();
}

#[test]
fn a_command_gets_its_frame_under_the_larger_bound() {
    let mut c = ready(Vec::new());
    c.submit_command(9, b"*1\r\n$4\r\nPING\r\n".to_vec())
        .unwrap();
    assert_eq!(
        c.poll_transmit(Instant::now()).unwrap(),
        b"*1\r\n$4\r\nPING\r\n"
    );
    // 2 MiB: over a check's bound, within a command's
    let big = vec![b'x'; 2 << 20];
    let mut frame = format!("${}\r\n", big.len()).into_bytes();
    frame.extend(&big);
    frame.extend(b"\r\n");
    let mut done = Vec::new();
    c.handle_input(Instant::now(), &frame, &mut done);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].reply.as_ref().unwrap(), &Reply::Str(frame));
    assert!(!c.is_down());
}

#[test]
fn a_closed_socket_fails_every_call_and_a_new_one_starts_clean() {
    let p = policy();
    let mut c = ready(Vec::new());
    c.submit(1, call(&p, "a", 41)).unwrap();
    c.poll_transmit(Instant::now()).unwrap();
    let mut done = Vec::new();
    // half a reply, then the socket closes
    let r = reply(&[1, 9, 5, -1, 0, 0, 1], 41);
    c.handle_input(Instant::now(), &r[..7], &mut done);
    c.handle_closed("the connection to Redis broke", &mut done);
    assert!(c.is_down());
    assert!(done[0].reply.is_err());
    // the next connection does not see the old half reply
    c.connecting(Instant::now());
    c.connected();
    c.submit(2, call(&p, "b", 42)).unwrap();
    c.poll_transmit(Instant::now()).unwrap();
    c.handle_input(
        Instant::now(),
        &reply(&[1, 8, 5, -1, 0, 0, 1], 42),
        &mut done,
    );
    assert_eq!(done.len(), 2);
    assert_eq!(done[1].id, 2);
    assert!(done[1].reply.is_ok());
}
