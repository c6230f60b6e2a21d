"""A thread that starts after the profiler attached: with --pid, pyperch's per-task events
must follow it (perf events with `inherit`).

Usage: late_thread.py DELAY MAX_SECONDS
Prints "ready <pid>", waits for SIGUSR1 (the test sends it once the profiler samples), sleeps
DELAY seconds (the main thread idle, no other thread), then starts a thread spinning in
late_worker until MAX_SECONDS or SIGTERM; the main thread waits for it without using the CPU.
"""
import os
import signal
import sys
import threading
import time

DELAY = float(sys.argv[1])
MAX_SECONDS = float(sys.argv[2])
STOP = []
GO = []
signal.signal(signal.SIGTERM, lambda *_: STOP.append(1))
signal.signal(signal.SIGUSR1, lambda *_: GO.append(1))


def late_worker(deadline):
    x = 0
    while not STOP and time.monotonic() < deadline:
        for i in range(10000):
            x = (x + i) % 65521
    return x


deadline = time.monotonic() + MAX_SECONDS
print("ready %d" % os.getpid(), flush=True)
while not GO and not STOP and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(DELAY)
t = threading.Thread(target=late_worker, args=(deadline,))
t.start()
while t.is_alive() and not STOP:
    time.sleep(0.05)
