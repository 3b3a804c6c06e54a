#!/usr/bin/env bash
# End-to-end test against a real replicated S3 store, Garage (https://garagehq.deuxfleurs.fr):
# a train job's checkpoints and experiment records go to Garage through opendal's S3 service,
# one Garage node is killed mid-job, and the job still resumes from its last checkpoint.
# Opt-in, not in CI: building Garage takes about 18 minutes on this project's 2-core machine.
#
#   scripts/test-garage.sh
#
# 1. Garage: $GARAGE, else `garage` on PATH, else <target>/garage/bin/garage, else built
#    there once with `cargo install garage --version $GARAGE_VERSION --locked --root
#    <target>/garage` (about 18 min). It must be v2 (the CLI and config used here).
# 2. Three Garage nodes g1..g3 on 127.0.0.1 (ports the OS picks), replication_factor 3 (a
#    write or read needs 2 of the 3), one zone; bucket `ringleader`, an access key for it.
# 3. Three ringleader nodes n0..n2 (--job-retention-s 10), each with
#    --storage-file holding s3://ringleader/e2e?endpoint=…&region=garage&access_key_id=…&secret_access_key=…
#    n0 and n2 talk to g1's S3 API, n1 to g2's: a rank may resume from what another wrote
#    through another Garage node. g3 serves no one: it is the one killed.
# 4. A train job (digits MLP, 2 workers, checkpoint every 20 steps, max_restarts 2, steps
#    slowed by RINGLEADER_TEST_STEP_DELAY_MS so that it lasts about a minute).
# 5. Once a committed checkpoint is in the bucket (listed through the S3 API, signed here with
#    SigV4, not through opendal), g3 is kill -9'd; the test waits for a checkpoint committed
#    after that (Garage takes writes with 2 of 3 nodes), then kill -9's the ringleader node of
#    the job's last rank not on n1 (its worker dies with it): the attempt fails and the job is
#    retried on the 2 nodes left, n1 among them, from its last checkpoint in Garage.
# 6. Asserts: the job succeeded in a later attempt; that attempt's rank 0 logged
#    `resumed step=N` with N > 0, N at least the last step committed before the kill (its
#    ranks agree on it, or they would start over);
#    committed checkpoints are in the bucket; the job's record `jobs/<id>/record.json` is in
#    the bucket and says succeeded, beside its TensorBoard files; after the retention the job
#    leaves the live state and `job ID --json` answers from that record
#    (`freshness.served_by = "archive"`), read back from Garage with g3 still down; no
#    log (the nodes', the ranks') holds the secret key.
#
# Prints last (exit 0 only when every assertion held):
#   garage nodes=3 killed=1 job=ID state=succeeded attempt=A restored_step=N checkpoints=K records=R
# with K the committed checkpoints listed in the bucket at the end (`keep` bounds it) and R the
# job's other objects there (record.json, TensorBoard files, timeline).
#
# Environment: GARAGE (a garage binary), GARAGE_VERSION (built when none is found; 2.5.0),
# RINGLEADER (a prebuilt ringleader binary: skips the build), PROFILE (release|debug: the
# build, default release), CARGO_TARGET_DIR, WAIT_S (deadline of each wait, 300), JOB_WAIT_S
# (deadline of the whole job, 900), STEPS (the job's steps, 600), STEP_DELAY_MS (added to
# each step, 50), KEEP=1 (keep the work directory; it is kept anyway on failure).
# Needs python3 (standard library). Every process it starts is killed by PID on exit.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# The embedded python helper imports scripts/cluster_api.py.
export RINGLEADER_SCRIPTS="$root/scripts"
target=${CARGO_TARGET_DIR:-$root/target}
profile=${PROFILE:-release}
garage_version=${GARAGE_VERSION:-2.5.0}
wait_s=${WAIT_S:-300}
job_wait_s=${JOB_WAIT_S:-900}
steps=${STEPS:-600}
step_delay_ms=${STEP_DELAY_MS:-50}
readonly BUCKET=ringleader PREFIX=e2e KEY_NAME=ringleader-e2e REGION=garage
readonly CKPT_EVERY=20 RETENTION_S=10 WORKERS=2

