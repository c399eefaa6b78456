//! RESP2, the Redis protocol, as the core's own connections speak it: framing of replies
//! under hard limits, and the parse of a framed reply.
//!
//! Every byte from Redis is untrusted (a proxy, a broken or hostile server). So a reply is
//! first *framed*: [`Framer`] scans it without allocating, resumes where it stopped when
//! more bytes arrive (no byte is scanned twice, so a reply that trickles in costs linear
//! time) and rejects, as soon as a header says so, anything beyond the limits: nesting
//! deeper than [`MAX_DEPTH`], a bulk string or a whole reply longer than the caller's
//! bound, an over-long line, a count that cannot fit, a type RESP2 does not have. Only a
//! complete, framed reply is parsed ([`parse_frame`], recursion bounded by the framer's
//! depth limit) or handed to the redis crate's parser (`redis::parse_redis_value`). A
//! framing error means the reply stream is in doubt: the connection is closed, never
//! reused.

use std::io;

/// The deepest nesting of arrays a reply may have. The scripts answer with at most two
/// levels (a batch call: an array of arrays).
pub(crate) const MAX_DEPTH: usize = 8;
/// The longest reply of a check script (single or batch), in bytes. A batch of 128 checks
/// answers with about 25 KB.
pub(crate) const MAX_CHECK_REPLY: usize = 1 << 20;
/// The longest reply of any other command (DUMP of a key's state for a reshard handoff is
/// the largest), in bytes.
pub(crate) const MAX_REPLY: usize = 64 << 20;
/// The longest status, error or integer line, in bytes.
pub(crate) const MAX_LINE: usize = 64 << 10;

/// A reply of Redis (the RESP2 types the scripts answer with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Nil,
    Int(i64),
    Str(Vec<u8>),
    Array(Vec<Reply>),
    /// An error reply (`-ERR ...`, `-NOSCRIPT ...`).
    Error(String),
}

impl Reply {
    /// The server lost the script (restart, SCRIPT FLUSH): send it with EVAL.
    pub fn is_noscript(&self) -> bool {
        matches!(self, Reply::Error(e) if e.starts_with("NOSCRIPT"))
    }
}

/// A reply shown in an error message: at most a couple hundred characters of it (a
/// hostile reply can be megabytes).
pub(crate) struct Shown<'a>(pub &'a Reply);

impl std::fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let full = format!("{:?}", self.0);
        match full.char_indices().nth(200) {
            Some((i, _)) => write!(f, "{} ...", &full[..i]),
            None => f.write_str(&full),
        }
    }
}

pub(crate) fn protocol(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Finds where each reply of a stream ends, under the limits above. Feed it the buffer
/// that starts with the reply (the same buffer, grown, on every call) until it answers
/// `Some(len)`; then drop `len` bytes from the buffer and go on with the next reply.
#[derive(Debug, Default)]
pub(crate) struct Framer {
    /// How many bytes of the current reply are scanned already.
    at: usize,
    /// For each array still open, how many of its elements are still to come.
    open: Vec<u64>,
}

/// Where the line at the front of `b` ends (the index of its CR): `Ok(None)` while its end
/// has not arrived; an error for a CR without LF or a line over [`MAX_LINE`].
fn line_end(b: &[u8]) -> io::Result<Option<usize>> {
    let window = &b[..b.len().min(MAX_LINE + 2)];
    match window.iter().position(|&c| c == b'\r') {
        Some(i) if i + 1 == window.len() => Ok(None),
        Some(i) if window[i + 1] == b'\n' => Ok(Some(i)),
        Some(_) => Err(protocol("a reply line with a CR but no LF")),
        None if window.len() > MAX_LINE => Err(protocol(format!(
            "a reply line longer than {MAX_LINE} bytes"
        ))),
        None => Ok(None),
    }
}

/// A RESP integer: an optional `-` and 1 to 19 digits, nothing else.
fn int(s: &[u8]) -> io::Result<i64> {
    let digits = s.strip_prefix(b"-").unwrap_or(s);
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(protocol(format!(
            "bad integer {:?} in a reply",
            String::from_utf8_lossy(&s[..s.len().min(32)])
        )));
    }
    std::str::from_utf8(s)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| protocol("integer out of range in a reply"))
}

