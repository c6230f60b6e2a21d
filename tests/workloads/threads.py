"""Four threads spinning in distinct Python functions plus one hashing thread.

Usage: threads.py [MAX_SECONDS]

spin_alpha, spin_beta, spin_gamma and spin_delta each spin in their own thread;
hash_worker hashes a 64 MiB buffer with hashlib.sha256 over and over: OpenSSL's
sha256 releases the GIL for large inputs, so that thread spends its CPU time in C code
without the GIL while its Python stack stays hash_worker.  Prints
"ready <pid> <name>=<native thread id> ..." on stdout once every thread runs, and exits
on SIGTERM or after MAX_SECONDS (default 60).  Each thread sets its OS name (prctl
PR_SET_NAME) to its function's name.

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import hashlib
import os
import signal
import sys
import threading
import time

STOP = threading.Event()
TIDS = {}
STARTED = threading.Barrier(6)


def register(name):
    TIDS[name] = threading.get_native_id()
    # The OS name /proc/PID/task/TID/comm shows (CPython 3.14+ sets it from the Thread's
    # name itself; earlier versions leave the process's name): what `--threads` shows.
    import ctypes
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name[:15].encode()), 0, 0, 0)  # PR_SET_NAME
    STARTED.wait()


def spin_alpha():
    register("spin_alpha")
    x = 0
    while not STOP.is_set():
        for i in range(10000):
            x = (x + i) % 65521


def spin_beta():
    register("spin_beta")
    x = 0
    while not STOP.is_set():
        for i in range(10000):
            x = (x + i) % 65521


def spin_gamma():
    register("spin_gamma")
    x = 0
    while not STOP.is_set():
        for i in range(10000):
            x = (x + i) % 65521


def spin_delta():
    register("spin_delta")
    x = 0
    while not STOP.is_set():
        for i in range(10000):
            x = (x + i) % 65521


def hash_worker(buf):
    register("hash_worker")
    digest = b""
    while not STOP.is_set():
        digest = hashlib.sha256(buf).digest()
    return digest


def main():
    max_seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    signal.signal(signal.SIGTERM, lambda signum, frame: STOP.set())
    buf = bytes(64 << 20)
    threads = [threading.Thread(target=f, name=f.__name__)
               for f in (spin_alpha, spin_beta, spin_gamma, spin_delta)]
    threads.append(threading.Thread(target=hash_worker, args=(buf,), name="hash_worker"))
    for t in threads:
        t.start()
    STARTED.wait()
    print("ready %d %s" % (os.getpid(), " ".join("%s=%d" % kv for kv in sorted(TIDS.items()))),
          flush=True)
    deadline = time.monotonic() + max_seconds
    while not STOP.is_set() and time.monotonic() < deadline:
        STOP.wait(0.2)
    STOP.set()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
