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

/// The monotonic clock as [`MonotonicClock`] reads it (same anchor, same µs), read
/// through the TSC where that is cheaper and safe (see [`tsc`]): what the limiter's own
/// time is, for the in-memory engine's checks.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[inline]
pub(crate) fn fast_now_us() -> u64 {
    let (start, wall) = anchor_us();
    wall + tsc::monotonic_us().saturating_sub(*start)
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
#[inline]
pub(crate) fn fast_now_us() -> u64 {
    MonotonicClock.now_us()
}

/// `CLOCK_MONOTONIC` extrapolated from the TSC (an invariant TSC only: constant rate,
/// running in every power state). Reading the clock through the vDSO cost about twice a
/// TSC read on the machines measured, and was the largest single cost of an in-memory
/// check. Each thread anchors the TSC to a clock read (bracketed by two TSC reads, kept
/// only when narrow) and extrapolates at most [`tsc::SPAN_US`] from it at the rate
/// measured since its first anchor (at least [`tsc::CALIBRATE_US`] before it is used),
/// so a value stays within about a µs of the clock; a thread's values never go back. The
/// first rate a thread measures is kept for the process: a thread started later uses it
/// from its first anchor while it measures its own (a new thread read the clock itself for
/// its first [`tsc::CALIBRATE_US`], which a pool of short-lived threads paid every time).
/// Anything odd (a rate out of range, the TSC gone back or jumped) re-anchors, and
/// until then the clock itself is read.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod tsc {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    /// The longest extrapolation from one anchor, µs.
    pub(super) const SPAN_US: u64 = 1_000;
    /// How long after a thread's first anchor its TSC rate is measured before use, µs.
    pub(super) const CALIBRATE_US: u64 = 10_000;
    /// The widest bracket (µs) around an anchor's clock read that is kept as an anchor.
    const BRACKET_US: u64 = 4;
    /// The widest bracket in ticks while the rate is not known yet (4 µs at 50 GHz...
    /// 4 ms at 50 MHz: a sanity bound only; the rate measured later bounds it properly).
    const BRACKET_TICKS: u64 = 200_000;
    /// Rates accepted, as µs per tick << 32: 50 MHz to 20 GHz.
    const RATES: std::ops::RangeInclusive<u64> = ((1u64 << 32) / 20_000)..=((1u64 << 32) / 50);

    #[derive(Clone, Copy)]
    struct State {
        /// the first anchor the rate is measured from: (tick, clock µs); tick 0 = none
        base: (u64, u64),
        /// the latest anchor: (tick, clock µs)
        at: (u64, u64),
        /// µs per tick << 32; 0 = not known yet (the clock itself is read)
        rate: u64,
        /// ticks past `at` that may be extrapolated
        span: u64,
        /// the last value this thread returned
        last: u64,
    }

    /// The rate (as [`State::rate`]) the first thread to finish calibrating measured; 0
    /// until then. The TSC is invariant (one rate on every core): only a thread's anchor
    /// is its own.
    static PROCESS_RATE: AtomicU64 = AtomicU64::new(0);

    thread_local! {
        static STATE: Cell<State> = const {
            Cell::new(State { base: (0, 0), at: (0, 0), rate: 0, span: 0, last: 0 })
        };
    }

    #[inline(always)]
    fn ticks() -> u64 {
        // SAFETY: RDTSC exists on every x86-64 CPU and reads a register
        #[allow(unused_unsafe)]
        unsafe {
            std::arch::x86_64::_rdtsc()
        }
    }

    /// Whether the CPU says its TSC is invariant (CPUID 8000_0007h, EDX bit 8).
    fn invariant() -> bool {
        static OK: OnceLock<bool> = OnceLock::new();
        *OK.get_or_init(|| {
            use std::arch::x86_64::__cpuid;
            // SAFETY: CPUID exists on every x86-64 CPU; the leaf is read only when listed
            #[allow(unused_unsafe)]
            unsafe {
                __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
            }
        })
    }

    /// `CLOCK_MONOTONIC` in µs, as `super::monotonic_us` reads it, within about a µs.
    #[inline]
    pub(super) fn monotonic_us() -> u64 {
        let t = ticks();
        STATE
            .try_with(|cell| {
                let mut s = cell.get();
                let dt = t.wrapping_sub(s.at.0);
                let us = if s.rate != 0 && dt < s.span {
                    // (dt × rate < SPAN_US << 32: no overflow)
                    s.at.1 + ((dt * s.rate) >> 32)
                } else {
                    anchor(&mut s)
                };
                let us = us.max(s.last);
                s.last = us;
                cell.set(s);
                us
            })
            // (a thread being torn down)
            .unwrap_or_else(|_| super::monotonic_us())
    }

    /// A clock read bracketed by two TSC reads: (mid tick, µs, bracket in ticks).
    fn bracket() -> (u64, u64, u64) {
        let t0 = ticks();
        let us = super::monotonic_us();
        let w = ticks().wrapping_sub(t0);
        (t0.wrapping_add(w / 2), us, w)
    }

    /// Reads the clock, and anchors (and measures the rate) when the read is good.
    #[cold]
    #[inline(never)]
    fn anchor(s: &mut State) -> u64 {
        if !invariant() {
            return super::monotonic_us();
        }
        // (another thread's rate, while this one's is not measured yet)
        let known = PROCESS_RATE.load(Ordering::Relaxed);
        if s.base.0 != 0 && s.rate == 0 && known == 0 {
            // measuring: the clock is read until the base is old enough
            let us = super::monotonic_us();
            if us.wrapping_sub(s.base.1) < CALIBRATE_US {
                return us;
            }
        }
        let (tick, us, w) = bracket();
        let rate_now = if s.rate != 0 { s.rate } else { known };
        let narrow = if rate_now != 0 {
            (w as u128 * rate_now as u128) >> 32 <= BRACKET_US as u128
        } else {
            w <= BRACKET_TICKS
        };
        if !narrow {
            // (preempted between the reads: the next read tries again)
            return us;
        }
        if s.base.0 == 0 {
            s.base = (tick, us);
            if known == 0 {
                return us;
            }
        }
        let (dt, dus) = (tick.wrapping_sub(s.base.0), us.wrapping_sub(s.base.1));
        let rate = if dus < CALIBRATE_US && known != 0 {
            // too soon to measure this thread's own: the process's
            known
        } else if dt > 0 && dt < 1 << 62 && dus < 1 << 30 {
            (((dus as u128) << 32) / dt as u128) as u64
        } else {
            0
        };
        if RATES.contains(&rate) && known == 0 {
            let _ = PROCESS_RATE.compare_exchange(0, rate, Ordering::Relaxed, Ordering::Relaxed);
        }
        if !RATES.contains(&rate) {
            // the TSC or the clock jumped (a suspend, a migration): measure again
            *s = State {
                base: (tick, us),
                at: (0, 0),
                rate: 0,
                span: 0,
                last: s.last,
            };
            return us;
        }
        s.at = (tick, us);
        s.rate = rate;
        s.span = (SPAN_US << 32) / rate;
        us
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

    /// The TSC-extrapolated clock stays within a few µs of the clock it extrapolates, over
    /// its calibration and many re-anchors, and never goes back on a thread.
    #[test]
    fn the_fast_clock_follows_the_monotonic_clock() {
        follows_for(std::time::Duration::from_millis(60));
        // a thread started once a rate is known extrapolates with it from its first
        // anchor, before its own calibration has run: it follows the clock from the start
        std::thread::spawn(|| follows_for(std::time::Duration::from_millis(20)))
            .join()
            .unwrap();
    }

    fn follows_for(d: std::time::Duration) {
        let start = Instant::now();
        let mut last = fast_now_us();
        let mut worst = 0u64;
        while start.elapsed() < d {
            let before = MonotonicClock.now_us();
            let t = fast_now_us();
            let after = MonotonicClock.now_us();
            assert!(t >= last, "went back from {last} to {t}");
            last = t;
            // (outside [before, after] by the extrapolation's error, and a thread
            // preempted between the reads widens the bracket: the error is measured)
            let off = before.saturating_sub(t).max(t.saturating_sub(after));
            if after - before < 50 {
                worst = worst.max(off);
            }
        }
        assert!(worst <= 5, "{worst} µs from the clock");
    }
}
