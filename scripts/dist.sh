#!/usr/bin/env bash
# `make dist`: writes dist/, what each registry would be sent, from ONE release build.
#
#   dist/python/  shardlimit-<v>-cp39-abi3-manylinux_2_28_x86_64.whl, shardlimit-<v>.tar.gz
#   dist/npm/     shardlimit-<v>.tgz (JS, .d.ts, no binary, no install script) and
#                 shardlimit-binding-linux-x64-gnu-<v>.tgz (the .node file)
#   dist/c/       shardlimit-<v>-x86_64-unknown-linux-gnu.tar.gz (the C/C++ SDK)
#   dist/go/      the Go module as a module proxy serves it (GOPROXY=file://$PWD/dist/go)
#   dist/crates/  `cargo package` of shardlimit, shardlimit-tower, shardlimit-cli (verified)
#   dist/bin/     shardlimit and shardlimit-serve, static executables (x86_64 musl)
#   dist/java/    shardlimit-<v>.jar (natives/linux-x86_64 inside), -sources, -javadoc, .pom,
#                 and shardlimit-spring-boot-starter-<v> (.jar, .pom) (scripts/dist-java.sh)
#
# The build: `cargo zigbuild --profile dist --target x86_64-unknown-linux-gnu.2.28` of the
# C ABI, the Node addon, the Python extension and the JNI library in one invocation, so the core and its
# dependencies compile once; zig (ziglang from PyPI, through cargo-zigbuild) links them
# against glibc 2.28's symbols, the floor of manylinux_2_28 (Debian 10+, Ubuntu 18.10+,
# RHEL 8+). The wheel is packed from that build (scripts/build-wheel.py) rather than by
# `maturin build`, which would compile everything again. The suites (scripts/test-c.sh,
# test-python.sh, test-node.sh) and scripts/test-dist.sh test these files.
# The build and the packing of one platform's artifacts are scripts/platforms.sh's
# (platform_build, platform_pack), which `make dist-all` (scripts/dist-all.sh) runs for
# every other platform too; this script builds the host's (linux-x64 glibc) only.
# Honours CARGO_TARGET_DIR; the tools go to $CARGO_TARGET_DIR/tools.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/lib.sh
. scripts/platforms.sh

ensure_rust
ensure_dist_tools
target=$(target_dir)
triple=x86_64-unknown-linux-gnu
version=$(workspace_version)
DIST=${DIST_DIR:-$root/dist}
stage="$target/dist-stage"
t0=$(date +%s)

# the C ABI, the Node addon, the Python extension and the JNI library, in one build
platform_build "$triple" shardlimit-c shardlimit-node shardlimit-python shardlimit-java

rm -rf "$DIST" "$stage"
mkdir -p "$DIST"/{python,npm,c,go,crates,bin} "$stage"

echo "== dist/bin: shardlimit and shardlimit-serve, static (x86_64-unknown-linux-musl)"
# musl's libc is linked in: one file that runs on any x86_64 Linux, and in a FROM scratch
# container (examples/serve/Containerfile)
musl=x86_64-unknown-linux-musl
rustup target list --installed 2>/dev/null | grep -qx "$musl" || rustup target add "$musl"
# zig (cargo-zigbuild) is the C compiler and linker for musl: ring's C needs one, and no
# x86_64-linux-musl-gcc is needed on the machine
cargo zigbuild --quiet --locked --profile dist --target "$musl" -p shardlimit-serve -p shardlimit-cli
for b in shardlimit shardlimit-serve; do
  cp "$target/$musl/dist/$b" "$DIST/bin/"
  # static: no dynamic section, so no NEEDED libraries and no interpreter
  if readelf -d "$DIST/bin/$b" 2>/dev/null | grep -q NEEDED; then
    echo "dist/bin/$b is not static: $(readelf -d "$DIST/bin/$b" | grep NEEDED)" >&2
    exit 1
  fi
done
"$DIST/bin/shardlimit-serve" --version >/dev/null

echo "== dist/c, dist/python, dist/npm: the SDK, the wheel and the platform package of $triple"
platform_pack "$triple" "$DIST"
"$TOOLS_BIN/maturin" sdist -m bindings/python/Cargo.toml -o "$DIST/python" >"$stage/sdist.log" 2>&1 ||
  { cat "$stage/sdist.log" >&2; exit 1; }
# the main npm package names exactly the platform packages in dist/npm
platform "$triple"
node scripts/npm-packages.js main "$stage" "$DIST/npm" "$P_NPM" >/dev/null

echo "== dist/java: the jar (natives/linux-x86_64 inside), sources, javadoc, POM"
DIST_DIR="$DIST" scripts/dist-java.sh "$(platform_out "$triple")/libshardlimit_jni.so"

echo "== dist/go: the Go module for GOPROXY=file://"
"$TOOLS_PY" scripts/go-proxy.py "$version" "$(git log -1 --format=%cI 2>/dev/null || date -u +%FT%TZ)" "$DIST/go" >/dev/null

echo "== dist/crates: cargo package (verified: each crate builds from its .crate)"
# one invocation: the crates depend on each other, and cargo packages them in order
# --allow-dirty: a local `make dist` may have uncommitted changes (the .crate records it)
# cargo verifies shardlimit-tower and shardlimit-cli against the shardlimit it packaged, through a
# temporary registry in $target/package, and unpacks that registry's crates into
# $CARGO_HOME/registry/src/<hash of the registry's path>/. It never unpacks a crate again that it
# finds unpacked there, so a clone at the path of an earlier one (a CI checkout) was verified
# against the earlier clone's sources. Our own crates are never fetched from anywhere: remove
# their unpacked copies so this run's are the ones verified.
for c in shardlimit shardlimit-tower shardlimit-cli; do
  rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"$c-$version"
done
cargo package --quiet --locked --allow-dirty -p shardlimit -p shardlimit-tower -p shardlimit-cli
cp "$target/package/shardlimit-$version.crate" "$target/package/shardlimit-tower-$version.crate" \
  "$target/package/shardlimit-cli-$version.crate" "$DIST/crates/"

echo "== dist/ ($(( $(date +%s) - t0 )) s)"
(cd "$DIST" && find . -type f | sort | while read -r f; do printf "%8s  %s\n" "$(numfmt --to=iec --suffix=B "$(stat -c %s "$f")")" "${f#./}"; done)
