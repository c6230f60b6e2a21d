"""Cyclic garbage collected by gc.collect() in a loop, after a phase without any collection.

Usage: gc_share.py OUT_JSON QUIET_CPU_SECONDS CHURN_CPU_SECONDS GO_FILE

Disables automatic collection, prints "ready <pid>", waits until GO_FILE exists, then runs:
- quiet: allocation-heavy pure Python (lists, dicts, strings; no cycles) for
  QUIET_CPU_SECONDS of CPU time, with no collection at all;
- churn: for CHURN_CPU_SECONDS of CPU time, make_cycles (a random number of two-object
  reference cycles, so that the loop's period does not line up with the sampling period)
  then collect (gc.collect(), its CPU time measured with time.thread_time around the call).
Writes {"pid": its pid, "churn": CPU s, "in_gc": CPU s inside gc.collect(), "collections": n} to OUT_JSON.
Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import gc
import json
import os
import random
import sys
import time

OUT, QUIET, CHURN, GO = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]


class Node:
    pass


def make_cycles(n):
    for _ in range(n):
        a = Node()
        b = Node()
        a.other = b
        b.other = a


def collect():
    t0 = time.thread_time()
    gc.collect()
    return time.thread_time() - t0


def churn(seconds):
    rng = random.Random(7)
    in_gc, collections = 0.0, 0
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        make_cycles(rng.randint(200, 4000))
        in_gc += collect()
        collections += 1
    return time.thread_time() - start, in_gc, collections


def quiet(seconds):
    start = time.thread_time()
    kept = 0
    while time.thread_time() - start < seconds:
        for i in range(2000):
            d = {"k": [i, str(i)], "v": (i, i + 1)}
            kept += len(d["k"][1])
    return kept


def main():
    gc.disable()
    print("ready", os.getpid(), flush=True)
    while not os.path.exists(GO):
        time.sleep(0.01)
    quiet(QUIET)
    total, in_gc, collections = churn(CHURN)
    with open(OUT + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "churn": total, "in_gc": in_gc, "collections": collections}, f)
    os.rename(OUT + ".tmp", OUT)


main()
