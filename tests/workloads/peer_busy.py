"""py-spy's "busyloop" case, written anew: the main thread spins in pure Python in
busy_loop() (it holds the GIL all the time) until MAX_SECONDS or SIGTERM.

Usage: peer_busy.py [MAX_SECONDS]    (default 120)

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import sys
import time


def busy_loop(deadline):
    x = 0
    while time.monotonic() < deadline:
        for i in range(5000):
            x = (x + i) % 65521
    return x


print("ready", os.getpid(), flush=True)
busy_loop(time.monotonic() + (float(sys.argv[1]) if len(sys.argv) > 1 else 120.0))
