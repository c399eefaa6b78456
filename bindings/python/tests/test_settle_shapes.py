"""Charge, refund and reserve-and-settle on every policy shape from Python (the core's,
no API change): an exact 300000/s bucket given as an ad-hoc rate string is charged to the
token, and a multi-limit rate string is charged, refunded and settled in every limit. On
Redis and in memory, with an injected clock."""

from __future__ import annotations

import json

from redis_support import RedisServer, config

from shardlimit import Limit, Limiter, ManualClock

T0 = 1_800_000_000_000_000


def limiters(redis: RedisServer) -> list[tuple[str, Limiter, ManualClock]]:
    out = []
    for name, text in (("redis", config([redis], {})), ("memory", json.dumps({"policies": {}}))):
        clock = ManualClock(T0)
        out.append((name, Limiter.from_json(text, clock=clock), clock))
    return out


def test_an_exact_rate_bucket_is_charged_to_the_token(redis: RedisServer) -> None:
    # 300,000/s is 10/3 µs a token: kept exact (rounded to 3 µs it would refill 333,333/s)
    bucket = Limit.parse("300000/second", "token_bucket")
    for engine, limiter, clock in limiters(redis):
        # 250,000 first: the bucket is 2,500,000 ticks of 1/3 µs ahead (833 ms, so that
        # Redis keeps the state: its expiry runs on the wall clock)
        assert limiter.charge("llm", bucket, 250_000).remaining == 50_000, engine
        for i in range(1, 301):
            clock.set_us(T0 + i)
            d = limiter.charge("llm", bucket, 1)
            # each µs refills 3 ticks, each token costs 10: 7 ticks more a step
            assert d.allowed and d.remaining == (3_000_000 - 2_500_000 - 7 * i) // 10, (engine, i, d)
        d = limiter.charge("llm", bucket, 40_000)
        assert d.remaining == (500_000 - 2_100 - 400_000) // 10, (engine, d)
        d, r = limiter.reserve("llm", bucket, 9_000)
        assert d.allowed and r is not None and d.remaining == 790, (engine, d)
        assert limiter.settle(r, 1_000).remaining == 8_790, engine
        # 100 tokens into debt, then refunded: one free token, exactly
        assert limiter.charge("llm", bucket, 8_790 + 100).remaining == 0, engine
        denied = limiter.check("llm", bucket)
        assert not denied.allowed, engine
        assert limiter.refund("llm", bucket, 101).remaining == 1, engine
        # 10 µs later exactly 3 more
        clock.set_us(T0 + 310)
        assert limiter.peek("llm", bucket).remaining == 4, engine


def test_a_multi_limit_rate_string_is_charged_in_every_limit(redis: RedisServer) -> None:
    plan = "5/hour; 100/day"
    for engine, limiter, clock in limiters(redis):
        d = limiter.charge("tenant", plan, 7)
        # the hour is in debt: the decision names it
        assert d.allowed and d.remaining == 0 and d.limit_index == 0, (engine, d)
        assert [q[0] for q in d.quotas] == [5, 100], engine
        assert not limiter.check("tenant", plan).allowed, engine
        d = limiter.refund("tenant", plan, 3)
        assert (d.remaining, d.limit_index) == (1, 0), (engine, d)
        # the next hour: a reservation is the all-or-nothing check, settled in both limits
        clock.set_us(T0 + 3_600_000_000)
        d, r = limiter.reserve("tenant", plan, 5)
        assert d.allowed and r is not None, (engine, d)
        assert limiter.settle(r, 2).remaining == 3, engine
        # the day: 4 + 2 used; a charge of 94 puts it at 100, the hour past its 5
        d = limiter.charge("tenant", plan, 94)
        assert d.remaining == 0, (engine, d)
        clock.set_us(T0 + 2 * 3_600_000_000)
        denied = limiter.check("tenant", plan)
        assert not denied.allowed and denied.limit_index == 1, (engine, denied)
