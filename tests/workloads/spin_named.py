"""Spins in a function with a given name for a given CPU time, then exits.

Usage: spin_named.py NAME MILLISECONDS
Used as the child of pid_reuse.py and slots.py; prints nothing.
"""
import sys
import time

namespace = {}
exec("def %s(deadline, clock):\n    x = 0\n    while clock() < deadline:\n        x += 1\n" % sys.argv[1], namespace)
namespace[sys.argv[1]](time.thread_time() + float(sys.argv[2]) / 1000.0, time.thread_time)
