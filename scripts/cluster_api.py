"""A ringleader cluster's HTTP API from python3's standard library, for the scripts that drive
local clusters (bench-search.sh, test-garage.sh import it from their embedded helpers)."""

import json
import os
import time
import urllib.request


def token():
    """The API token: RINGLEADER_TOKEN, else the file RINGLEADER_TOKEN_FILE names, else None."""
    if os.environ.get("RINGLEADER_TOKEN"):
        return os.environ["RINGLEADER_TOKEN"]
    path = os.environ.get("RINGLEADER_TOKEN_FILE")
    if path and os.path.exists(path):
        return open(path).read().strip()
    return None


def get(api, path):
    """GET http://API/PATH as JSON (10 s timeout), with the API token when there is one."""
    headers = {"Authorization": f"Bearer {token()}"} if token() else {}
    req = urllib.request.Request(f"http://{api}{path}", headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def formed(n, deadline_s, apis, fail):
    """Waits until every node in APIS sees N members alive and a chief; calls FAIL with the
    last view after DEADLINE_S seconds."""
    deadline, last = time.time() + deadline_s, ""
    while True:
        ok = True
        for api in apis:
            try:
                s = get(api, "/v1/status")
                alive = [m["name"] for m in s["members"] if m["state"] == "alive"]
                if len(alive) != n or not s.get("chief"):
                    ok, last = False, f"{api}: alive={alive} chief={s.get('chief')}"
            except Exception as e:
                ok, last = False, f"{api}: {e}"
        if ok:
            return
        if time.time() > deadline:
            fail(f"cluster not formed within {deadline_s} s: {last}")
        time.sleep(0.2)


def procs_under(tmp):
    """(pid, command line) of the live processes whose command line names a path under TMP
    (a script's nodes and their workers)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\0")
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(a.startswith(tmp + "/") for a in args):
            out.append((int(pid), " ".join(args)[:200]))
    return out
