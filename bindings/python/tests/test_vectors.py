"""The decision vectors of tests/vectors (format: the top of algorithms.json) replayed as
core/tests/vectors.rs does: every case on a fresh limiter with a ManualClock set to each
step's t_us, every op of every file (check, peek, acquire, release, reset, check_all, batch;
charge, refund, reserve, settle; shadow checks and shadow_report; set_override,
delete_override), on the in-memory engine and on a real Redis, through the sync API and
through asyncio. Decisions must equal the vectors to the µs. Every file of tests/vectors is
either replayed here, replayed by the test named in OTHER_FILES, or skipped with a reason."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Callable, Optional

from redis_support import RedisServer, config

import shardlimit
from shardlimit import Decision, Lease, Limiter, ManualClock, Reservation

VECTORS = Path(__file__).resolve().parents[3] / "tests" / "vectors"
#: every file of decision vectors, replayed in full
FILES = [
    "algorithms.json",
    "plans.json",
    "precision.json",
    "settle.json",
    "shadow.json",
    "overrides.json",
]
#: the other files of tests/vectors, and the test that replays each
OTHER_FILES = {
    "keys.json": "test_surface.py::test_the_key_rule_of_the_vectors",
    "routing.json": "test_api.py::test_route (every case among two shards)",
}
#: files no Python test replays, with the reason (none today)
SKIPPED_FILES: dict[str, str] = {}
DOCS: dict[str, dict[str, Any]] = {f: json.loads((VECTORS / f).read_text()) for f in FILES}
OPS = {"check", "peek", "acquire", "release", "reset", "check_all", "batch"}
#: settle.json's own ops (charge, refund, reserve-and-settle)
SETTLE_OPS = {"charge", "refund", "reserve", "settle"}
#: shadow.json's and overrides.json's own ops
ADMIN_OPS = {"shadow_report", "set_override", "delete_override"}

Make = Callable[[dict[str, Any], ManualClock], Limiter]


def us(seconds: Optional[float]) -> Optional[int]:
    return None if seconds is None else round(seconds * 1_000_000)


def observed(d: Decision) -> dict[str, Any]:
    return {
        "allowed": d.allowed,
        "limit": d.limit,
        "remaining": d.remaining,
        "reset_after_us": us(d.reset_after),
        "retry_after_us": us(d.retry_after),
        "delay_us": us(d.delay),
        "policy": d.policy,
        "layer": d.layer,
        # multi-limit policies (plans.json): which limit decided, and every window
        **(
            {}
            if d.limit_index is None
            else {"limit_index": d.limit_index, "rate_limit_policy": d.headers()["RateLimit-Policy"]}
        ),
        # shadow.json: written only when true
        **({"shadow_denied": True} if d.shadow_denied else {}),
    }


def extra(case: dict[str, Any]) -> dict[str, Any]:
    """A case's config beside its policies (plans.json)."""
    return {k: case[k] for k in ("plans", "default_algorithm") if k in case}


