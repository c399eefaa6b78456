#!/usr/bin/env python3
"""What can be checked of each platform's artifacts without running them (make dist-all):

    scripts/check-platforms.py DIST

For every C SDK, wheel and npm platform package in DIST (dist/c, dist/python, dist/npm),
and every JNI library in the jar (dist/java, natives/<os>-<arch>/):
- the binary's format and architecture are the platform's (ELF x86-64 / AArch64, Mach-O
  x86_64 / arm64), read with llvm-readobj / llvm-objdump;
- it exports what its loader looks for: every function of include/shardlimit.h (the SDK's
  shared library and static archive), PyInit__shardlimit (the wheel's module),
  napi_register_module_v1 (the .node file), the JNI functions (Java_io_shardlimit_*);
- the tags: the wheel's file name and its WHEEL `Tag:`; the npm package's os/cpu/libc;
  the main npm package's optionalDependencies name exactly the platform packages present;
  the jar holds a JNI library for exactly the glibc and macOS platforms built (none for
  musl: a JVM on Alpine names its platform linux-x86_64 as a glibc one does);
- glibc: no symbol version above GLIBC_2.28 (manylinux_2_28); musl: the module needs musl's
  loader (libc.musl-<arch>.so.1), no glibc;
- macOS: the minimum macOS version of every Mach-O file (LC_BUILD_VERSION minos, or
  LC_VERSION_MIN_MACOSX before 10.14) is the
  wheel tag's; the libraries it loads are the system's (libSystem, libiconv, Security,
  CoreFoundation); every symbol bound to Security or CoreFoundation is named as that
  framework's are (Sec*, CF*: the stubs of scripts/macos-stubs.py bind nothing else); the
  SDK dylib's install name is @rpath/libshardlimit.<major>.dylib; and a C program links
  against the SDK's static archive with its pkg-config flags (zig cc, into a Mach-O
  executable that is checked and not run);
- Windows (PE32+ x86-64): the DLLs each binary imports: no MinGW runtime DLL (libgcc_s,
  libwinpthread: not on Windows machines), no Node DLL (the addon finds Node-API in
  node.exe at load time), python3.dll alone of Python's (the wheel); the SDK's import
  library imports every function of the header from shardlimit.dll, and a C program links
  against it with shardlimit.pc's flags (scripts/test-dist-all.sh runs one under wine).
Nothing here runs a binary: scripts/test-platforms.sh and scripts/test-dist-all.sh run the
linux-arm64, musl and Windows ones that can run here.
"""
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSION = re.search(r'^#define SHARDLIMIT_VERSION "(.*)"$', (ROOT / "include/shardlimit.h").read_text(), re.M).group(1)
MAJOR = VERSION.split(".")[0]
HEADER_FUNCS = sorted(set(re.findall(r"\b(shardlimit_[a-z0-9_]+)\(", (ROOT / "include/shardlimit.h").read_text())))

