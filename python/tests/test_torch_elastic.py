"""Elastic PyTorch from survivors' memory on real nodes (issue 25, point 3): a cluster of 3
nodes of the debug binary runs a command job of 3 ranks (`min_workers = 2`, `[elastic]
protocol = "ringleader"`), each rank the book's script (`torch_elastic_rank.py`: a small
MLP on generated data through `rlt.init`, `ElasticSampler`, `rlt.DistributedDataParallel`
and `ElasticOptimizer`). One job lives through every fault in turn, each re-form checked
before the next fault:

1. a rank's process is killed (SIGKILL): `peer-lost <member> (rank r): exited …`;
   its member is back in the ring 2 s later (`rejoin_after_s`; `joined <member>`), a new
   process;
2. a rank is stopped (SIGSTOP): `hung <member> …`; then SIGCONT: it is not taken back
   (its node kills it) and the survivors go on undisturbed; its member rejoins;
3. a node is killed (SIGKILL): `peer-lost <member> …`; the node returns (restarted on its
   data directory) and joins: `joined <member>`;
4. a rank is slowed (it sleeps 0.3 s a step): `straggler <member> …`, the member is
   blacklisted and the ring goes on with 2;
then the ranks are told the step to end at, and the job succeeds in its first attempt.

After every re-form: the survivors' PIDs are the ones they had, every rank that logged a
step of a generation logged the same parameter digest for it (so the joiner got the state
and every rank restored the same commit), each `ringleader-elastic resumed` line lost at most
one step. That a re-form shares out the rest of an epoch, each sample once, is the
sampler's own test below.

Waits poll with deadlines; nodes are stopped by PID (their ranks die with them). Without
torch: SKIPPED.
"""

import json
import os
import re
import signal
import sys
import time

import pytest

try:
    import torch  # noqa: F401
except ImportError:
    pytest.skip("torch not installed", allow_module_level=True)

from conftest import PYTHON_DIR, Node  # noqa: E402

import ringleader  # noqa: E402  (importable once conftest put python/ on the path)

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "torch_elastic_rank.py")
# Bound on each wait for the job (a debug build on two cores, three torch processes).
WAIT_S = 120
POLL_S = 0.25
HASH = re.compile(r"^hash step=(\d+) gen=(\d+) rank=(\d+) world=(\d+) pid=(\d+) h=(\w+) t=")
RESUMED = re.compile(r"^ringleader-elastic resumed .*restored_step=(\d+) steps_lost=(\d+)")


class Cluster:
    """Three nodes on 127.0.0.1: the first makes the cluster key, the others join it;
    `node_env` is added to each node's environment."""

    def __init__(self, root, n=3, node_env=None):
        self.root = str(root)
        self.node_env = node_env
        self.nodes = [Node(os.path.join(self.root, "c0"), name="c0", env=node_env)]
        self.key = os.path.join(self.nodes[0].data_dir, "cluster.key")
        for i in range(1, n):
            self.nodes.append(self._joiner(i))
        self.wait_formed(n)

    def _joiner(self, i):
        with open(os.path.join(self.nodes[0].data_dir, "node.json")) as f:
            seed = json.load(f)["p2p_addrs"][0]
        return Node(os.path.join(self.root, f"c{i}"), name=f"c{i}",
                    extra=("--cluster-key", self.key, "--join", seed), env=self.node_env)

    def restart(self, i):
        self.nodes[i] = self._joiner(i)

    def client(self, avoid=None):
        for n in self.nodes:
            if n.proc.poll() is None and n.data_dir != avoid:
                return n.client()
        raise AssertionError("no node running")

    def wait_formed(self, n):
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                if all(sum(m["state"] == "alive" for m in x.client().status()["members"]) == n
                       for x in self.nodes):
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            assert time.monotonic() < deadline, "the cluster did not form"
            time.sleep(POLL_S)

    def node_of(self, member):
        return next(i for i, n in enumerate(self.nodes) if os.path.basename(n.data_dir) == member)

    def kill9(self, i):
        self.nodes[i].proc.kill()
        self.nodes[i].proc.wait()

    def logs(self, job_id):
        """Every line of every rank log of the job, on every node."""
        lines = []
        for n in self.nodes:
            base = os.path.join(n.data_dir, "jobs", job_id)
            for dirpath, _, files in os.walk(base):
                for f in files:
                    if f.endswith(".log"):
                        with open(os.path.join(dirpath, f), errors="replace") as fh:
                            lines.extend(fh.read().splitlines())
        return lines

    def stop(self):
        for n in self.nodes:
            n.stop()


