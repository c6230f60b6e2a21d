# -*- coding: utf-8 -*-
"""py-spy's "unicode" case, written anew: a script whose file name holds an emoji (outside
the Basic Multilingual Plane). function1 sleeps (MODE sleep) or spins (MODE spin).

Usage: peer_unicode💩.py MODE [MAX_SECONDS]    (default 120)

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import sys
import time


def function1(mode, seconds):
    deadline = time.monotonic() + seconds
    if mode == "sleep":
        time.sleep(seconds)  # @sleep
    x = 0
    while time.monotonic() < deadline:  # @loop
        x = (x + 1) % 65521  # @spin
    return x


print("ready", os.getpid(), flush=True)
function1(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 120.0)  # @module
