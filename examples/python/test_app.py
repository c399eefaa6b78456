"""Smoke test of examples/python/app.py: a real redis-server and the real service (uvicorn),
each on a free 127.0.0.1 port, and real HTTP requests over loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

APP = Path(__file__).with_name("app.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(ok, what: str, proc: subprocess.Popen, deadline_s: float = 20.0) -> None:
    """Bounded wait for a server to accept connections (not a sleep over a race)."""
    deadline = time.monotonic() + deadline_s
    while not ok():
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"{what} exited with {proc.returncode}: {out}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not start in {deadline_s}s")
        time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def redis_port() -> Iterator[int]:
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", d],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        def pong() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    return s.recv(16).startswith(b"+PONG")
            except OSError:
                return False

        wait_until(pong, "redis-server", proc)
        yield port
        stop(proc)


@pytest.fixture
def service(redis_port: int) -> Iterator[str]:
    port = free_port()
    config = {
        "shards": [{"name": "s0", "url": f"redis://127.0.0.1:{redis_port}"}],
        "timeout_ms": 2000,
        # sliding_log: exact, and no window boundary can fall inside the test
        "policies": {"api": {"algorithm": "sliding_log", "limit": 3, "window": "1h"}},
    }
    env = {**os.environ, "SHARDLIMIT_CONFIG": json.dumps(config)}
    proc = subprocess.Popen([sys.executable, str(APP), "--port", str(port), "--policy", "api"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(base + "/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(up, "examples/python/app.py", proc)
    yield base
    stop(proc)


def test_200s_then_429_with_headers_and_json_body(service: str) -> None:
    with httpx.Client(base_url=service, timeout=5) as http:
        for remaining in (2, 1, 0):
            r = http.get("/hello/alice")
            assert r.status_code == 200, r.text
            assert r.json() == {"hello": "alice"}
            assert r.headers["x-ratelimit-limit"] == "3"
            assert r.headers["x-ratelimit-remaining"] == str(remaining)
            assert int(r.headers["x-ratelimit-reset"]) > 0
            assert r.headers["ratelimit-policy"] == '"api";q=3;w=3600'
            assert r.headers["ratelimit"].startswith(f'"api";r={remaining};t=')
            assert "retry-after" not in r.headers
        for _ in range(2):
            r = http.get("/")
            assert r.status_code == 429
            assert r.headers["content-type"].startswith("application/json")
            assert r.headers["x-ratelimit-remaining"] == "0"
            assert 0 < int(r.headers["retry-after"]) <= 3600
            body = r.json()
            assert body["error"] == "rate_limited"
            assert body["policy"] == "api"
            assert body["limit"] == 3
            assert body["remaining"] == 0
            assert body["retry_after"] > 0
        # not limited, and not counted
        h = http.get("/health")
        assert h.status_code == 200
        assert "x-ratelimit-limit" not in h.headers
