#!/usr/bin/env bash
# Emulated cluster of N hosts on one Linux machine, for benchmarks and integration tests.
#
#   scripts/netns.sh up N [RATE]   create hosts rl1..rlN (idempotent; hosts above N are removed)
#   scripts/netns.sh rate I [RATE] [--egress|--ingress]
#                                  set (or, without RATE, remove) the rate limit of host I alone:
#                                  both directions, or only the host's egress (its upload) or
#                                  ingress (its download); the other direction is left as it is
#   scripts/netns.sh down          remove every rl* namespace, their veths and the bridge
#   scripts/netns.sh exec I CMD... run CMD inside host I (= ip netns exec rlI CMD...)
#   scripts/netns.sh status        list hosts, addresses and rate limits
#   scripts/netns.sh partition G1 G2...  cut the network between groups of hosts, each a
#                                  comma-separated list of indices (e.g. `partition 1,2 3,4,5`)
#   scripts/netns.sh heal          undo every partition
#
# Partitions are blackhole routes inside the hosts (host a gets `blackhole 10.77.0.b/32` for
# every host b in another group): the hosts of one group still reach each other, and every
# host still reaches (and is reached from) the root namespace at 10.77.0.254, so a test can
# watch both sides. A host in no group keeps reaching everyone. Established connections
# between groups stall (nothing passes either way) until `heal`.
#
# Layout (needs root, iproute2; no netem needed):
#   - host i (1 <= i <= 253) is the network namespace "rlI" with interface eth0 = 10.77.0.I/24
#     and its loopback up;
#   - eth0 is one end of a veth pair whose other end, "rlvethI", sits in the root namespace,
#     enslaved to the Linux bridge "rlbr0"; the bridge has 10.77.0.254/24, so the root namespace
#     reaches every host and every host reaches 10.77.0.254;
#   - RATE (a tc rate: 1gbit, 100mbit, 2.5gbit, 125mbps...) limits each host like a NIC of that
#     speed, in both directions: tc tbf on eth0 (host egress) and the same on rlvethI (what the
#     bridge sends to the host = host ingress). The tbf burst is about 1 ms of traffic at RATE
#     (125 kB at 1 Gbit/s; smaller bursts lose throughput to retransmits), at least 16 KiB;
#     the queue holds up to 5 ms of traffic (tbf latency 5ms).
#     Without RATE the links are unlimited (veth speed, several Gbit/s).
#   - `rate I RATE` applies the same tbf (same burst and latency rules) to host I only, after
#     `up`: e.g. `up 4` then `rate 1 300mbit --egress` caps what rl1 sends at 300 Mbit/s while
#     what it receives, and every other host, stays unlimited. Egress is the tbf on eth0 inside
#     rlI, ingress the tbf on rlvethI. A later `up` sets every host back to its own RATE.
#
# `down` also ends processes still running inside rl* namespaces (by the PIDs that
# `ip netns pids` reports: TERM, then KILL after 2 s), since a namespace with live processes
# keeps its network alive.
#
# Environment: NETNS_LATENCY (tbf latency, default 5ms).
#
# Names and addresses are per run when RL_NETNS_PREFIX (1 to 4 lower-case letters, default
# `rl`: namespaces rl1.., veths rlvethI, bridge rlbr0) and RL_NETNS_SUBNET (the /24's first
# three octets, default 10.77.0) are set: the tests give each test process its own, so two
# runs on one machine never take each other's hosts.

set -euo pipefail

