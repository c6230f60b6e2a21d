"""THREADS threads, each DEPTH frames deep in nested(), then sleeping with a few locals.

Usage: dump_many.py [THREADS] [MAX_SECONDS]

Prints "ready <pid>" once every thread is at the bottom; exits on SIGTERM or after
MAX_SECONDS (default 120). Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import signal
import sys
import threading
import time

DEPTH = 20


def nested(n, barrier):
    text = "level-%d" % n
    if n == 0:
        barrier.wait()
        while True:
            time.sleep(1000)
    return nested(n - 1, barrier), text


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    limit = float(sys.argv[2]) if len(sys.argv) > 2 else 120.0
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    barrier = threading.Barrier(count + 1)
    for _ in range(count):
        threading.Thread(target=nested, args=(DEPTH, barrier), daemon=True).start()
    barrier.wait()
    print("ready", os.getpid(), flush=True)
    time.sleep(limit)
    os._exit(0)


main()
