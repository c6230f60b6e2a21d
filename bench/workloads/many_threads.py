"""Many CPU-bound threads in one process: the shape of py-spy issue #872 (py-spy slowed a
159-thread torch process 5-15x), for the `storms` benchmark section.

Usage: many_threads.py SNAPSHOT_PATH MAX_SECONDS [THREADS]

Each of THREADS threads (500) descends through 12 nested calls (level_00 ... level_11) and, at
the bottom, runs leaf_a for 3 units of work then leaf_b for 1 (the same busy loop), over and
over: three quarters of the process's CPU time is in leaf_a, one quarter in leaf_b. Units of
work are passes through level_00 (all threads), counted in SNAPSHOT_PATH.counts (below), not in
the snapshots.
Runs unchanged on CPython 3.8 ... 3.15.
"""
import mmap
import os
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Harness  # noqa: E402

UNIT = 2000


def busy(n):
    x = 0
    for i in range(n):
        x = (x + i * 7) % 1000003
    return x


def leaf_a():
    return busy(3 * UNIT)


def leaf_b():
    return busy(UNIT)


def level_11():
    leaf_a()
    leaf_b()

def level_10():
    level_11()

def level_09():
    level_10()

def level_08():
    level_09()

def level_07():
    level_08()

def level_06():
    level_07()

def level_05():
    level_06()

def level_04():
    level_05()

def level_03():
    level_04()

def level_02():
    level_03()

def level_01():
    level_02()

def level_00():
    level_01()


def main():
    h = Harness()
    threads = int(h.args[0]) if h.args else 500
    # Threads start idle and begin together: a thread's start waits for the GIL, which
    # hundreds of busy threads would make slow.
    go = threading.Event()
    # The counters live in SNAPSHOT_PATH.counts (one little-endian 8-byte count per thread),
    # which the benchmark reads without signalling: with hundreds of CPU-bound threads the
    # main thread (where signal handlers run) can wait seconds for the GIL.
    with open(h.path + ".counts", "wb") as f:
        f.write(b"\0" * 8 * threads)
    fd = os.open(h.path + ".counts", os.O_RDWR)
    counts = mmap.mmap(fd, 8 * threads)

    def worker(k):
        go.wait()
        n = 0
        while not h.stop:
            level_00()
            n += 1
            struct.pack_into("<q", counts, 8 * k, n)

    pool = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    go.set()
    h.run_threads([])


if __name__ == "__main__":
    main()
