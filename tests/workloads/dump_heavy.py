"""THREADS threads, each DEPTH frames deep, every frame's code object named with a
4,000-character qualname and filename (one str object each, shared by every code object).

Usage: dump_heavy.py shared|distinct THREADS DEPTH [MAX_SECONDS]

shared: every frame runs the same code object (the target stays small, ~30 MB, while the
stacks show THREADS x DEPTH frames of 8,000 characters of names).
distinct: every frame of every thread runs a code object of its own (a copy made with
code.replace), so a reader that reads each code object once still reads THREADS x DEPTH of
them. Needs CPython 3.11+ (co_qualname). Prints "ready <pid>" once every thread is at the
bottom; exits on SIGTERM or after MAX_SECONDS (default 120).
"""
import os
import signal
import sys
import threading
import time

LONG = "q" * 4000
LONG_FILE = "/" + "f" * 3996 + ".py"

SOURCE = """
def level(n, barrier, chain):
    if n == 0:
        barrier.wait()
        while True:
            time.sleep(1000)
    return chain[n - 1](n - 1, barrier, chain)
"""


def make_base():
    namespace = {"time": time}
    exec(compile(SOURCE, LONG_FILE, "exec"), namespace)
    base = namespace["level"]
    base.__code__ = base.__code__.replace(co_qualname=LONG, co_name=LONG)
    return base


def main():
    mode, count, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    limit = float(sys.argv[4]) if len(sys.argv) > 4 else 120.0
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    sys.setrecursionlimit(depth * 2 + 1000)
    threading.stack_size(64 << 20)
    base = make_base()
    barrier = threading.Barrier(count + 1)
    for _ in range(count):
        if mode == "distinct":
            chain = [
                type(base)(base.__code__.replace(co_firstlineno=2 + i), base.__globals__)
                for i in range(depth + 1)
            ]
        else:
            chain = [base] * (depth + 1)
        threading.Thread(target=chain[depth], args=(depth, barrier, chain), daemon=True).start()
    barrier.wait()
    print("ready %d" % os.getpid(), flush=True)
    time.sleep(limit)


if __name__ == "__main__":
    main()
