"""The sharing benchmark's helper (scripts/bench-sharing.sh): the seeded trace, the driver
that submits it and plays the admin of `fifo-with-cancel`, and the figures, computed from
the nodes' own records (each job's document and metric history). Standard library only.

    python3 scripts/bench_sharing.py trace SEED SCALE                  # the trace, as JSON
    python3 scripts/bench_sharing.py calibrate API TOKEN OUT           # steps per second, as JSON
    python3 scripts/bench_sharing.py drive TRACE TOKENS POLICY OUT API BENCH_DIR DEADLINE_S CALIBRATION
    python3 scripts/bench_sharing.py figures RECORD                    # the `sharing …` line
    python3 scripts/bench_sharing.py timeline RECORD                   # free slots a waiting job fit

The figures' definitions are in bench-sharing.sh's header; each function below says which
it computes. scripts/bench_sharing_test.py checks them on a fabricated record.
"""

import json
import math
import os
import random
import sys
import time
import urllib.error
import urllib.request

# ---- the trace ----

#: The cluster the trace is written for: 4 nodes offering 3 cpus each.
NODES = 4
CPUS_PER_NODE = 3
#: Each user's quota (cpus) and fair-share weight: the entitlement of the `jain` figure.
USERS = {"alice": {"cpus": 6, "weight": 2}, "bob": {"cpus": 3, "weight": 1},
         "carol": {"cpus": 3, "weight": 1}}
#: Arrivals are spread over this many seconds (× SCALE).
ARRIVALS_S = 300.0
#: A search trial's length, seconds (× SCALE).
TRIAL_S = 30.0
#: A rigid command job's step (a sleep) and how often it checkpoints, seconds.
STEP_S = 0.5
CHECKPOINT_EVERY_S = 5.0
#: The admin of fifo-with-cancel acts for a high job that has waited this long, seconds.
CANCEL_AFTER_S = 10.0
#: A train job (and a trial) checkpoints about this often, seconds (its steps from the
#: calibration; a train job also commits in memory every 10 steps).
TRAIN_CHECKPOINT_EVERY_S = 2.0
#: The calibration measures a job's step rate over this many seconds of its steps.
CALIBRATE_WINDOW_S = 8.0

# The rigid command job (BENCH_DIR/job.py, on every node: they share this host): counts steps of STEP_S (a sleep), saves its step every
# CHECKPOINT_EVERY_S to BENCH_DIR/NAME.periodic and at SIGTERM (a preemption's stop) to
# NAME.stop, and on every start resumes from the newest of them (BENCH_RESUME=periodic: the
# periodic one only, a job resubmitted after an admin's cancel). Rank 0 keeps NAME.reached,
# the step it last finished, and reports on each start `lost_steps`: the steps done before
# that its resume point does not hold (work thrown away). Metrics go to its node's record.
JOB_PY = r'''
import os, signal, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))  # first: a stop may come at once
d, name = os.environ["BENCH_DIR"], os.environ["BENCH_NAME"]
steps, step_s = int(os.environ["BENCH_STEPS"]), float(os.environ["BENCH_STEP_S"])
every_s = float(os.environ["BENCH_CHECKPOINT_S"])
rank0 = os.environ.get("RANK", "0") == "0"
def read(suffix):
    try:
        return int(open(os.path.join(d, name + suffix)).read())
    except (OSError, ValueError):
        return 0
def write(suffix, n):
    p = os.path.join(d, name + suffix)
    open(p + ".tmp", "w").write(str(n))
    os.replace(p + ".tmp", p)
resumed = read(".periodic")
if os.environ.get("BENCH_RESUME") != "periodic":
    resumed = max(resumed, read(".stop"))
if rank0:
    print(f"ringleader-metric lost_steps {max(0, read('.reached') - resumed)}", flush=True)
step, saved_at = resumed, time.monotonic()
while step < steps and not stop:
    time.sleep(step_s)
    if stop:
        break
    step += 1
    if rank0:
        write(".reached", step)
        print(f"ringleader-metric step {step} {step}", flush=True)
        if time.monotonic() - saved_at >= every_s:
            write(".periodic", step)
            saved_at = time.monotonic()
if rank0 and stop:
    write(".stop", step)
    print(f"checkpointed {step}", flush=True)
'''


