//! The algorithm chart (`docs/algorithms.svg`): every algorithm gets the same bursty trace
//! across a window boundary, on the in-memory engine with a [`ManualClock`], and the
//! requests each one admits are drawn second by second.
//!
//! The trace is the seed story: a limit of 1000 per minute; 999 requests at 11:59:59, 999
//! at 12:00:00, then steady traffic a little above the limit. A fixed window counts the two
//! bursts in different windows and admits 1998 requests in two seconds.
//!
//! Everything here is deterministic: the same code writes the same bytes, and a test
//! fails when the committed SVG differs from what the code draws.

use shardlimit::{Limit, Limiter, ManualClock, Policy};
use std::fmt::Write as _;
use std::time::Duration;

/// 2025-01-01T12:00:00Z in µs: a window boundary for any window that divides a minute.
pub const NOON_US: u64 = 1_735_732_800_000_000;
const S: u64 = 1_000_000;
/// The chart starts 10 s before the first burst and ends at 12:02:10.
pub const START_US: u64 = NOON_US - 10 * S;
pub const END_US: u64 = NOON_US + 130 * S;
/// The limit every algorithm enforces: 1000 per minute.
pub const LIMIT: u64 = 1000;
pub const WINDOW: Duration = Duration::from_secs(60);
pub const BURST: u64 = 999;
/// Steady traffic after the bursts, requests per second.
pub const STEADY_PER_SEC: u64 = 25;

/// Request times (µs): `BURST` at 11:59:59, `BURST` at 12:00:00, then `STEADY_PER_SEC`
/// evenly spaced from 12:00:01 to the end of the chart.
pub fn trace() -> Vec<u64> {
    let mut t = vec![NOON_US - S; BURST as usize];
    t.extend(std::iter::repeat_n(NOON_US, BURST as usize));
    let gap = S / STEADY_PER_SEC;
    t.extend((NOON_US + S..END_US).step_by(gap as usize));
    t
}

/// One algorithm's run over the trace.
#[derive(Debug, Clone)]
pub struct Series {
    pub algorithm: &'static str,
    /// What the limit is, in the config's words.
    pub params: String,
    /// A one-line reading of the panel, with this run's numbers.
    pub note: String,
    /// Requests let through per second of the chart: admitted, or for the shaper
    /// released (decision time + delay).
    pub per_second: Vec<u64>,
    /// Requests admitted per second by decision time (differs only for the shaper).
    pub decided_per_second: Vec<u64>,
    /// The most let through in any 2 s, and in any 60 s (over every request time).
    pub max_2s: u64,
    pub max_60s: u64,
    pub total: u64,
    /// The longest delay the shaper asked for (zero for the others).
    pub max_delay: Duration,
}

/// The limits compared: each is "1000 per minute" in its algorithm's terms.
pub fn limits() -> Vec<Limit> {
    let rate = LIMIT as f64 / WINDOW.as_secs_f64();
    vec![
        Limit::fixed_window(LIMIT, WINDOW),
        Limit::sliding_window(LIMIT, WINDOW),
        Limit::sliding_log(LIMIT, WINDOW),
        Limit::token_bucket(LIMIT, rate),
        Limit::leaky_bucket(LIMIT, rate),
    ]
}

/// Runs `limit` over `trace` with an injected clock. Returns, for each admitted request,
/// its decision time and the time it was let through (decision time + the decision's
/// `delay`, which only the shaper sets), sorted by release.
pub fn run(limit: &Limit, trace: &[u64]) -> Vec<(u64, u64)> {
    let clock = ManualClock::new(trace[0]);
    let limiter = Limiter::memory()
        .with_clock(clock.clone())
        .expect("a fresh limiter");
    let policy = Policy::new(limit.algorithm().name(), limit.clone()).expect("a valid limit");
    let mut out = Vec::new();
    for &t in trace {
        clock.set_us(t);
        let d = limiter
            .check_blocking("client", &policy, 1)
            .expect("the in-memory engine does not fail");
        if d.allowed {
            out.push((t, t + d.delay.as_micros() as u64));
        }
    }
    out.sort_unstable_by_key(|(_, released)| *released);
    out
}

