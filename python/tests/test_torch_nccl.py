"""PyTorch's elastic session over a device group that fails as NCCL does (issue 50, points
1-3), on the CPU: `nccl_double`'s `"fakenccl"` backend stands in for NCCL
(`RINGLEADER_CUDA_BACKEND=cpu:fakenccl`).

- The double itself: works complete on enqueue, a gone peer blocks the exchange (never an
  error), `abort()` from another thread unblocks it, destroy waits unless aborted.
- A normal end destroys the group after a barrier over the ring, and aborts it only when
  the barrier fails.
- A generation whose ranks disagree on the device (one given no GPU) agrees on the minimum,
  the ring alone, and builds no store; a rank whose generation fails while it joins waits
  for the next one (`torch_nccl_rank.py join`, this process the other rank).
- A lost peer under the device group: the step blocks (NCCL never raises), the next
  generation aborts the device group, the step is not committed, the rank goes on
  (`torch_nccl_rank.py train`).
- A rank killed in a 3-rank elastic job on real nodes over the double: the survivors keep
  their processes, lose at most one step and finish (`torch_elastic_rank.py`).

Waits poll with deadlines; processes are ended by PID. Without torch: SKIPPED.
"""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

try:
    import torch
except ImportError:
    pytest.skip("torch not installed", allow_module_level=True)

from conftest import PYTHON_DIR  # noqa: E402

import nccl_double  # noqa: E402
from nccl_double import FakeNcclBackend, wait_for  # noqa: E402
from ringleader import _native  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "torch_nccl_rank.py")
# Bound on each wait (a rank imports torch on a busy two-core host).
WAIT_S = 120
# How long a blocked operation is watched for not ending, seconds (it cannot end: its peer
# never comes; a longer watch would only prove the same more slowly).
BLOCKED_WATCH_S = 0.3
SECRET = "ab12"


def pair():
    """Ranks 0 and 1 of one double over one in-memory store."""
    store = torch.distributed.HashStore()
    return FakeNcclBackend(store, 0, 2), FakeNcclBackend(store, 1, 2)


def allreduce(b, t):
    return b.allreduce([t], torch.distributed.AllreduceOptions())


# -- the double ------------------------------------------------------------------------


def test_the_double_completes_on_enqueue_and_exchanges_in_the_background():
    r0, r1 = pair()
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0])
    w0 = allreduce(r0, a)
    # Done for the host at once, though the peer has not issued its half.
    assert w0.wait() is True and w0.get_future().done()
    assert a.tolist() == [1.0, 2.0] and not w0.is_completed()
    w1 = allreduce(r1, b)
    wait_for(lambda: w0.is_completed() and w1.is_completed(), WAIT_S, "the exchange")
    assert a.tolist() == b.tolist() == [11.0, 22.0]
    for r in (r0, r1):
        r.shutdown()


def test_a_gone_peer_blocks_the_double_until_an_abort_from_another_thread():
    r0, _gone = pair()
    t = torch.tensor([1.0])
    w = allreduce(r0, t)
    w.wait()
    time.sleep(BLOCKED_WATCH_S)
    assert r0.in_flight() == 1 and not r0.aborted and r0.error is None
    threading.Thread(target=r0.abort).start()
    wait_for(lambda: r0.in_flight() == 0, WAIT_S, "the abort unblocking the exchange")
    assert r0.aborted and t.tolist() == [1.0] and r0.completed == 0
    # Aborted, later operations are dropped and destroy does not wait.
    allreduce(r0, t)
    r0.shutdown()
    wait_for(lambda: r0.in_flight() == 0, WAIT_S, "the dropped operation")


