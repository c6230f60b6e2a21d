"""About 2 s of busy work in launch_busy, then sys.exit(3).

Usage: launch.py [SECONDS]   (default 2)

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import sys
import time


def launch_busy(seconds):
    deadline = time.monotonic() + seconds
    x = 0
    while time.monotonic() < deadline:
        for i in range(10000):
            x = (x + i) % 65521
    return x


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    launch_busy(seconds)
    sys.exit(3)


if __name__ == "__main__":
    main()
