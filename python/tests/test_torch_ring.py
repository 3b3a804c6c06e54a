"""`ringleader._native.Ring`, the data plane under the torch backend, without torch: ranks
as threads of this process (each call releases the GIL), buffers from ctypes. Results, the
byte-level transfers, the typed errors (handshake refused, aborted, peer lost, a refused
mean of integers), a ring from a node's generation line, and closing."""

import ctypes
import socket
import threading

import pytest

from ringleader import _native

# How long a test waits for its rank threads, seconds.
THREADS_WAIT_S = 30


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def on_ranks(world, body):
    """Runs `body(rank)` on `world` threads at once; their results, or the first error."""
    results, errors = [None] * world, []

    def run(r):
        try:
            results[r] = body(r)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=THREADS_WAIT_S)
    assert not any(t.is_alive() for t in threads), "a rank thread hung"
    if errors:
        raise errors[0]
    return results


def group(world, secret="secret", secrets=None, **kw):
    """`world` connected rings through listeners bound first (a store's rendezvous)."""
    listeners = [_native.Listener() for _ in range(world)]
    addrs = [l.address for l in listeners]
    try:
        return on_ranks(world, lambda r: listeners[r].connect(
            r, addrs, secrets[r] if secrets else secret, 1, 9, **kw))
    finally:
        for l in listeners:
            l.close()


def buf(ctype, values):
    b = (ctype * len(values))(*values)
    return b, ctypes.addressof(b), ctypes.sizeof(b)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("shared_memory", [True, False])
def test_every_operation(world, shared_memory):
    rings = group(world, shared_memory=shared_memory)
    links = world - 1 if world > 2 else 1
    assert all((r.shared_memory_links > 0) == shared_memory for r in rings)
    assert all(r.shared_memory_links + r.network_links <= links for r in rings)
    n = 40_000  # several 512 KiB frames as int64, one recursive-doubling message as 5

    def body(r):
        ring = rings[r]
        out = {}
        for dtype, ctype in (("float32", ctypes.c_float), ("float64", ctypes.c_double),
                             ("int32", ctypes.c_int32), ("int64", ctypes.c_int64),
                             ("uint8", ctypes.c_uint8)):
            for length in (5, n):
                b, addr, size = buf(ctype, [(i * 3 + r) % 7 for i in range(length)])
                ring.allreduce(addr, size, dtype, "sum")
                out[dtype, length, "sum"] = list(b)
                b, addr, size = buf(ctype, [(i + r) % 5 for i in range(length)])
                ring.allreduce(addr, size, dtype, "max")
                out[dtype, length, "max"] = list(b)
        # Reduce-scatter: this rank owns segment(n, r) of the sum.
        b, addr, size = buf(ctypes.c_int64, [i * (r + 1) for i in range(n)])
        ring.reduce_scatter(addr, size, "int64", "sum")
        start, end = ring.segment(n, r)
        out["rs"] = (start, end, list(b)[start:end])
        # Allgather of bytes: world equal parts.
        part = 333
        b, addr, size = buf(ctypes.c_uint8, [0] * (world * part))
        ctypes.memset(addr + r * part, r + 1, part)
        ring.allgather(addr, size)
        out["ag"] = bytes(b)
        # Broadcast of odd bytes from the last rank.
        b, addr, size = buf(ctypes.c_uint8, [(i * 11) % 256 if r == world - 1 else 0
                                             for i in range(1001)])
        ring.broadcast(addr, size, world - 1)
        out["bc"] = bytes(b)
        ring.barrier()
        ring.close()
        return out

    outs = on_ranks(world, body)
    for dtype in ("float32", "float64", "int32", "int64", "uint8"):
        for length in (5, n):
            want = [sum((i * 3 + r) % 7 for r in range(world)) for i in range(length)]
            assert all(o[dtype, length, "sum"] == want for o in outs), (dtype, length)
            want = [max((i + r) % 5 for r in range(world)) for i in range(length)]
            assert all(o[dtype, length, "max"] == want for o in outs), (dtype, length)
    for o in outs:
        start, end, got = o["rs"]
        assert got == [i * sum(range(1, world + 1)) for i in range(start, end)]
        assert o["ag"] == b"".join(bytes([q + 1]) * 333 for q in range(world))
        assert o["bc"] == bytes((i * 11) % 256 for i in range(1001))