def test_destroying_the_double_waits_for_work_in_flight_unless_aborted():
    r0, r1 = pair()
    allreduce(r0, torch.tensor([1.0]))
    shut = threading.Thread(target=r0.shutdown, daemon=True)
    shut.start()
    shut.join(BLOCKED_WATCH_S)
    assert shut.is_alive(), "destroy returned with an operation in flight"
    allreduce(r1, torch.tensor([2.0]))
    shut.join(WAIT_S)
    assert not shut.is_alive() and r0.completed == 1
    r1.shutdown()

    r0, _gone = pair()
    allreduce(r0, torch.tensor([1.0]))
    r0.abort()
    shut = threading.Thread(target=r0.shutdown, daemon=True)
    shut.start()
    shut.join(WAIT_S)
    assert not shut.is_alive(), "destroy of an aborted group waited"


def test_the_device_group_is_named_by_one_variable_and_checked():
    from ringleader.torch import _device

    assert _device.configured({}) == _device.DeviceGroup("cuda", "nccl")
    assert _device.configured({"RINGLEADER_CUDA_BACKEND": "none"}) is None
    assert _device.configured({"RINGLEADER_CUDA_BACKEND": "cpu:fakenccl"}) == \
        _device.DeviceGroup("cpu", "fakenccl")
    with pytest.raises(ValueError, match="RINGLEADER_CUDA_BACKEND"):
        _device.configured({"RINGLEADER_CUDA_BACKEND": "cuda:"})
    cpu = _device.DeviceGroup("cpu", "fakenccl")
    assert _device.usable_here(cpu, {"RINGLEADER_GPUS": "1"})
    assert not _device.usable_here(cpu, {"RINGLEADER_GPUS": "0"})
    with pytest.raises(ValueError, match="RINGLEADER_GPUS"):
        _device.usable_here(cpu, {"RINGLEADER_GPUS": "two"})
    env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    _device.survive_communicator_errors(env)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"


def test_a_normal_end_destroys_after_a_barrier_and_aborts_only_when_it_fails(monkeypatch):
    from ringleader.torch import _device

    calls = []
    monkeypatch.setattr(_device, "drop", lambda aborted: calls.append(("drop", aborted)))
    assert _device.end(lambda: calls.append(("barrier",)))
    assert calls == [("barrier",), ("drop", False)]

    calls.clear()

    def gone() -> None:
        calls.append(("barrier",))
        raise RuntimeError("peer 1 lost")

    assert not _device.end(gone)
    assert calls == [("barrier",), ("drop", True)]


# -- ranks fed by this test --------------------------------------------------------------


