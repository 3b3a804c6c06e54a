#!/usr/bin/env bash
# The project's test command (README, .ci/run): every test of the workspace, then the `cuda`
# build (it must compile on a machine without CUDA) and its CPU-side GPU tests, then the docs.
set -euo pipefail
cd "$(dirname "$0")/.."
# Tests read what the project writes with the formats' own Python readers when they can
# (safetensors checkpoints, Prometheus' exposition, TensorBoard event files); best effort,
# never fatal: without them those tests say SKIPPED.
python3 -m pip install --quiet --disable-pip-version-check safetensors numpy prometheus_client >/dev/null 2>&1 || true
python3 -m pip install --quiet --disable-pip-version-check tensorboard >/dev/null 2>&1 || true
# The dashboard test renders the page in headless Chromium (about 30 s to install on Debian);
# without it that test says SKIPPED.
command -v chromium >/dev/null || (apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 || true)
# The CUDA kernels are checked on the CPU by compiling them as C++ (without g++ those tests
# say SKIPPED).
command -v g++ >/dev/null || (apt-get install -y --no-install-recommends g++ >/dev/null 2>&1 || true)
# The S3 checkpoint test runs against s3s-fs (a file-backed S3 server, ~2 min to build once);
# best effort too: without it that test says so and passes.
if ! command -v s3s-fs >/dev/null && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/s3s-fs" ]; then
    cargo install --quiet --locked s3s-fs --version 0.14.1 --features binary >/dev/null 2>&1 || true
fi
# The module structure first (a second): no import cycle, no import of a part that
# docs/design.md's table puts above (the script's own tests, then the check).
python3 scripts/check_layers_test.py
python3 scripts/check-layers.py
# The benchmark guard's reader (scripts/bench-check.sh runs by hand, not here): its figures
# and the floors file it reads.
python3 scripts/bench_check_test.py
# The Python tests' virtualenv (pytest, cloudpickle, torch), set up before the cargo tests: the
# node test that runs an unmodified PyTorch DDP script as a command job uses its python
# (RINGLEADER_TEST_PYTHON).
pyvenv=target/py-venv
if [ ! -x "$pyvenv/bin/pytest" ]; then
    python3 -m venv "$pyvenv"
    "$pyvenv/bin/pip" install --quiet --disable-pip-version-check pytest
fi
# cloudpickle for `Client.launch` (its tests skip without it).
"$pyvenv/bin/python" -c "import cloudpickle" 2>/dev/null ||
    "$pyvenv/bin/pip" install --quiet --disable-pip-version-check cloudpickle ||
    echo "cloudpickle not installed: the launch tests say SKIPPED"
# PyTorch for the `ringleader.torch` tests (python/tests/test_torch.py): the registry's wheel
# with its CUDA wheels, about 3 GB, a few minutes the first time and offline from pip's cache
# after; without it those tests say SKIPPED.
"$pyvenv/bin/python" -c "import torch" 2>/dev/null ||
    "$pyvenv/bin/pip" install --quiet --disable-pip-version-check torch ||
    echo "torch not installed: the torch tests say SKIPPED"
export RINGLEADER_TEST_PYTHON="$PWD/$pyvenv/bin/python"
# Every test's own output is kept (--show-output) so that a test that skipped part of itself
# (it prints "SKIPPED: why") is listed at the end instead of passing silently as `ok`.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace -- --show-output 2>&1 | tee "$log"
awk '
    /^---- .* stdout ----$/ { test = $2; next }
    /SKIPPED/ { sub(/^[[:space:]]+/, ""); print "  " (test == "" ? "?" : test) ": " $0 }
' "$log" | sort -u > "$log.skips"
if [ -s "$log.skips" ]; then
    echo "skipped (a tool or privilege this machine lacks): $(wc -l < "$log.skips")"
    cat "$log.skips"
else
    echo "skipped: none"
