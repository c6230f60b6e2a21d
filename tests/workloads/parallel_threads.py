"""Four threads spinning in parallel, each in a function of its own above one shared leaf,
and (optionally) deep recursion and alternating call chains in every thread.

Usage: parallel_threads.py RESULT_JSON MAX_SECONDS [DEPTH]

Threads spin_0 ... spin_3 each loop calling `shared_leaf` (all threads run the same code
object, so on a free-threaded build each thread but the first runs its own copy of its
bytecode) and, every other round, `alpha_1 -> alpha_2 -> shared_leaf` or `beta_1 -> beta_2 ->
shared_leaf` (the chains alternate at the same frame addresses). With DEPTH, each thread
first recurses DEPTH times in `recurse` and spins at the bottom. The main thread waits.

Prints "ready <pid> spin_0=<native id> ..." once every thread runs. On SIGTERM or after
MAX_SECONDS writes {"cpu": {"spin_0": s, ...}, "lines": {function: [lines]}} to RESULT_JSON:
each thread's CPU time (time.thread_time) and every line each function's instructions have.
Runs on CPython 3.10 ... 3.15, free-threaded builds included.
"""
import json
import os
import signal
import sys
import threading
import time

RESULT = sys.argv[1]
MAX_SECONDS = float(sys.argv[2])
DEPTH = int(sys.argv[3]) if len(sys.argv) > 3 else 0
THREADS = 4
sys.setrecursionlimit(DEPTH + 1000)

stop = threading.Event()
signal.signal(signal.SIGTERM, lambda s, f: stop.set())
cpu = {}
native = {}
started = threading.Barrier(THREADS + 1)


def shared_leaf(n):
    x = 0
    for i in range(n):
        x += i
    return x


def alpha_2(n):
    return shared_leaf(n)


def alpha_1(n):
    return alpha_2(n)


def beta_2(n):
    return shared_leaf(n)


def beta_1(n):
    return beta_2(n)


def spin(name):
    rounds = 0
    while not stop.is_set():
        shared_leaf(200)
        if rounds % 2:
            alpha_1(50)
        else:
            beta_1(50)
        rounds += 1


def recurse(depth, name):
    if depth > 0:
        return recurse(depth - 1, name)
    spin(name)


def spin_0():
    recurse(DEPTH, "spin_0")


def spin_1():
    recurse(DEPTH, "spin_1")


def spin_2():
    recurse(DEPTH, "spin_2")


def spin_3():
    recurse(DEPTH, "spin_3")


def run(target):
    native[target.__name__] = threading.get_native_id()
    started.wait()
    try:
        target()
    finally:
        cpu[target.__name__] = time.thread_time()


def lines_of(code):
    found = {line for _, _, line in code.co_lines() if line is not None}
    found.add(code.co_firstlineno)
    return sorted(found)


threads = [threading.Thread(target=run, args=(f,), name=f.__name__) for f in (spin_0, spin_1, spin_2, spin_3)]
for t in threads:
    t.start()
started.wait()
print("ready", os.getpid(), " ".join(f"{k}={v}" for k, v in sorted(native.items())), flush=True)
stop.wait(MAX_SECONDS)
stop.set()
for t in threads:
    t.join()
functions = [shared_leaf, alpha_1, alpha_2, beta_1, beta_2, spin, recurse, spin_0, spin_1, spin_2, spin_3, run]
with open(RESULT, "w") as f:
    json.dump({"cpu": cpu, "lines": {fn.__name__: lines_of(fn.__code__) for fn in functions}}, f)
