from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from redis_support import RedisServer  # noqa: E402


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """One real redis-server per test module, on a free loopback port."""
    server = RedisServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis(redis_server: RedisServer) -> RedisServer:
    """The module's server, emptied for this test."""
    redis_server.command("FLUSHALL")
    return redis_server