PREFIX=${RL_NETNS_PREFIX:-rl}
[[ $PREFIX =~ ^[a-z]{1,4}$ ]] || { echo "netns.sh: RL_NETNS_PREFIX must be 1 to 4 of a-z (got '$PREFIX')" >&2; exit 2; }
BRIDGE=${PREFIX}br0
SUBNET_PREFIX=${RL_NETNS_SUBNET:-10.77.0}
[[ $SUBNET_PREFIX =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || { echo "netns.sh: RL_NETNS_SUBNET must be three octets like 10.77.0 (got '$SUBNET_PREFIX')" >&2; exit 2; }
BRIDGE_ADDR=${SUBNET_PREFIX}.254
MAX_HOSTS=253
LATENCY=${NETNS_LATENCY:-5ms}
LOCK=/run/ringleader-netns-$PREFIX.lock

prog=$(basename "$0")
usage() {
    cat >&2 <<EOF
usage: $prog up N [RATE]     create hosts ${PREFIX}1..${PREFIX}N at ${SUBNET_PREFIX}.1..N/24 (RATE e.g. 1gbit)
       $prog rate I [RATE] [--egress|--ingress]
                             set (no RATE: remove) host I's limit, both directions or one
       $prog down            remove all ${PREFIX}* hosts, their veths and bridge $BRIDGE
       $prog exec I CMD...   run CMD in host I (namespace ${PREFIX}I)
       $prog status          list hosts
       $prog partition G1 G2...  cut links between groups of hosts (G: comma-separated indices)
       $prog heal            undo every partition
EOF
    exit 2
}
die() { echo "$prog: $*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" = 0 ] || die "must run as root (network namespaces)"
    command -v ip >/dev/null || die "ip (iproute2) not found"
    command -v tc >/dev/null || die "tc (iproute2) not found"
}

# Serialise up/down across concurrent callers (benchmarks and tests may share the machine).
take_lock() {
    if command -v flock >/dev/null; then
        exec 9>"$LOCK"
        flock -w 60 9 || die "could not take $LOCK within 60 s"
    fi
}

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

# Namespaces named rl<digits>, in numeric order.
our_namespaces() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+\$" | sort -V || true
}

ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$1"; }
link_exists() { ip link show dev "$1" >/dev/null 2>&1; }

# Bytes per second of a tc rate string (tc: "bit" suffixes are bits/s, "bps" suffixes bytes/s).
rate_bytes_per_s() {
    local r=${1,,} num unit mult
    [[ $r =~ ^([0-9]+(\.[0-9]+)?)([kmgt]?i?)(bit|bps)$ ]] || return 1
    num=${BASH_REMATCH[1]}
    unit=${BASH_REMATCH[3]}
    case "$unit" in
        "") mult=1 ;;
        k) mult=1000 ;; m) mult=1000000 ;; g) mult=1000000000 ;; t) mult=1000000000000 ;;
        ki) mult=1024 ;; mi) mult=1048576 ;; gi) mult=1073741824 ;; ti) mult=1099511627776 ;;
        *) return 1 ;;
    esac
    if [ "${BASH_REMATCH[4]}" = bit ]; then
        awk -v n="$num" -v m="$mult" 'BEGIN { printf "%.0f\n", n * m / 8 }'
    else
        awk -v n="$num" -v m="$mult" 'BEGIN { printf "%.0f\n", n * m }'
    fi
}

# tbf burst: ~1 ms of traffic, at least 16 KiB (about ten full-size frames; tbf splits GSO
# packets larger than the burst).
burst_for() {
    awk -v b="$1" 'BEGIN { x = b / 1000; if (x < 16384) x = 16384; printf "%.0f\n", x }'
}

