"""`ringleader.elastic` (no torch): the generation feed over a stream, the protocol lines it
prints (each parses back on the node's parser), and `Ring.agree`, the protocol crate's
agreement run over a ring of threads."""

import io
import queue
import threading

from ringleader import _native, elastic

from test_torch_ring import group, on_ranks


def gen_line(g, rank=0, world=1):
    addrs = ",".join(f'"127.0.0.1:{20000 + i}"' for i in range(world))
    return ('ringleader-generation {"generation":%d,"rank":%d,"addrs":[%s],"secret":"ab"}'
            % (g, rank, addrs))


def test_the_feed_hands_out_the_newest_generation_and_a_stop_is_final():
    arrived = threading.Semaphore(0)
    lines = queue.Queue()

    def stream():
        # Lines as the test releases them (a node writing to the rank's stdin).
        while (line := lines.get()) is not None:
            yield line + "\n"

    for line in [gen_line(1), "not a node line", gen_line(3, 1, 2), gen_line(2)]:
        lines.put(line)
    feed = elastic.GenerationFeed(stream(), on_arrival=arrived.release)
    # No stop yet: a generation is handed out (the newest read so far; an older one read
    # after a newer one never replaces it).
    g = feed.next(0, timeout=10)
    assert g is not None and g.generation in (1, 3)
    for line in ["ringleader-stop", gen_line(9), None]:
        lines.put(line)
    # Every line read: the stop is final, and nothing after it counts.
    assert feed.next(100, timeout=10) is None
    assert feed.stopped
    g = feed.pending(0)
    assert (g.generation, g.rank, g.world) == (3, 1, 2)
    assert feed.pending(3) is None
    assert feed.next(3, timeout=1) is None
    assert arrived.acquire(timeout=1)


def test_the_end_of_input_is_a_stop():
    feed = elastic.GenerationFeed(io.StringIO(""))
    assert feed.next(0, timeout=10) is None and feed.stopped


def test_the_lines_parse_back_on_the_nodes_parser(capsys):
    elastic.failed(2, 1, 'peer "lost" \\ rank 1')
    elastic.failed(2, None, "connect")
    elastic.resumed(3, 2, 1, 17, 15, 2, "broadcast")
    elastic.ComputeClock().beat_now(5200)
    stats = elastic.StepStats()
    stats.add(0.0125, 0.00025, 3, 1, 20)
    stats.add(0.5, 0.5, 3, 1, 21)  # within the second: not printed
    elastic.ready()
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        'ringleader-elastic failed generation=2 lost_rank=1 error="peer \\"lost\\" \\\\ rank 1"',
        'ringleader-elastic failed generation=2 lost_rank=- error="connect"',
        "ringleader-elastic resumed generation=3 world=2 rank=1 step=17 restored_step=15 "
        "steps_lost=2 source=broadcast",
        "ringleader-heartbeat computing_ms=5200",
        "ringleader-rank-stats generation=3 rank=1 step=20 compute_ms=12.500 wait_ms=0.250",
        "ringleader-ready",
    ]
    for line in lines:
        assert _native.parse_rank_line(line) == line


def test_a_standby_is_an_elastic_rank_started_with_the_standby_variable():
    elastic_env = {elastic.PROTOCOL_ENV: "ringleader"}
    assert not elastic.is_standby(elastic_env)
    assert elastic.is_standby({**elastic_env, elastic.STANDBY_ENV: "1"})
    assert not elastic.is_standby({elastic.STANDBY_ENV: "1"}), "not without the protocol"


def test_ring_agree_runs_the_protocols_agreement():
    """Holdings as the protocol crate's own test: the newest common commit of the holders of
    the newest generation, broadcast by its lowest holder to the joiner."""
    rings = group(3)
    holdings = [(2, 12, [4, 8, 12]), (2, 8, [4, 8]), (None, 0, [])]
    got = on_ranks(3, lambda r: rings[r].agree(*holdings[r]))
    assert got == [("restore", 8, 0, False, 12, True), ("restore", 8, 0, False, 12, True),
                   ("restore", 8, 0, False, 12, False)]
    fresh = on_ranks(3, lambda r: rings[r].agree(None, 5 * r, []))
    assert fresh == [("fresh", 10)] * 3
    # A rank that missed a generation is no holder, whatever it holds.
    stale = on_ranks(3, lambda r: rings[r].agree(*[(1, 20, [20]), (2, 4, [4]), (2, 4, [4])][r]))
    assert stale == [("restore", 4, 1, False, 20, False), ("restore", 4, 1, False, 20, True),
                     ("restore", 4, 1, False, 20, True)]
    for ring in rings:
        ring.close()
