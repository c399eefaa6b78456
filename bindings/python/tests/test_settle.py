"""Charge, refund and reserve-and-settle from Python, sync and asyncio, on Redis and in
memory: a charge puts the key into debt, a refund never goes above the limit, a settle
gives the unused part back to the window that admitted it."""

from __future__ import annotations

import asyncio
import json

import pytest
from redis_support import RedisServer, config

import shardlimit
from shardlimit import Limiter, ManualClock, Reservation

POLICIES = {
    "tokens": {"algorithm": "fixed_window", "limit": 10, "window": "1s"},
    "conc": {"algorithm": "concurrency", "max": 2, "lease_ttl": "1s"},
}
T0 = 1_800_000_000_000_000


def limiters(redis: RedisServer) -> list[tuple[Limiter, ManualClock]]:
    out = []
    for text in (config([redis], POLICIES), json.dumps({"policies": POLICIES})):
        clock = ManualClock(T0)
        out.append((Limiter.from_json(text, clock=clock), clock))
    return out


def test_charge_refund_reserve_settle(redis: RedisServer) -> None:
    for limiter, clock in limiters(redis):
        d = limiter.charge("llm", "tokens", 14)
        assert d.allowed and d.remaining == 0
        denied = limiter.check("llm", "tokens")
        assert not denied.allowed and denied.retry_after == pytest.approx(1.0)
        assert limiter.refund("llm", "tokens", 99).remaining == 10
        d, r = limiter.reserve("llm", "tokens", 8)
        assert d.allowed and isinstance(r, Reservation)
        assert (r.key, r.policy, r.units, r.at_us, r.settled) == ("llm", "tokens", 8, T0, False)
        assert limiter.settle(r, 3).remaining == 7
        assert r.settled
        with pytest.raises(shardlimit.InvalidArgumentError, match="settled already"):
            limiter.settle(r, 3)
        d, none = limiter.reserve("llm", "tokens", 11)
        assert not d.allowed and none is None
        # a settle in a later window gives nothing to that window
        _, r = limiter.reserve("llm", "tokens", 3)
        assert r is not None
        clock.set_us(T0 + 1_000_000)
        assert limiter.check("llm", "tokens", 10).allowed
        assert limiter.settle(r, 0).remaining == 0
        with pytest.raises(shardlimit.InvalidArgumentError, match="acquire and release"):
            limiter.charge("llm", "conc")
        with pytest.raises(shardlimit.InvalidArgumentError, match="cost"):
            limiter.charge("llm", "tokens", 0)


def test_async_twins(redis: RedisServer) -> None:
    async def main(limiter: Limiter) -> None:
        d = await limiter.acharge("a", "tokens", 4)
        assert d.remaining == 6
        assert (await limiter.arefund("a", "tokens", 1)).remaining == 7
        d, r = await limiter.areserve("a", "tokens", 5)
        assert d.allowed and r is not None
        assert (await limiter.asettle(r, 9)).remaining == 0
        with pytest.raises(shardlimit.InvalidArgumentError):
            await limiter.asettle(r, 1)

    for limiter, _ in limiters(redis):
        asyncio.run(main(limiter))