del_host() {
    local ns=$1 i=${1#"$PREFIX"} pids
    if ns_exists "$ns"; then
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        if [ -n "$pids" ]; then
            echo "$prog: ending processes still in $ns: $(echo "$pids" | tr '\n' ' ')" >&2
            # shellcheck disable=SC2086 # word splitting of the PID list is intended
            kill -TERM $pids 2>/dev/null || true
            for _ in 1 2 3 4 5 6 7 8 9 10; do
                pids=$(ip netns pids "$ns" 2>/dev/null || true)
                [ -z "$pids" ] && break
                sleep 0.2
            done
            if [ -n "$pids" ]; then
                # shellcheck disable=SC2086
                kill -KILL $pids 2>/dev/null || true
            fi
        fi
        ip netns delete "$ns" 2>/dev/null || true
    fi
    # Deleting the namespace destroys its veth end and with it the pair; be thorough anyway.
    if link_exists "${PREFIX}veth$i"; then ip link delete "${PREFIX}veth$i" 2>/dev/null || true; fi
}

set_rate() { # dev rate burst [netns]
    local dev=$1 rate=$2 burst=$3 ns=${4:-}
    local -a pre=()
    [ -n "$ns" ] && pre=(ip netns exec "$ns")
    if [ -z "$rate" ]; then
        "${pre[@]}" tc qdisc del dev "$dev" root 2>/dev/null || true
    else
        "${pre[@]}" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency "$LATENCY"
    fi
}

# Rate of the root tbf on dev (in namespace ns, if given), or "unlimited".
tbf_rate() { # dev [netns]
    local dev=$1 ns=${2:-} q
    local -a pre=()
    [ -n "$ns" ] && pre=(ip netns exec "$ns")
    q=$("${pre[@]}" tc qdisc show dev "$dev" 2>/dev/null | grep -o 'tbf .*rate [^ ]*' |
        sed 's/.*rate //' | head -1 || true)
    echo "${q:-unlimited}"
}

# Bytes per second of a RATE argument, or die naming it.
checked_bps() {
    local bps
    bps=$(rate_bytes_per_s "$1") || die "bad RATE '$1' (examples: 1gbit, 100mbit, 125mbps)"
    [ "$bps" -gt 0 ] || die "RATE must be positive"
    echo "$bps"
}

cmd_up() {
    if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi
    local n=$1 rate=${2:-} bps="" burst=""
    if ! is_uint "$n" || [ "$n" -lt 1 ] || [ "$n" -gt "$MAX_HOSTS" ]; then
        die "N must be an integer in 1..$MAX_HOSTS (got '$n')"
    fi
    if [ -n "$rate" ]; then
        bps=$(checked_bps "$rate")
        burst=$(burst_for "$bps")
    fi
    need_root
    take_lock

    # Bridge.
    if ! link_exists "$BRIDGE"; then
        ip link add "$BRIDGE" type bridge
    fi
    ip link set "$BRIDGE" type bridge stp_state 0 forward_delay 0 2>/dev/null || true
    ip addr replace "$BRIDGE_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    # Bridged frames must not be sent through the host's iptables (br_netfilter), if loaded.
    if [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]; then
        ip link set "$BRIDGE" type bridge nf_call_iptables 0 nf_call_ip6tables 0 \
            nf_call_arptables 0 2>/dev/null || true
    fi

    # Remove hosts beyond N from an earlier, larger `up`.
    local ns j
    for ns in $(our_namespaces); do
        j=${ns#"$PREFIX"}
        if [ "$j" -gt "$n" ] || [ "$j" -lt 1 ]; then del_host "$ns"; fi
    done

    local i host br_end
    for i in $(seq 1 "$n"); do
        host=${PREFIX}$i
        br_end=${PREFIX}veth$i
        if ! ns_exists "$host"; then
            ip netns add "$host"
        fi
        # The veth pair: eth0 inside the namespace, its twin on the bridge.
        if ! ip netns exec "$host" ip link show dev eth0 >/dev/null 2>&1; then
            if link_exists "$br_end"; then ip link delete "$br_end"; fi
            ip link add "$br_end" type veth peer name "${PREFIX}vpeer$i"
            ip link set "${PREFIX}vpeer$i" netns "$host"
            ip netns exec "$host" ip link set "${PREFIX}vpeer$i" name eth0
        fi
        ip link set "$br_end" master "$BRIDGE"
        ip link set "$br_end" up
        ip netns exec "$host" ip link set lo up
        ip netns exec "$host" ip addr flush dev eth0
        ip netns exec "$host" ip addr add "$SUBNET_PREFIX.$i/24" dev eth0
        ip netns exec "$host" ip link set eth0 up
        set_rate eth0 "$rate" "$burst" "$host"
        set_rate "$br_end" "$rate" "$burst"
    done

    # Wait until every host's eth0 is up (bridge port forwarding, no DAD for IPv4).
    for i in $(seq 1 "$n"); do
        for _ in $(seq 1 50); do
            ip netns exec "${PREFIX}$i" ip -o link show dev eth0 | grep -q 'state UP' && break
            sleep 0.1
        done
    done

    echo "netns: $n host(s) on bridge $BRIDGE ($BRIDGE_ADDR/24), rate ${rate:-unlimited}${rate:+ (tbf burst $burst B, latency $LATENCY, both directions)}"
    for i in $(seq 1 "$n"); do
        echo "${PREFIX}$i $SUBNET_PREFIX.$i"
    done
}

cmd_rate() {
    local i="" rate="" dir=both a bps="" burst=""
    for a in "$@"; do
        case "$a" in
            --egress | --ingress)
                [ "$dir" = both ] || die "give at most one of --egress, --ingress"
                dir=${a#--}
                ;;
            -*) die "unknown option '$a'" ;;
            *)
                if [ -z "$i" ]; then i=$a
                elif [ -z "$rate" ]; then rate=$a
                else usage
                fi
                ;;
        esac
    done
    [ -n "$i" ] || usage
    if ! is_uint "$i" || [ "$i" -lt 1 ] || [ "$i" -gt "$MAX_HOSTS" ]; then
        die "host index must be an integer in 1..$MAX_HOSTS (got '$i')"
    fi
    if [ -n "$rate" ]; then
        bps=$(checked_bps "$rate")
        burst=$(burst_for "$bps")
    fi
    need_root
    take_lock
    ns_exists "${PREFIX}$i" || die "host ${PREFIX}$i does not exist (run: $prog up N)"
    if [ "$dir" != ingress ]; then set_rate eth0 "$rate" "$burst" "${PREFIX}$i"; fi
    if [ "$dir" != egress ]; then set_rate "${PREFIX}veth$i" "$rate" "$burst"; fi
    echo "netns: ${PREFIX}$i egress $(tbf_rate eth0 "${PREFIX}$i") ingress $(tbf_rate "${PREFIX}veth$i")${rate:+ (tbf burst $burst B, latency $LATENCY)}"
}

