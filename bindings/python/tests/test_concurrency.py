"""Exact admission under contention on one key: 64 Python threads (sync calls release the
GIL) and 64 asyncio tasks (driven by the limiter's runtime) against a real Redis."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest
from redis_support import RedisServer, config

from shardlimit import Limiter

LIMIT = 500
ATTEMPTS_PER_WORKER = 16
WORKERS = 64  # 1024 attempts for 500 units
POLICIES = {
    # an exact sliding window with no boundary inside a test run
    "exact": {"algorithm": "sliding_log", "limit": LIMIT, "window": "1h"},
    "bucket": {"algorithm": "token_bucket", "capacity": LIMIT, "refill_per_sec": 0.001},
    "pool": {"algorithm": "concurrency", "max": 7, "lease_ttl": "1m"},
}


@pytest.fixture
def limiter(redis: RedisServer) -> Limiter:
    return Limiter.from_json(config([redis], POLICIES, timeout_ms=5000))


@pytest.mark.parametrize("policy", ["exact", "bucket"])
def test_64_threads_admit_exactly_the_limit(limiter: Limiter, policy: str) -> None:
    results: Counter[bool] = Counter()
    lock = threading.Lock()
    start = threading.Barrier(WORKERS)

    def worker() -> None:
        start.wait()
        local = Counter(limiter.check("one-key", policy).allowed for _ in range(ATTEMPTS_PER_WORKER))
        with lock:
            results.update(local)

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[True] == LIMIT
    assert results[False] == WORKERS * ATTEMPTS_PER_WORKER - LIMIT
    assert limiter.peek("one-key", policy).remaining == 0


@pytest.mark.parametrize("policy", ["exact", "bucket"])
def test_64_asyncio_tasks_admit_exactly_the_limit(limiter: Limiter, policy: str) -> None:
    async def task() -> list[bool]:
        return [(await limiter.acheck("one-key", policy)).allowed
                for _ in range(ATTEMPTS_PER_WORKER)]

    async def main() -> Counter[bool]:
        runs = await asyncio.gather(*(task() for _ in range(WORKERS)))
        return Counter(a for run in runs for a in run)

    results = asyncio.run(main())
    assert results[True] == LIMIT
    assert results[False] == WORKERS * ATTEMPTS_PER_WORKER - LIMIT


def test_weighted_costs_never_overshoot(limiter: Limiter) -> None:
    # 64 threads asking 1..4 units each: the admitted units sum to at most the limit, and
    # every admitted check saw exactly the units the earlier ones left
    admitted: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(WORKERS)

    def worker(n: int) -> None:
        start.wait()
        for i in range(ATTEMPTS_PER_WORKER):
            cost = 1 + (n + i) % 4
            if limiter.check("weighted", "exact", cost).allowed:
                with lock:
                    admitted.append(cost)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    remaining = limiter.peek("weighted", "exact").remaining
    assert sum(admitted) + remaining == LIMIT
    assert remaining < 4  # a denied check of the smallest cost that did not fit


def test_64_tasks_share_a_concurrency_pool(limiter: Limiter) -> None:
    held = 0
    peak = 0
    granted = 0

    async def task() -> None:
        nonlocal held, peak, granted
        decision, lease = await limiter.aacquire("pool-key", "pool")
        if lease is None:
            assert not decision
            return
        granted += 1
        held += 1
        peak = max(peak, held)
        await asyncio.sleep(0)
        held -= 1
        assert await limiter.arelease(lease)

    async def main() -> None:
        await asyncio.gather(*(task() for _ in range(WORKERS)))

    asyncio.run(main())
    assert 7 <= granted <= WORKERS and peak <= 7
    assert limiter.peek("pool-key", "pool").remaining == 7
