"""ringleader from Python: drive a cluster, and speak the rank protocol inside a job.

In a notebook (the node's HTTP API, docs/book/src/guide/python.md):

    import ringleader
    c = ringleader.Client()                      # RINGLEADER_PEER / RINGLEADER_TOKEN
    job = c.submit("examples/jobs/hello-command.toml")
    job.wait()

Inside a rank or a search's trial (what the node started):

    p = ringleader.params()                      # {"lr": 0.01, …}
    start = ringleader.checkpoint.load() or 0    # what this job or trial saved last
    for epoch in range(start + 1, 10):
        ringleader.report(epoch, val_accuracy=train_one_epoch(p["lr"]))
        ringleader.checkpoint.save(epoch)

The standard library only; the protocol's lines come from the Rust protocol crate through
the extension `ringleader._native`. A function runs as a search's trials with
`Client.launch(fn, params)` (cloudpickle). Typed (`py.typed`, `mypy --strict` in
scripts/test.sh); every failure it reports is a `RingleaderError` (python/README.md *Types*).
"""

from . import _native, checkpoint
from ._errors import (
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    JobCancelled,
    JobFailed,
    NotFound,
    RingleaderError,
    SpecError,
    Stopped,
    Unauthorized,
    Unavailable,
    Unreachable,
    WaitTimeout,
)
from ._launch import PickleTooLarge
from .checkpoint import CheckpointError
from .client import Client, Job, LogLine, Search
from .documents import BestTrial, DatasetFetch, Trial, TrialContext
from .distributions import choice, loguniform, randint, search_params, uniform
from .rank import dataset_dir, metric, params, report, stopped, trial

__version__ = _native.VERSION
PROTOCOL_VERSION = _native.PROTOCOL_VERSION

__all__ = [
    "ApiError", "BadRequest", "BestTrial", "CheckpointError", "Client", "Conflict",
    "DatasetFetch", "Forbidden", "Job", "JobCancelled", "JobFailed", "LogLine", "NotFound",
    "PickleTooLarge", "RingleaderError", "Search", "SpecError", "Stopped", "Trial",
    "TrialContext", "Unauthorized", "Unavailable", "Unreachable", "WaitTimeout", "checkpoint",
    "choice", "dataset_dir", "loguniform", "metric", "params", "randint", "report",
    "search_params", "stopped", "trial", "uniform",
]
