#!/usr/bin/env bash
# Install tests of the release artifacts in dist/ (`make dist` first; `make test` runs
# both): each artifact is installed OUTSIDE the repository, in an environment whose PATH
# has no Rust toolchain (env -i PATH=<go>:/usr/bin:/bin; checked), and a program of that
# ecosystem (scripts/dist-tests/) makes real decisions against a redis-server started on a
# free 127.0.0.1 port, admitting exactly the limit:
#   python  a venv of /usr/bin/python3, pip install of the wheel; the sdist without Rust
#           fails with one message that says so
#   npm     an empty project, npm install of both tarballs, offline; require and import
#   c       the SDK unpacked; pkg-config (dynamic and static), CMake find_package
#   go      a module that `go get`s the binding from GOPROXY=file://dist/go and links the
#           SDK statically: ldd shows no libshardlimit.so
#   rust    a project outside the workspace depending on the unpacked .crate (with Rust)
#   sdist   (only when asked: a release build, minutes) pip builds the sdist with Rust
# Plus the metadata: one version everywhere, LICENSE and URLs in every package.
#   scripts/test-dist.sh [metadata|python|npm|c|go|rust|sdist]...   (default: all but sdist)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/lib.sh

DIST=${DIST_DIR:-$root/dist}
version=$(workspace_version)
triple=x86_64-unknown-linux-gnu
[ -d "$DIST/c" ] || { echo "no $DIST: run make dist first" >&2; exit 1; }
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(metadata python npm c go rust)

ensure_redis
apt_install gcc g++ cmake make pkg-config binutils python3-venv >/dev/null
ensure_go
godir=$(dirname "$(command -v go)")
home=$(mktemp -d)
cleanup() {
  stop_started_redis
  wait 2>/dev/null || true
  rm -rf "$home"
}
trap cleanup EXIT
passed=0

# clean ENV... : runs a command with no Rust on PATH and nothing of this shell's env
clean() {
  env -i PATH="$godir:/usr/bin:/bin" HOME="$home" TMPDIR="$home/tmp" LANG=C.UTF-8 "$@"
}
mkdir -p "$home/tmp"
if clean sh -c 'command -v cargo || command -v rustc || command -v rustup'; then
  echo "the clean environment still has a Rust toolchain on PATH" >&2
  exit 1
fi

ok() { echo "ok: $*"; passed=$((passed + 1)); }
# flush PORT: forget the windows of the previous program (each checks the same key)
flush() { redis-cli -p "$1" FLUSHALL >/dev/null; }

# has WHAT CMD...: fails naming WHAT unless CMD succeeds
has() {
  local what=$1
  shift
  "$@" >/dev/null || { echo "metadata: $what" >&2; return 1; }
}

