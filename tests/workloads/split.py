"""CPU time split between two leaf functions, by construction.

Usage: split.py RESULT_JSON MAX_SECONDS

The main thread descends through 28 distinct nested calls (chain_00 ... chain_27) and, at
the bottom, calls leaf_a or leaf_b (equal-cost busy loops) chosen at random with
P(leaf_a) = 0.3.  It measures the CPU time spent in each leaf itself (time.thread_time
around every call) and, on SIGTERM or after MAX_SECONDS, writes
{"leaf_a": seconds, "leaf_b": seconds, "calls_a": n, "calls_b": n, "pid": pid} to
RESULT_JSON.  Prints "ready <pid>" on stdout once it is in the hot loop.

Runs unchanged on CPython 3.6 ... 3.15 (stdlib only).
"""
import json
import os
import random
import signal
import sys
import time

SHARE_A = 0.3
ITERATIONS = 20000


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


def chain_00(state):
    return chain_01(state)

def chain_01(state):
    return chain_02(state)

def chain_02(state):
    return chain_03(state)

def chain_03(state):
    return chain_04(state)

def chain_04(state):
    return chain_05(state)

def chain_05(state):
    return chain_06(state)

def chain_06(state):
    return chain_07(state)

def chain_07(state):
    return chain_08(state)

def chain_08(state):
    return chain_09(state)

def chain_09(state):
    return chain_10(state)

def chain_10(state):
    return chain_11(state)

def chain_11(state):
    return chain_12(state)

def chain_12(state):
    return chain_13(state)

def chain_13(state):
    return chain_14(state)

def chain_14(state):
    return chain_15(state)

def chain_15(state):
    return chain_16(state)

def chain_16(state):
    return chain_17(state)

def chain_17(state):
    return chain_18(state)

def chain_18(state):
    return chain_19(state)

def chain_19(state):
    return chain_20(state)

def chain_20(state):
    return chain_21(state)

def chain_21(state):
    return chain_22(state)

def chain_22(state):
    return chain_23(state)

def chain_23(state):
    return chain_24(state)

def chain_24(state):
    return chain_25(state)

def chain_25(state):
    return chain_26(state)

def chain_26(state):
    return chain_27(state)

def chain_27(state):
    rng = random.Random(20240601)
    clock = time.thread_time
    deadline = time.monotonic() + state["max_seconds"]
    totals = state["totals"]
    counts = state["counts"]
    print("ready %d" % os.getpid(), flush=True)
    while not state["stop"]:
        if rng.random() < SHARE_A:
            t0 = clock()
            leaf_a(ITERATIONS)
            totals[0] += clock() - t0
            counts[0] += 1
        else:
            t0 = clock()
            leaf_b(ITERATIONS)
            totals[1] += clock() - t0
            counts[1] += 1
        if ((counts[0] + counts[1]) & 63) == 0 and time.monotonic() > deadline:
            break
    return totals


def write_result(state):
    result = {
        "leaf_a": state["totals"][0],
        "leaf_b": state["totals"][1],
        "calls_a": state["counts"][0],
        "calls_b": state["counts"][1],
        "pid": os.getpid(),
    }
    tmp = state["path"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.rename(tmp, state["path"])


def on_sigterm(signum, frame):
    STATE["stop"] = True


STATE = {
    "path": sys.argv[1],
    "max_seconds": float(sys.argv[2]) if len(sys.argv) > 2 else 60.0,
    "totals": [0.0, 0.0],
    "counts": [0, 0],
    "stop": False,
}
signal.signal(signal.SIGTERM, on_sigterm)
chain_00(STATE)
write_result(STATE)
