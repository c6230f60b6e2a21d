"""Many CPU-bound threads in one process: the shape of py-spy issue #872 (py-spy slowed a
159-thread torch process 5-15x).

Usage: many_threads.py THREADS MAX_SECONDS

Each of THREADS threads descends through 12 nested calls (level_00 ... level_11) and, at the
bottom, runs leaf_a for 3 units of work then leaf_b for 1 (the same busy loop), over and over:
about three quarters of the process's CPU time is in leaf_a, one quarter in leaf_b. Prints
"ready <pid> threads=<n>" on stdout once every thread is in its loop; stops on SIGTERM or after
MAX_SECONDS.

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import signal
import sys
import threading
import time

UNIT = 2000
stop = threading.Event()
# Threads start idle and begin together: a thread's start waits for the GIL, which hundreds of
# busy threads would make slow.
go = threading.Event()


def busy(n):
    x = 0
    for i in range(n):
        x = (x + i * 7) % 1000003
    return x


def leaf_a():
    return busy(3 * UNIT)


def leaf_b():
    return busy(UNIT)


def level_11():
    leaf_a()
    leaf_b()

def level_10():
    level_11()

def level_09():
    level_10()

def level_08():
    level_09()

def level_07():
    level_08()

def level_06():
    level_07()

def level_05():
    level_06()

def level_04():
    level_05()

def level_03():
    level_04()

def level_02():
    level_03()

def level_01():
    level_02()

def level_00():
    level_01()


# The last thread to reach its loop sets this: the main thread then waits once for the GIL,
# not once per thread (500 waits behind 500 busy threads once took over a minute).
all_running = threading.Event()
running_lock = threading.Lock()
running = [0]


def worker(threads):
    go.wait()
    with running_lock:
        running[0] += 1
        if running[0] == threads:
            all_running.set()
    while not stop.is_set():
        level_00()


def main():
    threads, max_seconds = int(sys.argv[1]), float(sys.argv[2])
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    pool = [threading.Thread(target=worker, args=(threads,), daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    go.set()
    all_running.wait()
    print("ready %d threads=%d" % (os.getpid(), threads), flush=True)
    stop.wait(max_seconds)
    stop.set()


if __name__ == "__main__":
    main()
