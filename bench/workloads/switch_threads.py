"""A Python context-switch storm: THREADS threads (500), each sleeping PERIOD_US (500 us) at a
time in a loop, so each asks to switch out and back in about 1e6/PERIOD_US times a second
(2,000: 1,000,000 a second for the process, more than 2 CPUs can schedule; the benchmark
reports what was reached), for the `storms` benchmark section.

Usage: switch_threads.py SNAPSHOT_PATH MAX_SECONDS [THREADS] [PERIOD_US]

Three quarters of the threads sleep in wait_a, one quarter in wait_b: in wall time (every
thread's whole time) the split is 3/4 : 1/4 by construction. Units of work are sleeps done.
Runs unchanged on CPython 3.8 ... 3.15.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Harness  # noqa: E402


def wait_a(h, key, period):
    n = h.iters[key]
    sleep = time.sleep
    while not h.stop:
        sleep(period)
        n += 1
        h.iters[key] = n


def wait_b(h, key, period):
    n = h.iters[key]
    sleep = time.sleep
    while not h.stop:
        sleep(period)
        n += 1
        h.iters[key] = n


def main():
    h = Harness()
    threads = int(h.args[0]) if h.args else 500
    period = (float(h.args[1]) if len(h.args) > 1 else 500.0) / 1e6
    go = threading.Event()

    def worker(k):
        key = "t%d" % k
        h.iters[key] = 0
        go.wait()
        (wait_a if k % 4 else wait_b)(h, key, period)

    pool = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    go.set()
    h.run_threads([])


if __name__ == "__main__":
    main()
