"""The Python shapes of load under which the limit must hold exactly while Redis is
healthy, with the default timeout (50 ms) and on_error (open), so that a fallback shows as
an admission Redis did not grant: 20,000 concurrent ``acheck`` in one process (thread and
host transport), and 8 processes x 32 threads checking one key with the sync API.

``tests/test_host.py`` runs the first on an idle machine; scripts/test-overload.sh runs
them all with every CPU busy::

    python tests/overload_shapes.py          # from bindings/python (starts its own Redis)
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import sys
import threading
import time
from typing import Any

import shardlimit
from shardlimit import Limiter

_prefix = [0]


def _config(url: str, limit: int) -> str:
    _prefix[0] += 1
    return json.dumps({
        "shards": [{"name": "s0", "url": url}],
        "key_prefix": f"load{os.getpid()}-{_prefix[0]}-{time.time_ns()}:",
        "policies": {"hourly": {"algorithm": "fixed_window", "limit": limit, "window": "1h"}},
    })


def _tally(results: list[Any]) -> dict[str, Any]:
    admitted = fallbacks = errors = 0
    kinds: dict[str, int] = {}
    for r in results:
        if isinstance(r, BaseException):
            errors += 1
            kinds[type(r).__name__] = kinds.get(type(r).__name__, 0) + 1
            continue
        admitted += bool(r.allowed)
        fallbacks += r.source != "redis"
    return {"admitted": admitted, "fallbacks": fallbacks, "errors": errors, "kinds": kinds,
            "total": len(results)}


def concurrent_achecks(url: str, transport: str, n: int, limit: int) -> dict[str, Any]:
    """``n`` checks of one key, all started at once on one asyncio loop."""
    limiter = Limiter.from_json(_config(url, limit),
                                transport="host" if transport == "host" else "thread")

    async def main() -> list[Any]:
        calls = [limiter.acheck("one-key", "hourly") for _ in range(n)]
        results: list[Any] = await asyncio.gather(*calls, return_exceptions=True)
        return results

    try:
        return _tally(asyncio.run(main()))
    finally:
        limiter.close()


def _worker(text: str, threads: int, per_thread: int, out: Any) -> None:
    limiter = Limiter.from_json(text)
    results: list[Any] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def run() -> None:
        mine: list[Any] = []
        start.wait()
        for _ in range(per_thread):
            try:
                mine.append(limiter.check("one-key", "hourly"))
            except shardlimit.Error as e:
                mine.append(e)
        with lock:
            results.extend(mine)

    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    limiter.close()
    out.put(_tally(results))


def processes_threads(url: str, processes: int, threads: int, per_thread: int,
                      limit: int) -> dict[str, Any]:
    """``processes`` processes of ``threads`` threads, each making ``per_thread`` sync
    checks of one key (one limiter per process, as a WSGI server's workers)."""
    text = _config(url, limit)
    ctx = multiprocessing.get_context("spawn")
    out: Any = ctx.Queue()
    ps = [ctx.Process(target=_worker, args=(text, threads, per_thread, out))
          for _ in range(processes)]
    for p in ps:
        p.start()
    parts = [out.get(timeout=300) for _ in ps]
    for p in ps:
        p.join(timeout=60)
    total: dict[str, Any] = {"admitted": 0, "fallbacks": 0, "errors": 0, "kinds": {},
                             "total": 0}
    for part in parts:
        for k in ("admitted", "fallbacks", "errors", "total"):
            total[k] += part[k]
        for k, v in part["kinds"].items():
            total["kinds"][k] = total["kinds"].get(k, 0) + v
    return total


def main() -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from redis_support import RedisServer

    redis = RedisServer()
    failed = 0

    def report(what: str, limit: int, r: dict[str, Any], took: float) -> None:
        nonlocal failed
        ok = r["admitted"] == limit and r["fallbacks"] == 0 and r["errors"] == 0
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} python {what}: admitted {r['admitted']} of limit "
              f"{limit}, fallbacks {r['fallbacks']}, errors {r['errors']} {r['kinds']} "
              f"({took:.1f} s)", flush=True)

    try:
        t0 = time.monotonic()
        report("8 processes x 32 threads, one key, sync check", 100,
               processes_threads(redis.url, 8, 32, 20, 100), time.monotonic() - t0)
        for transport in ("thread", "host"):
            t0 = time.monotonic()
            report(f"20,000 concurrent acheck, {transport} transport", 100,
                   concurrent_achecks(redis.url, transport, 20_000, 100),
                   time.monotonic() - t0)
    finally:
        redis.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
