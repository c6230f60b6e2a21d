"""An idle Python process: it sleeps a few frames deep and does nothing else.

Usage: idle.py SNAPSHOT_PATH MAX_SECONDS

Used for the whole-host scale runs (1, 10 and 50 of these beside one busy workload).
Runs unchanged on CPython 3.8 ... 3.15.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402


def wait_forever(h):
    h.ready()
    while not h.expired():
        time.sleep(0.5)


def main():
    h = _harness.Harness()
    wait_forever(h)


if __name__ == "__main__":
    main()
