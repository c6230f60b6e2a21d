"""Busy for N seconds in short_lived_busy, then exits with status 0.

Usage: exit_early.py [SECONDS]   (default 2)

Prints "ready <pid>" on stdout when it starts.  Runs unchanged on CPython 3.8 ... 3.15.
"""
import os
import sys
import time


def short_lived_busy(seconds):
    deadline = time.monotonic() + seconds
    x = 0
    while time.monotonic() < deadline:
        for i in range(10000):
            x = (x + i) % 65521
    return x


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    print("ready %d" % os.getpid(), flush=True)
    short_lived_busy(seconds)


if __name__ == "__main__":
    main()
