#!/usr/bin/env python3
"""Writes docs/benchmarks.md from the results of scripts/bench-peers.sh.

    python3 bench/report.py RESULTS.jsonl OUT.md --meta k=v ... --lock bench/peers.lock

Every figure is the median over the rounds of one run (each library in its own process,
the libraries alternating within a round); ratios compare medians of the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

SHAPES = {
    "node-64": ("Node, 64 concurrent checks, 1000 keys, fixed window (node pinned to one CPU)",
                "shardlimit", ["rlf", "shardlimit spin_wait 100us", "shardlimit host transport",
                               "shardlimit thread transport"]),
    "py-async": ("Python asyncio, 64 tasks, 1000 keys, fixed window (pinned to one CPU)",
                 "shardlimit", ["limits-coredis", "limits-redispy", "shardlimit host transport",
                                "shardlimit thread transport"]),
    "py-sync": ("Python sync, one thread, 1000 keys, fixed window (pinned to one CPU)",
                "shardlimit", ["limits-redispy", "shardlimit spin_wait 100us"]),
    "go-64": ("Go, 64 goroutines, 1000 keys (shardlimit fixed window, redis_rate GCRA; pinned to one CPU)",
              "shardlimit", ["redis_rate", "shardlimit TransportThread"]),
    "rust": ("Rust: `shardlimit bench` (64 concurrent, 100k keys, token bucket, never denied) "
             "vs redis-benchmark -P 16 -c 50 on a minimal hash token-bucket script",
             "shardlimit bench", ["redis-benchmark -P16 -c50, minimal token bucket script"]),
}
LABELS = {
    "rlf": "rate-limiter-flexible + ioredis",
    "shardlimit spin_wait 100us": "shardlimit, `spin_wait: 100us` forced",
    "shardlimit host transport": "shardlimit, host transport named (bytes on the event loop, the default: Node `transport: 'host'`, Python `transport=\"host\"`)",
    "shardlimit thread transport": "shardlimit, the I/O thread (the opt-out of the default: Node `transport: 'thread'`, Python `transport=\"thread\"`)",
    "limits-coredis": "limits (async, coredis)",
    "limits-redispy": "limits (redis-py)",
    "redis_rate": "redis_rate + go-redis",
    "shardlimit TransportThread": "shardlimit, `WithTransport(TransportThread)` (the I/O thread; the default is the host transport, bytes on Go's netpoller)",
}
HTTP = {
    "express": ("Express, trivial route", {"rlf": "rate-limiter-flexible middleware",
                                           "erl": "express-rate-limit + rate-limit-redis"}),
    "fastapi": ("FastAPI (uvicorn, one worker), trivial route", {"peer": "slowapi"}),
    "flask": ("Flask (gunicorn -w 4), trivial route", {"peer": "Flask-Limiter"}),
}


def med(xs: list[Optional[float]]) -> Optional[float]:
    v = [x for x in xs if x is not None]
    return statistics.median(v) if v else None


def fmt(x: Optional[float], digits: int = 1) -> str:
    if x is None:
        return "–"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def span(xs: list[float]) -> str:
    if len(xs) < 2:
        return ""
    return f" ({min(xs):,.0f}–{max(xs):,.0f})"


MEMORY_LIBS = [("shardlimit_token_bucket", "shardlimit `Limiter::memory()`, token bucket"),
               ("shardlimit_fixed_window", "shardlimit `Limiter::memory()`, fixed window")]
GOVERNOR_RUNS = ["governor_keyed", "governor_keyed_again"]
THREADS = [("1_thread", "one thread (pinned to CPU 0)"), ("2_threads", "two threads")]


def criterion_ns(d: Path, lib: str, threads: str) -> Optional[tuple[float, float, float]]:
    """criterion's median ns per check and its 95% confidence interval, or None."""
    f = d / lib / threads / "new" / "estimates.json"
    if not f.exists():
        return None
    e = json.loads(f.read_text())["median"]
    ci = e["confidence_interval"]
    return e["point_estimate"], ci["lower_bound"], ci["upper_bound"]


