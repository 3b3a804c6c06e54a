#!/usr/bin/env python3
"""Tests of scripts/bench_check.py: figures read from benchmark lines, judged against their
bounds, and the floors file names only figures the checker computes. Run by scripts/test.sh."""

import sys
import tempfile
import tomllib
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_check  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIZE = bench_check.ALLREDUCE_SIZE

ALLREDUCE = f"""\
net=loopback impl=ringleader allreduce world=4 size={SIZE} time_ms=97.0 algbw_GBps=1.38 busbw_GBps=2.07 shm_links=4
net=loopback impl=gloo allreduce world=4 size={SIZE} time_ms=160.0 algbw_GBps=0.81 busbw_GBps=1.22
net=1gbit iperf3_GBps=0.1194 iperf3_Gbps=0.955 ring_hosts=4 ring_Gbps_per_host=0.95
net=1gbit impl=ringleader allreduce world=4 size={SIZE} time_ms=1120 algbw_GBps=0.06 busbw_GBps=0.119
net=1gbit impl=gloo allreduce world=4 size={SIZE} time_ms=1130 algbw_GBps=0.06 busbw_GBps=0.118
"""
DATASETS = """\
dataset sources=3 size_mb=512 mb_per_s=69.99 iperf_mb_per_s=100.51 ratio=0.696
dataset sources=1 size_mb=512 mb_per_s=34.9 iperf_mb_per_s=35.5 ratio=0.983
dataset sources=3 size_mb=512 to=dir mb_per_s=99.0 iperf_mb_per_s=105.0 ratio=0.943
"""
SCALE = """\
scale nodes=8 converge_s=0.31 detect_s=0.83 failover_s=2.34 submit_ms_p50=4.7 submit_ms_p99=8.1 wide_job_s=0.54 status_ms=0.3 chief_cpu_pct=0.40 node_rss_mb=25.7 idle_cpu_pct=0.34 chief_kib_per_entry=0.7
"""


def outputs(**parts):
    return {name: bench_check.parse(text) for name, text in parts.items()}


class Figures(unittest.TestCase):
    def test_ratios_are_read_from_the_lines_of_their_part(self):
        out = outputs(allreduce=ALLREDUCE, datasets=DATASETS)
        fig = bench_check.FIGURES
        self.assertAlmostEqual(fig["allreduce.loopback.ring_vs_gloo"](out), 2.07 / 1.22)
        self.assertAlmostEqual(fig["allreduce.1gbit.ring_vs_iperf3"](out), 0.119 / 0.1194)
        self.assertAlmostEqual(fig["datasets.sources3.vs_iperf3"](out), 0.696)
        self.assertAlmostEqual(fig["datasets.sources1.vs_iperf3"](out), 0.983)
        self.assertAlmostEqual(fig["datasets.sources3_to_dir.vs_iperf3"](out), 0.943)

    def test_a_ratio_far_below_its_floor_is_a_regression(self):
        out = outputs(datasets=DATASETS)
        line, regressed = bench_check.judge(
            "datasets.sources3.vs_iperf3", {"part": "datasets", "floor": 0.95}, out)
        self.assertTrue(regressed)
        self.assertIn("REGRESSION", line)
        line, regressed = bench_check.judge(
            "datasets.sources3_to_dir.vs_iperf3", {"part": "datasets", "floor": 0.95}, out)
        self.assertFalse(regressed, line)  # 0.943: under the floor, within 10 %
        self.assertIn("within 10 %", line)

    def test_a_ceiling_is_a_bound_from_above(self):
        out = outputs(scale=SCALE)
        line, regressed = bench_check.judge(
            "scale.8.idle_cpu_pct", {"part": "scale", "ceiling": 0.3}, out)
        self.assertTrue(regressed, line)  # 0.34 > 0.33
        line, regressed = bench_check.judge(
            "scale.8.detect_s", {"part": "scale", "ceiling": 2.0}, out)
        self.assertEqual((regressed, line.endswith(" ok")), (False, True), line)

    def test_a_figure_without_its_line_is_missing_not_a_regression(self):
        out = outputs(allreduce=ALLREDUCE.replace("impl=gloo", "impl=other"))
        line, regressed = bench_check.judge(
            "allreduce.loopback.ring_vs_gloo", {"part": "allreduce", "floor": 1.5}, out)
        self.assertFalse(regressed)
        self.assertIn("MISSING", line)
        line, _ = bench_check.judge("torch.ddp.1gbit.ring_vs_gloo", {"part": "torch", "floor": 1}, out)
        self.assertIn("MISSING (part torch did not run)", line)

    def test_bad_floors_are_refused(self):
        with self.assertRaises(ValueError):
            bench_check.judge("no.such.figure", {"part": "scale", "floor": 1}, {})
        with self.assertRaises(ValueError):
            bench_check.judge("scale.8.detect_s", {"part": "scale", "floor": 1, "ceiling": 2}, {})

    def test_the_project_floors_name_known_figures_of_known_parts(self):
        floors = tomllib.loads((ROOT / "docs/benchmarks-floors.toml").read_text())["figures"]
        self.assertGreater(len(floors), 10)
        parts = {"allreduce", "datasets", "torch", "elastic", "search", "scale"}
        for name, spec in floors.items():
            self.assertIn(name, bench_check.FIGURES)
            self.assertIn(spec["part"], parts, name)
            self.assertTrue(spec.get("why"), name)
            self.assertNotEqual("floor" in spec, "ceiling" in spec, name)

    def test_main_reads_a_directory_of_outputs(self):
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "datasets.out").write_text(DATASETS)
            floors = Path(d) / "floors.toml"
            floors.write_text('[figures."datasets.sources1.vs_iperf3"]\npart = "datasets"\n'
                              'floor = 0.98\nwhy = "test"\n')
            self.assertEqual(bench_check.main(["x", str(floors), d]), 0)
            floors.write_text('[figures."datasets.sources3.vs_iperf3"]\npart = "datasets"\n'
                              'floor = 0.95\nwhy = "test"\n')
            self.assertEqual(bench_check.main(["x", str(floors), d]), 1)


if __name__ == "__main__":
    unittest.main()
