"""The rendezvous through torch's store: every rank publishes its data-plane address, then
the ranks connect directly (see the package doc for the secret and the environment)."""

import os
import secrets
import socket
from typing import Any

from .. import _native

# Store keys, under the store prefix torch gives each process group.
ADDR_KEY = "ringleader/addr/{rank}"
SECRET_KEY = "ringleader/secret"
GROUP_KEY = "ringleader/group"

# The environment: the data-plane host to bind, the shared secret, shared memory on or off.
DATA_HOST_ENV = "RINGLEADER_DATA_HOST"
SECRET_ENV = _native.SECRET_ENV
SHM_ENV = "RINGLEADER_SHM"
THREADS_ENV = "RINGLEADER_RING_THREADS"
# The ring's runtime threads beside the operation's own (measured: see ring_threads()).
RING_THREADS_DEFAULT = 2

# Longest wait for the whole group to connect once every address is published, ms.
CONNECT_TIMEOUT_MS_MAX = 60_000
# Port assumed for MASTER_ADDR when finding the local address that reaches it (no packet is
# sent: a UDP socket is only connected, to read the route's source address).
ROUTE_PROBE_PORT = 29500


def data_host() -> str:
    """The local address peers reach this rank at: RINGLEADER_DATA_HOST, else the source
    address of the route to MASTER_ADDR, else 127.0.0.1."""
    given = os.environ.get(DATA_HOST_ENV)
    if given:
        return given
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            port = int(os.environ.get("MASTER_PORT") or ROUTE_PROBE_PORT)
            family, _, _, _, addr = socket.getaddrinfo(master, port, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(addr)
                host: str = s.getsockname()[0]
                return host
        except (OSError, ValueError):
            pass
    return "127.0.0.1"


def shared_memory_allowed() -> bool:
    """False when RINGLEADER_SHM is 0/false/no/off."""
    return os.environ.get(SHM_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def ring_threads() -> int:
    """The ring runtime's worker threads: RINGLEADER_RING_THREADS, else 2 (0: none)."""
    return int(os.environ.get(THREADS_ENV) or RING_THREADS_DEFAULT)


def _text(v: object) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def connect(store: Any, rank: int, world: int, timeout_ms: int) -> _native.Ring:
    """Binds, publishes, reads everyone's address from `store` and connects: a `Ring`."""
    host = data_host()
    listener = _native.Listener(f"[{host}]:0" if ":" in host else f"{host}:0")
    try:
        store.set(ADDR_KEY.format(rank=rank), listener.address)
        secret = os.environ.get(SECRET_ENV)
        if rank == 0:
            # A fresh group id per group: groups that share a secret (new_group, a second
            # init) cannot take each other's connections.
            store.set(GROUP_KEY, str(secrets.randbits(63)))
            if not secret:
                store.set(SECRET_KEY, secrets.token_hex(32))
        group_id = int(_text(store.get(GROUP_KEY)))
        if not secret:
            secret = _text(store.get(SECRET_KEY))
        addrs = [_text(store.get(ADDR_KEY.format(rank=r))) for r in range(world)]
        return listener.connect(
            rank, addrs, secret, 0, group_id,
            op_timeout_ms=timeout_ms,
            connect_timeout_ms=min(timeout_ms, CONNECT_TIMEOUT_MS_MAX),
            shared_memory=shared_memory_allowed(), threads=ring_threads(),
        )
    finally:
        listener.close()
