"""The search of scripts/bench-python.sh through one implementation; prints one line:

    python search impl=IMPL trials=N wall_s=S best=B overhead_ms_per_trial=O

The objective: a Python function of (lr, x) trained for up to EPOCHS epochs of EPOCH_S
seconds of sleep each, reporting after every epoch a score that grows with the epochs and
peaks at lr = 0.01, x = 0.3 (best possible ≈ 0.998). Every implementation gets TRIALS
trials, PARALLEL at once, successive halving with rungs 1, 3, 9 (η = 3).

overhead_ms_per_trial = (wall_s · PARALLEL − epochs trained · EPOCH_S) / trials: the slot
time not spent in the objective's epochs, per trial.

    python3 scripts/bench_python.py ringleader PEER TOKEN PYTHONPATH
    python3 scripts/bench_python.py optuna
    python3 scripts/bench_python.py ray

The Ray Tune driver was written against Ray 2.x (run with 2.60 here); its API has moved
between releases.
"""

import math
import os
import sys
import time

EPOCHS = 9
EPOCH_S = 0.1
TRIALS = int(os.environ.get("TRIALS", 32))
PARALLEL = int(os.environ.get("PARALLEL", 4))
SEED = int(os.environ.get("SEED", 1))
ETA = 3


def score(lr, x, epoch):
    """The validation score after `epoch` epochs (deterministic, in [0, 1))."""
    quality = math.exp(-((math.log10(lr) + 2) ** 2) / 2) * (1 - (x - 0.3) ** 2)
    return quality * (1 - 0.5 ** epoch)


def line(impl, trials, wall_s, best, epochs_trained):
    overhead = (wall_s * PARALLEL - epochs_trained * EPOCH_S) / trials * 1000
    print(f"python search impl={impl} trials={trials} wall_s={wall_s:.2f} best={best:.4f} "
          f"overhead_ms_per_trial={overhead:.0f}", flush=True)


def run_ringleader(peer, token, pythonpath):
    sys.path.insert(0, pythonpath)
    import ringleader

    def objective(lr, x):
        import time as t

        import ringleader as rl
        for epoch in range(1, EPOCHS + 1):
            t.sleep(EPOCH_S)
            rl.report(epoch, score=score(lr, x, epoch))

    c = ringleader.Client(peer, token)
    start = time.monotonic()
    search = c.launch(objective, {"lr": ringleader.loguniform(1e-4, 1.0),
                                  "x": ringleader.uniform(0, 1)},
                      algorithm="asha", trials=TRIALS, max_parallel=PARALLEL,
                      resource=EPOCHS, min_resource=1, reduction_factor=ETA,
                      metric="score", direction="max", seed=SEED, python=sys.executable,
                      env={"PYTHONPATH": pythonpath}, quiet=True)
    search.wait(timeout=600)
    wall = time.monotonic() - start
    trials = search.trials()
    line("ringleader", len(trials), wall, search.best["metric"],
         sum(t["resource"] or 0 for t in trials))


def _optuna_worker(storage_url, study_name, n_trials, queue):
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=storage_url)
    epochs = 0

    def objective(trial):
        nonlocal epochs
        lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
        x = trial.suggest_float("x", 0.0, 1.0)
        value = 0.0
        for epoch in range(1, EPOCHS + 1):
            time.sleep(EPOCH_S)
            epochs += 1
            value = score(lr, x, epoch)
            trial.report(value, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return value

    study.optimize(objective, n_trials=n_trials)
    queue.put(epochs)


def run_optuna(tmp):
    import multiprocessing

    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage_url = f"sqlite:///{os.path.join(tmp, 'optuna.db')}"
    start = time.monotonic()
    study = optuna.create_study(
        study_name="bench", storage=storage_url, direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=SEED),
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=ETA))
    queue = multiprocessing.Queue()
    per = [TRIALS // PARALLEL + (i < TRIALS % PARALLEL) for i in range(PARALLEL)]
    procs = [multiprocessing.Process(target=_optuna_worker,
                                     args=(storage_url, "bench", n, queue)) for n in per]
    for p in procs:
        p.start()
    epochs = sum(queue.get() for _ in procs)
    for p in procs:
        p.join()
    wall = time.monotonic() - start
    line("optuna", len(study.trials), wall, study.best_value, epochs)


def run_ray():
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    # PARALLEL logical CPUs, as the ringleader node offers (`--cpus`): Ray would otherwise
    # count this machine's cores and run fewer trials at once. Started before the clock,
    # as ringleader's node is.
    ray.init(num_cpus=PARALLEL, include_dashboard=False, logging_level="WARNING",
             log_to_driver=False)

    def objective(config):
        for epoch in range(1, EPOCHS + 1):
            time.sleep(EPOCH_S)
            metrics = {"score": score(config["lr"], config["x"], epoch)}
            try:
                tune.report(metrics)      # Ray ≥ 2.x: one dict
            except TypeError:
                tune.report(**metrics)    # older Ray: keywords

    start = time.monotonic()
    tuner = tune.Tuner(
        tune.with_resources(objective, {"cpu": 1}),
        param_space={"lr": tune.loguniform(1e-4, 1.0), "x": tune.uniform(0, 1)},
        tune_config=tune.TuneConfig(
            metric="score", mode="max", num_samples=TRIALS, max_concurrent_trials=PARALLEL,
            reuse_actors=True,
            scheduler=ASHAScheduler(max_t=EPOCHS, grace_period=1, reduction_factor=ETA)),
        run_config=tune.RunConfig(verbose=0))
    results = tuner.fit()
    wall = time.monotonic() - start
    epochs = sum(int(r.metrics.get("training_iteration", 0)) for r in results)
    line("ray", len(results), wall, results.get_best_result().metrics["score"], epochs)


def main():
    impl = sys.argv[1]
    if impl == "ringleader":
        run_ringleader(*sys.argv[2:5])
    elif impl == "optuna":
        run_optuna(sys.argv[2] if len(sys.argv) > 2 else "/tmp")
    elif impl == "ray":
        run_ray()
    else:
        sys.exit(f"bench_python.py: unknown impl {impl}")


if __name__ == "__main__":
    main()
