//! The wire form of check script calls, shared by both transports that carry them (the
//! pipelined connection, [`crate::transport::pipe`], and the host-driven one,
//! [`crate::transport::sansio`]): the tag each call's reply must carry, one check call in
//! parts ([`CheckCall`]), the packing of a burst's calls of one algorithm into one single or
//! batch script call ([`pack_calls`], `core/lua/main_batch.lua`), and the splitting of a
//! batch reply into each caller's reply ([`split_batch`]).

use crate::transport::resp::Reply;
use crate::wire::scripts::CheckScripts;
use crate::wire::{CheckPart, CheckSink};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// The most checks one batch call carries: bounds how long one script call holds Redis.
pub(crate) const MAX_BATCH: usize = 128;

/// The tags are 53-bit (Lua numbers hold them exactly).
const TAG_MASK: u64 = (1 << 53) - 1;

/// A number no other check call carries: not in this process (a counter), and not in
/// another process or a forked child (the counter starts at a random point, drawn from the
/// OS's random source in every process and again in every forked child, which would
/// otherwise go on with its parent's numbers). The check scripts echo it as the last value
/// of their reply, so a reply is taken only by the call it answers: whatever goes wrong
/// with a reply stream (a proxy that mixes connections, a reply that comes late), no caller
/// gets a decision made for another.
pub(crate) fn next_tag() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // the fork generation the counter's start was drawn in (MAX: not yet)
    static DRAWN_IN: AtomicU64 = AtomicU64::new(u64::MAX);
    let generation = crate::transport::runtime::fork_generation();
    if DRAWN_IN.load(Ordering::Acquire) != generation {
        NEXT.store(random_u64() & TAG_MASK, Ordering::Release);
        DRAWN_IN.store(generation, Ordering::Release);
    }
    NEXT.fetch_add(1, Ordering::Relaxed) & TAG_MASK
}

/// 64 bits from the OS's random source (`/dev/urandom`); where it cannot be read, the
/// standard library's randomly keyed hasher over the process id and the time.
fn random_u64() -> u64 {
    #[cfg(unix)]
    {
        use std::io::Read;
        let mut b = [0u8; 8];
        if std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut b))
            .is_ok()
        {
            return u64::from_ne_bytes(b);
        }
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Why a reply with another call's tag is refused (and its connection closed).
pub(crate) const NOT_THEIRS: &str = "a reply carrying another call's tag";

/// What becomes of a check's reply, given the tag of its call: the tag is taken off a
/// reply that carries it (`Ok`); a reply that carries another call's tag is `Err` (the
/// stream it came on is in doubt). The tag comes back as an integer, or as the decimal
/// string it was sent as (a plain check echoes its argument: no number to parse).
/// Replies without a tag at the end (error replies, malformed ones) pass as they are, for
/// the caller's checks of the reply to reject.
pub(crate) fn untag(reply: Reply, tag: u64) -> Result<Reply, Reply> {
    match reply {
        Reply::Array(mut items) => match items.last().and_then(|t| is_tag(t, tag)) {
            Some(true) => {
                items.pop();
                Ok(Reply::Array(items))
            }
            Some(false) => Err(Reply::Array(items)),
            None => Ok(Reply::Array(items)),
        },
        other => Ok(other),
    }
}

/// Whether a value where a tag goes is `tag` (an integer, or its decimal string); `None`:
/// not an integer or a string, so no tag at all.
fn is_tag(value: &Reply, tag: u64) -> Option<bool> {
    match value {
        Reply::Int(t) => Some(*t >= 0 && *t as u64 == tag),
        Reply::Str(t) => Some(t.as_slice() == itoa::Buffer::new().format(tag).as_bytes()),
        _ => None,
    }
}

