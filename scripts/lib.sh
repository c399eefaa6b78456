# Shared helpers for the project's scripts. Source it: `. scripts/lib.sh`.
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

# ensure_redis: makes redis-server and redis-cli available.
ensure_redis() {
  command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 && return 0
  apt_install redis-server redis-tools
}

# ensure_rust: cargo with rustfmt and clippy.
ensure_rust() {
  command -v cargo >/dev/null 2>&1 || { echo "cargo not found: install Rust with rustup" >&2; return 1; }
  rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy
}
