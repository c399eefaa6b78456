//! The bounded queues behind the C subscriptions: events (`events.rs`) and warning lines
//! (`logging.rs`). One core sink per limiter handle fans what it is given out to every
//! live queue; each queue holds at most its capacity, counts what it drops when full, and
//! is drained by `_next` with a timeout. A queue freed by its caller is gone from the
//! fan-out (only a weak reference stays), and when the core limiter is gone (its sink,
//! which holds the `Feed`, dropped) every queue closes.

use super::*;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Weak;
use std::time::Instant;

struct State<T> {
    items: VecDeque<T>,
    /// Freed by the caller, or the limiter is gone: nothing more will come.
    closed: bool,
    dropped: u64,
}

pub(crate) struct BoundedQueue<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    capacity: usize,
    /// The `_set_notify()` callback: called when the queue goes from empty to holding an
    /// item, and when it closes.
    notify: notify::Notify,
}

impl<T: Clone> BoundedQueue<T> {
    fn new(capacity: usize) -> Self {
        BoundedQueue {
            state: Mutex::new(State {
                items: VecDeque::new(),
                closed: false,
                dropped: 0,
            }),
            ready: Condvar::new(),
            capacity,
            notify: Default::default(),
        }
    }

    /// Queues a copy of `item`, unless the queue is closed or full (then it is counted).
    fn push(&self, item: &T) {
        let mut s = self.state.lock();
        if s.closed {
            return;
        }
        if s.items.len() >= self.capacity {
            s.dropped += 1;
            return;
        }
        s.items.push_back(item.clone());
        if s.items.len() == 1 {
            self.notify.fire();
        }
        drop(s);
        self.ready.notify_one();
    }

    fn close(&self) {
        let mut s = self.state.lock();
        if !s.closed {
            s.closed = true;
            self.notify.fire();
        }
        drop(s);
        self.ready.notify_all();
    }

    /// The body of a `_set_notify`: registers `callback` (once per queue) and calls it at
    /// once when items are queued already or the queue is closed.
    pub(crate) fn set_notify(
        &self,
        callback: notify::shardlimit_notify_callback,
        user: *mut std::ffi::c_void,
    ) -> Result<(), Error> {
        let f = notify::notify_arg(callback)?;
        let s = self.state.lock();
        if !self.notify.set(f, user) {
            return Err(notify::notify_set_twice());
        }
        if !s.items.is_empty() || s.closed {
            self.notify.fire();
        }
        Ok(())
    }

    /// `_free`: closes the queue (a thread waiting in `_next` wakes with CLOSED) and
    /// discards what it holds.
    pub(crate) fn close_and_discard(&self) {
        self.close();
        self.state.lock().items = VecDeque::new();
    }

    /// `_dropped`: how many items did not fit.
    pub(crate) fn dropped(&self) -> u64 {
        self.state.lock().dropped
    }

    /// The oldest item, waiting up to `timeout_us` microseconds for one (`u64::MAX`: no
    /// limit; 0, or inside a completion callback: no wait). `None` when none came in time;
    /// CLOSED once the queue is closed and empty.
    fn take(&self, timeout_us: u64) -> Result<Option<T>, Error> {
        let closed = || Error {
            code: SHARDLIMIT_ERR_CLOSED,
            message: "`subscription`: closed (freed, or its limiter is gone)".to_string(),
        };
        let mut s = self.state.lock();
        let wait = !pending::in_callback() && timeout_us > 0;
        let deadline = Instant::now().checked_add(Duration::from_micros(timeout_us));
        loop {
            if let Some(item) = s.items.pop_front() {
                return Ok(Some(item));
            }
            if s.closed {
                return Err(closed());
            }
            if !wait {
                return Ok(None);
            }
            match deadline {
                Some(d) => {
                    if self.ready.wait_until(&mut s, d).timed_out() && s.items.is_empty() {
                        return if s.closed { Err(closed()) } else { Ok(None) };
                    }
                }
                None => self.ready.wait(&mut s),
            }
        }
    }

    /// The body of a `_next`: takes an item as `take` does and, when one came, writes it
    /// converted to `*out`; `*out_got` says whether it did. Both pointers are checked
    /// output arguments.
    pub(crate) fn next_into<C>(
        &self,
        timeout_us: u64,
        out_got: Out<bool>,
        out: Out<C>,
        convert: impl FnOnce(&T) -> Result<C, Error>,
    ) -> Result<(), Error> {
        match self.take(timeout_us)? {
            Some(item) => {
                out.write(convert(&item)?);
                out_got.write(true);
            }
            None => out_got.write(false),
        }
        Ok(())
    }
}

/// The queues of one limiter handle, fed by one core sink.
pub(crate) struct Fanout<T> {
    queues: Mutex<Vec<Weak<BoundedQueue<T>>>>,
}

impl<T> Default for Fanout<T> {
    fn default() -> Self {
        Fanout {
            queues: Mutex::new(Vec::new()),
        }
    }
}

