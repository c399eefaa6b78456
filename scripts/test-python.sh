#!/usr/bin/env bash
# The Python binding's suite: installs the release wheel from dist/python (`make dist`;
# built by scripts/dist.sh when missing), type-checks the package, its stub, tests and
# benchmark with mypy, and runs pytest against real redis-server processes that the tests
# start on free 127.0.0.1 ports. Installs what is missing (Debian, as root).
#
#   scripts/test-python.sh            # from the repository root
#   PYTHON=python3.12 scripts/test-python.sh
#   SHARDLIMIT_PY_BENCH=1 scripts/test-python.sh   # also run bindings/python/bench
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_redis
DIST=${DIST_DIR:-$PWD/dist}
version=$(workspace_version)
wheel="$DIST/python/shardlimit-$version-cp39-abi3-manylinux_2_28_x86_64.whl"
[ -f "$wheel" ] || scripts/dist.sh

PYTHON=${PYTHON:-python3}
VENV=${SHARDLIMIT_PY_VENV:-.venv}

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  apt_install python3 python3-venv python3-pip
fi
"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 9):
    sys.exit(f"Python >= 3.9 is needed, found {sys.version.split()[0]}")
PY
if [ ! -x "$VENV/bin/python" ]; then
  # Debian's python3 needs python3-venv to make a venv with pip
  "$PYTHON" -m venv "$VENV" 2>/dev/null || { apt_install python3-venv; rm -rf "$VENV"; "$PYTHON" -m venv "$VENV"; }
fi
PY="$(cd "$VENV" && pwd)/bin/python"

echo "== python tools ($("$PY" --version))"
"$PY" -m pip install -q --disable-pip-version-check --upgrade pip
"$PY" -m pip install -q --disable-pip-version-check \
  "pytest>=8" "mypy>=1.10" "starlette>=0.37" "httpx>=0.27" "flask>=3" "fastapi>=0.110" \
  "gunicorn>=22" "uvicorn>=0.29" "trio>=0.22" "django>=4.2" \
  "redis>=5" "limits[redis,async-redis]>=4"

echo "== pip install $(basename "$wheel")"
"$PY" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"
"$PY" - <<'PY'
import pathlib, shardlimit, shardlimit._shardlimit as ext
so = pathlib.Path(ext.__file__).name
assert ".abi3." in so, f"not an abi3 extension: {so}"
assert "site-packages" in shardlimit.__file__, f"not the installed package: {shardlimit.__file__}"
print(f"installed shardlimit {shardlimit.__version__} ({so})")
PY

cd bindings/python
echo "== mypy"
"$PY" -m mypy

echo "== pytest"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
"$PY" -m pytest -p no:cacheprovider 2>&1 | tee "$log" || status=$?
if [ "$status" -ne 0 ]; then
  echo "pytest failed (exit $status)" >&2
  exit "$status"
fi
passed=$(grep -Eo '[0-9]+ passed' "$log" | tail -1 | awk '{print $1}')
if [ -z "$passed" ] || [ "$passed" -eq 0 ]; then
  echo "pytest ran no test" >&2
  exit 1
fi
echo "Python: $passed passed, 0 failed"

if [ -n "${SHARDLIMIT_PY_BENCH:-}" ]; then
  echo "== benchmark: shardlimit vs limits"
  "$PY" bench/bench_vs_limits.py
fi

echo "== examples/python: FastAPI app smoke test (real redis-server and uvicorn on 127.0.0.1)"
"$PY" -m pip install -q --disable-pip-version-check -r ../../examples/python/requirements.txt
(cd ../../examples/python && "$PY" -m pytest -p no:cacheprovider -q)