t_metadata() {
  echo "== metadata: one version ($version), license, project URLs"
  local url
  url=$(sed -n 's/^repository = "\(.*\)"$/\1/p' Cargo.toml)
  [ "$url" = "https://github.com/shardlimit/shardlimit" ] || { echo "repository is $url" >&2; return 1; }
  has "bindings/node/package.json version is not $version" \
    node -e 'process.exit(require("./bindings/node/package.json").version === process.argv[1] ? 0 : 1)' "$version"
  has "the npm main package is not $version, or its optionalDependencies are not the built platform packages at $version, or it keeps dev scripts/devDependencies" \
    sh -c 'tar -xzOf "$1" package/package.json | node -e "const p = JSON.parse(require(\"fs\").readFileSync(0)); const o = p.optionalDependencies || {}; process.exit(p.version === process.argv[1] && o[\"@shardlimit/binding-linux-x64-gnu\"] === p.version && Object.values(o).every((v) => v === p.version) && !p.scripts && !p.devDependencies ? 0 : 1)" "$2"' \
    _ "$DIST/npm/shardlimit-$version.tgz" "$version"
  has "SHARDLIMIT_VERSION in include/shardlimit.h is not $version" grep -q "^#define SHARDLIMIT_VERSION \"$version\"" include/shardlimit.h
  has "CHANGELOG.md has no section for $version" grep -q "^## \[$version\]" CHANGELOG.md
  has "LICENSE is not the Apache License 2.0" grep -q "Version 2.0, January 2004" LICENSE
  has "bindings/go/go.mod is not module ${url#https://}/bindings/go" grep -q "^module ${url#https://}/bindings/go$" bindings/go/go.mod
  has "bindings/python/pyproject.toml does not name $url" grep -q "$url" bindings/python/pyproject.toml
  has "bindings/node/package.json repository is not $url" \
    node -e 'process.exit(require("./bindings/node/package.json").repository.url === `git+${process.argv[1]}.git` ? 0 : 1)' "$url"
  local whl
  whl=$(ls "$DIST"/python/shardlimit-"$version"-cp39-abi3-manylinux_2_28_x86_64.whl)
  python3 - "$whl" "$version" "$url" <<'PY'
import sys, zipfile
whl, version, url = sys.argv[1:]
z = zipfile.ZipFile(whl)
meta = z.read(f"shardlimit-{version}.dist-info/METADATA").decode()
assert f"\nVersion: {version}\n" in meta and "License-Expression: Apache-2.0" in meta, meta[:400]
assert url in meta, "no project URL in METADATA"
assert f"shardlimit-{version}.dist-info/licenses/LICENSE" in z.namelist()
PY
  has "the npm platform package is not version $version" \
    sh -c 'tar -xzOf "$1" package/package.json | grep -q "\"version\": \"$2\""' _ "$DIST/npm/shardlimit-binding-linux-x64-gnu-$version.tgz" "$version"
  has "shardlimit.pc of the SDK has no URL: $url" \
    sh -c 'tar -xzOf "$1" "$2" | grep -q "^URL: $3$"' _ "$DIST/c/shardlimit-$version-$triple.tar.gz" "shardlimit-$version-$triple/lib/pkgconfig/shardlimit.pc" "$url"
  for c in shardlimit shardlimit-tower shardlimit-cli; do
    has "$c-$version.crate: no repository $url or no LICENSE" \
      sh -c 'tar -xzOf "$1" "$2/Cargo.toml" | grep -q "^repository = \"$3\"" && tar -tzf "$1" | grep -q "^$2/LICENSE$"' _ "$DIST/crates/$c-$version.crate" "$c-$version" "$url"
  done
  has "shardlimit-$version.crate does not carry the Lua scripts" \
    sh -c 'tar -tzf "$1" | grep -q "^$2/lua/prelude.lua$"' _ "$DIST/crates/shardlimit-$version.crate" "shardlimit-$version"
  ok "metadata"
}

t_python() {
  echo "== python: the wheel in a venv of /usr/bin/python3"
  local venv=$home/venv port out
  clean /usr/bin/python3 -m venv "$venv"
  clean "$venv/bin/pip" install -q --disable-pip-version-check --no-index \
    "$DIST/python/shardlimit-$version-cp39-abi3-manylinux_2_28_x86_64.whl"
  port=$(start_redis)
  (cd "$home" && clean "$venv/bin/python" "$root/scripts/dist-tests/check.py" "$port" "$version")
  echo "== python: the sdist without Rust says so"
  if out=$(cd "$home" && clean "$venv/bin/pip" install --disable-pip-version-check --no-build-isolation \
    --no-index "$DIST/python/shardlimit-$version.tar.gz" 2>&1); then
    echo "the sdist installed without Rust?" >&2; return 1
  fi
  grep -q "shardlimit: building from source needs Rust (cargo was not found on PATH)" <<<"$out" ||
    { echo "$out" >&2; echo "no 'needs Rust' message" >&2; return 1; }
  if grep -q "Traceback" <<<"$out"; then echo "$out" >&2; echo "a traceback" >&2; return 1; fi
  ok "python"
}

