"""Four CPU-bound Python threads contending for the GIL, one hashing with it released, and
one sleeping.

Usage: gil_share.py OUT_JSON SECONDS GO_FILE

Prints "ready <pid>", waits until GO_FILE exists, then runs gil_a ... gil_d (pure Python
loops: a thread on a CPU running them holds the GIL), hash_free (hashlib.sha256 over a
16 MiB buffer, which releases the GIL) and sleeper (10 ms sleeps in a loop) for SECONDS,
and writes to OUT_JSON each thread's CPU time (time.thread_time) under its function's name:
for gil_a ... gil_d that is the time each held the GIL; under "lifetime", the wall time
(perf_counter) each of gil_a ... gil_d ran; under "sleeper", the sleep time it asked for
("requested") and the wall time its time.sleep calls took ("in_sleep", which also holds
taking the GIL back). Then waits for SIGTERM.

The sleeper sleeps with select.select, not time.sleep: since 3.11 time.sleep fixes its
deadline before it releases the GIL, and releasing it can wait for another thread to take it
(the forced switch of drop_gil, a real GIL wait), so its time asleep in the kernel can be
less than it asked for. select releases the GIL first and then sleeps the whole timeout. Runs unchanged on CPython 3.8 ... 3.15 (stdlib
only).
"""
import hashlib
import json
import os
import select
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


LIFETIME = {}
RESULT["lifetime"] = LIFETIME


def gil_a(stop):
    start = time.perf_counter()
    spin(stop)
    RESULT["gil_a"] = time.thread_time()
    LIFETIME["gil_a"] = time.perf_counter() - start


def gil_b(stop):
    start = time.perf_counter()
    spin(stop)
    RESULT["gil_b"] = time.thread_time()
    LIFETIME["gil_b"] = time.perf_counter() - start


def gil_c(stop):
    start = time.perf_counter()
    spin(stop)
    RESULT["gil_c"] = time.thread_time()
    LIFETIME["gil_c"] = time.perf_counter() - start


def gil_d(stop):
    start = time.perf_counter()
    spin(stop)
    RESULT["gil_d"] = time.thread_time()
    LIFETIME["gil_d"] = time.perf_counter() - start


def sleeper(stop):
    requested = in_sleep = 0.0
    while time.monotonic() < stop:
        before = time.perf_counter()
        select.select([], [], [], 0.01)
        in_sleep += time.perf_counter() - before
        requested += 0.01
    RESULT["sleeper"] = {"requested": requested, "in_sleep": in_sleep}


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
    threads = [threading.Thread(target=f, args=(stop,)) for f in (gil_a, gil_b, gil_c, gil_d, hash_free, sleeper)]
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
