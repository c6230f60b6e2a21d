"""Sleeps without running Python code (never on a CPU), for empty recordings.

Usage: idle.py MAX_SECONDS. Prints "ready <pid>", then sleeps until SIGTERM or MAX_SECONDS.
"""
import os
import sys
import time

print("ready %d" % os.getpid(), flush=True)
time.sleep(float(sys.argv[1]))
