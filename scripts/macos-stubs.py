#!/usr/bin/env python3
"""Writes text stubs (.tbd) of the two macOS frameworks the core links, so that zig can
link the macOS targets on Linux without a macOS SDK (none can be fetched here):

    scripts/macos-stubs.py OUTDIR

OUTDIR/Security.framework/Security.tbd and OUTDIR/CoreFoundation.framework/CoreFoundation.tbd
(scripts/platforms.sh passes -F OUTDIR to the linker), and OUTDIR/libiconv.tbd. The TLS of the core goes through
redis' rustls-native-certs, whose security-framework crate declares its C functions in
security-framework-sys (Security.framework) and core-foundation-sys (CoreFoundation);
each stub exports every function and static those crates declare in their `extern` blocks
(the versions in Cargo.lock), under the framework's real install name. A stub only says
where the dynamic loader finds a symbol at run time: the symbols the link really binds are
checked by scripts/check-platforms.py (each named from its framework: Sec*/kSec* from
Security, CF*/kCF* from CoreFoundation), and a Mac loads the real framework.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = {
    # crate -> (framework, the prefixes every one of its symbols has)
    "security-framework-sys": ("Security", ("Sec", "kSec", "SSL", "CSSM", "Authorization", "kAuthorization", "CMS", "kCMS", "kSSL", "SecTransform")),
    "core-foundation-sys": ("CoreFoundation", ("CF", "kCF", "__CF", "_kCF")),
}
DECL = re.compile(r"\bpub\s+(?:static\s+(?:mut\s+)?|fn\s+)([A-Za-z_][A-Za-z0-9_]*)")


def extern_symbols(src: Path) -> set[str]:
    """The names declared inside `extern "C" { ... }` blocks of the crate's sources."""
    names: set[str] = set()
    for f in sorted(src.rglob("*.rs")):
        text = re.sub(r"//[^\n]*", "", f.read_text())
        for m in re.finditer(r'extern\s+"C"\s*\{', text):
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            names.update(DECL.findall(text[m.end() : i - 1]))
    return names


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    meta = json.loads(
        subprocess.check_output(
            ["cargo", "metadata", "--locked", "--format-version", "1", "--filter-platform", "aarch64-apple-darwin"],
            cwd=ROOT,
        )
    )
    for pkg in meta["packages"]:
        if pkg["name"] not in FRAMEWORKS:
            continue
        framework, prefixes = FRAMEWORKS[pkg["name"]]
        names = extern_symbols(Path(pkg["manifest_path"]).parent / "src")
        odd = sorted(n for n in names if not n.startswith(prefixes))
        if odd or not names:
            sys.exit(f"{pkg['name']} {pkg['version']}: no symbols, or symbols not of {framework}: {odd[:10]}")
        d = out / f"{framework}.framework"
        d.mkdir(parents=True, exist_ok=True)
        targets = "[ x86_64-macos, arm64-macos ]"
        symbols = ", ".join(f"_{n}" for n in sorted(names))
        (d / f"{framework}.tbd").write_text(
            "--- !tapi-tbd\n"
            "tbd-version:     4\n"
            f"targets:         {targets}\n"
            f"install-name:    '/System/Library/Frameworks/{framework}.framework/Versions/A/{framework}'\n"
            "exports:\n"
            f"  - targets:         {targets}\n"
            f"    symbols:         [ {symbols} ]\n"
            "...\n"
        )
        print(f"{d / framework}.tbd: {len(names)} symbols of {pkg['name']} {pkg['version']}")
    # and libiconv, which rustc names for every macOS staticlib (native-static-libs) and
    # cargo-zigbuild stubs for the Rust links only: scripts/check-platforms.py links a C
    # program against the SDK's archive with -L OUTDIR
    targets = "[ x86_64-macos, arm64-macos ]"
    (out / "libiconv.tbd").write_text(
        "--- !tapi-tbd\n"
        "tbd-version:     4\n"
        f"targets:         {targets}\n"
        "install-name:    '/usr/lib/libiconv.2.dylib'\n"
        "exports:\n"
        f"  - targets:         {targets}\n"
        "    symbols:         [ _iconv, _iconv_close, _iconv_open, _iconvctl, _libiconv, _libiconv_close, _libiconv_open ]\n"
        "...\n"
    )


if __name__ == "__main__":
    main()
