"""Per-key window offsets and exact bucket rates through Python:
``window_offset`` in a config on both engines, the offsets pinned by
tests/vectors/precision.json, a 300,000/s bucket refilling exactly, and the config errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from redis_support import RedisServer, config

import shardlimit
from shardlimit import Limiter, ManualClock

T0 = 1_800_000_000_000_000
DAY = 86_400_000_000
POLICIES: dict[str, Any] = {
    "daily": {"algorithm": "fixed_window", "limit": 1, "window": "1d", "window_offset": "per_key"},
    "fast": {"algorithm": "token_bucket", "capacity": 3_000_000, "refill_per_sec": 300_000},
}
# offsets of these keys in a day, from precision.json
OFFSETS = {"a": 52_766_353_057, "tenant:1": 40_405_616_687}


def us(seconds: float) -> int:
    return round(seconds * 1_000_000)


def engines(redis: RedisServer) -> list[tuple[Limiter, ManualClock]]:
    out: list[tuple[Limiter, ManualClock]] = []
    for text in (json.dumps({"policies": POLICIES}), config([redis], POLICIES)):
        clock = ManualClock(T0)
        out.append((Limiter.from_json(text, clock=clock), clock))
    return out


def test_offsets_are_the_pinned_ones() -> None:
    vectors = Path(__file__).resolve().parents[3] / "tests" / "vectors"
    doc = json.loads((vectors / "precision.json").read_text())
    pinned = {(o["key"], o["window_us"]): o["offset_us"] for o in doc["offsets"]}
    for key, offset in OFFSETS.items():
        assert pinned[(key, DAY)] == offset


def test_per_key_windows_reset_at_the_keys_offset(redis: RedisServer) -> None:
    for limiter, _ in engines(redis):
        for key, offset in OFFSETS.items():
            until = (offset - T0 % DAY) % DAY
            d = limiter.check(key, "daily")
            assert d.allowed
            assert us(d.reset_after) == until
            denied = limiter.check(key, "daily")
            assert not denied.allowed
            assert denied.retry_after is not None and us(denied.retry_after) == until


def test_three_hundred_thousand_per_second_is_exact(redis: RedisServer) -> None:
    for limiter, clock in engines(redis):
        assert limiter.check("k", "fast", 3_000_000).allowed
        denied = limiter.check("k", "fast")
        assert denied.retry_after is not None and us(denied.retry_after) == 4  # 10/3 µs, up
        clock.set_us(T0 + 1_000_000)
        # a second later exactly 300,000 tokens (rounded to 3 µs a token it was 333,333)
        assert limiter.peek("k", "fast").remaining == 300_000


def test_bad_fields_are_config_errors_naming_them() -> None:
    bad = {"algorithm": "token_bucket", "capacity": 5, "refill_per_sec": 1, "window_offset": "per_key"}
    with pytest.raises(shardlimit.ConfigError, match=r"policies\.p\.window_offset"):
        Limiter.from_json(json.dumps({"policies": {"p": bad}}))
    inexact = {"algorithm": "token_bucket", "capacity": 1_000_000, "refill_per_sec": 123.456789}
    with pytest.raises(shardlimit.ConfigError, match=r"123456789/1000000.*2\^50"):
        Limiter.from_json(json.dumps({"policies": {"p": inexact}}))
