"""One coroutine of an async call awaited in two event loops (one after the other, or at
once from two threads): the second gets a RuntimeError saying it was awaited already,
never a SystemError, on the in-memory engine and on Redis (the default transport and the
host one)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from redis_support import RedisServer, config

from shardlimit import Limiter

POLICIES = {"api": {"rate": "5/minute"}}


@pytest.fixture(params=["memory", "redis", "redis-host"])
def limiter(request: pytest.FixtureRequest, redis: RedisServer) -> Limiter:
    if request.param == "memory":
        return Limiter.from_json('{"policies": {"api": {"rate": "5/minute"}}}')
    if request.param == "redis-host":  # the bytes on the awaiting loop itself
        return Limiter.from_json(config([redis], POLICIES), transport="host")
    return Limiter.from_json(config([redis], POLICIES))


def test_one_coroutine_in_two_loops_one_after_the_other(limiter: Limiter) -> None:
    call = limiter.acheck("k", "api")

    async def started_then_left() -> None:
        asyncio.ensure_future(call)
        await asyncio.sleep(0)

    asyncio.run(started_then_left())

    async def again() -> Any:
        return await call

    with pytest.raises(RuntimeError, match="awaited already"):
        asyncio.run(again())


def test_one_coroutine_in_two_loops_at_once(limiter: Limiter) -> None:
    call = limiter.acheck("k", "api")
    results: list[Any] = []

    def run() -> None:
        async def wait() -> Any:
            return await call

        try:
            results.append(asyncio.run(wait()))
        except BaseException as e:  # what each loop got
            results.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(results) == 2 and len(errors) == 1, results
    assert type(errors[0]) is RuntimeError and "awaited already" in str(errors[0])
