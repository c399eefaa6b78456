#!/usr/bin/env bash
# Writes shardlimit.pc for a built library:
#   bindings/c/gen-pkgconfig.sh LIBDIR INCLUDEDIR OUTDIR
# e.g. bindings/c/gen-pkgconfig.sh "$PWD/target/release" "$PWD/include" "$PWD/target/release/pkgconfig"
# then: PKG_CONFIG_PATH=$PWD/target/release/pkgconfig pkg-config --cflags --libs shardlimit
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
libdir="$1" includedir="$2" outdir="$3"
version="$(sed -n 's/^#define SHARDLIMIT_VERSION "\(.*\)"$/\1/p' "$includedir/shardlimit.h")"
[ -n "$version" ] || { echo "no SHARDLIMIT_VERSION in $includedir/shardlimit.h" >&2; exit 1; }
mkdir -p "$outdir"
sed -e "s|@LIBDIR@|$libdir|" -e "s|@INCLUDEDIR@|$includedir|" -e "s|@VERSION@|$version|" \
  "$here/shardlimit.pc.in" > "$outdir/shardlimit.pc"
echo "$outdir/shardlimit.pc"
