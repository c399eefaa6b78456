# The release platforms and how one platform's artifacts are built and packed, for every
# ecosystem at once. Sourced by scripts/dist.sh (the host platform), scripts/dist-all.sh
# (every platform below) and scripts/test-platforms.sh; needs scripts/lib.sh sourced first.
#
#   platform_build TRIPLE [PACKAGE...]  one `cargo zigbuild --profile $DIST_PROFILE` of the C ABI,
#                                       the Node addon and the Python extension (or PACKAGEs)
#   platform_pack TRIPLE OUTDIR         from that build: OUTDIR/c/ the C/C++ SDK tarball,
#                                       OUTDIR/python/ the wheel, OUTDIR/npm/ the platform package
#   pack_c_sdk TRIPLE OUTDIR            the SDK alone (what scripts/test-platforms.sh needs)
#
# zig (cargo-zigbuild) is the C compiler and linker of every target: ring's C code and the
# final link, against glibc 2.28's symbols for the gnu targets, musl for the musl ones, and
# zig's macOS libSystem stubs plus scripts/macos-stubs.py's framework stubs for macOS, and
# zig's MinGW-w64 (UCRT) for Windows (the Python extension imports python3.dll through
# pyo3's raw-dylib linking: no Windows Python is needed to build it).

# the platforms `make dist-all` builds, in order (the host first: `make dist` builds it)
ALL_PLATFORMS=(
  x86_64-unknown-linux-gnu
  aarch64-unknown-linux-gnu
  x86_64-unknown-linux-musl
  aarch64-unknown-linux-musl
  aarch64-apple-darwin
  x86_64-apple-darwin
  x86_64-pc-windows-gnu
)
DIST_PROFILE=${DIST_PROFILE:-dist}

# platform TRIPLE: sets, for that target,
#   P_ZIG    what `cargo zigbuild --target` is given (the glibc floor as a suffix)
#   P_OS     linux | macos | windows
#   P_WHEEL  the wheel's platform tag
#   P_NPM    the npm platform tag (@shardlimit/binding-<tag>)
#   P_MACOS  the minimum macOS version (rustc's default for the target; the wheel tag says it)
#   P_JAVA   the jar's natives/ folder of its JNI library (bindings/java's NativeLoader:
#            <os>-<arch> from os.name and os.arch), or "" where the jar has none (musl: a
#            JVM on Alpine says linux-x86_64 too, and would load the glibc one)
#   P_FLAGS  RUSTFLAGS of this target only (CARGO_TARGET_<TRIPLE>_RUSTFLAGS)
platform() {
  P_TRIPLE=$1 P_ZIG=$1 P_MACOS="" P_FLAGS="" P_JAVA=""
  case "$1" in
    x86_64-unknown-linux-gnu) P_OS=linux P_ZIG=$1.2.28 P_WHEEL=manylinux_2_28_x86_64 P_NPM=linux-x64-gnu P_JAVA=linux-x86_64 ;;
    aarch64-unknown-linux-gnu) P_OS=linux P_ZIG=$1.2.28 P_WHEEL=manylinux_2_28_aarch64 P_NPM=linux-arm64-gnu P_JAVA=linux-aarch64 ;;
    # the shared objects link musl's libc.so dynamically (the loader of the Python or Node
    # that loads them is musl's): rustc's musl targets link libc statically unless told
    # not to, and then drop the cdylib crate type
    x86_64-unknown-linux-musl) P_OS=linux P_WHEEL=musllinux_1_2_x86_64 P_NPM=linux-x64-musl P_FLAGS="-C target-feature=-crt-static" ;;
    aarch64-unknown-linux-musl) P_OS=linux P_WHEEL=musllinux_1_2_aarch64 P_NPM=linux-arm64-musl P_FLAGS="-C target-feature=-crt-static" ;;
    # rustc's default deployment targets: macOS 11.0 (the first arm64 one) and 10.12
    aarch64-apple-darwin) P_OS=macos P_MACOS=11.0 P_WHEEL=macosx_11_0_arm64 P_NPM=darwin-arm64 P_JAVA=osx-aarch64 ;;
    x86_64-apple-darwin) P_OS=macos P_MACOS=10.12 P_WHEEL=macosx_10_12_x86_64 P_NPM=darwin-x64 P_JAVA=osx-x86_64 ;;
    # MinGW-w64 (zig's, against the UCRT of Windows 10+): the DLLs load into any Windows
    # program, the MSVC-built python.exe and node.exe included (napi-rs names the addon's
    # package win32-x64-gnu after how it was built)
    x86_64-pc-windows-gnu) P_OS=windows P_WHEEL=win_amd64 P_NPM=win32-x64-gnu P_JAVA=windows-x86_64 ;;
    *) echo "unknown platform $1 (one of: ${ALL_PLATFORMS[*]})" >&2; return 1 ;;
  esac
  if [ "$P_OS" = macos ]; then
    P_FLAGS="-C link-arg=-F$(target_dir)/macos-stubs"
  fi
}