def hashes(lines):
    """(step, gen, rank, world, pid, digest) of each `hash` line."""
    out = []
    for line in lines:
        m = HASH.match(line)
        if m:
            s, g, r, w, p, h = m.groups()
            out.append((int(s), int(g), int(r), int(w), int(p), h))
    return out


def pids_of(lines, gen):
    """{rank: pid} of the ranks that logged a step in generation `gen`."""
    return {r: p for _, g, r, _, p, _ in hashes(lines) if g == gen}


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (its node has not reaped it yet) is dead too.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture()
def cluster(tmp_path):
    c = Cluster(tmp_path / "cluster")
    yield c
    c.stop()


def test_one_job_lives_through_every_fault_from_survivors_memory(cluster, tmp_path):
    slow_dir = tmp_path / "slow"
    slow_dir.mkdir()
    stop_file = tmp_path / "stop-at"
    client = cluster.client()
    job = client.submit({
        "name": "torch-elastic", "kind": "command", "workers": 3, "min_workers": 2,
        "max_restarts": 0, "command": [sys.executable, RANK_SCRIPT],
        "env": {"PYTHONPATH": PYTHON_DIR, "OMP_NUM_THREADS": "1", "STEP_SLEEP_S": "0.03",
                "SLOW_DIR": str(slow_dir), "SLOW_S": "0.3", "STOP_AT_FILE": str(stop_file)},
        # A member that left may join again 2 s later (the default is 10 s; three rejoins).
        "elastic": {"protocol": "ringleader", "straggler_window": 10, "rejoin_after_s": 2},
    })
    job_id = job.id

    def doc():
        """The job's document; an API call refused while the cluster re-forms (a node busy,
        a chief changing) is tried again until the wait's deadline."""
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                return cluster.client(avoid=down["dir"]).job(job_id).doc
            except ringleader.RingleaderError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(POLL_S)

    down = {"dir": None}

    def wait(what, cond):
        deadline = time.monotonic() + WAIT_S
        while True:
            d = doc()
            lines = cluster.logs(job_id)
            if cond(d, lines):
                return d, lines
            assert d["state"] in ("pending", "running"), (what, d["state"], d["history"],
                                                          lines[-40:])
            assert time.monotonic() < deadline, (what, d["history"], lines[-40:])
            time.sleep(POLL_S)

    def stepping(gen, world):
        """Waits until every rank of generation `gen` logged 5 steps in it."""
        def cond(d, lines):
            counts = {}
            for _, g, r, w, _, _ in hashes(lines):
                if g == gen and w == world:
                    counts[r] = counts.get(r, 0) + 1
            return len(counts) == world and min(counts.values()) >= 5
        return wait(f"generation {gen} stepping on {world}", cond)

    def reformed(after_gen, reason, world):
        """Waits for a generation after `after_gen` whose reason starts with `reason`."""
        def cond(d, lines):
            return any(h["generation"] > after_gen and h["reason"].startswith(reason)
                       and len(h["ring"]) == world for h in d["history"])
        d, _ = wait(f"a re-form {reason!r} on {world}", cond)
        g = max(h["generation"] for h in d["history"] if h["reason"].startswith(reason))
        _, lines = stepping(g, world)
        return g, lines

    def check_consistent(lines):
        digests = {}
        for s, g, r, _, _, h in hashes(lines):
            digests.setdefault((g, s), {})[r] = h
        for (g, s), by_rank in digests.items():
            assert len(set(by_rank.values())) == 1, f"ranks differ at gen {g} step {s}: {by_rank}"
        lost = [int(m.group(2)) for m in map(RESUMED.match, lines) if m]
        assert lost and max(lost) <= 1, f"steps lost per re-form: {lost}"

    def member_of(d, rank):
        return d["ring"][rank]

    # Generation 1 on 3 ranks.
    d, lines = stepping(1, 3)
    gen = 1
    pids = pids_of(lines, 1)

    # 1. A rank killed; its member rejoins with a new process.
    d = doc()
    victim = member_of(d, 2)
    os.kill(pids[2], signal.SIGKILL)
    gen, lines = reformed(gen, f"peer-lost {victim} (rank 2)", 2)
    assert set(pids_of(lines, gen).values()) == {pids[0], pids[1]}
    check_consistent(lines)
    gen, lines = reformed(gen, f"joined {victim}", 3)
    now = pids_of(lines, gen)
    assert {pids[0], pids[1]} < set(now.values()) and pids[2] not in now.values()
    check_consistent(lines)
    pids = now

    # 2. A rank stopped: named hung; SIGCONT does not bring it back; its member rejoins.
    d = doc()
    r = 1
    victim, stopped = member_of(d, r), pids[r]
    os.kill(stopped, signal.SIGSTOP)
    wait("named hung", lambda d, _: any(h["reason"].startswith(f"hung {victim}")
                                        for h in d["history"]))
    try:
        # Woken as soon as it is named (its node may have killed it already).
        os.kill(stopped, signal.SIGCONT)
    except ProcessLookupError:
        pass
    gen, lines = reformed(gen, f"hung {victim}", 2)
    survivors = {p for k, p in pids.items() if k != r}
    assert set(pids_of(lines, gen).values()) == survivors
    deadline = time.monotonic() + WAIT_S
    while alive(stopped):
        assert time.monotonic() < deadline, "the stopped rank was not ended"
        time.sleep(POLL_S)
    _, lines = stepping(gen, 2)
    check_consistent(lines)
    gen, lines = reformed(gen, f"joined {victim}", 3)
    now = pids_of(lines, gen)
    assert survivors < set(now.values()) and stopped not in now.values()
    check_consistent(lines)
    pids = now

    # 3. A node killed; it returns and joins.
    d = doc()
    r = 2 if member_of(d, 2) != "c0" else 1
    victim = member_of(d, r)
    i = cluster.node_of(victim)
    down["dir"] = cluster.nodes[i].data_dir
    cluster.kill9(i)
    gen, lines = reformed(gen, f"peer-lost {victim}", 2)
    survivors = {p for k, p in pids.items() if k != r}
    assert set(pids_of(lines, gen).values()) == survivors
    check_consistent(lines)
    cluster.restart(i)
    down["dir"] = None
    gen, lines = reformed(gen, f"joined {victim}", 3)
    now = pids_of(lines, gen)
    assert survivors < set(now.values())
    check_consistent(lines)
    pids = now

    # 4. A rank slowed: a straggler, blacklisted; the ring goes on with 2.
    d = doc()
    r = 0
    victim = member_of(d, r)
    (slow_dir / str(pids[r])).write_text("")
    gen, lines = reformed(gen, f"straggler {victim}", 2)
    survivors = {p for k, p in pids.items() if k != r}
    assert set(pids_of(lines, gen).values()) == survivors
    check_consistent(lines)

    # The end: every rank stops at the same step; the job succeeds in its first attempt.
    last = max(s for s, *_ in hashes(lines))
    tmp = stop_file.with_suffix(".tmp")
    tmp.write_text(str(last + 20))
    os.replace(tmp, stop_file)
    deadline = time.monotonic() + WAIT_S
    while (d := doc())["state"] == "running":
        assert time.monotonic() < deadline, d["history"]
        time.sleep(POLL_S)
    lines = cluster.logs(job_id)
    assert d["state"] == "succeeded", (d["history"], d["events"][-5:], lines[-40:])
    assert d["attempt"] == 1
    assert sum(1 for line in lines if line.startswith("finished steps=")) >= 2
    check_consistent(lines)


