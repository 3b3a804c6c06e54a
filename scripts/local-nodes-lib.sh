# Helpers shared by the benchmarks that start local nodes (bench-search.sh,
# bench-sharing.sh); sourced. Needs python3 and scripts/cluster_api.py beside this file.

# stop_node_pids TMP WAIT_TENTHS PID...: SIGTERM to each node, SIGKILL to any still running
# WAIT_TENTHS tenths of a second later, then every process left whose command line names a
# path under TMP (ranks run in their own process groups: one a killed node left behind) is
# killed by PID, with a `# warning:` on stderr.
stop_node_pids() {
    local tmp=$1 tenths=$2 p i left
    shift 2
    for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "$@"; do
        for ((i = 0; i < tenths; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    left=$(python3 - "$tmp" <<'PYEOF'
import os, sys
sys.path.insert(0, os.environ.get("RINGLEADER_SCRIPTS") or os.path.dirname(os.path.abspath(sys.argv[0])))
import cluster_api
print(" ".join(str(pid) for pid, _ in cluster_api.procs_under(sys.argv[1])))
PYEOF
    ) || true
    if [ -n "$left" ]; then
        echo "# warning: processes left after the nodes stopped: $left (killed)" >&2
        for p in $left; do kill -KILL "$p" 2>/dev/null || true; done
    fi
}

# local_nodes_setup PREFIX [WAIT_TENTHS]: a fresh work directory /tmp/PREFIX.XXXXXX in $tmp,
# an empty $pids (the caller adds each node it starts), `stop_nodes` (stop_node_pids on
# them, WAIT_TENTHS 50 unless given) and an EXIT trap that stops them and removes $tmp
# (KEEP=1 keeps it and says where).
local_nodes_setup() {
    tmp=$(mktemp -d "/tmp/$1.XXXXXX")
    pids=()
    stop_tenths=${2:-50}
    trap local_nodes_cleanup EXIT
    trap 'exit 130' INT TERM
}
stop_nodes() {
    if [ "${#pids[@]}" -gt 0 ]; then stop_node_pids "$tmp" "$stop_tenths" "${pids[@]}"; fi
    pids=()
}
local_nodes_cleanup() {
    stop_nodes
    if [ "${KEEP:-0}" = 1 ]; then echo "# kept $tmp" >&2; else rm -rf "$tmp"; fi
}
