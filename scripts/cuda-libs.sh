# Sourced by bench-gpu.sh (and by hand before running the `cuda` test binaries): finds the
# CUDA libraries the trainer and the collective load at run time and puts them where cudarc's
# dynamic loading looks, as the node does for its ranks (collective's `cuda_libs`).
#
#   . scripts/cuda-libs.sh; cuda_libs_env DIR
#
# cudarc, built for CUDA 12.8, dlopens `libcublas.so`, `libcublas.so.12`, ... and
# `libnccl.so`, never `libcublas.so.13` (CUDA 13) nor `libnccl.so.2` (the only NCCL file of
# NVIDIA's runtime packages and PyTorch's wheels). cuda_libs_env looks for each library in
# LD_LIBRARY_PATH, the linker cache (`ldconfig -p`, read whole: a pipe into `grep -q` or an
# early `exit` kills ldconfig with SIGPIPE, which `set -o pipefail` turns into status 141), the
# CUDA toolkit (CUDA_HOME, /usr/local/cuda*: lib64 and CUDA 13's targets/*/lib) and the
# nvidia-* Python wheels (nvidia/*/lib, CUDA 13's nvidia/cu13/lib), newest major first; links
# each one found as DIR/lib<name>.so, and puts DIR and the found libraries' directories (for
# their own dependencies, libcublasLt say) in front of LD_LIBRARY_PATH. It prints one line
# per library to stderr ("cuda libs: cublas=/path ..."); a missing one is left out.
# Only the CUDA majors the driver supports are taken (cuBLAS 13 and NVRTC 13 fail under a
# 12.x driver): the newest is nvidia-smi's "CUDA Version" (cuda_driver_major), as the node
# asks cuDriverGetVersion; with no nvidia-smi, every major, newest first.

# The CUDA major in nvidia-smi's header ("... CUDA Version: 12.8 |") read on stdin; nothing
# when there is none.
cuda_major_of_smi() {
    sed -n 's/.*CUDA Version: *\([0-9][0-9]*\)\..*/\1/p' | head -n 1
}

# The newest CUDA major this host's driver supports, or nothing without nvidia-smi.
cuda_driver_major() {
    local smi
    smi=$(nvidia-smi 2>/dev/null) || return 0
    cuda_major_of_smi <<<"$smi"
}

cuda_libs_env() {
    local dir=$1 cache dirs=() found=() name path d py driver
    mkdir -p "$dir"
    driver=$(cuda_driver_major)
    cache=$(ldconfig -p 2>/dev/null || true)
    IFS=: read -r -a dirs <<<"${LD_LIBRARY_PATH:-}"
    for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-*; do
        [[ -n "$d" && -d "$d" ]] || continue
        dirs+=("$d/lib64" "$d"/targets/*/lib)
    done
    py=${PYTHON:-python3}
    if command -v "$py" >/dev/null 2>&1; then
        while IFS= read -r d; do dirs+=("$d"); done < <("$py" - 2>/dev/null <<'EOF' || true
import glob, os, sys
for p in sys.path:
    for d in sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib"))):
        print(d)
EOF
)
    fi
    for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib; do dirs+=("$d"); done
    for name in cuda:1 cublas:13,12 cublasLt:13,12 nvrtc:13,12 nccl:2; do
        local lib=${name%%:*} majors=${name##*:} m
        path=""
        IFS=, read -r -a ms <<<"$majors"
        for m in "${ms[@]}"; do
            # cuBLAS, cuBLASLt and NVRTC's majors are CUDA's; libcuda and NCCL version alone.
            case $lib in cublas | cublasLt | nvrtc)
                [[ -n "$driver" && "$m" -gt "$driver" ]] && continue ;;
            esac
            for d in "${dirs[@]}"; do
                [[ -n "$d" && -e "$d/lib$lib.so.$m" ]] && { path="$d/lib$lib.so.$m"; break; }
            done
            if [[ -z "$path" ]]; then
                path=$(awk -v n="lib$lib.so.$m" '$1 == n && !p { print $NF; p = 1 }' <<<"$cache")
            fi
            [[ -n "$path" ]] && break
        done
        [[ -n "$path" ]] || continue
        path=$(readlink -f "$path")
        ln -sfn "$path" "$dir/lib$lib.so"
        found+=("$lib=$path")
        case ":${LD_LIBRARY_PATH:-}:" in
            *":$(dirname "$path"):"*) ;;
            *) export LD_LIBRARY_PATH="$(dirname "$path")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
        esac
    done
    export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "cuda libs: ${found[*]:-none found} (driver's CUDA major: ${driver:-unknown})" >&2
}