# triple -> (format, arch as llvm-readobj names it, minimum macOS or None)
PLATFORMS = {
    "x86_64-unknown-linux-gnu": ("elf", "x86_64", None),
    "aarch64-unknown-linux-gnu": ("elf", "aarch64", None),
    "x86_64-unknown-linux-musl": ("elf", "x86_64", None),
    "aarch64-unknown-linux-musl": ("elf", "aarch64", None),
    "x86_64-apple-darwin": ("macho", "x86_64", "10.12"),
    "aarch64-apple-darwin": ("macho", "aarch64", "11.0"),
    "x86_64-pc-windows-gnu": ("coff", "x86_64", None),
}
WHEEL_TAGS = {
    "manylinux_2_28_x86_64": "x86_64-unknown-linux-gnu",
    "manylinux_2_28_aarch64": "aarch64-unknown-linux-gnu",
    "musllinux_1_2_x86_64": "x86_64-unknown-linux-musl",
    "musllinux_1_2_aarch64": "aarch64-unknown-linux-musl",
    "macosx_10_12_x86_64": "x86_64-apple-darwin",
    "macosx_11_0_arm64": "aarch64-apple-darwin",
    "win_amd64": "x86_64-pc-windows-gnu",
}
NPM_TAGS = {
    "linux-x64-gnu": ("x86_64-unknown-linux-gnu", "linux", "x64", "glibc"),
    "linux-arm64-gnu": ("aarch64-unknown-linux-gnu", "linux", "arm64", "glibc"),
    "linux-x64-musl": ("x86_64-unknown-linux-musl", "linux", "x64", "musl"),
    "linux-arm64-musl": ("aarch64-unknown-linux-musl", "linux", "arm64", "musl"),
    "darwin-x64": ("x86_64-apple-darwin", "darwin", "x64", None),
    "darwin-arm64": ("aarch64-apple-darwin", "darwin", "arm64", None),
    "win32-x64-gnu": ("x86_64-pc-windows-gnu", "win32", "x64", None),
}
# the jar's natives/ folder (bindings/java's NativeLoader.platform()) -> triple
JAVA_DIRS = {
    "linux-x86_64": "x86_64-unknown-linux-gnu",
    "linux-aarch64": "aarch64-unknown-linux-gnu",
    "osx-x86_64": "x86_64-apple-darwin",
    "osx-aarch64": "aarch64-apple-darwin",
    "windows-x86_64": "x86_64-pc-windows-gnu",
}
JNI_FUNCS = sorted({f for rs in (ROOT / "bindings/java/src").glob("*.rs") for f in re.findall(r"fn (Java_io_shardlimit_\w+)\(", rs.read_text())})
SYSTEM_DYLIBS = {
    "/usr/lib/libSystem.B.dylib",
    "/usr/lib/libiconv.2.dylib",
    "/usr/lib/libcharset.1.dylib",
    "/System/Library/Frameworks/Security.framework/Versions/A/Security",
    "/System/Library/Frameworks/CoreFoundation.framework/Versions/A/CoreFoundation",
}
FRAMEWORK_PREFIXES = {"Security": ("_Sec", "_kSec"), "CoreFoundation": ("_CF", "_kCF", "___CF")}

checked: list[str] = []


def fail(msg: str) -> None:
    sys.exit(f"check-platforms: {msg}")


def run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def arch_of(path: Path) -> tuple[str, str]:
    """(elf|macho|coff, arch) of a binary or of every member of an archive (all must agree)."""
    out = run("llvm-readobj", "--file-headers", str(path))
    formats = set(re.findall(r"^\s*Format: (\S+)", out, re.M))
    archs = set(re.findall(r"^\s*Arch: (\S+)", out, re.M))
    if len(formats) != 1 or len(archs) != 1:
        fail(f"{path.name}: formats {formats}, architectures {archs}")
    fmt = formats.pop()
    kind = "macho" if fmt.startswith("Mach-O") else "coff" if fmt.startswith("COFF") else "elf"
    return (kind, archs.pop())


def exported(path: Path, fmt: str) -> set[str]:
    if fmt == "coff":
        return set(re.findall(r"^\s*Name: (\S+)$", run("llvm-readobj", "--coff-exports", str(path)), re.M))
    if fmt == "elf" and not path.name.endswith(".a"):
        out = run("llvm-nm", "-D", "--defined-only", str(path))
    else:
        # (an archive's LLVM bitcode-free members with no symbols make llvm-nm exit 1 after
        # listing everything: its output is what counts)
        out = subprocess.run(["llvm-nm", "-g", "--defined-only", str(path)], capture_output=True, text=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip() and not line.endswith(":")}
    return {n[1:] if fmt == "macho" and n.startswith("_") else n for n in names}


