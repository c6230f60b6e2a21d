"""Recursion to a fixed depth, then a CPU split between two leaves, by construction.

Usage: deep.py DEPTH RESULT_JSON MAX_SECONDS

recurse() calls itself DEPTH times; at the bottom it loops calling leaf_a (P = 0.3) or
leaf_b, equal-cost busy loops, timing each with time.thread_time. On SIGTERM or after
MAX_SECONDS it writes {"leaf_a": s, "leaf_b": s, "depth": DEPTH} to RESULT_JSON.
Prints "ready <pid>" once in the hot loop. Runs on CPython 3.8 ... 3.15.
"""
import json
import os
import random
import signal
import sys
import time

DEPTH = int(sys.argv[1])
RESULT = sys.argv[2]
MAX_SECONDS = float(sys.argv[3])
sys.setrecursionlimit(DEPTH + 1000)

spent = {"leaf_a": 0.0, "leaf_b": 0.0}
stop = [False]


def on_term(signum, frame):
    stop[0] = True


signal.signal(signal.SIGTERM, on_term)


def leaf_a(n):
    x = 0
    for i in range(n):
        x = (x + i * 7) % 1000003
    return x


def leaf_b(n):
    x = 0
    for i in range(n):
        x = (x + i * 7) % 1000003
    return x


def hot_loop():
    rng = random.Random(1)
    end = time.time() + MAX_SECONDS
    print("ready %d" % os.getpid(), flush=True)
    while not stop[0] and time.time() < end:
        if rng.random() < 0.3:
            t = time.thread_time()
            leaf_a(20000)
            spent["leaf_a"] += time.thread_time() - t
        else:
            t = time.thread_time()
            leaf_b(20000)
            spent["leaf_b"] += time.thread_time() - t


def recurse(n):
    if n == 0:
        hot_loop()
        return
    recurse(n - 1)


recurse(DEPTH)
with open(RESULT, "w") as f:
    json.dump(dict(spent, depth=DEPTH, pid=os.getpid()), f)
