"""The Python blocks of the READMEs, read from the files and run as written against a real
Redis: the top-level README's first check, the binding README's Check, asyncio, Metrics,
FastAPI and Flask blocks, and docs/features.md's FastAPI block (the binding README's Django
and deduct_when blocks: test_django.py and test_route_keys.py; docs/features.md's business
blocks: test_readme_business.py). Names a block leaves to the reader (``run_report``,
``serve``, ``new_config_dict``) are given; the config file the blocks load is written to a
temporary working directory."""

from __future__ import annotations

import ast
import asyncio
import json
import pathlib
import re
from typing import Any

import httpx
import pytest
from redis_support import RedisServer

from shardlimit import Limiter

ROOT = pathlib.Path(__file__).resolve().parents[3]
POLICIES: dict[str, Any] = {
    "login": {"algorithm": "fixed_window", "limit": 5, "window": "1m", "on_error": "error"},
    "api": {"algorithm": "token_bucket", "capacity": 100, "refill_per_sec": 10, "overrides": True,
            "on_error": "error"},
    "per_ip": {"rate": "100/minute", "on_error": "error"},
    "tenant": {"rate": "100/minute", "on_error": "error"},
    "tokens": {"algorithm": "token_bucket", "capacity": 10000, "refill_per_sec": 100,
               "on_error": "error"},
    "reports": {"algorithm": "concurrency", "max": 2, "lease_ttl": "1m", "on_error": "error"},
}


def block(path: str, heading: str) -> str:
    """The first ```python block after ``heading`` in ``path`` (from the repository root)."""
    text = (ROOT / path).read_text(encoding="utf-8")
    assert heading in text, f"{path} has no heading {heading!r}"
    code = re.search(r"```python\n(.*?)```", text[text.index(heading):], re.S)
    assert code is not None, f"no python block after {heading!r} in {path}"
    return code.group(1)


@pytest.fixture
def config_file(redis: RedisServer, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    cfg = {"shards": [{"name": "s0", "url": redis.url}], "timeout_ms": 5000, "policies": POLICIES}
    (tmp_path / "shard-config.json").write_text(json.dumps(cfg))
    monkeypatch.chdir(tmp_path)
    return cfg


def test_the_top_level_readme_s_python_check(config_file: dict[str, Any]) -> None:
    ns: dict[str, Any] = {"__name__": "readme"}
    code = block("README.md", "## A first check, per language")
    exec(compile(code, "README.md (Python)", "exec"), ns)
    assert ns["d"].allowed and ns["d"].policy == "api" and ns["d"].source == "redis"


def test_the_binding_readme_s_check_block(config_file: dict[str, Any]) -> None:
    reports: list[int] = []

    def run_report() -> None:  # the block runs it inside its lease
        reports.append(ns["limiter"].peek("reports:tenant-7", "reports").remaining)

    ns: dict[str, Any] = {"__name__": "readme", "run_report": run_report}
    code = block("bindings/python/README.md", "## Check")
    exec(compile(code, "bindings/python/README.md (Check)", "exec"), ns)
    assert reports == [1]  # one of the 2 units held during the report
    limiter: Limiter = ns["limiter"]
    assert limiter.get_override("tenant:acme", "api") is None  # set, then deleted
    assert limiter.blocked("ip:203.0.113.9") is None  # blocked, then unblocked
    assert ns["d"].allowed and ns["d"].layer is not None


def test_the_binding_readme_s_asyncio_block(config_file: dict[str, Any]) -> None:
    code = block("bindings/python/README.md", "## asyncio")
    # every line but the last awaits on one loop (a top-level await, as in a coroutine); the
    # last line starts a loop of its own, so it runs outside that one
    *body, last = code.rstrip("\n").split("\n")
    assert last.startswith("asyncio.run("), last
    ns: dict[str, Any] = {"__name__": "readme", "asyncio": asyncio,
                          "limiter": Limiter.from_config_file("shard-config.json")}
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    coro = eval(compile("\n".join(body) + "\n", "bindings/python/README.md (asyncio)", "exec", flags=flags), ns)
    asyncio.run(coro)
    assert ns["r"] is not None and ns["lease"] is not None and ns["decision"].allowed
    exec(compile(last, "bindings/python/README.md (asyncio)", "exec"), ns)


def test_the_binding_readme_s_metrics_block(config_file: dict[str, Any]) -> None:
    served: list[bool] = []
    ns: dict[str, Any] = {"__name__": "readme", "serve": lambda: served.append(True),
                          "new_config_dict": config_file,
                          "limiter": Limiter.from_config_file("shard-config.json")}
    code = block("bindings/python/README.md", "## Metrics, events, reload, scale")
    exec(compile(code, "bindings/python/README.md (Metrics)", "exec"), ns)
    assert served == [True]
    with pytest.raises(Exception, match="closed"):  # the block ends with limiter.close()
        ns["limiter"].check("k", "api")


@pytest.mark.parametrize("path, heading", [
    ("bindings/python/README.md", "## FastAPI / Starlette: route limits"),
    ("docs/features.md", "## Python"),
])
def test_the_fastapi_blocks(config_file: dict[str, Any], path: str, heading: str) -> None:
    ns: dict[str, Any] = {"__name__": "readme", "limiter": Limiter.from_config_file("shard-config.json")}
    exec(compile(block(path, heading), f"{path} (FastAPI)", "exec"), ns)

    async def main() -> list[int]:
        transport = httpx.ASGITransport(app=ns["app"], client=("198.51.100.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            codes = [(await c.post("/v1/login")).status_code for _ in range(6)]
            codes.append((await c.get("/v1/health")).status_code)
            return codes

    assert asyncio.run(main()) == [200] * 5 + [429, 200]


def test_the_binding_readme_s_flask_block(config_file: dict[str, Any]) -> None:
    ns: dict[str, Any] = {"__name__": "readme", "limiter": Limiter.from_config_file("shard-config.json")}
    code = block("bindings/python/README.md", "## Flask: route limits")
    exec(compile(code, "bindings/python/README.md (Flask)", "exec"), ns)
    client = ns["app"].test_client()
    answers = [client.post("/login") for _ in range(6)]
    assert [a.status_code for a in answers] == [200] * 5 + [429]
    assert [a.get_json()["remaining"] for a in answers[:5]] == [4, 3, 2, 1, 0]