fi
rm -f "$log.skips"
# The README documents every flag and subcommand of the debug binary the tests just built
# (`--help`; hidden ones excepted), and every *Section* it refers to is one of its headings.
python3 scripts/check-readme.py target/debug/ringleader README.md
# The Python package (python/): its extension built in the dev profile and put next to the
# package (no wheel, no install), its type check, then its tests (pytest, in a virtualenv
# under target/) against real nodes of the debug binary the tests above built. pytest's
# exit 5 (no tests collected) is not a failure (the virtualenv is set up above).
# --workspace: the features the tests above built with (a `-p` build re-resolves them and
# rebuilds the collective, tokio and their dependencies under the extension: over 6 minutes
# on this 2-core machine).
cargo build --quiet --workspace
cp target/debug/lib_native.so python/ringleader/_native.abi3.so
# The package's types (python/pyproject.toml [tool.mypy]: `--strict` on every module), then
# its stub `_native.pyi` against the extension just built (stubtest): under a minute the
# first time (it reads torch's types), a few seconds with the cache under target/. Without
# torch, `ringleader.torch` is left out of it (its tests say SKIPPED too).
"$pyvenv/bin/python" -c "import mypy" 2>/dev/null ||
    "$pyvenv/bin/pip" install --quiet --disable-pip-version-check mypy
mypy_args=()
"$pyvenv/bin/python" -c "import torch" 2>/dev/null || {
    mypy_args=(--exclude 'ringleader/torch/')
    echo "skipped (type check): ringleader.torch, torch not installed"
}
(
    cd python
    export MYPY_CACHE_DIR="$OLDPWD/target/mypy-cache"
    "$OLDPWD/$pyvenv/bin/python" -m mypy "${mypy_args[@]}"
    "$OLDPWD/$pyvenv/bin/python" -m mypy.stubtest --mypy-config-file pyproject.toml ringleader._native
)
pytest_rc=0
RINGLEADER_TEST_BINARY="$PWD/target/debug/ringleader" \
    "$pyvenv/bin/python" -m pytest -q -rs -p no:cacheprovider python/tests || pytest_rc=$?
if [ "$pytest_rc" -ne 0 ] && [ "$pytest_rc" -ne 5 ]; then
    echo "python tests failed (pytest exit $pytest_rc)"
    exit "$pytest_rc"
fi
# The `cuda` build (trainer's CUDA backend, the collective's NCCL) compiles without CUDA, and
# its CPU-side tests run: the CUDA kernels compile with NVRTC, which needs no GPU (NVIDIA's
# libnvrtc wheel from PyPI, 90 MB, cached in target/nvrtc; without it that test says SKIPPED).
nvrtc=target/nvrtc
if [ ! -e "$nvrtc/libnvrtc.so" ]; then
    (
        set -e
        mkdir -p "$nvrtc/wheel"
        python3 -m pip download --quiet --disable-pip-version-check --no-deps \
            nvidia-cuda-nvrtc-cu12 -d "$nvrtc/wheel"
        python3 -m zipfile -e "$nvrtc"/wheel/*.whl "$nvrtc/wheel/x"
        cp "$nvrtc"/wheel/x/nvidia/cuda_nvrtc/lib/*.so* "$nvrtc/"
        ln -sf libnvrtc.so.12 "$nvrtc/libnvrtc.so"
        rm -rf "$nvrtc/wheel"
    ) >/dev/null 2>&1 || echo "libnvrtc not fetched: the NVRTC test will say SKIPPED"
fi
# One build for both: the workspace's libraries and binaries with `cuda` (the dependencies
# are the ones the tests above built; only the crates that use cudarc are built again), and
# the `gpu::` and `nccl::` unit tests in it (those that need a GPU say SKIPPED).
LD_LIBRARY_PATH="$PWD/$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo test --workspace --features ringleader/cuda --lib --bins -- --show-output gpu:: nccl:: 2>&1 | tee "$log"
grep -q "the_kernels_compile_with_nvrtc_for_the_devices_architecture ... ok" "$log"
if grep -q "SKIPPED" "$log"; then grep "SKIPPED" "$log" | sed 's/^/skipped (cuda build): /'; fi
# The deployments (deploy/): the systemd unit checked by systemd-analyze, and the Slurm
# script run in a one-host Slurm (it installs Debian's slurm-wlm when missing and says so;
# without root or the package it says SKIPPED).
scripts/test-systemd.sh target/debug/ringleader
scripts/test-slurm.sh target/debug/ringleader
# Every public doc renders without a broken link (the parts' module docs are the map).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
