"""The whole core in Python: every operation of spec/operations.json, the key rule of
tests/vectors/keys.json, rate strings, metrics, events, reload, scale, coroutines."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from redis_support import RedisServer, config

import shardlimit
from shardlimit import Limit, Limiter, ManualClock, parse_rate

ROOT = Path(__file__).resolve().parents[3]

#: Operations Python offers under another name than the core's (the test still fails when
#: the mapped name is missing).
PYTHON_NAMES = {
    "new": ["from_json"],
    # the clock is a keyword of every constructor: Limiter.memory(clock=ManualClock())
    "with_clock": [],
    # the config in force: its policy names and each policy
    "config": ["policies", "policy"],
}


def test_every_operation_of_the_spec_is_offered() -> None:
    spec = json.loads((ROOT / "spec" / "operations.json").read_text())
    missing = []
    for op in spec["operations"]:
        if "python" in op["not_in"]:
            continue
        names = PYTHON_NAMES.get(op["name"], [op["name"]])
        for name in names:
            if not hasattr(Limiter, name):
                missing.append(f"{op['name']} (as {name})")
        # an operation with a blocking twin in Rust waits on Redis: Python has both forms
        is_async = any(r.endswith("_blocking") for r in op["rust"])
        if is_async and not hasattr(Limiter, "a" + op["name"]):
            missing.append(f"{op['name']} (async twin a{op['name']})")
    assert not missing, f"Python lacks: {missing}"
    clock = ManualClock(5_000_000)
    assert Limiter.memory(clock=clock).check("k", "1/second").allowed


def test_the_key_rule_of_the_vectors() -> None:
    cases = json.loads((ROOT / "tests" / "vectors" / "keys.json").read_text())["cases"]
    limiter = Limiter.memory()
    assert len(cases) >= 10
    for case in cases:
        raw = bytes.fromhex(case["hex"])
        try:
            key = raw.decode("utf-8")
        except UnicodeDecodeError:
            # not representable as a str: the closest a caller gets is a str with lone
            # surrogates, which is refused before it reaches the core
            key = raw.decode("utf-8", "surrogateescape")
            assert not case["accepted"], case["name"]
            with pytest.raises((UnicodeEncodeError, shardlimit.InvalidArgumentError)):
                limiter.check(key, "5/minute")
            continue
        if case["accepted"]:
            assert limiter.check(key, "5/minute").allowed, case["name"]
        else:
            with pytest.raises(shardlimit.InvalidArgumentError, match="key"):
                limiter.check(key, "5/minute")
        # keys are str only: bytes are a TypeError, never silently decoded
        with pytest.raises(TypeError):
            limiter.check(raw, "5/minute")  # type: ignore[arg-type]


def test_rate_strings() -> None:
    assert [lim.id for lim in parse_rate("100/hour; 1000/day")] == [
        "fixed_window-100-3600000ms", "fixed_window-1000-86400000ms"]
    assert parse_rate("10 per second")[0].id == "fixed_window-10-1000ms"
    assert parse_rate("3/5 minutes")[0].id == "fixed_window-3-300000ms"
    assert parse_rate("20/2 seconds", "token_bucket")[0].id == "token_bucket-20-10ps"
    assert Limit.parse("5/minute").id == "fixed_window-5-60000ms"
    for bad, part in (("5/fortnight", "fortnight"), ("five/minute", "five"), ("", "empty"),
                      ("5/minute;", "empty item")):
        with pytest.raises(shardlimit.InvalidArgumentError, match=part):
            parse_rate(bad)
    with pytest.raises(shardlimit.InvalidArgumentError, match="algorithm"):
        parse_rate("5/minute", "magic")
    with pytest.raises(shardlimit.InvalidArgumentError, match="one limit"):
        Limit.parse("1/second; 5/minute")


def test_a_rate_string_of_several_limits_is_one_multi_limit_check() -> None:
    clock = ManualClock(0)
    limiter = Limiter.memory(clock=clock)
    rate = "2/second; 3/minute"
    assert [limiter.check("k", rate).allowed for _ in range(3)] == [True, True, False]
    clock.advance_us(1_000_000)
    assert limiter.check("k", rate).allowed
    # the minute is spent (3): the per-second limit consumed nothing on the denial
    d = limiter.check("k", rate)
    assert not d.allowed and d.limit_index == 1 and d.quotas == [(2, 1.0), (3, 60.0)]
    assert asyncio.run(limiter.acheck("other", rate)).allowed
    assert limiter.peek("k", rate).limit_index == 1
    limiter.reset("k", rate)
    assert limiter.check("k", rate).allowed
    # the same string is the same policy: one counter in the metrics
    names = [p["policy"] for p in limiter.metrics_snapshot()["policies"]]
    assert names.count("fixed_window-2-1000ms--fixed_window-3-60000ms") == 1


def test_metrics_events_and_prometheus() -> None:
    limiter = Limiter.from_json('{"policies": {"api": {"algorithm": "fixed_window", '
                                '"limit": 1, "window": "1h"}}}')
    events: list[dict[str, str]] = []
    seen = threading.Event()

    def on_event(e: dict[str, str]) -> None:
        # (the first check also crosses the default near_limit of 0.8: a near_limit event)
        if e["kind"] == "denied":
            events.append(e)
            seen.set()

    limiter.subscribe(on_event)
    assert limiter.check("k", "api").allowed
    assert not limiter.check("k", "api").allowed
    assert seen.wait(5)
    assert events[0]["kind"] == "denied" and events[0]["policy"] == "api"
    assert events[0]["key"] == "k"
    (api,) = [p for p in limiter.metrics_snapshot()["policies"] if p["policy"] == "api"]
    assert (api["allowed"], api["denied"]) == (1, 1)
    text = limiter.metrics()
    assert 'shardlimit_denied_total{policy="api"} 1' in text
    assert limiter.memory_keys == 1


def test_the_names_of_spec_names_json(tmp_path: Path) -> None:
    """spec/names.json: Python's names for loading a file, the metrics (``metrics()`` the
    Prometheus text, as in every language) and the field of an event's kind."""
    names = json.loads((ROOT / "spec" / "names.json").read_text())
    for thing in ("load_from_file", "metrics_text", "metrics_snapshot"):
        for dotted in [names[thing]["python"], *names[thing].get("aliases", {}).get("python", [])]:
            cls, name = dotted.split(".")
            assert cls == "Limiter" and hasattr(Limiter, name), f"{thing}: no {dotted}"
    path = tmp_path / "c.json"
    path.write_text('{"policies": {"api": "1/minute"}}')
    limiter = getattr(Limiter, names["load_from_file"]["python"].split(".")[1])(path)
    assert Limiter.from_config(path).policies == limiter.policies == ["api"]
    text = getattr(limiter, names["metrics_text"]["python"].split(".")[1])()
    assert isinstance(text, str) and text.startswith("# ") and text == limiter.prometheus()
    snapshot = getattr(limiter, names["metrics_snapshot"]["python"].split(".")[1])()
    assert isinstance(snapshot, dict) and "policies" in snapshot
    seen: list[dict[str, str]] = []
    got = threading.Event()

    def on_event(e: dict[str, str]) -> None:
        seen.append(e)
        got.set()

    limiter.subscribe(on_event)
    limiter.check("k", "api")
    limiter.check("k", "api")
    assert got.wait(5)
    assert names["event_kind_field"]["python"] == 'event["kind"]'
    assert all("event" not in e and e["kind"] in names["event_kinds"] for e in seen), seen


