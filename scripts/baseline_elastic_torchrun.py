#!/usr/bin/env python3
"""Elastic baseline: how fast PyTorch's own elastic path (torchrun) trains again after a worker
is SIGKILLed, on this host. Printed beside `ringleader-bench elastic`'s worker-kill figure.

What it runs, per measurement run (`--runs`, 3 by default):

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 \\
    torchrun --nnodes 1:4 --nproc-per-node 4 --max-restarts 3 \\
        --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:<free port> --rdzv-id <unique> \\
        scripts/baseline_elastic_train.py --ckpt-dir <tmp> --ckpt-every 10

i.e. one elastic agent (one "node" of an elastic job that may have 1 to 4 nodes) with 4
local workers, training a small DDP MLP over Gloo on CPU, one thread per process
(scripts/baseline_elastic_train.py). Each worker prints `pid rank=R pid=P ...` at start and
`step rank=R world=W restart=K step=S t=<unix s>` per completed step, K being
TORCHELASTIC_RESTART_COUNT; rank 0 checkpoints every 10 steps, which every rank reloads at
start (torchrun's contract: a restart re-runs the whole script).

Once rank 0 has completed `--warmup-steps` steps (20), the worker of rank 3 (`--victim-rank`)
gets SIGKILL; then:

  - recover_s: from the kill to the first step line of the restarted group (restart count
    incremented, any rank) with t > kill time; the figure of the result line (median over the
    runs), the counterpart of ringleader's recover_s;
  - detect_s: from the kill to the agent's "Worker group FAILED ... will restart worker group"
    log line (torchrun runs with LOGLEVEL=INFO; time of arrival of the line here);
  - reform_s: from the kill to the agent's "Starting worker group" line after the rendezvous of
    the new group (the rest of recover_s is process start, `import torch`, the Gloo process
    group, DDP's broadcast and one step);
  - steps_lost: steps trained again (last step completed before the kill minus the step the
    restarted group resumed after).

With a single agent this is torchrun's local-restart path: the agent sees a worker exit,
stops the surviving local workers (SIGTERM), re-runs the c10d rendezvous (a new round) and
starts 4 new workers; there is no other agent to lose, so the world stays 4. Note that with
`--nnodes 1:4` the rendezvous, once it has its minimum of 1 node, waits `last_call_timeout`
(30 s by default) for more nodes before it completes: that wait is part of every (re)start on
this path. `--rdzv-conf last_call_timeout=1` or `--nnodes 1` show the cost without it.

Output: exactly one line on stdout,

    elastic impl=torchrun fault=worker-kill recover_s=<median> recover_s_all=<a,b,c> workers=4 \\
        detect_s=<median> reform_s=<median> steps_lost=<median>

(the last three: medians over the runs where they were seen; `?` where never), and exit 0;
progress and a per-run breakdown go to stderr as `#` lines. When torch or torchrun is
missing, or no run completes, the stdout line is `# skipped: <reason>` (still exit 0).
Everything started is SIGKILLed on the way out, whatever happens (torchrun's process group and
every worker's: torchrun starts each worker in a session of its own); each phase of a run
(launch to kill, kill to recovery) is bounded by `--timeout-s` (120 s), so a run by twice
that. Stdlib only; torch is needed only by the processes it launches.

torchrun runs with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (`--share-store` drops it): with the
rendezvous TCPStore shared with the workers, torch's default since 2.5, a restarted worker
group can read the previous group's keys from the store (a race with the new workers' own
writes) and Gloo dials the dead workers' ports ("Gloo connectFullMesh failed ... Connection
refused") or waits for them, so restarts mostly fail until --max-restarts is spent (torch
2.15.0 here: 7 of 8 restarts; pytorch/pytorch#135712).

    python3 scripts/baseline_elastic_torchrun.py [--runs 3] [--timeout-s 120] \\
        [--nnodes 1:4] [--rdzv-conf last_call_timeout=1] [--log-dir DIR]
"""
import argparse
import atexit
import importlib.util
import os
import queue
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_SCRIPT = os.path.join(HERE, "baseline_elastic_train.py")

STEP_RE = re.compile(r"^step rank=(\d+) world=(\d+) restart=(\d+) step=(\d+) t=([0-9.]+)")
PID_RE = re.compile(r"^pid rank=(\d+) pid=(\d+) world=(\d+) restart=(\d+) t=([0-9.]+)")
FAILED_RE = re.compile(r"Worker group (FAILED|UNHEALTHY)")
STARTING_RE = re.compile(r"Starting worker group")

# Every process group / process this script started and has not yet reaped; see cleanup().
_live = []  # list of (Popen, set of worker pids)


def note(msg):
    print(f"# {msg}", file=sys.stderr, flush=True)


def skip(reason):
    print(f"# skipped: {reason}", flush=True)
    sys.exit(0)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(root):
    """PIDs of every live descendant of `root`, from /proc (Linux)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def is_our_worker(pid):
    """True when `pid` still runs the training script (guards against PID reuse)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"baseline_elastic_train.py" in f.read()
    except OSError:
        return False


