"""The Django per-view decorator against a real Redis: sync and async views, the key
function, 429 with the core's body and one header set, deduct_when, argument errors."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from redis_support import RedisServer, config

import shardlimit
from shardlimit import Limiter

django = pytest.importorskip("django", reason="Django is not installed")
from django.conf import settings  # noqa: E402

if not settings.configured:
    settings.configure(ALLOWED_HOSTS=["*"], DEBUG=False, USE_TZ=True)
    django.setup()

from django.http import HttpResponse  # noqa: E402
from django.test import RequestFactory  # noqa: E402

from shardlimit.django import limit  # noqa: E402

POLICIES = {"api": {"algorithm": "fixed_window", "limit": 2, "window": "1h", "on_error": "error"}}


@pytest.fixture
def limiter(redis: RedisServer) -> Limiter:
    return Limiter.from_json(config([redis], POLICIES))


def test_a_sync_view_is_limited_by_client_address(limiter: Limiter) -> None:
    @limit(limiter, "2/minute")
    def login(request: Any) -> HttpResponse:
        return HttpResponse(f"{request.shardlimit.remaining} left")

    rf = RequestFactory()
    ok = [login(rf.post("/login", REMOTE_ADDR="198.51.100.1")) for _ in range(2)]
    assert [r.status_code for r in ok] == [200, 200]
    assert ok[0].content == b"1 left" and ok[0]["X-RateLimit-Limit"] == "2"
    denied = login(rf.post("/login", REMOTE_ADDR="198.51.100.1"))
    assert denied.status_code == 429 and denied["Retry-After"]
    assert json.loads(denied.content)["error"] == "rate_limited"
    # another client has its own budget
    assert login(rf.post("/login", REMOTE_ADDR="198.51.100.2")).status_code == 200


def test_an_async_view_with_a_key_function_and_a_config_policy(limiter: Limiter) -> None:
    @limit(limiter, "api", key=lambda req: req.headers.get("x-api-key"))
    async def report(request: Any) -> HttpResponse:
        return HttpResponse("report")

    rf = RequestFactory()

    async def main() -> list[int]:
        return [(await report(rf.get("/r", HTTP_X_API_KEY="k1"))).status_code for _ in range(3)]

    assert asyncio.run(main()) == [200, 200, 429]
    # the key is the key function's own (a config policy by name): overrides apply to it
    assert limiter.peek("k1", "api").remaining == 0


def test_deduct_when_counts_only_failures(limiter: Limiter) -> None:
    status = {"code": 200}

    @limit(limiter, "2/hour", deduct_when=lambda response: response.status_code >= 400)
    def login(request: Any) -> HttpResponse:
        return HttpResponse("x", status=status["code"])

    rf = RequestFactory()
    assert [login(rf.post("/login")).status_code for _ in range(3)] == [200, 200, 200]
    status["code"] = 401
    assert [login(rf.post("/login")).status_code for _ in range(3)] == [401, 401, 429]


def test_a_bad_argument_is_an_error_naming_it(limiter: Limiter) -> None:
    with pytest.raises(shardlimit.InvalidArgumentError, match="^cost: "):
        limit(limiter, "5/minute", cost=None)  # type: ignore[arg-type]
    with pytest.raises(shardlimit.UnknownPolicyError):
        limit(limiter, "no_such_policy")


def test_the_readme_s_django_snippet_runs_as_written(limiter: Limiter) -> None:
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Django: a per-view decorator"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    ns: dict[str, Any] = {"__name__": "readme", "limiter": limiter}
    exec(compile(code.group(1), "README.md (Django)", "exec"), ns)
    rf = RequestFactory()
    codes = [ns["login"](rf.post("/login")).status_code for _ in range(6)]
    assert codes == [200] * 5 + [429]
    assert ns["login"](rf.post("/login", REMOTE_ADDR="198.51.100.9")).content == b"4 left"
