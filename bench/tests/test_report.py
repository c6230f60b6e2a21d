"""The report's comparison table (pyperch_bench.report): medians over repetitions, the
`vs pyperch` ratio, and the row format BENCHMARKS.md shows."""
import unittest

from pyperch_bench.figures import fmt, median, pct
from pyperch_bench.report import Report

HEADER = ("| tool | rate (Hz) | achieved samples/s (% of requested; target on CPU) | lost | CPU us/sample: process | + BPF | = total "
          "| vs pyperch | BPF whole run: ms (program runs) | whole-run CPU us/sample | target slowdown | slowdown per target CPU-second "
          "| peak RSS MB | split error (pp) | full stack | impossible |")


def run(run_id, tool, cpu_us, slowdown, **extra):
    metrics = {"achieved_hz": 990.0, "achieved_ratio": 0.99, "lost": 0, "lost_share": 0.0, "cpu_us_per_sample": cpu_us,
               "user_cpu_us_per_sample": cpu_us, "bpf_ns_per_sample": 2500.0 if tool == "pyperch" else None,
               "run_cpu_us_per_sample": cpu_us * 2, "rss_mb": 12.0, "target_cpu_share": 1.0,
               "accuracy": {"split_error_pp": 0.5, "noise_pp": 1.0, "full_stack_share": 1.0, "mixed_share": 0.0,
                            "mixed_share_of_chain": 0.0, "mixed": 0, "samples": 1000}}
    metrics.update(extra)
    return {"id": run_id, "tool": tool, "metrics": metrics, "slowdown": slowdown, "slowdown_per_cpu": slowdown,
            "bpf_total_ns": 5e6 if tool == "pyperch" else None, "bpf_total_runs": 2000 if tool == "pyperch" else None}


class FakeBench(object):
    def __init__(self, runs):
        self.results = {"groups": [{"interp": "3.12.1", "workload": "chain", "rate": 1000,
                                    "runs": [{"id": r["id"], "tool": r["tool"]} for r in runs]}],
                        "runs": runs}


class Table(unittest.TestCase):
    def test_medians_ratio_and_rows(self):
        runs = [run(1, "pyperch", 4.0, 0.01), run(2, "pyperch", 6.0, 0.03), run(3, "pyperch", 5.0, 0.02),
                run(4, "py-spy", 50.0, 0.10)]
        rep = Report(FakeBench(runs), {})
        summary = rep.table("3.12.1", "chain", [1000], ["pyperch", "py-spy"])
        self.assertEqual(summary[(1000, "pyperch")]["cpu_us_per_sample"], 5.0)
        self.assertEqual(summary[(1000, "pyperch")]["slowdowns"], [0.01, 0.03, 0.02])
        self.assertEqual(rep.summary[1]["cpu_per_sample_vs_pyperch"], 10.0)
        self.assertEqual(rep.lines[0], HEADER)
        self.assertEqual(rep.lines[1], "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        self.assertEqual(rep.lines[2], "| pyperch | 1000 | 990 (99%; 100%) | 0 (0.00%) | 5.00 | 2.50 | **5.00** | 1x | 5.0 (2000) "
                                       "| 10.0 | 2.0% (1.0, 3.0, 2.0) | 2.0% | 12.0 | 0.50 ± 1.00 | 100.0% | - |")
        # A peer: its total over pyperch's, no BPF column.
        self.assertTrue(rep.lines[3].startswith("| py-spy 0.4 (default, pausing) | 1000 | 990 (99%; 100%) | 0 (0.00%) | 50.00 | - | **50.00** | 10.0x | - |"), rep.lines[3])
        self.assertEqual(rep.lines[4], "")

    def test_nothing_run(self):
        rep = Report(FakeBench([]), {})
        self.assertEqual(rep.table("3.12.1", "web", [1000], ["pyperch"]), {})
        self.assertEqual(rep.lines, ["(not run)", ""])


class FreeThreaded(unittest.TestCase):
    def test_row_beside_the_main_interpreter(self):
        runs = [run(1, "pyperch", 5.0, 0.02), run(2, "pyperch", 7.0, 0.04)]
        bench = FakeBench(runs)
        bench.results["groups"][0]["runs"] = [{"id": 1, "tool": "pyperch"}]
        bench.results["groups"].append({"interp": "3.14.7t (free-threaded, built by hand)", "workload": "chain", "rate": 1000,
                                        "kind": "freethreaded", "runs": [{"id": 2, "tool": "pyperch"}]})
        rep = Report(bench, {"python_main": "3.12.1"})
        rep.freethreaded_section()
        self.assertEqual(rep.lines[0], "## Free-threaded CPython 3.14t (pyperch only)")
        row = [l for l in rep.lines if l.startswith("| CPU split")]
        self.assertEqual(row, ["| CPU split under a 30-call chain (depth 34) | 990 | 7.00 | 5.00 | 2500 | 4.0% | 0.50 (1.00) | 100.0% | - |"])

    def test_not_measured_says_why(self):
        bench = FakeBench([])
        bench.results["freethreaded_skipped"] = "PYPERCH_FT_PYTHON is not set"
        rep = Report(bench, {"python_main": "3.12.1"})
        rep.freethreaded_section()
        self.assertIn("Not measured in this run: PYPERCH_FT_PYTHON is not set", rep.lines[2])
        rep = Report(FakeBench([]), {"python_main": "3.12.1"})
        rep.freethreaded_section()
        self.assertEqual(rep.lines, [], "nothing when the section did not run")


class Figures(unittest.TestCase):
    def test_numbers(self):
        self.assertEqual(fmt(None), "n/a")
        self.assertEqual(fmt(float("nan")), "n/a")
        self.assertEqual(fmt(1.25, 1), "1.2")
        self.assertEqual(pct(0.5), 50.0)
        self.assertIsNone(pct(None))
        self.assertEqual(median([3, None, 1, 2]), 2)
        self.assertIsNone(median([None]))


if __name__ == "__main__":
    unittest.main()
