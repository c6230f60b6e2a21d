"""A deep recursion rebuilt over and over: the stack below the kernel's full frames changes
every few milliseconds (as the workload of `cargo xtask test-kernels` does).

Usage: rebuilt_deep.py DEPTH LEAF_ITERATIONS MAX_SECONDS

main() calls deep(DEPTH), which recurses DEPTH times down to middle() and leaf(), a busy
loop of LEAF_ITERATIONS steps; then everything returns and main() starts again. On 3.8-3.10
every rebuild takes its frame objects from the allocator again (other addresses, another
order); on 3.11+ the frames are rebuilt in the same places. Prints "ready <pid>" after the
first rebuild; ends on SIGTERM or after MAX_SECONDS. Runs on CPython 3.8 ... 3.15.
"""
import os
import signal
import sys
import time

DEPTH = int(sys.argv[1])
ITERATIONS = int(sys.argv[2])
MAX_SECONDS = float(sys.argv[3])
sys.setrecursionlimit(DEPTH + 1000)
stop = [False]


def on_term(signum, frame):
    stop[0] = True


signal.signal(signal.SIGTERM, on_term)


def leaf():
    x = 0
    for i in range(ITERATIONS):
        x += i
    return x


def middle():
    return leaf()


def deep(n):
    if n == 0:
        return middle()
    return deep(n - 1)


def main():
    deep(DEPTH)
    print("ready %d" % os.getpid(), flush=True)
    end = time.time() + MAX_SECONDS
    while not stop[0] and time.time() < end:
        deep(DEPTH)


main()
