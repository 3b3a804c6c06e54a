#!/usr/bin/env bash
# The Slurm launcher's test (deploy/slurm/ringleader.sbatch): a one-host Slurm (munge,
# slurmctld and slurmd of Debian's slurm-wlm, started here with a configuration of their own
# under a temporary directory and ports of their own, nothing in /etc changed) runs the sbatch
# script with a 3-task allocation on this host; a 3-worker train job on the bundled digits
# must succeed in it, and no process of the cluster may outlive the allocation.
#
#   scripts/test-slurm.sh [RINGLEADER_BINARY]   (default: target/debug/ringleader)
#
# Needs root (the daemons) and slurm-wlm, which it installs with apt-get when missing and
# says so; without either it prints SKIPPED and exits 0. Everything it starts is stopped by
# PID at its end.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/debug/ringleader}")

skip() {
    echo "SKIPPED (slurm test): $*"
    exit 0
}
[ "$(id -u)" -eq 0 ] || skip "needs root to run slurmctld and slurmd"
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    echo "slurm test: installing Debian's slurm-wlm and munge (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge >/dev/null 2>&1 ||
        skip "slurm-wlm could not be installed"
fi
[ -r /etc/munge/munge.key ] || skip "no munge key (/etc/munge/munge.key)"

tmp=$(mktemp -d)
pids=()
cleanup() {
    local rc=$?
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    if [ "$rc" -ne 0 ]; then
        for f in "$tmp"/*.log "$tmp"/job.out; do
            [ -f "$f" ] && { echo "--- $f"; tail -n 40 "$f"; }
        done
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

host=$(hostname -s)
# Ports of this run's own, away from Slurm's defaults (6817/6818) and the other tests'.
base=$((20000 + RANDOM % 20000))
mkdir -p "$tmp/state" "$tmp/spool" "$tmp/cluster"
munged -F --force --socket="$tmp/munge.sock" --pid-file="$tmp/munged.pid" \
    --log-file="$tmp/munged.log" --seed-file="$tmp/munge.seed" \
    --key-file=/etc/munge/munge.key 2>>"$tmp/munged.log" &
pids+=($!)
cat > "$tmp/slurm.conf" <<CONF
ClusterName=rltest
SlurmctldHost=$host
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge.sock
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$host CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=30 State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$tmp/slurm.conf"
for _ in $(seq 1 50); do [ -S "$tmp/munge.sock" ] && break; sleep 0.1; done
slurmctld -D -i >"$tmp/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D >"$tmp/slurmd.out" 2>&1 &
pids+=($!)
deadline=$((SECONDS + 60))
until sinfo -h -o %T 2>/dev/null | grep -qx idle; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "slurm test: the node never became idle: $(sinfo 2>&1)"; exit 1; }
    sleep 0.5
done


# The job's private directory inside the run's own; ports of the nodes away from Slurm's.
export RINGLEADER="$bin" RINGLEADER_SLURM_DIR="$tmp/cluster" RINGLEADER_SLURM_PORT=$((base + 10))
rc=0
sbatch --wait -N1 -n3 --ntasks-per-node=3 -t 5 --output="$tmp/job.out" \
    deploy/slurm/ringleader.sbatch examples/jobs/digits-mlp.toml >/dev/null || rc=$?
cat "$tmp/job.out"
[ "$rc" -eq 0 ] || { echo "slurm test: the allocation's script exited $rc"; exit 1; }
grep -q "3 nodes formed a cluster" "$tmp/job.out"
grep -q "state *succeeded\|succeeded" "$tmp/job.out"
# No node (nor rank) of the allocation outlives it.
if pgrep -f "$tmp/cluster" >/dev/null; then
    echo "slurm test: processes of the allocation still run: $(pgrep -af "$tmp/cluster")"
    exit 1
fi

# The allocation's end: Slurm's SIGTERM to the batch script (what --signal=B:TERM@60 sends
# before the time limit, and scancel) while a script and a job's ranks run stops every node
# and every rank.
marker="rl-slurm-rank-$base"
cat > "$tmp/long.toml" <<SPEC
name = "slurm-long"
kind = "command"
workers = 3
command = ["sh", "-c", "echo started; exec python3 -c 'import time; time.sleep(600)' $marker"]
SPEC
export RINGLEADER_SLURM_DIR="$tmp/cluster-2"
id=$(sbatch --parsable -N1 -n3 --ntasks-per-node=3 -t 5 --output="$tmp/job.out" \
    deploy/slurm/ringleader.sbatch -- sh -c "\"\$RINGLEADER\" submit $tmp/long.toml && sleep 600")
deadline=$((SECONDS + 120))
until [ "$(pgrep -fc "$marker" || true)" -ge 3 ]; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "slurm test: the long job's ranks never started"; exit 1; }
    sleep 0.5
done
scancel --batch --signal=TERM "$id"
deadline=$((SECONDS + 60))
while squeue -h -j "$id" 2>/dev/null | grep -q .; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "slurm test: the allocation did not end after SIGTERM"; exit 1; }
    sleep 0.5
done
cat "$tmp/job.out"
grep -q "stopping the cluster" "$tmp/job.out"
clean=$(grep -c "stopped clean=true" "$tmp/job.out" || true)
[ "$clean" -eq 3 ] || { echo "slurm test: $clean of 3 nodes stopped cleanly at the allocation's end"; exit 1; }
if pgrep -f "$tmp/cluster|$marker" >/dev/null; then
    echo "slurm test: processes outlived the allocation: $(pgrep -af "$tmp/cluster|$marker")"
    exit 1
fi
echo "slurm test: ok (a 3-node cluster in a 3-task allocation ran a 3-worker train job; SIGTERM to the allocation stopped every node and rank)"
