#!/usr/bin/env bash
# Tests of the C ABI and the Go and C++ examples that link it. Run from anywhere (it cds
# to the repository root); installs what is missing (Debian, as root):
#
#   1. runs the ABI's Rust tests;
#   2. regenerates include/shardlimit.h with cbindgen and fails if it changed;
#   3. builds the C test (-Wall -Wextra -Werror) against the shared library of the C SDK in
#      dist/c (`make dist`; built by scripts/dist.sh when missing) and runs it under
#      valgrind (any leak or memory error fails), then links it statically and runs it
#      again;
#   4. go vet + go test in bindings/go, linked to the SDK through pkg-config (and one short
#      run of the benchmark);
#   5. cmake + ctest of the C++ wrapper's tests (bindings/c/cpptest) against the SDK, and a
#      build of the C++ example (examples/cpp).
#
# Every test starts its own redis-server on a free 127.0.0.1 port and stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
. scripts/lib.sh

CBINDGEN_VERSION=0.29.4 # the header is byte-compared, so the generator is pinned

target="$(target_dir)"
version="$(workspace_version)"
DIST=${DIST_DIR:-$root/dist}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

step() { echo "== $*"; }

step "dependencies"
ensure_rust
apt_install redis-server gcc g++ make cmake pkg-config valgrind libgtest-dev
ensure_go
cbindgen="$(command -v cbindgen || true)"
if [ -z "$cbindgen" ] || [ "$("$cbindgen" --version)" != "cbindgen $CBINDGEN_VERSION" ]; then
  cbindgen="$target/tools/bin/cbindgen"
  if [ ! -x "$cbindgen" ] || [ "$("$cbindgen" --version)" != "cbindgen $CBINDGEN_VERSION" ]; then
    echo "installing cbindgen $CBINDGEN_VERSION into $target/tools"
    cargo install cbindgen --version "$CBINDGEN_VERSION" --locked --quiet --root "$target/tools"
  fi
fi

step "the C SDK (dist/c)"
sdk_tar="$DIST/c/shardlimit-$version-x86_64-unknown-linux-gnu.tar.gz"
[ -f "$sdk_tar" ] || scripts/dist.sh
# Unpacked at a path named by the tarball's hash, with a Go build cache of its own there:
# the go command does not rerun pkg-config to key its cache, so a cached package would
# keep linking the -L of an SDK unpacked elsewhere (or of an older build).
sdk_id="$(sha256sum "$sdk_tar" | cut -c1-16)"
sdk_base="$target/test-c/$sdk_id"
sdk="$sdk_base/shardlimit-$version-x86_64-unknown-linux-gnu"
if [ ! -d "$sdk" ]; then
  rm -rf "$target/test-c"
  mkdir -p "$sdk_base"
  tar -C "$sdk_base" -xzf "$sdk_tar"
fi
export GOCACHE="$sdk_base/go-cache"
lib="$sdk/lib"
# the SDK carries the committed headers: the ones tested here
cmp include/shardlimit.h "$sdk/include/shardlimit.h"
cmp include/shardlimit.hpp "$sdk/include/shardlimit.hpp"
step "cargo test -p shardlimit-c"
if ! cargo test --quiet -p shardlimit-c >"$work/cargo-test.log" 2>&1; then
  tail -60 "$work/cargo-test.log"
  echo "cargo test -p shardlimit-c failed" >&2
  exit 1
fi
grep -E "^test result" "$work/cargo-test.log"

step "header is up to date (cbindgen $CBINDGEN_VERSION)"
cp include/shardlimit.h "$work/committed.h"
"$cbindgen" --quiet --config bindings/c/cbindgen.toml --crate shardlimit-c --output include/shardlimit.h
if ! cmp -s "$work/committed.h" include/shardlimit.h; then
  diff -u "$work/committed.h" include/shardlimit.h | head -60 || true
  echo "include/shardlimit.h was stale: it has been regenerated; review and commit it" >&2
  exit 1
