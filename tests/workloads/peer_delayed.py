"""py-spy's "delayed_launch" case, written anew: the Python that a shell starts half a
second after the recording began; it spins in delayed_busy until MAX_SECONDS or until its
parent (the shell) is gone.

Usage: peer_delayed.py [MAX_SECONDS]    (default 60)

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import sys
import time

PARENT = os.getppid()


def delayed_busy(deadline):
    x = 0
    while time.monotonic() < deadline and os.getppid() == PARENT:
        for i in range(5000):
            x = (x + i) % 65521
    return x


delayed_busy(time.monotonic() + (float(sys.argv[1]) if len(sys.argv) > 1 else 60.0))