def test_a_wrong_secret_is_refused_by_the_handshake():
    with pytest.raises(_native.RingError) as e:
        group(2, secrets=["one", "two"], connect_timeout_ms=3000)
    assert e.value.reason in ("handshake", "connect"), (e.value.reason, e.value)
    assert isinstance(e.value, (_native.HandshakeRefused, _native.RingError))


def test_the_mean_of_integers_is_refused_and_the_ring_goes_on():
    rings = group(2)

    def body(r):
        b, addr, size = buf(ctypes.c_int64, [r + 1] * 10)
        with pytest.raises(ValueError, match="Avg"):
            rings[r].allreduce(addr, size, "int64", "avg")
        rings[r].allreduce(addr, size, "int64", "sum")
        return list(b)

    assert on_ranks(2, body) == [[3] * 10] * 2


def test_bad_arguments_raise_value_error():
    (ring,) = group(1)
    b, addr, size = buf(ctypes.c_float, [1.0] * 4)
    with pytest.raises(ValueError, match="dtype"):
        ring.allreduce(addr, size, "complex64", "sum")
    with pytest.raises(ValueError, match="op"):
        ring.allreduce(addr, size, "float32", "product")
    with pytest.raises(ValueError, match="aligned"):
        ring.allreduce(addr + 1, size - 4, "float32", "sum")
    with pytest.raises(ValueError, match="rank"):
        ring.segment(10, 1)


def test_abort_fails_this_rank_and_its_peer():
    rings = group(2)
    started = threading.Event()

    def body(r):
        if r == 0:
            started.wait(timeout=THREADS_WAIT_S)
            rings[0].abort()
            with pytest.raises(_native.Aborted) as e:
                rings[0].barrier()
            return e.value.reason
        # Rank 1 waits inside a barrier rank 0 never joins, until the abort arrives.
        started.set()
        with pytest.raises(_native.Aborted) as e:
            rings[1].barrier()
        return (e.value.reason, e.value.rank)

    assert on_ranks(2, body) == ["aborted", ("peer_aborted", 0)]
    assert rings[0].failed and rings[1].failed


def test_a_closed_peer_is_lost():
    rings = group(3, shared_memory=False)
    rings[2].close()

    def body(r):
        with pytest.raises(_native.RingError) as e:
            rings[r].barrier()
        return type(e.value), e.value.rank

    got = on_ranks(2, body)
    # Each survivor learns of rank 2's loss, directly or relayed by the other.
    assert all(issubclass(t, (_native.PeerLost, _native.Aborted)) for t, _ in got), got
    assert any(t is _native.PeerLost and rank == 2 for t, rank in got), got


def test_a_ring_from_a_generation_line_and_closing():
    port = free_port()
    line = ('ringleader-generation {"generation":4,"rank":0,"addrs":["127.0.0.1:%d"],'
            '"secret":"ab12"}' % port)
    ring = _native.Ring.from_generation_line(line, group_id=1)
    assert (ring.rank, ring.world, ring.generation, ring.group_id) == (0, 1, 4, 1)
    assert "Ring(rank=0, world=1, generation=4" in repr(ring)
    ring.barrier()
    ring.close()
    ring.close()
    with pytest.raises(_native.RingError, match="closed"):
        ring.barrier()
    with pytest.raises(ValueError):
        _native.Ring.from_generation_line("ringleader-stop")
    with pytest.raises(ValueError):
        _native.Ring.from_generation_line('ringleader-generation {"generation":1}')
