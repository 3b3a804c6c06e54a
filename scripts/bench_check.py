#!/usr/bin/env python3
"""Compares the figures of one scripts/bench-check.sh run with docs/benchmarks-floors.toml.

    bench_check.py FLOORS OUT_DIR

OUT_DIR holds each part's standard output as PART.out (the benchmarks' own lines). Prints one
line per figure of FLOORS:

    bench-check FIGURE value=V floor=F ok
    bench-check FIGURE value=V ceiling=C REGRESSION (more than 10 % worse than its bound)
    bench-check FIGURE MISSING (why)

and a summary line. Exit 0 when no figure regressed (missing ones included: a part that did
not run says why in its own lines), 1 when one did, 2 on bad input. The standard library
only (tomllib: Python 3.11).
"""

import math
import sys
import tomllib
from pathlib import Path

# How far past its bound a figure may fall before it is called a regression.
SLACK = 0.10
# The allreduce size every allreduce figure is read at (bench-check.sh runs it alone).
ALLREDUCE_SIZE = str(64 << 20)


class Missing(Exception):
    """A figure whose benchmark line is not in the output."""


def parse(text):
    """Each line of a benchmark's output as (words, fields): the bare words and key=value."""
    lines = []
    for raw in text.splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        words, fields = set(), {}
        for token in raw.split():
            key, eq, value = token.partition("=")
            if eq:
                fields[key] = value.strip('"')
            else:
                words.add(token)
        lines.append((words, fields))
    return lines


def find(lines, words, **fields):
    """The last line holding every one of `words` and `fields` (key=value)."""
    for have_words, have in reversed(lines):
        if set(words) <= have_words and all(have.get(k) == v for k, v in fields.items()):
            return have
    shown = " ".join([*words, *(f"{k}={v}" for k, v in fields.items())])
    raise Missing(f"no line with {shown}")


def number(line, key):
    try:
        value = float(line[key])
    except (KeyError, ValueError):
        raise Missing(f"no number {key}= in {line}")
    if not math.isfinite(value):
        raise Missing(f"{key}={line[key]}")
    return value


def ratio(a, b):
    if b <= 0:
        raise Missing("a zero denominator")
    return a / b


def allreduce(impl, net):
    return lambda out: number(
        find(out["allreduce"], ["allreduce"], net=net, impl=impl, world="4", size=ALLREDUCE_SIZE),
        "busbw_GBps")


def dataset(sources, to_dir=False):
    def figure(out):
        lines = [(w, f) for w, f in out["datasets"] if ("to" in f) == to_dir]
        line = find(lines, ["dataset"], sources=str(sources))
        return number(line, "ratio")
    return figure


def torch_ddp(net):
    def figure(out):
        ours = find(out["torch"], ["torch", "ddp"], backend="ringleader", net=net)
        gloo = find(out["torch"], ["torch", "ddp"], backend="gloo", net=net)
        return ratio(number(ours, "samples_per_s"), number(gloo, "samples_per_s"))
    return figure


def iperf3_1gbit(out):
    return number(find(out["allreduce"], [], net="1gbit", ring_hosts="4"), "iperf3_GBps")


def elastic(fault, key):
    return lambda out: number(find(out["elastic"], ["elastic"], fault=fault), key)


def search(key):
    def figure(out):
        for words, fields in reversed(out["search"]):
            if "search" in words and "trials_per_s" in fields:
                return number(fields, key)
        raise Missing("no search line with trials_per_s=")
    return figure


def scale(nodes, key):
    return lambda out: number(find(out["scale"], ["scale"], nodes=str(nodes)), key)


# Every figure the floors file may name: FIGURE -> a function of the parsed parts' output.
FIGURES = {
    "allreduce.loopback.ring_vs_gloo":
        lambda out: ratio(allreduce("ringleader", "loopback")(out), allreduce("gloo", "loopback")(out)),
    "allreduce.1gbit.ring_vs_iperf3":
        lambda out: ratio(allreduce("ringleader", "1gbit")(out), iperf3_1gbit(out)),
    "allreduce.1gbit.ring_vs_gloo":
        lambda out: ratio(allreduce("ringleader", "1gbit")(out), allreduce("gloo", "1gbit")(out)),
    "datasets.sources3.vs_iperf3": dataset(3),
    "datasets.sources1.vs_iperf3": dataset(1),
    "datasets.sources3_to_dir.vs_iperf3": dataset(3, to_dir=True),
    "torch.ddp.loopback.ring_vs_gloo": torch_ddp("loopback"),
    "torch.ddp.1gbit.ring_vs_gloo": torch_ddp("1gbit"),
    "elastic.worker_kill.recover_s": elastic("worker-kill", "recover_s"),
    "elastic.worker_kill.steps_lost": elastic("worker-kill", "steps_lost"),
    "elastic.host_kill.recover_s": elastic("host-kill", "recover_s"),
    "search.overhead.trials_per_s": search("trials_per_s"),
    "search.overhead.overhead_ms_p50": search("overhead_ms_p50"),
}
for n in (8, 32):
    for key in ("idle_cpu_pct", "converge_s", "detect_s", "failover_s", "submit_ms_p99",
                "wide_job_s"):
        FIGURES[f"scale.{n}.{key}"] = scale(n, key)


def judge(name, spec, outputs):
    """The line for one figure, and whether it regressed."""
    if ("floor" in spec) == ("ceiling" in spec):
        raise ValueError(f"{name}: give exactly one of floor and ceiling")
    if name not in FIGURES:
        raise ValueError(f"{name}: no such figure in scripts/bench_check.py")
    part = spec.get("part")
    if part not in outputs:
        return f"bench-check {name} MISSING (part {part} did not run)", False
    try:
        value = FIGURES[name](outputs)
    except Missing as e:
        return f"bench-check {name} MISSING ({e})", False
    if "floor" in spec:
        bound, kind = float(spec["floor"]), "floor"
        regressed = value < bound * (1 - SLACK)
    else:
        bound, kind = float(spec["ceiling"]), "ceiling"
        regressed = value > bound * (1 + SLACK)
    met = value >= bound if kind == "floor" else value <= bound
    verdict = "REGRESSION" if regressed else ("ok" if met else "ok (within 10 % of its bound)")
    return f"bench-check {name} value={value:.3f} {kind}={bound:g} {verdict}", regressed


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    floors = tomllib.loads(Path(argv[1]).read_text()).get("figures", {})
    out_dir = Path(argv[2])
    outputs = {p.stem: parse(p.read_text(errors="replace")) for p in out_dir.glob("*.out")}
    regressions = missing = 0
    for name, spec in floors.items():
        try:
            line, regressed = judge(name, spec, outputs)
        except ValueError as e:
            print(f"bench_check.py: {argv[1]}: {e}", file=sys.stderr)
            return 2
        print(line)
        regressions += regressed
        missing += " MISSING " in line
    print(f"bench-check figures={len(floors)} regressions={regressions} missing={missing}")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
