"""tests/vectors/algorithms.json replayed exactly as core/tests/vectors.rs does: every step
on a fresh limiter per case, its clock set to t_us, on the in-memory engine and on a real
Redis (sync and asyncio). The Python decisions must equal the vectors to the microsecond."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from redis_support import RedisServer, config

import shardlimit
from shardlimit import Decision, Lease, Limiter, ManualClock

VECTORS = Path(__file__).resolve().parents[3] / "tests" / "vectors" / "algorithms.json"
CASES: list[dict[str, Any]] = json.loads(VECTORS.read_text())["cases"]


def us(seconds: Optional[float]) -> Optional[int]:
    return None if seconds is None else round(seconds * 1_000_000)


def observed(d: Decision) -> dict[str, Any]:
    return {
        "allowed": d.allowed,
        "remaining": d.remaining,
        "reset_after_us": us(d.reset_after),
        "retry_after_us": us(d.retry_after),
        "delay_us": us(d.delay),
    }


def replay_sync(make: Callable[[str, ManualClock], Limiter]) -> int:
    steps = 0
    for n, case in enumerate(CASES):
        clock = ManualClock(0)
        limiter = make(json.dumps({"p": case["policy"]}), clock)
        leases: dict[str, Lease] = {}
        for i, step in enumerate(case["steps"]):
            clock.set_us(step["t_us"])
            where = f"{case['name']}, step {i}: {step}"
            if step["op"] == "release":
                released = limiter.release(leases[step["lease"]])
                assert released == step["expect_released"], where
            else:
                assert step["op"] == "check", where
                d, lease = limiter.acquire(step["key"], "p", step["cost"])
                if lease is not None and "lease_as" in step:
                    leases[step["lease_as"]] = lease
                assert observed(d) == step["expect"], where
            steps += 1
    return steps


async def replay_async(make: Callable[[str, ManualClock], Limiter]) -> int:
    steps = 0
    for case in CASES:
        clock = ManualClock(0)
        limiter = make(json.dumps({"p": case["policy"]}), clock)
        leases: dict[str, Lease] = {}
        for i, step in enumerate(case["steps"]):
            clock.set_us(step["t_us"])
            where = f"{case['name']}, step {i}: {step}"
            if step["op"] == "release":
                released = await limiter.arelease(leases[step["lease"]])
                assert released == step["expect_released"], where
            else:
                d, lease = await limiter.aacquire(step["key"], "p", step["cost"])
                if lease is not None and "lease_as" in step:
                    leases[step["lease_as"]] = lease
                assert observed(d) == step["expect"], where
            steps += 1
    return steps


def memory(policies: str, clock: ManualClock) -> Limiter:
    return Limiter.from_json(f'{{"policies": {policies}}}', clock=clock)


def on_redis(server: RedisServer) -> Callable[[str, ManualClock], Limiter]:
    counter = iter(range(1_000_000))

    def make(policies: str, clock: ManualClock) -> Limiter:
        # a fresh key space per case, like the core's FLUSHALL
        text = config([server], json.loads(policies), key_prefix=f"vec{next(counter)}:")
        limiter = Limiter.from_json(text, clock=clock)
        assert limiter.is_redis
        return limiter

    return make


def test_vectors_are_there() -> None:
    assert len(CASES) >= 6
    algorithms = {c["policy"]["algorithm"] for c in CASES}
    assert algorithms >= {
        "fixed_window", "sliding_window", "sliding_log",
        "token_bucket", "leaky_bucket", "concurrency",
    }


def test_memory_engine_matches_vectors() -> None:
    assert replay_sync(memory) > 30


def test_memory_engine_async_matches_vectors() -> None:
    assert asyncio.run(replay_async(memory)) > 30


def test_redis_engine_matches_vectors(redis: RedisServer) -> None:
    assert replay_sync(on_redis(redis)) > 30


def test_redis_engine_async_matches_vectors(redis: RedisServer) -> None:
    assert asyncio.run(replay_async(on_redis(redis))) > 30


@pytest.mark.parametrize("case", CASES[:1], ids=lambda c: str(c["name"]))
def test_sources_are_reported(case: dict[str, Any], redis: RedisServer) -> None:
    clock = ManualClock(case["steps"][0]["t_us"])
    policies = json.dumps({"p": case["policy"]})
    assert memory(policies, clock).check("k", "p").source == "memory"
    d = on_redis(redis)(policies, clock).check("k", "p")
    assert (d.source, d.shard) == ("redis", 0)
    assert shardlimit.Decision is type(d)