def test_reload_watch_and_scale(tmp_path: Path) -> None:
    limiter = Limiter.from_json('{"policies": {"api": {"algorithm": "fixed_window", '
                                '"limit": 10, "window": "1h"}}}')
    report = limiter.reload({"policies": {"api": {"algorithm": "fixed_window", "limit": 20,
                                                  "window": "1h"},
                                          "new": {"algorithm": "fixed_window", "limit": 1,
                                                  "window": "1h"}}})
    assert report["policies_added"] == ["new"] and report["policies_changed"] == ["api"]
    assert limiter.policy("api").max == 20
    with pytest.raises(shardlimit.ConfigError):
        limiter.reload("{not json")
    assert limiter.policy("api").max == 20, "a bad config keeps the old one"
    path = tmp_path / "c.json"
    path.write_text('{"policies": {"api": {"algorithm": "fixed_window", "limit": 30, '
                    '"window": "1h"}}}')
    assert limiter.reload_from_file(path)["policies_removed"] == ["new"]
    with limiter.watch_config(path, every=0.01) as watcher:
        assert watcher.active
    assert not watcher.active
    limiter.set_scale(0.5)
    assert limiter.scale() == 0.5
    assert limiter.check("k", "api").limit == 15
    with pytest.raises(shardlimit.InvalidArgumentError):
        limiter.observe_health(1.0)  # no hook yet
    limiter.set_latency_scale(0.1, min_factor=0.2)
    assert limiter.observe_health(0.05) == 1.0
    assert limiter.observe_health(0.2) == 0.5
    with pytest.raises(shardlimit.InvalidArgumentError):
        limiter.set_scale(0.0)


