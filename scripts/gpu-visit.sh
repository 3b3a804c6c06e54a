#!/usr/bin/env bash
# A visit to a GPU machine, run from the device kit (scripts/gpu-kit.sh builds it) on a
# machine with no Rust: `bash target/gpu-kit/scripts/gpu-visit.sh [--dry-run]`, within
# 8 minutes. Every line says what ran and on which device:
#
#   PASS|FAIL NAME on DEVICE (S s): what it printed that matters
#   SKIP NAME: why (no GPU, one GPU where it needs two, no torch with CUDA)
#   DRY NAME on DEVICE: the command (--dry-run: nothing runs, every part is listed)
#
# The parts, in order (each under its own deadline; a failure does not stop the others):
#   setup            unpack the wheel (no pip: a wheel is a zip) beside the kit; its node
#                    binary is the visit's `ringleader`
#   nccl-allreduce   collective-bench --nccl, one rank on GPU 0            (1+ GPU)
#   train-worker     train-worker on cuda, one rank, gradients by NCCL      (1+ GPU)
#   bench-gpu-B      scripts/bench-gpu.sh at batch B = 256 and 4096 (ringleader beside
#                    PyTorch eager), and PyTorch with the step in a CUDA graph  (1+ GPU)
#   node-gpu-job     a node offering its GPUs runs a train job, gpus_per_worker = 1 (1+ GPU)
#   torch-ddp-B      gpu_torch_check.py ddp on CUDA tensors, backend B = ringleader
#                    (cpu:ringleader,cuda:nccl) and nccl                   (1+ GPU, torch)
#   torch-commit     gpu_torch_check.py commit: the elastic commit in pinned host memory
#                    beside one on the device (device memory added, step time) (1+ GPU, torch)
#   rust-nccl-kill9  two train-workers over NCCL, kill -9 of rank 1: rank 0 ends with the
#                    loss named instead of hanging                          (2+ GPUs)
#   local-rank-job   a 2-rank command job, gpus_per_worker = 1: set_device(LOCAL_RANK) works
#                    on each                                               (2+ GPUs, torch)
#   elastic-torch    an elastic torch job of 2 ranks on CUDA, one rank killed: the survivor
#                    keeps its PID and finishes                            (2+ GPUs, torch)
# Exit status: the number of FAIL lines (0: none).
set -uo pipefail

kit=$(cd "$(dirname "$0")/.." && pwd)
cd "$kit"
dry=0
if [[ "${1:-}" == "--dry-run" ]]; then dry=1; fi

# The whole visit's budget, s (the device tool allows 10 minutes a command).
visit_budget_s=480
# One part's deadline unless it names its own, s.
part_deadline_s=120
# How long a job on the visit's node may take to start and end, s.
job_deadline_s=150

start_s=$SECONDS
fails=0
work=$(mktemp -d /tmp/gpu-visit.XXXXXX)
trap 'rm -rf "$work"' EXIT

