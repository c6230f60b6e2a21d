"""py-spy's "thread_reuse" case, written anew: short-lived threads started and joined one
after another (pthread ids and stacks are reused), each spinning briefly in reused_worker.

Usage: peer_thread_reuse.py [MAX_SECONDS]    (default 120)

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import sys
import threading
import time


def reused_worker():
    end = time.monotonic() + 0.05
    x = 0
    while time.monotonic() < end:
        x = (x + 1) % 65521


deadline = time.monotonic() + (float(sys.argv[1]) if len(sys.argv) > 1 else 120.0)
print("ready", os.getpid(), flush=True)
while time.monotonic() < deadline:
    th = threading.Thread(target=reused_worker)
    th.start()
    th.join()
