"""CPython profiling.sampling's mode filtering cases (test_modes.py), written anew: two
worker threads besides a main thread that waits.

Usage: sampling_modes.py CASE [MAX_SECONDS]    (default 120)
- cpu:       idle_worker sleeps, cpu_active_worker spins (--mode cpu vs wall);
- gil:       gil_releasing_work sleeps, gil_holding_work spins (--mode gil vs wall);
- exception: normal_worker spins, exception_handling_worker spins inside an except block
             (--mode exception vs wall).
Prints "ready <pid>" once both workers are in place.

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import sys
import threading
import time

READY = threading.Barrier(3)
DEADLINE = time.monotonic() + (float(sys.argv[2]) if len(sys.argv) > 2 else 120.0)


def spin_until_deadline():
    x = 0
    while time.monotonic() < DEADLINE:
        for i in range(2000):
            x = (x + i) % 65521
    return x


def idle_worker():
    READY.wait()
    while time.monotonic() < DEADLINE:
        time.sleep(0.5)


def cpu_active_worker():
    READY.wait()
    x = 0
    while time.monotonic() < DEADLINE:
        for i in range(2000):
            x = (x + i) % 65521


def gil_releasing_work():
    READY.wait()
    while time.monotonic() < DEADLINE:
        time.sleep(0.5)


def gil_holding_work():
    READY.wait()
    x = 0
    while time.monotonic() < DEADLINE:
        for i in range(2000):
            x = (x + i) % 65521


def normal_worker():
    READY.wait()
    x = 0
    while time.monotonic() < DEADLINE:
        for i in range(2000):
            x = (x + i) % 65521


def exception_handling_worker():
    try:
        raise ValueError("test exception")
    except ValueError:
        READY.wait()
        x = 0
        while time.monotonic() < DEADLINE:
            for i in range(2000):
                x = (x + i) % 65521


CASES = {
    "cpu": (idle_worker, cpu_active_worker),
    "gil": (gil_releasing_work, gil_holding_work),
    "exception": (normal_worker, exception_handling_worker),
}

workers = [threading.Thread(target=t, daemon=True) for t in CASES[sys.argv[1]]]
for w in workers:
    w.start()
READY.wait()
print("ready", os.getpid(), flush=True)
while time.monotonic() < DEADLINE:
    time.sleep(0.2)
