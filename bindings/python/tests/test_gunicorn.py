"""Real servers: Flask under gunicorn with 4 sync workers and FastAPI under gunicorn with 4
uvicorn workers, against a real Redis. 150 requests on a 100/minute limit admit exactly 100:
the lifespan/start-up warm-up connects every worker before traffic, so none falls open."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from redis_support import RedisServer, config, free_port

APPS = {
    "flask_app": """
        from flask import Flask
        import shardlimit
        from shardlimit.flask import FlaskLimits

        limiter = shardlimit.Limiter.from_env()
        app = Flask(__name__)
        limits = FlaskLimits(limiter, app)

        @app.get("/hit")
        @limits.limit("100/minute")
        def hit():
            return "ok"
    """,
    "fastapi_app": """
        from fastapi import FastAPI
        import shardlimit
        from shardlimit.asgi import RateLimitMiddleware, RouteLimits

        limiter = shardlimit.Limiter.from_env()
        limits = RouteLimits(limiter)
        sub = FastAPI()

        @sub.get("/hit")
        @limits.limit("100/minute")
        async def hit():
            return "ok"

        app = FastAPI()
        app.mount("/v1", sub)
        app.add_middleware(RateLimitMiddleware, limiter=limiter, routes=limits)
    """,
    "wsgi_error_app": """
        from flask import Flask
        import shardlimit
        from shardlimit.wsgi import RateLimitMiddleware

        limiter = shardlimit.Limiter.from_env()
        app = Flask(__name__)

        @app.get("/hit")
        def hit():
            return "ok"

        app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter, policy="raising")
    """,
}


class Gunicorn:
    """gunicorn with 4 workers of ``worker`` serving ``module:app`` on a free port."""

    def __init__(self, tmp_path: Path, module: str, worker: str, cfg: str) -> None:
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(APPS[module]))
        self.port = free_port()
        self.log = tmp_path / "gunicorn.log"
        env = dict(os.environ, SHARDLIMIT_CONFIG=cfg, PYTHONPATH=str(tmp_path))
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "-w", "4", "-k", worker, "-b",
                 f"127.0.0.1:{self.port}", f"{module}:app"],
                env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                get(self.port, "/nothing-here")
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"gunicorn did not start: {self.log.read_text()}")
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=15)


def get(port: int, path: str) -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        c.close()


@pytest.mark.parametrize("module, worker, path", [
    ("flask_app", "sync", "/hit"),
    ("fastapi_app", "uvicorn.workers.UvicornWorker", "/v1/hit"),
])
def test_four_workers_admit_exactly_the_limit(redis: RedisServer, tmp_path: Path, module: str,
                                              worker: str, path: str) -> None:
    pytest.importorskip("gunicorn")
    if worker != "sync":
        pytest.importorskip("uvicorn")
    # on_error open, as the report that admitted 104-108 had it. The deadline is 1 s, not the
    # default 50 ms: on a loaded 2-core CI machine a 50 ms deadline is missed by scheduling
    # alone, and a fallback would make the total depend on load, not on this code
    cfg = config([redis], {}, timeout_ms=1000)
    server = Gunicorn(tmp_path, module, worker, cfg)
    port, log = server.port, server.log
    try:
        # a worker accepts only after its start-up (Flask: import; uvicorn: lifespan), when
        # the warm-up has connected it: no worker falls back on its first requests
        codes = [get(port, path) for _ in range(150)]
        assert codes.count(200) == 100 and codes.count(429) == 50, \
            {c: codes.count(c) for c in set(codes)}
        assert "warm-up incomplete" not in log.read_text()
    finally:
        server.stop()


def test_a_backend_error_under_sync_workers_still_gets_a_response(redis: RedisServer,
                                                                  tmp_path: Path) -> None:
    """on_error "error" with Redis frozen: the error escapes the app into gunicorn, which
    answers 500. (It used to be an OSError, which gunicorn takes for a dead client socket:
    the client got no response at all.)"""
    pytest.importorskip("gunicorn")
    cfg = config([redis], {"raising": {"algorithm": "fixed_window", "limit": 100,
                                       "window": "1m", "on_error": "error"}}, timeout_ms=200)
    server = Gunicorn(tmp_path, "wsgi_error_app", "sync", cfg)
    assert redis.proc is not None
    try:
        assert get(server.port, "/hit") == 200
        os.kill(redis.proc.pid, signal.SIGSTOP)
        try:
            assert get(server.port, "/hit") == 500
        finally:
            os.kill(redis.proc.pid, signal.SIGCONT)
    finally:
        server.stop()