prog=test-garage
die() { echo "$prog: FAILED: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }

case "${1:-}" in
    "") ;;
    -h | --help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" >&2; exit 2 ;;
    *) echo "usage: $0   (settings are environment variables; see --help)" >&2; exit 2 ;;
esac
case $profile in release | debug) ;; *) die "PROFILE=$profile: release | debug" ;; esac
for v in wait_s job_wait_s steps step_delay_ms; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a whole number (got '${!v}')"
done
[ "$steps" -ge $((4 * CKPT_EVERY)) ] || die "STEPS must be at least $((4 * CKPT_EVERY))"
command -v python3 >/dev/null || die "needs python3"

# ---- binaries ----
if [ -n "${GARAGE:-}" ]; then
    garage=$GARAGE
elif command -v garage >/dev/null; then
    garage=$(command -v garage)
elif [ -x "$target/garage/bin/garage" ]; then
    garage=$target/garage/bin/garage
else
    note "no garage binary (GARAGE, PATH, $target/garage/bin): building garage $garage_version" \
        "with cargo install, about 18 minutes on 2 cores (once; kept in $target/garage)"
    cargo install garage --version "$garage_version" --locked --root "$target/garage" >&2
    garage=$target/garage/bin/garage
fi
[ -x "$garage" ] || die "garage binary $garage is not executable"
garage_v=$("$garage" --version | head -n 1)
[[ $garage_v =~ :([0-9]+)\. && ${BASH_REMATCH[1]} -ge 2 ]] ||
    die "$garage is '$garage_v'; this test needs Garage v2 (set GARAGE to one)"
note "garage: $garage ($garage_v)"

if [ -n "${RINGLEADER:-}" ]; then
    bin=$RINGLEADER
else
    if [ "$profile" = release ]; then cargo build --release -p ringleader >&2; else cargo build -p ringleader >&2; fi
    bin=$target/$profile/ringleader
fi
[ -x "$bin" ] || die "no ringleader binary at $bin"

