#!/usr/bin/env bash
# The project's test command (README, .ci/run): every test of the workspace, the Python
# package's, the deployments', then the `cuda` build (it must compile on a machine without
# CUDA) and its CPU-side GPU tests, then the docs.
#
# Every step runs even after one failed (cargo with --no-fail-fast), and the run ends with one
# line, `tests: N passed, N failed, N skipped`, then the failed steps; the exit status is 1 if
# any step failed. What it installs (best effort: without a tool, the tests that need it say
# SKIPPED) it says it installs, once, before it does.
set -uo pipefail
cd "$(dirname "$0")/.."

failed_steps=()
n_passed=0
n_failed=0
n_skipped=0
# How long each part took, printed at the end (CI's time is held under a bound: these say
# where it goes).
timings=()
# Notes that the part `$1` began at $2 (bash's SECONDS) and ends now.
took() { timings+=("$(printf '%5d s  %s' $((SECONDS - $2)) "$1")"); }
# Runs a step (a command) and counts it as one test: passed, or failed with its name kept.
step() {
    local name=$1 began=$SECONDS
    shift
    if "$@"; then
        n_passed=$((n_passed + 1))
    else
        local rc=$?
        n_failed=$((n_failed + 1))
        failed_steps+=("$name (exit $rc)")
    fi
    took "$name" "$began"
}
# Adds the counts of cargo's `test result:` lines in a log, and its tests that said SKIPPED
# (run as `ok` by cargo, counted here as skipped), to the totals.
count_cargo() {
    local log=$1 p f i s
    read -r p f i < <(awk '/^test result:/ {
        for (k = 1; k <= NF; k++) {
            if ($k ~ /^passed/) p += $(k - 1); if ($k ~ /^failed/) f += $(k - 1); if ($k ~ /^ignored/) i += $(k - 1)
        }
    } END { print p + 0, f + 0, i + 0 }' "$log")
    s=$(awk '/^---- .* stdout ----$/ { test = $2; next } /SKIPPED/ { print test }' "$log" | sort -u | grep -c . || true)
    n_passed=$((n_passed + p - s))
    n_failed=$((n_failed + f))
    n_skipped=$((n_skipped + i + s))
}
# `WHAT (WHY)` is about to be installed.
installing() { echo "test.sh: installing $1 ($2)"; }
py_has() { "$1" -c "import $2" 2>/dev/null; }

# Tests read what the project writes with the formats' own Python readers when they can
# (safetensors checkpoints, Prometheus' exposition, TensorBoard event files).
for module in safetensors numpy prometheus_client tensorboard; do
    py_has python3 "$module" && continue
    installing "$module" "pip: a test reads the project's files with it"
    python3 -m pip install --quiet --disable-pip-version-check "$module" >/dev/null 2>&1 || true
done
# The dashboard test renders the page in headless Chromium (about 30 s to install on Debian).
if ! command -v chromium >/dev/null; then
    installing chromium "apt-get: the dashboard test renders the page"
    apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 || true
fi
# The CUDA kernels are checked on the CPU by compiling them as C++.
if ! command -v g++ >/dev/null; then
    installing g++ "apt-get: the CUDA kernels are checked on the CPU"
    apt-get install -y --no-install-recommends g++ >/dev/null 2>&1 || true
fi
# The S3 checkpoint test runs against s3s-fs (a file-backed S3 server, ~2 min to build once).
if ! command -v s3s-fs >/dev/null && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/s3s-fs" ]; then
    installing s3s-fs "cargo install: the S3 checkpoint test's server"
    cargo install --quiet --locked s3s-fs --version 0.14.1 --features binary >/dev/null 2>&1 || true
