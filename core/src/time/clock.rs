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

#[cfg(not(target_os = "linux"))]
impl Clock for MonotonicClock {
    #[inline]
    fn now_us(&self) -> u64 {
        let (start, wall) = anchor();
        wall + start.elapsed().as_micros() as u64
    }
}

/// Linux: `CLOCK_MONOTONIC` read directly (the clock `Instant` reads), in whole µs with no
/// `Duration` arithmetic: the in-memory engine reads it once per check.
#[cfg(target_os = "linux")]
fn monotonic_us() -> u64 {
    // SAFETY: a zeroed timespec is a valid value (plain integers); clock_gettime writes
    // it, and CLOCK_MONOTONIC exists on every Linux, so the call cannot fail (std's
    // `Instant::now` relies on the same)
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

#[cfg(target_os = "linux")]
fn anchor_us() -> &'static (u64, u64) {
    static ANCHOR: OnceLock<(u64, u64)> = OnceLock::new();
    ANCHOR.get_or_init(|| {
        let (_, wall) = anchor();
        (monotonic_us(), *wall)
    })
}

#[cfg(target_os = "linux")]
impl Clock for MonotonicClock {
    #[inline]
    fn now_us(&self) -> u64 {
        let (start, wall) = anchor_us();
        wall + monotonic_us().saturating_sub(*start)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The monotonic clock never goes back, moves with real time and reads like Unix time.
    #[test]
    fn the_monotonic_clock_is_monotonic_and_anchored_to_the_wall_clock() {
        let wall = || {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_micros() as u64
        };
        let mut last = MonotonicClock.now_us();
        // (anchored once per process: within a second of the wall clock in a test run)
        assert!(last.abs_diff(wall()) < 1_000_000, "{last} vs {}", wall());
        for _ in 0..100_000 {
            let now = MonotonicClock.now_us();
            assert!(now >= last, "went back from {last} to {now}");
            last = now;
        }
        // it moves as `Instant` does: each read bracketed by two of `Instant`'s
        let read = || {
            let before = Instant::now();
            let t = MonotonicClock.now_us();
            (before, t, Instant::now())
        };
        let (a0, t0, b0) = read();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (a1, t1, b1) = read();
        let (least, most) = ((a1 - b0).as_micros() as u64, (b1 - a0).as_micros() as u64);
        // (+1: each read is truncated to a whole µs)
        assert!(
            least <= t1 - t0 + 1 && t1 - t0 <= most + 1,
            "moved {} µs, between {least} and {most}",
            t1 - t0
        );
    }
}