class Rank:
    """`torch_nccl_rank.py MODE` as rank 0, its generations written to its stdin; its
    stdout lines read on a thread."""

    def __init__(self, mode, gpus, **env):
        self.proc = subprocess.Popen(
            [sys.executable, RANK_SCRIPT, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, bufsize=1,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("RINGLEADER_")},
                 "PYTHONPATH": os.pathsep.join([PYTHON_DIR, HERE]),
                 "RINGLEADER_ELASTIC_PROTOCOL": "ringleader",
                 "RINGLEADER_CUDA_BACKEND": "cpu:fakenccl", "RINGLEADER_GPUS": str(gpus),
                 "OMP_NUM_THREADS": "1", **env})
        self.lines = []
        self._q = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, pattern):
        """The first line from now on matching `pattern` (a regex)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            left = deadline - time.monotonic()
            assert left > 0, (pattern, self.lines[-20:], self.stderr())
            try:
                line = self._q.get(timeout=left)
            except queue.Empty:
                continue
            self.lines.append(line)
            m = re.search(pattern, line)
            if m:
                return m

    def stop(self):
        """Ends its input (a stop) and waits for its exit status."""
        self.proc.stdin.close()
        return self.proc.wait(timeout=WAIT_S)

    def stderr(self):
        if self.proc.poll() is None:
            return "(running)"
        return self.proc.stderr.read()[-3000:]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def generation(g, rank, ports):
    addrs = ",".join(f'"127.0.0.1:{p}"' for p in ports)
    return (f'ringleader-generation {{"generation":{g},"rank":{rank},"addrs":[{addrs}],'
            f'"secret":"{SECRET}"}}')


def free_ports(n):
    import socket
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def peer(line):
    """This test as rank 1 of a generation line."""
    return _native.Ring.from_generation_line(line, 0, op_timeout_ms=WAIT_S * 1000,
                                             connect_timeout_ms=WAIT_S * 1000)


def min_over(ring, value):
    flag = torch.tensor([value], dtype=torch.int64)
    ring.allreduce(flag.data_ptr(), 8, "int64", "min")


@pytest.mark.parametrize("gpus_here,gpus_peer", [(1, 0), (0, 1)])
def test_a_generation_that_disagrees_on_the_device_uses_the_ring_and_builds_no_store(
        gpus_here, gpus_peer):
    rank = Rank("join", gpus_here)
    try:
        ports = free_ports(2)
        rank.send(generation(1, 0, ports))
        ring = peer(generation(1, 1, ports))
        min_over(ring, gpus_peer)
        ring.barrier()
        m = rank.expect(r"^joined generation=1 world=2 backend=(\S+) stores=(\d+) "
                        r"device=(\S+) async_handling=(\S+)")
        assert "fakenccl" not in m.group(1) and m.groups()[1:] == ("0", "None", "2"), rank.lines
        rank.expect("^barrier$")
        ring.close()
        assert rank.stop() == 0, rank.stderr()
    finally:
        rank.kill()


def test_a_rank_whose_generation_fails_while_joining_waits_for_the_next():
    rank = Rank("join", 1)
    try:
        ports = free_ports(2)
        rank.send(generation(1, 0, ports))
        ring = peer(generation(1, 1, ports))
        # Both may build the device group: rank 0 builds its store and broadcasts its port,
        # and this rank is lost instead.
        min_over(ring, 1)
        ring.abort()
        rank.expect(r"^ringleader-elastic failed generation=1 ")
        ring.close()
        rank.send(generation(2, 0, free_ports(1)))
        m = rank.expect(r"^joined generation=(\d+) world=(\d+) backend=(\S+) stores=(\d+)")
        assert m.groups() == ("2", "1", "cpu:fakenccl", "2"), rank.lines
        rank.expect("^barrier$")
        assert rank.stop() == 0, rank.stderr()
    finally:
        rank.kill()


def test_a_lost_peer_aborts_the_device_group_and_its_step_is_never_committed():
    lose_at, stop_at = 3, 8
    rank = Rank("train", 1, LOSE_AT=str(lose_at), STOP_AT=str(stop_at))
    try:
        rank.send(generation(1, 0, free_ports(1)))
        rank.expect(r"^joined generation=1 world=1 backend=cpu:fakenccl stores=1 "
                    r"device=cpu:fakenccl async_handling=2")
        rank.expect("^lost peers$")
        # The next step's collectives block (NCCL's do on a dead peer) until the node's
        # next generation: the session aborts the device group and drops the step.
        rank.send(generation(2, 0, free_ports(1)))
        m = rank.expect(r"^ringleader-elastic resumed generation=2 .*restored_step=(\d+) "
                        r"steps_lost=(\d+)")
        assert int(m.group(1)) == lose_at and int(m.group(2)) <= 1, rank.lines
        m = rank.expect(r"^aborted=(.*)$")
        assert m.group(1) == "[True, False]", rank.lines
        assert rank.proc.wait(timeout=WAIT_S) == 0, rank.stderr()
        steps = [tuple(map(int, x)) for x in
                 (re.findall(r"^hash step=(\d+) gen=(\d+)", line) for line in rank.lines) if x
                 for x in x]
        assert (lose_at + 1, 1) not in steps, "the aborted step was committed"
        assert (stop_at, 2) in steps
    finally:
        rank.kill()


def test_a_compute_section_runs_from_each_forward_to_its_step_not_between_steps():
    """The heartbeat's compute section (what the node times to call a rank hung) opens at
    each DDP forward and closes at `step()`: a data loader, an evaluation's other work or a
    checkpoint's save between steps is no step's compute (it was, so a rank saving a
    checkpoint for 20 steps' time was killed as hung)."""
    rank = Rank("train", 1, LOSE_AT="100", STOP_AT="4")
    try:
        rank.send(generation(1, 0, free_ports(1)))
        for _ in range(3):
            m = rank.expect(r"^clock in_forward=(\S+) between=(\S+)$")
            assert m.groups() == ("True", "None"), rank.lines
        assert rank.proc.wait(timeout=WAIT_S) == 0, rank.stderr()
    finally:
        rank.kill()


def test_a_re_form_keeps_the_schedules_learning_rate():
    """A StepLR given to the optimizer (halving every 2 steps): a step lost to a re-form
    restores the scheduler with the commit, and the lr goes on from the committed step's
    (it was set back to the base lr × world, and the scheduler counted the lost step)."""
    lose_at, stop_at = 3, 8
    rank = Rank("train", 1, LOSE_AT=str(lose_at), STOP_AT=str(stop_at), SCHED="1")
    try:
        rank.send(generation(1, 0, free_ports(1)))
        rank.expect("^lost peers$")
        rank.send(generation(2, 0, free_ports(1)))
        rank.expect(r"^ringleader-elastic resumed generation=2 .*restored_step=3")
        assert rank.proc.wait(timeout=WAIT_S) == 0, rank.stderr()
        for line in list(rank._q.queue):
            rank.lines.append(line)
        seen = [tuple(map(float, m.groups())) for m in
                (re.match(r"^lr step=(\d+) lr=(\S+)$", line) for line in rank.lines) if m]
        assert [s for s, _ in seen][-1] == stop_at, seen
        for step, lr in seen:
            assert lr == pytest.approx(0.05 * 0.5 ** (int(step) // 2)), seen
    finally:
        rank.kill()


def test_a_step_whose_group_torchs_watchdog_aborted_is_never_committed():
    """Under `TORCH_NCCL_ASYNC_ERROR_HANDLING=2` torch's watchdog aborts a communicator whose
    peer failed, and the cut collectives end as if done (their CUDA events complete): the
    fence ended but did not gather every rank's 1, so the step is dropped at once, not
    committed with partial reductions."""
    lose_at, stop_at = 3, 8
    rank = Rank("train", 1, LOSE_AT=str(lose_at), STOP_AT=str(stop_at), WATCHDOG="1")
    try:
        rank.send(generation(1, 0, free_ports(1)))
        rank.expect("^lost peers$")
        # Failed without waiting for the node's next generation nor the fence's deadline.
        m = rank.expect(r"^ringleader-elastic failed generation=1 lost_rank=- (.*)$")
        assert "the device group was aborted" in m.group(1), rank.lines
        assert not any(line.startswith(f"hash step={lose_at + 1} ") for line in rank.lines), \
            "the cut step was committed"
        rank.send(generation(2, 0, free_ports(1)))
        m = rank.expect(r"^ringleader-elastic resumed generation=2 .*restored_step=(\d+)")
        assert int(m.group(1)) == lose_at, rank.lines
        m = rank.expect(r"^aborted=(.*)$")
        assert m.group(1) == "[True, False]", rank.lines
        assert rank.proc.wait(timeout=WAIT_S) == 0, rank.stderr()
    finally:
        rank.kill()


def test_a_rank_whose_failure_names_no_one_exits_when_no_generation_follows():
    """Every rank alike may fail naming no lost rank (here the device group cut under it);
    the node re-forms only when some rank names one. With no newer generation within
    `UNNAMED_FAILURE_WAIT_S` the rank exits 1, so the node ends the attempt, instead of
    waiting forever."""
    rank = Rank("train", 1, LOSE_AT="3", STOP_AT="8", WATCHDOG="1",
                UNNAMED_FAILURE_WAIT_S="1")
    try:
        rank.send(generation(1, 0, free_ports(1)))
        rank.expect(r"^ringleader-elastic failed generation=1 lost_rank=- ")
        assert rank.proc.wait(timeout=WAIT_S) == 1
        assert "no newer generation came within 1 s: exiting" in rank.stderr()
    finally:
        rank.kill()


# -- a job on real nodes ---------------------------------------------------------------


def test_a_rank_killed_in_an_elastic_job_over_the_double_costs_at_most_a_step(tmp_path):
    from test_torch_elastic import POLL_S, RESUMED, Cluster, hashes, pids_of
    from test_torch_elastic import RANK_SCRIPT as ELASTIC_SCRIPT

    # Each node offers one fake GPU, so each rank is given one (RINGLEADER_GPUS=1).
    cluster = Cluster(tmp_path / "cluster", node_env={"RINGLEADER_TEST_GPUS": "T4:15360"})
    try:
        stop_file = tmp_path / "stop-at"
        client = cluster.client()
        job_id = client.submit({
            "name": "torch-nccl", "kind": "command", "workers": 3, "min_workers": 2,
            "max_restarts": 0, "command": [sys.executable, ELASTIC_SCRIPT],
            "resources": {"gpus_per_worker": 1},
            "env": {"PYTHONPATH": PYTHON_DIR, "OMP_NUM_THREADS": "1", "STEP_SLEEP_S": "0.03",
                    "STOP_AT_FILE": str(stop_file),
                    "RINGLEADER_CUDA_BACKEND": "cpu:fakenccl"},
            "elastic": {"protocol": "ringleader", "rejoin_after_s": 2},
        }).id

        def wait(what, cond):
            deadline = time.monotonic() + WAIT_S
            while True:
                d = cluster.client().job(job_id).doc
                lines = cluster.logs(job_id)
                if cond(d, lines):
                    return d, lines
                assert d["state"] in ("pending", "running"), (what, d["state"], lines[-40:])
                assert time.monotonic() < deadline, (what, d["history"], lines[-40:])
                time.sleep(POLL_S)

        def stepping(gen, world):
            def cond(d, lines):
                counts = {}
                for _, g, r, w, _, _ in hashes(lines):
                    if g == gen and w == world:
                        counts[r] = counts.get(r, 0) + 1
                return len(counts) == world and min(counts.values()) >= 5
            return wait(f"generation {gen} stepping on {world}", cond)

        def reformed(after, reason, world):
            d, _ = wait(f"a re-form {reason!r}", lambda d, _: any(
                h["generation"] > after and h["reason"].startswith(reason)
                and len(h["ring"]) == world for h in d["history"]))
            g = max(h["generation"] for h in d["history"] if h["reason"].startswith(reason))
            return g, stepping(g, world)[1]

        def consistent(lines):
            digests = {}
            for s, g, r, _, _, h in hashes(lines):
                digests.setdefault((g, s), set()).add(h)
            assert all(len(v) == 1 for v in digests.values()), "ranks differ"
            lost = [int(m.group(2)) for m in map(RESUMED.match, lines) if m]
            assert lost and max(lost) <= 1, f"steps lost per re-form: {lost}"

        d, lines = stepping(1, 3)
        groups = [line for line in lines if line.startswith("device_group=")]
        assert len(groups) == 3 and all(g.startswith("device_group=cpu:fakenccl ")
                                        for g in groups), groups
        pids = pids_of(lines, 1)
        victim = d["ring"][2]
        os.kill(pids[2], signal.SIGKILL)
        gen, lines = reformed(1, f"peer-lost {victim} (rank 2)", 2)
        assert set(pids_of(lines, gen).values()) == {pids[0], pids[1]}
        consistent(lines)
        gen, lines = reformed(gen, f"joined {victim}", 3)
        assert {pids[0], pids[1]} < set(pids_of(lines, gen).values())
        consistent(lines)

        last = max(s for s, *_ in hashes(lines))
        tmp = stop_file.with_suffix(".tmp")
        tmp.write_text(str(last + 10))
        os.replace(tmp, stop_file)
        d, lines = wait("the end", lambda d, _: d["state"] != "running")
        assert d["state"] == "succeeded" and d["attempt"] == 1, (d["history"], lines[-40:])
        consistent(lines)
    finally:
        cluster.stop()