def macho_checks(path: Path, minos: str, what: str) -> dict:
    """minos, the dylibs loaded, the framework symbols; returns the load commands seen."""
    out = run("llvm-objdump", "--macho", "--private-headers", str(path))
    # (a target before macOS 10.14 is written as LC_VERSION_MIN_MACOSX, with `version`)
    got = re.findall(r"cmd LC_BUILD_VERSION.*?minos (\S+)", out, re.S) + re.findall(
        r"cmd LC_VERSION_MIN_MACOSX\n\s*cmdsize \d+\n\s*version (\S+)", out)
    if got != [minos]:
        fail(f"{what}: minimum macOS {got}, expected {minos}")
    loads = set(re.findall(r"cmd LC_LOAD(?:_WEAK)?_DYLIB\n\s*cmdsize \d+\n\s*name (\S+)", out))
    if not loads or loads - SYSTEM_DYLIBS:
        fail(f"{what}: loads {sorted(loads - SYSTEM_DYLIBS)} beyond the system's")
    ident = re.findall(r"cmd LC_ID_DYLIB\n\s*cmdsize \d+\n\s*name (\S+)", out)
    for line in run("llvm-nm", "-m", "--undefined-only", str(path)).splitlines():
        m = re.search(r"external (\S+) \(from (\w+)\)", line)
        if m and m.group(2) in FRAMEWORK_PREFIXES and not m.group(1).startswith(FRAMEWORK_PREFIXES[m.group(2)]):
            fail(f"{what}: {m.group(1)} bound to {m.group(2)}")
    return {"loads": loads, "id": ident}


def elf_checks(path: Path, triple: str, what: str) -> None:
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", run("readelf", "-d", str(path))))
    if triple.endswith("-gnu"):
        versions = re.findall(r"GLIBC_([0-9.]+)", run("readelf", "--version-info", str(path)))
        newest = max((tuple(int(x) for x in v.split(".")) for v in versions), default=(0,))
        if newest > (2, 28):
            fail(f"{what}: needs GLIBC_{'.'.join(map(str, newest))} (> 2.28)")
        if any("musl" in n for n in needed):
            fail(f"{what}: needs musl {needed}")
    else:
        # zig names musl's libc "libc.so", which musl's loader takes as itself (as it does
        # libc.musl-<arch>.so.1); glibc's names (libc.so.6, libpthread.so.0, ...) it has not
        arch = triple.split("-")[0]
        musl = {"libc.so", f"libc.musl-{arch}.so.1"}
        if not needed & musl or any(re.search(r"\.so\.\d", n) and n not in musl for n in needed):
            fail(f"{what}: needs {sorted(needed)}, not musl's libc alone")


def coff_checks(path: Path, what: str) -> set[str]:
    """The DLLs a Windows binary imports: no MinGW runtime DLL (libgcc_s, libwinpthread,
    libstdc++: not on a Windows machine), no Node DLL (the addon finds Node-API in node.exe at
    load time), and Python only through python3.dll (the stable ABI); returns them."""
    dlls = {d.lower() for d in re.findall(r"^\s*Name: (\S+\.dll)$", run("llvm-readobj", "--coff-imports", str(path)), re.M | re.I)}
    bad = sorted(d for d in dlls if d.startswith(("lib", "node", "python3")) and d != "python3.dll")
    if bad or not dlls:
        fail(f"{what}: imports {bad or 'nothing'}")
    return dlls


def check_binary(path: Path, triple: str, what: str, symbols: list[str]) -> dict:
    fmt, arch, minos = PLATFORMS[triple]
    got = arch_of(path)
    if got != (fmt, arch):
        fail(f"{what}: {got}, expected {(fmt, arch)}")
    have = exported(path, fmt)
    missing = [s for s in symbols if s not in have]
    if missing:
        fail(f"{what}: does not export {missing[:5]} ({len(missing)} missing)")
    if fmt == "coff" and have - set(symbols):
        # a DLL exports what its .def names (the crates' build scripts); without one, MinGW's
        # linker exports every symbol
        fail(f"{what}: exports {len(have - set(symbols))} more than its ABI, e.g. {sorted(have - set(symbols))[:3]}")
    info = {}
    if not path.name.endswith(".a"):
        if fmt == "macho":
            info = macho_checks(path, minos, what)
        elif fmt == "coff":
            info = {"dlls": coff_checks(path, what)}
        else:
            elf_checks(path, triple, what)
    return info


