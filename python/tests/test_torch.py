"""The "ringleader" torch.distributed backend with real processes: every collective against
reference results on 2-4 ranks started as a node starts a command job's ranks (the torchrun
environment), DDP equivalence under torchrun itself, the store-free path from a ring, a
CUDA tensor's error, and a command job of 2 workers on a real node."""

import os
import socket
import subprocess
import sys

import pytest

try:
    import torch
except ImportError:
    pytest.skip("torch not installed", allow_module_level=True)

import ringleader.torch as rlt
import torch.distributed as dist

from conftest import JOB_WAIT_S, PYTHON_DIR

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_worker.py")
# How long one group of rank processes may take (importing torch is most of it), seconds.
GROUP_WAIT_S = 180


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def finish(procs, what):
    """Waits for every process (killing them all past GROUP_WAIT_S); their outputs."""
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=GROUP_WAIT_S)
            outs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
            p.wait()
        pytest.fail(f"{what} did not finish within {GROUP_WAIT_S} s")
    for p, out in zip(procs, outs):
        assert p.returncode == 0, f"{what}: a rank exited {p.returncode}:\n{out}"
    return outs


def rank_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGLEADER_")}
    env.update(PYTHONPATH=PYTHON_DIR, OMP_NUM_THREADS="1", **extra)
    return env


def run_ranks(world, scenario, **extra_env):
    """`world` ranks of torch_worker.py with the environment a node gives a command job."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, scenario], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
            env=rank_env(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                         LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=str(port), **extra_env))
        for r in range(world)
    ]
    return finish(procs, f"{scenario} on {world} ranks")


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_collective_equals_the_reference(world):
    outs = run_ranks(world, "ops")
    assert all(out.rstrip().endswith("ok ops") for out in outs), outs


def test_every_collective_over_tcp_with_a_given_secret():
    outs = run_ranks(3, "ops", RINGLEADER_SHM="0", RINGLEADER_SECRET="s3cret")
    assert all(out.rstrip().endswith("ok ops") for out in outs), outs


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_over_ringleader_equals_one_worker_under_torchrun(world):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
         "--master-addr", "127.0.0.1", "--master-port", str(port), WORKER, "ddp"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=rank_env())
    (out,) = finish([proc], f"torchrun ddp on {world} ranks")
    assert out.count("ok ddp") == world, out
    assert "mlp max |ddp - single|" in out and "cnn max |ddp - single|" in out, out


def test_init_from_ring_needs_no_store():
    """A world of one built from a ring (as from a node's generation line): torch's default
    group runs on it; a second generation replaces it after destroy."""
    for generation in (1, 2):
        line = ('ringleader-generation {"generation":%d,"rank":0,'
                '"addrs":["127.0.0.1:%d"],"secret":"00ff"}' % (generation, free_port()))
        ring = rlt.Ring.from_generation_line(line, group_id=5)
        assert (ring.rank, ring.world, ring.generation) == (0, 1, generation)
        rlt.init_from_ring(ring)
        try:
            t = torch.arange(4, dtype=torch.int64)
            dist.all_reduce(t)
            assert t.tolist() == [0, 1, 2, 3]
            assert dist.get_backend() == "ringleader"
        finally:
            dist.destroy_process_group()


def test_each_generation_builds_its_device_group_from_the_rings_own_store():
    """As on a GPU host, where CUDA tensors go through torch's NCCL group of the generation's
    ranks: 3 ranks, two generations from node lines, a device group (gloo standing in for
    NCCL) built from a store whose port rank 0 broadcasts over the ring."""
    world = 3
    lines = {}
    for g in (1, 2):
        addrs = ",".join(f'"127.0.0.1:{free_port()}"' for _ in range(world))
        lines[g] = [f'ringleader-generation {{"generation":{g},"rank":{r},"addrs":[{addrs}],'
                    f'"secret":"00ff"}}' for r in range(world)]
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, "device-group"], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
            env=rank_env(RL_LINE_1=lines[1][r], RL_LINE_2=lines[2][r]))
        for r in range(world)
    ]
    outs = finish(procs, "device groups over 2 generations")
    assert all(out.rstrip().endswith("ok device-group") for out in outs), outs


def test_a_cuda_tensor_names_the_nccl_way():
    ring = rlt.Ring(0, [f"127.0.0.1:{free_port()}"], "s")
    backend = rlt.RingleaderBackend(ring)
    try:
        meta = torch.empty(4, device="meta")
        with pytest.raises(RuntimeError, match="cpu:ringleader,cuda:nccl"):
            backend.allreduce([meta], dist.AllreduceOptions())
    finally:
        backend.shutdown()


def test_a_command_job_of_two_workers_inits_from_the_nodes_environment(client):
    job = client.submit({
        "name": "py-torch-ddp", "kind": "command", "workers": 2, "max_restarts": 0,
        "command": [sys.executable, WORKER, "job"],
        "env": {"PYTHONPATH": PYTHON_DIR, "OMP_NUM_THREADS": "1"},
    })
    doc = job.wait(timeout=JOB_WAIT_S + GROUP_WAIT_S)
    lines = list(job.logs())
    assert doc["state"] == "succeeded", (doc, lines)
    sums = {line.rank: line.split()[-1] for line in lines if " checksum " in line}
    assert sorted(sums) == [0, 1], lines
    assert sums[0] == sums[1], f"ranks disagree after a DDP step: {sums}"
    assert sum(1 for line in lines if line == "ok job") == 2, lines
