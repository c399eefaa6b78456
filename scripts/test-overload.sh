#!/usr/bin/env bash
# The overload suite: Redis healthy, every CPU of the machine made busy by processes this
# script starts and stops itself (killed by PID), the default timeout (50 ms) and on_error
# (open), so that a check falling back would show as an admission Redis did not grant.
# Each shape asserts admitted == limit exactly and zero fallbacks. Runs after `make dist`
# and the binding suites, on the artifacts they installed (scripts/test.sh runs it last):
#
#   overload_rust    (outside this script's busy processes: its tests saturate the CPUs
#                    themselves) 64 threads on one key through the blocking path, 20,000
#                    concurrent async checks, tasks of a multi-thread runtime
#                    (core/tests/overload.rs, `#[ignore]`d in the plain `cargo test`)
#   overload_python  8 processes x 32 threads on one key (sync check); 20,000 concurrent
#                    acheck, thread and host transport  (the wheel in $VENV, as
#                    scripts/test-python.sh installs it)
#   overload_node    20,000 concurrent check and an Express route hit 20,000 times over
#                    200 connections, thread and host transport  (the addon unpacked into
#                    bindings/node/node_modules by scripts/test-node.sh)
#   overload_go      2,000 goroutines x 10 checks on one key, host and thread transport
#                    (the C SDK of dist/c, through pkg-config, as scripts/test-c.sh)
#
#   scripts/test-overload.sh                 # every section (rust python node go)
#   scripts/test-overload.sh node python     # some
#
# Bounded: 130 s (Node), 70 s (Python), 40 s (Go) at most, about 1-2 min in all.
#
# Dev loop, without dist/: PY=path/to/venv/python (shardlimit installed by maturin
# develop), SHARDLIMIT_PKG_CONFIG_PATH=dir with shardlimit-static.pc (bindings/c/
# gen-pkgconfig.sh over a cargo build of shardlimit-c), and an addon built in
# bindings/node (`npm run build`).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
. scripts/lib.sh
ensure_redis

busy_pids=()
start_busy() {
  local n
  n=$(nproc)
  for _ in $(seq "$n"); do
    sh -c 'while :; do :; done' &
    busy_pids+=("$!")
  done
  echo "overload: $n busy processes (${busy_pids[*]}) keep every CPU saturated"
}
stop_busy() {
  local p
  for p in "${busy_pids[@]}"; do
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  busy_pids=()
}
trap stop_busy EXIT

overload_rust() {
  cargo test -p shardlimit --test overload --quiet -- --ignored --nocapture --test-threads 1
}

overload_python() {
  local py=${PY:-$root/${SHARDLIMIT_PY_VENV:-.venv}/bin/python}
  [ -x "$py" ] || { echo "overload_python: no $py (run scripts/test-python.sh first)" >&2; return 1; }
  (cd bindings/python && timeout 70 "$py" tests/overload_shapes.py)
}

overload_node() {
  [ -d bindings/node/node_modules/express ] || { echo "overload_node: run scripts/test-node.sh first" >&2; return 1; }
  (cd bindings/node && timeout 130 node test/overload/shapes.js)
}

go_test_bin=""
prepare_go() {
  ensure_go
  local pc=${SHARDLIMIT_PKG_CONFIG_PATH:-}
  if [ -z "$pc" ]; then
    # the SDK as scripts/test-c.sh unpacked it (at a path named by the tarball's hash)
    local version sdk_tar sdk_id base
    version="$(workspace_version)"
    sdk_tar="${DIST_DIR:-$root/dist}/c/shardlimit-$version-x86_64-unknown-linux-gnu.tar.gz"
    [ -f "$sdk_tar" ] || { echo "overload_go: no $sdk_tar (make dist)" >&2; return 1; }
    sdk_id="$(sha256sum "$sdk_tar" | cut -c1-16)"
    base="$(target_dir)/test-c/$sdk_id"
    if [ ! -d "$base/shardlimit-$version-x86_64-unknown-linux-gnu" ]; then
      mkdir -p "$base" && tar -C "$base" -xzf "$sdk_tar"
    fi
    pc="$base/shardlimit-$version-x86_64-unknown-linux-gnu/lib/pkgconfig"
    export GOCACHE="$base/go-cache"
  fi
  # compiled before the CPUs are made busy
  go_test_bin="$(mktemp -d)/overload.test"
  (cd bindings/go && PKG_CONFIG_PATH="$pc" go test -c -o "$go_test_bin" .)
}
overload_go() {
  (cd bindings/go && SHARDLIMIT_OVERLOAD=1 timeout 40 "$go_test_bin" -test.count=1 -test.v \
    -test.run '^TestOverloadManyGoroutinesOneKey$' | grep -E '^(ok|FAIL|PASS|---)|(ok|FAIL) +go ')
}

sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(rust python node go)
for s in "${sections[@]}"; do
  declare -F "overload_$s" >/dev/null || { echo "no section overload_$s" >&2; exit 2; }
  if declare -F "prepare_$s" >/dev/null; then "prepare_$s"; fi
done
failed=()
start=$(date +%s)
for s in "${sections[@]}"; do
  echo "== overload: $s"
  t0=$(date +%s)
  # the Rust tests make their own CPUs busy (and give Redis one of its own)
  if [ "$s" = rust ]; then stop_busy; elif [ ${#busy_pids[@]} -eq 0 ]; then start_busy; fi
  "overload_$s" || failed+=("$s")
  echo "   ($s: $(( $(date +%s) - t0 )) s)"
done
stop_busy
echo "overload: $(( $(date +%s) - start )) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "overload: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "overload: every shape admitted exactly its limit, no fallback"
