"""A process tree that grows during a recording, for `record --pid P --subprocesses`.

Usage: late_grandchild.py DIR
The parent prints "ready", then waits until DIR/go exists (the test creates it once pyperch
samples), then starts a child interpreter that starts a grandchild interpreter; the
grandchild spends about 6 s in grandchild_busy and writes "grandchild <pid>" to
DIR/grandchild. The parent itself only waits (never on a CPU long).

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import subprocess
import sys
import time


def grandchild_busy(seconds):
    deadline = time.monotonic() + seconds
    x = 0
    while time.monotonic() < deadline:
        for i in range(10000):
            x = (x + i) % 65521
    return x


def main():
    role = sys.argv[1]
    if role == "grandchild":
        with open(os.path.join(sys.argv[2], "grandchild"), "w") as f:
            f.write("grandchild %d\n" % os.getpid())
        grandchild_busy(6.0)
        return
    if role == "child":
        sys.exit(subprocess.call([sys.executable, os.path.abspath(__file__), "grandchild", sys.argv[2]]))
    directory = role
    print("ready", flush=True)
    go = os.path.join(directory, "go")
    deadline = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(subprocess.call([sys.executable, os.path.abspath(__file__), "child", directory]))


if __name__ == "__main__":
    main()
