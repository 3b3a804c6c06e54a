"""Checkpoints of a command rank or a command trial, kept in the node's storage.

    state = ringleader.checkpoint.load() or {"epoch": 0}
    for epoch in range(state["epoch"] + 1, 10):
        ...
        ringleader.checkpoint.save({"epoch": epoch, "weights": w})

`save` and `load` go through the rank's own node (`RINGLEADER_CHECKPOINT_URL`, on loopback),
showing the capability the node gave this rank (`RINGLEADER_CHECKPOINT_TOKEN`): it opens
this job's place in the store (`jobs/<job-id>/files/`) or, in a search's trial, the
trial's (`experiments/<search-id>/trials/<trial>/files/`, the same for every run of the
trial: a re-run after a failure finds what the last run saved), and nothing else. The
store's credentials stay with the node; `file://` and `s3://` stores alike. Standard
library only.
"""

import http.client
import os
import pickle
import re
import urllib.parse
from typing import Any

from . import _errors, _native
from .client import _PinnedHTTPSConnection
from .rank import Environ

URL_ENV = _native.CHECKPOINT_URL_ENV
TOKEN_ENV = _native.CHECKPOINT_TOKEN_ENV
TLS_ENV = _native.CHECKPOINT_TLS_SHA256_ENV

# The most bytes one checkpoint may hold (the node's CHECKPOINT_BYTES_MAX, 64 MiB).
CHECKPOINT_BYTES_MAX = 64 << 20
# Seconds a save or load waits for the node.
TIMEOUT_S = 120

_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")

# The first bytes of what save() writes for bytes given as they are (not pickled).
_RAW_MAGIC = b"ringleader-raw\n"


class CheckpointError(_errors.RingleaderError):
    """A checkpoint could not be saved or loaded: outside a rank, a bad name, a checkpoint
    too large, or the node refused or failed (`status` is its HTTP status, or None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _place(environ: Environ | None = None) -> tuple[str, str, str | None]:
    env = os.environ if environ is None else environ
    url, token = env.get(URL_ENV), env.get(TOKEN_ENV)
    if not url or not token:
        raise CheckpointError(
            f"no checkpoint place: {URL_ENV} and {TOKEN_ENV} are set by a ringleader node "
            "for the ranks of a command job or a command trial; run this inside one")
    return url.rstrip("/"), token, env.get(TLS_ENV)


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise CheckpointError(
            f"checkpoint name {name!r}: want 1 to 64 of A-Z a-z 0-9 . _ - (and not . or ..)")


def _call(method: str, name: str, body: bytes | None = None,
          environ: Environ | None = None) -> tuple[int, bytes]:
    _check_name(name)
    url, token, pin = _place(environ)
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        if not pin:
            raise CheckpointError(f"{URL_ENV} is https but {TLS_ENV} is not set")
        conn = _PinnedHTTPSConnection(host, port or 443, pin, TIMEOUT_S)
    else:
        conn = http.client.HTTPConnection(host, port or 80, timeout=TIMEOUT_S)
    headers = {"Authorization": f"Bearer {token}"}
    if body is not None:
        headers["Content-Type"] = "application/octet-stream"
    try:
        conn.request(method, f"{parts.path}/{name}", body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
    except (OSError, http.client.HTTPException) as e:
        raise CheckpointError(f"cannot reach this rank's node at {host}:{port}: {e}") from e
    finally:
        conn.close()
    return resp.status, data


def _reason(status: int, data: bytes) -> str:
    import json
    try:
        return str(json.loads(data).get("error") or status)
    except (ValueError, AttributeError):
        return f"{status}: {data[:200].decode(errors='replace')}"


def save(obj: object, name: str = "state") -> None:
    """Saves `obj` as checkpoint `name` of this job or trial, replacing the last one.

    `bytes` (or a bytearray or memoryview) are stored as they are; anything else pickled
    (the standard `pickle`). At most 64 MiB. The node writes a new object beside the old
    one and renames it into place, so a failed save (a full disk) keeps the last one and
    raises CheckpointError.
    """
    if isinstance(obj, (bytes, bytearray, memoryview)):
        blob = _RAW_MAGIC + bytes(obj)
    else:
        blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(blob) > CHECKPOINT_BYTES_MAX:
        raise CheckpointError(
            f"checkpoint {name!r} is {len(blob)} bytes, over the node's limit of "
            f"{CHECKPOINT_BYTES_MAX} (64 MiB): keep large tensors in your own storage")
    status, data = _call("PUT", name, blob)
    if not 200 <= status < 300:
        raise CheckpointError(f"checkpoint {name!r} not saved: {_reason(status, data)}", status)


def load(name: str = "state") -> Any:
    """The object last saved as checkpoint `name` of this job or trial, or None when there
    is none (a first run). Bytes saved as they are come back as bytes."""
    status, data = _call("GET", name)
    if status == 404:
        return None
    if not 200 <= status < 300:
        raise CheckpointError(f"checkpoint {name!r} not loaded: {_reason(status, data)}", status)
    if data.startswith(_RAW_MAGIC):
        return data[len(_RAW_MAGIC):]
    return pickle.loads(data)
