#!/usr/bin/env bash
# The C SDK of the platforms this machine can run besides its own (make test):
#   linux-arm64 (glibc)  a C program built against the aarch64 SDK with its pkg-config
#                        file (zig cc, glibc 2.28), run under qemu-aarch64 (Debian's
#                        qemu-user-static, with Debian's arm64 glibc as its sysroot)
#   linux-x64 musl       a C program linked statically against the x86_64-musl SDK's
#                        libshardlimit.a (no loader, no libc.so: it runs on any x86_64
#                        Linux), and one linked against its libshardlimit.so, run by
#                        musl's loader; both built by zig cc for x86_64-linux-musl with
#                        the SDK's pkg-config flags (the static one names the archive
#                        itself, as shardlimit-static.pc's -l:libshardlimit.a is GNU ld's
#                        and lld's, not zig's driver's; Debian's musl-gcc would add glibc's
#                        libgcc_eh; -lunwind is zig's unwinder where gcc -static adds
#                        libgcc_eh itself)
#   linux-arm64 musl     with --dist only (make test builds no aarch64 musl SDK): a C
#                        program linked statically against the aarch64-musl SDK's
#                        libshardlimit.a, run under qemu-aarch64
# Each makes 8 checks of one key against a redis-server on a free 127.0.0.1 port, under a
# fixed window of 5 per hour with on_error "error" (a failing Redis is an error, never a
# fallback decision), and fails unless exactly the first 5 were admitted, each decided
# by the Redis shard (scripts/dist-tests/check.c).
#
# The SDKs are packed by scripts/platforms.sh's pack_c_sdk, as make dist-all packs them,
# from a build of the C ABI alone in the dev profile (unoptimized: the release profile's
# LTO would take minutes per platform of make test's budget; make dist-all builds those).
#   scripts/test-platforms.sh           build (PLATFORM_TEST_PROFILE, default dev) and run
#   scripts/test-platforms.sh --dist    run the SDKs of dist/c (make dist-all) instead
# Installs what is missing. Honours CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/lib.sh
DIST_PROFILE=${PLATFORM_TEST_PROFILE:-dev}
. scripts/platforms.sh

from_dist=
[ "${1:-}" = --dist ] && from_dist=1
DIST=${DIST_DIR:-$root/dist}
version=$(workspace_version)
ensure_redis
ensure_rust
ensure_dist_tools
apt_install qemu-user-static libc6-arm64-cross libgcc-s1-arm64-cross musl pkg-config binutils
home=$(mktemp -d)
cleanup() {
  stop_started_redis
  wait 2>/dev/null || true
  rm -rf "$home"
}
trap cleanup EXIT
passed=0
t0=$(date +%s)

# sdk TRIPLE: the unpacked SDK of TRIPLE (built and packed here, or from dist/c)
sdk() {
  local triple=$1 tgz
  if [ -n "$from_dist" ]; then
    tgz="$DIST/c/shardlimit-$version-$triple.tar.gz"
    [ -f "$tgz" ] || { echo "no $tgz: run make dist-all first" >&2; return 1; }
  else
    nice -n 10 bash -c '. scripts/lib.sh && DIST_PROFILE=$2 && . scripts/platforms.sh && ensure_dist_tools && platform_build "$1" shardlimit-c' \
      _ "$triple" "$DIST_PROFILE" >&2
    pack_c_sdk "$triple" "$home/dist" >&2
    tgz="$home/dist/c/shardlimit-$version-$triple.tar.gz"
  fi
  mkdir -p "$home/sdk"
  tar -C "$home/sdk" -xzf "$tgz"
  echo "$home/sdk/shardlimit-$version-$triple"
}

# cc_with COMPILER... -- SDK OUT PCMODULE [FLAGS...]: check.c built with the SDK's pkg-config flags
cc_with() {
  local cc=()
  while [ "$1" != -- ]; do cc+=("$1"); shift; done
  shift
  local sdk=$1 out=$2 module=$3
  shift 3
  # shellcheck disable=SC2046
  "${cc[@]}" -std=c11 -Wall -Wextra -Werror "$@" scripts/dist-tests/check.c -o "$out" \
    $(PKG_CONFIG_PATH="$sdk/lib/pkgconfig" pkg-config --cflags --libs "$module")
}

