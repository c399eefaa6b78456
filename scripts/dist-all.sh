#!/usr/bin/env bash
# `make dist-all`: the release artifacts of every platform that builds here, into dist/.
#
#   scripts/dist-all.sh                       every platform of scripts/platforms.sh
#   PLATFORMS="aarch64-unknown-linux-gnu" scripts/dist-all.sh    the host plus those
#
# First `make dist` (scripts/dist.sh: the host's artifacts, the static musl binaries, the
# sdist, the Go module, the crates), then for each other platform, one at a time, one
# `cargo zigbuild --profile dist` of the C ABI, the Node addon, the Python extension and
# the JNI library (a full release build: several minutes each on 2 cores) and its packing
# (scripts/platforms.sh): dist/c/shardlimit-<v>-<triple>.tar.gz,
# dist/python/shardlimit-<v>-cp39-abi3-<platform tag>.whl,
# dist/npm/shardlimit-binding-<npm tag>-<v>.tgz. Then the main npm package again, naming
# exactly the platform packages built, the jar again with every JNI library built
# (natives/<os>-<arch>/, scripts/dist-java.sh), and scripts/check-platforms.py on the result: what
# can be checked of each platform without running it (architecture, exported symbols,
# tags, minimum macOS version, a macOS program linked against the SDK).
# The emulated and musl runs are scripts/test-platforms.sh's (in `make test`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/lib.sh
. scripts/platforms.sh

t0=$(date +%s)
DIST=${DIST_DIR:-$root/dist}
export DIST_DIR=$DIST
host=${ALL_PLATFORMS[0]}
if [ -n "${PLATFORMS:-}" ]; then
  read -r -a others <<<"$PLATFORMS"
else
  others=("${ALL_PLATFORMS[@]:1}")
fi
for t in "${others[@]}"; do platform "$t"; done

scripts/dist.sh
ensure_dist_tools
command -v llvm-objdump >/dev/null 2>&1 || apt_install llvm
stage="$(target_dir)/dist-stage"
platform "$host"
tags=("$P_NPM")
java_natives=()
for t in "${others[@]}"; do
  [ "$t" = "$host" ] && continue
  t1=$(date +%s)
  # nice: a full release build per platform, one at a time
  nice -n 10 bash -c '. scripts/lib.sh && . scripts/platforms.sh && ensure_dist_tools && platform_build "$1" shardlimit-c shardlimit-node shardlimit-python shardlimit-java' _ "$t"
  platform_pack "$t" "$DIST"
  tags+=("$P_NPM")
  [ -z "$P_JAVA" ] || java_natives+=("$P_JAVA=$(platform_out "$t")/$(platform_cdylib shardlimit_jni)")
  echo "== $t: built and packed in $(($(date +%s) - t1)) s"
done
echo "== dist/npm: the main package, naming ${tags[*]}"
node scripts/npm-packages.js main "$stage" "$DIST/npm" "${tags[@]}" >/dev/null
echo "== dist/java: the jar with the JNI libraries of ${java_natives[*]%%=*} too"
platform "$host"
DIST_DIR="$DIST" scripts/dist-java.sh "$(platform_out "$host")/$(platform_cdylib shardlimit_jni)" "${java_natives[@]}"
echo "== scripts/check-platforms.py"
# the macOS link check links against the same stubs as the macOS builds
"$TOOLS_PY" scripts/macos-stubs.py "$(target_dir)/macos-stubs" >/dev/null
MACOS_STUBS="$(target_dir)/macos-stubs" "$TOOLS_PY" scripts/check-platforms.py "$DIST"

echo "== dist/ ($(($(date +%s) - t0)) s)"
(cd "$DIST" && find . -type f | sort | while read -r f; do printf "%8s  %s\n" "$(numfmt --to=iec --suffix=B "$(stat -c %s "$f")")" "${f#./}"; done)
