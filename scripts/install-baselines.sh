#!/usr/bin/env bash
# Install what the allreduce baselines (scripts/baseline_allreduce_{gloo,mpi}.py) and the
# network-namespace benchmarks need. Idempotent: anything already present is skipped.
#
#   scripts/install-baselines.sh [--no-torch] [--no-mpi]
#
# - apt: openmpi-bin libopenmpi-dev iperf3 (+ iproute2 for ip/tc)
# - pip: numpy, mpi4py (built against the system Open MPI), torch (CPU use only), optuna
#   (scripts/baseline_search_optuna.py), Ray Tune (`ray[tune]`) and cloudpickle
#   (scripts/bench-python.sh: Ray 2.60 installs for Python 3.11 here, about 100 MB)
#
# About torch: PyPI carries no CPU-only build of torch for Linux x86_64 (the "+cpu" wheels live on
# the PyTorch project's own index, which is not reachable here), and `pip install --no-deps torch`
# does not import without the nvidia-* libraries (torch preloads them at import time). So this
# installs the ordinary PyPI wheel, about 3 GB with its CUDA dependencies, and uses it on CPU.
#
# Must run as root (apt-get). Never run from CI: it downloads gigabytes.
set -euo pipefail

want_torch=1
want_mpi=1
for arg in "$@"; do
    case "$arg" in
        --no-torch) want_torch=0 ;;
        --no-mpi) want_mpi=0 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "usage: $0 [--no-torch] [--no-mpi]" >&2; exit 2 ;;
    esac
done

PY=${PYTHON:-python3}
log() { echo "[install-baselines] $*"; }

have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
have_py() { "$PY" -c "import $1" >/dev/null 2>&1; }

# ---- apt packages ----
apt_pkgs=(iperf3 iproute2)
if [ "$want_mpi" = 1 ]; then apt_pkgs+=(openmpi-bin libopenmpi-dev); fi
missing=()
for p in "${apt_pkgs[@]}"; do have_pkg "$p" || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "[install-baselines] need root for apt-get install ${missing[*]}" >&2
        exit 1
    fi
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}"
else
    log "apt packages present: ${apt_pkgs[*]}"
fi

# ---- python packages ----
if have_py numpy; then log "numpy present"; else log "pip install numpy"; "$PY" -m pip install -q numpy; fi
if have_py optuna; then log "optuna present"; else log "pip install optuna"; "$PY" -m pip install -q optuna; fi
if have_py ray.tune; then log "ray[tune] present"; else log "pip install ray[tune]"; "$PY" -m pip install -q "ray[tune]"; fi
if have_py cloudpickle; then log "cloudpickle present"; else log "pip install cloudpickle"; "$PY" -m pip install -q cloudpickle; fi

if [ "$want_mpi" = 1 ]; then
    if have_py mpi4py; then
        log "mpi4py present"
    else
        log "pip install mpi4py (compiles against the system Open MPI, ~1 min)"
        "$PY" -m pip install -q mpi4py
    fi
fi

if [ "$want_torch" = 1 ]; then
    if have_py torch; then
        log "torch present: $("$PY" -c 'import torch; print(torch.__version__)')"
    else
        log "pip install torch (PyPI wheel, ~3 GB with CUDA deps; used on CPU only)"
        "$PY" -m pip install -q torch
    fi
fi

# ---- check ----
"$PY" - <<'PYEOF'
import importlib
for m in ("numpy", "mpi4py", "torch", "optuna", "ray", "cloudpickle"):
    try:
        mod = importlib.import_module(m)
        extra = ""
        if m == "torch":
            import torch.distributed as dist
            extra = " gloo=%s" % dist.is_gloo_available()
        print("[install-baselines] ok %s %s%s" % (m, getattr(mod, "__version__", "?"), extra))
    except Exception as e:  # noqa: BLE001
        print("[install-baselines] missing %s (%s)" % (m, e))
PYEOF
command -v mpirun >/dev/null && log "ok $(mpirun --version 2>/dev/null | head -1)"
command -v iperf3 >/dev/null && log "ok $(iperf3 --version 2>/dev/null | head -1)"
