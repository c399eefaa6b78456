"""shardlimit vs the `limits` package (its Redis storage), same Redis, same policy, one run.

    python bindings/python/bench/bench_vs_limits.py [--n 20000] [--json out.json]

Starts its own redis-server on a free 127.0.0.1 port and measures (each rate over rounds of
`--n` decisions, for at least a second):

1. sequential sync decisions/s (one thread, one call after another);
2. asyncio decisions/s with 64 concurrent tasks (limits: both its coredis and redis-py
   async implementations, the faster one counts);
3. per-call overhead of a sync shardlimit check over the bare Redis round trip: the very
   command shardlimit sends (captured with SLOWLOG) replayed over a raw socket. Twice:
   shardlimit as configured by default (a blocking call spins on its socket for up to
   `spin_wait`, 100 us, before sleeping) against a raw socket read that spins too, and
   shardlimit with `spin_wait: 0` against a raw socket read that sleeps.

The policy is a fixed window of 10^9 per hour (every check allowed, one script call per
check) in both libraries; a sliding-window counter comparison follows. Targets:
sync >= 3x limits, asyncio >= 5x limits async, overhead <= 15 us.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from redis_support import RedisServer, _encode, _Reader  # noqa: E402

import shardlimit  # noqa: E402

TASKS = 64
LIMIT = 10**9


class _SpinningSocket:
    """A socket whose recv() polls without ever sleeping (MSG_DONTWAIT in a loop)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def recv(self, n: int) -> bytes:
        while True:
            try:
                return self.sock.recv(n, socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass


def rate(n: int, seconds: float) -> float:
    return n / seconds


# A rate is measured over rounds of `n` decisions until at least this long has passed: a
# fast library's 20,000 decisions take a fifth of a second, too short to be steady.
MIN_SECONDS = 1.0


def timed_sync(fn: Callable[[str], Any], n: int, key: str) -> float:
    for _ in range(min(500, n)):
        fn(key)
    done, t0 = 0, time.perf_counter()
    while done == 0 or time.perf_counter() - t0 < MIN_SECONDS:
        for _ in range(n):
            fn(key)
        done += n
    return rate(done, time.perf_counter() - t0)


async def timed_async(fn: Callable[[str], Awaitable[Any]], n: int, key: str) -> float:
    per_task = n // TASKS

    async def task() -> None:
        for _ in range(per_task):
            await fn(key)

    # warm-up (connections, scripts, the loop's first rounds), for as long as a measurement
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < MIN_SECONDS:
        await asyncio.gather(*(task() for _ in range(TASKS)))
    done, t0 = 0, time.perf_counter()
    while done == 0 or time.perf_counter() - t0 < MIN_SECONDS:
        await asyncio.gather(*(task() for _ in range(TASKS)))
        done += per_task * TASKS
    return rate(done, time.perf_counter() - t0)


def latencies(fn: Callable[[], Any], n: int) -> list[float]:
    for _ in range(min(500, n)):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def summary(us: list[float]) -> dict[str, float]:
    us = sorted(us)
    return {"mean_us": statistics.fmean(us), "p50_us": us[len(us) // 2],
            "p99_us": us[int(len(us) * 0.99)]}


def captured_command(server: RedisServer, limiter: shardlimit.Limiter, key: str) -> list[bytes]:
    """The exact command one shardlimit check sends, from SLOWLOG."""
    with server.conn() as c:
        c("CONFIG", "SET", "slowlog-log-slower-than", "0")
        c("SLOWLOG", "RESET")
        limiter.check(key, "fw")
        entries = c("SLOWLOG", "GET", 10)
        c("CONFIG", "SET", "slowlog-log-slower-than", "10000")
    for entry in entries:
        args = entry[3]
        if args and args[0].upper() in (b"EVALSHA", b"EVAL"):
            return list(args)
    raise RuntimeError(f"no script call in SLOWLOG: {entries!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=20000, help="decisions per measurement")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    n = args.n

    from limits import RateLimitItemPerHour
    from limits import storage as lstorage
    from limits import strategies as lstrategies
    from limits.aio import storage as astorage
    from limits.aio import strategies as astrategies

    server = RedisServer()
    results: dict[str, Any] = {"n": n, "tasks": TASKS, "python": sys.version.split()[0],
                               "shardlimit": shardlimit.__version__,
                               "cpus": os.cpu_count()}
    try:
        cfg = json.dumps({
            "shards": [{"name": "bench", "url": server.url}],
            "timeout_ms": 5000,
            "policies": {
                "fw": {"algorithm": "fixed_window", "limit": LIMIT, "window": "1h"},
                "sw": {"algorithm": "sliding_window", "limit": LIMIT, "window": "1h"},
            },
        })
        sl = shardlimit.Limiter.from_json(cfg)
        item = RateLimitItemPerHour(LIMIT)
        sync_storage = lstorage.storage_from_string(server.url)
        l_fw = lstrategies.FixedWindowRateLimiter(sync_storage)
        l_sw = lstrategies.SlidingWindowCounterRateLimiter(sync_storage)

        # 1. sequential sync
        r = results["sync"] = {
            "shardlimit_fixed_window": timed_sync(lambda k: sl.check(k, "fw"), n, "s1"),
            "limits_fixed_window": timed_sync(lambda k: l_fw.hit(item, k), n, "l1"),
            "shardlimit_sliding_window": timed_sync(lambda k: sl.check(k, "sw"), n, "s2"),
            "limits_sliding_window_counter": timed_sync(lambda k: l_sw.hit(item, k), n, "l2"),
        }
        r["ratio_fixed_window"] = r["shardlimit_fixed_window"] / r["limits_fixed_window"]
        r["ratio_sliding_window"] = (r["shardlimit_sliding_window"]
                                     / r["limits_sliding_window_counter"])

        # 2. asyncio, 64 tasks
        async def run_async() -> dict[str, float]:
            out = {"shardlimit_fixed_window": await timed_async(
                lambda k: sl.acheck(k, "fw"), n, "as1")}
            for impl in ("coredis", "redispy"):
                st = astorage.RedisStorage(f"async+{server.url}", implementation=impl)
                lim = astrategies.FixedWindowRateLimiter(st)
                out[f"limits_{impl}_fixed_window"] = await timed_async(
                    lambda k: lim.hit(item, k), n, f"al-{impl}")
            out["shardlimit_sliding_window"] = await timed_async(
                lambda k: sl.acheck(k, "sw"), n, "as2")
            st = astorage.RedisStorage(f"async+{server.url}", implementation="coredis")
            lsw = astrategies.SlidingWindowCounterRateLimiter(st)
            out["limits_coredis_sliding_window_counter"] = await timed_async(
                lambda k: lsw.hit(item, k), n, "al-sw")
            return out

        a = results["asyncio"] = asyncio.run(run_async())
        best = max(a["limits_coredis_fixed_window"], a["limits_redispy_fixed_window"])
        a["ratio_fixed_window_vs_best_limits"] = a["shardlimit_fixed_window"] / best

        # 3. per-call overhead over the bare round trip of the same command
        command = captured_command(server, sl, "ov")
        raw = socket.create_connection(("127.0.0.1", server.port))
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = _Reader(raw)
        wire = _encode(*command)

        def bare() -> None:
            raw.sendall(wire)
            reply = reader.reply()
            assert isinstance(reply, list), reply

        # the same, reading without ever sleeping (what spin_wait does in the core)
        raw_spin = socket.create_connection(("127.0.0.1", server.port))
        raw_spin.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        spin_reader = _Reader(_SpinningSocket(raw_spin))  # type: ignore[arg-type]

        def bare_spinning() -> None:
            raw_spin.sendall(wire)
            reply = spin_reader.reply()
            assert isinstance(reply, list), reply

        nospin = shardlimit.Limiter.from_json(json.dumps({**json.loads(cfg), "spin_wait": 0}))
        nospin.check("ov", "fw")

        ping = _encode("PING")

        def bare_ping() -> None:
            raw.sendall(ping)
            reader.reply()

        m = min(n, 20000)
        # the binding's own cost: the same call on the in-memory engine (no I/O at all)
        mem = shardlimit.Limiter.from_json(json.dumps({"policies": {
            "fw": {"algorithm": "fixed_window", "limit": LIMIT, "window": "1h"}}}))
        mem_lat = summary(latencies(lambda: mem.check("ov", "fw"), m))
        sl_lat = summary(latencies(lambda: sl.check("ov", "fw"), m))
        spin_lat = summary(latencies(bare_spinning, m))
        nospin_lat = summary(latencies(lambda: nospin.check("ov", "fw"), m))
        bare_lat = summary(latencies(bare, m))
        ping_lat = summary(latencies(bare_ping, m))
        raw.close()
        raw_spin.close()
        results["overhead"] = {
            "shardlimit_check": sl_lat,
            "bare_same_command_raw_socket_spinning": spin_lat,
            "shardlimit_check_spin_wait_0": nospin_lat,
            "bare_same_command_raw_socket": bare_lat,
            "bare_ping_raw_socket": ping_lat,
            "memory_engine_check": mem_lat,
            "overhead_p50_us": sl_lat["p50_us"] - spin_lat["p50_us"],
            "overhead_mean_us": sl_lat["mean_us"] - spin_lat["mean_us"],
            "overhead_no_spin_p50_us": nospin_lat["p50_us"] - bare_lat["p50_us"],
            "overhead_no_spin_mean_us": nospin_lat["mean_us"] - bare_lat["mean_us"],
            "command": [c.decode(errors="replace") for c in command[:3]] + ["..."],
        }
    finally:
        server.stop()

    s, a, o = results["sync"], results["asyncio"], results["overhead"]
    print(f"shardlimit {results['shardlimit']}, Python {results['python']}, "
          f"{results['cpus']} CPUs, {n} decisions per measurement, one local redis-server")
    print("\nsequential sync decisions/s")
    print(f"  fixed window    shardlimit {s['shardlimit_fixed_window']:>9,.0f}   limits "
          f"{s['limits_fixed_window']:>9,.0f}   x{s['ratio_fixed_window']:.2f} (target >= 3)")
    print(f"  sliding window  shardlimit {s['shardlimit_sliding_window']:>9,.0f}   limits "
          f"{s['limits_sliding_window_counter']:>9,.0f}   x{s['ratio_sliding_window']:.2f}")
    print(f"\nasyncio decisions/s, {TASKS} tasks")
    print(f"  fixed window    shardlimit {a['shardlimit_fixed_window']:>9,.0f}   limits "
          f"coredis {a['limits_coredis_fixed_window']:>8,.0f} / redis-py "
          f"{a['limits_redispy_fixed_window']:>8,.0f}   "
          f"x{a['ratio_fixed_window_vs_best_limits']:.2f} vs the faster (target >= 5)")
    print(f"  sliding window  shardlimit {a['shardlimit_sliding_window']:>9,.0f}   limits "
          f"coredis {a['limits_coredis_sliding_window_counter']:>8,.0f}")
    print("\nsync latency, microseconds (p50 / mean / p99)")
    for label, k in (("shardlimit check", "shardlimit_check"),
                     ("same command, raw, spinning", "bare_same_command_raw_socket_spinning"),
                     ("check, spin_wait 0", "shardlimit_check_spin_wait_0"),
                     ("same command, raw socket", "bare_same_command_raw_socket"),
                     ("PING, raw socket", "bare_ping_raw_socket"),
                     ("check, in-memory engine", "memory_engine_check")):
        v = o[k]
        print(f"  {label:<28}{v['p50_us']:7.1f} {v['mean_us']:7.1f} {v['p99_us']:7.1f}")
    print(f"  overhead over the bare round trip (both spinning): p50 "
          f"{o['overhead_p50_us']:.1f} us, mean {o['overhead_mean_us']:.1f} us (target <= 15)")
    print(f"  overhead over the bare round trip (neither spinning): p50 "
          f"{o['overhead_no_spin_p50_us']:.1f} us, mean {o['overhead_no_spin_mean_us']:.1f} us")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
