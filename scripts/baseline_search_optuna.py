#!/usr/bin/env python3
"""Optuna baseline for scripts/bench-search.sh: TPE + successive halving on ringleader's objective.

Reads the same search spec the bench submits to ringleader (a `kind = "search"` TOML: the
trial template's [model]/[data]/[train]/[checkpoint] tables, the [search] table and its
[[search.params]]) and runs Optuna's TPESampler(seed) with SuccessiveHalvingPruner(
min_resource, reduction_factor) over the same search space:

- each trial writes the template with the trial's parameters (dotted names such as
  `train.lr`, `model.hidden`) and `train.epochs = max_resource` to a spec file and runs one
  `ringleader train-worker --spec FILE --rank 0 --addrs 127.0.0.1:PORT --metric-lines`
  process (one rank, as ringleader's trials with `workers = 1`);
- it reads the worker's `ringleader-report EPOCHS val_loss X val_accuracy Y` lines as they
  come, calls `trial.report(metric, EPOCHS)`, and when `trial.should_prune()` kills the
  process and raises TrialPruned;
- epochs are counted as they are reported; once the budget is used up the running trial is
  killed (its last report stands as its value) and the study stops.

Trials run sequentially by default (`--n-jobs 1`: one worker process at a time, so the
sampler sees every finished trial before it suggests the next); `--n-jobs N` runs N Optuna
threads, each with its own worker process.

`best` is the best over all trials (completed, pruned or cut by the budget) of each trial's
metric at the most epochs it reported, which is how ringleader's searches define a trial's
metric and the search's best. Prints one line:

    search impl=optuna algorithm=tpe+sha budget_epochs=E trials=N best=B seconds=S

Needs `pip install optuna` (scripts/install-baselines.sh installs it).
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib  # type: ignore

import optuna

TEMPLATE_TABLES = ("model", "data", "train", "checkpoint")


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        r = repr(v)
        if r in ("inf", "-inf", "nan"):
            raise ValueError(f"cannot write {r} to TOML")
        return r
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def spec_text(template, params, epochs):
    """The template's tables with `params` (dotted names) set and train.epochs = epochs."""
    tables = {name: dict(template.get(name, {})) for name in TEMPLATE_TABLES if name in template}
    for name, value in params.items():
        table, _, key = name.partition(".")
        if not key:
            raise ValueError(f"parameter {name}: want TABLE.KEY")
        tables.setdefault(table, {})[key] = value
    tables.setdefault("train", {})["epochs"] = epochs
    out = []
    for table, keys in tables.items():
        out.append(f"[{table}]")
        for k, v in keys.items():
            out.append(f"{k} = {toml_value(v)}")
        out.append("")
    return "\n".join(out)


