"""Types of `ringleader._native`, the extension built from `python/src` (pyo3): the rank
protocol's line formatters (`src/lib.rs`) and the data plane's `Ring` (`src/ring.rs`).
Checked against the built module by `python -m mypy.stubtest ringleader._native`."""

from typing import Final, Literal, TypeAlias, final

from ._base import RingFailure

__all__ = [
    "Aborted", "HandshakeRefused", "Listener", "PeerLost", "Ring", "RingError", "RingTimeout",
    "metric_line", "report_line", "rank_stats_line", "heartbeat_line", "ready_line",
    "elastic_failed_line", "elastic_resumed_line", "parse_rank_line", "VERSION",
    "PROTOCOL_VERSION", "PROTOCOL_VERSION_ENV", "GOLDEN_LINES",
]

VERSION: Final[str]
PROTOCOL_VERSION: Final[int]
PROTOCOL_VERSION_ENV: Final[str]
GOLDEN_LINES: Final[str]

# Rank lines, without the newline; ValueError when the line would not read back as given.
def metric_line(name: str, value: float, step: int | None = None) -> str: ...
def report_line(resource: int, values: list[tuple[str, float]]) -> str: ...
def rank_stats_line(
    generation: int, rank: int, step: int, compute_ms: float, wait_ms: float
) -> str: ...
def heartbeat_line(computing_ms: int) -> str: ...
def ready_line() -> str: ...
def elastic_failed_line(generation: int, lost_rank: int | None, error: str) -> str: ...
def elastic_resumed_line(
    generation: int,
    world: int,
    rank: int,
    step: int,
    restored_step: int,
    steps_lost: int,
    source: str,
) -> str: ...
def parse_rank_line(line: str) -> str: ...

class RingError(RingFailure):
    """A collective operation or the ring's connection failed; `reason` names why (a
    `RingleaderError` and a `RuntimeError`, through `ringleader._base.RingFailure`)."""

    reason: str
    rank: int | None

class PeerLost(RingError): ...
class Aborted(RingError): ...
class RingTimeout(RingError): ...
class HandshakeRefused(RingError): ...

# What `Ring.agree` returns: ("fresh", group_step) or
# ("restore", step, root, everyone_holds, group_step, holds).
_Agreement: TypeAlias = (
    tuple[Literal["fresh"], int] | tuple[Literal["restore"], int, int, bool, int, bool]
)

# The defaults written `...` are the collective's (op 60 s, connect 10 s).
@final
class Listener:
    def __new__(cls, address: str = "127.0.0.1:0") -> Listener: ...
    @property
    def address(self) -> str: ...
    def connect(
        self,
        rank: int,
        addrs: list[str],
        secret: str | bytes,
        generation: int = 0,
        group_id: int = 0,
        *,
        op_timeout_ms: int = ...,
        connect_timeout_ms: int = ...,
        shared_memory: bool = True,
        threads: int = 1,
    ) -> Ring: ...
    def close(self) -> None: ...

@final
class Ring:
    @property
    def rank(self) -> int: ...
    @property
    def world(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def group_id(self) -> int: ...
    @property
    def shared_memory_links(self) -> int: ...
    @property
    def network_links(self) -> int: ...
    @property
    def failed(self) -> bool: ...
    def __new__(
        cls,
        rank: int,
        addrs: list[str],
        secret: str | bytes,
        generation: int = 0,
        group_id: int = 0,
        *,
        op_timeout_ms: int = ...,
        connect_timeout_ms: int = ...,
        shared_memory: bool = True,
        threads: int = 1,
    ) -> Ring: ...
    @staticmethod
    def from_generation_line(
        line: str,
        group_id: int = 0,
        *,
        op_timeout_ms: int = ...,
        connect_timeout_ms: int = ...,
        shared_memory: bool = True,
        threads: int = 1,
    ) -> Ring: ...
    def segment(self, n: int, rank: int) -> tuple[int, int]: ...
    def allreduce(self, addr: int, nbytes: int, dtype: str, op: str) -> None: ...
    def reduce_scatter(self, addr: int, nbytes: int, dtype: str, op: str) -> None: ...
    def allgather(self, addr: int, nbytes: int) -> None: ...
    def broadcast(self, addr: int, nbytes: int, root: int) -> None: ...
    def agree(
        self, last_generation: int | None, step_reached: int, commits: list[int]
    ) -> _Agreement: ...
    def barrier(self) -> None: ...
    def abort(self) -> None: ...
    def close(self) -> None: ...
