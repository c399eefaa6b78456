//! Time sources. Redis scripts read the server clock; the in-memory engine a monotonic
//! clock. Tests inject a [`ManualClock`] into either engine.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of "now" in microseconds.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_us(&self) -> u64;
}

/// Monotonic time, anchored once to the wall clock so values look like Unix time.
#[derive(Debug, Default, Clone, Copy)]
pub struct MonotonicClock;

fn anchor() -> &'static (Instant, u64) {
    static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
    ANCHOR.get_or_init(|| {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        (Instant::now(), wall)
    })
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_us(&self) -> u64 {
        let (start, wall) = anchor();
        wall + start.elapsed().as_micros() as u64
    }
}

/// A clock that moves only when told to: for deterministic tests.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(start_us: u64) -> Arc<ManualClock> {
        Arc::new(ManualClock(AtomicU64::new(start_us)))
    }
    pub fn set_us(&self, us: u64) {
        self.0.store(us, Ordering::SeqCst)
    }
    pub fn advance_us(&self, us: u64) {
        self.0.fetch_add(us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