def kill_tree(proc, worker_pids):
    """SIGKILL torchrun, its process group, every descendant and every worker's session."""
    targets = set(descendants(proc.pid)) if proc.poll() is None else set()
    targets |= {p for p in worker_pids if is_our_worker(p)}
    own = os.getpgrp()
    for pid in targets:
        try:
            pgid = os.getpgid(pid)
            if pgid != own:
                os.killpg(pgid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # started with start_new_session: pgid == pid
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def cleanup():
    while _live:
        proc, pids = _live.pop()
        kill_tree(proc, pids)


def _on_signal(signum, _frame):
    cleanup()
    sys.exit(128 + signum)


def reader(stream, tag, q, log):
    for line in iter(stream.readline, ""):
        now = time.time()
        if log is not None:
            log.write(f"{now:.6f} {tag} {line}")
        q.put((now, tag, line.rstrip("\n")))
    q.put((time.time(), tag, None))


def torchrun_cmd():
    exe = shutil.which("torchrun")
    if exe:
        return [exe]
    # Same entry point; used where the console script is not on PATH.
    return [sys.executable, "-m", "torch.distributed.run"]


def one_run(args, run_idx, launcher):
    """One launch, warm-up, kill and recovery. Returns a dict of figures; raises on failure."""
    ckpt_dir = tempfile.mkdtemp(prefix="rl-torchrun-elastic-")
    port = free_port()
    rdzv_id = f"rl-elastic-{uuid.uuid4().hex[:12]}"
    cmd = launcher + [
        "--nnodes", args.nnodes,
        "--nproc-per-node", str(args.workers),
        "--max-restarts", str(args.max_restarts),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", rdzv_id,
    ]
    if args.rdzv_conf:
        cmd += ["--rdzv-conf", args.rdzv_conf]
    if args.monitor_interval is not None:
        cmd += ["--monitor-interval", str(args.monitor_interval)]
    cmd += [TRAIN_SCRIPT, "--ckpt-dir", ckpt_dir, "--ckpt-every", str(args.ckpt_every)]

    env = dict(os.environ, LOGLEVEL="INFO", OMP_NUM_THREADS="1")
    env.pop("PYTHONUNBUFFERED", None)  # the workers write whole lines; see baseline_elastic_train
    if not args.share_store:
        # pytorch/pytorch#135712: with the rendezvous TCPStore shared with the workers (the
        # default since torch 2.5), a restarted group may read the previous group's keys and
        # Gloo's connectFullMesh dials dead ports ("Connection refused"): restarts mostly fail.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    shown = ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 " if not args.share_store else "") + " ".join(cmd)
    if run_idx == 0:
        note("command: " + shown)
    log = None
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
        log = open(os.path.join(args.log_dir, f"torchrun-run{run_idx + 1}.log"), "w")
        log.write("# " + shown + "\n")
    worker_pids = set()
    t_launch = time.time()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, bufsize=1, env=env, start_new_session=True,
    )
    entry = (proc, worker_pids)
    _live.append(entry)
    q = queue.Queue()
    threads = [
        threading.Thread(target=reader, args=(proc.stdout, "out", q, log), daemon=True),
        threading.Thread(target=reader, args=(proc.stderr, "err", q, log), daemon=True),
    ]
    for t in threads:
        t.start()

    deadline = t_launch + args.timeout_s  # warm-up; the recovery gets a deadline of its own
    victim_pid = None
    warm_steps = 0  # rank 0's completed steps in the first group
    t_first_step = None
    t_kill = None
    last_step_before = 0
    r = {}
    eof = 0
    try:
        while True:
            left = deadline - time.time()
            if left <= 0:
                phase = "warm-up" if t_kill is None else "recovery"
                raise RuntimeError(f"timed out after {args.timeout_s:.0f} s in {phase}")
            try:
                now, tag, line = q.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                eof += 1
                if eof == 2:
                    raise RuntimeError(f"torchrun exited (rc={proc.wait()}) before recovery")
                continue
            if tag == "err":
                if t_kill is not None:
                    if "detect_s" not in r and FAILED_RE.search(line):
                        r["detect_s"] = now - t_kill
                    elif "detect_s" in r and "reform_s" not in r and STARTING_RE.search(line):
                        r["reform_s"] = now - t_kill
                continue
            m = PID_RE.match(line)
            if m:
                rank, pid, restart = int(m[1]), int(m[2]), int(m[4])
                worker_pids.add(pid)
                if restart == 0 and rank == args.victim_rank:
                    victim_pid = pid
                if t_kill is not None and restart > 0 and "spawn_s" not in r:
                    r["spawn_s"] = float(m[5]) - t_kill  # first new worker is up
                continue
            m = STEP_RE.match(line)
            if not m:
                continue
            rank, world, restart, step, t = int(m[1]), int(m[2]), int(m[3]), int(m[4]), float(m[5])
            if restart == 0:
                if t_first_step is None:
                    t_first_step = t
                if t_kill is None or t <= t_kill:
                    last_step_before = max(last_step_before, step)
                if rank == 0:
                    warm_steps += 1
                if t_kill is None and warm_steps >= args.warmup_steps and victim_pid is not None:
                    os.kill(victim_pid, signal.SIGKILL)
                    t_kill = time.time()
                    deadline = t_kill + args.timeout_s
            elif t_kill is not None and t > t_kill:
                r["recover_s"] = t - t_kill
                r["steps_lost"] = last_step_before - (step - 1)
                r["world"] = world
                r["restart"] = restart
                r["start_s"] = t_first_step - t_launch
                return r
    finally:
        kill_tree(proc, worker_pids)
        if entry in _live:
            _live.remove(entry)
        for t in threads:
            t.join(timeout=2)
        if log is not None:
            log.close()
        shutil.rmtree(ckpt_dir, ignore_errors=True)