def check_sdk(tgz: Path, tmp: Path) -> str:
    triple = tgz.name[len(f"shardlimit-{VERSION}-") : -len(".tar.gz")]
    if triple not in PLATFORMS:
        fail(f"{tgz.name}: unknown platform {triple}")
    fmt = PLATFORMS[triple][0]
    with tarfile.open(tgz) as t:
        if hasattr(tarfile, "tar_filter"):
            t.extractall(tmp, filter="tar")
        else:  # Python < 3.11.4 (our own tarball)
            t.extractall(tmp)
    sdk = tmp / f"shardlimit-{VERSION}-{triple}"
    lib = sdk / "lib"
    if fmt == "coff":
        return check_sdk_windows(tgz, sdk, triple)
    shared = lib / (f"libshardlimit.{MAJOR}.dylib" if fmt == "macho" else f"libshardlimit.so.{VERSION}")
    info = check_binary(shared, triple, f"{tgz.name}: {shared.name}", HEADER_FUNCS)
    if fmt == "macho" and info["id"] != [f"@rpath/libshardlimit.{MAJOR}.dylib"]:
        fail(f"{tgz.name}: install name {info['id']}")
    check_binary(lib / "libshardlimit.a", triple, f"{tgz.name}: libshardlimit.a", HEADER_FUNCS)
    for f in ("include/shardlimit.h", "include/shardlimit.hpp", "lib/pkgconfig/shardlimit.pc",
              "lib/pkgconfig/shardlimit-static.pc", "lib/cmake/shardlimit/shardlimitConfig.cmake",
              "lib/cmake/shardlimit/shardlimitConfigVersion.cmake", "LICENSE"):
        if not (sdk / f).is_file():
            fail(f"{tgz.name}: no {f}")
    cmake = (sdk / "lib/cmake/shardlimit/shardlimitConfig.cmake").read_text()
    if "@" + "SHARED@" in cmake or shared.name not in cmake:
        fail(f"{tgz.name}: shardlimitConfig.cmake does not name {shared.name}")
    if fmt == "macho":
        link_macos(sdk, triple, tmp)
    return triple


def check_sdk_windows(tgz: Path, sdk: Path, triple: str) -> str:
    """bin/shardlimit.dll exporting the header's functions, lib/shardlimit.lib importing
    each of them from it, the headers and shardlimit.pc."""
    check_binary(sdk / "bin/shardlimit.dll", triple, f"{tgz.name}: shardlimit.dll", HEADER_FUNCS)
    implib = sdk / "lib/shardlimit.lib"
    # (llvm-nm -g leaves out the import members' __imp_ symbols)
    nm = subprocess.run(["llvm-nm", str(implib)], capture_output=True, text=True).stdout
    have = {f[2] for f in (line.split() for line in nm.splitlines()) if len(f) == 3 and f[1] == "T"}
    missing = [f for f in HEADER_FUNCS if f"__imp_{f}" not in have]
    if missing:
        fail(f"{tgz.name}: shardlimit.lib does not import {missing[:5]}")
    if "shardlimit.dll" not in run("llvm-ar", "t", str(implib)).split():
        fail(f"{tgz.name}: shardlimit.lib is not shardlimit.dll's import library")
    for f in ("include/shardlimit.h", "include/shardlimit.hpp", "lib/pkgconfig/shardlimit.pc", "LICENSE"):
        if not (sdk / f).is_file():
            fail(f"{tgz.name}: no {f}")
    link_windows(sdk, triple)
    return triple


