"""The storms section (pyperch_bench.storms): the shares read from pyperch's and py-spy's
files, the slowdown of the churn storm, and the table BENCHMARKS.md shows."""
import os
import tempfile
import unittest

from pyperch_bench import storms


class Shares(unittest.TestCase):
    def test_pyperch_whole_host_one_pid(self):
        text = ("python3.12 (pid 7);<module> (chain.py:9);leaf_a (_harness.py:80) 30\n"
                "python3.12 (pid 7);<module> (chain.py:9);leaf_b (_harness.py:86) 70\n"
                "python3.12 (pid 8);<module> (other.py:1);leaf_a (other.py:2) 500\n")
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(text)
        try:
            self.assertEqual(storms.shares(f.name, "leaf_a", "leaf_b", pid=7), (0.3, 0.7))
            a, b = storms.shares(f.name, "leaf_a", "leaf_b")
            self.assertAlmostEqual(a, 530 / 600)
        finally:
            os.unlink(f.name)

    def test_pyspy_raw_and_missing_file(self):
        text = "<module> (many_threads.py:90);level_11 (many_threads.py:40);leaf_a (many_threads.py:31) 3\nx;leaf_b (m.py:1) 1\n"
        with tempfile.NamedTemporaryFile("w", suffix=".raw", delete=False) as f:
            f.write(text)
        try:
            self.assertEqual(storms.shares(f.name, "leaf_a", "leaf_b"), (0.75, 0.25))
        finally:
            os.unlink(f.name)
        self.assertIsNone(storms.shares("/nonexistent/x.txt", "leaf_a", "leaf_b"))

    def test_churn_throughput_is_inverse_mean_lifetime(self):
        s0 = {"t": 0.0, "iters": 10, "cpu": {"lifetime_s": 1.0}}
        s1 = {"t": 5.0, "iters": 30, "cpu": {"lifetime_s": 3.0}}
        self.assertEqual(storms.throughput(s0, s1, "churn"), 10.0)
        self.assertEqual(storms.throughput(s0, s1, "cpu"), 4.0)


class Table(unittest.TestCase):
    def test_rows(self):
        row = {"tool": "pyperch --max-cpu 2", "rate": 1000, "budget": 2, "cpu_pct": 1.9, "threads_s": 0.03, "bpf_s": 0.11,
               "seconds": 7.5, "effective_hz": [125.0, 436.5, 125.0], "slowdown": 0.01, "peak_rss_mb": 79.4,
               "shares": (0.287, 0.713), "truth": (0.3, 0.7), "delta_pp": 4.7}
        na = {"tool": "py-spy", "rate": None, "na": "cannot"}

        class Rep(object):
            r = {"storms": {"python": "3.12.1", "storms": {"nonpython": {"rows": [row, na], "size": {"switches_per_s": 1e5}}},
                            "per_sample_8": {"us_per_sample": 4.0, "bpf_us_per_sample": 2.5},
                            "per_sample_500": {"us_per_sample": 5.0, "bpf_us_per_sample": 3.5},
                            "dump": [{"wall_s": 0.2, "exit": 0, "threads": 501}]}}
        lines = storms.report(Rep())
        text = "\n".join(lines)
        self.assertIn("| **1.90 (0.40 + 1.47)** | 125 / 436 / 125 | 1.0% | 79.4 | 28.7 / 71.3 (true 30.0 / 70.0) | 4.7 |", text)
        self.assertIn("| py-spy | | | cannot |", text)
        self.assertIn("**1.25×**", text)
        self.assertIn("**0.20** (0.20; 501 threads)", text)


if __name__ == "__main__":
    unittest.main()