# platform_out TRIPLE: the directory cargo writes that target's artifacts to
# (the dev profile's directory is debug)
platform_out() {
  local dir=$DIST_PROFILE
  [ "$dir" = dev ] && dir=debug
  echo "$(target_dir)/$1/$dir"
}

platform_build() {
  local triple=$1
  shift
  platform "$triple" || return 1
  local pkgs=("$@")
  [ ${#pkgs[@]} -gt 0 ] || pkgs=(shardlimit-c shardlimit-node shardlimit-python)
  rustup target list --installed 2>/dev/null | grep -qx "$triple" || rustup target add "$triple" || return 1
  if [ "$P_OS" = macos ]; then
    # Security and CoreFoundation (rustls-native-certs, through redis' TLS) as text stubs:
    # no macOS SDK can be fetched here
    "$TOOLS_PY" "$SHARDLIMIT_ROOT/scripts/macos-stubs.py" "$(target_dir)/macos-stubs" >/dev/null || return 1
  fi
  local libnode=""
  if [ "$P_OS" = windows ]; then
    # napi's build script (napi-build 2.6) links -lnode for windows-gnu and panics unless
    # LIBNODE_PATH holds a libnode.dll; the addon imports nothing from it (Node-API is
    # looked up in node.exe at load time: napi's dyn-symbols, bindings/node/Cargo.toml,
    # and check-platforms.py checks it imports no node DLL), so the folder holds an empty
    # archive under both names
    libnode="$(target_dir)/windows-libnode"
    mkdir -p "$libnode" || return 1
    [ -f "$libnode/libnode.a" ] || ar rc "$libnode/libnode.a" || return 1
    cp "$libnode/libnode.a" "$libnode/libnode.dll"
  fi
  local var
  var="CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_RUSTFLAGS"
  local args=()
  for p in "${pkgs[@]}"; do args+=(-p "$p"); done
  echo "== cargo zigbuild --profile $DIST_PROFILE --target $P_ZIG (${pkgs[*]})"
  # PYO3_PYTHON: any CPython >= 3.9 (the extension is abi3); no libpython is linked
  env "$var=$P_FLAGS" ${P_MACOS:+MACOSX_DEPLOYMENT_TARGET=$P_MACOS} ${libnode:+LIBNODE_PATH=$libnode} PYO3_PYTHON="$(command -v python3)" \
    cargo zigbuild --quiet --locked --profile "$DIST_PROFILE" --target "$P_ZIG" "${args[@]}"
}

# the file names cargo gives a cdylib NAME on this platform
platform_cdylib() {
  case "$P_OS" in
    macos) echo "lib$1.dylib" ;;
    windows) echo "$1.dll" ;;
    *) echo "lib$1.so" ;;
  esac
}