/// One check script call, in parts the writer can put into a single or a batch call.
pub(crate) struct CheckCall {
    /// the check's algorithm's scripts
    pub(crate) scripts: &'static CheckScripts,
    /// the server lost the scripts (NOSCRIPT): send the source (EVAL), which loads it
    pub(crate) eval: bool,
    /// packed (`$<len>\r\n<arg>\r\n` each): the keys, the check's own arguments from
    /// `item_at`, its policy's from `shape_at`, its tag from `tag_at`
    packed: Vec<u8>,
    /// where the first key ends (the state's; the block entry's follows)
    key_at: usize,
    item_at: usize,
    shape_at: usize,
    tag_at: usize,
    /// how many arguments were written, and how many before `item_at` (the keys),
    /// `shape_at` and `tag_at`: each group's length is the policy's and the call's
    args: usize,
    keys: usize,
    before_shape: usize,
    before_tag: usize,
    /// the tag its reply must carry
    pub(crate) tag: u64,
}

impl CheckCall {
    /// The call whose arguments `write` writes (in the layout of [`crate::wire`]), and
    /// whose reply carries `tag`.
    pub fn new(
        scripts: &'static CheckScripts,
        eval: bool,
        tag: u64,
        write: impl FnOnce(&mut CheckCall),
    ) -> CheckCall {
        let mut call = CheckCall {
            scripts,
            eval,
            packed: Vec::with_capacity(192),
            key_at: 0,
            item_at: 0,
            shape_at: 0,
            tag_at: 0,
            args: 0,
            keys: 0,
            before_shape: 0,
            before_tag: 0,
            tag,
        };
        write(&mut call);
        call
    }

    fn shape(&self) -> &[u8] {
        &self.packed[self.shape_at..self.tag_at]
    }

    /// Whether this call fits the compact batch layout with `first`: a plain check (its
    /// state and block entry as keys, cost 1, no flags) of a policy whose values are
    /// `first`'s limit and period alone.
    fn fits_compact(&self, first: &CheckCall) -> bool {
        self.keys == 2
            && self.args - self.before_tag == 1
            && self.before_tag - self.before_shape == 2
            && &self.packed[self.item_at..self.shape_at] == b"$1\r\n1\r\n"
            && self.shape() == first.shape()
    }
}

impl CheckSink for CheckCall {
    fn arg(&mut self, a: &[u8]) {
        bulk(&mut self.packed, a);
        self.args += 1;
        if self.args == 1 {
            self.key_at = self.packed.len();
        }
    }
    fn mark(&mut self, part: CheckPart) {
        let at = self.packed.len();
        match part {
            CheckPart::Item => (self.item_at, self.keys) = (at, self.args),
            CheckPart::Shape => (self.shape_at, self.before_shape) = (at, self.args),
            CheckPart::Tag => (self.tag_at, self.before_tag) = (at, self.args),
        }
    }
}

/// Whether the batch call of `calls` (more than one) is in the compact layout: every one
/// a plain check with cost 1 of the first one's policy values ([`pack_calls`]).
pub(crate) fn is_compact<'a>(calls: impl IntoIterator<Item = &'a CheckCall>) -> bool {
    let mut calls = calls.into_iter();
    match calls.next() {
        Some(first) => first.fits_compact(first) && calls.all(|c| c.fits_compact(first)),
        None => false,
    }
}

/// The reply of one batch call, split into the replies of its checks (whose tags are
/// `tags`, in order): each element is untagged, and only if every one is its check's are
/// they handed out (`Err`: the stream is in doubt). A check's reply is an element (an
/// array, or an error reply), or, where an integer starts one, the three values of a short
/// admission inline (`remaining`, `reset_after`, the tag: core/lua/main_batch.lua). A reply
/// that is not an array of one reply per check (NOSCRIPT, OOM, anything else) becomes each
/// check's error reply. A `compact` call's reply ([`is_compact`]) starts with the call's
/// tag (the first check's), and each check's reply carries its place in the call (1..=n)
/// where its tag goes: a reply for another call, or replies out of order, are not taken.
pub(crate) fn split_batch(
    reply: Reply,
    mut tags: impl ExactSizeIterator<Item = u64>,
    compact: bool,
) -> io::Result<Vec<Reply>> {
    if !compact {
        return split_replies(reply, tags);
    }
    let n = tags.len();
    let call_tag = tags.next().unwrap_or(0);
    match reply {
        Reply::Array(mut items) if !items.is_empty() => match is_tag(&items[0], call_tag) {
            Some(true) => {
                items.remove(0);
                split_replies(Reply::Array(items), (1..n + 1).map(|p| p as u64))
            }
            Some(false) => Err(crate::transport::resp::protocol(NOT_THEIRS)),
            None => split_replies(Reply::Array(items), (1..n + 1).map(|p| p as u64)),
        },
        other => split_replies(other, (1..n + 1).map(|p| p as u64)),
    }
}

