"""py-spy's "thread_names" case, written anew: ten threads named CustomThreadName-0 ... 9
(names given through threading, not the OS) and the main thread, all asleep; the first five
wake every 5 ms to spin briefly so that a CPU-time profile sees them too.

Usage: peer_thread_names.py [MAX_SECONDS]    (default 120)
Prints "ready <pid> tids=TID,TID,..." (native ids, CustomThreadName-0 first).

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import sys
import threading
import time

TIDS = [None] * 10
STARTED = threading.Barrier(11)


def named_worker(index, deadline):
    TIDS[index] = threading.get_native_id()
    STARTED.wait()
    while time.monotonic() < deadline:
        if index < 5:
            x = 0
            for i in range(2000):
                x = (x + i) % 65521
            time.sleep(0.005)
        else:
            time.sleep(1.0)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
    deadline = time.monotonic() + seconds
    for i in range(10):
        th = threading.Thread(target=named_worker, args=(i, deadline), daemon=True)
        th.name = "CustomThreadName-%d" % i
        th.start()
    STARTED.wait()
    print("ready", os.getpid(), "tids=" + ",".join(str(t) for t in TIDS), flush=True)
    while time.monotonic() < deadline:
        time.sleep(0.5)


main()
