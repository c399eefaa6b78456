"""Interpreters that used events and log lines exit cleanly: shardlimit's threads that call
into Python (subscribe() callbacks, log lines) stop at the interpreter's exit instead of
calling it while it finalizes (that was a Rust panic trace, or a SIGSEGV). Each shape runs in
50 child interpreters, run in parallel within 60 s in all; every one must exit 0 with nothing
on stderr but the dead shard's expected warnings."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time
from pathlib import Path

RUNS = 50
# the whole test's bound: the children run in parallel
DEADLINE_S = 60.0

# README's subscribe example on the in-memory engine, then denials (one event each) while
# the interpreter exits
README = """
import queue
import shardlimit

limiter = shardlimit.Limiter.from_json(
    '{"policies": {"new-api": {"rate": "1/hour", "shadow": true}, "free": "10/day"}}')
limiter.check("user:1", "new-api")
d = limiter.check("user:1", "new-api")
assert d.allowed and d.shadow_denied
events: queue.Queue = queue.Queue()
limiter.subscribe(events.put)
for _ in range(8):
    limiter.check("tenant:7", "free")
while (e := events.get(timeout=5))["kind"] != "near_limit":
    pass
assert (e["key"], e["remaining"]) == ("tenant:7", "2")
for _ in range(50):
    limiter.check("tenant:7", "free")
"""

# a dead shard: every check falls back, with an event and a log line each
DEAD_SHARD = """
import json, socket, shardlimit
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
limiter = shardlimit.Limiter.from_json(json.dumps({"timeout_ms": 20, "log_interval": "1ms",
    "shards": [{"name": "dead", "url": f"redis://127.0.0.1:{port}"}],
    "policies": {"api": {"rate": "10/minute"}}}))
limiter.subscribe(lambda e: None)
for i in range(100):
    assert limiter.check(f"k{i}", "api").source == "fallback"
"""

# events still queued when the limiter is closed
AFTER_CLOSE = """
import shardlimit
limiter = shardlimit.Limiter.from_json('{"policies": {"free": "10/day"}}')
limiter.subscribe(lambda e: None)
for _ in range(60):
    limiter.check("tenant:7", "free")
limiter.close()
"""

# a parent with events and children of every start method, each with its own
CHILDREN = 5
MULTIPROCESS = """
import multiprocessing as mp, sys, shardlimit

def child() -> None:
    limiter = shardlimit.Limiter.from_json('{"policies": {"free": "10/day"}}')
    limiter.subscribe(lambda e: None)
    for _ in range(60):
        limiter.check("tenant:7", "free")

if __name__ == "__main__":
    parent = shardlimit.Limiter.from_json('{"policies": {"free": "10/day"}}')
    parent.subscribe(lambda e: None)
    for _ in range(60):
        parent.check("tenant:7", "free")
    methods = ["spawn", "fork", "forkserver", "spawn", "fork"][:%d]
    procs = [mp.get_context(m).Process(target=child) for m in methods]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    print("CHILD_EXIT_CODES", *(p.exitcode for p in procs))
""" % CHILDREN


def _run(script: Path, deadline: float) -> tuple[int, str, str]:
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    try:
        r = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=max(0.1, deadline - time.monotonic()),
            env=env,
        )
    except subprocess.TimeoutExpired:
        return -1, "", f"still running {DEADLINE_S:.0f} s after the test started"
    # the dead shard's warnings (logging's last-resort handler: its policy fell back, its
    # circuit opened, which depends on how fast the failures come) are expected; anything
    # else (a panic trace, a fatal error, a traceback) is not
    expected = ("shardlimit: policy `api` fell back", "shardlimit: circuit of shard `dead` opened")
    err = "".join(line for line in r.stderr.splitlines(keepends=True) if not line.startswith(expected))
    return r.returncode, r.stdout, err


def test_interpreters_exit_cleanly_in_every_shape(tmp_path: Path) -> None:
    shapes = {"readme": README, "dead_shard": DEAD_SHARD, "after_close": AFTER_CLOSE}
    # every child of a multiprocess run is a run of that shape: 50 children in all
    parents = RUNS // CHILDREN
    shapes["multiprocess"] = MULTIPROCESS
    scripts = {}
    for name, code in shapes.items():
        scripts[name] = tmp_path / f"{name}.py"
        scripts[name].write_text(code)
    jobs = [(name, scripts[name]) for name in ("readme", "dead_shard", "after_close") for _ in range(RUNS)]
    jobs += [("multiprocess", scripts["multiprocess"])] * parents
    started = time.monotonic()
    deadline = started + DEADLINE_S

    def job(j: tuple[str, Path]) -> tuple[str, int, str, str]:
        code, out, err = _run(j[1], deadline)
        return j[0], code, out, err

    with concurrent.futures.ThreadPoolExecutor(max_workers=4 * (os.cpu_count() or 2)) as pool:
        results = list(pool.map(job, jobs))
    took = time.monotonic() - started
    failures = []
    counts = {name: 0 for name in shapes}
    for name, rc, out, err in results:
        if name == "multiprocess":
            line = next((x for x in out.splitlines() if x.startswith("CHILD_EXIT_CODES")), None)
            child_codes = [int(c) for c in line.split()[1:]] if line else []
            counts[name] += sum(c == 0 for c in child_codes)
            if len(child_codes) != CHILDREN or any(child_codes):
                failures.append((name, f"children exited {child_codes}", err[-2000:]))
        else:
            counts[name] += rc == 0 and not err
        if rc != 0 or err:
            failures.append((name, f"exit {rc}", err[-2000:]))
    assert not failures, f"{len(failures)} unclean exits, the first: {failures[0]}"
    assert counts == {"readme": RUNS, "dead_shard": RUNS, "after_close": RUNS, "multiprocess": RUNS}
    assert took < DEADLINE_S, f"{len(jobs)} interpreters took {took:.1f} s"