def suggest(trial, p):
    """The trial's value of one [[search.params]] entry."""
    name, kind = p["name"], p["type"]
    scale = p.get("scale", "linear")
    if kind in ("double", "integer"):
        if scale not in ("linear", "log"):
            raise ValueError(f"{name}: scale {scale} is not supported by this baseline")
        if kind == "double":
            return trial.suggest_float(name, float(p["min"]), float(p["max"]), log=scale == "log")
        return trial.suggest_int(name, int(p["min"]), int(p["max"]), log=scale == "log")
    if kind in ("discrete", "categorical"):
        values = p["values"]
        # Optuna's choices must be scalars: lists (model.hidden) travel as their JSON text.
        choices = [json.dumps(v) if isinstance(v, (list, dict)) else v for v in values]
        picked = trial.suggest_categorical(name, choices)
        return values[choices.index(picked)]
    raise ValueError(f"{name}: type {kind} is not supported")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="the bench's search spec (TOML)")
    ap.add_argument("--bin", default="target/release/ringleader", help="ringleader binary")
    ap.add_argument("--budget", type=int, default=180, help="epochs, over all trials")
    ap.add_argument("--seed", type=int, default=None, help="default: the spec's search.seed")
    ap.add_argument("--n-jobs", type=int, default=1, help="Optuna threads (default 1: sequential)")
    ap.add_argument("--trial-timeout", type=float, default=600.0, help="seconds per trial")
    ap.add_argument("--work-dir", default=None, help="default: a temporary directory")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()

    with open(args.spec, "rb") as f:
        doc = tomllib.load(f)
    search = doc["search"]
    metric = search["metric"]
    direction = "maximize" if search.get("direction", "max") == "max" else "minimize"
    seed = args.seed if args.seed is not None else int(search.get("seed", 0))
    max_resource = int(search.get("max_resource", doc.get("train", {}).get("epochs", 9)))
    min_resource = int(search.get("min_resource", 1))
    eta = int(search.get("reduction_factor", 3))
    params = search["params"]
    exe = os.path.abspath(args.bin)
    if not os.access(exe, os.X_OK):
        sys.exit(f"baseline_search_optuna: no executable {exe}")

    # A SIGTERM (the bench's `timeout`) unwinds through the finally below, which kills the
    # running worker processes (each in its own session).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    if not args.verbose:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    work = args.work_dir or tempfile.mkdtemp(prefix="rl-optuna-")
    os.makedirs(work, exist_ok=True)

    lock = threading.Lock()
    state = {"epochs": 0, "exhausted": False, "procs": set(), "last": {}, "trials": 0}

    def kill(proc):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()

    def objective(trial):
        with lock:
            if state["exhausted"]:
                trial.study.stop()
                raise optuna.TrialPruned()  # never started: no epochs, no value
            state["trials"] += 1
        values = {p["name"]: suggest(trial, p) for p in params}
        tdir = os.path.join(work, f"trial-{trial.number}")
        os.makedirs(tdir, exist_ok=True)
        spec_file = os.path.join(tdir, "spec.toml")
        with open(spec_file, "w") as f:
            f.write(spec_text(doc, values, max_resource))
        cmd = [exe, "train-worker", "--spec", spec_file, "--rank", "0",
               "--addrs", f"127.0.0.1:{free_port()}", "--job-id", f"optuna-{trial.number}",
               "--data-dir", tdir, "--metric-lines"]
        err = open(os.path.join(tdir, "stderr"), "w")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                start_new_session=True)
        timer = threading.Timer(args.trial_timeout, kill, (proc,))
        timer.start()
        with lock:
            state["procs"].add(proc)
        done_epochs, last = 0, None
        try:
            for line in proc.stdout:
                fields = line.split()
                if len(fields) < 2 or fields[0] != "ringleader-report":
                    continue
                epoch = int(fields[1])
                kv = dict(zip(fields[2::2], fields[3::2]))
                if metric not in kv:
                    continue
                value = float(kv[metric])
                with lock:
                    if state["exhausted"]:
                        break  # killed for the budget: this late report does not count
                    state["epochs"] += max(epoch - done_epochs, 0)
                    done_epochs, last = epoch, value
                    state["last"][trial.number] = (value, epoch)
                    exhausted = state["epochs"] >= args.budget
                    if exhausted:
                        state["exhausted"] = True
                        for p in state["procs"]:
                            if p is not proc:
                                kill(p)
                trial.report(value, epoch)
                if exhausted:
                    trial.study.stop()
                    break
                if trial.should_prune():
                    kill(proc)
                    raise optuna.TrialPruned()
        finally:
            timer.cancel()
            kill(proc)
            err.close()
            with lock:
                state["procs"].discard(proc)
        if last is None:
            with lock:
                if state["exhausted"]:
                    raise optuna.TrialPruned()  # killed by another trial's last epoch
            tail = open(os.path.join(tdir, "stderr")).read()[-2000:]
            raise RuntimeError(f"trial {trial.number}: no {metric} report "
                               f"(exit {proc.returncode}): {tail}")
        if done_epochs < max_resource and not state["exhausted"]:
            tail = open(os.path.join(tdir, "stderr")).read()[-2000:]
            raise RuntimeError(f"trial {trial.number}: ended after {done_epochs} of "
                               f"{max_resource} epochs (exit {proc.returncode}): {tail}")
        return last

    sampler = optuna.samplers.TPESampler(seed=seed)
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=min_resource,
                                                    reduction_factor=eta)
    study = optuna.create_study(direction=direction, sampler=sampler, pruner=pruner)
    start = time.monotonic()
    try:
        # Failed trials (a worker that crashed) stop the study: a baseline should not hide them.
        study.optimize(objective, n_jobs=args.n_jobs, catch=())
    finally:
        with lock:
            for p in list(state["procs"]):
                kill(p)
    seconds = time.monotonic() - start

    if not state["last"]:
        sys.exit("baseline_search_optuna: no trial reported a value")
    pick = max if direction == "maximize" else min
    best = pick(v for v, _ in state["last"].values())
    print(f"search impl=optuna algorithm=tpe+sha budget_epochs={state['epochs']} "
          f"trials={state['trials']} best={best:.4f} seconds={seconds:.1f}", flush=True)
    if args.verbose:
        counts = {}
        for t in study.trials:
            counts[t.state.name] = counts.get(t.state.name, 0) + 1
        print(f"# optuna trials by state: {counts}; n_jobs={args.n_jobs}", file=sys.stderr)


if __name__ == "__main__":
    main()