/// The most events in any half-open span of `span_us` (events sorted).
fn max_in(events: &[u64], span_us: u64) -> u64 {
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..events.len() {
        while events[hi] - events[lo] >= span_us {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best as u64
}

fn bins(times: impl Iterator<Item = u64>, seconds: usize) -> Vec<u64> {
    let mut v = vec![0; seconds];
    for t in times.filter(|t| (START_US..END_US).contains(t)) {
        v[((t - START_US) / S) as usize] += 1;
    }
    v
}

pub fn simulate() -> Vec<Series> {
    let trace = trace();
    let seconds = ((END_US - START_US) / S) as usize;
    limits()
        .into_iter()
        .map(|limit| {
            let admitted = run(&limit, &trace);
            let shown: Vec<u64> = admitted
                .iter()
                .map(|(_, r)| *r)
                .filter(|t| (START_US..END_US).contains(t))
                .collect();
            let max_2s = max_in(&shown, 2 * S);
            let max_60s = max_in(&shown, 60 * S);
            let max_delay = Duration::from_micros(
                admitted.iter().map(|(d, r)| r - d).max().unwrap_or(0),
            );
            let rate = format!("{:.1}/s", LIMIT as f64 / WINDOW.as_secs_f64());
            let (params, note) = match &limit {
                Limit::FixedWindow { .. } => (
                    "1000 per minute".to_string(),
                    format!("Counts each minute on its own: both bursts pass, {max_2s} requests in 2 s."),
                ),
                Limit::SlidingWindow { .. } => (
                    "1000 per minute".to_string(),
                    format!(
                        "Weighs in the previous minute, so the second burst is refused. It takes that \
                         minute's traffic as evenly spread, so {max_60s} pass within 60 s here."
                    ),
                ),
                Limit::SlidingLog { .. } => (
                    "1000 per minute".to_string(),
                    format!(
                        "Exact: never more than {max_60s} in any 60 s, so after the bursts nothing \
                         passes until the first one is a minute old."
                    ),
                ),
                Limit::TokenBucket { capacity, .. } => (
                    format!("capacity {capacity}, refill 1000/min"),
                    format!(
                        "A burst up to the capacity, then the refill rate ({rate}); a full bucket \
                         plus a minute of refill is {max_60s} within 60 s."
                    ),
                ),
                Limit::LeakyBucket { capacity, .. } => (
                    format!("capacity {capacity}, leak 1000/min"),
                    format!(
                        "A shaper: admits into a queue and lets requests go at {rate}; they wait up \
                         to {} s. Bars show when they go.",
                        max_delay.as_secs_f64().round()
                    ),
                ),
                Limit::Concurrency { .. } => unreachable!("not charted"),
            };
            Series {
                algorithm: limit.algorithm().name(),
                params,
                note,
                per_second: bins(shown.iter().copied(), seconds),
                decided_per_second: bins(admitted.iter().map(|(d, _)| *d), seconds),
                max_2s,
                max_60s,
                total: shown.len() as u64,
                max_delay,
            }
        })
        .collect()
}

// ----- drawing ---------------------------------------------------------------------------

const WIDTH: u32 = 1000;
const LEFT: u32 = 70;
const RIGHT: u32 = 30;
const TOP: u32 = 176;
const PANEL_H: u32 = 100;
const PANEL_GAP: u32 = 62;
const BOTTOM: u32 = 58;
/// The y axis ends here (requests per second); taller bars are cut and labelled.
const Y_MAX: u64 = 50;
const FONT: &str = "DejaVu Sans, Helvetica, Arial, sans-serif";
const BAR: &str = "#3b6ea5";
const OFFERED: &str = "#dcdcdc";
const ALERT: &str = "#c0392b";
const MUTED: &str = "#666666";

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `hh:mm:ss` of a second offset from the chart's start.
fn clock_label(sec: u64) -> String {
    let t = (START_US / S + sec) % 86_400;
    format!("{:02}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
}

/// Requests sent per second of the chart.
fn offered_per_second(seconds: usize) -> Vec<u64> {
    let mut v = vec![0; seconds];
    for t in trace() {
        if (START_US..END_US).contains(&t) {
            v[((t - START_US) / S) as usize] += 1;
        }
    }
    v
}

/// The chart as SVG text.
pub fn svg(series: &[Series]) -> String {
    let seconds = series[0].per_second.len() as u32;
    let offered = offered_per_second(seconds as usize);
    let plot_w = WIDTH - LEFT - RIGHT;
    let bw = plot_w as f64 / seconds as f64;
    let px = |sec: u32| LEFT as f64 + sec as f64 * bw;
    let n = series.len() as u32;
    let height = TOP + n * PANEL_H + (n - 1) * PANEL_GAP + BOTTOM;
    let rate = LIMIT as f64 / WINDOW.as_secs_f64();
    let mut o = String::new();
    let w = &mut o;
    let _ = writeln!(
        w,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="{FONT}">"#
    );
    let _ = writeln!(
        w,
        "<title>Requests admitted per second by each shardlimit algorithm: limit 1000 per minute, \
         999 requests at 11:59:59, 999 at 12:00:00, then {STEADY_PER_SEC} per second</title>"
    );
    let _ = writeln!(
        w,
        r##"<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        w,
        r##"<text x="{LEFT}" y="30" font-size="19" font-weight="bold" fill="#222">One burst across a window boundary, five algorithms, limit 1000 per minute</text>"##
    );
    let _ = writeln!(
        w,
        r##"<text x="{LEFT}" y="52" font-size="13" fill="{MUTED}">The same requests for each: 999 at 11:59:59, 999 at 12:00:00 (a minute boundary), then {STEADY_PER_SEC} per second.</text>"##
    );
    let _ = writeln!(
        w,
        r##"<text x="{LEFT}" y="70" font-size="13" fill="{MUTED}">Generated by shardlimit-plot (examples/rust) on the in-memory engine with an injected clock.</text>"##
    );
    // legend
    let ly = 88;
    let _ = writeln!(
        w,
        r##"<rect x="{LEFT}" y="{}" width="12" height="12" fill="{BAR}"/><text x="{}" y="{}" font-size="12.5" fill="#333">admitted (leaky bucket: released)</text>"##,
        ly,
        LEFT + 17,
        ly + 10
    );
    let _ = writeln!(
        w,
        r##"<rect x="{}" y="{}" width="12" height="12" fill="{OFFERED}"/><text x="{}" y="{}" font-size="12.5" fill="#333">requests sent (grey where not let through)</text>"##,
        LEFT + 250,
        ly,
        LEFT + 267,
        ly + 10
    );
    let _ = writeln!(
        w,
        r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#2e8b57" stroke-width="1.5" stroke-dasharray="6 3"/><text x="{}" y="{}" font-size="12.5" fill="#333">1000/min as a steady rate (16.7/s)</text>"##,
        LEFT + 590,
        ly + 6,
        LEFT + 618,
        ly + 6,
        LEFT + 624,
        ly + 10
    );
    let _ = writeln!(
        w,
        r##"<text x="{LEFT}" y="{}" font-size="12.5" fill="#333">The y axis stops at {Y_MAX}/s: taller bars are cut, with their count written beside them. Dashed verticals: minute boundaries.</text>"##,
        ly + 28
    );
    for (i, s) in series.iter().enumerate() {
        let top = TOP + i as u32 * (PANEL_H + PANEL_GAP);
        let base = (top + PANEL_H) as f64;
        let y = |v: u64| base - v.min(Y_MAX) as f64 * PANEL_H as f64 / Y_MAX as f64;
        // the boundary spike: far more than the limit in two seconds
        let spike = s.max_2s >= LIMIT * 3 / 2;
        let _ = writeln!(w, r#"<g id="{}">"#, s.algorithm);
        // heading: algorithm, parameters, the numbers that matter
        let _ = writeln!(
            w,
            r##"<text x="{LEFT}" y="{}" font-size="15" font-weight="bold" fill="#222">{}<tspan dx="10" font-weight="normal" fill="{MUTED}">{}</tspan></text>"##,
            top - 30,
            s.algorithm,
            esc(&s.params)
        );
        let _ = writeln!(
            w,
            r##"<text x="{LEFT}" y="{}" font-size="12.5" fill="{}">{}</text>"##,
            top - 12,
            if spike { ALERT } else { "#333" },
            esc(&s.note)
        );
        let _ = writeln!(
            w,
            r##"<text x="{}" y="{}" font-size="12.5" text-anchor="end" fill="#333">most let through in any 2 s:<tspan dx="4" font-weight="bold" fill="{}">{}</tspan><tspan dx="14">in any 60 s:</tspan><tspan dx="4" font-weight="bold">{}</tspan></text>"##,
            WIDTH - RIGHT,
            top - 30,
            if spike { ALERT } else { "#333" },
            s.max_2s,
            s.max_60s
        );
        // y grid and axis
        for v in [0u64, 25, 50] {
            let yy = y(v);
            let _ = writeln!(
                w,
                r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="{}" stroke-width="1"/>"##,
                WIDTH - RIGHT,
                if v == 0 { "#999" } else { "#ececec" }
            );
            let _ = writeln!(
                w,
                r##"<text x="{}" y="{:.1}" font-size="11" text-anchor="end" fill="{MUTED}">{v}/s</text>"##,
                LEFT - 6,
                yy + 4.0
            );
        }
        // minute boundaries
        for sec in (0..seconds).filter(|s| (START_US / S + *s as u64).is_multiple_of(60)) {
            let x = px(sec);
            let _ = writeln!(
                w,
                r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{base:.1}" stroke="#888" stroke-width="1" stroke-dasharray="4 3"/>"##
            );
        }
        // bars: what was sent, then what was admitted over it
        for (sec, (&sent, &v)) in offered.iter().zip(&s.per_second).enumerate() {
            let x = px(sec as u32) + 0.5;
            if sent > 0 {
                let _ = writeln!(
                    w,
                    r#"<rect x="{x:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{OFFERED}"/>"#,
                    y(sent),
                    bw - 1.0,
                    base - y(sent)
                );
            }
            if v == 0 {
                continue;
            }
            let color = if spike && v > Y_MAX { ALERT } else { BAR };
            let _ = writeln!(
                w,
                r#"<rect x="{x:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{color}"><title>{}: {v} admitted</title></rect>"#,
                y(v),
                bw - 1.0,
                base - y(v),
                clock_label(sec as u64)
            );
        }
        // cut marks and counts on bars taller than the axis
        let tall: Vec<usize> = (0..s.per_second.len())
            .filter(|i| {
                s.per_second[*i] > Y_MAX || offered[*i] > Y_MAX || s.decided_per_second[*i] > Y_MAX
            })
            .collect();
        for &sec in &tall {
            let x = px(sec as u32);
            let _ = writeln!(
                w,
                r##"<path d="M{:.1} {:.1} L{:.1} {:.1}" stroke="#ffffff" stroke-width="3"/>"##,
                x - 1.0,
                top as f64 + 12.0,
                x + bw + 1.0,
                top as f64 + 6.0
            );
        }
        let mut label_x = px(tall.last().map_or(0, |l| *l as u32 + 1)) + 5.0;
        for &sec in &tall {
            let v = s.decided_per_second[sec];
            let color = if spike && v > Y_MAX { ALERT } else { BAR };
            let refused = offered[sec] - v.min(offered[sec]);
            let text = if refused > 0 {
                format!(
                    "{}: {v} admitted, {refused} refused",
                    clock_label(sec as u64)
                )
            } else {
                format!("{}: {v} admitted", clock_label(sec as u64))
            };
            let row = (sec - tall[0]) as f64;
            let _ = writeln!(
                w,
                r#"<text x="{label_x:.1}" y="{:.1}" font-size="11.5" fill="{color}">{}</text>"#,
                top as f64 + 22.0 + row * 15.0,
                esc(&text)
            );
        }
        if spike {
            label_x += 175.0;
            let _ = writeln!(
                w,
                r##"<text x="{label_x:.1}" y="{:.1}" font-size="13" font-weight="bold" fill="{ALERT}">{} admitted in 2 s: twice the limit</text>"##,
                top as f64 + 29.0,
                s.max_2s
            );
        }
        // the steady rate the limit allows
        let yr = base - rate * PANEL_H as f64 / Y_MAX as f64;
        let _ = writeln!(
            w,
            r##"<line x1="{LEFT}" y1="{yr:.1}" x2="{}" y2="{yr:.1}" stroke="#2e8b57" stroke-width="1.5" stroke-dasharray="6 3"/>"##,
            WIDTH - RIGHT
        );
        let _ = writeln!(w, "</g>");
    }
    // x axis under the last panel
    let base = TOP + n * PANEL_H + (n - 1) * PANEL_GAP;
    for sec in (0..=seconds).step_by(10) {
        let x = px(sec);
        let _ = writeln!(
            w,
            r##"<line x1="{x:.1}" y1="{base}" x2="{x:.1}" y2="{}" stroke="#999"/>"##,
            base + 5
        );
        let _ = writeln!(
            w,
            r##"<text x="{x:.1}" y="{}" font-size="11" text-anchor="middle" fill="{MUTED}">{}</text>"##,
            base + 19,
            clock_label(sec as u64)
        );
    }
    let _ = writeln!(
        w,
        r##"<text x="{:.1}" y="{}" font-size="12" text-anchor="middle" fill="{MUTED}">time (UTC), one bar per second</text>"##,
        LEFT as f64 + plot_w as f64 / 2.0,
        base + 42
    );
    let _ = writeln!(w, "</svg>");
    o
}

/// The committed chart, `docs/algorithms.svg`.
pub fn chart_svg() -> String {
    svg(&simulate())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixed_window_admits_twice_the_limit_in_two_seconds_and_the_others_do_not() {
        let s = simulate();
        let by = |name: &str| s.iter().find(|x| x.algorithm == name).unwrap();
        let fixed = by("fixed_window");
        assert_eq!(fixed.max_2s, 2 * BURST);
        assert_eq!(fixed.per_second[9..11], [BURST, BURST]);
        for name in [
            "sliding_window",
            "sliding_log",
            "token_bucket",
            "leaky_bucket",
        ] {
            let x = by(name);
            assert!(x.max_2s <= LIMIT + 20, "{name}: {}", x.max_2s);
        }
        // the second burst (12:00:00 is second 10 of the chart) is refused but for what is left
        assert_eq!(by("sliding_window").decided_per_second[10], 1);
        assert_eq!(by("sliding_log").decided_per_second[10], 1);
        assert_eq!(by("token_bucket").decided_per_second[10], 17);
        // the exact algorithm never exceeds the limit in any 60 s...
        assert_eq!(by("sliding_log").max_60s, LIMIT);
        // ...the approximation does when the previous minute's traffic came at its end (the
        // panel's note says so: keep it true)
        assert!(by("sliding_window").max_60s > LIMIT + LIMIT / 2);
        assert!(by("leaky_bucket").max_delay <= WINDOW);
        // the shaper releases at its leak rate: at most 17 in any second
        assert!(by("leaky_bucket").per_second.iter().all(|v| *v <= 17));
    }

    #[test]
    fn max_in_counts_half_open_spans() {
        assert_eq!(max_in(&[0, 1, 2, 10, 11], 2), 2);
        assert_eq!(max_in(&[0, 1, 2, 10, 11], 3), 3);
        assert_eq!(max_in(&[5, 5, 5], 1), 3);
        assert_eq!(max_in(&[], 1), 0);
    }
}
