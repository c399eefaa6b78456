#!/usr/bin/env bash
# `make test-dist-all`: runs what this machine can run of `make dist-all`'s other platforms,
# on the files in dist/ (never the source tree), each against a redis-server on a free
# 127.0.0.1 port, making 8 checks of one key under a fixed window of 5 per hour and failing
# unless exactly the first 5 were admitted, each decided by the Redis shard
# (scripts/dist-tests/check.*):
#   the C SDKs         scripts/test-platforms.sh --dist: linux-arm64 glibc under qemu-aarch64,
#                      x86_64 musl static and through musl's loader, aarch64 musl static
#                      under qemu-aarch64
#   linux-arm64 wheel  installed by pip (for the manylinux_2_28_aarch64 platform) into a
#                      venv of Debian's arm64 python3, which imports it under qemu-aarch64
#   linux-arm64 npm    both tarballs installed by npm (--cpu=arm64 --os=linux
#                      --libc=glibc --force) into an empty project, run by Debian's arm64 node
#                      under qemu-aarch64 (check.cjs and check.mjs)
#   windows-x64 C SDK  check.c built by zig cc for x86_64-windows-gnu with shardlimit.pc's
#                      flags (the import library), run by Debian's wine64 with the SDK's
#                      shardlimit.dll beside it (a Windows program's TCP to 127.0.0.1);
#                      wine 8 lacks bcryptprimitives.dll, so the test builds its own
#                      (scripts/dist-tests/bcryptprimitives.c) beside the program
#   scripts/test-dist-all.sh [TEST...]   all, or the TESTs named: sdks, windows-c,
#                                        wheel-arm64, npm-arm64
# Not in `make test`: the artifacts are `make dist-all`'s (a release build per platform).
# What it does not run, and why: RELEASING.md.
#
# Debian's arm64 python3 and nodejs come from the machine's own Debian mirror (read from
# its apt sources), unpacked once into $CARGO_TARGET_DIR/tools/debian-arm64 (debootstrap
# --download-only, then dpkg-deb -x of each package; nothing is configured or run as root
# inside it): qemu-aarch64-static -L takes it as the programs' root for every absolute path
# they open, so no chroot and no binfmt_misc registration are needed.
# Installs what is missing. Honours CARGO_TARGET_DIR and DIST_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/lib.sh
. scripts/platforms.sh

DIST=${DIST_DIR:-$root/dist}
version=$(workspace_version)
ensure_redis
ensure_dist_tools
apt_install qemu-user-static debootstrap wine64 pkg-config
command -v npm >/dev/null 2>&1 || { echo "npm not found: install Node.js (>= 18, with npm >= 10)" >&2; exit 1; }
home=$(mktemp -d)
wine=$(command -v wine64 || echo /usr/lib/wine/wine64)
wineserver=$(command -v wineserver || echo /usr/lib/wine/wineserver64)
# a wine prefix of this script's own, made on first use (about 20 s)
wine_prefix="$(target_dir)/tools/wine"
cleanup() {
  # the wineserver of this script's prefix (it would linger a few seconds)
  [ ! -d "$wine_prefix" ] || WINEPREFIX=$wine_prefix "$wineserver" -k 2>/dev/null || true
  stop_started_redis
  wait 2>/dev/null || true
  rm -rf "$home"
}
trap cleanup EXIT
passed=0
failed=0
t0=$(date +%s)