def trace(seed, scale):
    """The trace: a list of jobs, by arrival, each {name, user, kind, at_s, priority,
    workers, …}. Seeded: the same seed and scale give the same trace."""
    rng = random.Random(seed)
    jobs = []

    def at():
        return round(rng.uniform(0, ARRIVALS_S * 0.9) * scale, 1)

    # Elastic train jobs of the digits MLP (low priority, as the rigid jobs: background
    # experiments; a high job then takes from them by the least lost work, shrinks first,
    # so the benchmark measures shrinks): 4 workers, down to 2, sized in seconds at full
    # size on this binary and host (their steps: `spec`, from the calibration), so the
    # trace fills the cluster alike with a debug or a release build.
    for i, user in enumerate(["alice", "alice", "alice", "bob", "bob", "carol"]):
        jobs.append({"name": f"train-{i}", "user": user, "kind": "train", "at_s": at(),
                     "priority": "low", "workers": 4, "min_workers": 2,
                     "seconds": round(rng.choice([60, 80, 100]) * scale, 1)})
    # Rigid command jobs that checkpoint (low priority): 1 to 3 ranks, 30 to 80 s.
    for i, user in enumerate(["bob", "bob", "bob", "bob", "carol", "carol", "carol", "carol",
                              "alice", "alice"]):
        jobs.append({"name": f"rigid-{i}", "user": user, "kind": "command", "at_s": at(),
                     "priority": "low", "workers": rng.choice([1, 2, 3]),
                     "steps": max(4, int(rng.uniform(60, 160) * scale))})
    # A search of 4 one-worker train trials, 2 at a time (low priority), each about
    # TRIAL_S long (its epochs from the calibration).
    jobs.append({"name": "search-0", "user": "carol", "kind": "search", "at_s": at(),
                 "priority": "low", "workers": 1, "trials": 4, "max_parallel": 2,
                 "seconds": round(TRIAL_S * scale, 1), "seed": seed})
    # Two high-priority jobs arriving while the cluster is full, each within its owner's
    # quota (bob's 3 ranks, alice's 4): a job beyond its quota borrows, and a borrower takes
    # no one's work within their quota (design.md, Preemption), so it would wait by rule.
    for i, (user, frac) in enumerate([("bob", 0.5), ("alice", 0.75)]):
        jobs.append({"name": f"high-{i}", "user": user, "kind": "command",
                     "at_s": round(ARRIVALS_S * frac * scale, 1), "priority": "high",
                     "workers": min(4, USERS[user]["cpus"]), "steps": max(4, int(80 * scale))})
    jobs.sort(key=lambda j: (j["at_s"], j["name"]))
    return jobs


def train_spec(name, workers, train, checkpoint):
    """A train job of the trace's model (the digits MLP) as the API's JSON."""
    return {"name": name, "kind": "train", "workers": workers,
            "model": {"arch": "mlp", "hidden": [64]}, "data": {"dataset": "digits"},
            "train": {"batch_per_worker": 32, "lr": 0.05, **train}, "checkpoint": checkpoint}


def sized(job, cal):
    """A train job's or a search's size in steps (epochs for a search's trials) for its
    `seconds`, at the calibration CAL's step rates, and its checkpoint interval in steps."""
    if job["kind"] == "train":
        rate = cal["steps_per_s"]
        return {"max_steps": max(10, round(job["seconds"] * rate)),
                "every_steps": max(50, round(TRAIN_CHECKPOINT_EVERY_S * rate))}
    rate = cal["trial_steps_per_s"]
    return {"epochs": max(1, round(job["seconds"] * rate / cal["trial_steps_per_epoch"])),
            "every_steps": max(50, round(TRAIN_CHECKPOINT_EVERY_S * rate))}