def test_coroutines_run_under_asyncio_run(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], {"api": {"algorithm": "fixed_window",
                                                         "limit": 2, "window": "1h"}}))
    coro = limiter.acheck("k", "api")  # no loop yet
    assert asyncio.iscoroutine(coro)
    assert asyncio.run(coro).remaining == 1
    assert asyncio.run(limiter.apeek("k", "api")).remaining == 1


def test_warm_up_connects_before_traffic(redis: RedisServer) -> None:
    from shardlimit._http import warm_up

    limiter = Limiter.from_json(config([redis], {}, timeout_ms=1000))
    assert warm_up(limiter, 5.0) is None
    assert redis.proc is not None
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        failed = warm_up(Limiter.from_json(config([redis], {}, timeout_ms=50)), 0.3)
        assert failed is not None and "no answer within 300 ms" in failed, failed
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)


def test_close(redis: RedisServer) -> None:
    baseline = len(redis.command("CLIENT", "LIST").decode().strip().splitlines())
    with Limiter.from_json(config([redis], {"api": {"algorithm": "fixed_window", "limit": 2,
                                                    "window": "1h"}})) as limiter:
        assert limiter.check("k", "api").allowed
        pending = limiter.acheck("k", "api")
    assert limiter.closed and repr(limiter) == "Limiter(closed)"
    with pytest.raises(shardlimit.InvalidArgumentError, match="closed"):
        limiter.check("k", "api")
    # a call made before close holds the limiter: it finishes
    assert asyncio.run(pending).remaining == 0
    del pending
    limiter.close()  # idempotent
    # the connection is let go: Redis sees it close (asynchronously, so wait for it)
    deadline = time.monotonic() + 5
    while len(clients := redis.command("CLIENT", "LIST").decode().strip().splitlines()) > baseline:
        assert time.monotonic() < deadline, clients
        time.sleep(0.01)


def test_every_public_name_of_the_stub_has_a_docstring() -> None:
    import ast

    stub = Path(shardlimit.__file__).with_name("_shardlimit.pyi")
    tree = ast.parse(stub.read_text())
    missing = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                name = node.name
                if name.startswith("_") and not (prefix and name in ("__init__",)):
                    continue
                if ast.get_docstring(node) is None:
                    missing.append(prefix + name)
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{name}.")

    visit(tree.body, "")
    assert not missing, f"no docstring: {missing}"
    # and every public name of the extension is in the stub
    from shardlimit import _shardlimit as ext

    in_stub = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    in_stub |= {n.target.id for n in tree.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    public = {n for n in dir(ext) if not n.startswith("_")}
    assert public <= in_stub, public - in_stub


def test_anyio_on_asyncio_and_trio_through_threads() -> None:
    import anyio

    limiter = Limiter.memory()

    async def main() -> bool:
        return (await limiter.acheck("anyio", "2/minute")).allowed

    assert anyio.run(main, backend="asyncio")
    try:
        import trio
    except ImportError:
        return

    async def under_trio() -> bool:
        # the a-calls need asyncio; the sync calls release the GIL: run them on a thread
        with pytest.raises(RuntimeError, match="no running event loop"):
            await limiter.acheck("trio", "2/minute")
        d = await trio.to_thread.run_sync(limiter.check, "trio", "2/minute")
        return d.allowed

    assert trio.run(under_trio)
