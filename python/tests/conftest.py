"""Fixtures: a real node (the workspace's debug binary, or RINGLEADER_TEST_BINARY) started
on 127.0.0.1 with ports the OS picks and a data directory of its own, stopped by its pid.

The package is imported from python/ (scripts/test.sh puts the extension it built there as
ringleader/_native.abi3.so); ranks the node starts import it through PYTHONPATH too.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(PYTHON_DIR)
sys.path.insert(0, PYTHON_DIR)

import ringleader  # noqa: E402

# How long a node has to write node.json and elect itself chief, seconds.
NODE_START_S = 30
# How long a test waits for a job, seconds.
JOB_WAIT_S = 60


def binary():
    path = os.environ.get("RINGLEADER_TEST_BINARY") or os.path.join(
        ROOT, "target", "debug", "ringleader")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no node binary at {path}: build it (cargo build -p ringleader) or set "
                    "RINGLEADER_TEST_BINARY")
    return path


class Node:
    """One `ringleader node` process; `client()` talks to its API with its admin token."""

    def __init__(self, data_dir, name="py1", extra=(), cpus=8, env=None):
        self.data_dir = str(data_dir)
        self.https = "--api-tls" in extra
        os.makedirs(self.data_dir, exist_ok=True)
        self.log = open(os.path.join(self.data_dir, "node.log"), "ab")
        self.proc = subprocess.Popen(
            [binary(), "node", "--name", name, "--listen", "127.0.0.1:0", "--api",
             "127.0.0.1:0", "--data", "127.0.0.1:0", "--datasets", "127.0.0.1:0",
             "--data-dir", self.data_dir, "--cpus", str(cpus), *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("RINGLEADER_")},
                 **(env or {})},
        )
        deadline = time.monotonic() + NODE_START_S
        info_path = os.path.join(self.data_dir, "node.json")
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited at start ({self.proc.returncode}): "
                                   f"{self.tail()}")
            try:
                with open(info_path) as f:
                    info = json.load(f)
                if info["pid"] == self.proc.pid:
                    break
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"node did not start within {NODE_START_S} s: {self.tail()}")
            time.sleep(0.05)
        self.api = info["api_addr"]
        self.token_file = os.path.join(self.data_dir, "api.token")
        while True:
            try:
                if self.client().status().get("chief"):
                    break
            except ringleader.RingleaderError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"node has no chief after {NODE_START_S} s: {self.tail()}")
            time.sleep(0.05)

    def client(self, **kw):
        """A client with the admin token (and, for a TLS API, the pin) of its api.token."""
        token = kw.pop("token", None)
        with open(self.token_file) as f:
            lines = f.read().split()
        if token is None:
            token = lines[0]
        if self.https:
            return ringleader.Client("https://" + self.api, token, tls_sha256=lines[-1], **kw)
        return ringleader.Client(self.api, token, **kw)

    def tail(self, n=10):
        with open(os.path.join(self.data_dir, "node.log"), errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def node(tmp_path_factory):
    n = Node(tmp_path_factory.mktemp("node") / "data")
    yield n
    n.stop()


@pytest.fixture()
def client(node):
    return node.client()


@pytest.fixture()
def rank_env():
    """The [env] a command job needs to import the package from this checkout."""
    return {"PYTHONPATH": PYTHON_DIR}