pack_c_sdk() {
  local triple=$1 outdir=$2
  platform "$triple" || return 1
  local version major minor out stage sdk s
  version=$(workspace_version)
  major=${version%%.*}
  minor=${version#*.}; minor=${minor%%.*}
  out=$(platform_out "$triple")
  stage="$(target_dir)/dist-stage/$triple"
  sdk="shardlimit-$version-$triple"
  s="$stage/$sdk"
  rm -rf "$s"
  mkdir -p "$s/include" "$s/lib/pkgconfig" "$s/lib/cmake/shardlimit" "$outdir/c"
  cp "$SHARDLIMIT_ROOT"/include/shardlimit.h "$SHARDLIMIT_ROOT"/include/shardlimit.hpp "$s/include/"
  local shared soname native static_lib cmake_native
  if [ "$P_OS" = windows ]; then
    pack_c_sdk_windows "$triple" "$outdir" "$s" "$out" || return 1
    tar -C "$stage" --owner=0 --group=0 --numeric-owner --sort=name -czf "$outdir/c/$sdk.tar.gz" "$sdk"
    return
  fi
  if [ "$P_OS" = macos ]; then
    # install name @rpath/libshardlimit.<major>.dylib (bindings/c/build.rs)
    shared="libshardlimit.$major.dylib"
    soname="@rpath/$shared"
    cp "$out/libshardlimit.dylib" "$s/lib/$shared"
    ln -s "$shared" "$s/lib/libshardlimit.dylib"
    # what rustc links a staticlib of the core with on macOS (native-static-libs)
    native="-framework CoreFoundation -framework Security -liconv -lSystem -lc -lm"
    cmake_native="-framework CoreFoundation;-framework Security;iconv;m"
    # Apple's ld has no -l:FILE
    static_lib='${libdir}/libshardlimit.a'
  else
    shared="libshardlimit.so.$version"
    soname="libshardlimit.so.$major"
    cp "$out/libshardlimit.so" "$s/lib/$shared"
    ln -s "$shared" "$s/lib/libshardlimit.so.$major"
    ln -s "libshardlimit.so.$major" "$s/lib/libshardlimit.so"
    local got
    got=$(readelf -d "$s/lib/$shared" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    [ "$got" = "$soname" ] || { echo "$triple: libshardlimit.so has SONAME '$got', not $soname" >&2; return 1; }
    native="-lpthread -lm -ldl"
    cmake_native="Threads::Threads;m;dl"
    static_lib="-l:libshardlimit.a"
  fi
  cp "$out/libshardlimit.a" "$s/lib/"
  # the archive keeps debug info of the Rust std it bundles; users link what they need
  # (llvm-strip: binutils' strip knows no Mach-O)
  if [ "$P_OS" = macos ]; then
    llvm-strip --strip-debug "$s/lib/libshardlimit.a"
  else
    strip --strip-debug "$s/lib/libshardlimit.a" 2>/dev/null || llvm-strip --strip-debug "$s/lib/libshardlimit.a"
  fi
  PC_NATIVE_LIBS="$native" PC_STATIC_LIB="$static_lib" "$SHARDLIMIT_ROOT/bindings/c/gen-pkgconfig.sh" \
    '${pcfiledir}/..' '${pcfiledir}/../../include' "$s/lib/pkgconfig" >/dev/null
  for f in shardlimitConfig shardlimitConfigVersion; do
    sed -e "s|@VERSION@|$version|g" -e "s|@MAJOR@|$major|g" -e "s|@MINOR@|$minor|g" \
      -e "s|@SHARED@|$shared|g" -e "s|@SONAME@|$soname|g" -e "s|@NATIVE_LIBS@|$cmake_native|g" \
      "$SHARDLIMIT_ROOT/bindings/c/cmake/$f.cmake.in" > "$s/lib/cmake/shardlimit/$f.cmake"
  done
  cp "$SHARDLIMIT_ROOT/LICENSE" "$SHARDLIMIT_ROOT/CHANGELOG.md" "$s/"
  cp "$SHARDLIMIT_ROOT/bindings/c/README.md" "$s/README.md"
  tar -C "$stage" --owner=0 --group=0 --numeric-owner --sort=name -czf "$outdir/c/$sdk.tar.gz" "$sdk"
}

# pack_c_sdk_windows TRIPLE OUTDIR SDKDIR BUILDDIR: the Windows SDK's files, as MinGW-w64
# and MSVC users link a DLL: bin/shardlimit.dll, lib/shardlimit.lib (its import library,
# as the linker made it for the DLL: MSVC's link.exe takes it by that name, and MinGW's ld
# and zig's driver find it for -lshardlimit), lib/pkgconfig/shardlimit.pc (-lshardlimit).
# No static archive (a static Rust library on windows-gnu needs the import libraries of
# the windows crates besides the system's, which no .pc file can name portably) and no
# CMake package (an IMPORTED target there needs IMPORTED_IMPLIB, untested here).
pack_c_sdk_windows() {
  local s=$3 out=$4
  rm -rf "$s/lib/cmake" && mkdir -p "$s/bin" &&
    cp "$out/shardlimit.dll" "$s/bin/" &&
    cp "$out/libshardlimit.dll.a" "$s/lib/shardlimit.lib" &&
    PC_NATIVE_LIBS=" " PC_STATIC_LIB=" " "$SHARDLIMIT_ROOT/bindings/c/gen-pkgconfig.sh" \
      '${pcfiledir}/..' '${pcfiledir}/../../include' "$s/lib/pkgconfig" >/dev/null &&
    rm "$s/lib/pkgconfig/shardlimit-static.pc" &&
    cp "$SHARDLIMIT_ROOT/LICENSE" "$SHARDLIMIT_ROOT/CHANGELOG.md" "$s/" &&
    cp "$SHARDLIMIT_ROOT/bindings/c/README.md" "$s/README.md"
}

# The module `$2` of musl target `$1` as it ships: its dependency on musl's libc named as
# Alpine names it, libc.musl-<arch>.so.1 (zig links it against a `libc.so`; musl's loader
# takes either name for itself, but the musllinux policy and auditwheel know only
# Alpine's). Prints the path of the copy so renamed; other targets' modules as they are.
shipped_module() {
  local triple=$1 src=$2
  case "$triple" in *-musl) ;; *) echo "$src"; return 0 ;; esac
  command -v patchelf >/dev/null 2>&1 || apt_install patchelf >&2 || return 1
  local d
  d="$(target_dir)/dist-stage/musl-$triple"
  mkdir -p "$d" && cp "$src" "$d/" || return 1
  patchelf --replace-needed libc.so "libc.musl-${triple%%-*}.so.1" "$d/$(basename "$src")" || return 1
  echo "$d/$(basename "$src")"
}