class Replay:
    """One case's limiter, clock and leases; `where` names the step in every failure."""

    def __init__(self, make: Make, case: dict[str, Any], source: str) -> None:
        self.clock = ManualClock(0)
        self.limiter = make(case, self.clock)
        self.leases: dict[str, Lease] = {}
        self.reservations: dict[str, Reservation] = {}
        self.source = source

    def reserved(self, step: dict[str, Any], d: Decision, r: Optional[Reservation], where: str) -> None:
        self.decided(step, d, None, where)
        if "reserve_as" in step:
            assert r is not None, f"{where}: no reservation"
            self.reservations[step["reserve_as"]] = r

    def settle_step(self, step: dict[str, Any], where: str) -> bool:
        """settle.json's ops, sync; False for another op."""
        op = step["op"]
        if op == "charge":
            self.decided(step, self.limiter.charge(step["key"], self.policy_of(step), step["cost"]), None, where)
        elif op == "refund":
            self.decided(step, self.limiter.refund(step["key"], self.policy_of(step), step["cost"]), None, where)
        elif op == "reserve":
            self.reserved(step, *self.limiter.reserve(step["key"], self.policy_of(step), step["cost"]), where)
        elif op == "settle":
            r = self.reservations[step["reservation"]]
            self.decided(step, self.limiter.settle(r, step["actual"]), None, where)
        elif op == "shadow_report":
            report = self.limiter.shadow_report(step["policy"], step.get("top"))
            assert report == step["expect_report"], f"{where}: {report}"
        elif op == "set_override":
            self.limiter.set_override(step["key"], step["policy"], step["limit"], ttl(step))
        elif op == "delete_override":
            deleted = self.limiter.delete_override(step["key"], step["policy"])
            assert deleted == step["expect_deleted"], where
        else:
            return False
        return True

    async def asettle_step(self, step: dict[str, Any], where: str) -> bool:
        """settle.json's ops, on asyncio; False for another op."""
        op = step["op"]
        if op == "charge":
            d = await self.limiter.acharge(step["key"], self.policy_of(step), step["cost"])
            self.decided(step, d, None, where)
        elif op == "refund":
            d = await self.limiter.arefund(step["key"], self.policy_of(step), step["cost"])
            self.decided(step, d, None, where)
        elif op == "reserve":
            self.reserved(step, *await self.limiter.areserve(step["key"], self.policy_of(step), step["cost"]), where)
        elif op == "settle":
            r = self.reservations[step["reservation"]]
            self.decided(step, await self.limiter.asettle(r, step["actual"]), None, where)
        elif op == "shadow_report":
            report = await self.limiter.ashadow_report(step["policy"], step.get("top"))
            assert report == step["expect_report"], f"{where}: {report}"
        elif op == "set_override":
            await self.limiter.aset_override(step["key"], step["policy"], step["limit"], ttl(step))
        elif op == "delete_override":
            deleted = await self.limiter.adelete_override(step["key"], step["policy"])
            assert deleted == step["expect_deleted"], where
        else:
            return False
        return True

    def decided(self, item: dict[str, Any], d: Decision, lease: Optional[Lease], where: str) -> None:
        assert d.source == self.source, f"{where}: decided by {d.source}"
        assert observed(d) == item["expect"], f"{where}: {item}"
        if "lease_as" in item:
            assert lease is not None, f"{where}: no lease"
            self.leases[item["lease_as"]] = lease

    def policy_of(self, item: dict[str, Any]) -> Any:
        """The step's policy: its name, or the policy as the step's plan has it."""
        if "plan" in item:
            return self.limiter.plan_policy(item["plan"], item["policy"])
        return item["policy"]

    def call(self, item: dict[str, Any]) -> tuple[Decision, Optional[Lease]]:
        op, key, policy = item["op"], item["key"], self.policy_of(item)
        if op == "check" and item.get("shadow", False):
            return self.limiter.check_shadow(key, policy, item["cost"]), None
        if op == "check":
            return self.limiter.check(key, policy, item["cost"]), None
        if op == "peek":
            return self.limiter.peek(key, policy), None
        assert op == "acquire", f"op {op!r} cannot be a check or a batch item"
        return self.limiter.acquire(key, policy, item["units"])

    async def acall(self, item: dict[str, Any]) -> tuple[Decision, Optional[Lease]]:
        op, key, policy = item["op"], item["key"], self.policy_of(item)
        if op == "check" and item.get("shadow", False):
            return await self.limiter.acheck_shadow(key, policy, item["cost"]), None
        if op == "check":
            return await self.limiter.acheck(key, policy, item["cost"]), None
        if op == "peek":
            return await self.limiter.apeek(key, policy), None
        assert op == "acquire", f"op {op!r} cannot be a check or a batch item"
        return await self.limiter.aacquire(key, policy, item["units"])

    def step(self, step: dict[str, Any], where: str) -> None:
        op = step["op"]
        assert op in OPS | SETTLE_OPS | ADMIN_OPS, f"{where}: unknown op {op!r}"
        if self.settle_step(step, where):
            return
        if op in ("check", "peek", "acquire"):
            self.decided(step, *self.call(step), where)
        elif op == "batch":
            for j, item in enumerate(step["items"]):
                self.decided(item, *self.call(item), f"{where}, item {j}")
        elif op == "release":
            released = self.limiter.release(self.leases[step["lease"]])
            assert released == step["expect_released"], where
        elif op == "reset":
            self.limiter.reset(step["key"], step["policy"])
        else:
            layers = [(la["key"], la["policy"], la["cost"]) for la in step["layers"]]
            self.decided(step, self.limiter.check_all(layers), None, where)

    async def astep(self, step: dict[str, Any], where: str) -> None:
        op = step["op"]
        assert op in OPS | SETTLE_OPS | ADMIN_OPS, f"{where}: unknown op {op!r}"
        if await self.asettle_step(step, where):
            return
        if op in ("check", "peek", "acquire"):
            self.decided(step, *await self.acall(step), where)
        elif op == "batch":
            # one after another: calls made together (asyncio.gather) have no order, and
            # the items' decisions depend on it (core/tests/vectors.rs sends them together)
            for j, item in enumerate(step["items"]):
                self.decided(item, *await self.acall(item), f"{where}, item {j}")
        elif op == "release":
            released = await self.limiter.arelease(self.leases[step["lease"]])
            assert released == step["expect_released"], where
        elif op == "reset":
            await self.limiter.areset(step["key"], step["policy"])
        else:
            layers = [(la["key"], la["policy"], la["cost"]) for la in step["layers"]]
            self.decided(step, await self.limiter.acheck_all(layers), None, where)


def ttl(step: dict[str, Any]) -> Optional[float]:
    """set_override's ttl_ms, in the seconds Python takes."""
    return None if "ttl_ms" not in step else step["ttl_ms"] / 1000


