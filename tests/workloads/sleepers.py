"""Threads that only wait, asleep since before any profiler looks: the first thing a
py-spy user tries with `--idle` (py-spy's `longsleep.py`), with ten threads and non-ASCII
names as well.

Usage: sleepers.py THREADS MAX_SECONDS

Starts THREADS threads, each in `sleeper_ü` → `wait_here` (`time.sleep`), then the main
thread sleeps in `main_sleep`. Prints "ready <pid> tids=<tid,...>" (the native ids of the
sleeping threads, main first) once every thread sleeps, and exits after MAX_SECONDS or on
SIGTERM. Stdlib only, CPython 3.8 ... 3.15.
"""
import os
import sys
import threading
import time

THREADS, MAX_SECONDS = int(sys.argv[1]), float(sys.argv[2])
started = []
lock = threading.Lock()


def wait_here(seconds):
    time.sleep(seconds)


def sleeper_ü(seconds):
    with lock:
        started.append(threading.get_native_id())
    wait_here(seconds)


def main_sleep(seconds):
    time.sleep(seconds)


def main():
    for i in range(THREADS):
        threading.Thread(target=sleeper_ü, args=(MAX_SECONDS,), name="sleeper-%d" % i, daemon=True).start()
    while True:
        with lock:
            if len(started) == THREADS:
                break
        time.sleep(0.01)
    # Each thread is inside time.sleep well before the ready line is read.
    time.sleep(0.2)
    tids = [threading.get_native_id()] + started
    print("ready %d tids=%s" % (os.getpid(), ",".join(map(str, tids))), flush=True)
    main_sleep(MAX_SECONDS)


main()
