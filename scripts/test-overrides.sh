#!/usr/bin/env bash
# The cross-language override test (issue 18): Python sets a tenant's override on a real
# Redis, and long-lived Rust, Node and Go limiters that have checked the tenant before see
# it on their very next check (tests/cross/overrides.py). Run by scripts/test.sh after the
# bindings' suites. Builds the workers as `make demo` does (one `cargo build --profile demo`
# of the Rust worker, the Python extension, the Node addon and libshardlimit for Go; then
# `go build` of bindings/go/cmd/override-worker), cached on reruns.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/lib.sh

ensure_redis
ensure_rust
ensure_go
OUT=$(target_dir)/demo
PY=$(python3 -c 'import sys; print(sys.executable)')
WORK=$(mktemp -d)
REDIS_PID=
cleanup() {
  [ -z "$REDIS_PID" ] || kill "$REDIS_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== builds (cargo --profile demo, go build)"
PYO3_PYTHON="$PY" PYO3_BUILD_EXTENSION_MODULE=1 \
  cargo build --profile demo --quiet --no-default-features --features shardlimit-python/extension-module \
  --package=shardlimit-demo-worker --package=shardlimit-python --package=shardlimit-node --package=shardlimit-c
rm -rf "$OUT/python"
mkdir -p "$OUT/python" "$OUT/node"
cp -R bindings/python/python/shardlimit "$OUT/python/"
cp "$OUT/lib_shardlimit.so" "$OUT/python/shardlimit/_shardlimit.abi3.so"
cp "$OUT/libshardlimit_node.so" "$OUT/node/shardlimit.node"
bindings/c/gen-pkgconfig.sh "$OUT" "$root/include" "$OUT/pkgconfig" >/dev/null
major=$(workspace_version); major=${major%%.*}
ln -sf libshardlimit.so "$OUT/libshardlimit.so.$major"
PKG_CONFIG_PATH="$OUT/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}" GOCACHE="$OUT/go-cache" \
  go -C bindings/go build -buildvcs=false -tags shardlimit_dynamic -o "$OUT/go-override-worker" ./cmd/override-worker

echo "== redis-server on a free 127.0.0.1 port"
port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
for _ in $(seq 200); do redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null || { cat "$WORK/redis.log" >&2; exit 1; }

echo "== Python sets the override; Rust, Node and Go see it on their next check"
LD_LIBRARY_PATH="$OUT${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONPATH="$OUT/python${PYTHONPATH:+:$PYTHONPATH}" \
  timeout 120 "$PY" tests/cross/overrides.py "$port" "$OUT/shardlimit-override-worker" \
  "$OUT/go-override-worker" "$OUT/node/shardlimit.node"
