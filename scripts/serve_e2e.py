"""`shardlimit serve` behind real proxies: Envoy (its rate limit filter), nginx
(auth_request), Traefik (ForwardAuth) and HAProxy (a Lua action), in front of a trivial upstream, with the
files of examples/serve/ as they are (placeholders replaced by free loopback ports).
Also: one budget spent exactly by Envoy and a Python service at once, SIGHUP reload,
SIGTERM, and Envoy's failure_mode_deny with serve gone.

Run by scripts/test-serve.sh:  python serve_e2e.py SERVE_BIN ENVOY_BIN TRAEFIK_BIN
Every process it starts listens on 127.0.0.1 and is stopped by PID at the end.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EX = os.path.join(ROOT, "examples", "serve")
SERVE_BIN, ENVOY_BIN, TRAEFIK_BIN = sys.argv[1], sys.argv[2], sys.argv[3]
PROCS = []
PASSED = 0
FAILED = 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, log, **kw):
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, **kw)
    PROCS.append(p)
    return p


def stop(p, sig=signal.SIGTERM, timeout=10):
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return p.returncode


def wait_for(what, fn, timeout=20.0):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            if fn():
                return
        except Exception as e:  # not up yet
            last = e
        time.sleep(0.05)
    raise AssertionError(f"{what} did not come up within {timeout} s ({last})")


def get(port, path="/", headers=None, timeout=5):
    """(status, headers lower-cased, body) of one GET."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode()


def fill(name, out_dir, values):
    with open(os.path.join(EX, name)) as f:
        text = f.read()
    for k, v in values.items():
        text = text.replace("{{" + k + "}}", str(v))
    assert "{{" not in text, f"{name}: a placeholder is left: {text[text.index('{{'):][:40]}"
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def case(name):
    def wrap(fn):
        def run(*a):
            global PASSED, FAILED
            t = time.time()
            try:
                fn(*a)
                PASSED += 1
                print(f"ok   {name} ({time.time() - t:.1f} s)", flush=True)
            except Exception as e:
                FAILED += 1
                print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        return run
    return wrap


