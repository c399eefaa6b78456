#!/usr/bin/env bash
# Writes shardlimit.pc (dynamic) and shardlimit-static.pc (libshardlimit.a) for a built
# library:
#   bindings/c/gen-pkgconfig.sh LIBDIR INCLUDEDIR OUTDIR
# e.g. bindings/c/gen-pkgconfig.sh "$PWD/target/release" "$PWD/include" "$PWD/target/release/pkgconfig"
# then: PKG_CONFIG_PATH=$PWD/target/release/pkgconfig pkg-config --cflags --libs shardlimit
# LIBDIR and INCLUDEDIR may be relative to the .pc file: '${pcfiledir}/..' (the SDK's).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
libdir="$1" includedir="$2" outdir="$3"
version="$(sed -n 's/^#define SHARDLIMIT_VERSION "\(.*\)"$/\1/p' "$root/include/shardlimit.h")"
[ -n "$version" ] || { echo "no SHARDLIMIT_VERSION in include/shardlimit.h" >&2; exit 1; }
url="$(sed -n 's/^repository = "\(.*\)"$/\1/p' "$root/Cargo.toml")"
# What libshardlimit.a needs from the system: the C library's math, threads and dynamic
# loading (separate libraries before glibc 2.34). Not -lgcc_s: the compiler driver adds
# the unwinder itself (libgcc_s when linking dynamically, libgcc_eh with -static).
# Another platform's SDK (scripts/platforms.sh) sets both: PC_NATIVE_LIBS (macOS: its
# frameworks) and PC_STATIC_LIB (Apple's ld has no -l:FILE).
native="${PC_NATIVE_LIBS:--lpthread -lm -ldl}"
static_lib="${PC_STATIC_LIB:--l:libshardlimit.a}"
mkdir -p "$outdir"
for name in shardlimit shardlimit-static; do
  sed -e "s|@LIBDIR@|$libdir|" -e "s|@INCLUDEDIR@|$includedir|" -e "s|@VERSION@|$version|" \
    -e "s|@URL@|$url|" -e "s|@NATIVE_LIBS@|$native|" -e "s|@STATIC_LIB@|$static_lib|" "$here/$name.pc.in" > "$outdir/$name.pc"
  echo "$outdir/$name.pc"
done
