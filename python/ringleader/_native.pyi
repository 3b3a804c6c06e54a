"""Types of `ringleader._native`, the extension built from `python/src` (pyo3): the rank
protocol's line formatters (`src/lib.rs`) and the data plane's `Ring` (`src/ring.rs`).
Checked against the built module by `python -m mypy.stubtest ringleader._native`."""

from typing import Final, Literal, TypeAlias, final

from ._base import RingFailure

__all__ = [
    "Aborted", "HandshakeRefused", "Listener", "PeerLost", "Ring", "RingError", "RingTimeout",
    "metric_line", "report_line", "rank_stats_line", "heartbeat_line", "ready_line",
    "elastic_failed_line", "elastic_resumed_line", "parse_rank_line", "VERSION",
    "PROTOCOL_VERSION", "GOLDEN_LINES", "PROTOCOL_VERSION_ENV", "JOB_ID_ENV", "ATTEMPT_ENV",
    "GENERATION_ENV", "SEARCH_ID_ENV", "TRIAL_ID_ENV", "TRIAL_COPY_ENV", "TRIAL_RESOURCE_ENV",
    "TRIAL_RESUMABLE_ENV", "PARAMS_ENV", "PARAM_PREFIX_ENV", "ELASTIC_PROTOCOL_ENV",
    "STANDBY_ENV", "DATASET_DIR_ENV", "SECRET_ENV", "STORAGE_ENV", "GPUS_ENV",
    "CHECKPOINT_URL_ENV", "CHECKPOINT_TOKEN_ENV", "CHECKPOINT_TLS_SHA256_ENV", "NO_SHM_ENV",
]

VERSION: Final[str]
PROTOCOL_VERSION: Final[int]
GOLDEN_LINES: Final[str]
# The rank environment's names (the protocol crate's `env`): `JOB_ID_ENV == "RINGLEADER_JOB_ID"`.
PROTOCOL_VERSION_ENV: Final[str]
JOB_ID_ENV: Final[str]
ATTEMPT_ENV: Final[str]
GENERATION_ENV: Final[str]
SEARCH_ID_ENV: Final[str]
TRIAL_ID_ENV: Final[str]
TRIAL_COPY_ENV: Final[str]
TRIAL_RESOURCE_ENV: Final[str]
TRIAL_RESUMABLE_ENV: Final[str]
PARAMS_ENV: Final[str]
PARAM_PREFIX_ENV: Final[str]
ELASTIC_PROTOCOL_ENV: Final[str]
STANDBY_ENV: Final[str]
DATASET_DIR_ENV: Final[str]
SECRET_ENV: Final[str]
STORAGE_ENV: Final[str]
GPUS_ENV: Final[str]
CHECKPOINT_URL_ENV: Final[str]
CHECKPOINT_TOKEN_ENV: Final[str]
CHECKPOINT_TLS_SHA256_ENV: Final[str]
NO_SHM_ENV: Final[str]

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