def fmt(v):
    return f"{v:.3f}"


def median_of(runs, key, as_int=False):
    vals = [r[key] for r in runs if key in r]
    if not vals:
        return "?"
    m = statistics.median(vals)
    if as_int:
        return str(int(m)) if m == int(m) else f"{m:.1f}"
    return fmt(m)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=120.0,
                    help="bound on each phase of a run (launch to kill, kill to recovery), seconds")
    ap.add_argument("--workers", type=int, default=4, help="--nproc-per-node")
    ap.add_argument("--nnodes", default="1:4", help="torchrun --nnodes (MIN:MAX or N)")
    ap.add_argument("--max-restarts", type=int, default=3)
    ap.add_argument("--rdzv-conf", default="", help="torchrun --rdzv-conf, e.g. last_call_timeout=1")
    ap.add_argument("--monitor-interval", type=float, default=None,
                    help="torchrun --monitor-interval (default: torchrun's own, 0.1 s in torch 2.x)")
    ap.add_argument("--share-store", action="store_true",
                    help="keep torchrun's default shared rendezvous store (restarts then mostly fail, "
                    "pytorch/pytorch#135712); by default TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
    ap.add_argument("--warmup-steps", type=int, default=20, help="rank 0's steps before the kill")
    ap.add_argument("--victim-rank", type=int, default=None, help="rank to kill (default: last)")
    ap.add_argument("--ckpt-every", type=int, default=10, help="checkpoint interval, steps")
    ap.add_argument("--log-dir", default="", help="keep each run's raw torchrun output here")
    args = ap.parse_args()
    if args.victim_rank is None:
        args.victim_rank = args.workers - 1
    if not 0 < args.victim_rank < args.workers:
        ap.error("--victim-rank must be a non-zero rank below --workers")

    atexit.register(cleanup)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)

    if importlib.util.find_spec("torch") is None:
        skip("torch is not installed (scripts/install-baselines.sh)")
    launcher = torchrun_cmd()
    probe = subprocess.run(
        launcher + ["--help"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120
    )
    if probe.returncode != 0:
        skip("torchrun does not run: " + (probe.stderr.strip().splitlines() or ["?"])[-1])
    if not os.path.exists(TRAIN_SCRIPT):
        skip(f"{TRAIN_SCRIPT} is missing")

    note(
        "torchrun baseline: one agent, so a worker kill takes torchrun's local-restart path "
        "(stop the survivors, new c10d rendezvous round, 4 new workers from the last checkpoint)"
    )
    runs, failures = [], []
    for i in range(args.runs):
        try:
            r = one_run(args, i, launcher)
        except Exception as e:  # noqa: BLE001 - a failed run is reported, not fatal
            failures.append(str(e))
            note(f"run {i + 1}/{args.runs}: failed: {e}")
            continue
        runs.append(r)
        note(
            f"run {i + 1}/{args.runs}: first step {r['start_s']:.2f} s after launch; after the kill: "
            f"failure logged +{r.get('detect_s', float('nan')):.3f} s, new group started "
            f"+{r.get('reform_s', float('nan')):.3f} s, first new worker up "
            f"+{r.get('spawn_s', float('nan')):.3f} s, first step +{r['recover_s']:.3f} s "
            f"(world={r['world']} restart={r['restart']} steps_lost={r['steps_lost']})"
        )
    if not runs:
        skip("no run completed: " + "; ".join(failures))
    rec = [r["recover_s"] for r in runs]
    print(
        f"elastic impl=torchrun fault=worker-kill recover_s={fmt(statistics.median(rec))} "
        f"recover_s_all={','.join(fmt(v) for v in rec)} workers={args.workers} "
        f"detect_s={median_of(runs, 'detect_s')} reform_s={median_of(runs, 'reform_s')} "
        f"steps_lost={median_of(runs, 'steps_lost', as_int=True)}",
        flush=True,
    )


if __name__ == "__main__":
    main()
