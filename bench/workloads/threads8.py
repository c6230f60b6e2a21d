"""Eight threads, each busy in its own function.

Usage: threads8.py SNAPSHOT_PATH MAX_SECONDS

Threads run work_t0 ... work_t7 (identical busy loops under distinct names); each thread
records its own CPU time (time.thread_time()) and its units of work. The main thread only
sleeps (and answers the snapshot signal). The GIL lets one thread run Python at a time, so
the eight shares of CPU time come out near, but not exactly at, 12.5 % each: the workload's
own measurement is the truth the profiles are compared with.
Runs unchanged on CPython 3.8 ... 3.15.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

CHUNK = 2000


def spin(h, label):
    clock = time.thread_time
    start = clock()
    n = 0
    while not h.stop:
        x = 0
        for i in range(CHUNK):
            x = (x + i * 7) % 1000003
        n += 1
        h.iters[label] = n
        h.cpu[label] = clock() - start


def work_t0(h):
    spin_t0(h)


def spin_t0(h):
    spin(h, "work_t0")


def work_t1(h):
    spin_t1(h)


def spin_t1(h):
    spin(h, "work_t1")


def work_t2(h):
    spin_t2(h)


def spin_t2(h):
    spin(h, "work_t2")


def work_t3(h):
    spin_t3(h)


def spin_t3(h):
    spin(h, "work_t3")


def work_t4(h):
    spin_t4(h)


def spin_t4(h):
    spin(h, "work_t4")


def work_t5(h):
    spin_t5(h)


def spin_t5(h):
    spin(h, "work_t5")


def work_t6(h):
    spin_t6(h)


def spin_t6(h):
    spin(h, "work_t6")


def work_t7(h):
    spin_t7(h)


def spin_t7(h):
    spin(h, "work_t7")


WORKERS = [work_t0, work_t1, work_t2, work_t3, work_t4, work_t5, work_t6, work_t7]


def main():
    h = _harness.Harness()
    for f in WORKERS:
        h.iters[f.__name__] = 0
        h.cpu[f.__name__] = 0.0
    threads = [threading.Thread(target=f, args=(h,), name=f.__name__, daemon=True) for f in WORKERS]
    h.run_threads(threads)


if __name__ == "__main__":
    main()
