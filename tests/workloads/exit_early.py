"""Busy in short_lived_busy, then exits with status 0.

Usage: exit_early.py [SECONDS]   (default 2)

Busy for SECONDS after SIGUSR1 arrives (the test sends it once the recording samples), or
for SECONDS from the start if SIGUSR1 is ignored for 60 s; then exits with status 0.
Prints "ready <pid>" on stdout when it starts.  Runs unchanged on CPython 3.8 ... 3.15.
"""
import os
import signal
import sys
import time

DEADLINE = [time.monotonic() + 60.0]


def start_countdown(seconds):
    DEADLINE[0] = time.monotonic() + seconds


def short_lived_busy():
    x = 0
    while time.monotonic() < DEADLINE[0]:
        for i in range(10000):
            x = (x + i) % 65521
    return x


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    signal.signal(signal.SIGUSR1, lambda *_: start_countdown(seconds))
    print("ready %d" % os.getpid(), flush=True)
    short_lived_busy()


if __name__ == "__main__":
    main()
