"""Two distinct call chains of equal depth, called alternately in a tight loop.

Usage: frame_reuse.py MAX_SECONDS

Each round calls alpha_1 -> alpha_2 -> alpha_3 -> shared_leaf, then beta_1 -> beta_2 ->
beta_3 -> shared_leaf. Both chains push their frames at the same addresses (CPython reuses
the frames of returned calls), so a profiler that splices a cached caller chain onto a new
leaf shows stacks mixing alpha_* and beta_* frames: stacks that never happened.
Prints "ready <pid>". Runs on CPython 3.8 ... 3.15.
"""
import os
import signal
import sys
import time

MAX_SECONDS = float(sys.argv[1])
stop = [False]
signal.signal(signal.SIGTERM, lambda s, f: stop.__setitem__(0, True))


def shared_leaf(n):
    x = 0
    for i in range(n):
        x += i
    return x


def alpha_3(n):
    return shared_leaf(n)


def alpha_2(n):
    return alpha_3(n)


def alpha_1(n):
    return alpha_2(n)


def beta_3(n):
    return shared_leaf(n)


def beta_2(n):
    return beta_3(n)


def beta_1(n):
    return beta_2(n)


def main():
    end = time.time() + MAX_SECONDS
    print("ready %d" % os.getpid(), flush=True)
    while not stop[0] and time.time() < end:
        for _ in range(50):
            alpha_1(30)
            beta_1(30)


main()
