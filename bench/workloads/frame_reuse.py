"""Frame reuse: two call chains of the same depth, called alternately in a tight loop.

Usage: frame_reuse.py SNAPSHOT_PATH MAX_SECONDS

reuse_loop calls a_1 -> a_2 -> a_3 -> leaf, then b_1 -> b_2 -> b_3 -> leaf, over and over.
The two chains occupy the same frame slots one after the other (from 3.11 on, literally the
same memory in the thread's frame stack), so a profiler that reads a stack while it changes
can splice the two: a stack holding both a_* and b_* frames is impossible. By construction
each chain gets half of the time spent in the chains. One unit of work ("iters") is one
a-call plus one b-call. Runs unchanged on CPython 3.8 ... 3.15.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402


def leaf(x):
    y = x * 3
    return (y + 1) & 0xFFFF


def a_3(x):
    return leaf(x) + 1


def a_2(x):
    return a_3(x) + 1


def a_1(x):
    return a_2(x) + 1


def b_3(x):
    return leaf(x) + 1


def b_2(x):
    return b_3(x) + 1


def b_1(x):
    return b_2(x) + 1


def reuse_loop(h):
    h.iters["pairs"] = 0
    h.ready()
    n = 0
    s = 0
    while not h.expired():
        for i in range(1000):
            s += a_1(i)
            s += b_1(i)
        n += 1000
        h.iters["pairs"] = n
    return s


def main():
    h = _harness.Harness()
    reuse_loop(h)


if __name__ == "__main__":
    main()
