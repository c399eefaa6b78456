"""Decisions over TLS (``rediss://``) against a real ``redis-server --tls-port`` that requires
a client certificate, with a CA generated for this module: verified and mTLS work, a wrong
CA or a missing client certificate is a ``ConnectionError`` that the policy's ``on_error``
answers."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from redis_support import TlsRedisServer, generate_certs

import shardlimit
from shardlimit import Limiter

POLICIES = {
    "strict": {"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "error"},
    "closed": {"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "closed"},
}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = str(tmp_path_factory.mktemp("tls"))
    generate_certs(d)
    return d


@pytest.fixture(scope="module")
def server(certs: str) -> Iterator[TlsRedisServer]:
    s = TlsRedisServer(certs, auth_clients=True)
    try:
        yield s
    finally:
        s.stop()


def limiter(server: TlsRedisServer, **tls: Any) -> Limiter:
    return Limiter.from_json(json.dumps({
        "timeout_ms": 5000,
        "shards": [{"name": "s0", "url": server.tls_url, "tls": tls}],
        "policies": POLICIES,
    }))


def test_verified_mtls_decides_on_redis(server: TlsRedisServer, certs: str) -> None:
    lim = limiter(
        server,
        ca_file=os.path.join(certs, "ca.crt"),
        cert_file=os.path.join(certs, "client.crt"),
        key_file=os.path.join(certs, "client.key"),
    )
    d = lim.check("tls-user", "strict")
    assert (d.allowed, d.source, d.remaining) == (True, "redis", 4)

    async def acheck() -> shardlimit.Decision:
        return await lim.acheck("tls-user", "strict")

    d = asyncio.run(acheck())
    assert (d.allowed, d.source, d.remaining) == (True, "redis", 3)
    assert len(server.command("KEYS", "*tls-user*")) == 1


@pytest.mark.parametrize("ca", ["ca.crt", "other-ca.crt"])
def test_a_refused_handshake_is_a_connection_error(
    server: TlsRedisServer, certs: str, ca: str
) -> None:
    # other-ca.crt: the server is not trusted; ca.crt without a client certificate: the
    # server refuses the client
    lim = limiter(server, ca_file=os.path.join(certs, ca))
    with pytest.raises(shardlimit.ConnectionError) as info:
        lim.check("k", "strict")
    assert info.value.kind == "connection" and "shard `s0`" in str(info.value)
    d = lim.check("k", "closed")
    assert (d.allowed, d.source) == (False, "fallback")