fi
took "installing what is missing (pip, apt-get, cargo install)" 0
# The module structure first (a second): no import cycle, no import of a part that
# docs/book/src/design/design.md's table puts above (the script's own tests, then the check).
step "check-layers tests" python3 scripts/check_layers_test.py
step "check-layers" python3 scripts/check-layers.py
# The replicated domain's crate builds without the trainer: no candle, opendal, gemm or
# `trainer` in its dependency tree (`ringleader-spec`, carved from the trainer, is its one
# source of the trainer's tables). Package names are compared, not paths (the spec crate lives
# in trainer/spec/).
domain_without_trainer() {
    local found
    found=$(cargo tree -p ringleader-domain --prefix none --format '{p}' | awk '{print $1}' |
        sort -u | grep -E '^(candle|opendal|gemm)|^trainer$')
    if [ -n "$found" ]; then
        echo "ringleader-domain depends on $(echo $found) (node/domain/Cargo.toml): it must not"
        return 1
    fi
}
step "domain without the trainer" domain_without_trainer
# The benchmark guard's reader (scripts/bench-check.sh runs by hand, not here): its figures
# and the floors file it reads.
step "bench-check reader tests" python3 scripts/bench_check_test.py
# The sharing benchmark's figures (scripts/bench-sharing.sh, by hand too) on a fabricated record.
step "bench-sharing figures tests" python3 scripts/bench_sharing_test.py
# The device kit's visit (scripts/gpu-visit.sh, run from the kit on a GPU machine): both
# scripts parse, and the visit's dry run lists every part, runs nothing and ends well.
gpu_visit_dry() {
    local out p
    bash -n scripts/gpu-visit.sh && bash -n scripts/gpu-kit.sh || return 1
    out=$(bash scripts/gpu-visit.sh --dry-run) || return 1
    for p in setup nccl-allreduce train-worker bench-gpu-256 bench-gpu-4096 node-gpu-job \
        torch-ddp-ringleader torch-ddp-nccl torch-commit rust-nccl-kill9 local-rank-job elastic-torch; do
        grep -q "^DRY $p on " <<<"$out" || { echo "gpu-visit --dry-run lists no $p"; return 1; }
    done
    grep -q '^visit done in .*: 0 failed$' <<<"$out"
}
step "gpu-visit dry run" gpu_visit_dry
# The Python tests' virtualenv (pytest, cloudpickle, torch), set up before the cargo tests: the
# node test that runs an unmodified PyTorch DDP script as a command job uses its python
# (RINGLEADER_TEST_PYTHON).
pyvenv=target/py-venv
began=$SECONDS
pip_venv() { "$pyvenv/bin/pip" install --quiet --disable-pip-version-check "$@"; }
if [ ! -x "$pyvenv/bin/pytest" ]; then
    installing "a virtualenv with pytest in $pyvenv" "the Python tests"
    python3 -m venv "$pyvenv" && pip_venv pytest
fi
# cloudpickle for `Client.launch` (its tests skip without it).
if ! py_has "$pyvenv/bin/python" cloudpickle; then
    installing cloudpickle "pip, in $pyvenv: Client.launch"
    pip_venv cloudpickle || echo "cloudpickle not installed: the launch tests say SKIPPED"
fi
# PyTorch for the `ringleader.torch` tests (python/tests/test_torch.py): the registry's wheel
# with its CUDA wheels, about 3 GB, a few minutes the first time and offline from pip's cache
# after.
if ! py_has "$pyvenv/bin/python" torch; then
    installing torch "pip, in $pyvenv, about 3 GB: the ringleader.torch tests"
    pip_venv torch || echo "torch not installed: the torch tests say SKIPPED"
fi
export RINGLEADER_TEST_PYTHON="$PWD/$pyvenv/bin/python"
# The Kubernetes manifest (deploy/kubernetes/, not run here: no cluster is reachable) against
# the Kubernetes schemas, offline and strict (kubernetes-validate from PyPI, in $pyvenv).
if ! py_has "$pyvenv/bin/python" kubernetes_validate; then
    installing kubernetes-validate "pip, in $pyvenv: the Kubernetes manifest's schema check"
    pip_venv kubernetes-validate >/dev/null 2>&1 || true
fi
took "the Python virtualenv (pytest, cloudpickle, torch, kubernetes-validate)" "$began"
if [ -x "$pyvenv/bin/kubernetes-validate" ]; then
    step "kubernetes-validate" "$pyvenv/bin/kubernetes-validate" --strict --quiet deploy/kubernetes/ringleader.yaml