def spec(job, bench_dir, cal, resume=None):
    """The job's spec as the API's JSON (see README *Job specs*); a train job and a search
    sized by the calibration CAL (`calibrate`)."""
    name = job["name"] + ("-cont" if resume else "")
    base = {"name": name, "priority": job["priority"]}
    if job["kind"] == "train":
        size = sized(job, cal)
        return {**base, **train_spec(name, job["workers"],
                                     {"epochs": 100000, "max_steps": size["max_steps"]},
                                     {"every_steps": size["every_steps"], "keep": 1,
                                      "commit_every_steps": 10}),
                "min_workers": job["min_workers"], "max_workers": job["workers"]}
    if job["kind"] == "search":
        size = sized(job, cal)
        return {**base, **train_spec(name, 1, {"epochs": size["epochs"]},
                                     {"every_steps": size["every_steps"]}),
                "kind": "search",
                "search": {"algorithm": "random", "trials": job["trials"],
                           "max_parallel": job["max_parallel"], "metric": "val_accuracy",
                           "direction": "max", "seed": job["seed"],
                           "params": [{"name": "train.lr", "type": "double", "min": 0.01,
                                       "max": 0.2, "scale": "log"}]}}
    env = {"BENCH_DIR": bench_dir, "BENCH_NAME": job["name"], "BENCH_STEPS": str(job["steps"]),
           "BENCH_STEP_S": str(STEP_S), "BENCH_CHECKPOINT_S": str(CHECKPOINT_EVERY_S)}
    if resume:
        env["BENCH_RESUME"] = resume
    return {**base, "kind": "command", "workers": job["workers"],
            "command": ["python3", os.path.join(bench_dir, "job.py")],
            "env": env, "preemption": {"grace_s": 10}}


# ---- the driver ----

