#!/usr/bin/env bash
# Builds the Python package's wheel (python/) with the node binary in it, gives it the
# platform tag its ELF files really satisfy (`auditwheel show`: the oldest manylinux policy
# that the extension and the bundled binary both meet), installs it in a fresh virtualenv and
# checks that both `import ringleader` and the `ringleader` command work there; then a
# release tarball of the binary alone with its SHA-256. Not run by CI (a first release build
# takes about 28 minutes on 2 cores); run it before a release. The wheel is left in target/wheels/,
# the tarball and its checksum in target/dist/.
#
# Usage: scripts/build-wheel.sh [--node BINARY] [--strip] [PYTHON]   (default python3; needs
# Python >= 3.10 and PyPI for maturin)
#   --node BINARY  bundle this node binary (say, a `--features cuda` build) instead of building
#                  the workspace; no tarball then (scripts/gpu-kit.sh)
#   --strip        strip the extension (maturin's --strip): 15 MB of line tables less
# MATURIN_VENV=DIR uses the maturin of an existing virtualenv instead of installing one.
set -euo pipefail
cd "$(dirname "$0")/.."
node=""
strip=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --node) node=$2; shift 2 ;;
        --strip) strip=--strip; shift ;;
        *) break ;;
    esac
done
python=${1:-python3}
work=target/wheel-build
rm -rf "$work"
mkdir -p "$work" target/wheels
# The node binary, in release: the build backend copies it into the package.
# (--workspace: a `-p` build after a workspace build re-resolves features and rebuilds.)
if [[ -z "$node" ]]; then
    cargo build --release --locked --workspace
    node="$PWD/target/release/ringleader"
fi
node=$(realpath "$node")
if [[ -n "${MATURIN_VENV:-}" ]]; then
    ln -s "$(realpath "$MATURIN_VENV")" "$work/build-venv"
else
    "$python" -m venv "$work/build-venv"
    "$work/build-venv/bin/pip" install --quiet --disable-pip-version-check "maturin>=1.16,<2"
fi
# `pip wheel` goes through the package's build backend (python/build_backend/), exactly as
# `pip install ./python` does; RINGLEADER_NODE_BINARY spares it a second cargo build.
# maturin's backend runs the `maturin` command: the build venv's bin goes first on PATH
# (without build isolation pip does not put it there).
PATH="$PWD/$work/build-venv/bin:$PATH" RINGLEADER_NODE_BINARY="$node" MATURIN_PEP517_ARGS="$strip" \
    "$work/build-venv/bin/pip" wheel --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation -w target/wheels ./python
wheel=$(ls -t target/wheels/ringleader-*.whl | head -n1)
echo "built $wheel ($(du -h "$wheel" | cut -f1))"
# The platform tag: what auditwheel finds the wheel's ELF files (the extension and the node
# binary) consistent with, in place of the build's `linux_x86_64`, which pip would take for
# a promise about no glibc at all.
"$work/build-venv/bin/pip" install --quiet --disable-pip-version-check auditwheel "wheel>=0.42"
shown=$("$work/build-venv/bin/auditwheel" show "$wheel")
echo "$shown" | sed 's/^/auditwheel: /'
# (auditwheel wraps its sentence: the line breaks become spaces before the match.)
plat=$(echo "$shown" | tr '\n' ' ' | tr -s ' ' | grep -oE 'consistent with the following platform tag: *"[a-z0-9_]+"' |
    grep -oE '"[a-z0-9_]+"' | tr -d '"')
[ -n "$plat" ] || { echo "build-wheel: auditwheel named no platform tag" >&2; exit 1; }
case $wheel in
    *"$plat"*) ;;
    *)
        "$work/build-venv/bin/python" -m wheel tags --remove --platform-tag "$plat" "$wheel" >/dev/null
        wheel=$(ls -t target/wheels/ringleader-*"$plat"*.whl | head -n1)
        ;;
esac
echo "tagged $wheel"
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
cd - >/dev/null
# A wheel around a given binary is all the caller asked for.
[[ "$node" == "$(realpath target/release/ringleader 2>/dev/null)" ]] || exit 0
# The release tarball: the binary, the README and the deployments' files, with its checksum.
version=$(target/release/ringleader --version | awk '{print $2}')
name="ringleader-$version-$(uname -m)-linux"
rm -rf "target/dist/$name"
mkdir -p "target/dist/$name"
cp target/release/ringleader README.md "target/dist/$name/"
cp -r deploy "target/dist/$name/"
tar -C target/dist -czf "target/dist/$name.tar.gz" "$name"
rm -rf "target/dist/$name"
(cd target/dist && sha256sum "$name.tar.gz" > "$name.tar.gz.sha256")
echo "tarball ok: target/dist/$name.tar.gz ($(du -h "target/dist/$name.tar.gz" | cut -f1)), $(cut -c1-16 "target/dist/$name.tar.gz.sha256")…"
