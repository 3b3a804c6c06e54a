# Helpers shared by the allreduce benchmarks (bench-allreduce.sh, bench-hier.sh); sourced.
# iters_for reads the caller's $iters (empty: the default by size); wait_all its pids array.

size_bytes() { # 4K -> 4096, 64M -> 67108864, 4096 -> 4096
    local s=${1^^} n u
    [[ $s =~ ^([0-9]+)(B|K|KB|KIB|M|MB|MIB|G|GB|GIB)?$ ]] || return 1
    n=${BASH_REMATCH[1]}
    u=${BASH_REMATCH[2]}
    case "$u" in
        ""|B) echo "$n" ;;
        K|KB|KIB) echo $((n << 10)) ;;
        M|MB|MIB) echo $((n << 20)) ;;
        G|GB|GIB) echo $((n << 30)) ;;
    esac
}
iters_for() { # default: min(100, max(5, ceil(128 MiB / size)))
    if [ -n "$iters" ]; then echo "$iters"; return; fi
    local b=$1 k
    k=$(( ((128 << 20) + b - 1) / b ))
    [ "$k" -lt 5 ] && k=5
    [ "$k" -gt 100 ] && k=100
    echo "$k"
}
warmup_for() { # min(5, max(1, iters / 5))
    local w=$(($1 / 5))
    [ "$w" -lt 1 ] && w=1
    [ "$w" -gt 5 ] && w=5
    echo "$w"
}
# Wait for all PIDs in pids[]; rc of the first failure (124 = timed out).
wait_all() {
    local p rc=0 r
    for p in "${pids[@]}"; do
        r=0
        wait "$p" || r=$?
        if [ "$r" != 0 ] && [ "$rc" = 0 ]; then rc=$r; fi
    done
    pids=()
    return "$rc"
}
