"""Cross-language override test (issue 18): Python sets a tenant's override on a real Redis,
and long-lived Rust, Node and Go limiters, which have each checked the tenant before (with
the policy's limit), decide their very next check with it; then Python deletes it and
their next check is the policy's again. Run by scripts/test-overrides.sh, which builds the
workers and starts the Redis.

    python3 tests/cross/overrides.py REDIS_PORT RUST_WORKER GO_WORKER NODE_ADDON
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import shardlimit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY = "tenant:acme"
POLICY = "api"


def main() -> int:
    port, rust, go, addon = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    config = {
        "timeout_ms": 2000,
        "shards": [{"name": "s0", "url": f"redis://127.0.0.1:{port}"}],
        "policies": {
            # a free plan of 5 a day; the override moves the tenant to 1000 a day
            POLICY: {"algorithm": "fixed_window", "limit": 5, "window": "1d", "overrides": True}
        },
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
        path = f.name
    node_env = dict(os.environ, SHARDLIMIT_NATIVE_LIBRARY=addon)
    commands = {
        "rust": ([rust, "--config", path, "--policy", POLICY, "--key", KEY], None),
        "go": ([go, "-config", path, "-policy", POLICY, "-key", KEY], None),
        "node": (
            ["node", os.path.join(ROOT, "tests", "cross", "override-worker.js"), path, POLICY, KEY],
            node_env,
        ),
    }
    workers = {
        lang: subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        for lang, (cmd, env) in commands.items()
    }
    python = shardlimit.Limiter.from_config(path)
    failures = []

    def check_all(step: str, want_limit: int) -> None:
        """One check in each language, one after another (each sees the others' units)."""
        decisions = {"python": python.check(KEY, POLICY)}
        for lang, w in workers.items():
            assert w.stdin is not None and w.stdout is not None
            w.stdin.write("check\n")
            w.stdin.flush()
            line = w.stdout.readline()
            if not line:
                raise SystemExit(f"the {lang} worker exited")
            decisions[lang] = json.loads(line)
        for lang, d in decisions.items():
            limit = d.limit if lang == "python" else d.get("limit")
            policy = d.policy if lang == "python" else d.get("policy")
            ok = limit == want_limit and policy == POLICY
            print(f"{step:<28} {lang:<7} limit={limit} policy={policy} {'ok' if ok else 'WRONG'}")
            if not ok:
                failures.append(f"{step}: {lang} decided with {d}")

    try:
        check_all("before (the free plan)", 5)
        python.set_override(KEY, POLICY, "1000/day")
        check_all("after Python set_override", 1000)
        python.set_override(KEY, POLICY, {"limit": 20, "window": "1d"})
        check_all("after a second change", 20)
        assert python.delete_override(KEY, POLICY)
        check_all("after delete_override", 5)
    finally:
        for w in workers.values():
            assert w.stdin is not None
            w.stdin.close()
        for w in workers.values():
            w.wait(timeout=10)
        os.unlink(path)
    if failures:
        print("\n".join(failures), file=sys.stderr)
        return 1
    print("every language decided its next check with the override Python set")
    return 0


if __name__ == "__main__":
    sys.exit(main())
