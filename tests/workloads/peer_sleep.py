"""py-spy's "longsleep" case, written anew: the main thread sleeps in longsleep(), called
from module level. Lines the tests check are marked with `# @name` comments.

Usage: peer_sleep.py [MAX_SECONDS]    (default 120; SIGTERM ends it)

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import sys
import time


def longsleep(seconds):
    time.sleep(seconds)  # @sleep


print("ready", os.getpid(), flush=True)
longsleep(float(sys.argv[1]) if len(sys.argv) > 1 else 120.0)  # @module
