"""A context-switch storm in one CPython process (issue #33): many threads, each sleeping
SLEEP seconds (`time.sleep`) over and over, so each switches out and back in thousands of
times a second.

Usage: switch_storm.py THREADS MAX_SECONDS [SLEEP [LONG_THREADS LONG_SLEEP]]

Three threads in four wait in `wait_a`, one in four in `wait_b` (the same sleep), so about
three quarters of the storm's off-CPU time is under wait_a and one quarter under wait_b.
LONG_THREADS more threads wait in `wait_long`, LONG_SLEEP seconds at a time (waits much
longer than the storm's, beside it).
Prints "ready <pid> threads=<n>" on stdout once every thread is in its loop; stops on SIGTERM
or after MAX_SECONDS. Stdlib only, CPython 3.8 ... 3.15.
"""
import os
import signal
import sys
import threading
import time

stop = threading.Event()
go = threading.Event()


def wait_a(seconds):
    time.sleep(seconds)


def wait_b(seconds):
    time.sleep(seconds)


def wait_long(seconds):
    time.sleep(seconds)


def worker(wait, seconds, running):
    go.wait()
    running.release()
    while not stop.is_set():
        wait(seconds)


def main():
    threads, max_seconds = int(sys.argv[1]), float(sys.argv[2])
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0003
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    running = threading.Semaphore(0)
    pool = [
        threading.Thread(target=worker, args=(wait_b if i % 4 == 3 else wait_a, seconds, running), daemon=True)
        for i in range(threads)
    ]
    if len(sys.argv) > 5:
        long_threads, long_seconds = int(sys.argv[4]), float(sys.argv[5])
        pool += [
            threading.Thread(target=worker, args=(wait_long, long_seconds, running), daemon=True)
            for _ in range(long_threads)
        ]
    for t in pool:
        t.start()
    go.set()
    for _ in pool:
        running.acquire()
    print("ready %d threads=%d" % (os.getpid(), len(pool)), flush=True)
    stop.wait(max_seconds)
    stop.set()


if __name__ == "__main__":
    main()
