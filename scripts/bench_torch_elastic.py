"""Elastic PyTorch benchmarks (issue 25, point 5), driven by scripts/bench-torch.sh: the
the book's elastic script (python/tests/torch_elastic_rank.py, a small MLP, STEP_SLEEP_S of
compute a step) as a command job of 3 ranks on a local cluster of 3 nodes (`min_workers =
1`, `[elastic] protocol = "ringleader"`), and the same script under torchrun.

Ours, one job of N steps with the faults in turn (each once the ring stepped again):
worker-kill (SIGKILL a rank), join (its member is back 10 s after it left),
hang (SIGSTOP a rank: its node names it after 3 s), join again, straggler (a rank sleeps
SLOW_S more a step until the chief blacklists it), host-kill (SIGSTOP a node and its rank, as
a host that loses power: gossip names it dead). `recover_s`: from the fault to the first step
of the new generation; for join, the ring's pause: from the last step of the generation
before to the first step of the one with the joiner (the joiner starts as a standby while
the ring trains on; `start_s`, from the moment its member may rejoin to that first step, is
its start, not a pause); `steps_lost`: the most any rank's `ringleader-elastic resumed` line
of that generation lost.

torchrun (`--nnodes 1:4 --nproc-per-node 3 --max-restarts 3`, c10d rendezvous): one worker
killed; every worker starts again, and the script, which writes no checkpoint, from step 0:
`steps_lost` is the step reached at the kill.

Goodput: the wall time of N steps with the faults over N steps without (ours: the faults
above; torchrun: the kill only, its hang lasting until the collective's timeout).

Prints one line each:
    torch elastic fault=F recover_s=X steps_lost=L [start_s=S]
    torch elastic impl=torchrun fault=worker-kill recover_s=X steps_lost=L
    torch goodput faults=… ours_x=X torchrun_x=Y torchrun_faults=worker-kill
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))

from test_torch_elastic import RANK_SCRIPT, RESUMED, Cluster, hashes  # noqa: E402

from conftest import PYTHON_DIR  # noqa: E402

# The wall clock a `hash` line ends with.
STAMP = re.compile(r" t=(\d+\.\d+)")
# Bound on each wait, seconds.
WAIT_S = 180
POLL_S = 0.1
# Seconds after a member leaves before the chief takes it back (the node's rule).
REJOIN_AFTER_S = 10.0


def stamp(line):
    return float(STAMP.search(line).group(1))


def rank_env(args, work, stop_at):
    with open(os.path.join(work, "stop-at"), "w") as f:
        f.write(str(stop_at))
    return {"PYTHONPATH": PYTHON_DIR, "OMP_NUM_THREADS": "1",
            "STEP_SLEEP_S": str(args.step_sleep), "SLOW_DIR": os.path.join(work, "slow"),
            "SLOW_S": str(args.slow), "STOP_AT_FILE": os.path.join(work, "stop-at")}


class Run:
    """One job on a fresh cluster."""

    def __init__(self, args, work, steps):
        self.work = work
        os.makedirs(os.path.join(work, "slow"), exist_ok=True)
        self.cluster = Cluster(os.path.join(work, "cluster"))
        self.down = None
        self.job = self.cluster.client().submit({
            "name": "bench-torch-elastic", "kind": "command", "workers": 3,
            "min_workers": 1, "max_restarts": 0, "command": [sys.executable, RANK_SCRIPT],
            "env": rank_env(args, work, steps),
            "elastic": {"protocol": "ringleader", "straggler_window": 10},
        }).id

    def doc(self):
        return self.cluster.client(avoid=self.down).job(self.job).doc

    def lines(self):
        return self.cluster.logs(self.job)

    def wait(self, what, cond):
        deadline = time.monotonic() + WAIT_S
        while True:
            d, lines = self.doc(), self.lines()
            got = cond(d, lines)
            if got:
                return got
            if d["state"] not in ("pending", "running"):
                raise RuntimeError(f"{what}: job {d['state']}: {d['history']}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not within {WAIT_S} s: {d['history']}")
            time.sleep(POLL_S)

    def step_of(self, lines):
        return max((s for s, *_ in hashes(lines)), default=0)

    def at_step(self, step):
        return self.wait(f"step {step}", lambda d, lines: self.step_of(lines) >= step)

    def first_step_time(self, gen, lines):
        ts = [stamp(line) for line in lines
              if line.startswith("hash ") and f" gen={gen} " in line]
        return min(ts) if ts else None

    def last_step_time(self, gen):
        ts = [stamp(line) for line in self.lines()
              if line.startswith("hash ") and f" gen={gen} " in line]
        return max(ts) if ts else None

    def reform(self, reason, after_gen):
        """Waits for the generation after `after_gen` whose reason starts with `reason` to
        take a step: (generation, its first step's time, its steps lost)."""
        def cond(d, lines):
            gens = [h["generation"] for h in d["history"]
                    if h["generation"] > after_gen and h["reason"].startswith(reason)]
            if not gens:
                return None
            t = self.first_step_time(gens[0], lines)
            return None if t is None else (gens[0], t)
        gen, t = self.wait(f"re-form {reason!r}", cond)
        lost = [int(m.group(2)) for line in self.lines()
                if (m := RESUMED.match(line)) and f" generation={gen} " in line]
        return gen, t, max(lost, default=0)

    def pids(self, gen):
        """{rank: pid} of generation `gen`, once every rank of it took a step."""
        world = next(len(h["ring"]) for h in self.doc()["history"] if h["generation"] == gen)

        def cond(d, lines):
            got = {r: p for _, g, r, _, p, _ in hashes(lines) if g == gen}
            return got if len(got) == world else None
        return self.wait(f"every rank of generation {gen}", cond)

    def finish(self):
        self.wait("the end", lambda d, _: d["state"] == "succeeded" or None)

    def elapsed(self):
        """From the first step to the last."""
        ts = [stamp(line) for line in self.lines()
              if line.startswith("hash ")]
        return max(ts) - min(ts)

    def stop(self):
        self.cluster.stop()


def ours(args, work, faults):
    run = Run(args, work, args.steps)
    results = []
    try:
        n = args.steps
        run.at_step(n // 12)
        gen = 1
        if faults:
            def fault(name, rank, reason, act):
                """Injects a fault on `rank` (`act(pid, victim)`) and times its re-form."""
                victim = run.doc()["ring"][rank]
                pid = run.pids(gen)[rank]
                t0 = time.time()
                act(pid, victim)
                g, t, lost = run.reform(f"{reason} {victim}", gen)
                results.append((name, t - t0, lost))
                print(f"# {results[-1]}", file=sys.stderr, flush=True)
                return g, victim, pid, t0

            def wake(pid, sig):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

            gen, victim, _, t0 = fault("worker-kill", 2, "peer-lost",
                                       lambda pid, _: os.kill(pid, signal.SIGKILL))
            before = gen
            gen, t, lost = run.reform(f"joined {victim}", gen)
            pause = t - run.last_step_time(before)
            results.append(("join", pause, lost, t - (t0 + REJOIN_AFTER_S)))

            gen, victim, pid, _ = fault("hang", 1, "hung",
                                        lambda pid, _: os.kill(pid, signal.SIGSTOP))
            wake(pid, signal.SIGCONT)
            gen, _, _ = run.reform(f"joined {victim}", gen)

            gen, _, _, _ = fault(
                "straggler", 0, "straggler",
                lambda pid, _: open(os.path.join(work, "slow", str(pid)), "w").close())

            def freeze(pid, victim):
                node = run.cluster.nodes[run.cluster.node_of(victim)]
                run.down = node.data_dir
                os.kill(node.proc.pid, signal.SIGSTOP)
                os.kill(pid, signal.SIGSTOP)

            last = len(run.doc()["ring"]) - 1
            gen, victim, pid, _ = fault("host-kill", last, "peer-lost", freeze)
            node = run.cluster.nodes[run.cluster.node_of(victim)]
            node.proc.kill()
            node.proc.wait()
            wake(pid, signal.SIGKILL)
        run.finish()
        return results, run.elapsed()
    finally:
        run.stop()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args, work, kill):
    """One torchrun run of N steps; with `kill`, a worker killed at N/12: (recover_s,
    steps_lost, elapsed)."""
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, **rank_env(args, work, args.steps),
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    env = {k: v for k, v in env.items() if not k.startswith("RINGLEADER_")}
    log = os.path.join(work, "torchrun.log")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:4",
           "--nproc-per-node", "3", "--max-restarts", "3", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--tee", "3",
           "--log-dir", os.path.join(work, "logs"), RANK_SCRIPT]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        def lines():
            with open(log, errors="replace") as f:
                return [line.split(":", 1)[1] if line.startswith("[default") else line
                        for line in f.read().splitlines()]

        def wait(cond, what):
            deadline = time.monotonic() + WAIT_S * 2
            while not (got := cond(lines())):
                if proc.poll() is not None and not cond(lines()):
                    raise RuntimeError(f"torchrun ended ({proc.returncode}) before {what}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"torchrun: {what} not within {WAIT_S * 2} s")
                time.sleep(POLL_S)
            return got

        def hs(ls):
            return hashes(line.strip() for line in ls)

        recover, lost = None, None
        if kill:
            wait(lambda ls: max((s for s, *_ in hs(ls)), default=0) >= args.steps // 12,
                 "the kill step")
            before = hs(lines())
            reached = max(s for s, *_ in before)
            victim = next(p for _, _, r, _, p, _ in before if r == 2)
            t0 = time.time()
            os.kill(victim, signal.SIGKILL)

            def restarted(ls):
                ts = [stamp(line) for line in ls
                      if line.strip().startswith("hash ") and stamp(line) > t0
                      and f" pid={victim} " not in line
                      and int(line.split("step=")[1].split()[0]) <= reached // 2]
                return min(ts) if ts else None
            recover = wait(restarted, "the restart's first step") - t0
            lost = reached
        rc = proc.wait(timeout=WAIT_S * 4)
        if rc != 0:
            raise RuntimeError(f"torchrun exited {rc}: {lines()[-5:]}")
        ts = [stamp(line) for line in lines()
              if line.strip().startswith("hash ")]
        return recover, lost, max(ts) - min(ts)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2400)
    p.add_argument("--step-sleep", type=float, default=0.03)
    p.add_argument("--slow", type=float, default=0.3)
    p.add_argument("--parts", default="ours,torchrun")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="rl-bench-torch-elastic-")
    try:
        parts = args.parts.split(",")
        ours_x = torchrun_x = None
        if "ours" in parts:
            results, faulty = ours(args, os.path.join(work, "ours-faults"), True)
            for fault, recover, lost, *start in results:
                extra = f" start_s={start[0]:.3f}" if start else ""
                print(f"torch elastic fault={fault} recover_s={recover:.3f} steps_lost={lost}"
                      f"{extra}",
                      flush=True)
            _, clean = ours(args, os.path.join(work, "ours-clean"), False)
            ours_x = faulty / clean
        if "torchrun" in parts:
            recover, lost, faulty = torchrun(args, os.path.join(work, "tr-kill"), True)
            print(f"torch elastic impl=torchrun fault=worker-kill recover_s={recover:.3f} "
                  f"steps_lost={lost}", flush=True)
            _, _, clean = torchrun(args, os.path.join(work, "tr-clean"), False)
            torchrun_x = faulty / clean
        fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        print(f"torch goodput faults=worker-kill,join,hang,join,straggler,host-kill "
              f"steps={args.steps} ours_x={fmt(ours_x)} torchrun_x={fmt(torchrun_x)} "
              f"torchrun_faults=worker-kill", flush=True)
    finally:
        if args.keep:
            print(f"# kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