class Upstream(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"upstream\n"
        self.send_response(200)
        # what a proxy passed on from the auth answer (Traefik's authResponseHeadersRegex)
        seen = self.headers.get("x-ratelimit-remaining")
        if seen is not None:
            self.send_header("x-upstream-saw-remaining", seen)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def limited_run(port, key, n, allowed, denied_status=429):
    """n requests with x-api-key: the first `allowed` pass, the rest are denied."""
    got = [get(port, headers={"x-api-key": key}) for _ in range(n)]
    codes = [g[0] for g in got]
    assert codes == [200] * allowed + [denied_status] * (n - allowed), codes
    return got


def main():
    d = tempfile.mkdtemp(prefix="shardlimit-serve-e2e-")
    log = open(os.path.join(d, "processes.log"), "w")
    ports = {k: free_port() for k in ["REDIS_PORT", "SERVE_HTTP", "SERVE_GRPC", "UPSTREAM_PORT",
                                        "ENVOY_PORT", "ENVOY_ADMIN", "NGINX_PORT", "HAPROXY_PORT",
                                        "TRAEFIK_PORT", "TRAEFIK_PING"]}
    ports["DIR"] = d
    try:
        redis = start(["redis-server", "--port", str(ports["REDIS_PORT"]), "--bind", "127.0.0.1",
                       "--save", "", "--dir", d], log)
        wait_for("redis-server", lambda: subprocess.run(
            ["redis-cli", "-p", str(ports["REDIS_PORT"]), "ping"], capture_output=True, text=True
        ).stdout.strip() == "PONG")
        up = ThreadingHTTPServer(("127.0.0.1", ports["UPSTREAM_PORT"]), Upstream)
        threading.Thread(target=up.serve_forever, daemon=True).start()

        cfg = fill("shard-config.json", d, ports)
        serve_log = open(os.path.join(d, "serve.log"), "w")
        serve = start([SERVE_BIN, "--config", cfg, "--http", f"127.0.0.1:{ports['SERVE_HTTP']}",
                       "--grpc", f"127.0.0.1:{ports['SERVE_GRPC']}", "--log-format", "json"], serve_log)
        wait_for("shardlimit serve", lambda: get(ports["SERVE_HTTP"], "/readyz")[0] == 200)

        envoy_cfg = fill("envoy.yaml", d, {**ports, "FAILURE_MODE_DENY": "false", "RLS_TIMEOUT": "1s"})
        envoy = start([ENVOY_BIN, "-c", envoy_cfg, "--concurrency", "1", "--disable-hot-restart",
                       "--log-level", "warn"], log)
        wait_for("envoy", lambda: get(ports["ENVOY_ADMIN"], "/ready")[0] == 200, timeout=60)

        @case("envoy: 5 of 8 requests pass, the 429s carry serve's headers and JSON body")
        def envoy_limits():
            got = limited_run(ports["ENVOY_PORT"], "e1", 8, 5)
            s, h, b = got[0]
            assert b == "upstream\n", b
            assert h.get("x-ratelimit-remaining") == "4", h
            assert "ratelimit-policy" in h, h
            s, h, b = got[-1]
            assert h.get("x-envoy-ratelimited") == "true", h
            assert int(h["retry-after"]) > 0, h
            assert h.get("x-ratelimit-remaining") == "0", h
            assert h.get("content-type") == "application/json", h
            body = json.loads(b)
            assert body["error"] == "rate_limited" and body["policy"] == "edge_api", body
            # no x-api-key header: Envoy sends no descriptor, nothing is limited
            assert [get(ports["ENVOY_PORT"])[0] for _ in range(3)] == [200] * 3
        envoy_limits()

        @case("one budget: Envoy and a Python service checking the same key admit exactly 40 of 80")
        def shared_budget():
            import shardlimit
            lim = shardlimit.Limiter.from_config(cfg)
            lim.connect(5.0)
            results = {"envoy": 0, "python": 0}
            sources = set()

            def via_envoy(n):
                for _ in range(n):
                    if get(ports["ENVOY_PORT"], headers={"x-api-key": "shared-1"})[0] == 200:
                        results["envoy"] += 1

            def via_python(n):
                for _ in range(n):
                    dec = lim.check("key:shared-1", "shared")
                    sources.add(str(dec.source))
                    if dec.allowed:
                        results["python"] += 1

            # in turn: 10 each, all admitted
            for _ in range(10):
                via_envoy(1)
                via_python(1)
            assert results == {"envoy": 10, "python": 10}, results
            # at once: 30 each for the 20 units left
            barrier = threading.Barrier(2)
            ts = [threading.Thread(target=lambda f=f: (barrier.wait(), f(30))) for f in (via_envoy, via_python)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            assert results["envoy"] + results["python"] == 40, results
            assert sources == {"redis"}, sources
            print(f"     admitted: {results}")
        shared_budget()

        nginx_conf = fill("nginx.conf", d, ports)
        os.makedirs(os.path.join(d, "nginx", "logs"), exist_ok=True)
        nginx = start(["nginx", "-p", os.path.join(d, "nginx"), "-c", nginx_conf, "-g",
                       f"daemon off; pid {d}/nginx.pid; error_log {d}/nginx-error.log;"], log)
        wait_for("nginx", lambda: get(ports["NGINX_PORT"])[0] in (200, 429))

        @case("nginx auth_request: 403 from /auth becomes a 429 with Retry-After")
        def nginx_limits():
            # the wait above spent nothing: it sent no x-api-key, so the key is "key:"
            got = limited_run(ports["NGINX_PORT"], "n1", 7, 5)
            s, h, b = got[0]
            assert b == "upstream\n" and h.get("x-ratelimit-remaining") == "4", (h, b)
            s, h, b = got[-1]
            assert int(h["retry-after"]) > 0 and h.get("x-ratelimit-remaining") == "0", h
            assert json.loads(b) == {"error": "rate_limited"}, b
        nginx_limits()

        haproxy_cfg = fill("haproxy.cfg", d, ports)
        shutil_copy(os.path.join(EX, "shardlimit.lua"), os.path.join(d, "shardlimit.lua"))
        haproxy = start(["haproxy", "-db", "-f", haproxy_cfg], log)
        wait_for("haproxy", lambda: get(ports["HAPROXY_PORT"], headers={"x-api-key": "probe"})[0] == 200)

        @case("haproxy Lua action: 429 with Retry-After after 5")
        def haproxy_limits():
            got = limited_run(ports["HAPROXY_PORT"], "h1", 7, 5)
            s, h, b = got[0]
            assert b == "upstream\n" and h.get("x-ratelimit-remaining") == "4", (h, b)
            s, h, b = got[-1]
            assert int(h["retry-after"]) > 0 and h.get("x-ratelimit-remaining") == "0", h
        haproxy_limits()

        fill("traefik-dynamic.yml", d, ports)
        traefik = start([TRAEFIK_BIN, "--configFile=" + fill("traefik.yml", d, ports)], log)
        wait_for("traefik", lambda: get(ports["TRAEFIK_PING"], "/ping")[0] == 200, timeout=60)
        # the file provider's router comes up a moment after /ping
        wait_for("traefik's router", lambda: get(
            ports["TRAEFIK_PORT"], headers={"x-shardlimit-key": "key:probe-t"})[0] == 200, timeout=30)

        @case("traefik ForwardAuth: 5 of 8 pass, the 429s carry serve's headers and JSON body, the upstream gets the headers")
        def traefik_limits():
            got = [get(ports["TRAEFIK_PORT"], headers={"x-shardlimit-key": "key:t1"}) for _ in range(8)]
            codes = [g[0] for g in got]
            assert codes == [200] * 5 + [429] * 3, codes
            s, h, b = got[0]
            assert b == "upstream\n", b
            assert h.get("x-upstream-saw-remaining") == "4", h
            s, h, b = got[-1]
            assert int(h["retry-after"]) > 0 and h.get("x-ratelimit-remaining") == "0", h
            body = json.loads(b)
            assert body["error"] == "rate_limited" and body["policy"] == "edge_api", body
        traefik_limits()

        @case("SIGHUP reloads the config: edge_api 5 -> 7, the same key gets 2 more")
        def reload():
            with open(cfg) as f:
                c = json.load(f)
            c["policies"]["edge_api"]["limit"] = 7
            with open(cfg, "w") as f:
                json.dump(c, f)
            serve.send_signal(signal.SIGHUP)
            wait_for("reload", lambda: "reloaded" in open(os.path.join(d, "serve.log")).read(), 10)
            codes = [get(ports["ENVOY_PORT"], headers={"x-api-key": "e1"})[0] for _ in range(3)]
            assert codes == [200, 200, 429], codes
            # a broken file is refused, the config in force stays
            with open(cfg, "w") as f:
                f.write('{"policies": {"edge_api": "nope"}}')
            serve.send_signal(signal.SIGHUP)
            wait_for("refusal", lambda: "reload refused" in open(os.path.join(d, "serve.log")).read(), 10)
            assert get(ports["ENVOY_PORT"], headers={"x-api-key": "e1"})[0] == 429
        reload()

        @case("SIGTERM: serve exits 0; Envoy then fails open (failure_mode_deny: false), nginx and Traefik answer 500")
        def serve_gone():
            def allowed_on_failure():
                stats = get(ports["ENVOY_ADMIN"], "/stats?filter=ratelimit.failure_mode_allowed")[2]
                return sum(int(l.rsplit(":", 1)[1]) for l in stats.splitlines() if ":" in l)
            before = allowed_on_failure()
            assert before == 0, f"every call so far was answered by serve: {before}"
            rc = stop(serve)
            assert rc == 0, f"exit {rc}"
            assert '"stopped"' in open(os.path.join(d, "serve.log")).read()
            s, h, b = get(ports["ENVOY_PORT"], headers={"x-api-key": "e9"})
            assert s == 200, (s, h, b)
            assert allowed_on_failure() == 1
            assert get(ports["NGINX_PORT"], headers={"x-api-key": "n9"})[0] == 500
            # ForwardAuth cannot reach its auth server: Traefik answers 500 (fails closed)
            assert get(ports["TRAEFIK_PORT"], headers={"x-shardlimit-key": "key:t9"})[0] == 500
            # the Lua action sets no status when serve is unreachable: HAProxy lets it pass
            assert get(ports["HAPROXY_PORT"], headers={"x-api-key": "h9"})[0] == 200
        serve_gone()

        @case("Envoy with failure_mode_deny: true answers 500 when serve is gone")
        def deny_mode():
            p2 = {**ports, "ENVOY_PORT": free_port(), "ENVOY_ADMIN": free_port(), "FAILURE_MODE_DENY": "true", "RLS_TIMEOUT": "1s"}
            d2 = os.path.join(d, "deny")
            os.makedirs(d2)
            e2 = start([ENVOY_BIN, "-c", fill("envoy.yaml", d2, p2), "--concurrency", "1",
                        "--disable-hot-restart", "--base-id", "7", "--log-level", "warn"], log)
            try:
                wait_for("envoy (deny)", lambda: get(p2["ENVOY_ADMIN"], "/ready")[0] == 200, timeout=60)
                assert get(p2["ENVOY_PORT"], headers={"x-api-key": "e9"})[0] == 500
                assert get(p2["ENVOY_PORT"])[0] == 200, "no descriptor: no call, no failure"
            finally:
                stop(e2)
        deny_mode()

        @case("Envoy to serve over a Unix socket (a pipe cluster): 5 of 8 pass; the socket is 0660 and removed at exit")
        def over_unix_socket():
            p3 = {**ports, "ENVOY_PORT": free_port(), "ENVOY_ADMIN": free_port(), "FAILURE_MODE_DENY": "true", "RLS_TIMEOUT": "1s"}
            d3 = os.path.join(d, "uds")
            os.makedirs(d3)
            sock = os.path.join(d3, "rls.sock")
            # the example config as it is (the reload case left the shared copy invalid)
            s2_log = open(os.path.join(d, "serve-uds.log"), "w")
            s2 = start([SERVE_BIN, "--config", fill("shard-config.json", d3, ports), "--http", "off",
                        "--grpc", f"unix:{sock}"], s2_log)
            path = fill("envoy.yaml", d3, p3)
            text = open(path).read()
            tcp = "{address: {socket_address: {address: 127.0.0.1, port_value: %d}}}" % ports["SERVE_GRPC"]
            assert text.count(tcp) == 1, "the shardlimit cluster's endpoint"
            with open(path, "w") as f:
                f.write(text.replace(tcp, "{address: {pipe: {path: %s}}}" % sock))
            e3 = start([ENVOY_BIN, "-c", path, "--concurrency", "1", "--disable-hot-restart",
                        "--base-id", "8", "--log-level", "warn"], log)
            try:
                wait_for("serve on a Unix socket", lambda: s2.poll() is None and os.path.exists(sock))
                assert oct(os.stat(sock).st_mode & 0o777) == "0o660", oct(os.stat(sock).st_mode)
                wait_for("envoy (uds)", lambda: get(p3["ENVOY_ADMIN"], "/ready")[0] == 200, timeout=60)
                # failure_mode_deny: true, so a pass can only be serve's answer
                limited_run(p3["ENVOY_PORT"], "u1", 8, 5)
            finally:
                stop(e3)
                rc = stop(s2)
            assert rc == 0, f"exit {rc}"
            assert not os.path.exists(sock), "the socket was left behind"
        over_unix_socket()
        up.shutdown()
    finally:
        for p in reversed(PROCS):
            stop(p)
        log.close()
        if FAILED:
            for f in ["serve.log", "processes.log", "nginx-error.log"]:
                path = os.path.join(d, f)
                if os.path.exists(path):
                    print(f"--- {f} (last lines)")
                    print("".join(open(path).readlines()[-30:]))
    print(f"serve e2e: {PASSED} passed, {FAILED} failed")
    sys.exit(1 if FAILED else 0)


def shutil_copy(a, b):
    import shutil
    shutil.copy(a, b)


if __name__ == "__main__":
    main()