line() { echo "$*"; }
# The processes a part started (`pids`): SIGTERM (a node stops its ranks), then SIGKILL to
# any left after 10 s.
stop_started() {
    local p i
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for ((i = 0; i < 50; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$p" 2>/dev/null || true
    done
}
skip() { line "SKIP $1: $2"; }

# part NAME DEVICE DEADLINE_S CMD...: runs CMD (stdout and stderr to NAME.log) under the
# deadline, unless the visit's budget is spent; prints PASS or FAIL with the log's lines
# that start with `visit:` or, on failure, its last lines.
part() {
    local name=$1 device=$2 deadline=$3 rc t0 left pid
    shift 3
    if [[ $dry -eq 1 ]]; then
        line "DRY $name on $device: $*"
        return 0
    fi
    left=$((visit_budget_s - (SECONDS - start_s)))
    if [[ $left -lt 10 ]]; then
        skip "$name" "the visit's ${visit_budget_s} s are spent"
        return 0
    fi
    [[ $deadline -gt $left ]] && deadline=$left
    t0=$SECONDS
    # A process group of its own (job control on), so a part past its deadline ends whole;
    # the nodes it started stop when it ends.
    set -m
    (
        pids=()
        trap stop_started EXIT
        "$@"
    ) >"$work/$name.log" 2>&1 &
    pid=$!
    set +m
    while kill -0 "$pid" 2>/dev/null && [[ $((SECONDS - t0)) -lt $deadline ]]; do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM -- "-$pid" 2>/dev/null
        sleep 2
        kill -KILL -- "-$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        rc=124
    else
        wait "$pid"
        rc=$?
    fi
    if [[ $rc -eq 0 ]]; then
        line "PASS $name on $device ($((SECONDS - t0)) s): $(grep -h '^visit:' "$work/$name.log" | sed 's/^visit: //' | tr '\n' ';')"
    else
        fails=$((fails + 1))
        [[ $rc == 124 ]] && rc="timeout after ${deadline} s"
        line "FAIL $name on $device ($((SECONDS - t0)) s, exit $rc):"
        tail -n 15 "$work/$name.log" | sed 's/^/    /'
    fi
}

# ---- what this machine has ----
gpus=0
no_gpu="nvidia-smi not found"
if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    no_gpu="nvidia-smi lists none"
fi
gpu0="cuda:0"
if [[ $gpus -gt 0 ]]; then
    gpu0="cuda:0 ($(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0 2>/dev/null | tr -s ' '))"
fi
torch_cuda=0
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    torch_cuda=1
fi
line "visit kit=$(cat "$kit/COMMIT" 2>/dev/null || echo unknown) host=$(hostname) gpus=$gpus torch_cuda=$torch_cuda rust=$(command -v cargo || echo none)"

# ---- setup: the wheel, unpacked ----
site=$work/site
node=$site/ringleader/bin/ringleader
wheel=$(ls "$kit"/wheel/ringleader-*.whl 2>/dev/null | head -n1)
setup() {
    python3 -m zipfile -e "$wheel" "$site" && chmod +x "$node" &&
        echo "visit: $("$node" --version) from $(basename "$wheel")"
}
if [[ -z "$wheel" && $dry -eq 0 ]]; then
    fails=$((fails + 1))
    line "FAIL setup on cpu: no wheel in $kit/wheel (build the kit with scripts/gpu-kit.sh)"
else
    part setup cpu 60 setup
fi
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
export COLLECTIVE_BENCH=$kit/bin/collective-bench TRAIN_WORKER=$kit/bin/train-worker

# The CUDA libraries where cudarc finds them (scripts/cuda-libs.sh), for the binaries run
# here directly (bench-gpu.sh and the node find their own).
libs_ready() {
    # shellcheck source=scripts/cuda-libs.sh
    . "$kit/scripts/cuda-libs.sh" && cuda_libs_env "$work/libs"
}

port() { echo $((20000 + RANDOM % 9000)); }

# ---- one GPU ----
nccl_allreduce() {
    libs_ready || return 1
    "$COLLECTIVE_BENCH" --nccl --world 1 --rank 0 --device 0 --peers "127.0.0.1:$(port)" \
        --sizes 1M,64M --iters 10 | sed 's/^/visit: /'
}
train_worker_cuda() {
    libs_ready || return 1
    # shellcheck source=scripts/train-spec.sh
    . "$kit/scripts/train-spec.sh"
    bench_spec mlp "$work/mlp.toml" none "" 256
    CUDA_VISIBLE_DEVICES=0 RINGLEADER_GPUS=1 "$TRAIN_WORKER" --spec "$work/mlp.toml" --rank 0 \
        --addrs "127.0.0.1:$(port)" --bench-steps 30 --bench-warmup-steps 5 >"$work/tw.out" || return 1
    grep -q 'device=cuda\|cuda' "$work/tw.out" || { cat "$work/tw.out"; return 1; }
    grep -E '^bench |gradients=' "$work/tw.out" | sed 's/^/visit: /'
}
bench_gpu() {
    local batch=$1 m
    BATCH=$batch STEPS=30 WARMUP=5 bash "$kit/scripts/bench-gpu.sh" --no-build --sizes 1M,64M \
        --iters 10 | sed 's/^/visit: /' || return 1
    [[ $torch_cuda -eq 1 ]] || { echo "visit: torch graph=cuda: na (no torch with cuda)"; return 0; }
    for m in mlp cnn; do
        RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(port) \
            python3 "$kit/scripts/baseline_train_ddp.py" --device cuda --cuda-graph --model "$m" \
            --batch "$batch" --steps 30 --warmup 5 | sed 's/^/visit: torch /' || return 1
    done
}

# start_node NAME [node args…]: one node on 127.0.0.1 offering this host's GPUs; sets $api
# and $token (its admin token file).
start_node() {
    local name=$1 dir=$work/$1 deadline pid
    shift
    mkdir -p "$dir"
    "$node" keygen "$dir/cluster.key" 2>/dev/null
    "$node" node --name "$name" --listen 127.0.0.1:0 --api 127.0.0.1:0 --data 127.0.0.1:0 \
        --data-dir "$dir" --cluster-key "$dir/cluster.key" --gpus all "$@" </dev/null \
        >/dev/null 2>"$dir/node.log" &
    pid=$!
    pids+=("$pid")
    deadline=$((SECONDS + 30))
    until [[ -f "$dir/node.json" ]] && api=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["api_addr"])' "$dir/node.json" 2>/dev/null); do
        kill -0 "$pid" 2>/dev/null || { tail -5 "$dir/node.log"; return 1; }
        [[ $SECONDS -lt $deadline ]] || { echo "node did not start within 30 s"; return 1; }
        sleep 0.2
    done
    token=$dir/api.token
}
rl() { "$node" --peer "$api" --token-file "$token" "$@"; }
# job_field ID FIELD: one field of `job ID --json`.
job_field() {
    rl job "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin).get(sys.argv[1]))' "$2"
}
# wait_job ID: polls until the job ends, within $job_deadline_s; succeeds if it succeeded.
wait_job() {
    local id=$1 deadline=$((SECONDS + job_deadline_s)) state
    while true; do
        state=$(job_field "$id" state 2>/dev/null)
        case $state in
            succeeded) return 0 ;;
            failed | cancelled) echo "job $id $state"; rl logs "$id" | tail -20; return 1 ;;
        esac
        [[ $SECONDS -lt $deadline ]] || { echo "job $id still $state after $job_deadline_s s"; return 1; }
        sleep 1
    done
}
node_gpu_job() {
    start_node gpujob || return 1
    . "$kit/scripts/train-spec.sh"
    { printf 'name = "visit-gpu"\nkind = "train"\nworkers = 1\n[resources]\ngpus_per_worker = 1\n'
      bench_spec mlp /dev/stdout none "" 256 | sed 's/^epochs = 100$/epochs = 1\nmax_steps = 40/'; } >"$work/gpu-job.toml"
    local id
    id=$(rl submit "$work/gpu-job.toml") || return 1
    wait_job "$id" || return 1
    echo "visit: job $id succeeded, step $(job_field "$id" step)"
    rl logs "$id" | grep -iE 'device|cuda|gradients' | head -3 | sed 's/^/visit: /'
}
torch_ddp() {
    local backend=$1 world=$gpus p r
    [[ $world -gt 2 ]] && world=2
    p=$(port)
    local ranks=()
    for ((r = 0; r < world; r++)); do
        RANK=$r LOCAL_RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$p \
            python3 "$kit/scripts/gpu_torch_check.py" ddp "$backend" --steps 30 >"$work/ddp-$backend-$r.out" 2>&1 &
        ranks+=($!)
    done
    for r in "${ranks[@]}"; do wait "$r" || { cat "$work"/ddp-"$backend"-*.out; return 1; }; done
    grep -h '^torch ddp' "$work"/ddp-"$backend"-*.out | sed 's/^/visit: /'
    ! grep -q 'same_params=False' "$work"/ddp-"$backend"-*.out
}
torch_commit() {
    python3 "$kit/scripts/gpu_torch_check.py" commit --steps 50 >"$work/commit.out" 2>&1 ||
        { cat "$work/commit.out"; return 1; }
    grep -h '^torch commit' "$work/commit.out" | sed 's/^/visit: /'
}

