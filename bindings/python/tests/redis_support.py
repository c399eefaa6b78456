"""Real redis-server processes on free 127.0.0.1 ports, started and stopped by the tests."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any, Optional, Sequence, Union


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _encode(*args: Union[str, bytes, int]) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2 :]
        return data

    def reply(self) -> Any:
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.exact(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RuntimeError(f"unexpected reply {line!r}")


class Connection:
    """A minimal RESP client for test setup (FLUSHALL, CLIENT PAUSE, ...)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = _Reader(self.sock)

    def __call__(self, *args: Union[str, bytes, int]) -> Any:
        self.sock.sendall(_encode(*args))
        return self.reader.reply()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RedisServer:
    def __init__(self, extra: Sequence[str] = ()) -> None:
        # SHARDLIMIT_REDIS_SERVER: another server binary (valkey-server: scripts/test-valkey.sh)
        name = os.environ.get("SHARDLIMIT_REDIS_SERVER") or "redis-server"
        exe = shutil.which(name)
        if exe is None:
            raise RuntimeError(f"{name} is not installed (scripts/test-python.sh installs redis-server)")
        self.dir = tempfile.TemporaryDirectory(prefix="shardlimit-redis-")
        self.proc: Optional[subprocess.Popen[bytes]] = None
        # a port found free may be taken before the server binds it (the kernel hands a
        # released port out again): then the server exits and starts again on another
        for _ in range(10):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir.name, *extra],
                stdout=subprocess.DEVNULL,
            )
            if self._wait_ready():
                return
        raise RuntimeError("no free port for redis-server after 10 tries")

    def _wait_ready(self) -> bool:
        """Until this process (not another server on the port) answers; False if it exited."""
        assert self.proc is not None
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                return False
            try:
                with Connection(self.port) as c:
                    info = c("INFO", "server")
                    if f"process_id:{self.proc.pid}\r\n".encode() in info:
                        return True
            except (OSError, RuntimeError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.01)  # waiting for the server to listen, not for a race

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def conn(self) -> Connection:
        return Connection(self.port)

    def command(self, *args: Union[str, bytes, int]) -> Any:
        with self.conn() as c:
            return c(*args)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None
        self.dir.cleanup()


def config(
    servers: list[RedisServer], policies: dict[str, Any], **extra: Any
) -> str:
    """A JSON config with one shard per server. The deadline is generous (5 s) so that a
    loaded CI machine never turns a test into a timeout; tests of deadlines set their own."""
    cfg: dict[str, Any] = {
        "shards": [{"name": f"s{i}", "url": s.url} for i, s in enumerate(servers)],
        "timeout_ms": 5000,
        "policies": policies,
    }
    cfg.update(extra)
    return json.dumps(cfg)


# `tests/tls/gen-certs.sh` of the repository: the test PKI every language's TLS tests use
GEN_CERTS = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "tls", "gen-certs.sh"
)


def generate_certs(directory: str, san: str = "DNS:localhost,IP:127.0.0.1") -> None:
    """A throw-away CA, a server certificate for ``san``, a client certificate and a second
    CA (``other-ca.crt``) in ``directory`` (openssl, through the shared script)."""
    subprocess.run(["sh", GEN_CERTS, directory, san], check=True, timeout=60)


class TlsRedisServer(RedisServer):
    """A redis-server that also listens for TLS (``tls_port``) with the server certificate of
    ``certs``; with ``auth_clients`` it requires a client certificate signed by the test CA."""

    def __init__(self, certs: str, auth_clients: bool) -> None:
        self.tls_port = free_port()
        super().__init__([
            "--tls-port", str(self.tls_port),
            "--tls-cert-file", os.path.join(certs, "server.crt"),
            "--tls-key-file", os.path.join(certs, "server.key"),
            "--tls-ca-cert-file", os.path.join(certs, "ca.crt"),
            "--tls-auth-clients", "yes" if auth_clients else "no",
        ])
        # the plain port answering PING means every listener, the TLS one too, is bound

    @property
    def tls_url(self) -> str:
        return f"rediss://127.0.0.1:{self.tls_port}"