impl Framer {
    /// `Ok(Some(len))`: `buf[..len]` is one whole reply. `Ok(None)`: not complete yet.
    /// `Err`: not a reply within the limits (`max` bytes in all): the stream is in doubt.
    pub fn next(&mut self, buf: &[u8], max: usize) -> io::Result<Option<usize>> {
        loop {
            let rest = &buf[self.at..];
            let Some(&tag) = rest.first() else {
                return Ok(None);
            };
            let Some(end) = line_end(&rest[1..])? else {
                return Ok(None);
            };
            let head = &rest[1..1 + end];
            let mut used = 1 + end + 2;
            match tag {
                b'+' | b'-' => {}
                b':' => {
                    int(head)?;
                }
                b'$' => {
                    let n = int(head)?;
                    if n >= 0 {
                        let n = n as u64;
                        if n > max as u64 {
                            return Err(protocol(format!(
                                "a reply announces a string of {n} bytes, over the bound of {max}"
                            )));
                        }
                        let n = n as usize;
                        if rest.len() < used + n + 2 {
                            return Ok(None); // the header is scanned again: a few bytes
                        }
                        if &rest[used + n..used + n + 2] != b"\r\n" {
                            return Err(protocol("a bulk string without its end (CRLF)"));
                        }
                        used += n + 2;
                    } else if n != -1 {
                        return Err(protocol(format!("a bulk string of length {n}")));
                    }
                }
                b'*' => {
                    let n = int(head)?;
                    if n > 0 {
                        // every element takes at least 3 bytes
                        if n as u64 > (max / 3) as u64 {
                            return Err(protocol(format!(
                                "a reply announces {n} elements, over the bound of {max} bytes"
                            )));
                        }
                        if self.open.len() == MAX_DEPTH {
                            return Err(protocol(format!(
                                "a reply nested deeper than {MAX_DEPTH} levels"
                            )));
                        }
                        self.at += used;
                        self.open.push(n as u64);
                        continue;
                    } else if n < -1 {
                        return Err(protocol(format!("an array of length {n}")));
                    }
                }
                other => {
                    return Err(protocol(format!(
                        "a reply of unknown type {:?}",
                        (other as char).escape_default().to_string()
                    )))
                }
            }
            self.at += used;
            if self.at > max {
                return Err(protocol(format!("a reply over the bound of {max} bytes")));
            }
            // one element is complete: so may be the arrays it closes
            loop {
                match self.open.last_mut() {
                    None => {
                        let len = self.at;
                        self.at = 0;
                        return Ok(Some(len));
                    }
                    Some(left) => {
                        *left -= 1;
                        if *left > 0 {
                            break;
                        }
                        self.open.pop();
                    }
                }
            }
        }
    }
}

/// Parses one reply that [`Framer`] framed (so it is complete, well-formed and at most
/// [`MAX_DEPTH`] deep).
pub(crate) fn parse_frame(b: &[u8]) -> io::Result<Reply> {
    let (r, used) = parse_at(b, 0)?;
    if used != b.len() {
        return Err(protocol("bytes after a framed reply"));
    }
    Ok(r)
}

