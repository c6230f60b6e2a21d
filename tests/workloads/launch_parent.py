"""Starts launch.py in a child interpreter (the same executable) and exits with its status.

Usage: launch_parent.py [SECONDS]

Prints "child <pid>" on stdout when the child has started.  The parent itself only waits,
so every launch_busy sample must come from the child.

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import subprocess
import sys


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    args = [sys.executable, os.path.join(here, "launch.py")] + sys.argv[1:]
    child = subprocess.Popen(args)
    print("child %d" % child.pid, flush=True)
    sys.exit(child.wait())


if __name__ == "__main__":
    main()
