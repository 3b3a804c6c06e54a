"""The `ringleader` console command of the wheel: execs the node binary it carries.

maturin builds one Rust artifact per package (the extension), so the node binary travels as
a file inside the package (`ringleader/bin/ringleader`, put there by the build backend,
python/build_backend/ringleader_build.py) and this entry point replaces the Python process
with it (`os.execv`: same pid, signals and exit status as the binary's own).
`RINGLEADER_BIN` names another binary (a development build, for instance).
"""

import os
import sys


def binary() -> str:
    """The node binary this command runs: `RINGLEADER_BIN`, else the one in the package."""
    given = os.environ.get("RINGLEADER_BIN")
    if given:
        return given
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "ringleader")


def main() -> None:
    path = binary()
    if not os.access(path, os.X_OK):
        sys.exit(f"ringleader: no node binary at {path}: this install of the package has none "
                 "(build the wheel with scripts/build-wheel.sh, or set RINGLEADER_BIN)")
    os.execv(path, [path, *sys.argv[1:]])


if __name__ == "__main__":
    main()
