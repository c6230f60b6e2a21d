"""Split error, full stacks and impossible stacks against a workload's truth
(pyperch_bench.accuracy), and the rates taken between two snapshots (pyperch_bench.measurement)."""
import unittest

from pyperch_bench.accuracy import accuracy, expected_prefix, full_stack
from pyperch_bench.measurement import cpu_delta, rate_between, rate_per_cpu, switches_between

CHAIN = expected_prefix("chain")


class Accuracy(unittest.TestCase):
    def test_split_error_against_the_truth(self):
        stacks = [(CHAIN + ["leaf_a"], 40), (CHAIN + ["leaf_b"], 60)]
        a = accuracy("chain", stacks, {"leaf_a": 0.3, "leaf_b": 0.7})
        self.assertEqual((a["samples"], a["labelled"], a["mixed"]), (100, 100, 0))
        self.assertAlmostEqual(a["split_error_pp"], 10.0)
        self.assertAlmostEqual(a["measured"]["leaf_a"], 0.4)
        self.assertAlmostEqual(a["truth"]["leaf_b"], 0.7)
        self.assertAlmostEqual(a["noise_pp"], 100.0 * (0.3 * 0.7 / 100) ** 0.5)
        self.assertEqual(a["full_stack_share"], 1.0)

    def test_a_cut_stack_is_not_full(self):
        stacks = [(CHAIN + ["leaf_a"], 3), (["<module>", "main", "chain_05", "split_loop", "leaf_b"], 1)]
        self.assertEqual(accuracy("chain", stacks, {"leaf_a": 1, "leaf_b": 1})["full_stack_share"], 0.75)

    def test_frame_reuse_counts_impossible_stacks(self):
        pre = expected_prefix("frame_reuse")
        stacks = [(pre + ["a_1", "a_2", "a_3", "leaf"], 5), (pre + ["b_1", "b_2", "b_3", "leaf"], 4), (pre + ["a_1", "b_2", "leaf"], 1)]
        a = accuracy("frame_reuse", stacks, {})
        self.assertEqual((a["mixed"], a["labelled"]), (1, 9))
        self.assertAlmostEqual(a["mixed_share"], 0.1)
        self.assertAlmostEqual(a["full_stack_share"], 0.9)
        self.assertEqual(a["truth"], {"a": 0.5, "b": 0.5})

    def test_no_samples_gives_no_numbers(self):
        a = accuracy("web", [], {"render_page": 1.0, "encode_payload": 1.0})
        self.assertEqual((a["split_error_pp"], a["noise_pp"], a["full_stack_share"]), (None, None, None))

    def test_threads_and_the_snapshot_handler(self):
        self.assertTrue(full_stack("threads8", ["_bootstrap", "_bootstrap_inner", "run", "work_t3", "spin_t3"]))
        self.assertFalse(full_stack("threads8", ["_bootstrap", "work_t3", "spin_t3"]))
        # The harness's signal handler on top of a full stack does not cut it.
        self.assertTrue(full_stack("chain", CHAIN + ["leaf_a", "_snapshot", "dumps"]))
        self.assertTrue(full_stack("recursion", ["<module>", "main"] + ["descend"] * 6 + ["split_loop", "leaf_a"], depth=10))
        self.assertFalse(full_stack("recursion", ["<module>", "main"] + ["descend"] * 5 + ["split_loop", "leaf_a"], depth=10))


class Rates(unittest.TestCase):
    def test_rates_between_snapshots(self):
        s0 = {"t": 10.0, "iters": 100, "cpu_ns": 1_000_000_000, "switches": 50, "cpu": {"a": 1.0}}
        s1 = {"t": 12.0, "iters": 300, "cpu_ns": 1_500_000_000, "switches": 150, "cpu": {"a": 1.5, "b": 0.25}}
        self.assertEqual(rate_between(s0, s1), 100.0)
        self.assertEqual(rate_per_cpu(s0, s1), 400.0)
        self.assertEqual(switches_between(s0, s1), 50.0)
        self.assertEqual(cpu_delta(s0, s1), {"a": 0.5, "b": 0.25})

    def test_missing_or_backwards_snapshots(self):
        s = {"t": 1.0, "iters": 1, "cpu_ns": None, "switches": None, "cpu": {}}
        self.assertIsNone(rate_between(s, s))
        self.assertIsNone(rate_between(None, s))
        self.assertIsNone(rate_per_cpu(s, dict(s, t=2.0)))
        self.assertIsNone(switches_between(s, dict(s, t=2.0)))
        self.assertEqual(cpu_delta(None, s), {})


if __name__ == "__main__":
    unittest.main()
