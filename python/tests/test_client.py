"""Every client call against a real node: jobs, logs, metrics, cancel, a search of command
trials that use the package inside them, datasets, and bad input."""

import os
import subprocess
import textwrap
import time

import pytest

import ringleader

from conftest import JOB_WAIT_S, binary


def command_job(name, command, **extra):
    return {"name": name, "kind": "command", "max_restarts": 0, "command": command, **extra}


def test_status(client, node):
    s = client.status()
    assert s["chief"] is not None
    assert [m["state"] for m in s["members"]] == ["alive"]


def test_submit_a_dict_wait_logs_metrics_and_jobs(client):
    job = client.submit(command_job("py-hello", [
        "sh", "-c", "echo hello from $RANK; echo ringleader-metric answer 42 1"]))
    assert isinstance(job, ringleader.Job) and job.id.startswith("j-")
    doc = job.wait(timeout=JOB_WAIT_S)
    assert doc["state"] == "succeeded" and job.state == "succeeded"
    lines = list(job.logs())
    assert "hello from 0" in lines, lines
    assert all(isinstance(line, str) and line.rank == 0 for line in lines)
    assert job.metrics()["answer"] == [(1, 42.0)]
    assert job.id in [j["id"] for j in client.jobs()]
    again = client.job(job.id)
    assert again.id == job.id and again.doc["name"] == "py-hello"


def test_submit_text_and_a_path(client, tmp_path):
    text = 'name = "py-text"\nkind = "command"\ncommand = ["true"]\n'
    assert client.submit(text).wait(timeout=JOB_WAIT_S)["state"] == "succeeded"
    path = tmp_path / "job.toml"
    path.write_text(text.replace("py-text", "py-path"))
    for spec in (path, str(path)):
        job = client.submit(spec)
        assert job.doc["name"] == "py-path"
        job.wait(timeout=JOB_WAIT_S)


def test_a_retried_submit_with_the_same_token_is_one_job(client):
    spec = command_job("py-once", ["true"])
    first = client.submit(spec, idempotency_token="py-once-1")
    again = client.submit(spec, idempotency_token="py-once-1")
    assert first.id == again.id
    assert client.submit(spec).id != first.id


def test_a_failed_job_raises_job_failed_with_the_reason(client):
    job = client.submit(command_job("py-fails", ["sh", "-c", "echo oops >&2; exit 3"]))
    with pytest.raises(ringleader.JobFailed) as e:
        job.wait(timeout=JOB_WAIT_S)
    assert e.value.job_id == job.id and e.value.doc["state"] == "failed"
    assert "3" in e.value.reason, e.value.reason
    assert any("oops" in line for line in job.logs())
    # The cause: the exit status and the last stderr line, in the message too.
    assert e.value.cause.endswith("exit 3: oops"), e.value.cause
    assert e.value.stderr_tail == ["oops"]
    assert "exit 3: oops" in str(e.value), str(e.value)
    assert e.value.doc["failure"]["exit_code"] == 3