cmd_down() {
    [ $# -eq 0 ] || usage
    need_root
    take_lock
    local ns l
    for ns in $(our_namespaces); do del_host "$ns"; done
    for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
        grep -E "^${PREFIX}veth[0-9]+\$" || true); do
        ip link delete "$l" 2>/dev/null || true
    done
    if link_exists "$BRIDGE"; then ip link delete "$BRIDGE"; fi
    echo "netns: down"
}

cmd_exec() {
    [ $# -ge 2 ] || usage
    local i=$1
    shift
    is_uint "$i" || die "host index must be an integer (got '$i')"
    ns_exists "${PREFIX}$i" || die "host ${PREFIX}$i does not exist (run: $prog up N)"
    exec ip netns exec "${PREFIX}$i" "$@"
}

cmd_status() {
    [ $# -eq 0 ] || usage
    local ns addr any=0
    if link_exists "$BRIDGE"; then
        echo "bridge $BRIDGE $(ip -o -4 addr show dev "$BRIDGE" | awk '{print $4}' | head -1)"
    else
        echo "bridge $BRIDGE absent"
    fi
    for ns in $(our_namespaces); do
        any=1
        addr=$(ip netns exec "$ns" ip -o -4 addr show dev eth0 2>/dev/null | awk '{print $4}' | head -1)
        echo "$ns ${addr:-no-address} egress $(tbf_rate eth0 "$ns") ingress $(tbf_rate "${PREFIX}veth${ns#"$PREFIX"}") pids=$(ip netns pids "$ns" 2>/dev/null | wc -l)"
    done
    [ "$any" = 1 ] || echo "no ${PREFIX}* hosts"
}

cmd_partition() {
    [ $# -ge 2 ] || usage
    need_root
    local -A group=()
    local g=0 spec h a b
    local -a hosts
    for spec in "$@"; do
        g=$((g + 1))
        IFS=, read -ra hosts <<<"$spec"
        [ ${#hosts[@]} -ge 1 ] || die "empty group '$spec'"
        for h in "${hosts[@]}"; do
            is_uint "$h" || die "host index must be an integer (got '$h')"
            ns_exists "${PREFIX}$h" || die "host ${PREFIX}$h does not exist (run: $prog up N)"
            [ -z "${group[$h]:-}" ] || die "host $h is in two groups"
            group[$h]=$g
        done
    done
    for a in "${!group[@]}"; do
        for b in "${!group[@]}"; do
            if [ "${group[$a]}" != "${group[$b]}" ]; then
                ip netns exec "${PREFIX}$a" ip route replace blackhole "$SUBNET_PREFIX.$b/32"
            fi
        done
    done
    echo "netns: partitioned $*"
}

cmd_heal() {
    [ $# -eq 0 ] || usage
    need_root
    local ns r
    for ns in $(our_namespaces); do
        for r in $(ip netns exec "$ns" ip -o route show type blackhole 2>/dev/null |
            awk '{print $2}'); do
            ip netns exec "$ns" ip route del blackhole "$r" 2>/dev/null || true
        done
    done
    echo "netns: healed"
}

[ $# -ge 1 ] || usage
sub=$1
shift
case "$sub" in
    up) cmd_up "$@" ;;
    rate) cmd_rate "$@" ;;
    down) cmd_down "$@" ;;
    exec) cmd_exec "$@" ;;
    status) cmd_status "$@" ;;
    partition) cmd_partition "$@" ;;
    heal) cmd_heal "$@" ;;
    -h|--help|help) usage ;;
    *) echo "$prog: unknown command '$sub'" >&2; usage ;;
esac
