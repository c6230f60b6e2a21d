"""py-spy's "recursive" case, written anew: module-level code calls recurse(20) in a loop,
so every stack must start at <module> on the loop's lines and hold at most 21 recurse
frames (py-spy's issue 56: stacks that did not start at an entry point).

Usage: peer_recursive.py [MAX_SECONDS]    (default 120)

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import sys
import time


def recurse(x):
    if x == 0:
        return
    recurse(x - 1)


DEADLINE = time.monotonic() + (float(sys.argv[1]) if len(sys.argv) > 1 else 120.0)
print("ready", os.getpid(), flush=True)
while time.monotonic() < DEADLINE:  # @loop
    recurse(20)  # @call