def cases() -> list[tuple[str, dict[str, Any]]]:
    return [(f, c) for f in FILES for c in DOCS[f]["cases"]]


def replay_sync(make: Make, source: str) -> int:
    steps = 0
    for f, case in cases():
        r = Replay(make, case, source)
        for i, step in enumerate(case["steps"]):
            r.clock.set_us(step["t_us"])
            r.step(step, f"{f}: {case['name']}, step {i}")
            steps += 1
    return steps


async def replay_async(make: Make, source: str) -> int:
    steps = 0
    for f, case in cases():
        r = Replay(make, case, source)
        for i, step in enumerate(case["steps"]):
            r.clock.set_us(step["t_us"])
            await r.astep(step, f"{f}: {case['name']}, step {i}")
            steps += 1
    return steps


def memory(case: dict[str, Any], clock: ManualClock) -> Limiter:
    return Limiter.from_json(json.dumps({"policies": case["policies"], **extra(case)}), clock=clock)


def on_redis(server: RedisServer) -> Make:
    counter = iter(range(1_000_000))

    def make(case: dict[str, Any], clock: ManualClock) -> Limiter:
        # a fresh key space per case, like the core's FLUSHALL
        prefix = f"vec{next(counter)}:"
        text = config([server], case["policies"], key_prefix=prefix, **extra(case))
        limiter = Limiter.from_json(text, clock=clock)
        assert limiter.is_redis
        return limiter

    return make


def total_steps() -> int:
    return sum(len(c["steps"]) for _, c in cases())


def test_vectors_are_there() -> None:
    ops = {s["op"] for _, c in cases() for s in c["steps"]}
    assert ops == OPS | SETTLE_OPS | ADMIN_OPS
    algorithms = {
        p["algorithm"] for f, c in cases() if f == "algorithms.json" for p in c["policies"].values()
    }
    assert algorithms == {
        "fixed_window", "sliding_window", "sliding_log",
        "token_bucket", "leaky_bucket", "concurrency",
    }
    assert total_steps() > 100


def test_every_vector_file_is_replayed_or_skipped() -> None:
    """A new file in tests/vectors fails here until a test replays it or it is skipped
    with a reason; every decision file documents its steps (a `format` or a description)."""
    present = {p.name for p in VECTORS.glob("*.json")}
    known = set(FILES) | set(OTHER_FILES) | set(SKIPPED_FILES)
    assert present - known == set(), f"not replayed by Python, nor skipped: {present - known}"
    assert known - present == set(), f"listed but not in tests/vectors: {known - present}"
    assert all(SKIPPED_FILES.values())
    for f in FILES:
        assert "format" in DOCS[f] or "description" in DOCS[f], f
        assert DOCS[f]["cases"], f


def test_memory_engine_matches_vectors() -> None:
    assert replay_sync(memory, "memory") == total_steps()


def test_memory_engine_async_matches_vectors() -> None:
    assert asyncio.run(replay_async(memory, "memory")) == total_steps()


def test_redis_engine_matches_vectors(redis: RedisServer) -> None:
    assert replay_sync(on_redis(redis), "redis") == total_steps()


def test_redis_engine_async_matches_vectors(redis: RedisServer) -> None:
    assert asyncio.run(replay_async(on_redis(redis), "redis")) == total_steps()


def test_sources_are_reported(redis: RedisServer) -> None:
    _, case = cases()[0]
    clock = ManualClock(case["steps"][0]["t_us"])
    assert memory(case, clock).check("k", "p").source == "memory"
    d = on_redis(redis)(case, clock).check("k", "p")
    assert (d.source, d.shard) == ("redis", 0)
    assert shardlimit.Decision is type(d)


def test_window_offsets_match_vectors(redis: RedisServer) -> None:
    """precision.json's `offsets` (the per-key window offset function) through decisions:
    at a multiple of the window, a per_key fixed window of `window_us` resets for `key` in
    exactly offset_us (a whole window when the offset is 0), on both engines."""
    offsets = json.loads((VECTORS / "precision.json").read_text())["offsets"]
    assert len(offsets) >= 64
    windows = sorted({o["window_us"] for o in offsets})
    policies = {
        f"w{w}": {"algorithm": "fixed_window", "limit": 1, "window": f"{w}us", "window_offset": "per_key"}
        for w in windows
    }
    for text in (json.dumps({"policies": policies}), config([redis], policies, key_prefix="offsets:")):
        clock = ManualClock(0)
        limiter = Limiter.from_json(text, clock=clock)
        for o in offsets:
            w = o["window_us"]
            clock.set_us(w * -(-1_700_000_000_000_000 // w))  # the first multiple of w after 1.7e15
            d = limiter.check(o["key"], f"w{w}")
            assert d.allowed, o
            assert us(d.reset_after) == (o["offset_us"] or w), o