def call(api, path, token, body=None):
    """GET (or POST BODY as JSON) API/PATH with TOKEN: the answer as JSON."""
    headers = {"Authorization": f"Bearer {token}"}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    req = urllib.request.Request(f"http://{api}{path}", data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def note(msg):
    print(f"# {msg}", file=sys.stderr, flush=True)


ENDED = ("succeeded", "failed", "cancelled")


def step_rate(api, token, body, window_s=CALIBRATE_WINDOW_S, deadline_s=180.0):
    """Submits BODY (a train job without a step bound), watches its `step` and `epoch`
    every 0.2 s until its step has moved for WINDOW_S seconds, cancels it and waits for its
    end: (steps per second between the first and the last step change seen, steps per
    epoch: its step over its finished epochs, None before an epoch ended)."""
    jid = call(api, "/v1/jobs", token, body)["id"]
    seen, t0 = [], time.time()
    try:
        while True:
            d = call(api, f"/v1/jobs/{jid}", token)
            if d["state"] in ENDED:
                raise RuntimeError(f"calibration job {jid} ended ({d['state']}) before "
                                   f"its step rate was measured")
            now, step = time.time(), d.get("step") or 0
            if step and (not seen or step != seen[-1][1]):
                seen.append((now, step, d.get("epoch") or 0))
            if seen and seen[-1][0] - seen[0][0] >= window_s:
                break
            if now - t0 > deadline_s:
                raise RuntimeError(f"calibration job {jid} did not step for {window_s} s "
                                   f"within {deadline_s} s")
            time.sleep(0.2)
    finally:
        call(api, f"/v1/jobs/{jid}/cancel", token, {})
        while call(api, f"/v1/jobs/{jid}", token)["state"] not in ENDED:
            time.sleep(0.2)
    (ta, sa, _), (tb, sb, epoch) = seen[0], seen[-1]
    return (sb - sa) / (tb - ta), (sb / epoch if epoch else None)


def calibrate(api, token):
    """The step rates of the trace's train model on this binary and host, each job alone on
    the fresh cluster: `steps_per_s` of a train job at its full size (4 workers), and
    `trial_steps_per_s` and `trial_steps_per_epoch` of a one-worker trial (its evaluation
    after every epoch included). The trace's `seconds` become steps with them (`sized`)."""
    unbounded = {"epochs": 1000000}
    rate4, _ = step_rate(api, token, train_spec(
        "calibrate-train", 4, unbounded, {"every_steps": 1000000}))
    rate1, per_epoch = step_rate(api, token, train_spec(
        "calibrate-trial", 1, unbounded, {"every_steps": 1000000}))
    if per_epoch is None:
        raise RuntimeError("calibration: the one-worker job finished no epoch")
    return {"steps_per_s": rate4, "trial_steps_per_s": rate1,
            "trial_steps_per_epoch": per_epoch}


def drive(trace_jobs, tokens, policy, out, api, bench_dir, deadline_s, cal):
    """Submits each job at its time as its user; under fifo plays the admin (below); waits
    until every job has ended; writes every job's document and metric history to OUT.

    fifo-with-cancel: a high job pending for CANCEL_AFTER_S is given room by cancelling the
    youngest running low-priority rigid jobs of the trace until its ranks are free at that
    moment (again CANCEL_AFTER_S later if work queued ahead of it took them); each cancelled
    job is resubmitted as NAME-cont, resuming from its last periodic checkpoint. Train
    jobs and the search are sized by the calibration CAL (`sized`)."""
    admin = tokens["admin"]
    with open(os.path.join(bench_dir, "job.py"), "w") as f:
        f.write(JOB_PY)
    t0 = time.time()
    todo = list(trace_jobs)
    ids = {}          # job id -> trace name
    by_name = {j["name"]: j for j in trace_jobs}
    logical = {j["name"]: [] for j in trace_jobs}
    cancels, acted, timeline = [], {}, []
    capacity = NODES * CPUS_PER_NODE

    def submit(job, resume=None):
        doc = call(api, "/v1/jobs", tokens[job["user"]], spec(job, bench_dir, cal, resume))
        ids[doc["id"]] = job["name"]
        logical[job["name"]].append(doc["id"])
        note(f"{time.time() - t0:6.1f} s submitted {job['name']}{' (resumed)' if resume else ''}"
             f" as {doc['id']} by {job['user']}")

    while True:
        now = time.time() - t0
        while todo and todo[0]["at_s"] <= now:
            submit(todo.pop(0))
        summaries = call(api, "/v1/jobs?limit=10000", admin)
        live = [s for s in summaries if s["state"] not in ENDED]
        if not todo and not live and all(logical.values()):
            break
        if now > deadline_s:
            note(f"warning: {len(live)} jobs not ended after {deadline_s} s: "
                 f"{[(s['id'], s['name'], s['state']) for s in live][:8]}")
            break
        docs = {s["id"]: call(api, f"/v1/jobs/{s['id']}", admin) for s in live}
        # The timeline, one sample a second: every live job's ranks and every waiting
        # job's reason, so a run's idle slots can be read afterwards (`timeline`).
        queue = call(api, "/v1/queue", admin)["jobs"]
        timeline.append({"at_ms": int(time.time() * 1000),
                         "held": {i: len(d.get("ring") or []) for i, d in docs.items()
                                  if d["state"] == "running"},
                         "queue": [{"id": q["id"], "workers": q["workers"],
                                    "reason": q.get("pending_reason"),
                                    "trials": q.get("trials")} for q in queue]})
        if policy == "fifo":
            used = sum(len(d["ring"]) for d in docs.values() if d["state"] == "running")
            for jid, d in docs.items():
                job = by_name.get(ids.get(jid, ""))
                if not job or job["priority"] != "high" or d["state"] != "pending":
                    continue
                waited = time.time() * 1000 - d["submitted_at_ms"]
                if waited < CANCEL_AFTER_S * 1000 or time.time() - acted.get(jid, 0) < CANCEL_AFTER_S:
                    continue
                acted[jid] = time.time()
                need = job["workers"] - (capacity - used)
                victims = sorted(
                    (v for v in docs.values()
                     if v["state"] == "running" and v["id"] in ids
                     and by_name[ids[v["id"]]]["priority"] == "low"
                     and by_name[ids[v["id"]]]["kind"] == "command"),
                    key=lambda v: v["started_at_ms"] or 0, reverse=True)
                for v in victims:
                    if need <= 0:
                        break
                    call(api, f"/v1/jobs/{v['id']}/cancel", admin, {})
                    cancels.append({"job": v["id"], "for": jid, "at_ms": int(time.time() * 1000)})
                    need -= len(v["ring"])
                    used -= len(v["ring"])
                    v["state"] = "cancelling"
                    note(f"{now:6.1f} s fifo-with-cancel: cancelled {v['id']} "
                         f"({ids[v['id']]}) for {jid} ({job['name']})")
            for c in cancels:
                if c.get("resubmitted"):
                    continue
                d = docs.get(c["job"]) or call(api, f"/v1/jobs/{c['job']}", admin)
                if d["state"] in ENDED:
                    c["resubmitted"] = True
                    submit(by_name[ids[c["job"]]], resume="periodic")
        time.sleep(1.0)

    # The records: every job of the trace (its resubmissions and the search's trials
    # included; not the calibration's).
    record = {"policy": policy, "capacity": capacity, "users": USERS, "step_s": STEP_S,
              "trace": trace_jobs, "logical": logical, "cancels": cancels, "calibration": cal,
              "collected_at_ms": int(time.time() * 1000), "jobs": {}, "metrics": {},
              "timeline": timeline}
    for s in call(api, "/v1/jobs?limit=10000", admin):
        d = call(api, f"/v1/jobs/{s['id']}", admin)
        if s["id"] not in ids and (d.get("trial_of") or {}).get("search") not in ids:
            continue
        record["jobs"][s["id"]] = d
        record["metrics"][s["id"]] = call(api, f"/v1/jobs/{s['id']}/metrics", admin)["metrics"]
    json.dump(record, open(out, "w"))


# ---- the figures ----

def intervals(doc, end_ms):
    """A job's life from its events: (held, pending, ended_ms). held: [(t0, t1, ranks)]
    while ranks of it were placed (a requeue holds them until its ranks are out);
    pending: [(t0, t1)] while it waited (from its submit, and from a requeue or a failed
    attempt to its next placement); ended_ms: its end (END_MS if it has not ended)."""
    held, pending = [], []
    ranks, since, waiting = 0, None, doc["submitted_at_ms"]
    ended = None

    def close(at):
        nonlocal ranks, since
        if ranks and since is not None and at > since:
            held.append((since, at, ranks))
        since = at

    for e in doc["events"]:
        at, what, reason = e["at_ms"], e["what"], e.get("reason", "")
        if what == "placed":
            if waiting is not None:
                pending.append((waiting, at))
                waiting = None
            close(at)
            ranks = len(e.get("ring", []))
        elif what == "reformed":
            close(at)
            ranks = len(e.get("ring", []))
        elif what == "preempted" and (reason.endswith(" requeued") or reason.endswith(" trial paused")):
            close(at)
            ranks, waiting = 0, at
        elif what == "attempt_failed":
            close(at)
            ranks, waiting = 0, at
        elif what in ENDED:
            close(at)
            ranks = 0
            if waiting is not None:
                pending.append((waiting, at))
                waiting = None
            ended = at
    if ended is None:
        close(end_ms)
        if waiting is not None:
            pending.append((waiting, end_ms))
        ended = end_ms
    return held, pending, ended


def pct(xs, p):
    """The nearest-rank percentile P (0..1) of XS; None when empty."""
    xs = sorted(xs)
    return xs[max(0, math.ceil(p * len(xs)) - 1)] if xs else None


def water_fill(capacity, demand, weight):
    """Each user's entitlement: CAPACITY shared by WEIGHT, none above its DEMAND, what a
    user cannot use going to the others (weighted max-min fairness)."""
    ent = {u: 0.0 for u in demand}
    left, active = float(capacity), {u for u, d in demand.items() if d > 0}
    while left > 1e-9 and active:
        total_w = sum(weight[u] for u in active)
        share = {u: left * weight[u] / total_w for u in active}
        full = {u for u in active if demand[u] - ent[u] <= share[u]}
        if not full:
            for u in active:
                ent[u] += share[u]
            break
        for u in full:
            left -= demand[u] - ent[u]
            ent[u] = float(demand[u])
        active -= full
    return ent


def figures(rec):
    """Every figure of the `sharing` line, as a dict (see bench-sharing.sh's header)."""
    end_ms = rec["collected_at_ms"]
    jobs = rec["jobs"]
    capacity = rec["capacity"]
    weight = {u: v["weight"] for u, v in rec["users"].items()}
    trace = {j["name"]: j for j in rec["trace"]}
    life = {jid: intervals(d, end_ms) for jid, d in jobs.items() if d["kind"] != "search"}

    # utilization: busy rank-seconds over the rank-seconds the demand could have used.
    points = set()
    for jid, (held, pending, ended) in life.items():
        points.update([jobs[jid]["submitted_at_ms"], ended])
        for t0, t1, _ in held:
            points.update([t0, t1])
    points = sorted(points)
    busy = offered = 0.0
    alloc, entitled = {u: 0.0 for u in weight}, {u: 0.0 for u in weight}
    busy_from = min((h[0][0] for h, _, _ in life.values() if h), default=None)
    busy_to = max((h[-1][1] for h, _, _ in life.values() if h), default=None)
    for a, b in zip(points, points[1:]):
        mid, dt = (a + b) / 2, (b - a) / 1000.0
        demand, used = {u: 0 for u in weight}, {u: 0 for u in weight}
        for jid, (held, _, ended) in life.items():
            d = jobs[jid]
            owner = d["owner"]
            if d["submitted_at_ms"] <= mid < ended:
                demand[owner] = demand.get(owner, 0) + d["workers"]
            for t0, t1, r in held:
                if t0 <= mid < t1:
                    used[owner] = used.get(owner, 0) + r
        busy += sum(used.values()) * dt
        offered += min(capacity, sum(demand.values())) * dt
        if busy_from is not None and busy_from <= mid < busy_to:
            ent = water_fill(capacity, {u: demand.get(u, 0) for u in weight}, weight)
            for u in weight:
                alloc[u] += used.get(u, 0) * dt
                entitled[u] += ent[u] * dt
    xs = [alloc[u] / entitled[u] for u in weight if entitled[u] > 0]
    jain = sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if xs and any(xs) else None

    # waits, per job of the trace (its resubmissions included; a search: to its first trial).
    trials = {}
    for jid, d in jobs.items():
        if d.get("trial_of"):
            trials.setdefault(d["trial_of"]["search"], []).append(jid)
    waits, high_waits = [], []
    for name, job_ids in rec["logical"].items():
        w = 0.0
        for k, jid in enumerate(job_ids):
            d = jobs.get(jid)
            if d is None:
                continue
            if d["kind"] == "search":
                starts = [life[t][0][0][0] for t in trials.get(jid, []) if life[t][0]]
                w += ((min(starts) if starts else end_ms) - d["submitted_at_ms"]) / 1000.0
                continue
            w += sum(t1 - t0 for t0, t1 in life[jid][1]) / 1000.0
            if k > 0:  # a resubmission: the time from its predecessor's end to its submit
                w += max(0, d["submitted_at_ms"] - life[job_ids[k - 1]][2]) / 1000.0
        if job_ids:
            waits.append(w)
            if trace[name]["priority"] == "high":
                high_waits.append(w)

    # lost work: rank-seconds thrown away by preemption (or the admin's cancels).
    def history(jid, metric):
        return [v for _, v in rec["metrics"].get(jid, {}).get(metric, [])]

    def reform_losses(jid):
        """The steps each re-form of train job JID lost, once per re-form. Every rank
        reports `restored_step` and `steps_lost` together after joining a generation (the
        two histories' points pair up in order); the survivors of one re-form restore the
        same step, so reports that name the same `restored_step` are one re-form, counted
        by its largest loss, not once per survivor."""
        lost = rec["metrics"].get(jid, {}).get("steps_lost", [])
        restored = rec["metrics"].get(jid, {}).get("restored_step", [])
        if len(restored) != len(lost):  # not paired: each report on its own
            return [v for _, v in lost]
        by_reform = {}
        for (_, at), (_, v) in zip(restored, lost):
            by_reform[at] = max(by_reform.get(at, 0), v)
        return list(by_reform.values())

    def regressed(jid):
        """Steps redone: how far the `step` history went back, each time it did (at its
        reports' grain). The step is the value: the trainer reports it without a step, so
        its x is a sequence."""
        last, back = None, 0
        for _, x in rec["metrics"].get(jid, {}).get("step", []):
            if last is not None and x < last:
                back += last - x
            last = x
        return back

    lost_s, steps_lost = 0.0, 0
    for jid, d in jobs.items():
        if d["kind"] == "search":
            continue
        held = life[jid][0]
        if d["kind"] == "command":
            lost_s += sum(history(jid, "lost_steps")) * rec["step_s"] * d["workers"]
            continue
        lost = sum(reform_losses(jid)) + regressed(jid)
        rank_s = sum((t1 - t0) / 1000.0 * r for t0, t1, r in held)
        steps = d.get("step") or 0
        if lost and steps:
            lost_s += lost * rank_s / steps
        if any(": shrunk " in e.get("reason", "") for e in d["events"]):
            steps_lost += int(lost)

    # shrink_s: a job that some ring was shrunk for, and that no requeue or pause served:
    # its start minus the decision to shrink for it (its pending reason naming the shrink,
    # or the shrink's re-form, whichever came first; its submit if later).
    served_by, shrunk_at = {}, {}
    for d in jobs.values():
        for e in d["events"]:
            r = e.get("reason", "")
            if r.startswith("preempted for "):
                how = "shrink" if ": shrunk " in r else "stop"
                for_job = r.split()[2]
                served_by.setdefault(for_job, set()).add(how)
                if how == "shrink":
                    shrunk_at[for_job] = min(shrunk_at.get(for_job, e["at_ms"]), e["at_ms"])
    shrink = []
    for jid, hows in served_by.items():
        if hows == {"shrink"} and jid in life and life[jid][0]:
            decided = [e["at_ms"] for e in jobs[jid]["events"]
                       if "preempting " in e.get("reason", "") and "(shrink" in e["reason"]]
            start = max(jobs[jid]["submitted_at_ms"], min(decided + [shrunk_at[jid]]))
            shrink.append((life[jid][0][0][0] - start) / 1000.0)

    return {"policy": rec["policy"], "jobs": len(waits),
            "utilization": busy / offered if offered else None,
            "wait_p50_s": pct(waits, 0.5), "wait_p95_s": pct(waits, 0.95),
            "high_wait_p95_s": pct(high_waits, 0.95), "jain": jain, "lost_work_s": lost_s,
            "shrink_s_p50": pct(shrink, 0.5), "shrink_s_max": max(shrink) if shrink else None,
            "steps_lost": steps_lost, "shrinks": len(shrink), "cancels": len(rec["cancels"])}


def idle(rec):
    """The timeline's samples where slots were free while a waiting job asked for no more
    than were free: [(seconds since the first sample, free slots, [(job, workers, reason)])].
    What the scheduler left unused, read from the run's records."""
    out, t0 = [], None
    for s in rec.get("timeline", []):
        t0 = s["at_ms"] if t0 is None else t0
        free = rec["capacity"] - sum(s["held"].values())
        fits = [(q["id"], q["workers"], q["reason"]) for q in s["queue"]
                if free > 0 and (q.get("trials") or q["workers"]) and q["workers"] <= free]
        if fits:
            out.append(((s["at_ms"] - t0) / 1000.0, free, fits))
    return out


def line(f):
    """The `sharing …` line of figures F (`na` for a figure nothing measured)."""
    def fmt(v, digits):
        return "na" if v is None else f"{v:.{digits}f}"
    return (f"sharing policy={f['policy']} jobs={f['jobs']} utilization={fmt(f['utilization'], 3)} "
            f"wait_p50_s={fmt(f['wait_p50_s'], 1)} wait_p95_s={fmt(f['wait_p95_s'], 1)} "
            f"high_wait_p95_s={fmt(f['high_wait_p95_s'], 1)} jain={fmt(f['jain'], 3)} "
            f"lost_work_s={fmt(f['lost_work_s'], 1)} shrink_s_p50={fmt(f['shrink_s_p50'], 2)} "
            f"shrink_s_max={fmt(f['shrink_s_max'], 2)} steps_lost={f['steps_lost']}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "trace":
        json.dump(trace(int(args[0]), float(args[1])), sys.stdout, indent=1)
    elif cmd == "calibrate":
        c = calibrate(args[0], args[1])
        json.dump(c, open(args[2], "w"))
        print(f"sharing calibrate steps_per_s={c['steps_per_s']:.0f} "
              f"trial_steps_per_s={c['trial_steps_per_s']:.0f} "
              f"trial_steps_per_epoch={c['trial_steps_per_epoch']:.1f}")
    elif cmd == "drive":
        tr, tokens = json.load(open(args[0])), json.load(open(args[1]))
        drive(tr, tokens, args[2], args[3], args[4], args[5], float(args[6]),
              json.load(open(args[7])))
    elif cmd == "timeline":
        r = json.load(open(args[0]))
        for at, free, fits in idle(r):
            print(f"{at:7.1f} s {free:2d} free: " + "; ".join(
                f"{j} ({w}): {reason}" for j, w, reason in fits))
    elif cmd == "figures":
        f = figures(json.load(open(args[0])))
        note(f"{f['policy']}: {f['shrinks']} jobs served by shrinks only, {f['cancels']} cancels")
        print(line(f))
    else:
        sys.exit(f"bench_sharing.py: unknown command {cmd!r} (trace, calibrate, drive, figures)")
