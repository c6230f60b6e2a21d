"""Spends its time on two different lines of one function, two_lines_work, for about
SECONDS (default 30), so that a per-line profile shows it twice and a per-function one once.

Usage: two_lines.py [SECONDS]

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import sys
import time


def two_lines_work(deadline):
    x = 0
    while time.monotonic() < deadline:
        for i in range(3000):
            x = (x * 31 + i) % 65521
        for i in range(3000):
            x = (x * 17 + i) % 65519
    return x


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    print("ready", flush=True)
    two_lines_work(time.monotonic() + seconds)


if __name__ == "__main__":
    main()