else
    echo "SKIPPED: kubernetes-validate could not be installed: deploy/kubernetes/ringleader.yaml not checked"
    n_skipped=$((n_skipped + 1))
fi
# Every test's own output is kept (--show-output) so that a test that skipped part of itself
# (it prints "SKIPPED: why") is listed at the end instead of passing silently as `ok`.
log=$(mktemp)
trap 'rm -f "$log" "$log.skips"' EXIT
cargo_rc=0
began=$SECONDS
cargo test --workspace --no-fail-fast -- --show-output 2>&1 | tee "$log" || cargo_rc=$?
took "cargo test --workspace (build and run)" "$began"
count_cargo "$log"
if [ "$cargo_rc" -ne 0 ]; then failed_steps+=("cargo test --workspace (exit $cargo_rc)"); fi
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
# The book (docs/book/src) documents every flag and subcommand of the debug binary the tests
# just built in its CLI reference (`--help`; hidden ones excepted) and every key of a job spec
# in its spec reference, and every link of the book and the README leads somewhere
# (scripts/check-book.py, standard library only: it runs whether mdBook is here or not).
step "check-book" python3 scripts/check-book.py target/debug/ringleader
# Then the book's build with mdBook (into target/book/): a page SUMMARY.md lists but src/
# lacks fails it (mdBook only warns about an include that leads nowhere: check-book fails on
# it). mdBook is a crate, not a Debian or PyPI package: cargo install, about 2.5 minutes once
# on 2 cores, kept in cargo's bin/.
mdbook=$(command -v mdbook || echo "${CARGO_HOME:-$HOME/.cargo}/bin/mdbook")
began=$SECONDS
if [ ! -x "$mdbook" ]; then
    installing mdbook "cargo install, about 2.5 min once: the book's build"
    cargo install --quiet --locked mdbook --version 0.5.4 --no-default-features >/dev/null 2>&1 || true
fi
took "installing mdbook" "$began"
book_build() {
    local out
    out=$("$mdbook" build docs/book 2>&1) || { echo "$out"; return 1; }
}
if [ -x "$mdbook" ]; then
    step "mdbook build" book_build
else
    echo "SKIPPED: mdbook could not be installed: the book was checked (check-book) but not built"
    n_skipped=$((n_skipped + 1))
fi
# The Python package (python/): its extension built in the dev profile and put next to the
# package (no wheel, no install), its type check, then its tests (pytest, in a virtualenv
# under target/) against real nodes of the debug binary the tests above built. pytest's
# exit 5 (no tests collected) is not a failure (the virtualenv is set up above).
# --workspace: the features the tests above built with (a `-p` build re-resolves them and
# rebuilds the collective, tokio and their dependencies under the extension: over 6 minutes
# on this 2-core machine).
step "cargo build --workspace" cargo build --quiet --workspace
cp target/debug/lib_native.so python/ringleader/_native.abi3.so
# The package's types (python/pyproject.toml [tool.mypy]: `--strict` on every module), then
# its stub `_native.pyi` against the extension just built (stubtest): under a minute the
# first time (it reads torch's types), a few seconds with the cache under target/. Without
# torch, `ringleader.torch` is left out of it (its tests say SKIPPED too).
if ! py_has "$pyvenv/bin/python" mypy; then
    installing mypy "pip, in $pyvenv: the package's type check"
    pip_venv mypy
fi
mypy_args=()
py_has "$pyvenv/bin/python" torch || {
    mypy_args=(--exclude 'ringleader/torch/')
    echo "skipped (type check): ringleader.torch, torch not installed"
}
mypy_cache="$PWD/target/mypy-cache"
in_python() { (cd python && MYPY_CACHE_DIR="$mypy_cache" "$@"); }
step "mypy --strict" in_python "../$pyvenv/bin/python" -m mypy "${mypy_args[@]}"
step "stubtest" in_python "../$pyvenv/bin/python" -m mypy.stubtest --mypy-config-file pyproject.toml ringleader._native
pytest_rc=0
began=$SECONDS
RINGLEADER_TEST_BINARY="$PWD/target/debug/ringleader" \
    "$pyvenv/bin/python" -m pytest -q -rs -p no:cacheprovider python/tests 2>&1 | tee "$log" || pytest_rc=$?
