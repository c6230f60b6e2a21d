"""Every tool's profile and stderr summary taken apart (pyperch_bench.peers), on text shaped
like each tool's own output (the lines below are the formats pyperch 0.1, py-spy 0.4, Austin
3.7 and CPython 3.15's profiling.sampling write)."""
import os
import tempfile
import unittest

from pyperch_bench.peers import parse_colon_frames, parse_paren_frames, parse_profile, parse_tool_stderr


class Frames(unittest.TestCase):
    def test_pyperch_collapsed_drops_the_process_frame_and_pseudo_frames(self):
        stack = "python3.12 (pid 30337);<module> (/w/chain.py:143);main (/w/chain.py:139);<GC>;leaf_a (/w/chain.py:12)"
        self.assertEqual(parse_paren_frames(stack), ["<module>", "main", "leaf_a"])

    def test_qualnames_and_frames_without_a_location(self):
        stack = "process 42;<module> (chain.py:143);Handler.render_page (web.py:40);<native>"
        self.assertEqual(parse_paren_frames(stack), ["<module>", "render_page"])

    def test_austin_and_cpython_colon_frames(self):
        austin = "P30337;T0:30337;/w/chain.py:<module>:143;/w/chain.py:main:139;/w/chain.py:leaf_b:15"
        self.assertEqual(parse_colon_frames(austin), ["<module>", "main", "leaf_b"])
        cpython = "tid:4242;/w/web.py:<module>:90;/w/web.py:Engine.render:33"
        self.assertEqual(parse_colon_frames(cpython), ["<module>", "render"])


class Profiles(unittest.TestCase):
    def parse(self, tool, text):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(text)
        try:
            return parse_profile(tool, f.name)
        finally:
            os.unlink(f.name)

    def test_collapsed_counts(self):
        text = "python3.12 (pid 1);<module> (a.py:1);leaf_a (a.py:2) 7\n# comment\n\nnot a count x\n<module> (a.py:1) 3\n"
        self.assertEqual(self.parse("pyperch", text), [(["<module>", "leaf_a"], 7), (["<module>"], 3)])
        # The native and kernel variants read as pyperch and py-spy.
        self.assertEqual(self.parse("pyperch-native", text), self.parse("pyperch", text))
        self.assertEqual(self.parse("py-spy-native", "<module> (a.py:1) 2\n"), [(["<module>"], 2)])

    def test_austin_counts_one_per_line(self):
        text = "# austin: 3.7.0\n# mode: cpu\n\nP1;T0:1;/a.py:<module>:1;/a.py:leaf_b:3 211\nP1;T0:1;/a.py:<module>:1 90\n"
        self.assertEqual(self.parse("austin", text), [(["<module>", "leaf_b"], 1), (["<module>"], 1)])

    def test_cpython_collapsed(self):
        self.assertEqual(self.parse("cpython", "tid:9;/a.py:<module>:1;/a.py:leaf_a:2 5\n"), [(["<module>", "leaf_a"], 5)])

    def test_a_missing_file_is_no_stacks(self):
        self.assertEqual(parse_profile("pyperch", "/nonexistent/pyperch-bench-test.txt"), [])


PYPERCH_STATS = """pyperch: recorded 2.0 s: 122 samples (122 ok) from 1 Python process; wrote /tmp/out.txt
pyperch statistics (whole run):
  samples: 124
    ok                                                122 ( 98.4%)
    dropped: no Python frame                            2 (  1.6%)
  frame cache: 0 full hits, 0 partial hits, 0 misses; frames from kernel 4270, from cache 3, from memory 1
  target memory: 5 reads, 640 bytes (0.04 reads per sample); ring buffer: 147376 bytes (1208 per sample)
  kernel: 124 samples of registered processes, 2 lost (ring buffer full), 0 malformed records
  process 30337 (python3.12, Python 3.12.1):
    samples: 124
      ok                                                122 ( 98.4%)
      dropped: no Python frame                            2 (  1.6%)
"""


class Stderr(unittest.TestCase):
    def test_pyperch_statistics(self):
        info = parse_tool_stderr("pyperch", PYPERCH_STATS)
        self.assertEqual((info["recorded_s"], info["samples"], info["ok"], info["processes"]), (2.0, 122, 122, 1))
        self.assertEqual((info["kernel_samples"], info["kernel_lost"]), (124, 2))
        self.assertEqual((info["target_reads"], info["target_bytes"], info["ring_bytes"]), (5, 640, 147376))
        self.assertEqual((info["frames_kernel"], info["frames_cache"], info["frames_memory"]), (4270, 3, 1))
        self.assertEqual(info["outcomes"], {"ok": 122, "dropped: no Python frame": 2})
        self.assertEqual(info["per_process"], {30337: 124})
        self.assertEqual(info["per_process_detail"][30337]["ok"], 122)
        self.assertEqual(info["per_process_detail"][30337]["name"], "python3.12, Python 3.12.1")
        self.assertEqual(info["registered"], 1)

    def test_py_spy_summary(self):
        text = "py-spy> Wrote raw flamegraph data to '/tmp/x.txt'. Samples: 199 Errors: 3\npy-spy> 1.2s behind in sampling\n"
        self.assertEqual(parse_tool_stderr("py-spy", text), {"samples": 199, "errors": 3, "behind_warnings": 1})

    def test_austin_summary_with_colours(self):
        text = ("\u231b Sampling duration : \x1b[1m2.01 s\x1b[0m\n"
                "\u23f1\ufe0f  Frame sampling (min/avg/max) : \x1b[1m121/197/304 \u03bcs\x1b[0m\n"
                "\U0001f422 Long sampling rate : \x1b[1m4/192\x1b[0m (\x1b[1m2.08 %\x1b[0m) samples took longer\n"
                "\U0001f480 Error rate : \x1b[1m1/192\x1b[0m (\x1b[1m0.52 %\x1b[0m) invalid samples\n")
        self.assertEqual(parse_tool_stderr("austin", text),
                         {"sampling_s": 2.01, "frame_sampling_avg_us": 197, "long_samples": 4, "errors": 1, "attempts": 192})

    def test_cpython_summary(self):
        text = "Captured 2000 samples in 2.00 seconds\nError rate: 0.50\nWarning: missed 3 samples from the expected total of 2000 (0.15%)\n"
        self.assertEqual(parse_tool_stderr("cpython", text),
                         {"samples": 2000, "seconds": 2.0, "error_rate_pct": 0.5, "missed": 3, "expected": 2000})


if __name__ == "__main__":
    unittest.main()