pack_wheel() {
  local triple=$1 outdir=$2
  platform "$triple" || return 1
  local out wheel module
  out=$(platform_out "$triple")
  mkdir -p "$outdir/python"
  module=$(shipped_module "$triple" "$out/$(platform_cdylib _shardlimit)") || return 1
  wheel=$("$TOOLS_PY" "$SHARDLIMIT_ROOT/scripts/build-wheel.py" "$module" "$P_WHEEL" "$outdir/python")
  if [ "$P_OS" = linux ]; then
    # auditwheel reads the symbol versions (glibc) or the musl loader the module needs
    local report
    report=$("$TOOLS_BIN/auditwheel" show "$wheel" 2>&1) || { echo "$report" >&2; return 1; }
    # (auditwheel wraps its lines)
    tr -s ' \n' '  ' <<<"$report" | grep -q "is consistent with the following platform tag: \"$P_WHEEL\"" ||
      { echo "$report" >&2; echo "auditwheel: $(basename "$wheel") is not $P_WHEEL" >&2; return 1; }
  fi
}

pack_npm_platform() {
  local triple=$1 outdir=$2
  platform "$triple" || return 1
  local out
  out=$(platform_out "$triple")
  mkdir -p "$outdir/npm"
  local addon
  addon=$(shipped_module "$triple" "$out/$(platform_cdylib shardlimit_node)") || return 1
  node "$SHARDLIMIT_ROOT/scripts/npm-packages.js" platform "$triple" "$addon" \
    "$(target_dir)/dist-stage/npm-$P_NPM" "$outdir/npm" >/dev/null
}

platform_pack() {
  pack_c_sdk "$1" "$2" && pack_wheel "$1" "$2" && pack_npm_platform "$1" "$2"
}