fn split_replies(reply: Reply, tags: impl ExactSizeIterator<Item = u64>) -> io::Result<Vec<Reply>> {
    let not_theirs = || crate::transport::resp::protocol(NOT_THEIRS);
    let n = tags.len();
    Ok(match reply {
        Reply::Array(items) if replies_in(&items) == Some(n) => {
            // every element must be its caller's before any is handed out
            let mut out = Vec::with_capacity(n);
            for (r, tag) in group_inline(items).zip(tags) {
                out.push(untag(r, tag).map_err(|_| not_theirs())?);
            }
            out
        }
        // the whole call failed (NOSCRIPT, OOM, ...): every check gets its error
        Reply::Error(e) => vec![Reply::Error(e); n],
        other => {
            let e = format!(
                "a batch of {n} checks got the reply {:?}",
                crate::transport::resp::Shown(&other)
            );
            vec![Reply::Error(e); n]
        }
    })
}

/// How many replies a batch reply's values are: an integer starts a short admission of
/// three values (two integers, then the tag, an integer or a string), anything else is a
/// reply of its own. `None`: an integer not followed so.
fn replies_in(items: &[Reply]) -> Option<usize> {
    let (mut i, mut n) = (0, 0);
    while i < items.len() {
        if let Reply::Int(_) = items[i] {
            match items.get(i + 1..i + 3)? {
                [Reply::Int(_), Reply::Int(_) | Reply::Str(_)] => i += 3,
                _ => return None,
            }
        } else {
            i += 1;
        }
        n += 1;
    }
    Some(n)
}