fn parse_at(b: &[u8], depth: usize) -> io::Result<(Reply, usize)> {
    let malformed = || protocol("a malformed reply");
    if depth > MAX_DEPTH {
        return Err(protocol("a reply nested too deep"));
    }
    let tag = *b.first().ok_or_else(malformed)?;
    let end = line_end(&b[1..])?.ok_or_else(malformed)?;
    let head = &b[1..1 + end];
    let used = 1 + end + 2;
    Ok(match tag {
        b'+' => (Reply::Str(head.to_vec()), used),
        b'-' => (
            Reply::Error(String::from_utf8_lossy(head).into_owned()),
            used,
        ),
        b':' => (Reply::Int(int(head)?), used),
        b'$' => {
            let n = int(head)?;
            if n < 0 {
                return Ok((Reply::Nil, used));
            }
            let n = n as usize;
            let s = b.get(used..used + n).ok_or_else(malformed)?;
            (Reply::Str(s.to_vec()), used + n + 2)
        }
        b'*' => {
            let n = int(head)?;
            if n < 0 {
                return Ok((Reply::Nil, used));
            }
            let mut items = Vec::with_capacity((n as usize).min(256));
            let mut at = used;
            for _ in 0..n {
                let (item, u) = parse_at(b.get(at..).ok_or_else(malformed)?, depth + 1)?;
                items.push(item);
                at += u;
            }
            (Reply::Array(items), at)
        }
        _ => return Err(malformed()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(b: &[u8]) -> io::Result<Option<usize>> {
        Framer::default().next(b, MAX_CHECK_REPLY)
    }

    #[test]
    fn frames_and_parses_replies_and_waits_for_the_rest() {
        let full = b"*3\r\n:1\r\n$3\r\nabc\r\n*2\r\n:-5\r\n$-1\r\n+OK\r\n";
        let used = frame(full).unwrap().unwrap();
        assert_eq!(
            parse_frame(&full[..used]).unwrap(),
            Reply::Array(vec![
                Reply::Int(1),
                Reply::Str(b"abc".to_vec()),
                Reply::Array(vec![Reply::Int(-5), Reply::Nil]),
            ])
        );
        assert_eq!(&full[used..], b"+OK\r\n");
        // every proper prefix is incomplete, never an error, fed whole or byte by byte
        for cut in 0..used {
            assert_eq!(frame(&full[..cut]).unwrap(), None, "prefix of {cut} bytes");
        }
        let mut f = Framer::default();
        for cut in 0..used {
            assert_eq!(f.next(&full[..cut], MAX_CHECK_REPLY).unwrap(), None);
        }
        assert_eq!(f.next(&full[..], MAX_CHECK_REPLY).unwrap(), Some(used));
        // and the framer is ready for the next reply
        assert_eq!(f.next(b"+OK\r\n", MAX_CHECK_REPLY).unwrap(), Some(5));
        let e = b"-NOSCRIPT No matching script\r\n";
        assert_eq!(frame(e).unwrap(), Some(30));
        assert!(parse_frame(e).unwrap().is_noscript());
        assert_eq!(parse_frame(b"*0\r\n").unwrap(), Reply::Array(vec![]));
        assert_eq!(parse_frame(b"*-1\r\n").unwrap(), Reply::Nil);
    }

    #[test]
    fn rejects_what_is_not_resp2() {
        for bad in [
            &b":12x\r\n"[..],
            b":\r\n",
            b":+1\r\n",
            b": 1\r\n",
            b":99999999999999999999\r\n",
            b"%1\r\n",
            b"_\r\n",
            b"$3\r\nabcXY",
            b"$-2\r\n",
            b"*-2\r\n",
            b"$abc\r\n",
            b"+OK\rX\n",
        ] {
            assert!(frame(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn deep_nesting_is_an_error_at_once() {
        // 100,000 levels used to overflow the stack of a recursive parser
        let deep = b"*1\r\n".repeat(100_000);
        let e = frame(&deep).unwrap_err();
        assert!(e.to_string().contains("nested deeper"), "{e}");
        // the deepest allowed nesting frames and parses
        let mut ok = b"*1\r\n".repeat(MAX_DEPTH);
        ok.extend_from_slice(b":7\r\n");
        let n = frame(&ok).unwrap().unwrap();
        assert_eq!(n, ok.len());
        parse_frame(&ok).unwrap();
        let mut over = b"*1\r\n".repeat(MAX_DEPTH + 1);
        over.extend_from_slice(b":7\r\n");
        assert!(frame(&over).is_err());
    }

    #[test]
    fn announced_sizes_over_the_bound_are_errors_before_any_data() {
        // a bulk of 2^40 bytes: refused from its header, nothing buffered
        let e = frame(b"$1099511627776\r\n").unwrap_err();
        assert!(e.to_string().contains("over the bound"), "{e}");
        assert!(frame(b"*1000000000\r\n").is_err());
        // a bulk just within the bound is waited for
        let n = MAX_CHECK_REPLY - 16;
        assert_eq!(frame(format!("${n}\r\n").as_bytes()).unwrap(), None);
        // an endless stream of small elements ends at the bound
        let mut f = Framer::default();
        let mut stream = b"*300000\r\n".to_vec();
        let mut err = None;
        for _ in 0..300_000 {
            stream.extend_from_slice(b":1\r\n");
            if stream.len() % 4096 < 4 {
                if let Err(e) = f.next(&stream, 64 << 10) {
                    err = Some(e);
                    break;
                }
            }
        }
        assert!(
            err.is_some(),
            "a reply of {} bytes was accepted",
            stream.len()
        );
        assert!(stream.len() < (64 << 10) + 8192);
        // a line that never ends
        let line = [b"+".as_slice(), &vec![b'a'; MAX_LINE + 8]].concat();
        assert!(frame(&line).is_err());
    }

    #[test]
    fn a_trickled_reply_is_scanned_once() {
        // 50,000 elements arriving a few bytes at a time: linear, not quadratic
        let mut full = b"*50000\r\n".to_vec();
        for i in 0..50_000 {
            full.extend_from_slice(format!(":{i}\r\n").as_bytes());
        }
        let mut f = Framer::default();
        let mut got = None;
        for cut in (0..=full.len()).step_by(7).chain([full.len()]) {
            if let Some(n) = f.next(&full[..cut], MAX_CHECK_REPLY).unwrap() {
                got = Some(n);
                break;
            }
        }
        assert_eq!(got, Some(full.len()));
        match parse_frame(&full).unwrap() {
            Reply::Array(items) => assert_eq!(items.len(), 50_000),
            other => panic!("{other:?}"),
        }
    }

    /// A small deterministic generator (xorshift), so the property tests need no crate and
    /// replay the same cases every run.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    fn random_reply(rng: &mut Rng, depth: usize) -> Reply {
        match rng.below(if depth >= MAX_DEPTH { 5 } else { 7 }) {
            0 => Reply::Nil,
            1 => Reply::Int(rng.next() as i64),
            2 => Reply::Int(rng.below(1000) as i64 - 500),
            3 => Reply::Str((0..rng.below(40)).map(|_| rng.next() as u8).collect()),
            4 => Reply::Error(format!("ERR case {}", rng.below(1000))),
            _ => Reply::Array(
                (0..rng.below(6))
                    .map(|_| random_reply(rng, depth + 1))
                    .collect(),
            ),
        }
    }

    fn encode(r: &Reply, out: &mut Vec<u8>) {
        match r {
            Reply::Nil => out.extend_from_slice(b"$-1\r\n"),
            Reply::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Reply::Str(s) => {
                out.extend_from_slice(format!("${}\r\n", s.len()).as_bytes());
                out.extend_from_slice(s);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Error(e) => out.extend_from_slice(format!("-{e}\r\n").as_bytes()),
            Reply::Array(items) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for i in items {
                    encode(i, out);
                }
            }
        }
    }

    #[test]
    fn property_any_reply_round_trips_however_it_is_cut() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for case in 0..3000 {
            // two replies back to back, fed in random pieces
            let (a, b) = (random_reply(&mut rng, 0), random_reply(&mut rng, 0));
            let mut wire = Vec::new();
            encode(&a, &mut wire);
            let first = wire.len();
            encode(&b, &mut wire);
            let mut f = Framer::default();
            let mut fed = 0;
            let len = loop {
                fed = (fed + 1 + rng.below(16) as usize).min(wire.len());
                if let Some(n) = f.next(&wire[..fed], MAX_CHECK_REPLY).unwrap() {
                    break n;
                }
                assert!(fed < wire.len(), "case {case}: never complete");
            };
            assert_eq!(len, first, "case {case}");
            assert_eq!(parse_frame(&wire[..len]).unwrap(), a, "case {case}");
            let rest = &wire[len..];
            assert_eq!(f.next(rest, MAX_CHECK_REPLY).unwrap(), Some(rest.len()));
            assert_eq!(parse_frame(rest).unwrap(), b, "case {case}");
        }
    }

    #[test]
    fn property_mangled_bytes_never_panic_and_never_frame_past_the_input() {
        let mut rng = Rng(0xD1B5_4A32_D192_ED03);
        for _ in 0..20_000 {
            let mut wire = Vec::new();
            encode(&random_reply(&mut rng, 0), &mut wire);
            // flip, drop, insert or truncate a few bytes
            for _ in 0..1 + rng.below(3) {
                if wire.is_empty() {
                    break;
                }
                let at = rng.below(wire.len() as u64) as usize;
                match rng.below(4) {
                    0 => wire[at] = rng.next() as u8,
                    1 => {
                        wire.remove(at);
                    }
                    2 => wire.insert(at, b"*$:+-\r\n0123456789"[rng.below(17) as usize]),
                    _ => wire.truncate(at),
                }
            }
            let mut f = Framer::default();
            if let Ok(Some(n)) = f.next(&wire, 1 << 16) {
                assert!(n <= wire.len());
                // a framed reply always parses
                parse_frame(&wire[..n]).unwrap();
            }
        }
    }
}