# ---- two GPUs or more ----
rust_nccl_kill9() {
    libs_ready || return 1
    . "$kit/scripts/train-spec.sh"
    bench_spec mlp "$work/kill.toml" none "" 256
    local p0 p1 addrs="127.0.0.1:$(port),127.0.0.1:$(port)" deadline
    CUDA_VISIBLE_DEVICES=0 RINGLEADER_GPUS=1 "$TRAIN_WORKER" --spec "$work/kill.toml" --rank 0 \
        --addrs "$addrs" >"$work/k0.out" 2>"$work/k0.err" &
    p0=$!
    CUDA_VISIBLE_DEVICES=1 RINGLEADER_GPUS=1 "$TRAIN_WORKER" --spec "$work/kill.toml" --rank 1 \
        --addrs "$addrs" >"$work/k1.out" 2>"$work/k1.err" &
    p1=$!
    pids+=("$p0" "$p1")
    deadline=$((SECONDS + 60))
    until grep -q 'gradients=nccl' "$work/k0.out" && grep -qE 'step' "$work/k0.out"; do
        [[ $SECONDS -lt $deadline ]] || { echo "no nccl steps within 60 s"; cat "$work/k0.out" "$work/k0.err"; return 1; }
        sleep 0.5
    done
    sleep 2
    kill -KILL "$p1"
    deadline=$((SECONDS + 60))
    while kill -0 "$p0" 2>/dev/null; do
        [[ $SECONDS -lt $deadline ]] || { echo "rank 0 still running 60 s after rank 1 was killed"; kill -KILL "$p0"; return 1; }
        sleep 0.5
    done
    echo "visit: rank 0 ended after rank 1's kill -9: $(grep -ihE 'lost|peer|abort' "$work/k0.err" | tail -n1)"
    grep -qiE 'lost|peer' "$work/k0.err"
}
# torch_job_spec NAME MODE [TOML…]: a 2-rank command job running gpu_torch_check.py MODE
# on one GPU each, packed on this host, with the extra top-level TOML lines.
torch_job_spec() {
    local name=$1 mode=$2
    shift 2
    printf 'name = "%s"\nkind = "command"\nworkers = 2\nplacement = "pack"\n' "$name"
    printf '%s\n' "$@"
    printf 'command = ["python3", "%s", "%s"]\n' "$kit/scripts/gpu_torch_check.py" "$mode"
    printf '[resources]\ngpus_per_worker = 1\n[env]\nPYTHONPATH = "%s"\nSTEPS = "200"\n' "$site"
}
local_rank_job() {
    start_node lrjob || return 1
    torch_job_spec visit-local-rank local-rank >"$work/lr.toml"
    local id
    id=$(rl submit "$work/lr.toml") || return 1
    wait_job "$id" || return 1
    rl logs "$id" | grep '^local-rank\|local-rank rank' | sed 's/^/visit: /'
    [[ $(rl logs "$id" | grep -c 'local-rank rank') -eq 2 ]]
}
elastic_torch() {
    start_node eljob || return 1
    { torch_job_spec visit-elastic-torch elastic 'min_workers = 1'
      printf '[elastic]\nprotocol = "ringleader"\n'; } >"$work/el.toml"
    local id deadline victim survivor
    id=$(rl submit "$work/el.toml") || return 1
    deadline=$((SECONDS + 90))
    until rl logs "$id" 2>/dev/null | grep -q 'elastic step=20 .*world=2'; do
        [[ $SECONDS -lt $deadline ]] || { echo "no step 20 of 2 ranks within 90 s"; rl logs "$id" | tail; return 1; }
        sleep 1
    done
    victim=$(rl logs "$id" | grep -o 'rank=1 world=2 pid=[0-9]*' | tail -n1 | grep -o '[0-9]*$')
    survivor=$(rl logs "$id" | grep -o 'rank=0 world=2 pid=[0-9]*' | tail -n1 | grep -o '[0-9]*$')
    kill -KILL "$victim" || return 1
    wait_job "$id" || return 1
    echo "visit: killed pid $victim; $(rl logs "$id" | grep '^finished\|finished steps' | tail -n1)"
    rl logs "$id" | grep -q "finished steps=.* pid=$survivor"
}