# ---- work directory, processes, cleanup ----
tmp=$(mktemp -d /tmp/rl-test-garage.XXXXXX)
garage_pids=(0 0 0 0) # index 1..3
node_pids=(0 0 0)
ok=0
# The processes started here run disowned (the shell still reaps them, and reports no
# "Killed" for the kill -9's that are the point of the test). A PID is signalled only while
# its command line names the work directory (once started: the fork runs the shell's own
# command line until exec), so a PID the system reused is left alone.
ours() { # PID
    [ "$1" != 0 ] && tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" | grep -qF "$tmp/"
}
gone_within() { # PID TENTHS: polls until the process is gone
    local i
    for ((i = 0; i < $2; i++)); do ours "$1" || return 0; sleep 0.1; done
    ! ours "$1"
}
stop_pid() { # PID: TERM, up to 5 s, then KILL
    ours "$1" || return 0
    kill -TERM "$1" 2>/dev/null || true
    gone_within "$1" 50 && return 0
    kill -KILL "$1" 2>/dev/null || true
    gone_within "$1" 50 || echo "$prog: process $1 still there after SIGKILL" >&2
}
kill9() { # PID: kill -9, and wait until it is gone
    ours "$1" || die "process $1 is not running"
    kill -KILL "$1"
    gone_within "$1" 100 || die "process $1 still there 10 s after SIGKILL"
}
cleanup() {
    local rc=$? p left
    for p in "${node_pids[@]}"; do stop_pid "$p"; done
    for p in "${garage_pids[@]}"; do stop_pid "$p"; done
    # Ranks die with their node (PR_SET_PDEATHSIG); any process still naming a path under
    # the work directory (a rank's child) is killed by PID.
    if [ -f "$tmp/helper.py" ]; then
        left=$(python3 "$tmp/helper.py" leftovers "$tmp" 2>/dev/null || true)
        for p in $left; do kill -KILL "$p" 2>/dev/null || true; done
    fi
    if [ "${KEEP:-0}" = 1 ] || [ "$ok" != 1 ]; then
        echo "$prog: work directory (node and Garage logs) kept: $tmp" >&2
    else
        rm -rf "$tmp"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The helper: the ringleader HTTP API and a SigV4-signed S3 client (ListObjectsV2, GetObject),
# python3's standard library only. S3 settings come from S3_* in the environment.
cat >"$tmp/helper.py" <<'PYEOF'
import datetime, hashlib, hmac, json, os, re, socket, sys, time
import urllib.parse, urllib.request
import xml.etree.ElementTree as ET
sys.path.insert(0, os.environ["RINGLEADER_SCRIPTS"])
import cluster_api

ENDED = ("succeeded", "failed", "cancelled")

def fail(msg):
    sys.exit(f"test-garage: FAILED: {msg}")

api_get = cluster_api.get

# ---- S3, path style, AWS Signature Version 4 ----
def _hmac(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()

def s3_request(key="", query=None):
    endpoint = os.environ["S3_ENDPOINT"].rstrip("/")
    bucket, region = os.environ["S3_BUCKET"], os.environ["S3_REGION"]
    access, secret = os.environ["S3_ACCESS_KEY"], os.environ["S3_SECRET_KEY"]
    host = urllib.parse.urlsplit(endpoint).netloc
    path = urllib.parse.quote(f"/{bucket}" + (f"/{key}" if key else ""), safe="/-_.~")
    q = sorted((query or {}).items())
    qs = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                  for k, v in q)
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(b"").hexdigest()
    headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
    signed = ";".join(sorted(headers))
    canonical = "\n".join(["GET", path, qs,
                           "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
                           signed, payload])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    k = _hmac(("AWS4" + secret).encode(), day)
    for part in (region, "s3", "aws4_request"):
        k = _hmac(k, part)
    sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    req = urllib.request.Request(endpoint + path + (f"?{qs}" if qs else ""), headers={
        "x-amz-content-sha256": payload, "x-amz-date": amz_date,
        "Authorization": f"AWS4-HMAC-SHA256 Credential={access}/{scope}, "
                         f"SignedHeaders={signed}, Signature={sig}"})
    with urllib.request.urlopen(req, timeout=20) as r:
        return r.read()

def s3_list(prefix):
    ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
    keys, token = [], None
    while True:
        q = {"list-type": "2", "prefix": prefix}
        if token:
            q["continuation-token"] = token
        doc = ET.fromstring(s3_request(query=q))
        keys += [c.findtext(f"{ns}Key") for c in doc.findall(f"{ns}Contents")]
        if doc.findtext(f"{ns}IsTruncated") != "true":
            return keys
        token = doc.findtext(f"{ns}NextContinuationToken")

def committed_steps(prefix, job):
    pat = re.compile(re.escape(f"{prefix}/jobs/{job}/ckpt/") + r"([0-9]{12})/COMMIT$")
    return sorted(int(m[1]) for k in s3_list(f"{prefix}/jobs/{job}/ckpt/") if (m := pat.match(k)))

# ---- waits, each with a deadline ----
def formed(n, deadline_s, apis):
    cluster_api.formed(n, deadline_s, apis, fail)

def job_doc(apis, job):
    """The job's document from the first node that answers, and the errors before it."""
    errs = []
    for api in apis:
        try:
            return api_get(api, f"/v1/jobs/{job}"), errs
        except Exception as e:
            errs.append(f"{api}: {e}")
    return None, errs

def wait_ring(deadline_s, job, apis):
    """Waits until the job runs on its full ring; prints the ring's members, rank order."""
    deadline, doc = time.time() + deadline_s, None
    while time.time() < deadline:
        doc, _ = job_doc(apis, job)
        if doc and doc["state"] in ENDED:
            fail(f"job {job} ended {doc['state']} before it was seen running: {doc['events'][-5:]}")
        if doc and doc["state"] == "running" and len(doc.get("ring") or []) == int(doc["workers"]):
            print(" ".join(doc["ring"]))
            return
        time.sleep(0.25)
    fail(f"job {job} not running on its ring within {deadline_s} s: {doc}")

def wait_ckpt(deadline_s, prefix, job, after, apis):
    """Waits for a committed checkpoint of a step > after; prints the newest step."""
    deadline, last = time.time() + deadline_s, ""
    while time.time() < deadline:
        try:
            steps = committed_steps(prefix, job)
            if steps and steps[-1] > after:
                print(steps[-1])
                return
            last = f"committed steps {steps}"
        except Exception as e:
            last = f"listing the bucket: {e}"
        doc, _ = job_doc(apis, job)
        if doc and doc["state"] in ENDED:
            fail(f"job {job} ended {doc['state']} before a checkpoint after step {after}; {last}")
        time.sleep(0.5)
    fail(f"no checkpoint after step {after} within {deadline_s} s ({last})")

def wait_job(deadline_s, job, out, apis):
    deadline, doc, errs = time.time() + deadline_s, None, []
    while time.time() < deadline:
        d, errs = job_doc(apis, job)
        doc = d or doc
        if doc and doc["state"] in ENDED:
            break
        time.sleep(0.5)
    else:
        fail(f"job {job} not ended within {deadline_s} s: "
                 f"{doc and {k: doc.get(k) for k in ('state', 'attempt', 'step', 'ring')}} {errs}")
    json.dump(doc, open(out, "w"), indent=1)
    print(doc["state"])

def wait_key(deadline_s, key):
    deadline, last = time.time() + deadline_s, ""
    while time.time() < deadline:
        try:
            sys.stdout.buffer.write(s3_request(key))
            return
        except Exception as e:
            last = str(e)
        time.sleep(0.5)
    fail(f"no s3 object {key} within {deadline_s} s: {last}")

def wait_archived(deadline_s, job, apis):
    deadline, last = time.time() + deadline_s, None
    while time.time() < deadline:
        doc, errs = job_doc(apis, job)
        last = doc and doc.get("freshness") or errs
        if doc and (doc.get("freshness") or {}).get("served_by") == "archive":
            if doc["state"] != "succeeded":
                fail(f"job {job} answered from the archive as {doc['state']}")
            return
        time.sleep(0.5)
    fail(f"job {job} not answered from the archive within {deadline_s} s: {last}")

def free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    print(" ".join(str(s.getsockname()[1]) for s in socks))
    for s in socks:
        s.close()

if __name__ == "__main__":
    cmd, a = sys.argv[1], sys.argv[2:]
    if cmd == "ports":
        free_ports(int(a[0]))
    elif cmd == "field":
        print(json.load(open(a[0]))[a[1]] if len(a) == 2 else json.load(open(a[0]))[a[1]][int(a[2])])
    elif cmd == "formed":
        formed(int(a[0]), float(a[1]), a[2:])
    elif cmd == "ring":
        wait_ring(float(a[0]), a[1], a[2:])
    elif cmd == "wait-ckpt":
        wait_ckpt(float(a[0]), a[1], a[2], int(a[3]), a[4:])
    elif cmd == "wait-job":
        wait_job(float(a[0]), a[1], a[2], a[3:])
    elif cmd == "wait-key":
        wait_key(float(a[0]), a[1])
    elif cmd == "wait-archived":
        wait_archived(float(a[0]), a[1], a[2:])
    elif cmd == "committed":
        print(" ".join(map(str, committed_steps(a[0], a[1]))))
    elif cmd == "list":
        print("\n".join(s3_list(a[0])))
    elif cmd == "leftovers":
        print(" ".join(str(pid) for pid, _ in cluster_api.procs_under(a[0])))
    else:
        fail(f"unknown command {cmd}")
PYEOF
helper() { python3 "$tmp/helper.py" "$@"; }

# ---- 1. three Garage nodes ----
ports_s=$(helper ports 6)
read -r -a ports <<<"$ports_s"
rpc_secret=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
gconf() { echo "$tmp/g$1/garage.toml"; }
g() { # N ARGS...: the garage CLI against node N (over its RPC port), bounded in time
    timeout 30 "$garage" -c "$(gconf "$1")" "${@:2}"
}
s3_port() { echo "${ports[$(($1 + 2))]}"; } # g1..g3: ports[3..5]
for i in 1 2 3; do
    d=$tmp/g$i
    mkdir -p "$d/meta" "$d/data"
    cat >"$d/garage.toml" <<EOF
metadata_dir = "$d/meta"
data_dir = "$d/data"
db_engine = "sqlite"
replication_factor = 3
rpc_bind_addr = "127.0.0.1:${ports[$((i - 1))]}"
rpc_public_addr = "127.0.0.1:${ports[$((i - 1))]}"
rpc_secret = "$rpc_secret"

[s3_api]
s3_region = "$REGION"
api_bind_addr = "127.0.0.1:$(s3_port "$i")"
EOF
    chmod 600 "$d/garage.toml"
    "$garage" -c "$d/garage.toml" server </dev/null >"$d/garage.log" 2>&1 &
    garage_pids[i]=$!
    disown "${garage_pids[i]}"
done
garage_ids=("")
for i in 1 2 3; do
    deadline=$((SECONDS + wait_s))
    until g "$i" status >/dev/null 2>&1; do
        kill -0 "${garage_pids[i]}" 2>/dev/null || { tail -n 5 "$tmp/g$i/garage.log" >&2; die "garage g$i exited at start"; }
        [ "$SECONDS" -lt "$deadline" ] || die "garage g$i did not answer within $wait_s s"
        sleep 0.2
    done
    garage_ids+=("$(g "$i" node id -q 2>/dev/null)") # ID@127.0.0.1:PORT
done
for i in 2 3; do
    g 1 node connect "${garage_ids[i]}" >/dev/null || die "garage g1 could not connect to g$i"
done
for i in 1 2 3; do
    g 1 layout assign -z dc1 -c 1G "${garage_ids[i]%%@*}" >/dev/null || die "garage layout assign g$i failed"
done
g 1 layout apply --version 1 >/dev/null || die "garage layout apply failed"
deadline=$((SECONDS + wait_s))
until health=$(g 1 health 2>/dev/null) && grep -qE '^Storage nodes up: +3$' <<<"$health"; do
    [ "$SECONDS" -lt "$deadline" ] || { g 1 health >&2 || true; die "garage not healthy within $wait_s s"; }
    sleep 0.5
done
g 1 bucket create "$BUCKET" >/dev/null || die "garage bucket create failed"
g 1 key create "$KEY_NAME" >/dev/null || die "garage key create failed"
access_key=$(g 1 key info --key-id "$KEY_NAME" | tr -d '[:space:]')
secret_key=$(g 1 key info --secret-key "$KEY_NAME" | tr -d '[:space:]')
[[ -n $access_key && -n $secret_key ]] || die "no access key from 'garage key info'"
g 1 bucket allow --read --write --owner "$BUCKET" --key "$KEY_NAME" >/dev/null || die "garage bucket allow failed"
note "garage: 3 nodes healthy (S3 APIs on 127.0.0.1:$(s3_port 1), :$(s3_port 2), :$(s3_port 3)); bucket $BUCKET, key $access_key"

# The test's own S3 client (the helper) reads through g1, as n0 and n2 do.
helper() {
    S3_ENDPOINT="http://127.0.0.1:$(s3_port 1)" S3_BUCKET=$BUCKET S3_REGION=$REGION \
        S3_ACCESS_KEY=$access_key S3_SECRET_KEY=$secret_key python3 "$tmp/helper.py" "$@"
}
storage_url() { # GARAGE-NODE
    echo "s3://$BUCKET/$PREFIX?endpoint=http://127.0.0.1:$(s3_port "$1")&region=$REGION&access_key_id=$access_key&secret_access_key=$secret_key"
}

# ---- 2. three ringleader nodes ----
apis=("" "" "")
seed=""
# A keyed cluster (the default): one key for the three nodes, n0's admin token for the CLI.
"$bin" keygen "$tmp/cluster.key" 2>/dev/null
export RINGLEADER_TOKEN_FILE=$tmp/n0/api.token
for i in 0 1 2; do
    d=$tmp/n$i
    mkdir -p "$d"
    join=()
    if [ -n "$seed" ]; then join=(--join "$seed"); fi
    endpoint_node=1
    if [ "$i" = 1 ]; then endpoint_node=2; fi
    # The URL carries the S3 keys: from a 0600 file, never the command line (`ps`).
    (umask 077 && storage_url "$endpoint_node" >"$d/storage.url")
    # The ranks' step delay is a test hook: the node's environment (debug builds only), never
    # a spec's `env`, which may not set RINGLEADER_* variables.
    RINGLEADER_TEST_STEP_DELAY_MS=$step_delay_ms \
        "$bin" node --name "n$i" --listen 127.0.0.1:0 --api 127.0.0.1:0 --data 127.0.0.1:0 \
        --data-dir "$d" --cluster-key "$tmp/cluster.key" --storage-file "$d/storage.url" \
        --job-retention-s "$RETENTION_S" "${join[@]}" </dev/null >"$d/stdout.log" 2>"$d/node.log" &
    node_pids[i]=$!
    disown "${node_pids[i]}"
    deadline=$((SECONDS + wait_s))
    until [ -f "$d/node.json" ] && [ "$(helper field "$d/node.json" pid 2>/dev/null)" = "${node_pids[i]}" ]; do
        kill -0 "${node_pids[i]}" 2>/dev/null || { tail -n 5 "$d/node.log" >&2; die "node n$i exited at start"; }
        [ "$SECONDS" -lt "$deadline" ] || die "node n$i did not start within $wait_s s"
        sleep 0.1
    done
    apis[i]=$(helper field "$d/node.json" api_addr)
    if [ -z "$seed" ]; then seed=$(helper field "$d/node.json" p2p_addrs 0); fi
done
helper formed 3 "$wait_s" "${apis[@]}"
note "ringleader: 3 nodes formed (APIs ${apis[*]})"

# ---- 3. the train job ----
cat >"$tmp/job.toml" <<EOF
name = "garage-e2e"
kind = "train"
workers = $WORKERS
max_restarts = 2
placement = "spread"
[model]
arch = "mlp"
hidden = [64]
[data]
dataset = "digits"
[train]
epochs = 1000
max_steps = $steps
batch_per_worker = 32
lr = 0.05
seed = 7
[checkpoint]
every_steps = $CKPT_EVERY
keep = 3
EOF
job=$("$bin" --peer "${apis[0]}" submit "$tmp/job.toml")
[ -n "$job" ] || die "submit printed no job id"
ring_s=$(helper ring "$wait_s" "$job" "${apis[@]}")
read -r -a ring <<<"$ring_s"
note "job $job running on ${ring[*]}"

# ---- 4. a checkpoint in Garage; kill -9 g3; checkpoints go on ----
first=$(helper wait-ckpt "$wait_s" "$PREFIX" "$job" 0 "${apis[@]}")
note "checkpoint step $first committed in the bucket; kill -9 garage g3"
kill9 "${garage_pids[3]}"
garage_pids[3]=0
killed_garage=1
before_kill=$(helper wait-ckpt "$wait_s" "$PREFIX" "$job" "$first" "${apis[@]}")
note "checkpoint step $before_kill committed with g3 down"

# ---- 5. kill -9 a ringleader node of the ring: the job must resume from Garage ----
# The victim is the last rank not on n1, so that n1 (through g2) is among the survivors and
# the retried ranks read, through two Garage nodes, checkpoints written through one of them.
victim_rank=""
for ((r = ${#ring[@]} - 1; r >= 0; r--)); do
    if [ "${ring[r]}" != n1 ]; then victim_rank=$r; break; fi
done
[ -n "$victim_rank" ] || die "no ring member other than n1 in '${ring[*]}'"
victim=${ring[victim_rank]}
v=${victim#n}
[[ $v =~ ^[0-2]$ ]] || die "ring member '$victim' is not one of n0..n2"
note "kill -9 ringleader node $victim (rank $victim_rank of $job)"
kill9 "${node_pids[v]}"
node_pids[v]=0
alive_apis=()
for i in 0 1 2; do if [ "$i" != "$v" ]; then alive_apis+=("${apis[i]}"); fi; done

state=$(helper wait-job "$job_wait_s" "$job" "$tmp/job.json" "${alive_apis[@]}")
attempt=$(helper field "$tmp/job.json" attempt)
[ "$state" = succeeded ] || die "job $job ended $state (attempt $attempt); document in $tmp/job.json"
[ "$attempt" -ge 2 ] || die "job $job succeeded in attempt $attempt: the kill did not make it restart"

# The later attempt's rank 0 says where it resumed from (its log is on a live node).
resumed=$(grep -rhoE ' resumed step=[0-9]+' "$tmp"/n*/jobs/"$job" 2>/dev/null | sed 's/.*step=//' | sort -n | tail -n 1 || true)
[ -n "$resumed" ] || die "no 'resumed step=' line in job $job's rank logs: it started over"
[ "$resumed" -gt 0 ] || die "job $job resumed at step 0"
[ "$resumed" -ge "$before_kill" ] ||
    die "job $job resumed at step $resumed, before step $before_kill committed ahead of the kill"

# ---- 6. what is in the bucket ----
committed_s=$(helper committed "$PREFIX" "$job")
read -r -a committed <<<"$committed_s"
[ "${#committed[@]}" -ge 1 ] || die "no committed checkpoint of $job in the bucket"
helper wait-key "$wait_s" "$PREFIX/jobs/$job/record.json" >"$tmp/record.json"
python3 - "$tmp/record.json" "$job" <<'PYEOF' || die "record.json of $job in the bucket is not its succeeded record"
import json, sys
doc = json.load(open(sys.argv[1]))
state = doc.get("state")
state = state if isinstance(state, str) else json.dumps(state)
sys.exit(0 if str(doc.get("id")) == sys.argv[2] and "succeeded" in state.lower() else 1)
PYEOF
helper list "$PREFIX/jobs/$job/" >"$tmp/objects.txt"
grep -q "^$PREFIX/jobs/$job/tb/" "$tmp/objects.txt" || die "no TensorBoard files of $job in the bucket"
records=$(grep -vc "^$PREFIX/jobs/$job/ckpt/" "$tmp/objects.txt" || true)
helper wait-archived "$wait_s" "$job" "${alive_apis[@]}"
note "job $job compacted out of the live state; answered from its record in Garage"

# Credentials must not leak into any log: the nodes' and the ranks' (which `ringleader logs`
# serves to any API client); the book's security model says storage URLs are shown with them
# REDACTED.
if grep -qF "$secret_key" "$tmp"/n*/node.log "$tmp"/n*/stdout.log; then
    die "a node's log holds the S3 secret key"
fi
leaks=$( (grep -rlF "$secret_key" "$tmp"/n*/jobs 2>/dev/null || true) | wc -l)
if [ "$leaks" -gt 0 ]; then
    die "$leaks rank logs of $job hold the S3 secret key"
fi

ok=1
echo "garage nodes=3 killed=$killed_garage job=$job state=$state attempt=$attempt restored_step=$resumed checkpoints=${#committed[@]} records=$records"
