"""Fork safety: a Limiter created and used before os.fork() (gunicorn --preload,
multiprocessing with fork) keeps working in the child, sync and asyncio: the core
re-creates its runtime and connections there."""

from __future__ import annotations

import asyncio
import json
import os
import warnings

import pytest
from redis_support import RedisServer, config

from shardlimit import Limiter

POLICIES = {"api": {"algorithm": "sliding_log", "limit": 10, "window": "1h"}}


def run_in_child(fn: "object") -> dict[str, object]:
    """Forks; the child runs fn() and sends back its JSON result through a pipe."""
    r, w = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a process with threads may deadlock; the point
        # of this test is that shardlimit's own threads do not
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.close(r)
            out = json.dumps(fn()).encode()  # type: ignore[operator]
            os.write(w, out)
            code = 0
        except BaseException as e:  # report anything, then exit
            os.write(w, json.dumps({"error": repr(e)}).encode())
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    result: dict[str, object] = json.loads(b"".join(chunks) or b"{}")
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_limiter_keeps_working_in_a_forked_child(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], POLICIES))
    # used before the fork: its runtime threads and connection exist in the parent only
    assert limiter.check("k", "api").remaining == 9

    def child() -> dict[str, object]:
        sync = limiter.check("k", "api", 2)

        async def main() -> int:
            return (await limiter.acheck("k", "api")).remaining

        return {"pid": os.getpid(), "sync": sync.remaining, "async": asyncio.run(main()),
                "source": sync.source}

    result = run_in_child(child)
    assert result["pid"] != os.getpid()
    # the child shared the parent's Redis state: 1 + 2 + 1 units used
    assert (result["sync"], result["async"], result["source"]) == (7, 6, "redis")
    # and the parent's runtime is untouched
    assert limiter.check("k", "api").remaining == 5

    async def parent_async() -> int:
        return (await limiter.acheck("k", "api")).remaining

    assert asyncio.run(parent_async()) == 4


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_children_in_a_row(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], POLICIES))
    assert limiter.check("k", "api")
    seen = [run_in_child(lambda: {"r": limiter.check("k", "api").remaining})["r"]
            for _ in range(3)]
    assert seen == [8, 7, 6]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_inside_a_running_loop_checks_on_its_own_loop(
        redis: RedisServer) -> None:
    # the parent's host transport is bound to its running loop when the fork happens: the
    # child's copy of that loop still says it runs on this very thread, but it is the
    # parent's (its sockets, its futures); the child's own loop must get its own transport
    limiter = Limiter.from_json(config([redis], POLICIES))
    assert limiter.transport == "host"

    def child() -> dict[str, object]:
        async def main() -> list[object]:
            d = await limiter.acheck("k", "api")
            return [d.remaining, d.source]

        return {"r": asyncio.run(main())}

    async def parent() -> tuple[int, dict[str, object], int]:
        first = (await limiter.acheck("k", "api")).remaining
        result = run_in_child(child)  # (blocks this loop while the child runs: a test)
        return first, result, (await limiter.acheck("k", "api")).remaining

    first, result, after = asyncio.run(parent())
    assert (first, result["r"], after) == (9, [8, "redis"], 7)
