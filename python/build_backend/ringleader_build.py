"""The package's PEP 517 build backend: maturin's, after the node binary is put in the package.

maturin builds one Rust artifact per project (here the extension `ringleader._native`), so
the node binary, a second crate of the workspace, is built here first with cargo in release
and copied to `ringleader/bin/ringleader`; the wheel carries it and the console command
`ringleader` (ringleader/_cli.py) execs it. `RINGLEADER_NODE_BINARY=/path/to/ringleader`
uses a binary already built instead (scripts/build-wheel.sh passes the one it built).
Only wheels carry the binary: an sdist is the sources, and building it into a wheel builds
the binary again.
"""

import os
import shutil
import subprocess

import maturin

# The rest of the backend, as maturin has it.
build_sdist = maturin.build_sdist
get_requires_for_build_editable = maturin.get_requires_for_build_editable
get_requires_for_build_sdist = maturin.get_requires_for_build_sdist
get_requires_for_build_wheel = maturin.get_requires_for_build_wheel
prepare_metadata_for_build_editable = maturin.prepare_metadata_for_build_editable
prepare_metadata_for_build_wheel = maturin.prepare_metadata_for_build_wheel

PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ringleader")
WORKSPACE = os.path.dirname(os.path.dirname(PACKAGE_DIR))


def _bundle_node_binary():
    """Copies the release node binary to ringleader/bin/ringleader (building it if needed)."""
    given = os.environ.get("RINGLEADER_NODE_BINARY")
    if given:
        binary = given
    else:
        subprocess.run(
            ["cargo", "build", "--release", "--locked", "-p", "ringleader", "--bin", "ringleader"],
            cwd=WORKSPACE,
            check=True,
        )
        binary = os.path.join(WORKSPACE, "target", "release", "ringleader")
    dest_dir = os.path.join(PACKAGE_DIR, "bin")
    os.makedirs(dest_dir, exist_ok=True)
    dest = os.path.join(dest_dir, "ringleader")
    shutil.copyfile(binary, dest)
    os.chmod(dest, 0o755)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _bundle_node_binary()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _bundle_node_binary()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)
