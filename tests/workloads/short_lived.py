"""Process churn: short-lived Python processes started at a steady rate (issue #33's "1,000
short-lived Python processes a minute").

Usage: short_lived.py PER_MINUTE SECONDS      (the spawner)
       short_lived.py child                   (one short-lived process)

The spawner prints "ready <pid>" and then starts `python short_lived.py child` PER_MINUTE
times a minute (one every 60/PER_MINUTE s, on a fixed schedule) for SECONDS or until SIGTERM,
reaping the ones that ended; at the end it prints "spawned <n> exited <m>". Each child spins
in short_lived_a for about 30 ms and in short_lived_b for about 10 ms of CPU, and exits.

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import signal
import subprocess
import sys
import time


def spin(seconds):
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for i in range(200):
            x = (x + i * 7) % 1000003
    return x


def short_lived_a():
    return spin(0.030)


def short_lived_b():
    return spin(0.010)


def child():
    short_lived_a()
    short_lived_b()


def spawner(per_minute, seconds):
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    print("ready %d" % os.getpid(), flush=True)
    period = 60.0 / per_minute
    start = time.monotonic()
    running, spawned, exited = [], 0, 0
    while not stop and time.monotonic() - start < seconds:
        running.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "child"]))
        spawned += 1
        still = []
        for p in running:
            if p.poll() is None:
                still.append(p)
            else:
                exited += 1
        running = still
        delay = start + spawned * period - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    for p in running:
        p.wait()
        exited += 1
    print("spawned %d exited %d" % (spawned, exited), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["child"]:
        child()
    else:
        spawner(float(sys.argv[1]), float(sys.argv[2]))
