"""Four CPU-bound Python threads contending for the GIL, and one hashing with it released.

Usage: gil_share.py OUT_JSON SECONDS GO_FILE

Prints "ready <pid>", waits until GO_FILE exists, then runs gil_a ... gil_d (pure Python
loops: a thread on a CPU running them holds the GIL) and hash_free (hashlib.sha256 over a
16 MiB buffer, which releases the GIL) for SECONDS, and writes each thread's CPU time
(time.thread_time) to OUT_JSON: for gil_a ... gil_d that is the time each held the GIL.
Then waits for SIGTERM. Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import hashlib
import json
import os
import sys
import threading
import time

OUT, SECONDS, GO = sys.argv[1], float(sys.argv[2]), sys.argv[3]
RESULT = {}


def spin(stop):
    x = 0
    while time.monotonic() < stop:
        for i in range(2000):
            x = (x + i) % 65521
    return x


def gil_a(stop):
    spin(stop)
    RESULT["gil_a"] = time.thread_time()


def gil_b(stop):
    spin(stop)
    RESULT["gil_b"] = time.thread_time()


def gil_c(stop):
    spin(stop)
    RESULT["gil_c"] = time.thread_time()


def gil_d(stop):
    spin(stop)
    RESULT["gil_d"] = time.thread_time()


def hash_free(stop):
    data = b"\x5a" * (16 << 20)
    while time.monotonic() < stop:
        hashlib.sha256(data).digest()
    RESULT["hash_free"] = time.thread_time()


def main():
    print("ready", os.getpid(), flush=True)
    while not os.path.exists(GO):
        time.sleep(0.01)
    stop = time.monotonic() + SECONDS
    threads = [threading.Thread(target=f, args=(stop,)) for f in (gil_a, gil_b, gil_c, gil_d, hash_free)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(OUT + ".tmp", "w") as f:
        json.dump(RESULT, f)
    os.rename(OUT + ".tmp", OUT)
    print("done", flush=True)
    while True:
        time.sleep(3600)


main()