fi
if git ls-files --error-unmatch include/shardlimit.h >/dev/null 2>&1; then
  git diff --exit-code include/shardlimit.h
else
  echo "note: include/shardlimit.h is not committed yet"
fi

step "pkg-config"
export PKG_CONFIG_PATH="$lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
echo "shardlimit $(pkg-config --modversion shardlimit): $(pkg-config --cflags --libs shardlimit)"

step "C test under valgrind"
cflags=(-std=c11 -g -O1 -Wall -Wextra -Werror -pedantic)
cc "${cflags[@]}" $(pkg-config --cflags shardlimit) bindings/c/ctest/test_shardlimit.c \
  -o "$work/test_shardlimit" $(pkg-config --libs shardlimit) -Wl,-rpath,"$lib" -lpthread
# --child-silent-after-fork: the fork test's child inherits the parent's runtime, which
# the core leaks on purpose there (its threads do not exist in the child); the child
# reports its result to the parent through a pipe, and the parent is fully checked.
valgrind --quiet --error-exitcode=99 --leak-check=full --show-leak-kinds=definite,indirect,possible \
  --errors-for-leak-kinds=definite,indirect,possible --child-silent-after-fork=yes \
  "$work/test_shardlimit"

step "C test, statically linked"
cc "${cflags[@]}" $(pkg-config --cflags shardlimit-static) bindings/c/ctest/test_shardlimit.c \
  -o "$work/test_shardlimit_static" $(pkg-config --libs shardlimit-static)
if ldd "$work/test_shardlimit_static" | grep -q libshardlimit; then
  echo "the static C test needs libshardlimit.so" >&2
  exit 1
fi
"$work/test_shardlimit_static"

step "the READMEs' C and C++ blocks (README.md, bindings/c/README.md)"
bindings/c/readme-snippets.sh "$work" "$lib"

step "Go (bindings/go)"
(
  cd bindings/go
  # links libshardlimit.a (pkg-config module shardlimit-static), the binding's default
  unformatted="$(gofmt -l .)"
  [ -z "$unformatted" ] || { echo "gofmt needed: $unformatted" >&2; exit 1; }
  go vet ./...
  go test -race -count=1 ./...
  # no goroutine left once every limiter is closed (goleak, from the Go module proxy: a
  # module of its own, so that the published module does not depend on it)
  (cd leaktest && go vet . && go test -race -count=1 .)
  # Check on the I/O thread too (the default is the host transport on plain shards)
  SHARDLIMIT_TEST_TRANSPORT=thread go test -race -count=1 .
  # the benchmark compiles and runs (figures: see bindings/c/README.md)
  go test -count=1 -run '^$' -bench BenchmarkCheck64 -benchtime 2000x . | grep -E "^(Benchmark|ok)"
  # -tags shardlimit_dynamic links libshardlimit.so (pkg-config module shardlimit)
  LD_LIBRARY_PATH="$lib" go test -count=1 -tags shardlimit_dynamic -run 'TestCheck' .
)

step "C++ (bindings/c/cpptest, examples/cpp)"
# -U: the library found by a previous run (another SDK) is looked up again
cmake -S bindings/c/cpptest -B "$target/cpptest-build" -USHARDLIMIT_LIBRARY -DSHARDLIMIT_LIB_DIR="$lib" \
  -DSHARDLIMIT_INCLUDE_DIR="$sdk/include" -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$target/cpptest-build" -j2 >/dev/null
LD_LIBRARY_PATH="$lib" ctest --test-dir "$target/cpptest-build" --output-on-failure
cmake -S examples/cpp -B "$target/cpp-build" -USHARDLIMIT_LIBRARY -DSHARDLIMIT_LIB_DIR="$lib" \
  -DSHARDLIMIT_INCLUDE_DIR="$sdk/include" -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$target/cpp-build" -j2 >/dev/null

echo "C, Go and C++ suites passed"