# cc_musl_static ARCH SDK OUT: check.c linked statically against the SDK's libshardlimit.a
cc_musl_static() {
  local arch=$1 sdk=$2 out=$3
  # shellcheck disable=SC2046
  "$TOOLS_PY" -m ziglang cc -target "$arch-linux-musl" -static -std=c11 -Wall -Wextra -Werror scripts/dist-tests/check.c \
    -o "$out" -I"$sdk/include" "$sdk/lib/libshardlimit.a" \
    $(PKG_CONFIG_PATH="$sdk/lib/pkgconfig" pkg-config --static --libs-only-l shardlimit | sed 's/-lshardlimit//') -lunwind
  if readelf -l "$out" | grep -q INTERP || readelf -d "$out" | grep -q NEEDED; then
    echo "$(basename "$out") is not static" >&2; return 1
  fi
}

# expect_limit OUTPUT: the program's line saying it admitted exactly the limit
expect_limit() {
  grep -qx "c: admitted 5 of 8 (limit 5)" <<<"$1" || { echo "$1" >&2; echo "not exactly the limit" >&2; return 1; }
}

echo "== linux-arm64 (aarch64-unknown-linux-gnu): the C SDK under qemu-aarch64"
port=$(start_redis)
sdk_arm=$(sdk aarch64-unknown-linux-gnu)
# zig: a C compiler for aarch64 with glibc 2.28 (the one that linked the SDK)
cc_with "$TOOLS_PY" -m ziglang cc -target aarch64-linux-gnu.2.28 -- "$sdk_arm" "$home/check-arm64" shardlimit
readelf -h "$home/check-arm64" | grep -q 'Machine:.*AArch64' || { echo "check-arm64 is not AArch64" >&2; exit 1; }
readelf -d "$home/check-arm64" | grep -q "NEEDED.*\[libshardlimit.so.${version%%.*}\]"
out=$(qemu-aarch64-static -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH="$sdk_arm/lib" "$home/check-arm64" "$port" "$version")
expect_limit "$out"
echo "ok: $out (AArch64, emulated, libshardlimit.so.${version%%.*} of the SDK)"
passed=$((passed + 1))

echo "== linux-x64 musl (x86_64-unknown-linux-musl): the C SDK, static and dynamic"
redis-cli -p "$port" FLUSHALL >/dev/null
sdk_musl=$(sdk x86_64-unknown-linux-musl)
cc_musl_static x86_64 "$sdk_musl" "$home/check-musl-static"
out=$(env -i "$home/check-musl-static" "$port" "$version")
expect_limit "$out"
echo "ok: $out (static musl executable, libshardlimit.a of the SDK)"
passed=$((passed + 1))
redis-cli -p "$port" FLUSHALL >/dev/null
cc_with "$TOOLS_PY" -m ziglang cc -target x86_64-linux-musl -- "$sdk_musl" "$home/check-musl-dynamic" shardlimit
readelf -l "$home/check-musl-dynamic" | grep -q 'interpreter: /lib/ld-musl-x86_64.so.1' ||
  { echo "check-musl-dynamic is not loaded by musl's loader" >&2; exit 1; }
out=$(env -i LD_LIBRARY_PATH="$sdk_musl/lib" "$home/check-musl-dynamic" "$port" "$version")
expect_limit "$out"
echo "ok: $out (musl's loader, libshardlimit.so.${version%%.*} of the SDK)"
passed=$((passed + 1))

if [ -n "$from_dist" ]; then
  # (make dist-all's only: make test builds no aarch64 musl SDK)
  echo "== linux-arm64 musl (aarch64-unknown-linux-musl): the C SDK, static, under qemu-aarch64"
  redis-cli -p "$port" FLUSHALL >/dev/null
  sdk_arm_musl=$(sdk aarch64-unknown-linux-musl)
  cc_musl_static aarch64 "$sdk_arm_musl" "$home/check-arm64-musl-static"
  readelf -h "$home/check-arm64-musl-static" | grep -q 'Machine:.*AArch64' || { echo "check-arm64-musl-static is not AArch64" >&2; exit 1; }
  out=$(env -i "$(command -v qemu-aarch64-static)" "$home/check-arm64-musl-static" "$port" "$version")
  expect_limit "$out"
  echo "ok: $out (static AArch64 musl executable, emulated, libshardlimit.a of the SDK)"
  passed=$((passed + 1))
fi

echo "platforms: $passed passed, 0 failed ($(($(date +%s) - t0)) s)"
