"""py-spy's "dump_subprocesses_threads" case, written anew: four daemon threads wake every
50 ms, and a Python child process sleeps; the main thread waits for the child.

Usage: peer_dump_threads.py [MAX_SECONDS]    (default 120)
Prints "ready <pid> child=<child pid>".

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import subprocess
import sys
import threading
import time


def napping_worker():
    while True:
        time.sleep(0.05)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
    for _ in range(4):
        threading.Thread(target=napping_worker, daemon=True).start()
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\ntime.sleep(%f)" % seconds],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    print("ready", os.getpid(), "child=%d" % child.pid, flush=True)
    try:
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()


main()