def memory_vs_governor(d: Path, w: Any, target: Any) -> list[tuple[str, str, str, str]]:
    """The in-memory engine against governor's keyed limiter (core/benches/governor.rs);
    returns the README's rows."""
    short: list[tuple[str, str, str, str]] = []
    w("## Rust in-memory engine against governor's keyed limiter (criterion, 1000 keys, never denied)")
    w("")
    w("`cargo bench -p shardlimit --bench governor`: shardlimit's `check_blocking` on "
      "`Limiter::memory()` and governor's `RateLimiter::keyed(..).check_key` on the same "
      "1000 keys, alternating in one bench (governor runs twice, between and after "
      "shardlimit's; its figure is the mean of the two medians). Two threads: wall time "
      "per check with both threads checking. ns per check: criterion's median "
      "(95% confidence interval).")
    w("")
    w("| threads | library | ns per check | governor ÷ this (≥ 1: shardlimit as fast or faster) |")
    w("| --- | --- | ---: | ---: |")
    for threads, title in THREADS:
        gov = [x for x in (criterion_ns(d, g, threads) for g in GOVERNOR_RUNS) if x]
        g_ns = statistics.mean(x[0] for x in gov) if gov else None
        if gov:
            runs = " / ".join(f"{x[0]:.1f} ({x[1]:.1f}–{x[2]:.1f})" for x in gov)
            w(f"| {title} | governor `RateLimiter::keyed` (default keyed store) | {g_ns:.1f}: {runs} | |")
        worst: Optional[float] = None
        for lib, label in MEMORY_LIBS:
            x = criterion_ns(d, lib, threads)
            if not x:
                continue
            r = g_ns / x[0] if g_ns else None
            worst = r if worst is None or (r is not None and r < worst) else worst
            w(f"| {title} | {label} | {x[0]:.1f} ({x[1]:.1f}–{x[2]:.1f}) | {fmt(r, 2)}{'×' if r else ''} |")
        target(f"In-memory engine, {title}: governor's ns per check ÷ shardlimit's (the slower algorithm)",
               worst, "≥ 1", worst is not None and worst >= 1)
        if worst and g_ns:
            short.append((f"In-memory engine, {title} (the slower algorithm)", f"{g_ns / worst:.1f} ns",
                          f"governor 0.10 keyed: {g_ns:.1f} ns", f"{1 / worst:.2f}×"))
    w("")
    return short


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--meta", action="append", default=[])
    ap.add_argument("--lock")
    ap.add_argument("--readme", help="a file with the markers README_START/README_END (the "
                    "README): the short table between them is rewritten from this run")
    ap.add_argument("--criterion", help="criterion's memory_vs_governor directory "
                    "(cargo bench -p shardlimit --bench governor)")
    a = ap.parse_args()
    meta = dict(m.split("=", 1) for m in a.meta)
    rows = [json.loads(line) for line in Path(a.results).read_text().splitlines() if line.strip()]
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[(r["shape"], r["label"])].append(r)

    def m(shape: str, label: str, field: str) -> Optional[float]:
        return med([r.get(field) for r in by.get((shape, label), [])])

    out: list[str] = []
    w = out.append
    w("# Benchmarks: shardlimit against the latest peers")
    w("")
    w(f"Written by `make bench` (`scripts/bench-peers.sh`) on {meta.get('date')}"
      + (" in **`--quick` mode (one short round: these numbers only show that the script works)**"
         if meta.get("quick") == "1" else f", {meta.get('rounds')} rounds") + ".")
    w("")
    w(f"- Machine: {meta.get('cpu')}; load average before `{meta.get('load_before')}`, "
      f"after `{meta.get('load_after')}`. The machine is shared with other work: figures "
      "move by ±20% between runs; ratios (same run, libraries alternating) move less.")
    w(f"- Redis {meta.get('redis')} pinned to CPU 1, each client process pinned to CPU 0 "
      "(`taskset`); the HTTP load generator (wrk, 64 connections) runs on CPU 1 beside Redis.")
    w(f"- shardlimit from {meta.get('artifacts')}, commit {meta.get('commit')}; Node "
      f"{meta.get('node')}, Python {meta.get('python')}, {meta.get('go')}.")
    w("- CPU per decision: the client process (every thread) from `/proc/<pid>/stat` over "
      "the measured phase; Redis from `/proc/<pid>/stat` (all of redis-server) and from "
      "`INFO commandstats` (the server time of the commands alone, over every decision "
      "of the run, warm-up and sequential phase included).")
    w(f"- Sizes: {meta.get('total')} concurrent decisions and {meta.get('sequential')} "
      f"sequential ones (p50/p99) per Node and Go run; {meta.get('py_async_n')} per Python asyncio run and "
      f"{meta.get('py_n')} per Python sync run "
      f"(p50/p99 of every call); {meta.get('rust_n')} per Rust run; "
      f"{meta.get('http_secs')} s per HTTP run.")
    if a.lock:
        peers = [line.split() for line in Path(a.lock).read_text().splitlines()
                 if line.strip() and not line.startswith("#")]
        checked = [line for line in Path(a.lock).read_text().splitlines() if "checked:" in line]
        w(f"- Peers (`bench/peers.lock`, {checked[0].split('checked:')[1].strip() if checked else ''}): "
          + ", ".join(f"{n} {v}" for _, n, v in peers)
          + f"; built: redis_rate {meta.get('redis_rate')}, go-redis {meta.get('go_redis')}.")
    w("")

    fallbacks = sum(r.get("fallbacks", 0) + r.get("non_2xx", 0) for r in rows)
    w(f"- Only decisions that came from Redis are measured: a fallback (`on_error`) is not a "
      f"decision, each run counts them (and the HTTP apps answer one with 503), and a run "
      f"that had any fails. This run: {fallbacks} fallbacks in {len(rows)} runs.")
    w("")

    targets: list[tuple[str, str, Optional[float], str, Optional[bool]]] = []
    short_http: list[tuple[str, str, str, str]] = []

    for shape, (title, base, peers) in SHAPES.items():
        if not any(k[0] == shape for k in by):
            continue
        w(f"## {title}")
        w("")
        w("| library | decisions/s (min–max) | p50 µs | p99 µs | client CPU µs/decision | "
          "Redis CPU µs/decision | Redis command µs/decision | shardlimit ÷ this, decisions/s | "
          "this ÷ shardlimit, client CPU |")
        w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        b_rate, b_cpu = m(shape, base, "decisions_per_sec"), m(shape, base, "client_cpu_us")
        for label in [base] + peers:
            rs = by.get((shape, label))
            if not rs:
                continue
            rate = m(shape, label, "decisions_per_sec")
            cpu = m(shape, label, "client_cpu_us")
            ratio = "" if label == base or not rate or not b_rate else f"{b_rate / rate:.2f}×"
            cratio = "" if label == base or not cpu or not b_cpu else f"{b_cpu / cpu:.2f}×"
            version = rs[0].get("version", label)
            w(f"| {LABELS.get(label, label)}"
              + (f" ({version})" if version and version != label else "")
              + f" | {fmt(rate)}{span([r['decisions_per_sec'] for r in rs])} | "
              f"{fmt(m(shape, label, 'p50_us'))} | {fmt(m(shape, label, 'p99_us'))} | "
              f"{fmt(cpu)} | {fmt(m(shape, label, 'redis_cpu_us'))} | "
              f"{fmt(m(shape, label, 'redis_script_us'))} | {ratio} | {cratio} |")
        w("")

    def ratio_of(shape: str, a_label: str, b_label: str, field: str) -> Optional[float]:
        x, y = m(shape, a_label, field), m(shape, b_label, field)
        return x / y if x and y else None

    def target(name: str, value: Optional[float], want: str, ok: Optional[bool]) -> None:
        targets.append((name, want, value, "", ok))

    r = ratio_of("node-64", "shardlimit", "rlf", "decisions_per_sec")
    target("Node decisions/s ÷ rate-limiter-flexible", r, "≥ 1.5", r is not None and r >= 1.5)
    r = ratio_of("node-64", "shardlimit", "rlf", "client_cpu_us")
    target("Node client CPU per decision ÷ rate-limiter-flexible", r, "≤ 0.6", r is not None and r <= 0.6)
    r = ratio_of("node-64", "shardlimit host transport", "rlf", "decisions_per_sec")
    target("Node, host transport: decisions/s ÷ rate-limiter-flexible", r, "≥ 1.5", r is not None and r >= 1.5)
    r = ratio_of("node-64", "shardlimit host transport", "rlf", "client_cpu_us")
    target("Node, host transport: client CPU per decision ÷ rate-limiter-flexible", r, "≤ 0.6",
           r is not None and r <= 0.6)
    best = max([x for x in (m("py-async", "limits-coredis", "decisions_per_sec"),
                            m("py-async", "limits-redispy", "decisions_per_sec")) if x] or [0])
    sl = m("py-async", "shardlimit", "decisions_per_sec")
    r = sl / best if sl and best else None
    target("Python asyncio decisions/s ÷ the faster limits async", r, "≥ 5", r is not None and r >= 5)
    r = ratio_of("py-sync", "shardlimit", "limits-redispy", "decisions_per_sec")
    target("Python sync decisions/s ÷ limits", r, "≥ 3", r is not None and r >= 3)
    r = ratio_of("go-64", "shardlimit", "redis_rate", "decisions_per_sec")
    target("Go decisions/s at 64 goroutines ÷ redis_rate", r, "≥ 1.5", r is not None and r >= 1.5)
    r = ratio_of("go-64", "shardlimit", "redis_rate", "client_cpu_us")
    target("Go client CPU per decision ÷ redis_rate", r, "≤ 0.7", r is not None and r <= 0.7)
    r = ratio_of("go-64", "shardlimit", "redis_rate", "p50_us")
    target("Go single-goroutine p50 ÷ redis_rate", r, "≤ 1", r is not None and r <= 1)
    go_sl, rust_sl = m("go-64", "shardlimit", "decisions_per_sec"), m("rust", "shardlimit bench", "decisions_per_sec")
    r = go_sl / rust_sl if go_sl and rust_sl else None
    target("Go at 64 goroutines ÷ the Rust async caller (`shardlimit bench`; 1000 vs 100k keys)", r, "≥ 0.9",
           r is not None and r >= 0.9)
    rb = "redis-benchmark -P16 -c50, minimal token bucket script"
    r = ratio_of("rust", "shardlimit bench", rb, "decisions_per_sec")
    target("`shardlimit bench` ÷ redis-benchmark on a minimal script", r, "≥ 0.9", r is not None and r >= 0.9)
    r = ratio_of("rust", "shardlimit bench", rb, "redis_script_us")
    target("Redis command time per decision ÷ the minimal script's (token bucket, batched)", r, "≤ 1.2",
           r is not None and r <= 1.2)
    r = ratio_of("node-64", "shardlimit", "rlf", "redis_script_us")
    target("Redis command time per decision ÷ rate-limiter-flexible's (fixed window, Node, 64 concurrent)", r,
           "≤ 0.6", r is not None and r <= 0.6)
    r = ratio_of("node-64", "shardlimit", "rlf", "redis_cpu_us")
    target("Redis CPU (`/proc`) per decision ÷ rate-limiter-flexible's (the same run)", r, "≤ 0.6",
           r is not None and r <= 0.6)
    r = ratio_of("node-64", "shardlimit", "shardlimit spin_wait 100us", "decisions_per_sec")
    target("Node pinned to one CPU: default ÷ spin_wait 100us forced, decisions/s", r, "≥ 1 (never worse with fewer cores)",
           r is not None and r >= 0.95)

    http_rows = [k for k in by if k[0].startswith("http-")]
    if http_rows:
        w("## HTTP: a trivial route, wrk -c 64")
        w("")
        w("Added CPU per request: the server's CPU per request (every process of it, from "
          "`/proc`) minus that of the same route without a limiter, in the same round "
          "(median over rounds). Every limiter keys by client address on Redis, a fixed "
          "window of 10^9 per hour (never denied).")
        w("")
        w("| framework | limiter | requests/s (min–max) | server CPU µs/request | added CPU µs/request | added CPU ÷ shardlimit's | Redis command µs/request |")
        w("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for fw, (title, peer_names) in HTTP.items():
            shape = "http-" + fw
            if (shape, "none") not in by:
                continue
            base_rounds = {r["round"]: r["cpu_us_per_req"] for r in by[(shape, "none")]}

            def added(label: str) -> Optional[float]:
                return med([r["cpu_us_per_req"] - base_rounds[r["round"]]
                            for r in by.get((shape, label), []) if r["round"] in base_rounds])

            sl_added = added("shardlimit")
            for label, name in [("none", "none"), ("shardlimit", "shardlimit middleware")] + list(peer_names.items()):
                rs = by.get((shape, label))
                if not rs:
                    continue
                ad = added(label) if label != "none" else None
                rr = f"{ad / sl_added:.1f}×" if label not in ("none", "shardlimit") and ad and sl_added and sl_added > 0 else ""
                bad = sum(r.get("non_2xx", 0) for r in rs)
                w(f"| {title} | {name}{f' ({bad} non-2xx)' if bad else ''} | "
                  f"{fmt(med([r['req_per_sec'] for r in rs]))}{span([r['req_per_sec'] for r in rs])} | "
                  f"{fmt(med([r['cpu_us_per_req'] for r in rs]))} | {fmt(ad)} | {rr} | "
                  f"{fmt(med([r.get('redis_script_us') for r in rs]), 2)} |")
            for label, name in peer_names.items():
                ad = added(label)
                if sl_added is not None and ad:
                    short_http.append((f"{title}: added CPU per request", f"{sl_added:.1f} µs",
                                       f"{name}: {ad:.1f} µs", f"{sl_added / ad:.2f}×"))
                if fw == "express":
                    r_ = sl_added / ad if sl_added is not None and ad else None
                    target(f"Express added CPU per request ÷ {name}'s", r_, "≤ 1", r_ is not None and r_ <= 1)
            if fw == "fastapi":
                target("FastAPI added CPU per request, µs", sl_added, "≤ 25", sl_added is not None and sl_added <= 25)
            if fw == "flask":
                target("Flask added CPU per request, µs", sl_added, "≤ 50", sl_added is not None and sl_added <= 50)
        w("")

    short_memory: list[tuple[str, str, str, str]] = []
    if a.criterion:
        short_memory = memory_vs_governor(Path(a.criterion), w, target)

    w("## Targets (issue 27: one core, latest peers, one run, alternating)")
    w("")
    w("| target | measured | wanted | met |")
    w("| --- | ---: | ---: | :---: |")
    for name, want, value, _, ok in targets:
        w(f"| {name} | {fmt(value, 2)} | {want} | {'yes' if ok else 'no' if value is not None else '–'} |")
    w("")
    w("## Dated notes")
    w("")
    w("What was measured on the way to the current design (profiles, alternating A/B runs, "
      "choices and their reasons), one file per period: [notes/](notes/).")
    w("")
    w("Capacity planning from these figures (shards per million decisions/s for each "
      "algorithm, memory per key, connections, 100 shards and 1,000 processes): "
      "[capacity.md](capacity.md).")
    w("")
    # sections other tools measure (`make bench-redis-cost`, `make bench-serve`,
    # `make bench-scale`): kept as the file has them
    for section in kept_sections(Path(a.out)):
        out.extend(section)
    Path(a.out).write_text("\n".join(out))
    if a.readme:
        write_readme_table(Path(a.readme), meta, short_rows(m, by) + short_http + short_memory)


README_START = "<!-- make bench: the short table, written by bench/report.py -->"
README_END = "<!-- make bench: end -->"


def short_rows(m: Any, by: dict[tuple[str, str], list[dict[str, Any]]]) -> list[tuple[str, str, str, str]]:
    """The README's rows: (what, shardlimit, the peer, shardlimit ÷ the peer)."""
    rows: list[tuple[str, str, str, str]] = []

    def version(shape: str, label: str) -> str:
        rs = by.get((shape, label)) or [{}]
        return rs[0].get("version", label)

    def rate(what: str, shape: str, peer: str, base: str = "shardlimit") -> None:
        x, y = m(shape, base, "decisions_per_sec"), m(shape, peer, "decisions_per_sec")
        if x and y:
            rows.append((what, f"{x:,.0f}/s", f"{version(shape, peer)}: {y:,.0f}/s", f"{x / y:.2f}×"))

    rate("Node, 64 concurrent checks", "node-64", "rlf")
    x, y = m("node-64", "shardlimit", "redis_script_us"), m("node-64", "rlf", "redis_script_us")
    if x and y:
        rows.append(("Redis command time per decision (the Node run)", f"{x:.2f} µs",
                     f"{version('node-64', 'rlf')}: {y:.2f} µs", f"{x / y:.2f}×"))
    best = max((lab for lab in ("limits-coredis", "limits-redispy") if m("py-async", lab, "decisions_per_sec")),
               key=lambda lab: m("py-async", lab, "decisions_per_sec"), default=None)
    if best:
        rate("Python asyncio, 64 tasks", "py-async", best)
    rate("Python sync, one thread", "py-sync", "limits-redispy")
    rate("Go, 64 goroutines", "go-64", "redis_rate")
    rate("Rust, `shardlimit bench` (token bucket)", "rust",
         "redis-benchmark -P16 -c50, minimal token bucket script", base="shardlimit bench")
    return rows


def write_readme_table(path: Path, meta: dict[str, str], rows: list[tuple[str, str, str, str]]) -> None:
    text = path.read_text()
    if README_START not in text or README_END not in text:
        raise SystemExit(f"{path}: the markers {README_START!r} and {README_END!r} are missing")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    table = [README_START, "",
             f"`make bench` on {meta.get('date', '?')[:10]} (one core each for the client and Redis, "
             "peers at their latest releases, medians of alternating rounds; every row and its "
             "CPU per decision: [docs/benchmarks.md](docs/benchmarks.md)):", "",
             "| shape | shardlimit | peer | shardlimit ÷ peer (rates: higher is better; times: lower) |",
             "| --- | ---: | ---: | ---: |"]
    table += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    if meta.get("quick") == "1":
        table += ["", "(a `--quick` run: these numbers only show that the script works)"]
    table += ["", README_END]
    path.write_text(head + "\n".join(table) + tail)


# the headings of the sections of docs/benchmarks.md that this script does not write (and
# keeps, whole, at the end): the Redis cost per algorithm (scripts/bench-redis-cost.sh),
# `shardlimit serve` against Lyft's ratelimit (scripts/bench-serve.sh), scale out over
# 1-8 shards and Cluster primaries (scripts/bench-scale.sh, which `make bench` also runs)
# and Java against Bucket4j (scripts/bench-java.sh)
KEPT = ("## Redis's own work per decision", "## shardlimit serve against Lyft's ratelimit",
        "## Scale out", "## Java: ")


def kept_sections(path: Path) -> list[list[str]]:
    """The KEPT sections of the existing `path`, each from its heading to the next `## `."""
    if not path.exists():
        return []
    sections: list[list[str]] = []
    cur: Optional[list[str]] = None
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            cur = [line] if line.startswith(KEPT) else None
            if cur is not None:
                sections.append(cur)
        elif cur is not None:
            cur.append(line)
    for s in sections:
        while s and not s[-1].strip():
            s.pop()
        s.append("")
    return sections


if __name__ == "__main__":
    main()