/// The replies of a batch reply's values ([`replies_in`] says how they group).
fn group_inline(items: Vec<Reply>) -> impl Iterator<Item = Reply> {
    let mut it = items.into_iter();
    std::iter::from_fn(move || {
        Some(match it.next()? {
            Reply::Int(remaining) => {
                let (reset, tag) = (it.next()?, it.next()?);
                Reply::Array(vec![Reply::Int(remaining), reset, tag])
            }
            other => other,
        })
    })
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
/// policy argument set sent once, after its length (core/lua/main_batch.lua); EVAL of the
/// source when one of them saw NOSCRIPT.
pub(crate) fn pack_calls(
    out: &mut Vec<u8>,
    calls: &[CheckCall],
    scratch: (&mut Vec<usize>, &mut Vec<usize>),
) {
    let first = &calls[0];
    let eval = calls.iter().any(|c| c.eval);
    let (op, script): (&[u8], &str) = match (calls.len() > 1, eval) {
        (false, false) => (b"EVALSHA", first.scripts.single_sha),
        (false, true) => (b"EVAL", first.scripts.single_src),
        (true, false) => (b"EVALSHA", first.scripts.batch_sha),
        (true, true) => (b"EVAL", first.scripts.batch_src),
    };
    if calls.len() == 1 {
        header(out, 3 + first.args);
        bulk(out, op);
        bulk(out, script.as_bytes());
        bulk(out, itoa::Buffer::new().format(first.keys).as_bytes());
        out.extend_from_slice(&first.packed);
        return;
    }
    if is_compact(calls) {
        // the compact layout: one shape, every check plain with cost 1, so per check its
        // keys alone (every state, then every block entry), then the call's tag (the first
        // check's; core/lua/main_batch.lua)
        let keys = calls.len() * 2;
        let shape_args = first.before_tag - first.before_shape;
        header(out, 3 + keys + 2 + shape_args + 1);
        bulk(out, op);
        bulk(out, script.as_bytes());
        bulk(out, itoa::Buffer::new().format(keys).as_bytes());
        for c in calls {
            out.extend_from_slice(&c.packed[..c.key_at]);
        }
        for c in calls {
            out.extend_from_slice(&c.packed[c.key_at..c.item_at]);
        }
        bulk(out, b"0");
        bulk(out, itoa::Buffer::new().format(shape_args).as_bytes());
        out.extend_from_slice(first.shape());
        out.extend_from_slice(&first.packed[first.tag_at..]);
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
    let keys: usize = calls.iter().map(|c| c.keys).sum();
    // per shape its length and its values; per call its shape, own values and tag
    let shape_args: usize = firsts
        .iter()
        .map(|&j| 1 + calls[j].before_tag - calls[j].before_shape)
        .sum();
    let call_args: usize = calls
        .iter()
        .map(|c| 1 + (c.before_shape - c.keys) + (c.args - c.before_tag))
        .sum();
    header(out, 3 + keys + 1 + shape_args + call_args);
    bulk(out, op);
    bulk(out, script.as_bytes());
    bulk(out, itoa::Buffer::new().format(keys).as_bytes());
    for c in calls {
        out.extend_from_slice(&c.packed[..c.item_at]);
    }
    bulk(out, itoa::Buffer::new().format(firsts.len()).as_bytes());
    for &j in firsts.iter() {
        let c = &calls[j];
        bulk(
            out,
            itoa::Buffer::new()
                .format(c.before_tag - c.before_shape)
                .as_bytes(),
        );
        out.extend_from_slice(c.shape());
    }
    for (c, shape) in calls.iter().zip(shapes.iter()) {
        bulk(out, itoa::Buffer::new().format(*shape).as_bytes());
        out.extend_from_slice(&c.packed[c.item_at..c.shape_at]);
        out.extend_from_slice(&c.packed[c.tag_at..]);
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// The arguments of the one command `calls` are packed into.
    fn packed(calls: &[CheckCall]) -> Vec<String> {
        let mut out = Vec::new();
        pack_calls(&mut out, calls, (&mut Vec::new(), &mut Vec::new()));
        let text = String::from_utf8(out).unwrap();
        let mut lines = text.split("\r\n");
        let n: usize = lines.next().unwrap()[1..].parse().unwrap();
        let mut args = Vec::new();
        while let Some(l) = lines.next() {
            if l.starts_with('$') {
                args.push(lines.next().unwrap().to_string());
            }
        }
        assert_eq!(args.len(), n, "the header counts the arguments");
        args
    }

    #[test]
    fn plain_checks_of_one_shape_and_cost_1_go_compact_the_others_in_full() {
        use crate::policy::Algorithm;
        let scripts = crate::wire::scripts::check_scripts(Algorithm::FixedWindow);
        let call = |key: &str, cost: u64, limit: u64, tag: u64| {
            CheckCall::new(scripts, false, tag, |c| {
                c.arg(format!("s{key}").as_bytes());
                c.arg(format!("b{key}").as_bytes());
                c.mark(CheckPart::Item);
                c.int(cost);
                c.mark(CheckPart::Shape);
                c.int(limit);
                c.int(60);
                c.mark(CheckPart::Tag);
                c.int(tag);
            })
        };
        let head = |keys: [&str; 4]| {
            let mut v = vec![
                "EVALSHA".to_string(),
                scripts.batch_sha.to_string(),
                "4".into(),
            ];
            v.extend(keys.map(String::from));
            v
        };
        let want = |rest: &[&str]| {
            let mut v = head(["s1", "b1", "s2", "b2"]);
            v.extend(rest.iter().map(|s| s.to_string()));
            v
        };
        // one shape, cost 1: the states, then the block entries; "0", the shape's length
        // and values, the first check's tag
        let mut compact = head(["s1", "s2", "b1", "b2"]);
        compact.extend(["0", "2", "10", "60", "7"].map(String::from));
        assert_eq!(packed(&[call("1", 1, 10, 7), call("2", 1, 10, 8)]), compact);
        // a cost of 2: every check its shape, cost and tag
        assert_eq!(
            packed(&[call("1", 1, 10, 7), call("2", 2, 10, 8)]),
            want(&["1", "2", "10", "60", "1", "1", "7", "1", "2", "8"])
        );
        // two shapes
        assert_eq!(
            packed(&[call("1", 1, 10, 7), call("2", 1, 11, 8)]),
            want(&["2", "2", "10", "60", "2", "11", "60", "1", "1", "7", "2", "1", "8"])
        );
        // a check with flags (a lease: "x" and its id) is never compact
        let lease = CheckCall::new(scripts, false, 8, |c| {
            c.arg(b"s2");
            c.arg(b"b2");
            c.mark(CheckPart::Item);
            c.int(1);
            c.arg(b"x");
            c.arg(b"l");
            c.mark(CheckPart::Shape);
            c.int(10);
            c.int(60);
            c.mark(CheckPart::Tag);
            c.int(8);
        });
        assert_eq!(
            packed(&[call("1", 1, 10, 7), lease]),
            want(&["1", "2", "10", "60", "1", "1", "7", "1", "1", "x", "l", "8"])
        );
    }

    /// The tags a forked child takes next, read back through a pipe.
    fn child_tags(n: usize) -> Vec<u64> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe() writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only takes tags, writes them to the pipe and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let tags: Vec<u8> = (0..n).flat_map(|_| next_tag().to_ne_bytes()).collect();
            // SAFETY: the buffer is valid for its length; _exit ends the child at once.
            unsafe {
                libc::write(fds[1], tags.as_ptr().cast(), tags.len());
                libc::_exit(0);
            }
        }
        // SAFETY: closes our copy of the write end; waits for the child we forked.
        unsafe {
            libc::close(fds[1]);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        let mut buf = vec![0u8; n * 8];
        // SAFETY: `buf` is valid for writes of its length.
        let got = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
        // SAFETY: closes the read end, ours.
        unsafe { libc::close(fds[0]) };
        assert_eq!(got as usize, buf.len(), "the child's tags");
        buf.chunks(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn a_tag_is_taken_as_an_integer_or_as_the_string_it_was_sent_as() {
        let r = |last: Reply| Reply::Array(vec![Reply::Int(1), last]);
        let own = Reply::Array(vec![Reply::Int(1)]);
        assert_eq!(untag(r(Reply::Int(42)), 42), Ok(own.clone()));
        assert_eq!(untag(r(Reply::Str(b"42".to_vec())), 42), Ok(own));
        assert!(untag(r(Reply::Int(43)), 42).is_err());
        assert!(untag(r(Reply::Str(b"43".to_vec())), 42).is_err());
        assert!(untag(r(Reply::Str(b"042".to_vec())), 42).is_err());
        // no tag at the end: passed on as it is, for the reader to reject
        assert_eq!(untag(r(Reply::Nil), 42), Ok(r(Reply::Nil)));
    }

    #[test]
    fn a_batch_reply_holds_short_admissions_inline_and_the_rest_as_elements() {
        let i = Reply::Int;
        let tag = |t: &str| Reply::Str(t.as_bytes().to_vec());
        let long = Reply::Array(vec![i(0), i(5), i(9), i(9), i(0), i(0), i(0), i(8)]);
        let reply = Reply::Array(vec![
            i(4),
            i(1000),
            tag("7"),
            long.clone(),
            Reply::Error("WRONGTYPE".into()),
            i(3),
            i(999),
            i(10),
        ]);
        let got = split_batch(reply, [7, 8, 9, 10].into_iter(), false).unwrap();
        assert_eq!(
            got,
            vec![
                Reply::Array(vec![i(4), i(1000)]),
                Reply::Array(vec![i(0), i(5), i(9), i(9), i(0), i(0), i(0)]),
                Reply::Error("WRONGTYPE".into()),
                Reply::Array(vec![i(3), i(999)]),
            ]
        );
        // an inline admission carrying another call's tag: the stream is in doubt
        let swapped = Reply::Array(vec![i(4), i(1000), tag("8"), i(4), i(1000), tag("7")]);
        assert!(split_batch(swapped, [7, 8].into_iter(), false).is_err());
        // values that do not make one reply per check: every check gets an error
        for bad in [
            vec![i(4), i(1000)],
            vec![i(4), i(1000), tag("7"), i(1)],
            vec![i(4), tag("7"), i(1000)],
            vec![i(4), i(1000), tag("7"), long.clone(), long],
        ] {
            let got = split_batch(Reply::Array(bad.clone()), [7, 8].into_iter(), false).unwrap();
            assert!(
                got.iter().all(|r| matches!(r, Reply::Error(_))),
                "{bad:?}: {got:?}"
            );
            assert_eq!(got.len(), 2);
        }
    }

    #[test]
    fn a_compact_batch_reply_is_the_calls_by_its_head_and_each_checks_by_its_place() {
        let i = Reply::Int;
        let tag = |t: &str| Reply::Str(t.as_bytes().to_vec());
        let long = Reply::Array(vec![i(0), i(5), i(9), i(9), i(0), i(0), i(0), i(2)]);
        let wrong = Reply::Error("WRONGTYPE".into());
        // the call's tag (its first check's, 7), then each check's reply with its place
        let reply = |head: Reply, rest: Vec<Reply>| Reply::Array([vec![head], rest].concat());
        let good = vec![
            i(4),
            i(1000),
            i(1),
            long.clone(),
            wrong.clone(),
            i(3),
            i(999),
            i(4),
        ];
        let got = split_batch(
            reply(tag("7"), good.clone()),
            [7, 8, 9, 10].into_iter(),
            true,
        );
        assert_eq!(
            got.unwrap(),
            vec![
                Reply::Array(vec![i(4), i(1000)]),
                Reply::Array(vec![i(0), i(5), i(9), i(9), i(0), i(0), i(0)]),
                wrong.clone(),
                Reply::Array(vec![i(3), i(999)]),
            ]
        );
        // another call's reply: the stream is in doubt
        let other = split_batch(
            reply(tag("8"), good.clone()),
            [7, 8, 9, 10].into_iter(),
            true,
        );
        assert!(other.is_err());
        let other = split_batch(reply(i(8), good), [7, 8, 9, 10].into_iter(), true);
        assert!(other.is_err());
        // replies out of order: each says its place
        let swapped = vec![long.clone(), i(4), i(1000), i(1)];
        assert!(split_batch(reply(i(7), swapped), [7, 8].into_iter(), true).is_err());
        // a head that is not this call's tag: not this call's reply
        let headless = Reply::Array(vec![i(4), i(1000), i(1), long.clone()]);
        assert!(split_batch(headless, [7, 8].into_iter(), true).is_err());
        let headless = Reply::Array(vec![long.clone(), long.clone()]);
        assert!(split_batch(headless, [7, 8].into_iter(), true).is_err());
        // too few or too many, or no head: every check gets an error
        for bad in [
            reply(i(7), vec![i(4), i(1000), i(1)]),
            reply(
                i(7),
                vec![i(4), i(1000), i(1), long.clone(), i(4), i(1000), i(3)],
            ),
            Reply::Array(vec![]),
            wrong.clone(),
        ] {
            let got = split_batch(bad.clone(), [7, 8].into_iter(), true).unwrap();
            assert!(
                got.iter().all(|r| matches!(r, Reply::Error(_))),
                "{bad:?}: {got:?}"
            );
            assert_eq!(got.len(), 2);
        }
    }

    #[test]
    fn tags_do_not_repeat_across_processes_forks_or_connections() {
        let mine: Vec<u64> = (0..1000).map(|_| next_tag()).collect();
        // one counter for every connection of the process: no tag twice
        let set: std::collections::HashSet<u64> = mine.iter().copied().collect();
        assert_eq!(set.len(), mine.len());
        assert!(mine.iter().all(|&t| t <= TAG_MASK));
        // forked children draw their own start: neither the parent's next numbers nor
        // each other's (a fixed start, or an inherited counter, would give both the same)
        let a = child_tags(100);
        let b = child_tags(100);
        let next = next_tag();
        let near = |x: u64, y: u64| x.abs_diff(y) < 1_000_000;
        assert!(
            !near(a[0], next),
            "a child went on with the parent's counter"
        );
        assert!(!near(a[0], b[0]), "two children drew the same start");
        assert!(
            !near(a[0], 1) && !near(mine[0], 1),
            "a start that is not random"
        );
        for w in a.windows(2).chain(b.windows(2)) {
            assert_eq!(w[1], (w[0] + 1) & TAG_MASK);
        }
    }
}
