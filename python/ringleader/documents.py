"""The node's documents that the package returns as typed values: a search's trials and its
best (`Search.trials()`, `Search.best`), a dataset fetch's status (`Client.get_dataset`),
and which trial this process is (`ringleader.trial()`).

Each is a frozen dataclass whose fields are typed, and still the `dict` it was before (the
document as the node sent it, docs/book/src/guide/python.md): `doc["params"]`, `doc.get("rung")`,
`json.dumps(doc)` and `doc == {...}` hold as they did. The fields are read when the value is
made; a key the node adds later shows in the dict before it has a field. They print as the
dicts they are.
"""

from dataclasses import InitVar, dataclass
from typing import Any

from ._errors import Doc


@dataclass(frozen=True, eq=False, repr=False)
class Document(dict[str, Any]):
    """A document with typed fields; the dict is `raw`, the JSON as the node sent it."""

    raw: InitVar[Doc]

    def __post_init__(self, raw: Doc) -> None:
        dict.update(self, raw)


@dataclass(frozen=True, eq=False, repr=False)
class Trial(Document):
    """One trial of a search, as `ringleader job ID --json` shows it."""

    id: int
    job: str
    """The job that runs it (`Client.job(trial.job).logs()`)."""
    owner: str
    """The user it belongs to: its search's owner (`admin` from nodes older than owners)."""
    params: dict[str, Any]
    state: str
    """`pending`, `running`, `paused` (at a rung), `succeeded`, `stopped` or `failed`."""
    metric: float | None
    """The metric at the largest resource reported, if any."""
    resource: int
    """Resource trained (epochs)."""
    promotions: int
    bracket: int
    """Hyperband bracket (0 for the other algorithms)."""
    node: str
    """The member that ran it last."""
    note: str
    """Why it stopped or failed ("" when it did neither)."""

    @classmethod
    def of(cls, doc: Doc) -> "Trial":
        return cls(raw=doc, id=doc["id"], job=doc["job"], owner=doc.get("owner", "admin"),
                   params=doc["params"],
                   state=doc["state"], metric=doc.get("metric"), resource=doc["resource"],
                   promotions=doc["promotions"], bracket=doc.get("bracket", 0),
                   node=doc["node"], note=doc.get("note", ""))


@dataclass(frozen=True, eq=False, repr=False)
class BestTrial(Document):
    """A search's best trial so far: `{id, params, metric}`."""

    id: int
    params: dict[str, Any]
    metric: float

    @classmethod
    def of(cls, doc: Doc) -> "BestTrial":
        return cls(raw=doc, id=doc["id"], params=doc["params"], metric=doc["metric"])


@dataclass(frozen=True, eq=False, repr=False)
class TrialContext(Document):
    """Which trial this process is (`ringleader.trial()`), from the node's environment."""

    search: str | None
    """The search's job id."""
    trial: int
    """Its number in the search."""
    is_copy: bool
    """True in a speculative copy (the key `copy`)."""
    job: str | None
    """This trial's own job id."""
    rung: int | None
    """The resource (e.g. epochs) this run must reach; None when the node gave none."""
    resumable: bool
    """True when this run ends at `rung` and a promotion resumes it in a new run."""

    @classmethod
    def of(cls, search: str | None, trial: int, copy: bool, job: str | None,
           rung: int | None, resumable: bool) -> "TrialContext":
        raw = {"search": search, "trial": trial, "copy": copy, "job": job, "rung": rung,
               "resumable": resumable}
        return cls(raw=raw, search=search, trial=trial, is_copy=copy, job=job, rung=rung,
                   resumable=resumable)


@dataclass(frozen=True, eq=False, repr=False)
class DatasetFetch(Document):
    """A dataset fetch's status, as `ringleader dataset get --json` shows it (its holders
    in `["sources"]`)."""

    name: str
    root: str
    """The manifest's BLAKE3 hash: the dataset's content name."""
    state: str
    """`fetching`, `done` or `failed`."""
    error: str | None
    """Why it failed."""
    chunks: int
    chunks_done: int
    size_bytes: int
    bytes: int
    """Bytes fetched by this run (verified chunks)."""
    mb_per_s: float
    path: str | None
    """Where the files are on the node once done."""

    @classmethod
    def of(cls, doc: Doc) -> "DatasetFetch":
        return cls(raw=doc, name=doc["name"], root=str(doc["root"]), state=doc["state"],
                   error=doc.get("error"), chunks=doc["chunks"],
                   chunks_done=doc["chunks_done"], size_bytes=doc["size_bytes"],
                   bytes=doc["bytes"], mb_per_s=doc["mb_per_s"], path=doc.get("path"))