def link_windows(sdk: Path, triple: str) -> None:
    """A C program linked against the DLL's import library with shardlimit.pc's flags."""
    env = dict(os.environ, PKG_CONFIG_PATH=str(sdk / "lib/pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "shardlimit"], check=True,
                           capture_output=True, text=True, env=env).stdout.split()
    exe = sdk / "check.exe"
    subprocess.run([sys.executable, "-m", "ziglang", "cc", "-target", "x86_64-windows-gnu", "-std=c11",
                    "-Wall", "-Werror", str(ROOT / "scripts/dist-tests/check.c"), "-o", str(exe), *flags], check=True)
    if "shardlimit.dll" not in coff_checks(exe, exe.name):
        fail(f"{exe.name}: does not import shardlimit.dll")
    checked.append(f"a C program links against the {triple} SDK's import library (PE32+, imports shardlimit.dll)")


def link_macos(sdk: Path, triple: str, tmp: Path) -> None:
    """A C program linked against the SDK's archive with shardlimit-static.pc's flags."""
    env = dict(os.environ, PKG_CONFIG_PATH=str(sdk / "lib/pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "shardlimit-static"], check=True,
                           capture_output=True, text=True, env=env).stdout.split()
    arch = triple.split("-")[0]
    minos = PLATFORMS[triple][2]
    exe = tmp / f"check-{triple}"
    stubs = os.environ.get("MACOS_STUBS")
    if not stubs:
        fail("MACOS_STUBS: the directory scripts/macos-stubs.py wrote")
    subprocess.run([sys.executable, "-m", "ziglang", "cc", "-target", f"{arch}-macos.{minos}", "-std=c11",
                    "-Wall", "-Werror", str(ROOT / "scripts/dist-tests/check.c"), "-o", str(exe),
                    f"-F{stubs}", f"-L{stubs}", *flags], check=True)
    macho_checks(exe, minos, f"{exe.name} (linked against the {triple} SDK)")
    if arch_of(exe) != ("macho", PLATFORMS[triple][1]):
        fail(f"{exe.name}: {arch_of(exe)}")
    checked.append(f"a C program links against the {triple} SDK's static archive (Mach-O, minos {minos})")


def check_wheel(whl: Path, tmp: Path) -> str:
    m = re.fullmatch(rf"shardlimit-{re.escape(VERSION)}-cp39-abi3-(.+)\.whl", whl.name)
    if not m or m.group(1) not in WHEEL_TAGS:
        fail(f"{whl.name}: not a cp39-abi3 wheel of a known platform")
    plat = m.group(1)
    triple = WHEEL_TAGS[plat]
    with zipfile.ZipFile(whl) as z:
        wheel = z.read(f"shardlimit-{VERSION}.dist-info/WHEEL").decode()
        if f"\nTag: cp39-abi3-{plat}\n" not in wheel:
            fail(f"{whl.name}: WHEEL says {wheel!r}")
        module = "_shardlimit.pyd" if plat.startswith("win") else "_shardlimit.abi3.so"
        ext = tmp / whl.name / module
        ext.parent.mkdir(parents=True)
        ext.write_bytes(z.read(f"shardlimit/{module}"))
    info = check_binary(ext, triple, whl.name, ["PyInit__shardlimit"])
    if "dlls" in info and "python3.dll" not in info["dlls"]:
        fail(f"{whl.name}: does not import python3.dll")
    return triple


def check_npm(tgz: Path, tmp: Path) -> str:
    m = re.fullmatch(rf"shardlimit-binding-(.+)-{re.escape(VERSION)}\.tgz", tgz.name)
    if not m or m.group(1) not in NPM_TAGS:
        fail(f"{tgz.name}: not a known platform package")
    tag = m.group(1)
    triple, os_, cpu, libc = NPM_TAGS[tag]
    with tarfile.open(tgz) as t:
        pkg = json.load(t.extractfile("package/package.json"))
        node = tmp / tgz.name / f"shardlimit.{tag}.node"
        node.parent.mkdir(parents=True)
        node.write_bytes(t.extractfile(f"package/shardlimit.{tag}.node").read())
    want = {"name": f"@shardlimit/binding-{tag}", "version": VERSION, "os": [os_], "cpu": [cpu],
            "main": f"shardlimit.{tag}.node"}
    if libc:
        want["libc"] = [libc]
    got = {k: pkg.get(k) for k in want}
    if got != want or (not libc and "libc" in pkg):
        fail(f"{tgz.name}: package.json {got}, expected {want}")
    check_binary(node, triple, tgz.name, ["napi_register_module_v1"])
    return tag


def check_jar(jar: Path, tmp: Path) -> list[str]:
    """Each natives/<os>-<arch>/ library of the jar: its platform's binary, exporting the JNI functions."""
    triples = []
    with zipfile.ZipFile(jar) as z:
        for name in sorted(n for n in z.namelist() if n.startswith("natives/") and not n.endswith("/")):
            folder, lib = name.split("/")[1:]
            triple = JAVA_DIRS.get(folder)
            if not triple:
                fail(f"{jar.name}: {name}: unknown platform folder {folder}")
            want = {"macho": "libshardlimit_jni.dylib", "coff": "shardlimit_jni.dll"}.get(PLATFORMS[triple][0], "libshardlimit_jni.so")
            if lib != want:
                fail(f"{jar.name}: {name}: the JVM of {folder} loads {want}")
            out = tmp / jar.name / folder / lib
            out.parent.mkdir(parents=True)
            out.write_bytes(z.read(name))
            check_binary(out, triple, f"{jar.name}: {name}", ["JNI_OnLoad", *JNI_FUNCS])
            triples.append(triple)
    return triples


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    dist = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        per: dict[str, list[str]] = {}
        for i, f in enumerate(sorted((dist / "c").glob("*.tar.gz"))):
            per.setdefault(check_sdk(f, tmp / f"c{i}"), []).append("C SDK")
        for f in sorted((dist / "python").glob("*.whl")):
            per.setdefault(check_wheel(f, tmp), []).append("wheel")
        tags = []
        for f in sorted((dist / "npm").glob("shardlimit-binding-*.tgz")):
            tag = check_npm(f, tmp)
            tags.append(tag)
            per.setdefault(NPM_TAGS[tag][0], []).append("npm")
        with tarfile.open(dist / "npm" / f"shardlimit-{VERSION}.tgz") as t:
            main_pkg = json.load(t.extractfile("package/package.json"))
        want = {f"@shardlimit/binding-{t}": VERSION for t in tags}
        if main_pkg.get("optionalDependencies") != want:
            fail(f"the main npm package names {main_pkg.get('optionalDependencies')}, built: {want}")
        jar = dist / "java" / f"shardlimit-{VERSION}.jar"
        jni = check_jar(jar, tmp) if jar.is_file() else []
        if jni and sorted(jni) != sorted(t for t in per if t in JAVA_DIRS.values()):
            fail(f"{jar.name}: JNI libraries of {sorted(jni)}, platforms built: {sorted(per)}")
        for triple in jni:
            per[triple].append("jar")
        for triple, what in per.items():
            if sorted(set(what) - {"jar"}) != ["C SDK", "npm", "wheel"]:
                fail(f"{triple}: only {what}")
            print(f"ok: {triple}: C SDK, wheel, npm package{', JNI library in the jar' if 'jar' in what else ''}"
                  f" (architecture, exports, tags"
                  f"{', minimum macOS ' + PLATFORMS[triple][2] if PLATFORMS[triple][2] else ''})")
        for c in checked:
            print(f"ok: {c}")
        print(f"ok: the main npm package names exactly {', '.join(tags)}")
        print(f"platforms: {len(per) + len(checked) + 1} passed, 0 failed")


if __name__ == "__main__":
    main()
