"""The PEP 517 build backend of shardlimit's sdist: maturin's, once Rust is known to be there.

Building shardlimit from source compiles its Rust core, so it needs cargo. Without it,
maturin would fetch a Rust toolchain on its own (a large download and a long compile) or,
offline, fail deep inside that step; this backend says what is missing in one message
instead. Prebuilt wheels (`pip install shardlimit` on a supported platform) need no Rust.
"""

import os
import shutil
import sys

_MESSAGE = (
    "shardlimit: building from source needs Rust (cargo was not found on PATH).\n"
    "  Install a prebuilt wheel instead (pip install --only-binary shardlimit shardlimit),\n"
    "  or install Rust (https://rustup.rs) and retry.\n"
)


def _require_cargo() -> None:
    if shutil.which(os.environ.get("CARGO", "cargo")) is None:
        sys.stderr.write(_MESSAGE)
        sys.stderr.flush()
        raise SystemExit(1)


def _maturin():  # type: ignore[no-untyped-def]
    _require_cargo()
    import maturin

    return maturin


def get_requires_for_build_wheel(config_settings=None):  # type: ignore[no-untyped-def]
    return _maturin().get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):  # type: ignore[no-untyped-def]
    return _maturin().get_requires_for_build_sdist(config_settings)


def get_requires_for_build_editable(config_settings=None):  # type: ignore[no-untyped-def]
    return _maturin().get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):  # type: ignore[no-untyped-def]
    return _maturin().prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):  # type: ignore[no-untyped-def]
    return _maturin().prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):  # type: ignore[no-untyped-def]
    return _maturin().build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):  # type: ignore[no-untyped-def]
    return _maturin().build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):  # type: ignore[no-untyped-def]
    return _maturin().build_sdist(sdist_directory, config_settings)
