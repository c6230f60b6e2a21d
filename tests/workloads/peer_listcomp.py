"""py-spy's "negative_linenumber_offsets" case, written anew: f() runs a list comprehension
written over several lines whose element sleeps, so that the line table steps backwards
(a negative line delta) inside it. Before 3.12 the comprehension is its own frame
(<listcomp>); from 3.12 on it is inlined into f (PEP 709).

Usage: peer_listcomp.py [MAX_SECONDS]    (default 120)

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import sys
import time

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0


def f():
    return [  # @first
        # Spread over several lines on purpose.
        time.sleep(1)
        for _ in range(int(SECONDS))
    ]  # @last


print("ready", os.getpid(), flush=True)
f()  # @module
