#!/usr/bin/env python3
"""Writes the Go module in bindings/go as a module proxy serves it (GOPROXY=file://DIR):

    scripts/go-proxy.py VERSION TIME OUTDIR

OUTDIR/<module>/@v/{list, vVERSION.info, vVERSION.mod, vVERSION.zip}; the zip holds the
module's files under <module>@vVERSION/, with the repository's LICENSE (what the Go
command puts in the zip of a module in a subdirectory), and no directory entries.
"""
import json
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MOD = ROOT / "bindings" / "go"


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    version, time, outdir = "v" + sys.argv[1], sys.argv[2], Path(sys.argv[3])
    gomod = (MOD / "go.mod").read_text()
    module = gomod.split("\n", 1)[0].removeprefix("module ").strip()
    vdir = outdir / module / "@v"
    vdir.mkdir(parents=True, exist_ok=True)
    (vdir / "list").write_text(version + "\n")
    (vdir / f"{version}.info").write_text(json.dumps({"Version": version, "Time": time}) + "\n")
    (vdir / f"{version}.mod").write_text(gomod)
    # the committed files only (not binaries a build left there)
    out = subprocess.run(["git", "-C", str(MOD), "ls-files", "-z", "."], check=True, capture_output=True).stdout
    names = [name for name in out.decode().split("\0") if name]
    # a directory with a go.mod of its own is another module (leaktest/): not in this zip
    nested = {name.rsplit("/", 1)[0] + "/" for name in names if name.endswith("/go.mod")}
    files = sorted(MOD / name for name in names if not any(name.startswith(d) for d in nested))
    with zipfile.ZipFile(vdir / f"{version}.zip", "w", zipfile.ZIP_DEFLATED) as z:
        prefix = f"{module}@{version}/"
        for f in files:
            z.writestr(zipfile.ZipInfo(prefix + f.relative_to(MOD).as_posix(), (1980, 1, 1, 0, 0, 0)), f.read_bytes())
        if not (MOD / "LICENSE").exists():
            z.writestr(zipfile.ZipInfo(prefix + "LICENSE", (1980, 1, 1, 0, 0, 0)), (ROOT / "LICENSE").read_bytes())
    print(vdir / f"{version}.zip")


if __name__ == "__main__":
    main()
