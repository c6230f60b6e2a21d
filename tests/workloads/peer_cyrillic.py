"""py-spy's "cyrillic" case, written anew: a function whose name is in Cyrillic letters
(a non-ASCII identifier, stored by CPython as a non-compact-ASCII string) sleeps (MODE
sleep) or spins (MODE spin).

Usage: peer_cyrillic.py MODE [MAX_SECONDS]    (default 120)

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import sys
import time


def кириллица(mode, seconds):
    deadline = time.monotonic() + seconds
    if mode == "sleep":
        time.sleep(seconds)  # @sleep
    x = 0
    while time.monotonic() < deadline:  # @loop
        x = (x + 1) % 65521  # @spin
    return x


print("ready", os.getpid(), flush=True)
кириллица(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 120.0)  # @module