def test_the_sampler_shares_out_the_rest_of_an_epoch_after_a_reform(monkeypatch):
    """Every sample once per epoch across a re-form from 3 ranks to 2 in mid-epoch, back
    to the commit of the step before the failed one."""
    import ringleader.torch as rlt
    from ringleader.torch import _session

    sess = _session.session()
    seen = []

    def take(world, sampler_of_rank, steps):
        """`steps` steps of every rank at `world`; returns their batches."""
        monkeypatch.setattr(sess, "world", world)
        iters = {}
        for r, s in sampler_of_rank.items():
            monkeypatch.setattr(sess, "rank", r)
            iters[r] = iter(s)
        out = []
        for _ in range(steps):
            for r, it in iters.items():
                monkeypatch.setattr(sess, "rank", r)
                out.extend(next(it, []))
            for s in sampler_of_rank.values():
                s.normalize()
        return out

    samplers = {r: rlt.ElasticSampler(100, batch_size=4, seed=3) for r in range(3)}
    seen += take(3, samplers, 3)           # 36 samples
    commit = samplers[0].state()
    take(3, samplers, 1)                   # a failed step: lost
    for s in samplers.values():
        s.set_state(commit)
    survivors = {0: samplers[0], 1: samplers[1]}
    rest = []
    while survivors[0].epoch == 0:
        got = take(2, survivors, 1)
        if not got:
            break
        rest += got
    seen += rest
    assert len(seen) == len(set(seen)) == 100
