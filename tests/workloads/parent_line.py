"""A parent calls the same child from two different lines, alternately.

Usage: parent_line.py MAX_SECONDS

parent() calls child(1) on the line marked CALL_ONE and child(2) on the line marked
CALL_TWO. The child frame lands at the same address both times; only the parent's current
line differs. child(1) spins in spin_one, child(2) in spin_two, so in a correct profile
CALL_ONE's line is always followed by spin_one and CALL_TWO's by spin_two.
Prints "ready <pid> one=<line> two=<line>". Runs on CPython 3.8 ... 3.15.
"""
import inspect
import os
import signal
import sys
import time

MAX_SECONDS = float(sys.argv[1])
stop = [False]
signal.signal(signal.SIGTERM, lambda s, f: stop.__setitem__(0, True))


def spin_one(n):
    x = 0
    for i in range(n):
        x += i
    return x


def spin_two(n):
    x = 0
    for i in range(n):
        x += i
    return x


def child(kind):
    if kind == 1:
        return spin_one(300)
    return spin_two(300)


def parent():
    end = time.time() + MAX_SECONDS
    while not stop[0] and time.time() < end:
        child(1)  # CALL_ONE
        child(2)  # CALL_TWO


def marked_line(marker):
    lines, start = inspect.getsourcelines(parent)
    for i, text in enumerate(lines):
        if marker in text:
            return start + i
    raise SystemExit("marker not found")


print("ready %d one=%d two=%d" % (os.getpid(), marked_line("# CALL_ONE"), marked_line("# CALL_TWO")), flush=True)
parent()
