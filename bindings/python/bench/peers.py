"""One library, one run, for scripts/bench-peers.sh (which alternates the libraries and pins
this process to one CPU):

    python bench/peers.py --lib shardlimit|limits-redispy|limits-coredis --mode sync|async
        --redis redis://127.0.0.1:PORT [--redis-pid PID] [--n 20000] [--tasks 64]
        [--spin-wait 100us] [--transport host|thread]

The policy: a fixed window of 10^9 per hour over 1000 keys (every check admitted, one
script call per check in both libraries). `sync`: one thread, one call after another;
`async`: `--tasks` asyncio tasks. Prints one JSON line: decisions/s, p50/p99 of the calls
(sync: each call; async: each await), and the CPU per decision of this process
(/proc/self/stat, every thread) and of redis-server (/proc/PID/stat) while measuring.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any, Awaitable, Callable, Literal, cast

KEYS = 1000
LIMIT = 10**9
HZ = os.sysconf("SC_CLK_TCK")
REDIS_PID: str | None = None
CPU: dict[str, float] = {}


def mark(when: str) -> None:
    """The CPU used so far by this process and by redis-server, as `when`."""
    CPU[f"self_{when}"] = cpu_us("self")
    CPU[f"redis_{when}"] = cpu_us(REDIS_PID) if REDIS_PID else 0.0


def cpu_us(pid: str) -> float:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) * 1e6 / HZ


# shardlimit decisions whose source was not Redis: scripts/bench-peers.sh fails the run
FALLBACKS = [0]


def quantile(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(p * len(s)))]


def make(lib: str, url: str, mode: str, spin_wait: str | None,
         transport: str = "default") -> tuple[str, Any]:
    if lib == "shardlimit":
        import shardlimit

        sl = shardlimit.Limiter.from_json(json.dumps({
            "shards": [{"name": "bench", "url": url}],
            "timeout_ms": 1000,
            **({} if spin_wait is None else {"spin_wait": spin_wait}),
            "policies": {"fw": {"algorithm": "fixed_window", "limit": LIMIT, "window": "1h"}},
        }), transport=cast(Literal["default", "host", "thread"], transport))
        version = f"shardlimit {shardlimit.__version__}"
        def counted(d: Any) -> bool:
            # a decision that did not come from Redis (a fallback) is counted, not measured
            if d.source != "redis":
                FALLBACKS[0] += 1
            return bool(d.allowed)

        if mode == "sync":
            return version, lambda k: counted(sl.check(k, "fw"))

        async def acheck(k: str) -> bool:
            return counted(await sl.acheck(k, "fw"))

        return version, acheck
    from importlib.metadata import version as dist_version

    from limits import RateLimitItemPerHour

    item = RateLimitItemPerHour(LIMIT)
    impl = cast(Literal["redispy", "coredis"], lib.removeprefix("limits-"))
    if impl not in ("redispy", "coredis"):
        raise SystemExit(f"--lib must be shardlimit, limits-redispy or limits-coredis, got {lib}")
    client = "redis" if impl == "redispy" else "coredis"
    version = f"limits {dist_version('limits')} + {client} {dist_version(client)}"
    if mode == "sync":
        if impl != "redispy":
            raise SystemExit("limits' sync storage is redis-py: --lib limits-redispy")
        from limits import storage, strategies

        lim = strategies.FixedWindowRateLimiter(storage.storage_from_string(url))
        return version, lambda k: lim.hit(item, k)
    from limits.aio import storage as astorage
    from limits.aio import strategies as astrategies

    alim = astrategies.FixedWindowRateLimiter(
        astorage.RedisStorage(f"async+{url}", implementation=impl))
    return version, lambda k: alim.hit(item, k)


def run_sync(check: Callable[[str], Any], n: int) -> tuple[float, list[float]]:
    for i in range(2000):
        check(f"warm:{i % KEYS}")
    lat = []
    mark("start")
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter_ns()
        if not check(f"user:{i % KEYS}"):
            raise SystemExit("a check was denied")
        lat.append((time.perf_counter_ns() - s) / 1000)
    rate = n / (time.perf_counter() - t0)
    mark("end")
    return rate, lat


async def run_async(check: Callable[[str], Awaitable[Any]], n: int, tasks: int
                    ) -> tuple[float, list[float]]:
    for i in range(2000):
        await check(f"warm:{i % KEYS}")
    lat: list[float] = []
    nxt = 0

    async def worker() -> None:
        nonlocal nxt
        while nxt < n:
            i = nxt
            nxt += 1
            s = time.perf_counter_ns()
            if not await check(f"user:{i % KEYS}"):
                raise SystemExit("a check was denied")
            lat.append((time.perf_counter_ns() - s) / 1000)

    mark("start")
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    rate = n / (time.perf_counter() - t0)
    mark("end")
    return rate, lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--mode", choices=("sync", "async"), required=True)
    ap.add_argument("--redis", required=True)
    ap.add_argument("--redis-pid")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--spin-wait", help="shardlimit's spin_wait (default: the core's)")
    ap.add_argument("--transport", choices=("default", "host", "thread"), default="default",
                    help="shardlimit's transport (host: acheck's bytes on the asyncio loop)")
    a = ap.parse_args()
    global REDIS_PID
    REDIS_PID = a.redis_pid
    version, check = make(a.lib, a.redis, a.mode, a.spin_wait, a.transport)
    if a.mode == "sync":
        rate, lat = run_sync(check, a.n)
    else:
        rate, lat = asyncio.run(run_async(check, a.n, a.tasks))
    made = a.n + 2000  # with the warm-up (for Redis's commandstats)
    print(json.dumps({
        "lib": a.lib,
        "mode": a.mode,
        "version": version,
        "python": sys.version.split()[0],
        "decisions_per_sec": rate,
        "p50_us": quantile(lat, 0.5),
        "p99_us": quantile(lat, 0.99),
        "client_cpu_us": (CPU["self_end"] - CPU["self_start"]) / a.n,
        "redis_cpu_us": (CPU["redis_end"] - CPU["redis_start"]) / a.n if a.redis_pid else None,
        "decisions": made,
        "fallbacks": FALLBACKS[0],
    }))


if __name__ == "__main__":
    main()