impl<T: Clone> Fanout<T> {
    /// Gives every live queue a copy of `item`.
    pub(crate) fn emit(&self, item: &T) {
        for q in self.queues.lock().iter().filter_map(Weak::upgrade) {
            q.push(item);
        }
    }

    /// A new queue of `capacity` items (`capacity_arg`), fed from now on; the fan-out keeps
    /// only a weak reference (freed queues are swept here).
    pub(crate) fn subscribe(&self, capacity: usize) -> Arc<BoundedQueue<T>> {
        let queue = Arc::new(BoundedQueue::new(capacity));
        let mut qs = self.queues.lock();
        qs.retain(|w| w.strong_count() > 0);
        qs.push(Arc::downgrade(&queue));
        queue
    }

    /// The core sink is gone: every queue closes (`_next` gives what is queued, then
    /// CLOSED).
    pub(crate) fn close_all(&self) {
        for q in self.queues.lock().drain(..).filter_map(|w| w.upgrade()) {
            q.close();
        }
    }
}

/// A subscription's `capacity` argument: 0 means `default`, more than `max` is refused
/// (the message counts `unit`s).
pub(crate) fn capacity_arg(
    capacity: usize,
    default: usize,
    max: usize,
    unit: &str,
) -> Result<usize, Error> {
    match capacity {
        0 => Ok(default),
        c if c > max => Err(invalid("capacity", format!("is {c}; at most {max} {unit}"))),
        c => Ok(c),
    }
}

/// Copies `src` into the fixed, NUL-terminated buffer `dst` of a queued struct, cut at a
/// character boundary when it does not fit: (bytes copied, whether it was cut).
pub(crate) fn fill(dst: &mut [c_char], src: &str) -> (usize, bool) {
    let mut n = src.len().min(dst.len() - 1);
    while !src.is_char_boundary(n) {
        n -= 1;
    }
    for (d, b) in dst.iter_mut().zip(&src.as_bytes()[..n]) {
        *d = *b as c_char;
    }
    dst[n] = 0;
    (n, n < src.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_at_a_character_and_says_so() {
        let mut buf = [1 as c_char; 8];
        // 7 bytes fit before the NUL; the 4-byte character at 6..10 does not
        let (n, cut) = fill(&mut buf, "abcdef\u{1F600}");
        assert_eq!((n, cut), (6, true));
        assert_eq!(buf[6], 0);
        let (n, cut) = fill(&mut buf, "abc");
        assert_eq!((n, cut), (3, false));
        assert_eq!(buf[3], 0);
    }

    #[test]
    fn a_full_queue_counts_what_it_drops_and_a_closed_one_takes_nothing() {
        let f = Fanout::<u32>::default();
        let q = f.subscribe(2);
        for i in 0..5 {
            f.emit(&i);
        }
        assert_eq!(q.dropped(), 3);
        assert_eq!(q.take(0).unwrap(), Some(0));
        assert_eq!(q.take(0).unwrap(), Some(1));
        assert_eq!(q.take(1_000).unwrap(), None);
        f.emit(&7);
        f.close_all();
        // what was queued before the close is still given, then CLOSED
        assert_eq!(q.take(0).unwrap(), Some(7));
        assert_eq!(q.take(0).unwrap_err().code, SHARDLIMIT_ERR_CLOSED);
        f.emit(&8);
        assert_eq!(q.take(u64::MAX).unwrap_err().code, SHARDLIMIT_ERR_CLOSED);
    }

    #[test]
    fn a_freed_queue_wakes_its_waiter_and_leaves_the_fan_out() {
        let f = Fanout::<u32>::default();
        let first = f.subscribe(4);
        f.emit(&1);
        first.close_and_discard();
        // what was queued is discarded, and a wait ends at once in CLOSED
        assert_eq!(first.take(0).unwrap_err().code, SHARDLIMIT_ERR_CLOSED);
        drop(first);
        let q = f.subscribe(4);
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let q = q.clone();
            // a wait with no limit: only the free can end it
            std::thread::spawn(move || tx.send(q.take(u64::MAX).map_err(|e| e.code)))
        };
        q.close_and_discard();
        let r = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the free woke the waiter");
        assert!(
            matches!(r, Err(SHARDLIMIT_ERR_CLOSED)),
            "{:?}",
            r.map(|_| ())
        );
        waiter.join().unwrap().unwrap();
        drop(q);
        let _last = f.subscribe(1);
        assert_eq!(f.queues.lock().len(), 1, "the freed queues were swept");
    }

    #[test]
    fn capacity_zero_is_the_default_and_too_large_is_named() {
        assert_eq!(capacity_arg(0, 256, 4096, "lines").unwrap(), 256);
        assert_eq!(capacity_arg(4096, 256, 4096, "lines").unwrap(), 4096);
        let e = capacity_arg(4097, 256, 4096, "lines").unwrap_err();
        assert!(e.message.contains("capacity") && e.message.contains("at most 4096 lines"));
    }
}