took "python tests" "$began"
# pytest -q's last line: `N failed, N passed, N skipped, … in T s` (any of them).
for kind in passed failed skipped error; do
    n=$(tail -n 5 "$log" | grep -oE "[0-9]+ $kind" | tail -n1 | cut -d' ' -f1)
    case $kind in
        passed) n_passed=$((n_passed + ${n:-0})) ;;
        failed | error) n_failed=$((n_failed + ${n:-0})) ;;
        skipped) n_skipped=$((n_skipped + ${n:-0})) ;;
    esac
done
if [ "$pytest_rc" -ne 0 ] && [ "$pytest_rc" -ne 5 ]; then
    failed_steps+=("python tests (pytest exit $pytest_rc)")
fi
# The deployments (deploy/): the systemd unit checked by systemd-analyze, and the Slurm
# script run in a one-host Slurm (it installs Debian's slurm-wlm when missing and says so;
# without root or the package it says SKIPPED).
for deploy in systemd slurm; do
    began=$SECONDS
    out=$(scripts/test-$deploy.sh target/debug/ringleader 2>&1)
    rc=$?
    took "scripts/test-$deploy.sh" "$began"
    echo "$out" | grep -v "^[0-9TZ:.-]* *\(INFO\|WARN\|DEBUG\)" | tail -n 20
    if [ "$rc" -ne 0 ]; then
        n_failed=$((n_failed + 1))
        failed_steps+=("scripts/test-$deploy.sh (exit $rc)")
    elif echo "$out" | grep -q SKIPPED; then
        n_skipped=$((n_skipped + 1))
    else
        n_passed=$((n_passed + 1))
    fi
done
# The `cuda` build (trainer's CUDA backend, the collective's NCCL) compiles without CUDA, and
# its CPU-side tests run: the CUDA kernels compile with NVRTC, which needs no GPU (NVIDIA's
# libnvrtc wheel from PyPI, 90 MB, cached in target/nvrtc; without it that test says SKIPPED).
nvrtc=target/nvrtc
if [ ! -e "$nvrtc/libnvrtc.so" ]; then
    installing libnvrtc "pip download of nvidia-cuda-nvrtc-cu12 into $nvrtc: the NVRTC test"
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
cuda_rc=0
began=$SECONDS
LD_LIBRARY_PATH="$PWD/$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo test --workspace --no-fail-fast --features ringleader/cuda --lib --bins -- --show-output gpu:: nccl:: 2>&1 | tee "$log" || cuda_rc=$?
took "cargo test --features ringleader/cuda (build and run)" "$began"
count_cargo "$log"
if [ "$cuda_rc" -ne 0 ]; then failed_steps+=("cargo test --features ringleader/cuda (exit $cuda_rc)"); fi
step "the kernels compile with NVRTC" grep -q "the_kernels_compile_with_nvrtc_for_the_devices_architecture ... ok" "$log"
if grep -q "SKIPPED" "$log"; then grep "SKIPPED" "$log" | sed 's/^/skipped (cuda build): /'; fi
# Every public doc renders without a broken link (the parts' module docs are the map).
step "cargo doc" env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
# The fuzz targets (node/fuzz, a workspace of its own, fuzzed by scripts/fuzz.sh with nightly)
# are one line each around a body in node/fuzz/bodies/ that the hostile_bytes tests above
# compile and run; `every_fuzz_target_is_a_body_that_runs_here` checks that form. (Checking
# the fuzz workspace itself took 133 s of CI's 35 minutes: every crate again, in check mode.)

echo "time by part (of $SECONDS s in all):"
printf '%s\n' "${timings[@]}" | sort -rn | head -n 12
echo "tests: $n_passed passed, $n_failed failed, $n_skipped skipped"
if [ "${#failed_steps[@]}" -gt 0 ]; then
    echo "failed steps:"
    printf '  %s\n' "${failed_steps[@]}"
    exit 1
fi