def test_the_logs_of_a_retried_job_hold_every_run_marked_by_run(client, node):
    job = client.submit(command_job(
        "py-retried", ["sh", "-c", "echo attempt $RINGLEADER_ATTEMPT; "
                       "[ $RINGLEADER_ATTEMPT -ge 2 ]"], max_restarts=1))
    job.wait(timeout=JOB_WAIT_S)
    lines = list(job.logs())
    assert lines == ["attempt 1", "attempt 2"], lines
    assert [line.run for line in lines] == [1, 2]
    assert lines[0].generation < lines[1].generation
    # The CLI prints the same, each run under its header.
    out = subprocess.run([binary(), "--peer", node.api, "--token-file", node.token_file,
                          "logs", job.id], capture_output=True, text=True, timeout=30,
                         env={k: v for k, v in os.environ.items()
                              if not k.startswith("RINGLEADER_")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"== run 1 (generation {lines[0].generation})", "[rank 0] attempt 1",
        f"== run 2 (generation {lines[1].generation})", "[rank 0] attempt 2"], out.stdout


def test_a_token_of_more_than_one_line_is_refused_saying_what_to_use(monkeypatch):
    # `RINGLEADER_TOKEN=$(cat api.token)` of a keyed node: the token, then its TLS pin.
    text = "ab" * 32 + "\ntls sha256:" + "0" * 64
    monkeypatch.setenv("RINGLEADER_TOKEN", text)
    with pytest.raises(ValueError) as e:
        ringleader.Client("127.0.0.1:9")
    assert "RINGLEADER_TOKEN holds more than one line" in str(e.value)
    assert "RINGLEADER_TOKEN_FILE" in str(e.value) and "head -n1" in str(e.value)
    with pytest.raises(ValueError, match="more than one line"):
        ringleader.Client("127.0.0.1:9", token=text)
    with pytest.raises(ValueError, match="control characters"):
        ringleader.Client("127.0.0.1:9", token="ab\x1bcd")
    # One line, with the newline a shell or a file leaves after it: the token.
    monkeypatch.setenv("RINGLEADER_TOKEN", "tok\n")
    assert ringleader.Client("127.0.0.1:9").token == "tok"


def test_a_token_file_rewritten_by_a_key_rotation_is_read_again(monkeypatch, tmp_path):
    # A node whose admin token changed (`ringleader key rotate` rewrote its api.token): it
    # answers 401 to the old token; a client that read the file reads it again, once.
    import http.server
    import threading

    class Node(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.headers.get("Authorization") == "Bearer new"
            body = b'{"ok": true}' if ok else b'{"error": "wrong API token", "reason": "wrong"}'
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Node)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        token_file = tmp_path / "api.token"
        token_file.write_text("old\n")
        monkeypatch.delenv("RINGLEADER_TOKEN", raising=False)
        monkeypatch.setenv("RINGLEADER_TOKEN_FILE", str(token_file))
        peer = f"127.0.0.1:{server.server_port}"
        c = ringleader.Client(peer)
        with pytest.raises(ringleader.ApiError) as e:
            c.request("GET", "/v1/status")
        assert e.value.status == 401, "the file holds the old token still"
        token_file.write_text("new\n")
        assert c.request("GET", "/v1/status") == {"ok": True}
        assert c.token == "new"
        # A token given directly is never replaced.
        with pytest.raises(ringleader.ApiError):
            ringleader.Client(peer, token="old").request("GET", "/v1/status")
    finally:
        server.shutdown()


def test_follow_logs_until_the_end_then_cancel(client):
    job = client.submit(command_job("py-follow", [
        "sh", "-c", "for i in 1 2 3; do echo line $i; sleep 0.2; done"]))
    lines = list(job.logs(follow=True))
    assert lines == ["line 1", "line 2", "line 3"]
    assert job.refresh().state == "succeeded"

    long = client.submit(command_job("py-cancel", ["sleep", "60"]))
    long.cancel()
    assert long.state == "cancelled"
    with pytest.raises(ringleader.JobCancelled):
        long.wait(timeout=JOB_WAIT_S)
    with pytest.raises(ringleader.BadRequest):
        long.cancel()


def test_unknown_job_and_wrong_token(client, node):
    with pytest.raises(ringleader.NotFound) as e:
        client.job("j-zzzz")
    assert "no job" in e.value.reason and e.value.status == 404
    with pytest.raises(ringleader.BadRequest):
        client.job("not-a-job")
    with pytest.raises(ringleader.Unauthorized) as e:
        node.client(token="wrong").status()
    assert "refused" in e.value.reason
    with pytest.raises(ringleader.Unauthorized) as e:
        ringleader.Client(node.api, "").status()
    assert "wants an API token" in e.value.reason


def test_users_own_their_jobs_and_a_viewer_only_reads(client, node):
    alice = client.create_token("py-alice", role="user")
    assert (alice["user"], alice["role"]) == ("py-alice", "user")
    viewer = client.create_token("py-dash", user="lab", role="viewer")
    rows = {t["name"]: t for t in client.tokens()}
    assert (rows["py-dash"]["user"], rows["py-dash"]["role"]) == ("lab", "viewer")
    as_alice = node.client(token=alice["token"])
    job = as_alice.submit(command_job("py-owned", ["sleep", "30"]))
    assert job.refresh().owner == "py-alice"
    with pytest.raises(ringleader.Forbidden) as e:
        node.client(token=viewer["token"]).job(job.id).cancel()
    assert "lab has role viewer" in e.value.reason
    assert node.client(token=viewer["token"]).job(job.id).owner == "py-alice"
    job.cancel()
    assert job.state == "cancelled"
    assert client.job(job.id).owner == "py-alice"
    client.revoke_token("py-alice")
    client.revoke_token("py-dash")
    assert "py-alice" not in {t["name"] for t in client.tokens()}


def test_a_bad_spec_names_its_field_and_line(client):
    with pytest.raises(ringleader.SpecError) as e:
        client.submit(command_job("py-bad", ["true"], workers=0))
    assert e.value.field == "workers" and isinstance(e.value.line, int), vars(e.value)
    assert "workers" in e.value.reason
    with pytest.raises(ringleader.SpecError) as e:
        client.submit('name = "x"\nkind = "command"\nwokers = 2\ncommand = ["true"]\n')
    assert e.value.line == 3 and "did you mean" in e.value.reason, vars(e.value)


TRIAL = textwrap.dedent("""
    import json, ringleader
    p, t = ringleader.params(), ringleader.trial()
    print("trial", json.dumps(t), "params", json.dumps(p), flush=True)
    for epoch in (1, 2):
        ringleader.report(epoch, score=p["x"] * epoch, other=1.5)
""")


def test_a_search_of_trials_that_use_the_package(client, rank_env):
    search = client.submit({
        "name": "py-grid", "kind": "search", "command": ["python3", "-c", TRIAL],
        "env": rank_env,
        "search": {"trial": "command", "algorithm": "grid", "metric": "score",
                   "direction": "max", "max_parallel": 3, "params": {"x": [1, 2, 3]}},
    })
    assert isinstance(search, ringleader.Search)
    doc = search.wait(timeout=JOB_WAIT_S)
    trials = search.trials()
    assert trials == doc["trials"]
    assert sorted(t["state"] for t in trials) == ["succeeded"] * 3, trials
    assert {t["params"]["x"] for t in trials} == {1, 2, 3}
    best = search.best
    assert best["params"] == {"x": 3} and best["metric"] == 6.0, best
    # Inside the best trial: its params typed, its place in the search, its reports.
    trial_job = client.job(next(t["job"] for t in trials if t["id"] == best["id"]))
    lines = list(trial_job.logs())
    head = next(line for line in lines if line.startswith("trial "))
    assert f'"search": "{search.id}"' in head, head
    assert head.endswith('params {"x": 3}'), head
    assert "ringleader-report 2 score 6 other 1.5" in lines, lines
    assert trial_job.metrics()["score"][-1][1] == 6.0


def test_datasets_add_ls_get(client, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("alpha\n")
    (src / "b.bin").write_bytes(os.urandom(1000))
    doc = client.add_dataset("py-ds", src)
    assert doc["name"] == "py-ds" and doc["files"] == 2
    assert "py-ds" in [d["name"] for d in client.datasets()]
    with pytest.raises(ringleader.Conflict):
        client.add_dataset("py-ds", src)
    to = tmp_path / "out"
    status = client.get_dataset("py-ds", to=to, timeout=JOB_WAIT_S)
    assert status["state"] == "done", status
    assert isinstance(status, ringleader.DatasetFetch) and status.state == "done"
    assert status.path == status["path"] and status.chunks == status["chunks"] > 0, status
    found = sorted(str(p.relative_to(to)) for p in to.rglob("*") if p.is_file())
    assert found == ["a.txt", "b.bin"], found
    assert (to / "a.txt").read_text() == "alpha\n"
    with pytest.raises(ringleader.NotFound):
        client.get_dataset("py-none")


def test_a_quota_holds_a_job_with_its_reason_in_the_queue(client):
    # The admin's quota is no cpu and no borrowing: a job waits, saying why.
    client.set_quota("admin", cpus=0, borrow_cpus=0)
    try:
        job = client.submit(command_job("py-held", ["true"], priority="high"))
        deadline = time.monotonic() + JOB_WAIT_S
        while job.refresh().pending_reason is None:
            assert time.monotonic() < deadline, job.doc
            time.sleep(0.1)
        assert job.state == "pending"
        assert job.pending_reason == "waiting for 1 cpu: admin's quota 0/0 cpus in use"
        [row] = [r for r in client.queue() if r["id"] == job.id]
        assert row["owner"] == "admin" and row["priority_label"] == "high"
        assert row["pending_reason"] == job.pending_reason
        [quota] = [q for q in client.quotas() if q["user"] == "admin"]
        assert quota["quota"] == {"cpus": 0, "borrow_cpus": 0}
        job.cancel()
    finally:
        # Back to room for every later test.
        client.set_quota("admin", cpus=1_000_000, borrow_cpus=1_000_000)


def test_job_failed_carries_the_cause_and_the_stderr_tail_of_its_document():
    doc = {"state": "failed", "failure": {
        "cause": "rank 0 on m1: exit 1: ModuleNotFoundError: No module named 'foo'",
        "attempt": 2, "rank": 0, "member": "m1", "exit_code": 1,
        "stderr_tail": ["Traceback (most recent call last):",
                        "ModuleNotFoundError: No module named 'foo'"]}}
    e = ringleader.JobFailed("j-1", "not retried: the same failure twice", doc)
    assert e.cause == doc["failure"]["cause"]
    assert e.stderr_tail == doc["failure"]["stderr_tail"]
    assert str(e).startswith("job j-1 failed: rank 0 on m1: exit 1: ModuleNotFoundError")
    assert "    Traceback (most recent call last):" in str(e)
    # A document without a failure (an older node): the reason is the cause.
    bare = ringleader.JobFailed("j-2", "all 1 restarts used", {"state": "failed"})
    assert (bare.cause, bare.stderr_tail) == ("all 1 restarts used", [])