# ensure_arm64_root: Debian's arm64 python3 and nodejs, unpacked; sets ARM64_ROOT
ensure_arm64_root() {
  ARM64_ROOT="$(target_dir)/tools/debian-arm64"
  [ -f "$ARM64_ROOT/.unpacked" ] && return 0
  local suite mirror
  suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
  # the first non-security mirror of the machine's apt sources (deb822 or one-line format)
  mirror=${DEBIAN_MIRROR:-$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
    sed -n -e 's/^URIs: *\([^ ]*\).*/\1/p' -e 's/^deb \(\[[^]]*\] \)\{0,1\}\([^ ]*\).*/\2/p' | grep -v security | head -1)}
  [ -n "$suite" ] && [ -n "$mirror" ] || { echo "no Debian suite or mirror in /etc/os-release, /etc/apt (set DEBIAN_MIRROR)" >&2; return 1; }
  echo "== Debian $suite arm64: python3 and nodejs into $ARM64_ROOT"
  rm -rf "$ARM64_ROOT"
  mkdir -p "$ARM64_ROOT"
  debootstrap --download-only --arch=arm64 --variant=minbase --include=python3,python3-venv,nodejs \
    "$suite" "$ARM64_ROOT" "$mirror" >"$home/debootstrap.log" 2>&1 ||
    { tail -20 "$home/debootstrap.log" >&2; return 1; }
  local deb
  for deb in "$ARM64_ROOT"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$ARM64_ROOT"; done
  rm -f "$ARM64_ROOT"/var/cache/apt/archives/*.deb
  touch "$ARM64_ROOT/.unpacked"
}

arm64() {
  qemu-aarch64-static -L "$ARM64_ROOT" "$@"
}

# run NAME FUNCTION: one test, in a subshell that stops at its first failing command (set -e
# is off inside an `if`); its failure is counted and reported, and the others still run
run() {
  local name=$1 rc
  shift
  set +e
  (
    set -e
    "$@"
  )
  rc=$?
  set -e
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
  else
    echo "FAILED: $name" >&2
    failed=$((failed + 1))
  fi
}

t_sdks() {
  DIST_DIR="$DIST" scripts/test-platforms.sh --dist
}

t_wheel_arm64() {
  echo "== linux-arm64: the manylinux_2_28_aarch64 wheel, in Debian's arm64 python3 (qemu-aarch64)"
  local whl="$DIST/python/shardlimit-$version-cp39-abi3-manylinux_2_28_aarch64.whl" venv=$home/venv-arm64 port out py
  [ -f "$whl" ] || { echo "no $whl: run make dist-all first" >&2; return 1; }
  # the venv's own pip would run its python as a child process, which needs binfmt_misc:
  # this machine's pip installs for the arm64 platform into the venv's site-packages
  arm64 "$ARM64_ROOT/usr/bin/python3" -m venv --without-pip "$venv"
  py=$(cd "$venv/lib" && echo python3.*)
  "$TOOLS_PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --only-binary=:all: \
    --platform manylinux_2_28_aarch64 --implementation cp --python-version "${py#python}" \
    --target "$venv/lib/$py/site-packages" "$whl"
  port=$(start_redis)
  # (qemu-aarch64 runs AArch64 programs only)
  out=$(cd "$home" && arm64 "$venv/bin/python" "$root/scripts/dist-tests/check.py" "$port" "$version")
  echo "ok: $out (aarch64 CPython ${py#python}, emulated)"
}

t_npm_arm64() {
  echo "== linux-arm64: the main npm package and @shardlimit/binding-linux-arm64-gnu, in Debian's arm64 node (qemu-aarch64)"
  local proj=$home/npm-arm64 port out
  mkdir -p "$proj"
  # (--force: npm refuses a package whose cpu is not this machine's even with --cpu)
  (cd "$proj" && npm init -y --no-update-notifier >/dev/null &&
    npm install --offline --no-audit --no-fund --no-update-notifier --loglevel=error \
      --os=linux --cpu=arm64 --libc=glibc --force \
      "$DIST/npm/shardlimit-$version.tgz" "$DIST/npm/shardlimit-binding-linux-arm64-gnu-$version.tgz")
  [ -f "$proj/node_modules/@shardlimit/binding-linux-arm64-gnu/shardlimit.linux-arm64-gnu.node" ]
  cp scripts/dist-tests/check.cjs scripts/dist-tests/check.mjs "$proj/"
  port=$(start_redis)
  out=$(cd "$proj" && arm64 "$ARM64_ROOT/usr/bin/node" check.cjs "$port" "$version")
  echo "ok: $out (arm64 node $(arm64 "$ARM64_ROOT/usr/bin/node" --version), emulated)"
  redis-cli -p "$port" FLUSHALL >/dev/null
  out=$(cd "$proj" && arm64 "$ARM64_ROOT/usr/bin/node" check.mjs "$port")
  echo "ok: $out (ES module)"
}

t_windows_c() {
  echo "== windows-x64 (x86_64-pc-windows-gnu): the C SDK, a program run by wine"
  local tgz="$DIST/c/shardlimit-$version-x86_64-pc-windows-gnu.tar.gz" dir=$home/windows sdk port out
  [ -f "$tgz" ] || { echo "no $tgz: run make dist-all first" >&2; return 1; }
  mkdir -p "$dir"
  tar -C "$dir" -xzf "$tgz"
  sdk="$dir/shardlimit-$version-x86_64-pc-windows-gnu"
  # shellcheck disable=SC2046
  "$TOOLS_PY" -m ziglang cc -target x86_64-windows-gnu -std=c11 -Wall -Wextra -Werror scripts/dist-tests/check.c \
    -o "$dir/check.exe" $(PKG_CONFIG_PATH="$sdk/lib/pkgconfig" pkg-config --cflags --libs shardlimit)
  cp "$sdk/bin/shardlimit.dll" "$dir/"
  # wine 8 has no bcryptprimitives.dll (Windows 10+ does): the test's own, beside the program
  # (scripts/dist-tests/bcryptprimitives.c)
  "$TOOLS_PY" -m ziglang cc -target x86_64-windows-gnu -shared scripts/dist-tests/bcryptprimitives.c \
    -o "$dir/bcryptprimitives.dll" -ladvapi32
  port=$(start_redis)
  out=$(cd "$dir" && WINEPREFIX=$wine_prefix WINEDEBUG=-all "$wine" check.exe "$port" "$version" | tr -d '\r')
  grep -qx "c: admitted 5 of 8 (limit 5)" <<<"$out" || { echo "$out" >&2; echo "not exactly the limit" >&2; return 1; }
  echo "ok: $out (PE32+ under wine $("$wine" --version), shardlimit.dll of the SDK)"
}

tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(sdks windows-c wheel-arm64 npm-arm64)
for t in "${tests[@]}"; do
  case "$t" in
    sdks) run "the C SDKs (scripts/test-platforms.sh --dist)" t_sdks ;;
    windows-c) run "windows-x64 C SDK" t_windows_c ;;
    wheel-arm64) ensure_arm64_root && run "linux-arm64 wheel" t_wheel_arm64 ;;
    npm-arm64) ensure_arm64_root && run "linux-arm64 npm" t_npm_arm64 ;;
    *) echo "unknown test $t (sdks, windows-c, wheel-arm64, npm-arm64)" >&2; exit 2 ;;
  esac
done
echo "dist-all: $passed passed, $failed failed ($(($(date +%s) - t0)) s)"
[ "$failed" -eq 0 ]