t_npm() {
  echo "== npm: both tarballs in an empty project (offline)"
  local proj=$home/npm-project port
  mkdir -p "$proj"
  (cd "$proj" && clean npm init -y --no-update-notifier >/dev/null &&
    clean npm install --offline --no-audit --no-fund --no-update-notifier --loglevel=error \
      "$DIST/npm/shardlimit-$version.tgz" "$DIST/npm/shardlimit-binding-linux-x64-gnu-$version.tgz")
  [ -f "$proj/node_modules/@shardlimit/binding-linux-x64-gnu/shardlimit.linux-x64-gnu.node" ]
  if find "$proj/node_modules/shardlimit" -name '*.node' | grep -q .; then
    echo "the main package carries a binary" >&2; return 1
  fi
  cp scripts/dist-tests/check.cjs scripts/dist-tests/check.mjs "$proj/"
  port=$(start_redis)
  (cd "$proj" && clean node check.cjs "$port" "$version" && clean node check.mjs "$port")
  ok "npm"
}

sdk_unpack() {
  if [ ! -d "$home/sdk" ]; then
    mkdir -p "$home/sdk"
    tar -C "$home/sdk" -xzf "$DIST/c/shardlimit-$version-$triple.tar.gz"
  fi
  echo "$home/sdk/shardlimit-$version-$triple"
}

