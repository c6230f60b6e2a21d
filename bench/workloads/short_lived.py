"""Process churn for the `storms` benchmark section (issue #33's "1,000 short-lived Python
processes a minute").

Usage: short_lived.py SNAPSHOT_PATH MAX_SECONDS [PER_MINUTE]     (the spawner)
       short_lived.py child                                      (one short-lived process)

The spawner starts `python short_lived.py child` PER_MINUTE (1,000) times a minute on a fixed
schedule and reaps them. Each child spins in short_lived_a for 30 ms and in short_lived_b for
10 ms of CPU (a 3/4 : 1/4 split) and exits. Units of work are children that ended; the
snapshot's "cpu" carries "lifetime_s", the sum of their lifetimes (start to reaped, polled
every few ms): the storm's slowdown is the growth of the mean lifetime.
Runs unchanged on CPython 3.8 ... 3.15.
"""
import os
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


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _harness import Harness
    h = Harness()
    per_minute = float(h.args[0]) if h.args else 1000.0
    period = 60.0 / per_minute
    h.iters["children"] = 0
    h.cpu["lifetime_s"] = 0.0
    h.ready()
    start = time.monotonic()
    spawned = 0
    running = []
    me = os.path.abspath(__file__)
    while not h.expired():
        now = time.monotonic()
        if now >= start + spawned * period:
            running.append((subprocess.Popen([sys.executable, me, "child"]), time.monotonic()))
            spawned += 1
        still = []
        for p, t0 in running:
            if p.poll() is None:
                still.append((p, t0))
            else:
                h.cpu["lifetime_s"] += time.monotonic() - t0
                h.iters["children"] += 1
        running = still
        time.sleep(0.003)
    for p, _ in running:
        p.kill()
        p.wait()


if __name__ == "__main__":
    if sys.argv[1:] == ["child"]:
        short_lived_a()
        short_lived_b()
    else:
        main()
