#!/usr/bin/env bash
# Builds the Python package's wheel (python/) with the node binary in it, installs it in a
# fresh virtualenv and checks that both `import ringleader` and the `ringleader` command work
# there. Not run by CI (a release build is about 9 minutes on 2 cores); run it before a
# release. The wheel is left in target/wheels/.
#
# Usage: scripts/build-wheel.sh [PYTHON]   (default python3; needs Python >= 3.10 and PyPI
# for maturin)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3}
work=target/wheel-build
rm -rf "$work"
mkdir -p "$work" target/wheels
# The node binary, in release: the build backend copies it into the package.
# (--workspace: a `-p` build after a workspace build re-resolves features and rebuilds.)
cargo build --release --locked --workspace
"$python" -m venv "$work/build-venv"
"$work/build-venv/bin/pip" install --quiet --disable-pip-version-check "maturin>=1.16,<2"
# `pip wheel` goes through the package's build backend (python/build_backend/), exactly as
# `pip install ./python` does; RINGLEADER_NODE_BINARY spares it a second cargo build.
# maturin's backend runs the `maturin` command: the build venv's bin goes first on PATH
# (without build isolation pip does not put it there).
PATH="$PWD/$work/build-venv/bin:$PATH" RINGLEADER_NODE_BINARY="$PWD/target/release/ringleader" \
    "$work/build-venv/bin/pip" wheel --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation -w target/wheels ./python
wheel=$(ls -t target/wheels/ringleader-*.whl | head -n1)
echo "built $wheel ($(du -h "$wheel" | cut -f1))"
# A fresh virtualenv, in a directory of its own so nothing resolves from the checkout.
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "$wheel"
cd "$work"
./venv/bin/python -c 'import ringleader; print("import ringleader", ringleader.__version__, "protocol", ringleader.PROTOCOL_VERSION); print(ringleader.metric.__module__)'
./venv/bin/python -c 'import ringleader; ringleader.metric("check", 1.5, 2)' | grep -qx 'ringleader-metric check 1.5 2'
# The wheel's dependencies came with it: `launch` pickles with cloudpickle.
./venv/bin/python -c 'import ringleader._launch as l; l._cloudpickle(); print("launch ok: cloudpickle installed")'
./venv/bin/ringleader --help | head -n 3
./venv/bin/ringleader --version
echo "wheel ok: $wheel"