t_c() {
  echo "== c: the SDK through pkg-config and CMake"
  local sdk port soname
  sdk=$(sdk_unpack)
  soname=$(readelf -d "$sdk/lib/libshardlimit.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [ "$soname" = "libshardlimit.so.${version%%.*}" ] || { echo "SONAME '$soname'" >&2; return 1; }
  port=$(start_redis)
  local pc="PKG_CONFIG_PATH=$sdk/lib/pkgconfig" b=$home/c
  mkdir -p "$b"
  # dynamic: the loader finds libshardlimit.so.<major> by its SONAME
  clean env "$pc" sh -c 'cc -std=c11 -Wall -Wextra -Werror "$1" -o "$2" $(pkg-config --cflags --libs shardlimit)' \
    _ scripts/dist-tests/check.c "$b/check_dynamic"
  readelf -d "$b/check_dynamic" | grep -q "NEEDED.*\[libshardlimit.so.${version%%.*}\]"
  clean env LD_LIBRARY_PATH="$sdk/lib" "$b/check_dynamic" "$port" "$version"
  # static: the archive and what pkg-config --static lists, then fully static
  clean env "$pc" sh -c 'cc -std=c11 -Wall -Wextra -Werror "$1" -o "$2" $(pkg-config --cflags --libs shardlimit-static)' \
    _ scripts/dist-tests/check.c "$b/check_static"
  if ldd "$b/check_static" | grep -q libshardlimit; then echo "check_static needs libshardlimit.so" >&2; return 1; fi
  flush "$port"
  clean "$b/check_static" "$port" "$version"
  clean env "$pc" sh -c 'cc -static -std=c11 "$1" -o "$2" $(pkg-config --cflags shardlimit) "$3/lib/libshardlimit.a" $(pkg-config --static --libs-only-l shardlimit | sed "s/-lshardlimit//")' \
    _ scripts/dist-tests/check.c "$b/check_fully_static" "$sdk" 2>"$b/static.log" ||
    { cat "$b/static.log" >&2; return 1; }
  flush "$port"
  clean "$b/check_fully_static" "$port" "$version"
  # CMake: find_package(shardlimit) and its imported targets, C++ header
  cp -R scripts/dist-tests/cmake "$b/cmake"
  clean cmake -S "$b/cmake" -B "$b/cmake/build" -DCMAKE_PREFIX_PATH="$sdk" -DEXPECTED_VERSION="$version" >/dev/null
  clean cmake --build "$b/cmake/build" -j2 >/dev/null
  flush "$port"
  clean env LD_LIBRARY_PATH="$sdk/lib" "$b/cmake/build/check_dynamic" "$port"
  flush "$port"
  clean "$b/cmake/build/check_static" "$port"
  ok "c"
}

t_go() {
  echo "== go: go get from the file proxy, SDK linked statically"
  local sdk port proj=$home/go-project
  sdk=$(sdk_unpack)
  mkdir -p "$proj"
  cp scripts/dist-tests/go/main.go "$proj/"
  local genv=(GOPROXY="file://$DIST/go" GONOSUMDB=github.com/shardlimit GOFLAGS=-modcacherw
    GOPATH="$home/gopath" GOCACHE="$home/gocache" GOTOOLCHAIN=local CGO_ENABLED=1
    PKG_CONFIG_PATH="$sdk/lib/pkgconfig")
  # the `go get` line of bindings/go/README.md as written, with its SHARDLIMIT_DIST set
  local readme_get
  readme_get=$(grep -E '^GOPROXY=file://\$SHARDLIMIT_DIST/go ' bindings/go/README.md | sed "s/@v0\.1\.0\$/@v$version/")
  [ -n "$readme_get" ] || { echo "bindings/go/README.md has no GOPROXY=file://\$SHARDLIMIT_DIST/go line" >&2; return 1; }
  (cd "$proj" && clean env "${genv[@]}" go mod init example.com/installtest >/dev/null 2>&1 &&
    clean env "${genv[@]}" SHARDLIMIT_DIST="$DIST" bash -euc "$readme_get" &&
    clean env "${genv[@]}" go build -o check .)
  if ldd "$proj/check" | grep -q libshardlimit; then echo "the Go binary needs libshardlimit.so" >&2; return 1; fi
  port=$(start_redis)
  clean "$proj/check" "$port"
  ok "go"
}

t_rust() {
  echo "== rust: a project outside the workspace on the packaged crate"
  ensure_rust
  local proj=$home/rust-project port crate
  mkdir -p "$proj/src" "$home/crates"
  tar -C "$home/crates" -xzf "$DIST/crates/shardlimit-$version.crate"
  crate="$home/crates/shardlimit-$version"
  sed -e "s|@VERSION@|$version|g" -e "s|@CRATE_DIR@|$crate|" scripts/dist-tests/rust/Cargo.toml.in >"$proj/Cargo.toml"
  cp scripts/dist-tests/rust/src/main.rs "$proj/src/"
  # the workspace's lock file: the same dependency versions, so the debug build of the
  # workspace's dependencies in the target directory is reused
  cp Cargo.lock "$proj/"
  port=$(start_redis)
  (cd "$proj" && CARGO_TARGET_DIR="$(target_dir)" cargo run --quiet -- "$port")
  # (the tree read whole first: `grep -q` leaving a pipe early fails it under pipefail)
  local tree
  tree=$(cd "$proj" && cargo tree --quiet --depth 1 -e normal)
  grep -qF "shardlimit v$version ($crate)" <<<"$tree" ||
    { echo "shardlimit did not come from the unpacked crate" >&2; return 1; }
  ok "rust"
}

t_sdist() {
  echo "== sdist: pip builds it where Rust is installed"
  ensure_rust
  local venv=$home/venv-sdist port
  /usr/bin/python3 -m venv "$venv"
  # PyPI for maturin (the build requirement); the core's crates from the cargo cache
  CARGO_TARGET_DIR="$(target_dir)/sdist-check" "$venv/bin/pip" install -q --disable-pip-version-check \
    "$DIST/python/shardlimit-$version.tar.gz"
  port=$(start_redis)
  (cd "$home" && "$venv/bin/python" "$root/scripts/dist-tests/check.py" "$port" "$version")
  ok "sdist"
}

for s in "${suites[@]}"; do "t_$s"; done
echo "dist: $passed passed, 0 failed"
