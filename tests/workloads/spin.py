"""Spins in one named leaf function until SIGTERM or MAX_SECONDS.

Usage: spin.py LEAF [MAX_SECONDS [exec:LEAF2:AFTER:PYTHON]]
LEAF is one of leaf_red, leaf_green, leaf_blue, leaf_late, leaf_old. With exec:..., after
AFTER seconds the process replaces itself (os.execv, same pid) with PYTHON running
spin.py LEAF2.

Each process of a test runs a different leaf, so the test can tell from the profile which
interpreter a stack came from.  Prints "ready <pid>" on stdout once spinning.

Deliberately plain (no f-strings, no walrus): it must run on the unsupported CPython 3.6
and 3.7 as well as on 3.8 ... 3.15.
"""
import os
import signal
import sys
import time

STOP = []


def leaf_red(deadline):
    x = 0
    while not STOP and time.monotonic() < deadline:
        for i in range(10000):
            x = (x + i) % 65521
    return x


def leaf_green(deadline):
    x = 0
    while not STOP and time.monotonic() < deadline:
        for i in range(10000):
            x = (x + i) % 65521
    return x


def leaf_blue(deadline):
    x = 0
    while not STOP and time.monotonic() < deadline:
        for i in range(10000):
            x = (x + i) % 65521
    return x


def leaf_late(deadline):
    x = 0
    while not STOP and time.monotonic() < deadline:
        for i in range(10000):
            x = (x + i) % 65521
    return x


def leaf_old(deadline):
    x = 0
    while not STOP and time.monotonic() < deadline:
        for i in range(10000):
            x = (x + i) % 65521
    return x


LEAVES = {
    "leaf_red": leaf_red,
    "leaf_green": leaf_green,
    "leaf_blue": leaf_blue,
    "leaf_late": leaf_late,
    "leaf_old": leaf_old,
}


def main():
    leaf = LEAVES[sys.argv[1]]
    max_seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    signal.signal(signal.SIGTERM, lambda signum, frame: STOP.append(1))
    print("ready %d" % os.getpid(), flush=True)
    deadline = time.monotonic() + max_seconds
    then = sys.argv[3].split(":", 3) if len(sys.argv) > 3 and sys.argv[3].startswith("exec:") else None
    if then:
        leaf(min(deadline, time.monotonic() + float(then[2])))
        if not STOP:
            script = os.path.abspath(__file__)
            os.execv(then[3], [then[3], script, then[1], str(max_seconds)])
        return
    leaf(deadline)


if __name__ == "__main__":
    main()