if [[ $gpus -lt 1 && $dry -eq 0 ]]; then
    for p in nccl-allreduce train-worker bench-gpu-256 bench-gpu-4096 node-gpu-job \
        torch-ddp-ringleader torch-ddp-nccl torch-commit; do
        skip "$p" "no GPU ($no_gpu)"
    done
else
    part nccl-allreduce "$gpu0" "$part_deadline_s" nccl_allreduce
    part train-worker "$gpu0" "$part_deadline_s" train_worker_cuda
    part bench-gpu-256 "$gpu0" 150 bench_gpu 256
    part bench-gpu-4096 "$gpu0" 150 bench_gpu 4096
    part node-gpu-job "$gpu0" "$job_deadline_s" node_gpu_job
    for b in ringleader nccl; do
        if [[ $torch_cuda -eq 1 || $dry -eq 1 ]]; then
            part "torch-ddp-$b" "$gpu0" "$part_deadline_s" torch_ddp "$b"
        else
            skip "torch-ddp-$b" "no torch with CUDA here"
        fi
    done
    if [[ $torch_cuda -eq 1 || $dry -eq 1 ]]; then
        part torch-commit "$gpu0" "$part_deadline_s" torch_commit
    else
        skip torch-commit "no torch with CUDA here"
    fi
fi
if [[ $gpus -lt 2 && $dry -eq 0 ]]; then
    for p in rust-nccl-kill9 local-rank-job elastic-torch; do
        skip "$p" "needs 2 GPUs, this host has $gpus"
    done
else
    part rust-nccl-kill9 "cuda:0,cuda:1" "$part_deadline_s" rust_nccl_kill9
    if [[ $torch_cuda -eq 1 || $dry -eq 1 ]]; then
        part local-rank-job "cuda:0,cuda:1" "$job_deadline_s" local_rank_job
        part elastic-torch "cuda:0,cuda:1" "$job_deadline_s" elastic_torch
    else
        skip local-rank-job "no torch with CUDA here"
        skip elastic-torch "no torch with CUDA here"
    fi
fi
line "visit done in $((SECONDS - start_s)) s: $fails failed"
exit "$fails"
