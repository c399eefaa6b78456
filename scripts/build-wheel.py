#!/usr/bin/env python3
"""Packs the Python wheel from the extension module of the shared release build.

    scripts/build-wheel.py EXTENSION PLATFORM_TAG OUTDIR

EXTENSION is lib_shardlimit.so as `cargo zigbuild --profile dist` left it (linked against
glibc PLATFORM_TAG's floor, e.g. manylinux_2_28_x86_64). scripts/dist.sh uses this instead
of `maturin build`, which would compile the core a second time with its own linker setup:
the wheel is a zip of bindings/python/python/shardlimit plus that module as
shardlimit/_shardlimit.abi3.so (shardlimit/_shardlimit.pyd in a win_* wheel: Windows'
CPython has no abi3 suffix), and a .dist-info whose METADATA comes from
bindings/python/pyproject.toml, the version from [workspace.package], the README and
LICENSE. `auditwheel show` (scripts/dist.sh) then checks the tag against the symbols.
"""
import base64
import hashlib
import io
import os
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = ROOT / "bindings" / "python"


def workspace_version() -> str:
    return tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]


def metadata(version: str) -> str:
    project = tomllib.loads((PY / "pyproject.toml").read_text())["project"]
    lines = [
        "Metadata-Version: 2.4",
        f"Name: {project['name']}",
        f"Version: {version}",
        f"Summary: {project['description']}",
        f"Keywords: {','.join(project.get('keywords', []))}",
    ]
    for author in project.get("authors", []):
        lines.append(f"Author: {author['name']}")
    lines.append(f"License-Expression: {project['license']}")
    lines.append("License-File: LICENSE")
    lines += [f"Classifier: {c}" for c in project.get("classifiers", [])]
    lines.append(f"Requires-Python: {project['requires-python']}")
    for extra, reqs in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {r} ; extra == \"{extra}\"" for r in reqs]
    for label, url in project.get("urls", {}).items():
        lines.append(f"Project-URL: {label}, {url}")
    lines.append("Description-Content-Type: text/markdown; charset=UTF-8; variant=GFM")
    return "\n".join(lines) + "\n\n" + (PY / project["readme"]).read_text()


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    ext, plat, outdir = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    version = workspace_version()
    tag = f"cp39-abi3-{plat}"
    info = f"shardlimit-{version}.dist-info"
    files: list[tuple[str, bytes, int]] = []  # (name in the wheel, bytes, mode)
    pkg = PY / "python" / "shardlimit"
    for f in sorted(pkg.rglob("*")):
        # sources only: a native module left in the tree by `maturin develop` would go into
        # the wheel beside EXTENSION under the same name
        if (
            f.is_file()
            and "__pycache__" not in f.parts
            and f.suffix not in (".pyc", ".so", ".pyd", ".dylib")
        ):
            files.append((f"shardlimit/{f.relative_to(pkg).as_posix()}", f.read_bytes(), 0o644))
    module = "_shardlimit.pyd" if plat.startswith("win") else "_shardlimit.abi3.so"
    files.append((f"shardlimit/{module}", ext.read_bytes(), 0o755))
    files.append((f"{info}/METADATA", metadata(version).encode(), 0o644))
    wheel = f"Wheel-Version: 1.0\nGenerator: shardlimit scripts/build-wheel.py\nRoot-Is-Purelib: false\nTag: {tag}\n"
    files.append((f"{info}/WHEEL", wheel.encode(), 0o644))
    files.append((f"{info}/licenses/LICENSE", (ROOT / "LICENSE").read_bytes(), 0o644))
    record = io.StringIO()
    for name, data, _ in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{name},sha256={digest},{len(data)}\n")
    record.write(f"{info}/RECORD,,\n")
    files.append((f"{info}/RECORD", record.getvalue().encode(), 0o644))

    outdir.mkdir(parents=True, exist_ok=True)
    out = outdir / f"shardlimit-{version}-{tag}.whl"
    # reproducible: fixed timestamps (SOURCE_DATE_EPOCH if set), sorted as written
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
    stamp = max(epoch, 315532800)
    import time
    date = time.gmtime(stamp)[:6]
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, mode in files:
            zi = zipfile.ZipInfo(name, date_time=date)
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    print(out)


if __name__ == "__main__":
    main()
